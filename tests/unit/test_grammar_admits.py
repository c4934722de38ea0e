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
        # a negated enum's intervals are flagged bounds, merged with the plain ones beside them
        {"$schema": D4, "type": "integer", "maximum": 2, "not": {"enum": [3]}},
        {"$schema": D4, "type": "number", "minimum": 4, "not": {"enum": [1, 3]}},
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


# ---------------------------------------------------------------------------- "not": {"type": "integer"}

D7 = "http://json-schema.org/draft-07/schema#"
#: numbers as written within what a non-integer grammar generates: no exponent, at most 6
#: decimals, an integer part below 10^9
_PLAIN = [
    "0",
    "1",
    "-1",
    "7",
    "0.0",
    "1.0",
    "-1.0",
    "5.000000",
    "1.5",
    "-0.5",
    "0.000001",
    "-0.000001",
    "2.999999",
    "3.25",
    "999999999.5",
    "-999999999.999999",
]
#: with an exponent: floats to a parser, integers in value from draft 6 on (1e2 is 100)
_EXPONENTS = ["1e2", "1E2", "1.5e1", "0e0", "-2E-2", "1.0e1", "1.25e+1"]


@pytest.mark.parametrize("draft", [None, D7])
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "not": {"type": "integer"}},
        {"not": {"type": "integer"}},
        {"type": ["number", "string"], "not": {"type": "integer"}},
        {"type": "number", "not": {"type": ["integer", "string"]}},
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        {"type": "number", "not": {"type": "integer"}, "minimum": -1, "exclusiveMaximum": 3},
        {"type": "number", "allOf": [{"not": {"type": "integer"}}, {"not": {"minimum": 3}}]},
    ],
)
def test_a_negated_integer_type_admits_the_numbers_with_a_fraction(draft: str | None, schema: dict[str, Any]) -> None:
    # from draft 6 on 1.0 is an integer: the fraction digits are never all 0
    schema = {**schema, "$schema": draft} if draft else schema
    assert disagreements(schema, _PLAIN) == []
    grammar = compiled_grammar(schema)
    assert [t for t in _EXPONENTS if grammar.matches(t)] == []  # narrower: no exponent form
    assert [t for t in ("1.5", "-0.25", "2.999999") if grammar.matches(t)] == ["1.5", "-0.25", "2.999999"]


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": D4, "type": "number", "not": {"type": "integer"}},
        {"$schema": D4, "not": {"type": "integer"}},
        {"$schema": D4, "oneOf": [{"type": "integer"}, {"type": "number"}]},
    ],
)
def test_draft4_reads_every_number_with_a_fraction_or_exponent_as_no_integer(schema: dict[str, Any]) -> None:
    # draft 4's integers are what the parser reads as int: 1.0 and 1e2 are not, and both are generated
    assert disagreements(schema, [*_PLAIN, *_EXPONENTS]) == []
    assert compile_schema(schema).notes == []


def test_draft4_bounded_non_integers_include_whole_values_written_with_a_point() -> None:
    schema = {"$schema": D4, "type": "number", "not": {"type": "integer"}, "minimum": 1, "maximum": 3}
    assert disagreements(schema, _PLAIN) == []
    assert compiled_grammar(schema).matches("2.0")


def test_unbounded_non_integers_name_their_narrowing() -> None:
    compiled = compile_schema({"type": "number", "not": {"type": "integer"}})
    assert compiled.exact and [n.split(":")[0] for n in compiled.notes] == ["$"]


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        # no value at all: the refusal names the negation
        ({"type": "integer", "not": {"type": "integer"}}, "not"),
        ({"type": "number", "not": {"type": "integer"}, "minimum": 5, "maximum": 5}, "not"),
        ({"type": "number", "not": {"type": "integer"}, "multipleOf": 2}, "not"),
        # draft 4: whole values written with a point, but only the integers the step divides,
        # and those beside a bound only between two
        ({"$schema": D4, "type": "number", "not": {"type": "integer"}, "multipleOf": 1, "minimum": 3}, "multipleOf"),
    ],
)
def test_non_integers_nothing_generates_are_refused(schema: dict[str, Any], construct: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [(r.path, r.construct) for r in compiled.refusals] == [("$", construct)]


_D4_NOT_INTEGER = {"$schema": D4, "type": "number", "not": {"type": "integer"}}


@pytest.mark.parametrize(
    "schema",
    [
        {**_D4_NOT_INTEGER, "multipleOf": 2},
        {**_D4_NOT_INTEGER, "multipleOf": 1},
        {**_D4_NOT_INTEGER, "multipleOf": 3, "minimum": 0},
        # listed between two bounds: whole multiples were written as integers (none validated)
        {**_D4_NOT_INTEGER, "multipleOf": 2, "minimum": 0, "maximum": 10},
        {**_D4_NOT_INTEGER, "multipleOf": 0.5, "minimum": 0, "maximum": 3},
    ],
)
def test_draft4_non_integer_multiples_are_whole_values_written_with_a_point(schema: dict[str, Any]) -> None:
    # draft 4 reads 2.0 as no integer, and a float's remainder by an integer step is exact;
    # a whole value is written with one 0 after the point (5.000000 is valid, not generated)
    big = ["123456789012345.0", "123456789012344.0", "-999999999999999.0"]
    probes = [t for t in [*NUMBERS, *_PLAIN, *big] if not t.endswith(".000000")]
    assert disagreements(schema, probes) == []
    assert compiled_grammar(schema).matches("0.0")


# ---------------------------------------------------------------------------- decimal steps merged in allOf

#: numbers as the listing writes them: integers, and decimals with no trailing zero
_STEPS_PROBES = sorted(
    {*(str(n) for n in range(-2, 12)), *(str(n / 10) for n in range(-10, 40)), *(str(n / 4) for n in range(-4, 16))}
    - {f"{n}.0" for n in range(-3, 12)},
    key=float,
)


@pytest.mark.parametrize(
    ("schema", "admitted"),
    [
        (
            {"type": "number", "minimum": 0, "maximum": 3, "allOf": [{"multipleOf": 0.5}, {"multipleOf": 0.25}]},
            ["0", "0.5", "1", "1.5", "2", "2.5", "3"],
        ),
        # the common multiples are 0.6 apart (jsonschema's float division, 0.6 / 0.3 =
        # 1.9999999999999998, kept only 0, 1.8 and 3; multipleOf is decided exactly now)
        (
            {"type": "number", "minimum": 0, "maximum": 3, "allOf": [{"multipleOf": 0.3}, {"multipleOf": 0.2}]},
            ["0", "0.6", "1.2", "1.8", "2.4", "3"],
        ),
        (
            {"type": "integer", "minimum": 0, "maximum": 10, "allOf": [{"multipleOf": 0.5}, {"multipleOf": 1.5}]},
            ["0", "3", "6", "9"],
        ),
        (
            {"$schema": D4, "minimum": -1, "maximum": 2, "allOf": [{"multipleOf": 0.5}, {"multipleOf": 2}]},
            ["0", "2"],
        ),
    ],
)
def test_decimal_steps_merged_in_all_of_admit_the_common_multiples_the_validator_accepts(
    schema: dict[str, Any], admitted: list[str]
) -> None:
    grammar = compiled_grammar(schema)
    check = validator(schema)
    assert [t for t in _STEPS_PROBES if grammar.matches(t)] == admitted
    assert [t for t in _STEPS_PROBES if check.is_valid(json.loads(t))] == admitted
    # other kinds of value: what the schema's type admits (with no type, the number keywords
    # narrow the grammar to numbers, as they do without the allOf)
    others = ['"a"', "null", "[]", "{}", "true"]
    assert [t for t in others if grammar.matches(t)] == []


def test_decimal_steps_merged_without_two_bounds_are_their_least_common_multiple() -> None:
    schema = {"type": "number", "minimum": 0, "allOf": [{"multipleOf": 0.5}, {"multipleOf": 0.25}, {"multipleOf": 0.3}]}
    grammar = compiled_grammar(schema)
    check = validator(schema)
    probes = ["0", "1.5", "3", "4.5", "1500", "0.5", "0.3", "0.75", "-1.5", "1.50"]
    assert [t for t in probes if grammar.matches(t)] == ["0", "1.5", "3", "4.5", "1500"]  # one decimal, as 1.5
    assert all(check.is_valid(json.loads(t)) for t in ("1.5", "4.5", "1500"))
    refused = compile_schema({"allOf": [{"multipleOf": 0.1234567891}, {"multipleOf": 0.9876543217}]})
    assert [(r.path, r.construct) for r in refused.refusals] == [("$", "multipleOf")]


# ---------------------------------------------------------------------------- keywords the draft lacks

D6 = "http://json-schema.org/draft-06/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
_ARRAYS = ["[]", "[1]", "[1,1]", "[2]", "[1,2]", "[2,2]", '["a"]', '[1,"a"]']
_OBJECTS = ["{}", '{"a":1}', '{"b":1}', '{"a":1,"b":2}', '{"ab":1}', '{"a":"x"}']
_SCALARS = ["1", "2", "3", '"a"', "null", "true"]


@pytest.mark.parametrize(
    ("schema", "texts"),
    [
        # validation ignores a keyword the schema's draft does not have: so does the grammar
        ({"$schema": D4, "type": "array", "contains": {"const": 1}}, _ARRAYS),
        ({"$schema": D4, "type": "array", "items": [{"const": 1}], "additionalItems": False}, _ARRAYS),
        ({"$schema": D4, "type": "object", "propertyNames": {"maxLength": 1}}, _OBJECTS),
        ({"$schema": D4, "const": 1}, _SCALARS),
        ({"$schema": D4, "type": "integer", "allOf": [{"const": 1}, {"const": 2}]}, _SCALARS),
        ({"$schema": D4, "type": "integer", "enum": [1, 2], "const": 2}, _SCALARS),
        ({"$schema": D4, "type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}, _OBJECTS),
        ({"$schema": D7, "type": "array", "items": {"type": "integer"}, "unevaluatedItems": False}, _ARRAYS),
        (
            {
                "$schema": D6,
                "type": "array",
                "allOf": [{"contains": {"const": 1}, "minContains": 2}, {"contains": {"const": 1}, "minContains": 3}],
            },
            _ARRAYS,
        ),
        ({"type": "array", "prefixItems": [{"const": 1}], "additionalItems": {"type": "string"}}, _ARRAYS),
        ({"$schema": D7, "type": "integer", "divisibleBy": 2}, _SCALARS),
        ({"$schema": D7, "type": "integer", "disallow": "integer"}, _SCALARS),
        ({"$schema": D7, "type": "integer", "extends": {"maximum": 1}}, _SCALARS),
        ({"type": "integer", "$recursiveRef": "#/$defs/one", "$defs": {"one": {"const": 1}}}, _SCALARS),
        ({"$schema": D2019, "type": "integer", "$dynamicRef": "#/$defs/one", "$defs": {"one": {"const": 1}}}, _SCALARS),
    ],
)
def test_keywords_the_draft_lacks_constrain_nothing(schema: dict[str, Any], texts: list[str]) -> None:
    assert disagreements(schema, texts) == []


@pytest.mark.parametrize(
    "schema",
    [
        # draft 4 has no "const": the first branch admits every value, so an integer matches both
        {"$schema": D4, "oneOf": [{"const": "a"}, {"type": "integer"}]},
        {"$schema": D4, "oneOf": [{"type": "array", "contains": {"const": 1}}, {"type": "array", "maxItems": 0}]},
    ],
)
def test_one_of_branches_are_not_told_apart_by_keywords_the_draft_lacks(schema: dict[str, Any]) -> None:
    assert disagreements(schema, [*_SCALARS, *_ARRAYS, "5", "1.5"]) == []


# ---------------------------------------------------------------------------- contains counts in allOf


@pytest.mark.parametrize(
    "schema",
    [
        # each component's minContains/maxContains counts its own contains (1 when absent)
        {
            "type": "array",
            "items": {"type": "integer"},
            "allOf": [{"contains": {"const": 1}}, {"contains": {"const": 1}, "minContains": 0}],
        },
        {
            "type": "array",
            "items": {"type": "integer"},
            "contains": {"const": 1},
            "allOf": [{"contains": {"const": 1}, "minContains": 0}],
        },
        # a count without its contains means nothing
        {"type": "array", "items": {"type": "integer"}, "allOf": [{"minContains": 0}, {"contains": {"const": 1}}]},
        {
            "type": "array",
            "items": {"type": "integer"},
            "allOf": [{"contains": {"const": 1}, "maxContains": 1}, {"maxContains": 3}],
        },
        # one contains in both: the tighter counts
        {
            "type": "array",
            "items": {"type": "integer"},
            "allOf": [
                {"contains": {"const": 1}, "minContains": 2},
                {"contains": {"const": 1}, "minContains": 3, "maxContains": 4},
            ],
        },
    ],
)
def test_contains_counts_merge_with_their_own_contains(schema: dict[str, Any]) -> None:
    arrays = ["[]", "[2]", "[1]", "[1,1]", "[1,2]", "[1,1,1]", "[1,1,1,1]", "[1,1,1,1,1]", "[2,1,1,1]"]
    assert disagreements(schema, arrays) == []
