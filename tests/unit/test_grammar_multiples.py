"""multipleOf: integer steps without two bounds (divisibility of a decimal integer is regular:
one rule per remainder and digit count), decimal steps between two bounds (each multiple
listed and kept only when the validator accepts it) and without (the digits, point aside,
divisible by the step's digits), steps merged across allOf by their least common multiple.
The validator decides multipleOf exactly on the decimals written (jsonschema's float
division called 0.07 and 19.99 no multiples of 0.01). What stays refused says why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from localllm.grammar.compile import MAX_STEP, compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, validator


def _agrees_on_integers(schema: Any, lo: int = -400, hi: int = 400) -> list[int]:
    """Integers in [lo, hi] where the grammar and the validator disagree."""
    g = grammar_of(schema)
    check = validator(schema)
    return [x for x in range(lo, hi) if g.matches(str(x)) != check.is_valid(x)]


@pytest.mark.parametrize(
    "schema",
    [
        {"multipleOf": 2},  # JSON-Schema-Test-Suite multipleOf group 0
        {"type": "integer", "multipleOf": 3},
        {"type": "integer", "multipleOf": 7, "minimum": 0},
        {"type": "integer", "multipleOf": 4, "exclusiveMinimum": 0},
        {"type": "integer", "multipleOf": 6, "maximum": 5},
        {"type": "integer", "multipleOf": MAX_STEP},
        # if-then-else group 5: else multipleOf 2 where the if (exclusiveMaximum 0) fails
        {"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"multipleOf": 2}},
    ],
)
def test_integer_steps_without_two_bounds_compile_exactly(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    if "if" not in schema:
        assert _agrees_on_integers(schema) == []


@pytest.mark.parametrize(
    "schema",
    [
        # refused before ("a bound other than 0", and more than 256 multiples between two):
        # JSON Schema Store's minecraft dimension height, Github_hard o41232's multiple
        {"type": "integer", "minimum": 0, "maximum": 4096, "multipleOf": 16},
        {"exclusiveMaximum": 100, "default": 20, "multipleOf": 10, "type": "number"},
        {"type": "integer", "multipleOf": 4, "minimum": 5},
        {"type": "number", "multipleOf": 7, "exclusiveMinimum": -300.5, "exclusiveMaximum": 2000},
        {"type": "integer", "multipleOf": 32, "maximum": -33},
        {"type": "integer", "multipleOf": 3, "minimum": -1000, "maximum": 1000, "not": {"multipleOf": 2}},
    ],
)
def test_integer_steps_beside_any_bounds_compile_exactly(schema: dict[str, Any]) -> None:
    """A digit walk keeps the remainder and, while the digits equal a bound's, the bound's
    digits still to compare: the grammar and the validator agree on every integer near the
    bounds and far past them."""
    assert _agrees_on_integers(schema, -3000, 5000) == []
    assert invalid_walks(schema, compile_schema(schema), 300) == []


def test_integer_multiples_cap_their_digits() -> None:
    g = grammar_of({"type": "integer", "multipleOf": 3})
    assert g.matches("9" * 15 + "9") and not g.matches("3" * 18) and not g.matches("03") and not g.matches("-0")
    assert g.matches("-" + "3" * 16)


def test_number_multiples_are_written_as_integers_with_a_note() -> None:
    compiled = compile_schema({"type": "number", "multipleOf": 5})
    g = grammar_of({"type": "number", "multipleOf": 5})
    assert g.matches("-15") and not g.matches("15.0") and not g.matches("16")
    assert any("written as integers" in note for note in compiled.notes)


def test_all_of_integer_steps_merge_by_lcm() -> None:
    # JSON-Schema-Test-Suite allOf group 11: allOf 2, anyOf 3, oneOf 5 -> multiples of 30
    schema = {"allOf": [{"multipleOf": 2}], "anyOf": [{"multipleOf": 3}], "oneOf": [{"multipleOf": 5}]}
    assert _agrees_on_integers(schema, -200, 200) == []
    assert grammar_of(schema).matches("90")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1},
        {"multipleOf": 1.5, "minimum": -10, "exclusiveMaximum": 9},
        {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 0, "maximum": 3},
        {"type": "integer", "multipleOf": 2.5, "minimum": 0, "maximum": 40},
    ],
)
def test_decimal_steps_between_bounds_list_what_the_validator_accepts(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    g = grammar_of(schema)
    check = validator(schema)
    for k in range(-1200, 1200):
        for text in (f"{k / 100:.2f}".rstrip("0").rstrip("."), str(k)):
            if g.matches(text):
                assert check.is_valid(float(text) if "." in text else int(text)), text


def test_decimal_step_admits_its_listed_multiples() -> None:
    g = grammar_of({"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 1})
    assert [t for t in ("0", "0.25", "0.5", "0.75", "1", "0.3", "1.25", "-0.25") if g.matches(t)] == [
        "0",
        "0.25",
        "0.5",
        "0.75",
        "1",
    ]


def _numbers() -> list[str]:
    """Number texts: signs, integer parts, fractions of 0-5 digits (trailing zeros too), exponents."""
    ints = [str(i) for i in range(130)] + ["999", "1000", "1234567890", "12345678901234", "123456789012345"]
    fractions = ["", ".0", ".00", ".5", ".25", ".50", ".75", ".05", ".01", ".07", ".99", ".125", ".0001"]
    fractions += [".0075", ".00751", ".3", ".33", ".1", ".10", ".2", ".45", ".30000"]
    texts = [sign + i + f for sign in ("", "-") for i in ints for f in fractions]
    return [*texts, "1e2", "1.5e1", "-0", "00", "01.5", "0.0", "600.03", "19.99", "4.02", "1.11"]


def _valid(check: Any, text: str) -> bool:
    """Whether ``text`` is JSON (``00`` is not) the validator accepts."""
    try:
        return bool(check.is_valid(json.loads(text)))
    except ValueError:
        return False


@pytest.mark.parametrize(
    "schema",
    [
        {"multipleOf": 0.0001},  # JSON-Schema-Test-Suite multipleOf group 2: no bounds
        {"multipleOf": 1.5},  # JSON-Schema-Test-Suite multipleOf group 1
        {"type": "number", "multipleOf": 0.01},
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 99999999999999.98},  # Github_easy o46421
        {"type": "number", "multipleOf": 0.25, "minimum": 0},
        {"type": "number", "multipleOf": 0.05, "exclusiveMinimum": 0},
        {"type": "number", "multipleOf": 0.2, "minimum": 0.2},
        {"type": "number", "multipleOf": 0.5, "maximum": 0},
        {"type": "number", "multipleOf": 0.3, "exclusiveMaximum": 0},
        {"type": "integer", "multipleOf": 0.5},  # every integer
        {"type": "integer", "multipleOf": 2.5, "minimum": 0},  # the multiples of 5
        {"allOf": [{"multipleOf": 0.25}, {"multipleOf": 0.1}]},  # merged: 0.5
        # a step of 10^-k beside any bounds (refused before: "a bound other than 0"): the
        # bounded numbers with at most k decimals (JSONSchemaBench Github_easy o46379's amount)
        {"type": "number", "multipleOf": 0.01, "minimum": 5},
        {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": 0.01},
        {"type": "number", "multipleOf": 0.1, "exclusiveMinimum": -2.5, "maximum": 1000},
        {"type": "number", "multipleOf": 0.001, "maximum": 5},
        {"type": "number", "multipleOf": 0.01, "minimum": -99999999999999.98, "maximum": 99999999999999.98},
        # any step a / 10^k (a up to 32) beside any bounds: Github_medium o74461's skill value
        {"maximum": 100, "minimum": 0, "multipleOf": 0.25, "type": "number"},
        {"type": "number", "multipleOf": 0.25, "minimum": 5},
        {"type": "number", "multipleOf": 0.05, "exclusiveMinimum": -3.3, "maximum": 120.5},
        {"type": "number", "multipleOf": 1.5, "exclusiveMaximum": 7.5},
    ],
)
def test_decimal_steps_without_two_bounds_admit_only_valid_multiples(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    g = grammar_of(schema)
    check = validator(schema)
    texts = _numbers()
    admitted = [t for t in texts if g.matches(t)]
    assert [t for t in admitted if not _valid(check, t)] == []
    # every valid number written with at most the step's decimals and 15 digits, no exponent,
    # no leading zero and a nonzero value is admitted (trailing zeros within the decimals too)
    decimals = len(str(schema.get("multipleOf", 0.5)).partition(".")[2])
    meant = [
        t
        for t in texts
        if _valid(check, t)
        and "e" not in t
        and len(t.lstrip("-").partition(".")[2]) <= decimals
        and len(t.lstrip("-").partition(".")[0]) <= 15 - decimals  # 15 digits: the float is the decimal
        and not t.lstrip("-").startswith("00")
        and not (t.lstrip("-").startswith("0") and t.lstrip("-")[1:2].isdigit())
        and json.loads(t) != 0
    ]
    if schema.get("type") != "integer":
        assert [t for t in meant if t not in admitted] == []
    assert len(admitted) >= 20


def test_prices_the_validator_refused_are_multiples_now() -> None:
    schema = {"type": "number", "multipleOf": 0.01, "minimum": 0}
    check = validator(schema)
    g = grammar_of(schema)
    for text in ("0.07", "19.99", "600.03", "4.02", "1.11", "10001.12", "0", "3"):
        assert check.is_valid(json.loads(text)) and g.matches(text), text
    for text in ("0.075", "-0.07", "19.999", "1e-2"):
        assert not g.matches(text), text
    assert not check.is_valid(0.075) and not check.is_valid(0.30000000000000004)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.75, "minimum": 5},  # digits above 32 and a bound off 0
        {"type": "number", "multipleOf": 0.75},  # digits 75 above MAX_STEP
        {"type": "integer", "multipleOf": MAX_STEP + 1},
        {"type": "integer", "multipleOf": 0.123456789},  # JSON-Schema-Test-Suite group 3: integers step 123456789
    ],
)
def test_what_stays_refused_names_multiple_of(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == ["multipleOf"]


# -- "not" of multipleOf: the numbers left, a remainder set or a listed range ---------------
HAZELCAST_GROUP_SIZE = {  # JSONSchemaBench JsonSchemaStore/hazelcast-config-5.3: an odd CP group size
    "anyOf": [{"const": 0}, {"type": "integer", "minimum": 3, "maximum": 7, "not": {"multipleOf": 2}}]
}


@pytest.mark.parametrize(
    "schema",
    [
        HAZELCAST_GROUP_SIZE,
        {"type": "integer", "not": {"multipleOf": 2}},
        {"type": "integer", "minimum": 1, "not": {"multipleOf": 8}},
        {"type": "integer", "exclusiveMaximum": 0, "not": {"multipleOf": 5}},
        {"type": "integer", "multipleOf": 3, "not": {"multipleOf": 2}},
        {"type": "integer", "allOf": [{"not": {"multipleOf": 2}}, {"not": {"multipleOf": 3}}]},  # lcm 6
        {"type": "integer", "minimum": -50, "maximum": 150, "not": {"multipleOf": 7}},  # listed
        {"type": "number", "not": {"multipleOf": 3}},
        {"not": {"multipleOf": 2}},  # JSON-Schema-Test-Suite's not/multipleOf shape: numbers only
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "not": {"multipleOf": 4}},
    ],
)
def test_not_multiple_of_an_integer_step_compiles_exactly_on_integers(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    assert _agrees_on_integers(schema) == []


def test_a_number_type_beside_not_multiple_of_keeps_its_fractions() -> None:
    g = grammar_of({"type": "number", "not": {"multipleOf": 2}})
    assert g.matches("1.5") and g.matches("-0.25") and g.matches("3")
    assert not g.matches("2.0") and not g.matches("4") and not g.matches('"x"')
    integers = grammar_of({"type": "integer", "minimum": 3, "maximum": 7, "not": {"multipleOf": 2}})
    assert [n for n in range(0, 10) if integers.matches(str(n))] == [3, 5, 7]
    assert not integers.matches("3.5")


@pytest.mark.parametrize(
    ("schema", "construct", "unsatisfiable"),
    [
        ({"type": "integer", "not": {"multipleOf": 1.5}}, "not", False),  # a decimal step
        ({"type": "integer", "not": {"multipleOf": 64}}, "not", False),  # 64 remainders, above MAX_STEP
        ({"type": "integer", "allOf": [{"not": {"multipleOf": 6}}, {"not": {"multipleOf": 7}}]}, "not", False),
        ({"type": "integer", "multipleOf": 4, "not": {"multipleOf": 2}}, "not", True),
        ({"type": "integer", "minimum": 4, "maximum": 4, "not": {"multipleOf": 2}}, "not", True),
    ],
)
def test_not_multiple_of_what_stays_refused_says_why(
    schema: dict[str, Any], construct: str, unsatisfiable: bool
) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == [construct]
    assert compiled.unsatisfiable is unsatisfiable


#: JSONSchemaBench Handwritten allany6 ("result must be mof 420 and the range is negative"):
#: negations merged across allOf components nest their anyOfs; read one level deep, the
#: rewrite went round until "allOf nested deeper than 64"
ALLANY6 = {
    "type": "number",
    "allOf": [
        {"minimum": -4000},
        {"maximum": -3000},
        {"minimum": -10000},
        {"maximum": -2000},
        {"$ref": "#/definitions/any1"},
        {"$ref": "#/definitions/any2"},
        {"$ref": "#/definitions/any3"},
        {"not": {"multipleOf": 8}},
    ],
    "definitions": {
        "any1": {"anyOf": [{"multipleOf": 33}, {"multipleOf": 12}, {"multipleOf": 77}]},
        "any2": {"anyOf": [{"allOf": [{"not": {"multipleOf": 6}}, {"not": {"multipleOf": 7}}]}, {"multipleOf": 35}]},
        "any3": {"anyOf": [{"not": {"multipleOf": 11}}, {"multipleOf": 7}]},
    },
}


def test_negations_merged_into_nested_any_ofs_compile_exactly() -> None:
    compiled = compile_schema(ALLANY6)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(ALLANY6, compiled, 200) == []
    assert _agrees_on_integers(ALLANY6, -4500, -2500) == []
    g = grammar_of(ALLANY6)
    assert [n for n in range(-4500, -2500) if g.matches(str(n))] == [-3850, -3780, -3465]
