"""``if``/``then`` chains keyed on one property's ``const`` (``if kind == "a" then …``, one
component per value: JSON Schema Store's saucectl, minecraft's item modifiers, yippee) compile
as one choice with a branch per value, exactly: the grammar admits what the schema admits."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from localllm.grammar import compile_schema
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import invalid_walks, validator

KINDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def chain(
    n: int,
    *,
    node_required: bool = True,
    declared: str = "enum",
    if_requires: bool = False,
    if_typed: bool = False,
    elses: bool = False,
    node_typed: bool = True,
) -> dict[str, Any]:
    """An object with ``kind`` and, per kind, an if/then making ``x<i>`` a required integer
    (and, with ``elses``, an else forbidding it)."""
    kinds = KINDS[:n]
    choices: dict[str, dict[str, Any]] = {
        "enum": {"enum": kinds},
        "some": {"enum": kinds[:-1]},  # a value no if names: the "other" branch
        "string": {"type": "string", "maxLength": 2},
        "none": {},
    }
    kind = choices[declared]
    comps: list[Any] = []
    for i, value in enumerate(kinds):
        cond: dict[str, Any] = {"properties": {"kind": {"const": value}}}
        if if_requires:
            cond["required"] = ["kind"]
        if if_typed:
            cond["type"] = "object"
        comp: dict[str, Any] = {
            "if": cond,
            "then": {"type": "object", "properties": {f"x{i}": {"type": "integer"}}, "required": [f"x{i}"]},
        }
        if elses:
            comp["else"] = {"properties": {f"x{i}": False}}
        comps.append(comp)
    schema: dict[str, Any] = {"properties": {"kind": kind, **{f"x{i}": {} for i in range(n)}}, "allOf": comps}
    if node_typed:
        schema["type"] = "object"
    if node_required:
        schema["required"] = ["kind"]
    return schema


def candidates(n: int) -> list[Any]:
    """Objects with each kind (and one no if names, and none), with x0..x2 present, absent
    or mistyped; and values that are not objects."""
    out: list[Any] = [None, 1, "a", [], [{"kind": "a"}]]
    for kind in [*KINDS[:n], "zz", None]:
        # declared names only: an undeclared "x9" beside a declared "x0" is a key the open
        # object's grammar leaves out on purpose (README, "Open objects"); "zz" is not
        for xs in itertools.product([None, 1, "s"], repeat=min(n, 3)):
            value: dict[str, Any] = {} if kind is None else {"kind": kind}
            value.update({f"x{i}": x for i, x in enumerate(xs) if x is not None})
            out.append(value)
            out.append({**value, f"x{n - 1}": 7})  # the last kind's property too
            out.append({**value, "zz": 1})
    return out


VARIANTS = [
    pytest.param(
        dict(zip(keys, values, strict=True)), id="-".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
    )
    for keys, values in [
        (("node_required", "declared"), (True, "enum")),
        (("node_required", "declared"), (False, "enum")),
        (("node_required", "declared"), (True, "some")),
        (("node_required", "declared"), (False, "string")),
        (("node_required", "declared", "if_requires"), (False, "none", True)),
        (("node_required", "if_typed"), (False, True)),
        (("node_required", "declared", "elses"), (False, "some", True)),
        (("node_required", "declared", "if_requires", "elses"), (False, "string", True, True)),
        (("node_typed",), (False,)),  # only the thens say object
        (("node_typed", "if_typed", "node_required"), (False, True, False)),  # not rewritten: non-objects pass
    ]
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_the_grammar_admits_exactly_what_the_schema_admits(variant: dict[str, Any], n: int) -> None:
    schema = chain(n, **variant)
    compiled = compile_schema(schema)
    if n == 8 and variant == {"node_typed": False, "if_typed": True, "node_required": False}:
        # a non-object passes every typed "if" and the group: no object-only branches for it
        assert not compiled.exact and compiled.refusals[0].construct == "anyOf"
        return
    assert compiled.exact, compiled.refusals
    grammar = Grammar.parse(compiled.grammar or "")
    check = validator(schema)
    wrong = []
    for value in candidates(n):
        text = json.dumps(value, separators=(",", ":"))
        if grammar.matches(text) is not check.is_valid(value):
            wrong.append((text, check.is_valid(value)))
    assert wrong == []
    assert invalid_walks(schema, compiled, 100, seed=n) == []


def test_eight_kinds_compile_where_they_were_refused() -> None:
    # before: "allOf of anyOf gives more than 64 alternatives" from seven components on
    for n in (7, 8, 20):
        assert compile_schema(chain(n)).exact, n
        assert compile_schema(chain(n, node_required=False, declared="string")).exact, n


@pytest.mark.parametrize(
    "change",
    [
        {"if": {"properties": {"kind": {"const": "a"}, "other": {"const": 1}}}},  # two properties
        {"if": {"properties": {"kind": {"const": 1}}}},  # not a string
        {"if": {"properties": {"kind": {"enum": ["a", "b"]}}}},  # two values
        {"if": {"properties": {"kind": {"const": "a", "minLength": 1}}}},  # more than the const
        {"if": {"properties": {"kind": {"const": "a"}}, "minProperties": 1}},
        {"if": {"properties": {"kind": {"const": "b"}}}},  # the same value twice
    ],
)
def test_a_component_that_is_not_a_plain_case_leaves_the_chain_distributed(change: dict[str, Any]) -> None:
    schema = chain(3, node_required=False, declared="string")
    schema["allOf"][0] = {**schema["allOf"][0], **change}
    compiled = compile_schema(schema)
    assert compiled.exact, compiled.refusals  # three components: distributing them fits
    grammar = Grammar.parse(compiled.grammar or "")
    check = validator(schema)
    rng = random.Random(3)
    values = candidates(3)
    rng.shuffle(values)
    assert [v for v in values if grammar.matches(json.dumps(v, separators=(",", ":"))) is not check.is_valid(v)] == []


def test_the_object_type_may_come_from_a_referenced_component() -> None:
    # v2ray's v4-config: `allOf: [{$ref: base}, {if: {type: object, …}, then: …}, …]`, the
    # node itself untyped; a non-object fails the ref, so every branch may be an object
    schema = chain(8, node_typed=False, if_typed=True, node_required=False)
    schema["$defs"] = {"base": {"type": "object"}}
    schema["allOf"].insert(0, {"$ref": "#/$defs/base"})
    compiled = compile_schema(schema)
    assert compiled.exact, compiled.refusals  # before: more than 64 alternatives
    grammar = Grammar.parse(compiled.grammar or "")
    check = validator(schema)
    values = candidates(8)
    assert [v for v in values if grammar.matches(json.dumps(v, separators=(",", ":"))) is not check.is_valid(v)] == []
    assert invalid_walks(schema, compiled, 100, seed=8) == []
    # the same ref to a schema that admits strings too leaves the chain distributed (refused)
    schema["$defs"]["base"] = {"type": ["object", "string"]}
    assert not compile_schema(schema).exact
