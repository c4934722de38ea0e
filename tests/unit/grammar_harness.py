"""Shared by the grammar tests: load the corpora, validate walks with formats asserted."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localllm.grammar.compile import CompiledGrammar, compile_schema, validator_class
from localllm.grammar.formats import format_checker
from localllm.grammar.walk import Grammar
from tests.conftest import REPO

CORPUS_DIR = REPO / "grammar" / "corpus"
REALWORLD = REPO / "grammar" / "realworld" / "schemas.jsonl"


class Runaway(Exception):
    """Raised by a test's counting wrapper once a step count shows work growing without bound
    (the test fails at once instead of hanging)."""


def validator(schema: Any) -> Any:
    """The validator for the schema's draft with formats asserted, as every answer path has it."""
    cls = validator_class(schema)
    return cls(schema, format_checker=format_checker(cls))


def both_paths(root: Path, schema: Any, data: Any) -> tuple[bool, bool]:
    """Is ``data`` valid on the answer path (``SchemaSet.validate``) and on the service's?"""
    from localllm.errors import AgentError
    from localllm.schema import SchemaSet
    from localllm.service.chat import _violation

    try:
        SchemaSet(root).validate(json.dumps(data), schema)
        answer_path = True
    except AgentError:
        answer_path = False
    return answer_path, _violation(schema, data) is None


def grammar_of(schema: Any, **kw: Any) -> Grammar:
    """The schema's compiled grammar, parsed (the test fails on a refusal)."""
    compiled = compile_schema(schema, **kw)
    assert compiled.grammar is not None, compiled.refusals
    return Grammar.parse(compiled.grammar)


def leaks(schema: Any, candidates: list[Any]) -> list[str]:
    """Candidates the compiled grammar admits although the schema rejects them."""
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return []
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    out = []
    for value in candidates:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if grammar.matches(text) and not check.is_valid(value):
            out.append(text)
    return out


def sound_on(schema: Any, texts: list[str]) -> list[str]:
    """Texts (JSON as written: key order, repeats) the grammar admits that parse to an invalid value."""
    grammar = grammar_of(schema)
    check = validator(schema)
    return [t for t in texts if grammar.matches(t) and not check.is_valid(json.loads(t))]


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


_NAME_KEYWORDS = ("properties", "patternProperties", "dependencies", "dependentSchemas", "dependentRequired")
_FILLERS: tuple[Any, ...] = ("x", 0, -1, 1.5, True, None, [], {}, ["x", "x"], [0, 0])
MAX_PROBES = 300  # per walk and level
_ASTRAL = "\U0001f600"


def _schema_literals(schema: Any) -> tuple[list[str], list[Any]]:
    """The names (property names, required names, pattern texts) and the values (const/enum
    members, bounds and their neighbours) a schema mentions: where a converter's hole hides."""
    names: list[str] = []
    values: list[Any] = []

    def add(bucket: list[Any], item: Any) -> None:
        if item not in bucket and len(bucket) < 40:
            bucket.append(item)

    def visit(node: Any, depth: int) -> None:
        if depth > 30:
            return
        if isinstance(node, list):
            for item in node:
                visit(item, depth + 1)
            return
        if not isinstance(node, dict):
            return
        for key in _NAME_KEYWORDS:
            if isinstance(node.get(key), dict):
                for name in node[key]:
                    add(names, name.strip("^$") if key == "patternProperties" else name)
        if isinstance(node.get("required"), list):
            for name in node["required"]:
                if isinstance(name, str):
                    add(names, name)
        for member in ([node["const"]] if "const" in node else []) + (
            node["enum"] if isinstance(node.get("enum"), list) else []
        ):
            add(values, member)
            if isinstance(member, str):
                add(names, member)
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            bound = node.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool):
                for v in (bound - 1, bound, bound + 1):
                    add(values, v)
        for key, child in node.items():
            if key not in ("const", "enum", "examples", "default"):
                visit(child, depth + 1)

    visit(schema, 0)
    return names, values


def _mutations(value: Any, level: int, names: list[str], values: list[Any]) -> Iterator[Any]:
    """Values one edit away from ``value``, by level: 0 reshapes (an array item repeated,
    dropped or added; a key dropped; a string doubled, cut, or with an astral character),
    1 puts a schema literal in place of a value, 2 adds a key (a schema name with a filler)."""
    if level == 1:
        yield from values
        yield from names
    if isinstance(value, dict):
        items = list(value.items())
        if level == 0:
            for i in range(len(items)):
                yield dict(items[:i] + items[i + 1 :])
        if level == 2:
            for name in names:
                if name not in value:
                    for filler in (*_FILLERS[::2], _ASTRAL + "x"):
                        for i in range(len(items) + 1):
                            yield dict([*items[:i], (name, filler), *items[i:]])
        for i, (key, child) in enumerate(items):
            for variant in _mutations(child, level, names, values):
                yield dict([*items[:i], (key, variant), *items[i + 1 :]])
    elif isinstance(value, list):
        if level == 0:
            if value:
                yield [*value, value[0]]
                yield [*value, *value]
                yield value[:-1]
                yield []
            for filler in _FILLERS:
                yield [*value, filler]
        for i, child in enumerate(value):
            for variant in _mutations(child, level, names, values):
                yield [*value[:i], variant, *value[i + 1 :]]
    elif isinstance(value, str) and level == 0:
        yield value + value
        yield value[:1]
        yield ""
        # an astral character is one code point but two \\u escapes (two grammar characters)
        for k in range(2, 41):
            yield _ASTRAL + "x" * (k - 2)


def counterexample(grammar: Grammar, schema: Any, samples: list[Any]) -> str | None:
    """An answer ``grammar`` admits although it breaks ``schema``, searched among the schema's
    own literals and one-edit mutations of ``samples`` (valid answers of the grammar): the
    directed probes random walks rarely hit (a key a pattern names, an enum value a ``not``
    excludes, a repeated array item), and extra keys that are not JSON. None when no probe
    gets through."""
    names, values = _schema_literals(schema)
    check = validator(schema)
    for sample in samples:
        text = json.dumps(sample, separators=(",", ":"))
        # not JSON at all: an extra key with a bad escape or a raw control character
        opens = [i + 1 for i, c in enumerate(text) if c == "{"][:20]
        closes = [i for i, c in enumerate(text) if c == "}"][:20]
        for bad in ('"\\q":0', '"\x01":0'):
            probes = [text[:i] + bad + "," + text[i:] for i in opens] + [text[:i] + bad + text[i:] for i in opens]
            probes += [text[:i] + "," + bad + text[i:] for i in closes]
            for probe in probes:
                if grammar.matches(probe):
                    return probe
    seen: set[str] = set()
    for level in range(3):
        for sample in samples:
            tried = 0
            for probe in _mutations(sample, level, names, values):
                text = json.dumps(probe, separators=(",", ":"))
                if text in seen:
                    continue
                seen.add(text)
                tried += 1
                if tried > MAX_PROBES:
                    break
                if not check.is_valid(probe) and grammar.matches(text):
                    return text
    return None


__all__ = ["Path", "corpus", "counterexample", "coverage", "invalid_walks", "realworld", "sound_on", "validator"]
