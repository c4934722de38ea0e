"""The grammar-subset checker: the corpus as a conformance suite, plus targeted cases."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from localllm.cli.grammar import verdict
from localllm.grammar import Violation, check_subset, format_violation
from localllm.grammar.paths import child_path, parse_path
from localllm.grammar.subset import pattern_problem
from localllm.resources import data_path
from tests.conftest import REPO

CORPUS = sorted((REPO / "grammar" / "corpus").glob("*.json"))


def findings(schema: Any) -> list[tuple[str, str, str]]:
    return [(v.path, v.construct, v.severity) for v in check_subset(schema)]


def test_corpus_is_big_enough_and_covers_every_verdict_and_server_behaviour() -> None:
    entries = [json.loads(p.read_text()) for p in CORPUS]
    assert len(entries) >= 40
    assert {e["verdict"] for e in entries} == {"ok", "warning-only", "error"}
    assert {e["llama"] for e in entries} == {"enforces", "ignores", "degrades", "refuses"}
    for e in entries:
        assert set(e) <= {"description", "schema", "verdict", "findings", "llama", "probe"}
        # ok ⇔ the server enforces; refusal/degradation are always errors.
        assert (e["verdict"] == "ok") == (e["llama"] == "enforces")
        if e["llama"] in ("refuses", "degrades"):
            assert e["verdict"] == "error"


def test_corpus_is_shipped_as_data() -> None:
    assert (data_path("grammar", "corpus") / CORPUS[0].name).is_file()


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_entry(path: Path) -> None:
    entry = json.loads(path.read_text())
    got = check_subset(entry["schema"])
    assert verdict(got) == entry["verdict"]
    assert [{"path": v.path, "construct": v.construct, "severity": v.severity} for v in got] == entry["findings"]
    for v in got:
        assert v.message.startswith(v.path), v.message


def test_violation_is_a_frozen_dataclass() -> None:
    v = Violation("$", "not", "m", "error")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.path = "$.x"  # type: ignore[misc]
    assert str(v) == "m"


# ---------------------------------------------------------------------------- messages


def test_unsupported_construct_message_matches_the_reference_shape() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    [v] = check_subset(schema)
    assert v.message == '$.properties.a: unsupported construct "uniqueItems" is outside the llama.cpp grammar subset'
    assert (v.path, v.construct, v.severity) == ("$.properties.a", "uniqueItems", "error")


def test_any_of_beside_properties_message() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"type": "object"}]}
    [v] = check_subset(schema)
    assert v.message == '$: "anyOf" alongside sibling properties/type is outside the llama.cpp grammar subset'


def test_any_of_beside_other_keywords_names_them() -> None:
    [v] = check_subset({"required": ["a"], "minProperties": 1, "anyOf": [{"properties": {"a": {}}}]})
    assert v.construct == "anyOf"
    assert '"minProperties", "required"' in v.message


def test_unanchored_pattern_message_shape() -> None:
    [v] = check_subset({"type": "object", "properties": {"code": {"type": "string", "pattern": "[A-Z]+"}}})
    assert v.message.startswith('$.properties.code.pattern: "[A-Z]+" is not anchored (^...$)')
    assert (v.path, v.construct) == ("$.properties.code", "pattern")


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (r"^\d+$", r'uses "\d"'),
        (r"^\w+$", r'uses "\w"'),
        (r"^a\sb$", r'uses "\s"'),
        (r"^\bx\b$", r'uses "\b"'),
        (r"^[\d]$", r'uses "\d" inside [...]'),
        ("^(?=a)a$", "lookahead"),
        ("^(?!a)b$", "lookahead"),
        ("^(?<=a)b$", "lookbehind"),
        ("^(?<n>a)$", "named group"),
        ("^(?P<n>a)$", "named group"),
        ("^(?i)abc$", "inline flags"),
        ("^a$|^b$", 'uses "$" inside the pattern'),
        ("^a]$", 'stray "]"'),
    ],
)
def test_unsupported_patterns_say_why(pattern: str, needle: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None and needle in problem
    assert "accepts any string" in problem


@pytest.mark.parametrize(
    "pattern",
    [
        "^[A-Z]{3}-[0-9]{2}$",
        "^(yes|no)(?:-[a-z]+)?$",
        "^a+?b*$",
        r"^\.\*\[x\]$",
        r"^[\-a-z]{0,}$",
        r"^\x41\u00e9$",
        "^a{,3}$",
        "^$",
    ],
)
def test_supported_patterns(pattern: str) -> None:
    assert pattern_problem(pattern) is None


@pytest.mark.parametrize("pattern", ["^(ab$", "^ab)$", "^[ab$", "^*a$", "^a\\$"])
def test_invalid_patterns_fail_the_request(pattern: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None and "the request fails" in problem


def test_python_invalid_pattern_is_an_error_even_if_llama_reads_it() -> None:
    # llama.cpp scans "{2,1}" happily; Python's re (used by validation) rejects it.
    [v] = check_subset({"type": "string", "pattern": "^a{2,1}$"})
    assert v.construct == "pattern" and "not a valid regular expression" in v.message


def test_format_violation_load_time_shape() -> None:
    v = Violation(
        "$.properties.a",
        "uniqueItems",
        '$.properties.a: unsupported construct "uniqueItems" is outside the llama.cpp grammar subset',
    )
    assert format_violation(v, "agent.local", "schemas/decide.json") == (
        'agent "agent.local" is builtin.local_llm with grammar: true but its decide schema '
        '"schemas/decide.json" is outside the llama.cpp grammar subset: $.properties.a: unsupported construct '
        '"uniqueItems" is outside the llama.cpp grammar subset'
    )


def test_where_labels_messages_but_not_paths() -> None:
    [v] = check_subset({"not": {}}, where="s.json")
    assert v.path == "$"
    assert v.message.startswith('s.json: $: unsupported construct "not"')


# ---------------------------------------------------------------------------- order


def test_sibling_properties_are_visited_in_sorted_order() -> None:
    bad = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    names = ["zeta", "alpha", "mid", "Beta", "a b"]
    schema = {"type": "object", "properties": {n: bad for n in names}}
    paths = [v.path for v in check_subset(schema)]
    assert paths == [child_path("$.properties", n) for n in sorted(names)]
    assert paths[:2] == ["$.properties.Beta", '$.properties["a b"]']  # code point order
    # Same result whatever the insertion order.
    reordered = {"type": "object", "properties": {n: bad for n in reversed(names)}}
    assert check_subset(reordered) == check_subset(schema)


def test_order_is_depth_first_with_keys_sorted() -> None:
    schema = {
        "type": "object",
        "not": {},
        "properties": {"b": {"not": {}}, "a": {"if": {}}},
        "propertyNames": {"maxLength": 3},
    }
    assert findings(schema) == [
        ("$.properties.a", "if", "error"),
        ("$.properties.b", "not", "error"),
        ("$", "not", "error"),
        ("$", "propertyNames", "error"),
    ]


def test_paths_round_trip() -> None:
    path = child_path(child_path(child_path("$", "properties"), "a b"), 3)
    assert path == '$.properties["a b"][3]'
    assert parse_path(path) == ["properties", "a b", 3]
    assert parse_path("$.$defs.x-y") == ["$defs", "x-y"]


# ---------------------------------------------------------------------------- refs


def test_local_refs_are_followed_and_checked_at_the_target() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"$ref": "#/$defs/t"}},
        "$defs": {"t": {"type": "array", "uniqueItems": True}, "unused": {"not": {}}},
    }
    # Reported once, at the target; unreferenced $defs are never visited.
    assert findings(schema) == [("$.$defs.t", "uniqueItems", "error")]


def test_definitions_and_pointer_refs() -> None:
    schema = {
        "properties": {"a": {"$ref": "#/definitions/x"}, "b": {"$ref": "#/properties/a"}},
        "definitions": {"x": {"type": "string", "pattern": "\\d"}},
    }
    assert findings(schema) == [("$.definitions.x", "pattern", "error")]


def test_recursive_ref_through_structure_terminates_and_is_ok() -> None:
    schema = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
        },
    }
    assert check_subset(schema) == []


def test_left_recursive_refs_are_errors() -> None:
    direct = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    assert findings(direct) == [("$.$defs.a", "$ref", "error")]
    mutual = {
        "$defs": {
            "a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]},
            "b": {"oneOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]},
        },
        "$ref": "#/$defs/a",
    }
    got = check_subset(mutual)
    assert [(v.path, v.construct) for v in got if v.severity == "error"] == [("$.$defs.b.oneOf[0]", "$ref")]
    assert "left recursion" in got[-1].message


def test_cycle_through_structure_then_bare_is_still_found() -> None:
    # x reaches y through an array (fine) and bare (not fine); y comes back bare.
    schema = {
        "$ref": "#/$defs/x",
        "$defs": {
            "x": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/y"}}, {"$ref": "#/$defs/y"}]},
            "y": {"anyOf": [{"$ref": "#/$defs/x"}, {"type": "null"}]},
        },
    }
    assert any("left recursion" in v.message for v in check_subset(schema))


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("#", "the whole document"),
        ("https://example.com/a.json", 'only local "#/..." references'),
        ("other.json#/x", 'only local "#/..." references'),
        ("#/$defs/missing", "cannot be resolved"),
        ("#/$defs/a~1b", "cannot be resolved"),
        ("#anchor", 'only local "#/..." references'),
    ],
)
def test_bad_refs(ref: str, needle: str) -> None:
    schema = {"type": "object", "properties": {"p": {"$ref": ref}}, "$defs": {"a/b": {}}}
    [v] = check_subset(schema)
    assert (v.path, v.construct, v.severity) == ("$.properties.p", "$ref", "error")
    assert needle in v.message


def test_keywords_beside_ref_are_errors_but_annotations_and_defs_are_not() -> None:
    schema = {
        "$ref": "#/$defs/s",
        "$defs": {"s": {"type": "string"}},
        "description": "d",
        "title": "t",
        "maxLength": 3,
        "type": "string",
    }
    assert findings(schema) == [("$", "maxLength", "error")]  # "type" is implied by the target


# ---------------------------------------------------------------------------- constructs


def test_boolean_subschemas_are_errors_except_additional_properties() -> None:
    assert findings({"type": "array", "items": True}) == [("$.items", "boolean schema", "error")]
    assert findings({"type": "object", "properties": {"x": False}}) == [("$.properties.x", "boolean schema", "error")]
    assert findings(True) == [("$", "boolean schema", "error")]
    assert findings({"type": "object", "properties": {"x": {}}, "additionalProperties": False}) == []


@pytest.mark.parametrize("keyword", ["uniqueItems", "contains", "minContains", "unevaluatedItems"])
def test_array_keywords_outside_the_subset(keyword: str) -> None:
    value: Any = True if keyword == "uniqueItems" else 1 if keyword == "minContains" else {"type": "string"}
    # beside "items" (a schema) nothing is left for "unevaluatedItems": test it on a plain array
    base: dict[str, Any] = {"type": "array"} if keyword == "unevaluatedItems" else {"type": "array", "items": {}}
    assert findings({**base, keyword: value}) == [("$", keyword, "error")]


@pytest.mark.parametrize(
    "keyword",
    [
        "patternProperties",
        "propertyNames",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
        "unevaluatedProperties",
    ],
)
def test_object_keywords_outside_the_subset(keyword: str) -> None:
    value: Any = (
        {"a": ["b"]}
        if keyword in ("dependentRequired", "dependencies")
        else (
            False
            if keyword == "unevaluatedProperties"
            else {"a": {}}
            if keyword in ("patternProperties", "dependentSchemas")
            else {"maxLength": 3}
        )
    )
    # on an object closed on its "properties" every generated key is evaluated: nothing is
    # left for "unevaluatedProperties", so it is tested on an open object
    props: dict[str, Any] = {} if keyword == "unevaluatedProperties" else {"properties": {"a": {}, "b": {}}}
    if keyword == "dependencies":  # a draft-7 keyword (2020-12 validation ignores it)
        props["$schema"] = "http://json-schema.org/draft-07/schema#"
    assert findings({"type": "object", **props, keyword: value}) == [("$", keyword, "error")]


def test_if_then_else_is_one_finding_on_if() -> None:
    got = check_subset({"type": "object", "if": {}, "then": {}, "else": {}})
    assert [(v.path, v.construct) for v in got] == [("$", "if")]
    assert '"if"/"then"/"else"' in got[0].message


@pytest.mark.parametrize("keyword", ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"])
def test_number_bounds_are_warnings(keyword: str) -> None:
    assert findings({"type": "number", keyword: 1}) == [("$", keyword, "warning")]


def test_integer_bounds_are_enforced_except_multiple_of() -> None:
    assert findings({"type": "integer", "minimum": 0, "exclusiveMaximum": 10}) == []
    assert findings({"type": "integer", "multipleOf": 2}) == [("$", "multipleOf", "warning")]
    assert findings({"type": "integer", "minimum": 0, "exclusiveMinimum": 0}) == [("$", "exclusiveMinimum", "warning")]
    assert findings({"type": "integer", "exclusiveMinimum": True}) == [("$", "exclusiveMinimum", "error")]


def test_formats() -> None:
    for fmt in ("time", "uuid"):
        assert findings({"type": "string", "format": fmt}) == []
    for fmt in ("date", "date-time"):  # impossible dates are value-level
        assert findings({"type": "string", "format": fmt}) == [("$", "format", "warning")]
    assert findings({"type": "string", "format": "email"}) == [("$", "format", "warning")]
    assert findings({"format": "hostname"}) == [("$", "format", "warning")]
    assert findings({"type": "string", "format": "date", "maxLength": 4}) == [
        ("$", "maxLength", "error"),
        ("$", "format", "warning"),
    ]


def test_one_of_exclusivity_warning_unless_provably_disjoint() -> None:
    overlapping = {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}
    assert findings(overlapping) == [("$", "oneOf", "warning")]
    consts = {"oneOf": [{"const": "a"}, {"const": "b"}]}
    types = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    numeric = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    tagged = {
        "oneOf": [{"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]}, {"$ref": "#/$defs/y"}],
        "$defs": {"y": {"type": "object", "properties": {"k": {"enum": ["y", "z"]}}, "required": ["k"]}},
    }
    assert findings(consts) == [] and findings(types) == [] and findings(tagged) == []
    assert findings(numeric) == [("$", "oneOf", "warning")]


def test_any_of_beside_one_of() -> None:
    # llama.cpp takes oneOf and drops the anyOf beside it.
    assert findings({"oneOf": [{"type": "integer"}, {"type": "string"}], "anyOf": [{}]}) == [("$", "anyOf", "error")]


def test_min_max_properties_are_warnings() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "minProperties": 1, "maxProperties": 1}
    assert findings(schema) == [("$", "maxProperties", "warning"), ("$", "minProperties", "warning")]


def test_tuple_bounds() -> None:
    tup: dict[str, Any] = {"type": "array", "prefixItems": [{}, {}]}
    assert findings({**tup, "minItems": 1, "maxItems": 2}) == []
    assert findings({**tup, "minItems": 3}) == [("$", "minItems", "error")]
    assert findings({**tup, "maxItems": 1}) == [("$", "maxItems", "error")]
    assert findings({**tup, "items": {}}) == [("$", "prefixItems", "error")]


def test_required_must_name_listed_properties() -> None:
    assert findings({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]}) == [("$", "required", "error")]
    assert findings({"type": "object", "required": ["a"]}) == [("$", "required", "error")]
    assert findings({"type": "object", "properties": {"a": {}}, "required": []}) == []


def test_all_of_supported_shapes() -> None:
    objects = {
        "allOf": [{"type": "object", "properties": {"a": {}}}, {"$ref": "#/$defs/b"}],
        "$defs": {"b": {"properties": {"b": {"type": "integer"}}}},
        "required": ["a", "b"],
    }
    assert findings(objects) == []
    enums = {"allOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]}
    assert findings(enums) == []
    assert findings({"allOf": [{"enum": [1]}, {"enum": [2]}]}) == [("$", "allOf", "error")]


def test_all_of_unsupported_shapes() -> None:
    assert findings({"type": "string", "allOf": [{"minLength": 1}]}) == [("$", "allOf", "error")]
    assert findings({"type": "object", "properties": {"a": {}}, "allOf": [{"required": ["a"]}]}) == [
        ("$", "allOf", "error")
    ]
    assert findings({"allOf": [{"properties": {"a": {}}}, {"type": "string", "minLength": 1}]}) == [
        ("$.allOf[1]", "minLength", "error"),
        ("$.allOf[1]", "type", "error"),
    ]
    assert findings(
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]}
    ) == [("$.allOf[0]", "additionalProperties", "error")]
    assert findings({"allOf": [{"properties": {"a": {}}}], "required": ["z"]}) == [("$", "required", "error")]


def test_enum_and_const_win_over_siblings() -> None:
    assert findings({"type": "string", "enum": ["ab"], "maxLength": 2, "pattern": "\\d"}) == [("$", "enum", "error")]
    assert findings({"type": "string", "enum": ["ab", "cd"], "maxLength": 2}) == []
    assert findings({"type": ["string", "null"], "enum": ["a", None]}) == []
    assert findings({"const": 5, "type": "integer", "maximum": 3}) == [("$", "const", "error")]
    assert findings({"enum": []}) == [("$", "enum", "error")]


def test_irrelevant_and_neutral_keywords_are_not_findings() -> None:
    assert findings({"type": "string", "uniqueItems": True, "minimum": 1, "required": ["x"]}) == []
    assert findings({"type": "array", "items": {}, "uniqueItems": False, "minItems": 0}) == []
    assert findings({"type": "boolean", "maxLength": 3}) == []
    assert findings({}) == []
    assert findings({"title": "x", "x-extension": {"not": {}}}) == []


def test_typeless_schemas_follow_the_converters_order() -> None:
    # No type and no structural keyword: any value, so type-specific keywords are unenforced.
    assert findings({"minItems": 2}) == [("$", "minItems", "error")]
    assert findings({"minimum": 2}) == [("$", "minimum", "warning")]
    # properties picks an object; items an array; pattern a string.
    assert findings({"properties": {}, "minLength": 3}) == []
    assert findings({"items": {}, "maxItems": 1}) == []
    assert findings({"pattern": "^a$", "maxItems": 1}) == []


def test_invalid_values_the_server_rejects() -> None:
    assert findings({"type": "int"}) == [("$", "type", "error")]
    assert findings({"type": []}) == [("$", "type", "error")]
    assert findings({"type": "array", "minItems": -1}) == [("$", "minItems", "error")]
    assert findings({"type": "string", "maxLength": "3"}) == [("$", "maxLength", "error")]
    assert findings({"anyOf": []}) == [("$", "anyOf", "error")]
    assert findings({"type": "object", "properties": []}) == [("$", "properties", "error")]
    assert findings({"type": "object", "properties": {"a": 3}}) == [("$.properties.a", "schema", "error")]


def test_type_list_checks_each_type_once() -> None:
    schema = {"type": ["string", "null", "array"], "pattern": "\\d", "uniqueItems": True}
    assert findings(schema) == [("$", "pattern", "error"), ("$", "uniqueItems", "error")]


@pytest.mark.parametrize(
    ("bounds", "runaway"),
    [
        # measured on the pinned llama-server (its converter, then its grammar parser) in a child
        # under RLIMIT_AS: each of these allocated 4.3-5 GB within 15 s and grew on
        ({"minimum": 9_999_999_999_999_999}, "minimum"),  # [0-9]{16,15}
        ({"maximum": -(10**16)}, "maximum"),
        ({"minimum": 9_223_372_036_854_775_806}, "minimum"),
        ({"exclusiveMaximum": -9_223_372_036_854_775_805}, "exclusiveMaximum"),  # read as 2 - 2^63
        ({"minimum": 2**63, "maximum": 2**63 + 9}, "maximum"),  # both wrap: no minimum, a maximum near -2^63
        ({"minimum": 1 - 2**63, "maximum": -(2**62)}, "minimum"),  # negated: 2^63 - 1, no maximum
        ({"minimum": -(2**63), "maximum": -(2**62)}, "maximum"),  # -2^63: no minimum
        # a cast C++ leaves undefined: -2^63 on x86 (the bound lost), 2^63 - 1 on ARM (a minimum
        # alone of 19 digits: it would run away there)
        ({"minimum": 1e30}, "minimum"),
        # these the pinned server read and answered
        ({"minimum": 999_999_999_999_999}, None),
        ({"minimum": 10**17, "maximum": 10**18}, None),
        ({"minimum": 2 - 2**63, "maximum": 2**63 - 2}, None),
        ({"minimum": -(10**18), "maximum": 10**18}, None),
        ({"minimum": -(2**63), "maximum": 2**63 - 1}, None),  # an int64 in an API's schema: no bound
    ],
)
def test_integer_bounds_the_converter_runs_away_on_are_runaway_errors(
    bounds: dict[str, float], runaway: str | None
) -> None:
    found = check_subset({"type": "integer", **bounds})
    assert [v.construct for v in found if v.runaway] == ([runaway] if runaway else [])
    assert all(v.severity == "error" for v in found if v.runaway)
    if runaway is None:
        assert not [v for v in found if v.severity == "error"]


@pytest.mark.parametrize(
    ("bounds", "key"),
    [
        ({"minimum": 2**63 + 5}, "minimum"),
        ({"exclusiveMinimum": 2**63 - 1}, "exclusiveMinimum"),
        # JSONSchemaBench (Github_medium o83275, Github_hard o19187, Snowplow sp_17): the pinned
        # server answered "-" for each, under "minimum": 0
        ({"minimum": 0, "maximum": 18446744073709551615}, "maximum"),
        ({"minimum": 0, "maximum": 3.6893488147419103e19}, "maximum"),
        ({"minimum": 0, "maximum": 9223372036854776000}, "maximum"),
        ({"maximum": -1e30}, "maximum"),  # -2^63, negated to itself: the pinned server's 400
    ],
)
def test_an_integer_bound_read_as_another_is_an_error(bounds: dict[str, float], key: str) -> None:
    # 2^63 + 5 is stored unsigned and read as 5 - 2^63; 2^63 - 1 + 1 wraps to -2^63 (no minimum)
    found = [(v.construct, v.severity, v.runaway) for v in check_subset({"type": "integer", **bounds})]
    assert found == [(key, "error", False)]
