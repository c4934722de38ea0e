"""Properties in any order: a JSON object's key order carries no meaning, so the grammar
admits the declared properties in every order — each at most once, the required ones always —
up to ANY_ORDER of them (2^n rules); larger objects keep their declared order and a note
names the narrowing. uniqueItems arrays over a finite domain take their values in any order
the same way. Regression tests are the JSONSchemaBench instances (tests/bench/data) that the
declared-order grammar rejected although they are valid.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.grammar.compile import ANY_ORDER, compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, sound_on, validator


def _object(n: int, required: list[str], **kw: Any) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(n)]
    return {
        "type": "object",
        "properties": {name: {"const": i} for i, name in enumerate(names)},
        "required": required,
        "additionalProperties": False,
        **kw,
    }


def _text(pairs: list[tuple[str, int]]) -> str:
    return "{" + ",".join(f'"{k}":{v}' for k, v in pairs) + "}"


def test_every_order_of_four_properties_and_nothing_else() -> None:
    schema = _object(4, ["b", "d"])
    g = grammar_of(schema)
    check = validator(schema)
    pairs = [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    seen = 0
    for k in range(5):
        for chosen in itertools.permutations(pairs, k):
            text = _text(list(chosen))
            assert g.matches(text) == check.is_valid(json.loads(text)), text
            seen += g.matches(text)
    assert seen == 2 + 12 + 24  # {b,d} in 2 orders, 3 keys in 3! orders twice, all four in 4!
    # a repeated key parses to a valid object, yet the grammar writes each property once
    assert not g.matches('{"b":1,"d":3,"b":1}') and not g.matches('{"d":3,"b":1,"d":3}')


def test_min_properties_one_over_optional_properties_in_any_order() -> None:
    g = grammar_of(_object(3, [], minProperties=1))
    assert g.matches('{"c":2,"a":0}') and g.matches('{"b":1}') and not g.matches("{}")


def test_extension_keys_still_follow_the_declared_properties() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}
    g = grammar_of(schema)
    assert g.matches('{"b":"x","a":1,"zz":null}')
    assert not g.matches('{"zz":null,"b":"x","a":1}') and not g.matches('{"b":"x","a":1,"b":"y"}')


def test_more_properties_than_the_bound_keep_declared_order_with_a_note() -> None:
    n = ANY_ORDER + 1
    schema = _object(n, [])
    compiled = compile_schema(schema)
    g = grammar_of(schema)
    assert g.matches(_text([("a", 0), ("b", 1)])) and not g.matches(_text([("b", 1), ("a", 0)]))
    assert any(f"{n} properties or items in declared order" in note for note in compiled.notes)
    assert not any("declared order" in note for note in compile_schema(_object(ANY_ORDER, [])).notes)


def test_the_any_order_budget_falls_back_to_declared_order() -> None:
    # 2^6 rules per six-property object: four spend the 256-rule budget, so the fifth and the
    # outer object (compiled after its values) keep their declared order
    schema = {"type": "object", "properties": {f"o{i}": _object(6, []) for i in range(5)}, "required": ["o4"]}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None
    spent = [note.split(":")[0] for note in compiled.notes if "budget is spent" in note]
    assert spent == ["$.properties.o4", "$"]
    assert invalid_walks(schema, compiled, 60) == []


def test_unique_enum_items_in_any_order() -> None:
    schema = {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True, "minItems": 1}
    g = grammar_of(schema)
    assert g.matches('["z","x"]') and g.matches('["y","z","x"]') and g.matches('["y"]')
    assert not g.matches('["x","x"]') and not g.matches('["z","y","z"]') and not g.matches("[]")


# ---------------------------------------------------------------------------- counted


def _subsets_in_every_order(pairs: list[tuple[str, int]], *, orders: bool = True) -> Iterator[str]:
    for k in range(len(pairs) + 1):
        for chosen in itertools.combinations(pairs, k):
            yield from (_text(list(p)) for p in (itertools.permutations(chosen) if orders else [chosen]))


@pytest.mark.parametrize(("required", "least", "most"), [([], 2, 3), (["b"], 3, None), ([], 0, 1), (["a", "d"], 2, 2)])
def test_min_and_max_properties_between_required_and_declared_count_every_order(
    required: list[str], least: int, most: int | None
) -> None:
    bounds = {"minProperties": least} | ({} if most is None else {"maxProperties": most})
    schema = _object(4, required, **bounds)
    g, check = grammar_of(schema), validator(schema)
    admitted = 0
    for text in _subsets_in_every_order([("a", 0), ("b", 1), ("c", 2), ("d", 3)]):
        assert g.matches(text) == check.is_valid(json.loads(text)), text
        admitted += g.matches(text)
    assert admitted > 0


@pytest.mark.parametrize(("required", "least", "most"), [([], 3, 4), (["c", "f"], 4, None), ([], 0, 2), (["g"], 1, 1)])
def test_counted_properties_beyond_any_order_keep_declared_order_and_count(
    required: list[str], least: int, most: int | None
) -> None:
    n = ANY_ORDER + 2
    bounds = {"minProperties": least} | ({} if most is None else {"maxProperties": most})
    schema = _object(n, required, **bounds)
    compiled = compile_schema(schema)
    g, check = grammar_of(schema), validator(schema)
    pairs = [(chr(ord("a") + i), i) for i in range(n)]
    admitted = 0
    for text in _subsets_in_every_order(pairs, orders=False):  # all 2^8 subsets, declared order
        assert g.matches(text) == check.is_valid(json.loads(text)), text
        admitted += g.matches(text)
    assert admitted > 0
    assert invalid_walks(schema, compiled, 200) == []


def test_min_properties_beside_undeclared_keys_counts_the_declared_ones_with_a_note() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}, "c": {}}, "minProperties": 2}
    compiled = compile_schema(schema, open_objects=True)
    g = grammar_of(schema, open_objects=True)
    assert g.matches('{"c":1,"a":2,"zz":3}') and g.matches('{"b":1,"c":2}')
    # an undeclared key may repeat ({"a":1,"x":1,"x":2} parses to two keys): not counted
    assert not g.matches('{"a":1,"x":1}') and not g.matches('{"a":1}')
    assert any("minProperties 2 is met by declared properties" in n for n in compiled.notes)
    assert invalid_walks(schema, compiled, 200) == []


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        (
            {
                "type": "object",
                "properties": {"a": {}},
                "additionalProperties": {"type": "integer"},
                "minProperties": 2,
            },
            "minProperties",
        ),
        (_object(100, [], minProperties=50), "minProperties"),  # 100 x 51 counting rules
        (_object(100, [], maxProperties=99), "maxProperties"),
    ],
)
def test_counts_that_cannot_be_written_are_refused_by_name(schema: dict[str, Any], construct: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert compiled.refusals[0].construct == construct


def test_max_properties_below_the_required_count_admits_nothing() -> None:
    compiled = compile_schema(_object(3, ["a", "b"], maxProperties=1))
    assert compiled.grammar is None
    assert (compiled.refusals[0].construct, compiled.refusals[0].path) == ("maxProperties", "$")


@pytest.mark.parametrize(("least", "most"), [(2, None), (2, 3), (0, 2), (3, 3)])
def test_unique_enum_items_counted(least: int, most: int | None) -> None:
    schema = {"type": "array", "items": {"enum": ["w", "x", "y", "z"]}, "uniqueItems": True, "minItems": least}
    if most is not None:
        schema["maxItems"] = most
    g, check = grammar_of(schema), validator(schema)
    admitted = 0
    for k in range(6):
        for arr in itertools.product(["w", "x", "y", "z"], repeat=k):
            text = json.dumps(list(arr), separators=(",", ":"))
            assert g.matches(text) == check.is_valid(list(arr)), text
            admitted += g.matches(text)
    assert admitted > 0


def test_unique_items_wanting_more_values_than_allowed_admit_nothing() -> None:
    compiled = compile_schema({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 3})
    assert compiled.grammar is None
    assert compiled.refusals[0].construct == "minItems"


# ---------------------------------------------------------------------------- regressions (bench instances)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        # JsonSchemaStore libman: "provider" before "destination", "files" last
        (
            {
                "type": "object",
                "properties": {
                    "library": {"type": "string"},
                    "files": {"type": "array", "items": {"type": "string"}},
                    "destination": {"type": "string"},
                    "provider": {"type": "string"},
                },
                "required": ["library"],
            },
            '{"library":"jquery","provider":"cdnjs","destination":"js/","files":["jquery.min.js"]}',
        ),
        # Snowplow sp_351: "enabled" before "parameters" where the schema declares them reversed
        (
            {
                "type": "object",
                "properties": {
                    "parameters": {"type": "object"},
                    "vendor": {"type": "string"},
                    "name": {"type": "string"},
                    "enabled": {"type": "boolean"},
                },
                "required": ["vendor", "name", "enabled", "parameters"],
                "additionalProperties": False,
            },
            '{"vendor":"com.example","name":"pii","enabled":true,"parameters":{}}',
        ),
    ],
)
def test_valid_bench_instances_in_another_order_are_admitted(schema: Any, text: str) -> None:
    assert validator(schema).is_valid(json.loads(text))
    assert grammar_of(schema).matches(text)


# ---------------------------------------------------------------------------- families


_VALUES = [{"type": "integer"}, {"type": "string", "maxLength": 2}, {"const": 1}, {"enum": [True, None]}, False]


@st.composite
def _objects(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "ab", "ba", "c", "", "é"]), max_size=ANY_ORDER, unique=True))
    schema: dict[str, Any] = {"type": "object", "properties": {n: draw(st.sampled_from(_VALUES)) for n in names}}
    required = draw(st.lists(st.sampled_from([*names, "zz"]), max_size=3, unique=True)) if names else []
    if required:
        schema["required"] = required
    extra = draw(st.sampled_from([None, False, {"type": "integer"}]))
    if extra is not None:
        schema["additionalProperties"] = extra
    if draw(st.integers(0, 3)) == 0:
        schema["minProperties"] = draw(st.integers(1, 4))
    if draw(st.integers(0, 3)) == 0:
        schema["maxProperties"] = draw(st.integers(0, 4))
    return schema


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_objects(), st.integers(0, 1000))
def test_any_order_families_admit_only_valid_values(schema: dict[str, Any], seed: int) -> None:
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 40, seed) == []
    rng = random.Random(seed)
    keys = [*schema["properties"], "zz"]
    values = ["1", '"s"', "true", "null", "2.5"]
    texts = [
        "{" + ",".join(f"{json.dumps(rng.choice(keys))}:{rng.choice(values)}" for _ in range(rng.randint(0, 4))) + "}"
        for _ in range(60)
    ]
    assert sound_on(schema, texts) == []
