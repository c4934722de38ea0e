"""What the compiler now expresses exactly that it refused (or narrowed silently) before.

Each construct: the exact-compile result, probes the grammar must admit / reject (checked
against the validator too), and random walks that all validate.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import counterexample, invalid_walks, validator

WALKS = 300


def exact(schema: Any) -> Grammar:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, WALKS) == []
    grammar = Grammar.parse(compiled.grammar)
    rng = __import__("random").Random(1)
    samples = [json.loads(grammar.sample(rng)) for _ in range(20)]
    assert counterexample(grammar, schema, samples) is None
    return grammar


def probes(schema: Any, admits: list[Any], rejects: list[Any]) -> None:
    g = exact(schema)
    check = validator(schema)
    for value in admits:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        assert check.is_valid(value), value
        assert g.matches(text), text
    for value in rejects:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        assert not g.matches(text), text


# ---------------------------------------------------------------------------- $ref reused in allOf


REF_TWICE = [
    {
        "$defs": {"a": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}],
    },
    {
        # the JSON-Schema-Test-Suite's "$ref to the same schema from two places is not an infinite loop" shape
        "$defs": {"int": {"type": "integer"}},
        "allOf": [{"properties": {"foo": {"$ref": "#/$defs/int"}}}, {"additionalProperties": {"$ref": "#/$defs/int"}}],
    },
    {
        "$defs": {
            "base": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            "named": {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"name": {"type": "string"}}}]},
        },
        "allOf": [{"$ref": "#/$defs/base"}, {"$ref": "#/$defs/named"}],
    },
]


@pytest.mark.parametrize("schema", REF_TWICE)
def test_the_same_ref_twice_in_all_of_is_merged_once(schema: Any) -> None:
    exact(schema)


def test_a_ref_reaching_itself_through_all_of_is_still_left_recursion() -> None:
    schema = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    compiled = compile_schema(schema)
    assert compiled.grammar is None and compiled.refusals[0].construct == "$ref"


# ---------------------------------------------------------------------------- exact decimal ranges


def test_temperature_range_admits_the_decimals_below_one() -> None:
    probes(
        {"type": "object", "properties": {"t": {"type": "number", "minimum": 0.1, "maximum": 2.0}}, "required": ["t"]},
        [{"t": 0.1}, {"t": 0.7}, {"t": 0.99}, {"t": 1}, {"t": 2.0}],
        [{"t": 0.05}, {"t": 2.5}, {"t": 0}],
    )


def test_a_range_narrower_than_one_unit_compiles() -> None:
    probes({"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.2}, [0.15, 0.11, 0.199], [0.1, 0.2, 0.21])


def test_a_range_no_generated_number_meets_names_the_narrowing() -> None:
    compiled = compile_schema({"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.1000001})
    assert compiled.grammar is None
    refusal = compiled.refusals[0]
    assert refusal.construct == "minimum"
    assert "6 decimals" in refusal.message and "0.1" in refusal.message


def test_narrowed_formats_and_bounds_are_named_in_the_notes() -> None:
    compiled = compile_schema({"type": "object", "properties": {"u": {"type": "string", "format": "hostname"}}})
    assert compiled.exact and any(n.startswith("$.properties.u:") and "hostname" in n for n in compiled.notes)
    assert compile_schema({"type": "string", "format": "date"}).notes == []
    compiled = compile_schema({"type": "number", "minimum": 0.1234567890123456, "maximum": 3})
    assert compiled.exact and any(n.startswith("$:") for n in compiled.notes)


# ---------------------------------------------------------------------------- not / if / dependencies / oneOf

OBJ = {
    "type": "object",
    "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}, "y": {"type": "string", "maxLength": 3}},
    "required": ["kind"],
}


@pytest.mark.parametrize(
    ("schema", "admits", "rejects"),
    [
        ({"not": {"type": "string"}}, [1, None, [], {}], ["s"]),
        ({"type": "string", "not": {"enum": ["a", "b"]}}, ["", "c", "ab", "ba"], ["a", "b"]),
        ({"type": "integer", "minimum": 0, "maximum": 5, "not": {"const": 3}}, [0, 2, 4, 5], [3, 6]),
        ({"type": "number", "not": {"enum": [1, 2.5]}}, [0, 1.5, 2, 3], [1, 2.5, 1.0]),
        (
            {**OBJ, "not": {"required": ["x", "y"]}},
            [{"kind": "a"}, {"kind": "a", "x": 1}],
            [{"kind": "a", "x": 1, "y": ""}],
        ),
        ({"type": "string", "not": {"maxLength": 2}}, ["abc"], ["ab", ""]),
        ({"not": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, [None, True], ["s", 3]),
        (
            {
                **OBJ,
                "if": {"properties": {"kind": {"const": "a"}}},
                "then": {"required": ["x"]},
                "else": {"required": ["y"]},
            },
            [{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}],
            [{"kind": "a"}, {"kind": "b"}, {"kind": "b", "x": 1}],
        ),
        (
            {**OBJ, "dependentRequired": {"x": ["y"]}},
            [{"kind": "a"}, {"kind": "a", "x": 1, "y": ""}],
            [{"kind": "a", "x": 1}],
        ),
        (
            {**OBJ, "dependentSchemas": {"x": {"properties": {"y": {"minLength": 2}}, "required": ["y"]}}},
            [{"kind": "a", "x": 1, "y": "ab"}, {"kind": "a", "y": ""}],
            [{"kind": "a", "x": 1, "y": "a"}, {"kind": "a", "x": 1}],
        ),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", **OBJ, "dependencies": {"x": ["y"]}},
            [{"kind": "a"}, {"kind": "a", "x": 1, "y": ""}],
            [{"kind": "a", "x": 1}],
        ),
        ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}, [-1, 11, 100], [0, 5, 10]),
        ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, ["abcd"], ["", "abc", 1]),
    ],
)
def test_negation_based_constructs_compile_exactly(schema: Any, admits: list[Any], rejects: list[Any]) -> None:
    probes(schema, admits, rejects)


def test_if_is_ignored_where_the_draft_has_no_if() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "if": {"minimum": 5},
        "then": {"maximum": 1},
    }
    probes(schema, [7, 0], ["s"])


# ---------------------------------------------------------------------------- arrays: uniqueItems, contains; multipleOf


@pytest.mark.parametrize(
    ("schema", "admits", "rejects"),
    [
        (
            {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
            [[], ["a"], ["a", "c"], ["a", "b", "c"]],
            [["a", "a"], ["b", "a", "b"]],
        ),
        (
            {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 1},
            [[True], [False], [True, False]],
            [[], [True, True]],
        ),
        ({"type": "array", "items": {"enum": [1, 1.0, 2]}, "uniqueItems": True}, [[1, 2]], [[1, 1]]),
        (
            {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}},
            [[1], [0, 1, 2], [2, 1, 1]],
            [[], [0, 2]],
        ),
        (
            {
                "type": "array",
                "items": {"type": "integer"},
                "contains": {"minimum": 5},
                "minContains": 2,
                "maxContains": 3,
            },
            [[5, 6], [0, 5, 1, 7, 9]],
            [[5], [5, 6, 7, 8], [1, 2]],
        ),
        (
            {"type": "array", "contains": {"type": "string"}, "minContains": 0, "maxContains": 1},
            [[], [1], ["a", 1]],
            [["a", "b"]],
        ),
        (
            {"type": "array", "contains": {"type": "string", "pattern": "^a"}, "maxItems": 2},
            [["a"], ["ab", "ac"]],
            [[], ["b"]],
        ),
        ({"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 30}, [5, 10, 30], [0, 1, 31, 35]),
    ],
)
def test_array_and_step_constructs_compile_exactly(schema: Any, admits: list[Any], rejects: list[Any]) -> None:
    probes(schema, admits, rejects)


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "integer", "multipleOf": 33, "minimum": 5}, "multipleOf"),
        ({"type": "number", "multipleOf": 0.75}, "multipleOf"),
    ],
)
def test_still_refused_with_the_construct(schema: Any, construct: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None and compiled.refusals[0].construct == construct


# ---------------------------------------------------------------------------- same-document $id / $anchor


@pytest.mark.parametrize(
    ("schema", "admits", "rejects"),
    [
        (
            {
                "$defs": {"a": {"$anchor": "num", "type": "integer"}},
                "type": "object",
                "properties": {"x": {"$ref": "#num"}},
                "required": ["x"],
            },
            [{"x": 1}],
            [{"x": "1"}],
        ),
        (
            {
                "$id": "https://example.com/root.json",
                "$defs": {
                    "b": {
                        "$id": "b.json",
                        "type": "object",
                        "properties": {"y": {"$ref": "#/$defs/c"}},
                        "required": ["y"],
                        "$defs": {"c": {"type": "string"}},
                    }
                },
                "$ref": "b.json",
            },
            [{"y": "s"}],
            [{"y": 1}, {}],
        ),
        (
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "definitions": {"a": {"$id": "#flag", "type": "boolean"}},
                "type": "array",
                "items": {"$ref": "#flag"},
            },
            [[True, False]],
            [[1]],
        ),
        (  # JSON-Schema-Test-Suite unknownKeyword.json: an $id inside an unknown keyword names
            # nothing (the grammar took the integer one: 1 admitted)
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "definitions": {
                    "id_in_unknown": {"not": {"array_of_schemas": [{"$id": "https://h/my.json", "type": "null"}]}},
                    "real_id_in_schema": {"$id": "https://h/my.json", "type": "string"},
                    "id_in_unknown1": {
                        "not": {"object_of_schemas": {"foo": {"$id": "https://h/my.json", "type": "integer"}}}
                    },
                },
                "anyOf": [{"$ref": "https://h/my.json"}],
            },
            ["a string"],
            [1, None],
        ),
        (  # JSON-Schema-Test-Suite draft 7 ref.json: before 2019-09 an $id beside a $ref is
            # ignored, so "foo.json" resolves against the root's base (the grammar took the string one)
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "$id": "http://h/sibling_id/base/",
                "definitions": {
                    "foo": {"$id": "http://h/sibling_id/foo.json", "type": "string"},
                    "base_foo": {"$id": "foo.json", "type": "number"},
                },
                "allOf": [{"$id": "http://h/sibling_id/", "$ref": "foo.json"}],
            },
            [1],
            ["a"],
        ),
        (  # a property named "default" (or "enum", "const", "examples") is a schema, not data:
            # its nested $id was left in place and refused ("a nested $id changes how refs
            # resolve"; JSONSchemaBench Github_ultra o76156), its refs not followed
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "$id": "https://h/root.json",
                "type": "object",
                "properties": {
                    "default": {
                        "$id": "d.json",
                        "type": "object",
                        "properties": {"n": {"$ref": "#/definitions/n"}},
                        "definitions": {"n": {"type": "integer"}},
                    },
                    "enum": {"$ref": "d.json"},
                },
                "definitions": {"n": {"type": "string"}},
                "required": ["default", "enum"],
            },
            [{"default": {"n": 1}, "enum": {}}],
            [{"default": {"n": "1"}, "enum": {}}, {"default": {}, "enum": {"n": "x"}}],
        ),
        (  # draft 4 reads "id", never "$id": nine JSONSchemaBench schemas (JSON Schema Store's
            # base and cryproj, Github_medium o46413) were refused for a keyword it ignores
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "definitions": {"a": {"type": "integer"}},
                "properties": {
                    "x": {
                        "$id": "http://other.example/x.json",
                        "definitions": {"a": {"type": "string"}},
                        "properties": {"y": {"$ref": "#/definitions/a"}},
                    }
                },
            },
            [{"x": {"y": 1}}],
            [{"x": {"y": "s"}}],
        ),
    ],
)
def test_same_document_ids_and_anchors_resolve(schema: Any, admits: list[Any], rejects: list[Any]) -> None:
    probes(schema, admits, rejects)


def test_a_ref_to_another_document_is_still_refused() -> None:
    compiled = compile_schema({"$id": "https://example.com/a.json", "$ref": "other.json#/x"})
    assert compiled.grammar is None and compiled.refusals[0].construct == "$ref"


# ---------------------------------------------------------------------------- length bounds beside a pattern


@pytest.mark.parametrize(
    ("schema", "admits", "rejects"),
    [
        ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}, ["a", "abcde"], ["", "abcdef", "A"]),
        (
            {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$", "maxLength": 8},
            ["1.2.3", "1234.5.6"],
            ["12345.6.7", "1.2"],
        ),
        ({"type": "string", "pattern": "^a", "minLength": 3, "maxLength": 4}, ["abc", "abcd"], ["ab", "abcde", "bcd"]),
        ({"type": "string", "pattern": "^[A-Z]{2}[0-9]*$", "minLength": 4}, ["AB12", "AB123"], ["AB1", "AB"]),
    ],
)
def test_length_bounds_beside_a_pattern_are_intersected(schema: Any, admits: list[Any], rejects: list[Any]) -> None:
    probes(schema, admits, rejects)
