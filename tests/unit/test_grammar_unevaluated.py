"""unevaluatedProperties/unevaluatedItems beside allOf and $ref: which keys and positions are
evaluated is fixed by the schemas (the union of the components' properties and patterns, the
longest prefix), so the keyword becomes one more allOf component. Beside anyOf/oneOf/not/if
(evaluation depends on the branch a value takes) it stays refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, validator

S = "https://json-schema.org/draft/2020-12/schema"
S19 = "https://json-schema.org/draft/2019-09/schema"


@pytest.mark.parametrize(
    ("schema", "admitted", "rejected"),
    [
        # JSON-Schema-Test-Suite unevaluatedItems group 7: the component's prefix evaluates item 1
        (
            {"$schema": S, "allOf": [{"prefixItems": [True, {"type": "number"}]}], "prefixItems": [{"type": "string"}]}
            | {"unevaluatedItems": False},
            ['["foo",42]', '["foo"]'],
            ['["foo",42,true]', '["foo","bar"]'],
        ),
        # group 10: a component's unevaluatedItems true evaluates every item
        (
            {"$schema": S, "allOf": [{"prefixItems": [{"type": "string"}]}, {"unevaluatedItems": True}]}
            | {"unevaluatedItems": False},
            ['["foo",42,true]'],
            ["[1]"],
        ),
        # unevaluatedProperties group 25: a component's unevaluatedProperties true evaluates every key
        (
            {"$schema": S, "allOf": [{"properties": {"foo": {"type": "string"}}, "unevaluatedProperties": True}]}
            | {"unevaluatedProperties": False},
            ['{"foo":"a","bar":1}'],
            ['{"foo":1}'],
        ),
        # beside $ref: the referenced properties are evaluated
        (
            {
                "$schema": S,
                "$defs": {"base": {"properties": {"a": {"type": "integer"}}}},
                "$ref": "#/$defs/base",
                "properties": {"b": {"type": "string"}},
                "unevaluatedProperties": False,
            },
            ['{"a":1,"b":"x"}', '{"b":"x","a":1}', "{}"],
            ['{"a":1,"c":2}', '{"c":null}'],
        ),
        # 2019-09 items array: additionalItems after the longest prefix
        (
            {"$schema": S19, "allOf": [{"items": [{"type": "integer"}, True]}], "unevaluatedItems": {"type": "string"}},
            ['[1,null,"x"]', "[1]"],
            ["[1,null,2]"],
        ),
    ],
)
def test_unevaluated_beside_all_of_and_ref_compiles_exactly(
    schema: dict[str, Any], admitted: list[str], rejected: list[str]
) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    g = grammar_of(schema)
    check = validator(schema)
    for text in admitted:
        assert check.is_valid(json.loads(text)) and g.matches(text), text
    for text in rejected:
        assert not check.is_valid(json.loads(text)) and not g.matches(text), text


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$schema": S,
            "anyOf": [{"properties": {"a": True}}, {"properties": {"b": True}}],
            "unevaluatedProperties": False,
        },
        {"$schema": S, "allOf": [{"oneOf": [{"prefixItems": [True]}, {"type": "array"}]}], "unevaluatedItems": False},
        {"$schema": S, "allOf": [{"contains": {"type": "string"}}], "unevaluatedItems": False},
    ],
)
def test_unevaluated_beside_branching_applicators_stays_refused(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert compiled.refusals[0].construct in ("unevaluatedProperties", "unevaluatedItems")
