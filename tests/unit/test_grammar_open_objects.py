"""Open objects: the extension-key rule (keys beside the declared properties, after them).

Every admitted text must parse to a valid value (a repeated key leaves its last value, as
``json.loads`` and the validator read it); extension keys never repeat a declared name;
``open_objects=False`` keeps objects whose ``additionalProperties`` is absent or true closed.
Regression tests are the JSONSchemaBench instances (tests/bench/data) that closed generation
rejected although they are valid.
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

D4 = "http://json-schema.org/draft-04/schema#"


def admits(schema: Any, text: str, **kw: Any) -> bool:
    return grammar_of(schema, **kw).matches(text)


# ---------------------------------------------------------------------------- the rule


def test_open_object_admits_extra_keys_after_the_declared_ones() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    assert admits(schema, '{"a":1,"$schema":"x"}')
    assert admits(schema, '{"a":1,"b":"y","zz":[1],"c":{}}')
    assert admits(schema, '{"a":1,"bb":null}')  # same first letter as "b", other length
    assert not admits(schema, '{"zz":1,"a":1}')  # declared properties come first
    assert not admits(schema, "{}")


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"a":"x"}',
        '{"a":1,"b":"y","b":2}',
        '{"a":1,"\\u0062":2}',  # "b" written as an escape
        '{"a":1,"\\u0061":"x"}',
    ],
)
def test_extension_keys_never_repeat_a_declared_name(text: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    assert not validator(schema).is_valid(json.loads(text)) or text.count('"a"') > 1 or "\\u" in text
    assert not admits(schema, text)


def test_only_optional_properties_object_may_hold_only_extension_keys() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert admits(schema, "{}") and admits(schema, '{"x":true}') and admits(schema, '{"a":1,"x":true}')
    assert not admits(schema, '{"x":true,"a":1}')


def test_min_properties_one_is_met_by_an_extension_key() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1}
    assert admits(schema, '{"x":true}') and admits(schema, '{"a":1}') and not admits(schema, "{}")


def test_additional_properties_schema_types_the_extension_values() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    assert admits(schema, '{"a":"s","n":3}') and not admits(schema, '{"a":"s","n":"3"}')
    # a schema (not absent/true) applies with open_objects off too
    assert admits(schema, '{"a":"s","n":3}', open_objects=False)


def test_closed_when_asked_or_when_the_schema_says_so() -> None:
    open_ = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not admits(open_, '{"a":1,"x":2}', open_objects=False)
    assert not admits({**open_, "additionalProperties": False}, '{"a":1,"x":2}')
    assert not admits({**open_, "maxProperties": 3}, '{"a":1,"x":2}')  # repeated keys would miscount


def test_property_names_bound_the_extension_keys() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "propertyNames": {"maxLength": 2}}
    assert admits(schema, '{"a":1,"xy":2}') and not admits(schema, '{"a":1,"xyz":2}')


def test_pattern_properties_give_the_keys_and_their_values() -> None:
    schema = {"type": "object", "patternProperties": {".*": {"type": "number"}}}
    assert admits(schema, '{"temperature":25,"humidity":60.5}') and not admits(schema, '{"t":"x"}')
    anchored = {
        "type": "object",
        "patternProperties": {"^[a-z_]{1,8}$": {"type": ["number", "boolean"]}},
        "additionalProperties": False,
    }
    assert admits(anchored, '{"a":1,"is_on":true}')
    assert not admits(anchored, '{"A":1}') and not admits(anchored, '{"a":"s"}')


def test_overlapping_patterns_meet_both_schemas() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 3}},
        "additionalProperties": False,
    }
    assert not admits(schema, '{"ab":1}')  # "ab" matches both: an integer of at least 3
    assert admits(schema, '{"ab":4}')
    assert sound_on(schema, ['{"ab":1}', '{"ab":4}', '{"a":1}', '{"b":1}', '{"ab":4,"ab":1}']) == []


def test_a_declared_name_a_pattern_matches_keeps_its_own_schema() -> None:
    # WashingtonPost wp_68: "basic" is declared and matches the pattern
    schema = {
        "type": "object",
        "properties": {"basic": {"type": "string", "maxLength": 3}},
        "patternProperties": {"^[a-z]*$": {"type": "string"}},
        "additionalProperties": False,
    }
    assert admits(schema, '{"basic":"abc","custom":"abc"}')
    assert sound_on(schema, ['{"basic":"abc","basic":"abcdef"}', '{"custom":"abcdef"}']) == []


def test_pattern_property_key_false_is_never_generated() -> None:
    schema = {"type": "object", "properties": {"a": False}, "patternProperties": {".*": {}}}
    assert sound_on(schema, ['{"a":1}', '{"b":1}', "{}"]) == []
    assert not admits(schema, '{"a":1}')


# ---------------------------------------------------------------------------- regressions (bench instances)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        # Github_medium o65503: "$schema" beside declared properties
        (
            {"$schema": D4, "properties": {"agency": {"type": "string"}}, "required": ["agency"], "type": "object"},
            '{"agency":"x","$schema":"http://json-schema.org/draft-04/schema"}',
        ),
        # Github_medium o9950: an object of numbers under patternProperties ".*"
        (
            {
                "type": "object",
                "properties": {"t": {"type": "object", "patternProperties": {".*": {"type": "number"}}}},
            },
            '{"t":{"start":1,"stop":0}}',
        ),
        # Snowplow sp_395: keys one space longer than the declared ones
        (
            {"additionalProperties": True, "properties": {"occurred": {"type": "string"}}, "type": "object"},
            '{"occurred ":"2022-01-01T12:00:00.000Z"}',
        ),
        # Kubernetes kb_533: an undeclared key after the declared ones
        (
            {
                "properties": {"queuing": {"type": "object"}, "type": {"type": ["string", "null"]}},
                "required": ["type"],
                "type": "object",
            },
            '{"type":"Queue","queuingConfiguration":{"handSize":8}}',
        ),
        # WashingtonPost wp_68: a key under patternProperties beside a declared one
        (
            {
                "additionalProperties": False,
                "patternProperties": {"^[a-zA-Z0-9_]*$": {"type": "object", "required": ["text"]}},
                "properties": {"basic": {"type": "object", "required": ["text"]}},
                "type": "object",
            },
            '{"basic":{"text":"a"},"custom_label":{"text":"b"}}',
        ),
    ],
)
def test_valid_bench_instances_are_admitted(schema: Any, text: str) -> None:
    assert validator(schema).is_valid(json.loads(text))
    assert admits(schema, text)


# ---------------------------------------------------------------------------- families


_NAMES = ["a", "ab", "b", "x-1", "", "é"]
_VALUES = [{}, {"type": "integer"}, {"type": "string", "maxLength": 2}, {"const": 1}, {"minimum": 3}, False]
_PATTERNS = ["^a", "b$", ".*", "^x-", "^[a-b]+$", "1"]
_CANDIDATE_KEYS = ["a", "ab", "b", "x-1", "", "é", "aa", "bb", "x-", "zz", "a b"]
_CANDIDATE_VALUES = ["1", "5", '"s"', '"long"', "null", "{}", "2.5"]


@st.composite
def _objects(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    names = draw(st.lists(st.sampled_from(_NAMES), max_size=3, unique=True))
    if names:
        schema["properties"] = {n: draw(st.sampled_from(_VALUES)) for n in names}
    required = draw(st.lists(st.sampled_from(_NAMES), max_size=2, unique=True))
    if required:
        schema["required"] = required
    if draw(st.booleans()):
        pats = draw(st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=2, unique=True))
        schema["patternProperties"] = {p: draw(st.sampled_from(_VALUES[:-1])) for p in pats}
    extra = draw(st.sampled_from([None, True, False, {"type": "integer"}, {"type": "string"}]))
    if extra is not None:
        schema["additionalProperties"] = extra
    if draw(st.integers(0, 4)) == 0:
        schema["propertyNames"] = {"maxLength": 2}
    if draw(st.integers(0, 4)) == 0:
        schema["minProperties"] = 1
    return schema


def _candidates(rng: random.Random, n: int) -> list[str]:
    out = ["{}"]
    for _ in range(n):
        pairs = [
            f"{json.dumps(rng.choice(_CANDIDATE_KEYS), ensure_ascii=False)}:{rng.choice(_CANDIDATE_VALUES)}"
            for _ in range(rng.randint(1, 4))
        ]
        out.append("{" + ",".join(pairs) + "}")
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_objects(), st.integers(0, 1000))
def test_open_object_families_admit_only_valid_values(schema: dict[str, Any], seed: int) -> None:
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 40, seed) == []
    assert sound_on(schema, _candidates(random.Random(seed), 60)) == []
