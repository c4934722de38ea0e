"""The relaxed grammar: a refused schema's keywords dropped where that only widens it."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from localllm.grammar.relax import MAX_DROPS, relax
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import invalid_walks, realworld, validator

TAGS: dict[str, Any] = {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True}


def _dropped(schema: Any) -> list[tuple[str, str]] | None:
    relaxed = relax(schema)
    return None if relaxed is None else [(r.path, r.construct) for r in relaxed.dropped]


def _without(schema: Any, path: list[str | int], key: str) -> Any:
    out = copy.deepcopy(schema)
    node = out
    for token in path:
        node = node[token]
    del node[key]
    return out


def test_unique_strings_leave_the_rest_of_the_answer_constrained() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"tags": TAGS, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["tags", "n"],
        "additionalProperties": False,
    }
    assert compile_schema(schema).refusals[0].construct == "uniqueItems"
    relaxed = relax(schema)
    assert relaxed is not None
    assert [(r.path, r.construct) for r in relaxed.dropped] == [("$.properties.tags", "uniqueItems")]
    assert relaxed.schema == _without(schema, ["properties", "tags"], "uniqueItems")
    assert invalid_walks(relaxed.schema, relaxed.compiled, 300) == []
    g = Grammar.parse(relaxed.compiled.grammar or "")
    assert g.matches('{"tags":["a","b"],"n":3}') and g.matches('{"n":3,"tags":[]}')
    assert g.matches('{"tags":["a","a"],"n":3}')  # left to validation
    assert not g.matches('{"tags":["a"],"n":10}') and not g.matches('{"tags":[1],"n":3}')
    assert not g.matches('{"tags":["a"]}') and not g.matches('{"tags":[],"n":3,"x":1}')
    assert schema["properties"]["tags"]["uniqueItems"] is True  # the caller's schema is not changed


def test_every_refused_real_world_schema_relaxes_to_a_superset_that_walks_valid() -> None:
    relaxed_ids = []
    for sid, schema in realworld():
        if compile_schema(schema).exact:
            continue
        relaxed = relax(schema, seconds=600)  # winget's ten compiles take 3-4 s alone, more under load
        if relaxed is None:
            continue
        relaxed_ids.append(sid)
        for refusal in relaxed.dropped:
            assert refusal.construct in json.dumps(schema), (sid, refusal)
        assert invalid_walks(relaxed.schema, relaxed.compiled, 100) == [], sid
    # the JSON Schema Store schemas with unique strings (winget's manifest drops ten), the test
    # suite's uniqueItems and multipleOf 123456789, llama.cpp's lookahead; of the other 13, 7
    # are invalid, 3 admit no value, 1 has unevaluatedProperties and 2 are refused inside the
    # compiler's rewrites (merged allOf components, dependentSchemas)
    assert relaxed_ids == [
        "jsb/JsonSchemaStore/schema-catalog",
        "jsb/JsonSchemaStore/drupal-breakpoints",
        "jsb/JsonSchemaStore/csscomb",
        "jsb/JsonSchemaStore/minecraft-configured-carver",
        "jsb/JsonSchemaStore/winget-pkgs-singleton-1.0.0",
        "jsts/draft2020-12/uniqueItems/1",
        "jsts/draft2020-12/multipleOf/3",
        "llama.cpp/unsupported-regexp-in-a-property",
    ]


@pytest.mark.parametrize(
    ("name", "schema", "dropped"),
    [
        (
            "a not at a property goes whole",
            {"type": "object", "properties": {"n": {"type": "integer", "not": {"multipleOf": 3}}}, "required": ["n"]},
            [("$.properties.n", "not")],
        ),
        (
            "a lookahead pattern",
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)x+$"}}, "required": ["a"]},
            [("$.properties.a", "pattern")],
        ),
        (
            # a string or a list of unique strings (JSON Schema Store's minecraft carver): the
            # branches' types stay apart, so the oneOf still picks exactly one
            "under a oneOf whose branches state types no two share",
            {"oneOf": [{"type": "string"}, TAGS]},
            [("$[1]", "uniqueItems")],
        ),
        (
            # pydantic's Optional[list]: anyOf of null and the list, the branch named "[1]"
            "an anyOf branch",
            {"type": "object", "properties": {"x": {"anyOf": [{"type": "null"}, TAGS]}}},
            [("$.properties.x[1]", "uniqueItems")],
        ),
        (
            "unique strings in $defs, reached by a ref from a property only",
            {
                "$defs": {"t": TAGS},
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"not": {"type": "string"}}},
            },
            [("$.$defs.t", "uniqueItems")],
        ),
    ],
)
def test_relaxed(name: str, schema: Any, dropped: list[tuple[str, str]]) -> None:
    assert _dropped(schema) == dropped, name
    relaxed = relax(schema)
    assert relaxed is not None and invalid_walks(relaxed.schema, relaxed.compiled, 200) == []


@pytest.mark.parametrize(
    ("name", "schema"),
    [
        # a wider branch could match beside the other: fewer values pass the oneOf
        # arrays on both branches: the wider one matches beside the other
        ("under a oneOf whose branches share a type", {"oneOf": [{"type": "array", "maxItems": 1}, TAGS]}),
        ("under a oneOf of refs", {"$defs": {"t": TAGS}, "oneOf": [{"type": "string"}, {"$ref": "#/$defs/t"}]}),
        (
            "a ref from under not could reach it",
            {"$defs": {"t": TAGS}, "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"not": {"$ref": "#/$defs/t"}}}},
        ),
        (
            "unevaluatedProperties anywhere",
            {"type": "object", "properties": {"t": TAGS}, "unevaluatedProperties": False},
        ),
        (
            "the compiler's own path of an allOf component",
            {"allOf": [{"properties": {"t": TAGS}}, {"required": ["t"]}]},
        ),
        ("not a valid schema", {"type": "kaboom"}),
        # the validator cannot check it either: dropping it would let anything through
        ("a ref that does not resolve", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
        (
            "more keywords to drop than MAX_DROPS",
            {"type": "object", "properties": {f"t{i}": TAGS for i in range(MAX_DROPS + 1)}},
        ),
        ("nothing to relax", {"type": "object", "properties": {"t": {"type": "string"}}}),
        # no value meets them: dropping the bound (or the false) would constrain answers that
        # can never validate (the service says so in a 400 instead)
        (
            "bounds no integer meets",
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["n"]},
        ),
        ("an allOf component is false", {"allOf": [{"type": "string"}, False]}),
    ],
)
def test_not_relaxed(name: str, schema: Any) -> None:
    assert relax(schema) is None, name


def test_a_relaxed_grammar_admits_the_valid_answers_the_exact_one_would() -> None:
    # the same object with and without the refused keyword: every valid answer of the original
    # that the grammar of the original minus uniqueItems admits, the relaxed grammar admits
    schema = {"type": "object", "properties": {"tags": TAGS, "kind": {"enum": ["a", "b"]}}, "required": ["kind"]}
    relaxed = relax(schema)
    assert relaxed is not None
    g = Grammar.parse(relaxed.compiled.grammar or "")
    check = validator(schema)
    answers = [
        '{"kind":"a"}',
        '{"kind":"b","tags":["x","y"]}',
        '{"tags":[],"kind":"a"}',
        '{"tags":["x","x"],"kind":"a"}',
    ]
    for text in answers:
        assert g.matches(text)
    assert [check.is_valid(json.loads(t)) for t in answers] == [True, True, True, False]


def test_relaxing_stops_at_its_compile_time_budget() -> None:
    schema = {"type": "object", "properties": {"a": TAGS, "b": TAGS}}  # two keywords: two compiles more
    assert relax(schema, seconds=0.0) is None
    relaxed = relax(schema)
    assert relaxed is not None and len(relaxed.dropped) == 2


def test_the_answer_is_kept_per_schema() -> None:
    schema = {"type": "object", "properties": {"tags": TAGS}}
    first = relax(schema)
    assert first is not None and relax(copy.deepcopy(schema)) is first
    assert relax(schema, space=True) is not first
    assert relax({"type": "object", "properties": {"tags": TAGS}, "x": float("nan")}) is None  # not JSON


# ---------------------------------------------------------------------------- the superset, on random schemas

_REFUSED: list[dict[str, Any]] = [
    {"type": "array", "items": {"type": "string", "maxLength": 2}, "uniqueItems": True, "maxItems": 3},
    {"type": "integer", "not": {"multipleOf": 3}},
    {"type": "string", "pattern": "^(?=a)[ab]{0,2}$"},
]
_LEAVES: list[dict[str, Any]] = [
    {"type": "integer", "minimum": 0, "maximum": 3},
    {"type": "string", "maxLength": 2},
    {"enum": ["a", 1, None]},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    {},
]
_POOL: list[Any] = [None, True, 0, 1, 3, 6, -1, "a", "b", "ab", "ba", "", "abc", [], ["a"], ["a", "a"], ["a", "b"], [1]]


def _schema(rng: random.Random, depth: int = 0) -> Any:
    """Refused keywords under properties, items, allOf, anyOf, oneOf (of disjoint types too),
    not and if/then/else."""
    r = rng.random()
    if depth > 2 or r < 0.35:
        return copy.deepcopy(rng.choice(_REFUSED if rng.random() < 0.4 else _LEAVES))
    if r < 0.55:
        names = rng.sample(["a", "b", "c"], rng.randint(1, 3))
        out: dict[str, Any] = {"type": "object", "properties": {n: _schema(rng, depth + 1) for n in names}}
        out["required"] = rng.sample(names, rng.randint(0, len(names)))
        return out
    if r < 0.65:
        return {"type": "array", "items": _schema(rng, depth + 1), "maxItems": 3}
    if r < 0.72:  # a string or a list: branches whose types no two share
        return {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "array", "items": _schema(rng, depth + 1)}]}
    if r < 0.85:
        key = rng.choice(["allOf", "anyOf", "oneOf"])
        return {key: [_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]}
    if r < 0.93:
        return {"not": _schema(rng, depth + 1)}
    return {"if": _schema(rng, depth + 1), "then": _schema(rng, depth + 1), "else": _schema(rng, depth + 1)}


def _value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 2 or r < 0.5:
        return rng.choice(_POOL)
    if r < 0.75:
        return {k: _value(rng, depth + 1) for k in rng.sample(["a", "b", "c"], rng.randint(0, 3))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _narrowed(schema: Any, wider: Any, rng: random.Random, n: int = 150) -> list[Any]:
    """Values ``schema`` admits and ``wider`` does not."""
    check, widened = validator(schema), validator(wider)
    return [v for v in (_value(rng) for _ in range(n)) if check.is_valid(v) and not widened.is_valid(v)]


def test_a_relaxed_schema_admits_every_value_the_schema_does() -> None:
    rng = random.Random(20261205)
    relaxed_count = 0
    for _ in range(300):
        schema = _schema(rng)
        if rng.random() < 0.3:  # a refused keyword in $defs, reached from a property or from under a not
            ref = {"type": "object", "properties": {"r": {"$ref": "#/$defs/d"}}}
            beside = ref if rng.random() < 0.5 else {"not": {**ref, "required": ["r"]}}
            schema = {"$defs": {"d": copy.deepcopy(rng.choice(_REFUSED))}, "allOf": [schema, beside]}
        relaxed = relax(schema)
        if relaxed is None:
            continue
        relaxed_count += 1
        assert _narrowed(schema, relaxed.schema, rng) == [], (schema, relaxed.dropped)
        assert invalid_walks(relaxed.schema, relaxed.compiled, 10, seed=relaxed_count) == []
    assert relaxed_count >= 60  # ~1 in 4 of these relax; the rest keep a refusal under not/oneOf/if


def test_the_superset_check_catches_a_keyword_dropped_under_not() -> None:
    # the control: uniqueItems dropped under a not narrows the schema, and the values show it
    schema = {"not": copy.deepcopy(_REFUSED[0])}
    wrong = {"not": {k: v for k, v in _REFUSED[0].items() if k != "uniqueItems"}}
    relaxed = relax(schema)  # drops the whole not instead
    assert relaxed is not None and (relaxed.schema, relaxed.dropped[0].construct) == ({}, "not")
    assert _narrowed(schema, wrong, random.Random(1), n=400) != []
