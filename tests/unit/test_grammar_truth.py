"""The checker as the truth about llama.cpp's converter: its holes, its false rejects, no tracebacks."""

from __future__ import annotations

from typing import Any

import pytest

from localllm.cli.grammar import verdict
from localllm.grammar import check_subset
from localllm.grammar.compile import compile_schema, schema_problem


def errors(schema: Any) -> list[tuple[str, str]]:
    return [(v.path, v.construct) for v in check_subset(schema) if v.severity == "error"]


def warnings(schema: Any) -> list[tuple[str, str]]:
    return [(v.path, v.construct) for v in check_subset(schema) if v.severity == "warning"]


OBJ = {"a": {"type": "integer", "minimum": 0, "maximum": 9}}


# ---------------------------------------------------------------------------- holes


@pytest.mark.parametrize("extra", [True, {}, {"type": "integer"}])
def test_extra_keys_beside_properties_are_a_hole(extra: Any) -> None:
    schema = {"type": "object", "properties": OBJ, "additionalProperties": extra}
    assert errors(schema) == [("$", "additionalProperties")]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": OBJ, "additionalProperties": False},
        {"type": "object", "properties": OBJ},
        {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3}},
    ],
)
def test_closed_objects_and_maps_are_not(schema: dict[str, Any]) -> None:
    assert errors(schema) == []


@pytest.mark.parametrize(
    "pattern", ["^.+$", "^[^a]+$", "^a\\\\b$", "^a\\tb$", '^a"b$', '^a\\"b$', "^[ -~]+$", "^\\x22$"]
)
def test_patterns_that_emit_raw_quote_backslash_or_control_are_a_hole(pattern: str) -> None:
    assert errors({"type": "string", "pattern": pattern}) == [("$", "pattern")]


@pytest.mark.parametrize(
    "pattern", ["^[a-z]+$", "^[A-Z]{2}-[0-9]{3}$", "^\\.$", "^[.+-]$", "^(a|b)+$", "^iglu:[a-zA-Z0-9-_.]+$"]
)
def test_plain_patterns_are_enforced(pattern: str) -> None:
    assert errors({"type": "string", "pattern": pattern}) == []


@pytest.mark.parametrize(
    ("bounds", "exact"),
    [
        ({"maximum": -5}, False),
        ({"minimum": 100}, False),
        ({"minimum": 1024}, False),
        ({"maximum": -100}, False),
        ({"exclusiveMaximum": -4}, False),
        ({"minimum": 2005}, False),
        ({"minimum": 0}, True),
        ({"minimum": 1}, True),
        ({"minimum": 9}, True),
        ({"minimum": 10}, True),
        ({"minimum": 25}, True),
        ({"minimum": 250}, True),
        ({"minimum": -123}, True),
        ({"maximum": 30}, True),
        ({"maximum": 0}, True),
        ({"maximum": -19}, True),
        ({"maximum": -10}, True),
        ({"minimum": 100, "maximum": 200}, True),
        ({"minimum": -100, "maximum": -5}, True),
    ],
)
def test_one_sided_integer_bounds_per_value(bounds: dict[str, int], exact: bool) -> None:
    found = errors({"type": "integer", **bounds})
    assert (found == []) == exact, found


def test_dates_are_value_level_warnings() -> None:
    for fmt in ("date", "date-time"):
        schema = {"type": "string", "format": fmt}
        assert errors(schema) == [] and warnings(schema) == [("$", "format")]
    assert check_subset({"type": "string", "format": "uuid"}) == []


# ---------------------------------------------------------------------------- former false rejects


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "anyOf": [{"type": "object", "properties": OBJ}, {"type": "object", "properties": {}}]},
        {"type": "string", "oneOf": [{"const": "a"}, {"enum": ["b", "c"]}]},
        {"type": "string", "anyOf": [{"maxLength": 2}, {"enum": ["abcd"]}]},
        {"$defs": {"o": {"type": "object", "properties": OBJ}}, "type": "object", "$ref": "#/$defs/o"},
        {"type": "string", "format": "date", "minLength": 10},
        {"type": "string", "format": "uuid", "minLength": 1, "maxLength": 36},
        {"type": "object", "properties": OBJ, "additionalProperties": False, "patternProperties": {"^x-": {}}},
        {
            "allOf": [
                {
                    "anyOf": [
                        {"type": "object", "properties": {"a": {"type": "string"}}},
                        {"type": "object", "properties": {"b": {"type": "string"}}},
                    ]
                },
                {"type": "object", "properties": {"c": {"type": "boolean"}}},
            ]
        },
    ],
)
def test_what_the_server_enforces_is_not_rejected(schema: dict[str, Any]) -> None:
    assert errors(schema) == []


def test_type_beside_any_of_that_does_not_imply_it_is_still_an_error() -> None:
    schema = {"type": "object", "anyOf": [{"type": "string"}, {"type": "object", "properties": OBJ}]}
    assert errors(schema) == [("$", "anyOf")]


def test_number_bounds_inside_all_of_are_warnings() -> None:
    schema = {"type": "number", "allOf": [{"minimum": 0}, {"maximum": 1}]}
    assert errors(schema) == [] and ("$", "allOf") in warnings(schema)
    assert verdict(check_subset(schema)) == "warning-only"


# ---------------------------------------------------------------------------- classes found on the real converter


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"type": "string", "minLength": 2}, [("$", "minLength")]),
        ({"type": "string", "minLength": 32, "maxLength": 32}, [("$", "minLength")]),
        ({"type": "string", "anyOf": [{"maxLength": 2}, {"minLength": 4}]}, [("$.anyOf[1]", "minLength")]),
        ({"type": "string", "minLength": 1}, []),
        ({"type": "string", "format": "uuid", "minLength": 36}, []),
    ],
)
def test_min_length_counts_escapes_so_a_surrogate_pair_is_a_hole(schema: Any, found: list[tuple[str, str]]) -> None:
    # "\ud83d\ude00" is two char repetitions in llama.cpp's char{m,} but one character
    assert errors(schema) == found


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"not": False}, []),
        ({"not": {"not": {}}}, []),
        ({"type": "string", "not": {"not": True}}, []),
        ({"not": {"not": {"type": "string"}}}, [("$", "not")]),
        ({"type": "string", "not": {"enum": ["no"]}}, [("$", "not")]),
    ],
)
def test_not_of_an_unsatisfiable_schema_constrains_nothing(schema: Any, found: list[tuple[str, str]]) -> None:
    assert errors(schema) == found


STR = {"type": "string"}


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"items": {"type": "number"}, "unevaluatedItems": STR}, []),
        ({"type": "object", "additionalProperties": STR, "unevaluatedProperties": False}, []),
        ({"properties": {"foo": STR}, "unevaluatedProperties": False}, []),
        ({"allOf": [{"properties": {"foo": STR}, "unevaluatedProperties": True}], "unevaluatedProperties": False}, []),
        (
            {"allOf": [{"unevaluatedProperties": True}, {"properties": {"foo": STR}, "unevaluatedProperties": False}]},
            [],
        ),
        ({"type": "array", "unevaluatedItems": False}, [("$", "unevaluatedItems")]),
        ({"type": "object", "unevaluatedProperties": False}, [("$", "unevaluatedProperties")]),
        (
            {"allOf": [{"properties": {"a": STR}}, {"properties": {"b": STR}, "unevaluatedProperties": False}]},
            [("$.allOf[1]", "unevaluatedProperties")],
        ),
    ],
)
def test_unevaluated_keywords_with_nothing_left_to_evaluate(schema: Any, found: list[tuple[str, str]]) -> None:
    assert errors(schema) == found


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"allOf": [{"maximum": 30}, {"minimum": 20}]}, []),
        ({"allOf": [{"prefixItems": [STR]}, {"unevaluatedItems": True}], "unevaluatedItems": False}, []),
        ({"allOf": [{"prefixItems": [True, STR]}]}, [("$.allOf[0]", "prefixItems")]),
        ({"allOf": [{"type": "integer", "minimum": 1}]}, [("$.allOf[0]", "minimum"), ("$.allOf[0]", "type")]),
    ],
)
def test_all_of_components_with_only_other_types_keywords_are_vacuous_on_its_object(
    schema: Any, found: list[tuple[str, str]]
) -> None:
    # without a type, llama.cpp turns allOf into an object: a number/string/array keyword
    # constrains no object (but a boolean subschema anywhere still fails the request)
    assert errors(schema) == found


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"type": "object", "additionalProperties": False, "patternProperties": {"^x$": STR}}, []),
        ({"properties": {"a": {"type": "boolean"}}, "patternProperties": {".*": {"type": "boolean"}}}, []),
        ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}}, [("$", "patternProperties")]),
        ({"properties": {"a": {"type": "boolean"}}, "patternProperties": {".*": STR}}, [("$", "patternProperties")]),
        (
            {"properties": {"a": {"type": "boolean"}}, "patternProperties": {".*": {"type": "boolean", "const": True}}},
            [("$", "patternProperties")],
        ),
    ],
)
def test_pattern_properties_on_closed_objects(schema: Any, found: list[tuple[str, str]]) -> None:
    # llama.cpp generates only declared names (none without "properties" when closed)
    assert errors(schema) == found


def test_all_of_any_of_refs_to_optional_objects_are_merged_exactly() -> None:
    defs: dict[str, Any] = {n: {"properties": {n: {"type": "number"}}} for n in ("a", "b", "c")}
    schema = {
        "definitions": defs,
        "type": "object",
        "allOf": [{"$ref": "#/definitions/a"}, {"anyOf": [{"$ref": "#/definitions/b"}, {"$ref": "#/definitions/c"}]}],
    }
    assert errors(schema) == []
    defs["c"]["additionalProperties"] = False
    assert errors(schema) == [("$.allOf[1]", "anyOf")]


D3 = "http://json-schema.org/draft-03/schema#"
D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        # before 2019-09, validation itself ignores every keyword beside "$ref"
        ({"$schema": D4, "definitions": {"l": {"type": "array"}}, "$ref": "#/definitions/l", "maxItems": 1}, []),
        ({"definitions": {"l": {"type": "array"}}, "$ref": "#/definitions/l", "maxItems": 1}, [("$", "maxItems")]),
        # a keyword the draft does not have constrains nothing
        ({"$schema": D4, "type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, []),
        ({"type": "object", "dependencies": {"a": ["b"]}}, []),
        ({"$schema": D4, "type": "object", "dependencies": {"a": ["b"]}}, [("$", "dependencies")]),
        ({"$schema": D4, "type": "array", "items": {}, "contains": {"type": "string"}}, []),
        # draft-7 "additionalItems": held by a tuple (generated with exactly its elements),
        # ignored by validation without one; draft 3's "extends" is not modelled at all
        ({"$schema": D7, "type": "array", "items": [STR], "additionalItems": False}, []),
        ({"$schema": D7, "type": "array", "items": STR, "additionalItems": False}, []),
        ({"$schema": D3, "type": "object", "extends": {"required": ["a"]}}, [("$", "extends")]),
    ],
)
def test_only_the_schemas_own_draft_is_enforced_by_validation(schema: Any, found: list[tuple[str, str]]) -> None:
    assert errors(schema) == found


CLOSED_BAR = {"properties": {"bar": STR}}


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        # the $ref target generates only "bar": a sibling about "foo" and unevaluatedProperties see nothing
        (
            {
                "$defs": {"b": CLOSED_BAR},
                "$ref": "#/$defs/b",
                "properties": {"foo": STR},
                "unevaluatedProperties": False,
            },
            [],
        ),
        ({"$defs": {"b": CLOSED_BAR}, "$ref": "#/$defs/b", "properties": {"bar": STR}}, []),
        (
            {"$defs": {"b": CLOSED_BAR}, "$ref": "#/$defs/b", "properties": {"bar": {"maxLength": 1}}},
            [("$", "properties")],
        ),
        (
            {"$defs": {"b": {"type": "object"}}, "$ref": "#/$defs/b", "unevaluatedProperties": False},
            [("$", "unevaluatedProperties")],
        ),
        # oneOf alternatives that each imply the siblings
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"kind": STR, "n": {"type": "integer"}},
                "oneOf": [
                    {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                    {"properties": {"kind": {"const": "b"}, "n": {"const": 1}}, "required": ["kind"]},
                ],
            },
            [],
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"kind": STR},
                "oneOf": [{"properties": {"kind": {"const": "a"}, "extra": STR}}],
            },
            [("$", "oneOf")],
        ),
        (
            {"required": ["kind"], "anyOf": [{"properties": {"kind": {"const": "a"}}}]},
            [("$", "anyOf")],
        ),
    ],
)
def test_siblings_of_ref_and_alternatives_implied_by_what_is_generated(
    schema: Any, found: list[tuple[str, str]]
) -> None:
    assert errors(schema) == found


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        # llama.cpp ignores "allOf" beside "properties"; it is exact when the closed object holds it
        ({"allOf": [{"patternProperties": {"^bar": STR}}], "properties": {"foo": STR}}, []),
        ({"allOf": [{"type": "object", "properties": {"foo": STR}}, {"maxLength": 3}], "properties": {"foo": STR}}, []),
        (
            {"allOf": [{"patternProperties": {"^fo": {"type": "integer"}}}], "properties": {"foo": STR}},
            [("$", "allOf")],
        ),
        ({"allOf": [{"required": ["foo"]}], "properties": {"foo": STR}}, [("$", "allOf")]),
        (
            {"allOf": [{"maxLength": 3}], "properties": {"foo": STR}, "additionalProperties": True},
            [("$", "additionalProperties"), ("$", "allOf")],
        ),
    ],
)
def test_all_of_beside_properties_held_by_the_closed_object(schema: Any, found: list[tuple[str, str]]) -> None:
    assert errors(schema) == found


INT = {"type": "integer"}


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        # llama.cpp's grammar for these is just the integer: the root's object keywords never see it
        ({"properties": {"": INT, "a": STR}, "required": ["a"]}, []),
        ({"additionalProperties": INT, "properties": {"": INT, "a": INT}}, []),
        # ... which breaks "type": "object"
        ({"type": "object", "properties": {"": INT}}, [("$", "properties")]),
        ({"properties": {"": {"type": "object"}}}, [("$", "properties")]),
        ({"type": "object", "properties": {"x": {"type": "object", "properties": {"": INT}}}}, []),
    ],
)
def test_a_property_named_empty_at_the_root_becomes_the_whole_grammar(
    schema: Any, found: list[tuple[str, str]]
) -> None:
    assert errors(schema) == found


# ---------------------------------------------------------------------------- never a traceback


@pytest.mark.parametrize(
    "schema",
    [
        {"const": 0, "minimum": None},
        {"enum": ["a"], "type": {"required": "a"}},
        {"$schema": 5, "type": "string"},
        {"type": "object", "properties": {"p": {"enum": ["f"], "type": "\\"}}, "required": ["p"]},
        {"type": "string", "minLength": "3"},
    ],
)
def test_malformed_schemas_are_error_findings_and_a_schema_problem(schema: dict[str, Any]) -> None:
    assert errors(schema)
    assert schema_problem(schema) is not None
    assert not compile_schema(schema).exact


def test_deep_nesting_is_a_finding() -> None:
    schema: Any = {"type": "integer"}
    for _ in range(400):
        schema = {"type": "array", "items": schema}
    assert errors(schema) == [("$", "depth")]
    assert schema_problem(schema) is not None


def test_valid_schemas_have_no_schema_problem() -> None:
    assert schema_problem({"type": "object", "properties": OBJ}) is None
    assert schema_problem(True) is None


def test_unenforced_is_empty_when_the_schema_compiles() -> None:
    from localllm.grammar import unenforced

    one_sided = {"type": "integer", "maximum": -5}  # a converter hole, exact when compiled
    assert unenforced(one_sided) == []
    assert [v.construct for v in unenforced(one_sided, compiled=False)] == ["maximum"]
    unique = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    assert [v.construct for v in unenforced(unique)] == ["uniqueItems"]
