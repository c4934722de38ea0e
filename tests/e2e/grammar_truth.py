"""The truth about a grammar the real server built: does it hold the schema?

Used by ``test_grammar_compiled_e2e.test_checker_matches_the_server_converter``, in worker
processes (``spawn``): this module imports only what judging one schema needs, so a
worker starts in about 2 s instead of compiling the whole corpus as the test module does
at import. Judging is pure Python and deterministic (each schema gets ``random.Random(1)``),
so the verdicts do not depend on which worker judges which schema.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from localllm.cli.grammar import verdict
from localllm.grammar import Violation, check_subset
from localllm.grammar.compile import _validation_failures
from localllm.grammar.paths import parse_path
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import counterexample, validator

WALKS = 1000  # the probes start from the walks that together reach the most keys
PROBED_WALKS = 6  # walks whose one-edit mutations are probed


def judge(schema: Any, server_grammar: str | None) -> tuple[bool, bool]:
    """``(the checker accepts the schema, the server's grammar enforces it)``.

    ``server_grammar`` is the GBNF the server reported for the schema, None when it refused
    the schema (a refusal enforces nothing).
    """
    findings = check_subset(schema)
    accepts = verdict(findings) != "error"
    if server_grammar is None:
        return accepts, False
    target = _structural(schema, findings) if accepts else schema
    try:
        enforced = enforces(Grammar.parse(server_grammar), target, random.Random(1))
    except _validation_failures():  # a schema jsonschema itself cannot evaluate
        enforced = False
    return accepts, enforced


def _structural(schema: Any, findings: list[Violation]) -> Any:
    out = copy.deepcopy(schema)
    for f in findings:
        if f.severity != "warning":
            continue
        node: Any = out
        for token in parse_path(f.path):
            node = node[token]
        if f.construct == "oneOf":
            node["anyOf"] = node.pop("oneOf")
        else:
            node.pop(f.construct, None)
    return out


def _paths(value: Any, prefix: str = "") -> set[str]:
    """The key paths a JSON value reaches (array items as ``[]``)."""
    out = {prefix}
    if isinstance(value, dict):
        for key, child in value.items():
            out |= _paths(child, f"{prefix}.{key}")
    elif isinstance(value, list):
        for child in value:
            out |= _paths(child, prefix + "[]")
    return out


def enforces(grammar: Grammar, schema: Any, rng: random.Random) -> bool:
    """Does the grammar hold ``schema``: every random walk valid, and no directed probe (a
    schema literal, a one-edit mutation of a walk) admitted although invalid?"""
    check = validator(schema)
    walks: list[tuple[set[str], Any]] = []
    for _ in range(WALKS):
        text = grammar.sample(rng)
        try:
            value = json.loads(text)
        except ValueError:
            return False
        if not check.is_valid(value):
            return False
        walks.append((_paths(value), value))
    # probe the walks that together reach the most key paths (greedy cover)
    samples: list[Any] = []
    covered: set[str] = set()
    for _ in range(PROBED_WALKS):
        reach, value = max(walks, key=lambda w: len(w[0] - covered))
        if samples and not reach - covered:
            break
        samples.append(value)
        covered |= reach
    return counterexample(grammar, schema, samples) is None
