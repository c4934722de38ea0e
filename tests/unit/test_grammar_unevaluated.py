"""unevaluatedProperties/unevaluatedItems beside allOf and $ref: which keys and positions are
evaluated is fixed by the schemas (the union of the components' properties and patterns, the
longest prefix), so the keyword becomes one more allOf component. Beside anyOf/oneOf/not/if
(evaluation depends on the branch a value takes) it stays refused. allOf components with
patternProperties merge (a pattern one side gives also gets the other's additionalProperties).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.grammar.compile import compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, sound_on, validator

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


# ---------------------------------------------------------------------------- allOf of patternProperties

_NAMES = ["a", "ab", "b", "x1"]
_PATTERNS = ["^a", "b$", "^x", "1"]
_VALUES: list[Any] = [True, {"type": "integer"}, {"type": "string"}, {"const": 1}, False]


@st.composite
def _shapes(draw: st.DrawFn) -> dict[str, Any]:
    shape: dict[str, Any] = {"type": "object"}
    names = draw(st.lists(st.sampled_from(_NAMES), max_size=2, unique=True))
    if names:
        shape["properties"] = {n: draw(st.sampled_from(_VALUES)) for n in names}
    pats = draw(st.lists(st.sampled_from(_PATTERNS), max_size=2, unique=True))
    if pats:
        shape["patternProperties"] = {p: draw(st.sampled_from(_VALUES)) for p in pats}
    extra = draw(st.sampled_from([None, False, {"type": "integer"}, {"type": "string"}]))
    if extra is not None:
        shape["additionalProperties"] = extra
    return shape


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes(), _shapes(), st.booleans(), st.integers(0, 1000))
def test_all_of_with_pattern_properties_admits_only_valid_values(
    a: dict[str, Any], b: dict[str, Any], unevaluated: bool, seed: int
) -> None:
    schema: dict[str, Any] = {"$schema": S, "allOf": [a, b]}
    if unevaluated:
        schema["unevaluatedProperties"] = False
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 40, seed) == []
    rng = random.Random(seed)
    keys = [*_NAMES, "zz", "a1", "xb"]
    values = ["1", '"s"', "null", "2"]
    texts = []
    for _ in range(80):
        pairs = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 3))}
        texts.append("{" + ",".join(f'"{k}":{v}' for k, v in pairs.items()) + "}")
    assert sound_on(schema, texts) == []


def test_all_of_pattern_properties_merge_bench_group_8() -> None:
    # JSON-Schema-Test-Suite unevaluatedProperties group 8: a pattern in an allOf component
    schema = {
        "$schema": S,
        "allOf": [{"patternProperties": {"^bar": {"type": "string"}}}],
        "properties": {"foo": {"type": "string"}},
        "unevaluatedProperties": False,
        "type": "object",
    }
    g = grammar_of(schema)
    assert g.matches('{"foo":"x","bar":"y"}') and g.matches('{"foo":"x","barn":"y"}')  # pattern keys after
    assert not g.matches('{"foo":"x","baz":"y"}') and not g.matches('{"bar":1}')
