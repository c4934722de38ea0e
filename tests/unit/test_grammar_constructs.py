"""Constructs compiled since the JSONSchemaBench sample's refusals (tests/bench/bench_grammar.py):
oneOf branches told apart by required names, closed objects and alternatives' kinds; allOf
components with their own if/then; the root's id carried into merged copies; uri-template.

Each has a regression test (refused before) and a family test: every walk validates and no
candidate the schema rejects is admitted.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.grammar.compile import compile_schema
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import Runaway, grammar_of, invalid_walks, leaks, validator

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"


# ---------------------------------------------------------------------------- oneOf told apart


# Github_trivial o83137 (reduced): a closed object that requires "locks", or one that requires "error"
LOCKS = {
    "$schema": D4,
    "type": "object",
    "oneOf": [
        {
            "properties": {"locks": {"type": "array", "items": {"type": "string"}}, "next": {"type": "string"}},
            "additionalProperties": False,
            "required": ["locks"],
        },
        {
            "properties": {"locks": {"type": "null"}, "error": {"type": "string"}},
            "additionalProperties": False,
            "required": ["error"],
        },
    ],
}


def test_one_of_of_closed_objects_with_different_required_names_compiles() -> None:
    grammar = grammar_of(LOCKS)
    assert grammar.matches('{"locks":["a"],"next":"x"}') and grammar.matches('{"locks":null,"error":"e"}')
    assert grammar.matches('{"error":"e"}')
    assert not grammar.matches('{"locks":["a"],"error":"e"}') and not grammar.matches("{}")


def test_one_of_told_apart_by_the_kinds_of_alternatives() -> None:
    # JsonSchemaStore rtx (reduced): an array of tools, or one tool (a string or an object)
    tool = {
        "oneOf": [
            {"type": "string"},
            {"type": "object", "properties": {"version": {"type": "string"}}, "required": ["version"]},
        ]
    }
    schema = {
        "$defs": {"tool": tool},
        "oneOf": [{"type": "array", "items": {"$ref": "#/$defs/tool"}}, {"$ref": "#/$defs/tool"}],
    }
    grammar = grammar_of(schema)
    assert (
        grammar.matches('["1.0",{"version":"2"}]') and grammar.matches('"1.0"') and grammar.matches('{"version":"2"}')
    )
    assert not grammar.matches("1")


_PROP_SCHEMAS: list[Any] = [
    {"type": "string"},
    {"type": "null"},
    {"const": 1},
    {"enum": [1, 2]},
    {"type": "integer"},
    {},
]
_BRANCH_NAMES = ["a", "b", "c"]


@st.composite
def _branch(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(_BRANCH_NAMES), min_size=1, max_size=3, unique=True))
    node: dict[str, Any] = {"properties": {n: draw(st.sampled_from(_PROP_SCHEMAS)) for n in names}}
    required = draw(st.lists(st.sampled_from(_BRANCH_NAMES), max_size=2, unique=True))
    if required:
        node["required"] = required
    if draw(st.booleans()):
        node["additionalProperties"] = False
    return node


def _objects(rng: random.Random, n: int) -> list[Any]:
    values: list[Any] = ["x", 1, None, {}]
    pool: list[Any] = ["s", None, 1, 2, 3, 1.5, [], {}]
    for _ in range(n):
        names = rng.sample([*_BRANCH_NAMES, "d"], rng.randint(1, 3))
        values.append({k: rng.choice(pool) for k in names})
    return values


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_branch(), min_size=2, max_size=3), st.integers(0, 1000))
def test_one_of_families_admit_only_values_one_branch_accepts(branches: list[Any], seed: int) -> None:
    schema = {"type": "object", "oneOf": branches}
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 30, seed) == []
    assert leaks(schema, _objects(random.Random(seed), 80)) == []


# overlapping branches whose values have no negation here (a oneOf inside): each branch is
# generated without the keys the others require (a partial negation, noted)
_OVERLAP = {"oneOf": [{"type": "integer"}, {"minimum": 2}]}  # 2, 3, … match both: no negation here

# Github_medium o79474 (reduced): open objects each requiring their own key
ROLES = {
    "type": "array",
    "items": {
        "oneOf": [
            {"type": "object", "properties": {"allowLogin": {"type": "boolean"}}, "required": ["allowLogin"]},
            {"type": "object", "properties": {"injectRoles": _OVERLAP}, "required": ["injectRoles"]},
        ]
    },
}


def test_one_of_of_open_objects_told_apart_by_the_keys_the_others_require() -> None:
    compiled = compile_schema(ROLES)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(ROLES, compiled, 300) == []
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('[{"allowLogin":true},{"injectRoles":2.5},{"injectRoles":-1},{"injectRoles":"s"}]')
    assert not grammar.matches('[{"allowLogin":true,"injectRoles":2.5}]')  # both branches: invalid
    assert not grammar.matches('[{"injectRoles":1.5}]')  # neither of its own oneOf: invalid
    # valid, left out (injectRoles 3 matches both of its own oneOf, so only allowLogin's branch
    # does), and noted
    assert validator(ROLES).is_valid([{"allowLogin": True, "injectRoles": 3}])
    assert not grammar.matches('[{"allowLogin":true,"injectRoles":3}]')
    # the negation of injectRoles' branch, which allowLogin's is generated with
    assert [n.split(":")[0] for n in compiled.notes if "no negation here" in n] == ["$.items.oneOf[1]"]


def test_one_of_told_apart_by_a_key_the_other_forbids_through_its_patterns() -> None:
    # Github_medium o10566 (reduced): a {"$date": …} wrapper or a document whose keys never start with $
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"$date": {"type": "string"}}, "required": ["$date"]},
            {"type": "object", "patternProperties": {"^[^$]": {"type": "integer"}}, "additionalProperties": False},
        ]
    }
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert compiled.notes == []  # disjoint as they are: nothing left out
    assert invalid_walks(schema, compiled, 300) == []
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('{"$date":"x"}') and grammar.matches('{"a":1}') and grammar.matches("{}")
    assert not grammar.matches('{"a":"x"}')


# Github_hard o17529 (reduced): Symfony asserts, told apart by "assert", which the items' own
# "required" (a sibling of the oneOf, not in any branch) makes present in every value
_ASSERT_EXTRAS: list[tuple[str, dict[str, Any]]] = [
    ("NotBlank", {}),
    ("Blank", {}),
    ("Type", {"type": {"enum": ["array", "bool", "int"]}}),
    ("Email", {"strict": {"type": "boolean"}}),
    ("Length", {"min": {"type": "integer"}, "max": {"type": "integer"}}),
    ("Regex", {"pattern": {"type": "string"}}),
    ("Uuid", {}),
    ("Range", {"min": {"type": ["integer", "string"]}}),
]
ASSERTS = {
    "type": "array",
    "items": {
        "required": ["assert"],
        "oneOf": [
            {"properties": {"assert": {"enum": [name]}, "message": {"type": "string"}, **extra}}
            for name, extra in _ASSERT_EXTRAS
        ],
    },
}


def test_one_of_told_apart_by_a_name_the_siblings_require() -> None:
    compiled = compile_schema(ASSERTS)
    assert compiled.grammar is not None, compiled.refusals
    assert compiled.notes == []  # disjoint as they are: nothing left out
    assert invalid_walks(ASSERTS, compiled, 300) == []
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('[{"assert":"NotBlank","message":"m"},{"assert":"Length","min":1,"x":[]}]')
    assert grammar.matches('[{"assert":"Range","min":"a"}]')
    assert not grammar.matches('[{"message":"m"}]')  # every branch matches it: invalid
    assert not grammar.matches('["NotBlank"]')  # a string matches every branch too
    assert not grammar.matches('[{"assert":"Length","min":"a"}]')  # no branch


# Github_medium o35868 (reduced): an address per country; no branch requires "country", so an
# address without one matches them all, and negating six branches of three properties each
# would take 3^6 alternatives
ADDRESS = {
    "type": "object",
    "oneOf": [
        {
            "properties": {
                "country": {"type": "string", "enum": [country]},
                "state": {"type": "string", "enum": states},
                "postalCode": {"type": "string", "maxLength": 10},
            }
        }
        for country, states in [
            ("BRA", ["AC", "AL", "SP"]),
            ("ITA", ["AG", "AL", "MI"]),
            ("MEX", ["AG", "BC", "CM"]),
            ("USA", ["AL", "CA", "NY"]),
            ("CAN", ["AB", "BC", "ON"]),
            ("ARG", ["B", "C", "K"]),
            ("CHL", ["AI", "AN", "AP"]),
        ]
    ],
}


def test_one_of_told_apart_by_a_property_no_branch_requires_is_generated_with_it() -> None:
    compiled = compile_schema(ADDRESS)
    assert compiled.grammar is not None, compiled.refusals
    assert [n for n in compiled.notes if "tells them apart" in n] == [
        '$: oneOf branches are generated with "country", which tells them apart'
    ]
    assert invalid_walks(ADDRESS, compiled, 500) == []
    grammar, check = Grammar.parse(compiled.grammar), validator(ADDRESS)
    assert grammar.matches('{"country":"BRA","state":"SP","postalCode":"01000"}')
    assert grammar.matches('{"country":"ITA","state":"AL"}')
    assert not grammar.matches('{"country":"BRA","state":"MI"}') and not check.is_valid(
        {"country": "BRA", "state": "MI"}
    )
    # valid (only Brazil has the state SP), not generated: no country
    assert check.is_valid({"state": "SP"}) and not grammar.matches('{"state":"SP"}')


# Github_hard o21780 (and o4237, o61027, Github_medium o51161, ...): a host as a name or an address
HOST = {"type": "string", "oneOf": [{"format": "hostname"}, {"format": "ipv4"}, {"format": "ipv6"}]}


def test_one_of_of_formats_told_apart_by_their_supersets_and_negations() -> None:
    compiled = compile_schema(HOST)
    assert compiled.grammar is not None, compiled.refusals
    # ipv4 is negated exactly; hostname and ipv6 as the strings outside their supersets
    negated = [n.split(":")[0] for n in compiled.notes if "negated here as" in n]
    assert negated == ["$.oneOf[0]", "$.oneOf[2]"]
    assert invalid_walks(HOST, compiled, 1000) == []
    grammar, check = Grammar.parse(compiled.grammar), validator(HOST)
    hosts = ["example.com", "10.0.0.256", "1.2.3", "::1", "fe80::1:2", "1.2.3.4", "a:b", "-x", "::ffff:1.2.3.4"]
    assert [h for h in hosts if grammar.matches(json.dumps(h))] == [h for h in hosts if check.is_valid(h)]
    assert [h for h in hosts if not check.is_valid(h)] == ["1.2.3.4", "a:b", "-x"]  # 1.2.3.4 is a hostname too


@pytest.mark.parametrize(
    "schema",
    [
        # Github_medium o58478: a registry as a URI or a host name (a URI has a scheme and a colon)
        {"type": "string", "oneOf": [{"format": "uri"}, {"format": "hostname"}]},
        {"type": "string", "oneOf": [{"format": "ipv4"}, {"format": "ipv6"}, {"format": "email"}]},
        {"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]},
    ],
)
def test_one_of_of_formats_no_string_holds_two_of(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert [n for n in compiled.notes if "rejects" in n] == []  # disjoint as they are
    assert invalid_walks(schema, compiled, 500) == []


def test_a_format_is_negated_exactly_where_its_superset_is_exact_and_an_annotation_rejects_nothing() -> None:
    schema = {"type": "string", "maxLength": 20, "not": {"format": "ipv4"}}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None and compiled.notes == [], compiled.refusals
    assert invalid_walks(schema, compiled, 500) == []
    grammar = Grammar.parse(compiled.grammar)
    assert [grammar.matches(json.dumps(t)) for t in ["1.2.3.4", "1.2.3.04", "x", "256.1.1.1"]] == [
        False,
        True,
        True,
        True,
    ]
    # only where the superset is exact: the strings outside hostname's are fewer than not-a-hostname's
    assert compile_schema({"type": "string", "not": {"format": "hostname"}}).grammar is None
    # "color" is no format draft 7 asserts: negating it leaves no value
    assert compile_schema({"$schema": D7, "type": "string", "not": {"format": "color"}}).unsatisfiable


# Github_hard o3895 (reduced): Solidity type names, one pattern per family, no two matching one name
SOLIDITY = {
    "oneOf": [
        {"type": "string", "pattern": f"^{name}(\\[[0-9]*\\])*$"}
        for name in (
            "u?int(8|16|32|256)?",
            "address",
            "bool",
            "u?fixed(8x0|128x18)?",
            "bytes(1|2|32)",
            "bytes",
            "function",
            "string",
            "tuple",
        )
    ]
}


def test_one_of_of_patterns_no_string_matches_two_of() -> None:
    compiled = compile_schema(SOLIDITY)
    assert compiled.grammar is not None, compiled.refusals
    assert compiled.notes == []
    grammar = Grammar.parse(compiled.grammar)
    names = ["uint256", "int", "address[2][]", "bool", "ufixed128x18", "bytes32", "bytes[]", "string", "x", "bytes3"]
    check = validator(SOLIDITY)
    assert [n for n in names if grammar.matches(json.dumps(n))] == [n for n in names if check.is_valid(n)]
    assert [n for n in names if not check.is_valid(n)] == ["x", "bytes3"]


def test_one_of_told_apart_by_partial_negations_into_nothing_is_refused_not_unsatisfiable() -> None:
    # {"k": 5} is valid (5 matches both of the first value's oneOf, one of the second's), but
    # each branch without the other's required key has no value left: refused, not "no value"
    schema = {
        "type": "object",
        "oneOf": [
            {"required": ["k"], "properties": {"k": _OVERLAP}},
            {"required": ["k"], "properties": {"k": {"oneOf": [{"type": "number"}, {"maximum": 0}]}}},
        ],
    }
    assert validator(schema).is_valid({"k": 5})
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == ["oneOf"]


def test_partial_negations_of_recursive_refs_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # a tree with two recursive children: negating it partially, each level would negate both
    # children again (2^64 steps) were a ref not cut off inside its own negation
    import localllm.grammar.compile as compile_module

    calls = [0]
    negate = compile_module._Compiler.negate

    def counted(self: Any, node: Any, path: str, depth: int, partial: bool = False) -> Any:
        calls[0] += 1
        if calls[0] > 50_000:
            raise Runaway
        return negate(self, node, path, depth, partial)

    monkeypatch.setattr(compile_module._Compiler, "negate", counted)
    tree = {
        "type": "object",
        "properties": {"l": {"$ref": "#/$defs/t"}, "r": {"$ref": "#/$defs/t"}, "q": _OVERLAP},
        "required": ["x"],
    }
    for required in ([], ["l"]):
        other = {"type": "object", "properties": {"l": {"type": "string"}}, "required": required}
        schema = {"$defs": {"t": tree}, "oneOf": [{"$ref": "#/$defs/t"}, other]}
        compiled = compile_schema(schema)
        assert compiled.grammar is not None, compiled.refusals
        assert invalid_walks(schema, compiled, 200) == []
    # a ladder of refs each reached twice: the steps are capped, and the schema refused
    ladder: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(30)
    }
    ladder["d30"] = {"type": "object", "properties": {"q": _OVERLAP}, "required": ["q"]}
    calls[0] = 0
    compiled = compile_schema({"$defs": ladder, "oneOf": [{"$ref": "#/$defs/d0"}, {"type": "object"}]})
    assert calls[0] <= compile_module.MAX_PARTIAL_NEGATIONS + 100  # and a few full negations
    assert [r.construct for r in compiled.refusals] == ["oneOf"]


_UNNEGATED: list[Any] = [
    _OVERLAP,
    {"type": "array", "contains": {"type": "string"}},
    {"type": "string"},
    {"type": "null"},
]


@st.composite
def _open_branch(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(_BRANCH_NAMES), min_size=1, max_size=3, unique=True))
    node: dict[str, Any] = {"properties": {n: draw(st.sampled_from(_UNNEGATED)) for n in names}}
    node["required"] = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    return node


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_open_branch(), min_size=2, max_size=3), st.booleans(), st.integers(0, 1000))
def test_one_of_families_told_apart_partially_admit_only_values_one_branch_accepts(
    branches: list[Any], open_objects: bool, seed: int
) -> None:
    schema = {"type": "object", "oneOf": branches}
    compiled = compile_schema(schema, open_objects=open_objects)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 30, seed) == []
    rng = random.Random(seed)
    pool: list[Any] = ["s", None, 1, 3, -2, 1.5, [], [1, "s"], [1, 2], {}]
    values = [{k: rng.choice(pool) for k in rng.sample([*_BRANCH_NAMES, "d"], rng.randint(1, 3))} for _ in range(80)]
    assert leaks(schema, values) == []


# ---------------------------------------------------------------------------- allOf of if/then


def _if_then(kind: str, name: str) -> dict[str, Any]:
    return {
        "if": {"properties": {"type": {"const": kind}}},
        "then": {"properties": {"type": {"const": kind}, name: {"type": "string"}}, "required": [name]},
    }


# JsonSchemaStore openrewrite (reduced): one if/then per resource type, each in its own allOf component
RESOURCES = {
    "type": "object",
    "properties": {"type": {"enum": ["recipe", "category", "style"]}},
    "required": ["type"],
    "allOf": [_if_then("recipe", "name"), _if_then("category", "packageName")],
}


def test_all_of_components_with_their_own_if_then_compile() -> None:
    grammar = grammar_of(RESOURCES)
    assert grammar.matches('{"type":"recipe","name":"n"}') and grammar.matches('{"type":"style"}')
    assert grammar.matches('{"type":"category","packageName":"p"}')
    assert not grammar.matches('{"type":"recipe"}') and not grammar.matches('{"type":"category","name":"n"}')
    compiled = compile_schema(RESOURCES)
    assert invalid_walks(RESOURCES, compiled, 300) == []


def test_all_of_component_keeps_its_not_beside_its_if() -> None:
    schema = {
        "type": "object",
        "properties": {"k": {"enum": ["a", "b", "c"]}},
        "required": ["k"],
        "allOf": [
            {
                "if": {"properties": {"k": {"const": "a"}}},
                "then": {"required": ["x"]},
                "not": {"properties": {"k": {"const": "c"}}},
            }
        ],
    }
    values = [{"k": "a"}, {"k": "a", "x": 1}, {"k": "b"}, {"k": "c"}, {"k": "c", "x": 1}]
    assert leaks(schema, values) == []
    grammar = grammar_of(schema)
    assert grammar.matches('{"k":"b"}') and not grammar.matches('{"k":"c"}') and not grammar.matches('{"k":"a"}')


# ---------------------------------------------------------------------------- the root's id


def test_root_id_in_distributed_copies_is_not_a_nested_id() -> None:
    # JsonSchemaStore libman (reduced): a draft-4 root with "id", allOf of anyOf distributes the root
    schema = {
        "$schema": D4,
        "id": "https://json.schemastore.org/libman.json",
        "type": "object",
        "properties": {"version": {"enum": ["1.0"]}, "defaultProvider": {"type": "string"}},
        "required": ["version"],
        "allOf": [{"anyOf": [{"required": ["defaultProvider"]}, {"properties": {"defaultProvider": {"const": "x"}}}]}],
    }
    grammar = grammar_of(schema)
    assert grammar.matches('{"version":"1.0","defaultProvider":"y"}') and grammar.matches('{"version":"1.0"}')
    assert invalid_walks(schema, compile_schema(schema), 200) == []


# ---------------------------------------------------------------------------- uri-template


def test_uri_template_is_generated_narrowed_and_valid() -> None:
    schema = {"type": "string", "format": "uri-template"}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None and any("uri-template" in n for n in compiled.notes)
    assert invalid_walks(schema, compiled, 500) == []
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('"https://example.com/{id}/files"')
    for bad in ('"https://example.com/{id"', '"https://example.com/{}"'):
        assert not validator(schema).is_valid(json.loads(bad))
        assert not grammar.matches(bad)


D2020 = "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    ("schema", "admitted", "refused"),
    [
        # JSONSchemaStore stripe-app and schema-catalog
        ({"format": "uri", "pattern": "^https://"}, ["https://a.example/x"], ["http://a.example", "ftp://a.b"]),
        (
            {"format": "uri", "pattern": "^https?://.*/.+"},
            ["http://a.b/c", "https://x.y/z/w"],
            ["https://a.b", "file://a/b"],
        ),
        ({"format": "uri-template", "maxLength": 20}, ["https://a.b/{id}"], ["https://abcdefghij.example/{id}"]),
        ({"format": "date", "pattern": "^2024-"}, ["2024-02-29"], ["2023-02-28", "2024-02-30"]),
        ({"format": "ipv4", "pattern": "^10\\."}, ["10.0.0.1"], ["192.168.0.1", "10.0.0.256"]),
        ({"format": "hostname", "minLength": 10, "maxLength": 12}, ["abcde.fghij"], ["a.b", "abcdefghijklm.example"]),
        ({"$schema": D2020, "format": "duration", "maxLength": 4}, ["P12D", "PT1H"], ["P1Y2M", "P"]),
    ],
)
def test_a_pattern_or_length_bounds_beside_a_format_compile_as_their_product(
    schema: dict[str, Any], admitted: list[str], refused: list[str]
) -> None:
    """Refused before ("pattern beside format is not intersected", "length bounds beside
    format are not intersected"): the format's own rule, read as an automaton, is intersected
    with the patterns and the length bounds."""
    schema = {"type": "string", **schema}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 400) == []
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    assert [t for t in admitted if grammar.matches(json.dumps(t))] == admitted
    assert all(check.is_valid(t) for t in admitted)
    assert [t for t in refused if grammar.matches(json.dumps(t))] == []


def test_a_format_product_past_its_states_is_refused_naming_the_bound() -> None:
    # 5,596 states once minimised
    compiled = compile_schema({"type": "string", "format": "email", "maxLength": 64})
    assert [r.construct for r in compiled.refusals] == ["maxLength"]
    assert compiled.refusals[0].message.startswith('$: format "email" (length 0..64) is not compiled')


def test_a_product_is_capped_once_minimised() -> None:
    # email within 20 characters passes 1,000 states while it is built and has 154 minimised
    schema = {"type": "string", "format": "email", "maxLength": 20}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 500) == []
    grammar = Grammar.parse(compiled.grammar)
    probes = ["a@example.com", "first.last@ex.org", "a@b.co", "abcdefgh@abcdefgh.com", "a@", "@b.co", "a b@c.de"]
    assert [p for p in probes if grammar.matches(json.dumps(p))] == ["a@example.com", "first.last@ex.org", "a@b.co"]


# ---------------------------------------------------------------------------- allOf of many if/then


def _sample(name: str) -> dict[str, Any]:
    path = Path(__file__).parents[1] / "bench" / "data" / "jsonschemabench_sample.jsonl"
    return next(e for e in map(json.loads, path.read_text().splitlines()) if e["id"].endswith(name))


@pytest.mark.parametrize("name", ["JsonSchemaStore---openrewrite", "Github_hard---o21171"])
def test_all_of_if_then_components_keep_the_alternatives_that_admit_a_value(name: str) -> None:
    """Refused before ("allOf of anyOf gives more than 64 alternatives"): the if/then
    components keyed on one property multiply out past 64, and all but a few of those
    alternatives contradict themselves. Each is now generated on trial and dropped when it
    admits nothing; both schemas compile and admit what the validator admits."""
    entry = _sample(name)
    schema = entry["schema"]
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    for test in entry["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"))
        assert check.is_valid(test["data"]) is test["valid"]
        if not test["valid"]:
            assert not grammar.matches(text), text
    if name.endswith("openrewrite"):
        recipe = {"type": "specs.openrewrite.org/v1beta/recipe", "name": "r", "recipeList": ["a.B"]}
        category = {"type": "specs.openrewrite.org/v1beta/category", "packageName": "p"}
        mixed = {**category, "recipeList": ["a.B"]}  # a recipe's key under the category's type
        assert [grammar.matches(json.dumps(v, separators=(",", ":"))) for v in (recipe, category, mixed)] == [
            check.is_valid(v) for v in (recipe, category, mixed)
        ]


def test_all_of_of_anyof_trials_are_bounded_per_schema() -> None:
    """Twelve if/then components on one key multiply out past what MAX_TRIALS trials can
    sort: refused as before, in bounded time. (Keyed on a plain ``const``, the same chain is
    one choice and compiles: ``test_grammar_switch.py``; a ``minLength`` beside each const
    keeps it distributed here.)"""
    kinds = [f"k{i}" for i in range(12)]

    def schema(extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"kind": {"enum": kinds}, **{f"f{i}": {"type": "integer"} for i in range(12)}},
            "required": ["kind"],
            "additionalProperties": False,
            "allOf": [
                {"if": {"properties": {"kind": {"const": k, **extra}}}, "then": {"required": [f"f{i}"]}}
                for i, k in enumerate(kinds)
            ],
        }

    assert [r.construct for r in compile_schema(schema({"minLength": 1})).refusals] == ["anyOf"]
    assert compile_schema(schema({})).exact


def _tagged(i: int, j: int, n: int) -> dict[str, Any]:
    """An object alternative tagged ``t{i}_{j}``: two of different tags never agree."""
    props: dict[str, Any] = {f"p{k}": {"type": "string", "pattern": f"^[a-z]{{1,{k + 3}}}$"} for k in range(n)}
    props["tag"] = {"const": f"t{i}_{j}"}
    return {"type": "object", "properties": props, "required": [*props]}


def test_an_all_of_of_anyof_no_alternative_of_which_admits_a_value_is_unsatisfiable() -> None:
    contradicting = {"allOf": [{"anyOf": [_tagged(i, j, 2) for j in range(8)]} for i in range(3)]}
    alone = compile_schema(contradicting)
    assert alone.grammar is None and [r.construct for r in alone.refusals] == ["anyOf"]
    assert "admits a value" in alone.refusals[0].message
    # as a branch it is dropped, not the schema refused
    schema = {"anyOf": [contradicting, {"type": "integer"}]}
    grammar = grammar_of(schema)
    assert grammar.matches("7") and not grammar.matches('{"tag":"t0_0","p0":"a","p1":"a"}')


def test_all_of_of_anyof_trials_stop_at_the_schemas_character_budget() -> None:
    """512 alternatives of 30-property objects (2.9 million characters to try): refused after
    MAX_TRIAL_CHARS, as before trials existed, not after 1.3 s of trials."""
    from localllm.grammar import compile as module

    schema = {"allOf": [{"anyOf": [_tagged(i, j, 30) for j in range(8)]} for i in range(6)]}
    tried: list[int] = []
    real = module._Compiler.gen

    def counted(self: Any, node: Any, path: str, depth: int, bare: frozenset[str]) -> str:
        if depth == 0 and path == "$" and isinstance(node, dict) and set(node) == {"allOf"}:
            tried.append(1)
        return real(self, node, path, depth, bare)

    module._Compiler.gen = counted  # type: ignore[method-assign]
    try:
        compiled = compile_schema(schema)
    finally:
        module._Compiler.gen = real  # type: ignore[method-assign]
    assert [r.construct for r in compiled.refusals] == ["anyOf"]
    assert 0 < len(tried) < 512


# ---------------------------------------------------------------------------- duration


@pytest.mark.parametrize(
    "draft", ["https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2019-09/schema"]
)
def test_duration_is_generated_in_rfc_3339_form_and_valid(draft: str) -> None:
    """Refused before ("has no grammar here"): JSONSchemaStore openrewrite and the
    JSON-Schema-Test-Suite's format group 18 fell back to the server's converter."""
    schema = {"$schema": draft, "type": "string", "format": "duration"}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None and any("duration" in n for n in compiled.notes)
    assert invalid_walks(schema, compiled, 2000) == []
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    admitted = ["P1Y", "P2W", "P0D", "PT36H", "P1Y2M3DT4H5M6S", "P3M4D", "PT5M6S", "P9999Y"]
    narrowed = ["P10000Y"]  # valid, past the digits
    # outside RFC 3339's form (appendix A): days without months after years, seconds without
    # minutes after hours, a fraction
    invalid = ["P", "PT", "P1YT", "P1W1D", "p1y", "1Y", "P1M1W", "P1Y1D", "PT1H1S", "P1.5Y"]
    assert [t for t in admitted + narrowed if check.is_valid(t)] == admitted + narrowed
    assert [t for t in admitted + narrowed + invalid if grammar.matches(json.dumps(t))] == admitted
    assert not any(check.is_valid(t) for t in invalid)


# ---------------------------------------------------------------------------- ipv6, pointers, regex


def _ipv6_candidates(rng: random.Random, n: int) -> list[str]:
    """Near-misses and hits: 1..10 parts of 0..5 hex digits (a "g" now and then), an IPv4
    tail or an empty part here and there, one ":" doubled."""

    def part() -> str:
        r = rng.random()
        if r < 0.08:
            return ""
        if r < 0.15:
            return ".".join(
                rng.choice(["0", "1", "9", "10", "255", "256", "01"]) for _ in range(rng.choice([3, 4, 4, 5]))
            )
        return "".join(rng.choice("0123456789abcdefABCDEFg") for _ in range(rng.choice([1, 1, 2, 3, 4, 4, 5])))

    out = []
    for _ in range(n):
        text = ":".join(part() for _ in range(rng.randint(1, 10)))
        out.append(text.replace(":", "::", 1) if rng.random() < 0.3 else text)
    return out


@pytest.mark.parametrize("draft", [D4, D2020])
def test_ipv6_is_compiled_exactly(draft: str) -> None:
    """Refused before ("has no grammar here"; 13 JSONSchemaBench schemas, Snowplow's host
    among them). RFC 3986's IPv6address is what ``ipaddress.IPv6Address`` reads: the grammar
    admits exactly the candidates the format check accepts, compressed forms and IPv4 tails
    included."""
    schema = {"$schema": draft, "type": "string", "format": "ipv6"}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert not any("ipv6" in n for n in compiled.notes)  # exact: not narrowed
    grammar, check = Grammar.parse(compiled.grammar), validator(schema)
    candidates = _ipv6_candidates(random.Random(7), 6000)
    candidates += ["::", "::1", "1::", "::ffff:10.0.0.1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "fe80::1%eth0"]
    disagree = [t for t in candidates if grammar.matches(json.dumps(t)) != check.is_valid(t)]
    assert sum(map(check.is_valid, candidates)) > 300
    assert disagree == []
    assert invalid_walks(schema, compiled, 500) == []


def test_ipv6_with_a_pattern_beside_it_is_their_product() -> None:
    schema = {"type": "string", "format": "ipv6", "pattern": "^fe80:", "maxLength": 12}
    grammar = grammar_of(schema)
    assert grammar.matches('"fe80::1"') and not grammar.matches('"fe81::1"') and not grammar.matches('"fe80::1:2:3:4"')
    assert invalid_walks(schema, compile_schema(schema), 500) == []


@pytest.mark.parametrize("draft", [D7, D2020])
@pytest.mark.parametrize(
    ("fmt", "admitted", "invalid"),
    [
        ("json-pointer", ["", "/", "/a/0", "/a~1b/~0", "/ x/{}"], ["a", "/~", "/~2", "/a~"]),
        ("relative-json-pointer", ["0", "0#", "1/a", "12/a~1b"], ["", "#", "01", "/a", "-1", "1~"]),
        ("idn-hostname", ["example.com", "a-b.c1"], ["-x", "a..b", "xn--x"]),
    ],
)
def test_pointers_and_idn_hostnames_compile_narrowed(
    draft: str, fmt: str, admitted: list[str], invalid: list[str]
) -> None:
    """Refused before; generated narrowed now (printable ASCII tokens; ASCII hostnames)."""
    schema = {"$schema": draft, "type": "string", "format": fmt}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert any(fmt in n for n in compiled.notes)
    grammar, check = Grammar.parse(compiled.grammar), validator(schema)
    assert [t for t in admitted + invalid if check.is_valid(t)] == admitted
    assert [t for t in admitted + invalid if grammar.matches(json.dumps(t))] == admitted
    assert invalid_walks(schema, compiled, 1000) == []


COMMON_REGEXES = [
    "^[a-zA-Z0-9_-]+$",
    r"\d{3}-\d{4}",
    r"^https?://",
    r"(foo|bar)\.txt$",
    r"^\bword\b",
    r"[^\s]+",
    r"^v?\d+(\.\d+){0,2}$",
    r"^(?:[a-z]{2,5}|\*)$",
    "",
]


@pytest.mark.parametrize("draft", [D4, D2020])
def test_regex_format_is_generated_as_patterns_that_compile(draft: str) -> None:
    """Refused before (17 JSONSchemaBench schemas: appveyor's commit message filter, renovate's
    extractVersion, ...). The grammar writes a narrowed regex language over the decoded
    characters (a backslash is two characters of JSON text); every walk is a pattern the
    format check reads, and the everyday patterns are admitted."""
    schema = {"$schema": draft, "type": "string", "format": "regex"}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert any("regex" in n for n in compiled.notes)
    grammar = Grammar.parse(compiled.grammar)
    assert [r for r in COMMON_REGEXES if not grammar.matches(json.dumps(r))] == []
    # quantified anchors or boundaries, a reversed count, an open class or group: not patterns
    for bad in ["^*", r"\b+", "a{3,2}", "[a-", "(a", "a**", "[]"]:
        assert not grammar.matches(json.dumps(bad)), bad
    assert invalid_walks(schema, compiled, 3000) == []


def test_regex_format_beside_a_pattern_is_their_product() -> None:
    # Github_hard o90970 (GitLab CI's job coverage): a regex between slashes
    schema = {"type": "string", "format": "regex", "pattern": "^/.+/$"}
    grammar = grammar_of(schema)
    assert grammar.matches(json.dumps(r"/\d+\.\d+%/")) and not grammar.matches(json.dumps(r"\d+"))
    assert invalid_walks(schema, compile_schema(schema), 1000) == []


@pytest.mark.parametrize("draft", [D4, D7, D2020])
def test_a_format_the_draft_does_not_assert_is_an_annotation(draft: str) -> None:
    """``color`` (asserted by draft 3 alone, whose schemas are not compiled) was refused as a
    format with no grammar (7 JSONSchemaBench schemas, all draft 4): it constrains nothing."""
    schema = {"$schema": draft, "type": "string", "format": "color"}
    grammar = grammar_of(schema)
    assert grammar.matches('"#ff0000"') and grammar.matches('"not a colour"')


def test_uri_admits_the_common_schemes() -> None:
    # MCPspec ListRootsResult: a root's uri "must start with file://"
    schema = {"type": "object", "properties": {"uri": {"type": "string", "format": "uri"}}, "required": ["uri"]}
    grammar = grammar_of(schema)
    for text in ('{"uri":"file://path/to/root1"}', '{"uri":"http://a.b/c"}', '{"uri":"https://a.b"}'):
        assert validator(schema).is_valid(json.loads(text))
        assert grammar.matches(text)
    assert invalid_walks(schema, compile_schema(schema), 500) == []


# ---------------------------------------------------------------------------- maxLength beside grouped patterns


def test_max_length_beside_groups_and_optional_groups_is_intersected() -> None:
    # Github_hard o82571: a CURIE pattern of groups, one optional, beside maxLength 146
    schema = {
        "type": "string",
        "pattern": "^([a-z0-9-]+):([a-z0-9\\.-]+):([a-z0-9-]+)?:([a-z0-9-]+)$",
        "minLength": 0,
        "maxLength": 14,
    }
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 500) == []
    grammar = Grammar.parse(compiled.grammar)
    # the first variable part takes the budget (as for plain repeats); the optional one is dropped
    assert grammar.matches('"a:b::c"') and grammar.matches('"abcdefghi:b::c"')
    assert not grammar.matches('"abcdefghij:b::c"')  # 15 characters


_PIECES = ["[a-z]+", "([0-9]+)", "(ab|c+)", "(x+)?", ":", "(y|zz)?", "[a-c]{2,3}"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4),
    st.booleans(),
    st.integers(0, 4),
    st.integers(1, 12),
    st.integers(0, 1000),
)
def test_length_bounds_beside_pattern_families_admit_only_matches(
    pieces: list[str], anchored: bool, lo: int, hi: int, seed: int
) -> None:
    body = "".join(pieces)
    schema = {"type": "string", "pattern": f"^{body}$" if anchored else body, "minLength": lo, "maxLength": hi}
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 40, seed) == []
    rng = random.Random(seed)
    candidates = ["".join(rng.choice("abcxyz09:") for _ in range(rng.randint(0, 14))) for _ in range(200)]
    assert leaks(schema, candidates) == []


# ---------------------------------------------------------------------------- unevaluated*, simple forms


@pytest.mark.parametrize(
    ("schema", "admits", "rejects"),
    [
        (
            {"type": "object", "properties": {"foo": {"type": "string"}}, "unevaluatedProperties": False},
            ['{"foo":"a"}', "{}"],
            ['{"foo":"a","bar":1}', '{"bar":1}'],
        ),
        (
            {"type": "object", "properties": {"foo": {}}, "unevaluatedProperties": {"type": "integer"}},
            ['{"foo":"a","bar":1}'],
            ['{"foo":"a","bar":"b"}'],
        ),
        (
            {"type": "object", "additionalProperties": {"type": "string"}, "unevaluatedProperties": False},
            ['{"bar":"b"}'],
            ['{"bar":1}'],
        ),
        (
            {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
            ["[1]", "[]"],
            ["[1,2]", '["a"]'],
        ),
        (
            {"type": "array", "unevaluatedItems": {"type": "string"}},
            ['["a","b"]'],
            ["[1]"],
        ),
    ],
)
def test_unevaluated_in_its_simple_form_is_the_adjacent_keyword(
    schema: dict[str, Any], admits: list[str], rejects: list[str]
) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    grammar = Grammar.parse(compiled.grammar)
    check = validator(schema)
    for text in admits:
        assert check.is_valid(json.loads(text)) and grammar.matches(text), text
    for text in rejects:
        assert not check.is_valid(json.loads(text)) and not grammar.matches(text), text
    assert invalid_walks(schema, compiled, 200) == []


@pytest.mark.parametrize(
    "schema",
    [
        # the allOf component's own unevaluatedProperties sees none of the parent's properties
        {"properties": {"a": {}}, "allOf": [{"unevaluatedProperties": False}]},
        {"allOf": [{"properties": {"a": {}}}, {"unevaluatedProperties": False}]},
    ],
)
def test_unevaluated_in_an_all_of_component_sees_only_its_own_keywords(schema: dict[str, Any]) -> None:
    assert not validator(schema).is_valid({"a": 1})
    compiled = compile_schema(schema)
    assert compiled.grammar is None or not Grammar.parse(compiled.grammar).matches('{"a":1}')
    assert leaks(schema, [{"a": 1}, {}, {"b": 2}, [], "x"]) == []


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        ({"not": {"properties": {"x": {"type": "string"}}}, "unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"anyOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"prefixItems": [{}], "contains": {"type": "string"}, "unevaluatedItems": False}, "unevaluatedItems"),
    ],
)
def test_unevaluated_beside_in_place_applicators_is_refused(schema: dict[str, Any], construct: str) -> None:
    assert compile_schema(schema).refusals[0].construct == construct


_EVAL_POOL: list[Any] = [False, True, {"type": "integer"}, {"type": "string"}]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
    st.sampled_from([None, False, {"type": "string"}]),
    st.sampled_from(_EVAL_POOL),
    st.booleans(),
    st.integers(0, 1000),
)
def test_unevaluated_properties_families(names: list[str], extra: Any, unevaluated: Any, nest: bool, seed: int) -> None:
    inner: dict[str, Any] = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    if extra is not None:
        inner["additionalProperties"] = extra
    inner["unevaluatedProperties"] = unevaluated
    schema = {"allOf": [{"properties": {"c": {}}}, inner]} if nest else inner
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        return
    assert invalid_walks(schema, compiled, 40, seed) == []
    rng = random.Random(seed)
    pool: list[Any] = [1, "s", None]
    values = [{k: rng.choice(pool) for k in rng.sample(["a", "b", "c", "d"], rng.randint(0, 3))} for _ in range(60)]
    assert leaks(schema, values) == []


def test_a_schema_unsatisfiable_beside_a_one_of_told_apart_partially_says_so() -> None:
    # y admits no value, whatever the oneOf beside it: the schema is unsatisfiable, not a
    # oneOf the partial negations may have emptied
    told_apart = {
        "oneOf": [
            {"type": "object", "required": ["k"], "properties": {"k": _OVERLAP}},
            {"type": "object", "required": ["j"], "properties": {"j": _OVERLAP}},
        ]
    }
    impossible = {"allOf": [{"type": "string"}, {"type": "integer"}]}
    schema = {"type": "object", "properties": {"x": told_apart, "y": impossible}, "required": ["y", "x"]}
    assert compile_schema({"type": "object", "properties": {"x": told_apart}}).grammar is not None
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [(r.path, r.construct) for r in compiled.refusals] == [("$.properties.y", "type")]


#: a hierarchical menu as Github_medium o13136 writes it: "children" items are the item
#: itself, by a ref wrapped in a one-component allOf
MENU: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "definitions": {
        "menuItem": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "url": {"type": "string", "minLength": 1},
                "children": {"type": "array", "items": {"allOf": [{"$ref": "#/definitions/menuItem"}]}},
            },
            "additionalProperties": False,
            "required": ["label", "url"],
        }
    },
    "type": "object",
    "properties": {"main": {"type": "array", "items": {"$ref": "#/definitions/menuItem"}}},
    "required": ["main"],
}


def test_a_recursive_ref_inside_a_one_component_allOf_is_a_recursive_rule() -> None:
    # the component was merged into a new object at every level, so the recursion was
    # unrolled until it was refused past 64 levels; {"allOf": [S]} is S, and the ref stays one
    compiled = compile_schema(MENU)
    assert compiled.exact, compiled.refusals
    assert invalid_walks(MENU, compiled, 300) == []
    g = Grammar.parse(compiled.grammar or "")
    leaf = {"label": "c", "url": "/c"}
    deep: dict[str, Any] = leaf
    for depth in range(20):  # deeper than the unrolling reached (64 schema levels: ~12 items)
        deep = {"label": f"l{depth}", "url": "/", "children": [deep, leaf]}
    answers: list[dict[str, Any]] = [{"main": []}, {"main": [leaf]}, {"main": [deep]}]
    for value in answers:
        assert validator(MENU).is_valid(value)
        assert g.matches(json.dumps(value, separators=(",", ":")))
    for bad in ({"main": [{"label": "a", "url": "/", "children": [{"label": "b"}]}]}, {"main": [{**leaf, "x": 1}]}):
        assert not g.matches(json.dumps(bad, separators=(",", ":")))
