"""Valid answers the compiler once refused: each grammar here admits exactly the probes the
validator accepts (within the numbers it generates: no "-0", integer part below 10^9, at
most 6 decimals), and random walks and one-edit mutations of them all validate."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import counterexample, invalid_walks, validator

D4 = "http://json-schema.org/draft-04/schema#"
WALKS = 300

#: numbers as written: integers, the same values with a fraction part, and values between them
NUMBERS = [
    *(str(n) for n in range(-3, 10)),
    *(f"{n}.0" for n in range(-3, 10)),
    *(f"{n}.5" for n in range(-3, 10)),
    "0.000001",
    "4.999999",
    "5.000001",
    "2.999999",
    "3.000001",
    "1.000001",
    "0.999999",
    "-0.5",
    "-0.000001",
]


def compiled_grammar(schema: Any) -> Grammar:
    """The schema's grammar: it compiles, walks validate, no mutation of a walk leaks."""
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, WALKS) == []
    grammar = Grammar.parse(compiled.grammar)
    rng = random.Random(1)
    samples = [json.loads(grammar.sample(rng)) for _ in range(20)]
    assert counterexample(grammar, schema, samples) is None
    return grammar


def disagreements(schema: Any, texts: list[str]) -> list[tuple[str, bool]]:
    """(text, what the validator says) for each text the grammar judges otherwise."""
    grammar = compiled_grammar(schema)
    check = validator(schema)
    out = []
    for text in texts:
        valid = check.is_valid(json.loads(text))
        if grammar.matches(text) != valid:
            out.append((text, valid))
    return out


# ---------------------------------------------------------------------------- draft 4's exclusive flags


_D4_BOUNDS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"maximum": 5}, {"maximum": 7, "exclusiveMaximum": True}),
    ({"maximum": 7, "exclusiveMaximum": True}, {"maximum": 5}),
    ({"maximum": 5, "exclusiveMaximum": True}, {"maximum": 3}),
    ({"maximum": 5, "exclusiveMaximum": False}, {"maximum": 7, "exclusiveMaximum": True}),
    ({"maximum": 5, "exclusiveMaximum": True}, {"maximum": 5}),
    ({"maximum": 5, "exclusiveMaximum": True}, {"maximum": 7}),
    ({"minimum": 1, "exclusiveMinimum": True}, {"minimum": 2}),
    ({"minimum": 3}, {"minimum": 1, "exclusiveMinimum": True}),
    ({"minimum": 2, "exclusiveMinimum": True}, {"minimum": 2, "exclusiveMinimum": False}),
    ({"minimum": 1, "exclusiveMinimum": True, "maximum": 8}, {"minimum": 2, "maximum": 6, "exclusiveMaximum": True}),
]


@pytest.mark.parametrize(("a", "b"), _D4_BOUNDS)
@pytest.mark.parametrize("kind", ["number", "integer"])
@pytest.mark.parametrize("shape", ["allOf", "sibling", "anyOf"])
def test_draft4_bounds_merged_keep_each_ones_exclusiveness(
    a: dict[str, Any], b: dict[str, Any], kind: str, shape: str
) -> None:
    # each component's flag applies to its own bound only: the tighter bound keeps its flag
    if shape == "allOf":
        schema: dict[str, Any] = {"$schema": D4, "type": kind, "allOf": [a, b]}
    elif shape == "sibling":
        schema = {"$schema": D4, "type": kind, **a, "allOf": [b]}
    else:  # siblings distributed into each anyOf branch
        schema = {"$schema": D4, "type": kind, **a, "anyOf": [b, {"maximum": -100}]}
    assert disagreements(schema, NUMBERS) == []


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": D4, "type": "number", "not": {"maximum": 5, "exclusiveMaximum": True}},
        {"$schema": D4, "type": "number", "not": {"minimum": 2, "exclusiveMinimum": True}},
        {"$schema": D4, "type": "integer", "not": {"minimum": 2, "exclusiveMinimum": True, "maximum": 6}},
        {"$schema": D4, "type": "number", "oneOf": [{"maximum": 5, "exclusiveMaximum": True}, {"minimum": 3}]},
        {
            "$schema": D4,
            "type": "integer",
            "oneOf": [{"maximum": 5, "exclusiveMaximum": True}, {"minimum": 3, "exclusiveMinimum": True}],
        },
    ],
)
def test_draft4_exclusive_bounds_negate(schema: dict[str, Any]) -> None:
    assert disagreements(schema, NUMBERS) == []


# ---------------------------------------------------------------------------- DEL in patterns

#: strings as written: DEL (U+007F) escaped and raw, beside the characters around it
_DEL_TEXTS = [
    '""',
    '"\\u007f"',
    '"\\u007F"',
    '"\\u007f\\u007f"',
    '"\x7f"',
    '"a"',
    '"a\\u007f"',
    '"\\u007fa"',
    '"~"',
    '"\\u0080"',
    '"\\u001f"',
]


@pytest.mark.parametrize(
    ("pattern", "admitted"),
    [
        ("^\x7f+$", ['"\\u007f"', '"\\u007f\\u007f"']),
        ("^\\x7f+$", ['"\\u007f"', '"\\u007f\\u007f"']),
        ("^\\u007f{2}$", ['"\\u007f\\u007f"']),
        ("^[\x7f]$", ['"\\u007f"']),
        ("^a\x7f$", ['"a\\u007f"']),
        ("^[~-\\x80]$", ['"\\u007f"', '"~"']),
    ],
)
def test_del_in_a_pattern_is_written_as_an_escape(pattern: str, admitted: list[str]) -> None:
    # JSON may hold DEL raw, but the grammar writes it only as \u007f (as its "char" rule does)
    schema = {"type": "string", "pattern": pattern}
    grammar = compiled_grammar(schema)
    check = validator(schema)
    assert [t for t in _DEL_TEXTS if grammar.matches(t)] == admitted
    assert all(check.is_valid(json.loads(t)) for t in admitted)


def test_a_pattern_search_for_del_admits_it_among_other_characters() -> None:
    schema = {"type": "string", "pattern": "\x7f"}
    grammar = compiled_grammar(schema)
    # the DEL searched for is written \u007f; a \u007F is read by the "char" rule around it
    found = ['"\\u007f"', '"\\u007f\\u007f"', '"a\\u007f"', '"\\u007fa"']
    assert [t for t in _DEL_TEXTS if grammar.matches(t)] == found
