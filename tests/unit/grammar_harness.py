"""Shared by the grammar tests: load the corpora, validate walks with formats asserted."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema

from localllm.grammar.compile import CompiledGrammar, compile_schema, validator_class
from localllm.grammar.walk import Grammar
from tests.conftest import REPO

CORPUS_DIR = REPO / "grammar" / "corpus"
REALWORLD = REPO / "grammar" / "realworld" / "schemas.jsonl"

_RFC3339_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$")


def _date_time(value: object) -> bool:
    if not isinstance(value, str) or "T" not in value:
        return not isinstance(value, str)
    day, _, time = value.partition("T")
    if not _RFC3339_TIME.match(time):
        return False
    try:
        datetime.fromisoformat(day)
    except ValueError:
        return False
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", day))


def _time(value: object) -> bool:
    return not isinstance(value, str) or bool(_RFC3339_TIME.match(value))


def validator(schema: Any) -> Any:
    """The jsonschema validator for the schema's draft, formats asserted (date-time and time strictly)."""
    cls = validator_class(schema)
    checker = jsonschema.FormatChecker(list(cls.FORMAT_CHECKER.checkers))
    checker.checks("date-time")(_date_time)
    checker.checks("time")(_time)
    return cls(schema, format_checker=checker)


def corpus() -> Iterator[tuple[str, Any]]:
    for path in sorted(CORPUS_DIR.glob("*.json")):
        yield f"corpus/{path.stem}", json.loads(path.read_text())["schema"]


def realworld() -> Iterator[tuple[str, Any]]:
    for line in REALWORLD.read_text().splitlines():
        entry = json.loads(line)
        yield entry["id"], entry["schema"]


def invalid_walks(schema: Any, compiled: CompiledGrammar, n: int, seed: int = 0) -> list[str]:
    """Random walks of the compiled grammar that are not valid JSON or not schema-valid."""
    assert compiled.grammar is not None
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    rng = random.Random(seed)
    bad = []
    for _ in range(n):
        text = grammar.sample(rng)
        try:
            value = json.loads(text)
        except ValueError:
            bad.append(text)
            continue
        if not check.is_valid(value):
            bad.append(text)
    return bad


def coverage(entries: list[tuple[str, Any]], *, space: bool = False) -> tuple[int, dict[str, int]]:
    """How many compile exactly, and the refusals counted by construct."""
    exact = 0
    refused: dict[str, int] = {}
    for _, schema in entries:
        compiled = compile_schema(schema, space=space)
        if compiled.exact:
            exact += 1
        else:
            construct = compiled.refusals[0].construct
            refused[construct] = refused.get(construct, 0) + 1
    return exact, refused


__all__ = ["Path", "corpus", "coverage", "invalid_walks", "realworld", "validator"]
