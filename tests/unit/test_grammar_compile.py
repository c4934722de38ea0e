"""The schema → GBNF compiler: exact on both corpora (random walks validate), refusals as data."""

from __future__ import annotations

import json
import random
from datetime import date
from typing import Any

import pytest

from localllm.grammar import compile as compile_module
from localllm.grammar.compile import CompiledGrammar, Refusal, compile_schema, integer_range
from localllm.grammar.pattern import search
from localllm.grammar.walk import Grammar, GrammarSyntaxError
from tests.conftest import in_child
from tests.unit.grammar_harness import Runaway, corpus, grammar_of, invalid_walks, realworld

WALKS = 200
CORPUS = list(corpus())
REALWORLD = list(realworld())


# ---------------------------------------------------------------------------- the harness


@pytest.mark.parametrize(("name", "schema"), CORPUS, ids=[n for n, _ in CORPUS])
def test_corpus_walks_are_all_valid(name: str, schema: Any) -> None:
    compiled = compile_schema(schema)
    if compiled.exact:
        assert invalid_walks(schema, compiled, WALKS) == []
    else:
        assert compiled.refusals and all(isinstance(r, Refusal) for r in compiled.refusals)


@pytest.mark.slow
def test_realworld_corpus_walks_are_all_valid_and_coverage_holds() -> None:
    assert len(REALWORLD) >= 300
    exact = 0
    bad: dict[str, list[str]] = {}
    for name, schema in REALWORLD:
        compiled = compile_schema(schema)
        if not compiled.exact:
            continue
        exact += 1
        invalid = invalid_walks(schema, compiled, WALKS)
        if invalid:
            bad[name] = invalid[:3]
    assert bad == {}
    # measured: 454 of 482 (94.2%; 93.4% before decimal multipleOf steps; 92.9% before pattern automata; 91.1% before multipleOf/unevaluated*/uniqueItems grew; 87.3% before open objects; 82.4% before not/if/oneOf); llama.cpp ~75%
    assert exact / len(REALWORLD) >= 0.85


def test_realworld_entries_carry_provenance() -> None:
    from tests.unit.grammar_harness import REALWORLD as path

    for line in path.read_text().splitlines():
        entry = json.loads(line)
        assert set(entry) == {"id", "source", "license", "schema"}
        assert entry["source"] and entry["license"]
    assert path.stat().st_size < 5_000_000


# ---------------------------------------------------------------------------- negative probes


@pytest.mark.parametrize(
    ("schema", "probe"),
    [
        ({"type": "object", "additionalProperties": True}, '{"\\q":1}'),
        ({"type": "object", "additionalProperties": True}, '{"\x01":1}'),
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": {}}, '{"\\q":1}'),
        ({"type": "string", "pattern": "^.+$"}, '"a"b"'),
        ({"type": "string", "pattern": "^[^a]+$"}, '"x\\y"'),
        ({"type": "string", "pattern": "^\\\\$"}, '"\\"'),
        ({"type": "string", "pattern": "^\\t$"}, '"\t"'),
        ({"type": "string"}, '"\\ud800"'),
        ({"type": "integer", "maximum": -5}, "-01"),
        ({"type": "integer", "maximum": -5}, "-4"),
        ({"type": "integer", "minimum": 100}, "19"),
        ({"type": "integer", "minimum": 1024}, "129"),
        ({"type": "integer", "maximum": -100}, "-19"),
        ({"type": "integer"}, "-0"),
        ({"type": "integer"}, "01"),
        ({"type": "string", "format": "date"}, '"0000-01-01"'),
        ({"type": "string", "format": "date"}, '"2023-02-31"'),
        ({"type": "string", "format": "date"}, '"2023-02-29"'),
        ({"type": "string", "format": "date"}, '"1900-02-29"'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{ "a":1}'),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            '{"a":1,"b":2}',
        ),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":1,"a":"x"}'),
    ],
)
def test_invalid_probes_are_rejected(schema: dict[str, Any], probe: str) -> None:
    assert not grammar_of(schema).matches(probe)


@pytest.mark.parametrize(
    ("schema", "probe"),
    [
        ({"type": "object", "additionalProperties": True}, '{"\\u00e9\\n":[1,{"b":null}]}'),
        ({"type": "string", "pattern": "^.+$"}, '"a\\"b"'),
        ({"type": "string", "format": "date"}, '"2024-02-29"'),
        ({"type": "string", "format": "date"}, '"2000-02-29"'),
        ({"type": "string", "format": "date-time"}, '"2024-02-29T23:59:59.5+05:30"'),
        ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a":-12}'),
    ],
)
def test_valid_probes_are_accepted(schema: dict[str, Any], probe: str) -> None:
    assert grammar_of(schema).matches(probe)


# ---------------------------------------------------------------------------- exact pieces


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (None, -5),
        (100, None),
        (1024, None),
        (None, -100),
        (-123, 42),
        (0, 23),
        (15, 300),
        (-10, 10),
        (7, 7),
        (-7, -7),
        (0, 0),
        (None, 0),
        (0, None),
        (-1, None),
        (None, None),
        (99, 1000),
        (-999, -100),
    ],
)
def test_integer_ranges_are_exact(lo: int | None, hi: int | None) -> None:
    g = Grammar.parse(f"root ::= {integer_range(lo, hi)}\n")
    for n in range(-1200, 1201):
        assert g.matches(str(n)) == ((lo is None or n >= lo) and (hi is None or n <= hi)), n
    assert not g.matches("-0")
    assert not g.matches("007")


def test_date_grammar_is_exact_over_every_month_and_day() -> None:
    g = grammar_of({"type": "string", "format": "date"})
    for year in (1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 9999):
        for month in range(0, 14):
            for day in range(0, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    date.fromisoformat(text)
                    valid = True
                except ValueError:
                    valid = False
                assert g.matches(json.dumps(text)) == valid, text


def test_number_bounds_allow_decimals_and_never_cross_a_bound() -> None:
    g = grammar_of({"type": "number", "minimum": 0, "exclusiveMaximum": 1})
    assert g.matches("0.5") and g.matches("0") and g.matches("0.999999")
    assert not g.matches("1") and not g.matches("1.0") and not g.matches("-0.5")


def test_compact_by_default_and_one_space_when_asked() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]}
    assert not grammar_of(schema).matches('{"a": [1, 2]}')
    spaced = grammar_of(schema, space=True)
    assert spaced.matches('{"a": [1, 2]}') and spaced.matches('{"a":[1,2]}')
    assert not spaced.matches('{"a":  [1]}') and not spaced.matches('{"a":\n[1]}')


def test_properties_in_any_order_each_once_required_always() -> None:
    g = grammar_of(
        {"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}}, "required": ["b"]}
    )
    assert g.matches('{"b":2}') and g.matches('{"a":1,"b":2,"c":3}') and g.matches('{"b":2,"c":3}')
    assert g.matches('{"b":2,"a":1}') and g.matches('{"c":3,"b":2,"a":1}')
    assert not g.matches('{"a":1}') and not g.matches("{}") and not g.matches('{"b":2,"b":2}')
    assert not g.matches('{"a":1,"b":2,"a":1}')


def test_min_properties_one_over_optional_properties() -> None:
    g = grammar_of({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "minProperties": 1})
    assert g.matches('{"a":1}') and g.matches('{"b":2}') and g.matches('{"a":1,"b":2}')
    assert not g.matches("{}")


def test_recursion_through_refs_is_a_rule() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/node",
    }
    g = grammar_of(schema)
    assert g.matches('{"kids":[{"kids":[]},{"kids":[{"kids":[]}]}]}')
    assert not g.matches('{"kids":[{}]}')


def test_disjoint_one_of_compiles_and_overlapping_one_of_is_refused() -> None:
    assert compile_schema({"oneOf": [{"type": "string"}, {"type": "integer"}]}).exact
    assert compile_schema(
        {
            "oneOf": [
                {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]},
            ]
        }
    ).exact
    untyped = {
        "oneOf": [
            {"properties": {"grant": {"enum": ["code"]}}, "required": ["grant"]},
            {"properties": {"grant": {"enum": ["token"]}}, "required": ["grant"]},
        ]
    }
    g = grammar_of(untyped)
    assert g.matches('{"grant":"code"}') and g.matches('{"grant":"token"}') and not g.matches("{}")
    # overlapping: each branch without the values of the others (strings of length >= 4 only)
    g = grammar_of({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})
    assert g.matches('"abcd"') and not g.matches('"abc"') and not g.matches("1")
    # overlapping, a branch a pattern: the other without the strings it finds
    g = grammar_of({"oneOf": [{"type": "string"}, {"type": "string", "pattern": "^[ab]"}]})
    assert g.matches('"c"') and g.matches('""') and not g.matches('"a"') and not g.matches('"bc"')
    # overlapping and a branch has no negation here (a pattern with an anchor inside): refused
    refused = compile_schema({"oneOf": [{"type": "string"}, {"type": "string", "pattern": "a(b|$)"}]})
    assert not refused.exact and refused.refusals[0].construct == "oneOf"


def test_enum_keeps_only_values_valid_against_the_whole_schema() -> None:
    g = grammar_of({"type": "string", "enum": ["a", "bb", 3], "maxLength": 1})
    assert g.matches('"a"') and not g.matches('"bb"') and not g.matches("3")


def test_enum_values_are_checked_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # jsonschema's enum compares a value with every member: each listed value checked against
    # the enum listing it, a oneOf branch's values against the other's enum, uniqueItems' domain
    # against its items' enum were n^2/2 comparisons (10,000 integers: 35 s of CPU, a 59 KB
    # schema; `localllm grammar compile` 66 s)
    import jsonschema._keywords

    real = jsonschema._keywords.equal
    compared = 0

    def counting(one: Any, two: Any) -> bool:
        nonlocal compared
        compared += 1
        return bool(real(one, two))

    monkeypatch.setattr(jsonschema._keywords, "equal", counting)
    n = 1000
    cases = [
        ({"enum": list(range(n)), "maximum": n - 2}, ["0", str(n - 2)], [str(n - 1), "1.0"]),
        ({"oneOf": [{"enum": [f"s{i}" for i in range(n)]}, {"enum": list(range(n))}]}, ['"s1"', "1"], ['"s"']),
        # (100: the test's grammar walker recurses once per value of the listed array)
        ({"type": "array", "items": {"enum": list(range(100))}, "uniqueItems": True}, ["[0,1]", "[]"], ["[0,0]"]),
        ({"enum": [1.0, True, [1]], "const": 1}, ["1"], ["true", "[1]"]),
    ]
    for schema, admits, rejects in cases:
        compared = 0
        grammar = grammar_of(schema)
        assert compared <= 100, schema
        assert [t for t in admits + rejects if grammar.matches(t)] == admits


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        # each repeat under the compiler's 1,000 cap, together a million characters: every
        # validator refuses the schema (past the linear matcher's 20,000 states), and the
        # compiler wrote "( [a]{1000} ){1000}" (`grammar check`: "enforced", exit 0)
        ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "$.pattern"),
        ({"type": "object", "patternProperties": {"^(a{200}){200}$": True}}, '$.patternProperties["^(a{200}){200}$"]'),
        ({"properties": {"x": {"not": {"pattern": "((a{100}){100}){100}"}}}}, "$.properties.x.not.pattern"),
    ],
)
def test_a_pattern_no_validator_can_check_is_refused(schema: Any, path: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [(r.construct, r.path) for r in compiled.refusals] == [("pattern", path)]


def test_all_of_is_merged() -> None:
    g = grammar_of(
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"a": {"minimum": 5}}},
            ]
        }
    )
    assert g.matches('{"a":5}') and not g.matches('{"a":4}')


@pytest.mark.parametrize(
    ("schema", "construct"),
    [
        ({"not": {"type": "string", "pattern": "a(b|$)"}}, "not"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "integer", "multipleOf": 33, "minimum": 5}, "multipleOf"),
        ({"$ref": "https://example.com/x.json"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "$ref"),
        ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}, "$ref"),
        ({"type": "string", "pattern": "^(?=a)a$"}, "pattern"),
        ({"type": "string", "pattern": "^(a)\\1$"}, "pattern"),
        ({"type": "string", "pattern": "^\\bx$"}, "pattern"),
        ({"type": "kaboom"}, "schema"),
        ({"const": 0, "minimum": None}, "schema"),
        ({"enum": ["a"], "type": {"required": "a"}}, "schema"),
        ({"if": {"type": "string", "format": "email"}, "then": {"minLength": 1}}, "if"),
        (False, "false"),
    ],
)
def test_refusals_name_the_construct(schema: Any, construct: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == [construct]
    assert compiled.refusals[0].message.startswith(compiled.refusals[0].path)


def test_deep_nesting_is_a_refusal_not_a_crash() -> None:
    schema: Any = {"type": "integer"}
    for _ in range(400):
        schema = {"type": "array", "items": schema}
    compiled = compile_schema(schema)
    assert compiled.grammar is None and compiled.refusals[0].construct == "depth"
    assert isinstance(compiled, CompiledGrammar)


def test_non_ascii_and_escaped_keys_survive() -> None:
    schema = {
        "type": "object",
        "properties": {'qu"o\\te': {"const": "é\n"}, "中": {"type": "null"}},
        "required": ['qu"o\\te', "中"],
    }
    g = grammar_of(schema)
    assert g.matches(json.dumps({'qu"o\\te': "é\n", "中": None}, ensure_ascii=False, separators=(",", ":")))


def test_walker_reads_llama_cpp_escapes() -> None:
    g = Grammar.parse('root ::= [a\\-z]+ "\\-" space\nspace ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n')
    assert g.matches("a-z-") and g.matches("z-\n\t ") and not g.matches("b-")


def test_walker_rejects_grammar_it_cannot_read() -> None:
    with pytest.raises(GrammarSyntaxError):
        Grammar.parse('root ::= "a" undefined\n')
    with pytest.raises(GrammarSyntaxError):
        Grammar.parse('root ::= "\\q"\n')


def test_walks_reach_both_ends_of_bounded_repeats() -> None:
    g = grammar_of({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3})
    rng = random.Random(3)
    lengths = {len(json.loads(g.sample(rng))) for _ in range(200)}
    assert lengths == {1, 2, 3}


def _widest_group(grammar: str) -> int:
    """The most alternatives any one group or rule body of ``grammar`` holds."""
    import re

    widths, widest = [1], 1
    for token in re.findall(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|::=|[()|]', grammar):
        if token in ("(", "::="):
            widths[-1:] = [widths[-1], 1] if token == "(" else [1]
        elif token == ")":
            widest = max(widest, widths.pop())
        elif token == "|":
            widths[-1] += 1
    return max(widest, *widths)


def test_a_long_enum_is_a_trie_of_few_live_alternatives() -> None:
    # llama.cpp checks every alternative live at a position against the whole vocabulary per
    # token: 3,000 values as 3,000 alternatives took 34.5 s for a 5-token answer, as a trie 0.41 s
    values = [f"v{i}" for i in range(10_000)] + [True, 3, None, 'é\\"', ""]
    grammar = compile_schema({"enum": values}).grammar
    assert grammar is not None and _widest_group(grammar) <= 12
    parsed = Grammar.parse(grammar)
    texts = [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]
    assert all(parsed.matches(t) for t in texts[::97] + texts[-5:])
    assert not any(parsed.matches(t) for t in ('"v"', '"v10000"', '"v01"', '"w"', "4", '"é"'))
    # at most TRIE_LITERALS values: the alternatives as they were
    few = compile_schema({"enum": [f"v{i}" for i in range(32)]}).grammar
    assert few is not None and _widest_group(few) == 32
    # values branching along one value more than TRIE_DEPTH times: flat too
    chain = compile_schema({"enum": ["a" * i for i in range(1, 41)]}).grammar
    assert chain is not None and _widest_group(chain) == 40


@pytest.mark.slow
def test_an_object_of_many_properties_compiles_in_linear_time() -> None:
    # each property probed rule names from 1 and copied every rule table, and each required
    # name rebuilt the set of declared ones: 16,000 properties took 21.5 s, 4x per doubling
    # (a service request could hold 500,000); 40,000 are ~6 s now, then refused for size
    refused = in_child(
        """
        import json
        from localllm.grammar.compile import compile_schema
        props = {f"p{i}": {"type": "integer"} for i in range(40_000)}
        compiled = compile_schema({"type": "object", "properties": props, "required": list(props)})
        print(json.dumps([r.construct for r in compiled.refusals]))
        """,
        timeout=60,
    )
    assert refused == ["size"]


@pytest.mark.parametrize(
    ("expr", "atom"),
    [
        # a "(" or ")" inside a literal or a class is a character, not a group: read as one,
        # two groups looked like one, and a repeat suffix would apply to the last only
        ('( "\\"((\\"" ) ( "x" )', False),
        ("( [(] ) ( a )", False),
        ('( "\\"((\\"" | "\\"(x\\"" )', True),
        ("( [)] x )", True),
        ("( a ( b ) )", True),
        ("( a ) ( b )", False),
        ('"(" ( x )', False),
        ("( a ) b", False),
        ("rule-name", True),
        ('"lit"', True),
    ],
)
def test_a_group_is_read_past_the_parentheses_inside_literals_and_classes(expr: str, atom: bool) -> None:
    assert compile_module._is_atom(expr) is atom


def test_a_value_is_validated_once_against_a_subschema_used_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # each use of a subschema merges it into a new object: its listed values were validated
    # again every time (o83932: 20,613 checks of 190 value and schema pairs, 30 % of 7 s)
    checked: list[Any] = []
    real = compile_module._Compiler.valid

    def valid(self: Any, schema: Any, value: Any, path: str, construct: str) -> bool:
        checked.append(value)
        return real(self, schema, value, path, construct)

    monkeypatch.setattr(compile_module._Compiler, "valid", valid)
    colours = {"enum": ["red", "green", "blue", "x"], "minLength": 3}
    schema = {
        "$defs": {"colour": colours},
        "type": "object",
        "properties": {f"p{i}": {"allOf": [{"$ref": "#/$defs/colour"}, {"type": "string"}]} for i in range(8)},
        "required": [f"p{i}" for i in range(8)],
        "additionalProperties": False,
    }
    grammar = Grammar.parse(compile_schema(schema).grammar or "")
    assert sorted(checked) == ["blue", "green", "red", "x"]
    answer = {f"p{i}": "red" for i in range(8)}
    assert grammar.matches(json.dumps(answer, separators=(",", ":")))
    assert not grammar.matches(json.dumps({**answer, "p7": "x"}, separators=(",", ":")))


@pytest.mark.parametrize(
    ("draft", "admitted"),
    [
        ("http://json-schema.org/draft-04/schema#", ["1"]),
        ("https://json-schema.org/draft/2020-12/schema", ["1.0", "1"]),
    ],
)
@pytest.mark.parametrize("first", [1.0, 1])
def test_kept_verdicts_tell_1_from_1_0(draft: str, admitted: list[str], first: float) -> None:
    # draft 4's integer is not 1.0: the verdict on one must not be taken for the other
    other = 1 if isinstance(first, float) else 1.0
    schema = {"$schema": draft, "anyOf": [{"enum": [first]}, {"enum": [other]}], "type": "integer"}
    grammar = Grammar.parse(compile_schema(schema).grammar or "")
    assert [text for text in ("1.0", "1") if grammar.matches(text)] == admitted


def test_merging_tells_true_from_1_where_python_does_not() -> None:
    # merging skips a keyword both components give alike; Python's == takes true for 1,
    # JSON does not: both keywords must stay
    compiled = compile_schema({"allOf": [{"not": {"const": True}}, {"not": {"const": 1}}]})
    grammar = Grammar.parse(compiled.grammar or "")
    assert [grammar.matches(t) for t in ("true", "1", "2", "false")] == [False, False, True, True]
    # a keyword the merge cannot combine is refused, not taken as given alike
    compiled = compile_schema({"allOf": [{"contains": {"const": True}}, {"contains": {"const": 1}}]})
    assert compiled.grammar is None and [r.construct for r in compiled.refusals] == ["contains"]
    assert compile_schema({"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 1.0}}]}).exact


def test_a_branch_left_out_as_unsatisfiable_leaves_no_note() -> None:
    # the branch's email was noted as generated narrowed, then the branch was dropped (a
    # required property no value meets): the note told of something the grammar does not hold
    schema = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"e": {"type": "string", "format": "email"}, "x": False},
                "required": ["e", "x"],
            },
            {"type": "object", "properties": {"e": {"type": "string", "format": "uri"}}},
        ]
    }
    compiled = compile_schema(schema)
    assert compiled.exact and [note.split(":")[0] for note in compiled.notes] == ["$[1].properties.e"]


def _levels(n: int, leaf: dict[str, Any]) -> dict[str, Any]:
    """``n`` levels of alternatives over the level below, each with a first branch that turns
    out to admit no value only after the level below is generated (a property false)."""
    defs: dict[str, Any] = {"d0": leaf}
    for i in range(n):
        below = {"$ref": f"#/$defs/d{i}"}
        defs[f"d{i + 1}"] = {
            "anyOf": [
                {"type": "object", "properties": {"x": below, "z": False}, "required": ["x", "z"]},
                {"type": "object", "properties": {"y": below}, "required": ["y"], "additionalProperties": False},
            ]
        }
    return {"$defs": defs, "$ref": f"#/$defs/d{n}"}


def test_a_ref_generated_in_a_branch_that_fails_is_not_generated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # each level's first branch generated the level below, then failed and dropped it; the
    # second generated it again: twice the work at every level (12 levels: 4,096 times, 3 s)
    entered: list[str] = []
    real = compile_module._Compiler.gen

    def gen(self: Any, node: Any, path: str, depth: int, bare: frozenset[str]) -> str:
        entered.append(path)
        if len(entered) > 100_000:
            raise Runaway
        return real(self, node, path, depth, bare)

    monkeypatch.setattr(compile_module._Compiler, "gen", gen)
    leaf = {"type": "object", "properties": {"e": {"type": "string", "format": "email"}}, "required": ["e"]}
    schema = _levels(12, leaf)
    compiled = compile_schema(schema)
    assert entered.count("$.$defs.d0") == 1 and entered.count("$.$defs.d11") == 1
    # the note of the level generated once is there once; the grammar holds what the schema does
    assert [note.split(":")[0] for note in compiled.notes] == ["$.$defs.d0.properties.e"]
    assert invalid_walks(schema, compiled, 100) == []
    grammar = Grammar.parse(compiled.grammar or "")
    value: Any = {"e": "a@b.c"}
    for _ in range(12):
        value = {"y": value}
    assert grammar.matches(json.dumps(value, separators=(",", ":")))
    assert not grammar.matches(json.dumps({"x": value["y"], "z": 1}, separators=(",", ":")))


def test_a_ref_kept_through_a_failed_branch_and_used_nowhere_else_leaves_no_rule_or_note() -> None:
    leaf = {"type": "object", "properties": {"e": {"type": "string", "format": "email"}}, "required": ["e"]}
    schema = {
        "$defs": {"leaf": leaf},
        "anyOf": [
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/leaf"}, "z": False}, "required": ["x", "z"]},
            {"type": "string", "maxLength": 3},
        ],
    }
    compiled = compile_schema(schema)
    assert compiled.grammar is not None and compiled.notes == []
    assert [line.split(" ::= ")[0] for line in compiled.grammar.splitlines() if "leaf" in line] == []
    assert invalid_walks(schema, compiled, 50) == []


@pytest.mark.parametrize("open_objects", [True, False])
def test_a_kept_ref_that_an_unused_rule_names_is_still_defined(open_objects: bool) -> None:
    # "d" is generated in the failed branch of its dependentRequired rewrite (p1 absent, yet
    # required) and kept; the branch that stands makes p3's rule (maxProperties 1 then leaves
    # p3 out, so nothing uses it) with the kept ref-d: leaving ref-d out for being unreachable
    # left "undefined rule ref-d", which llama.cpp refuses the whole grammar for
    schema = {
        "$defs": {
            "d": {},
            "o": {
                "properties": {"p3": {"$ref": "#/$defs/d"}},
                "required": ["p1"],
                "maxProperties": 1,
                "dependentRequired": {"p1": []},
            },
        },
        "properties": {"p4": {"$ref": "#/$defs/o"}},
    }
    compiled = compile_schema(schema, open_objects=open_objects)
    assert compiled.grammar is not None, compiled.refusals
    grammar = Grammar.parse(compiled.grammar)  # every name defined
    assert grammar.matches('{"p4":{"p1":1}}') and not grammar.matches('{"p4":{"p3":1}}')
    assert invalid_walks(schema, compiled, 50) == []


def test_a_ref_that_reaches_one_still_being_generated_is_not_kept() -> None:
    # "node" fails after its property generated "pair", whose rule names node's: node's rule
    # is dropped, so pair's must go too, and the second branch generates it again
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/pair"}, "z": False},
                "required": ["p", "z"],
            },
            "pair": {"type": "array", "prefixItems": [{"$ref": "#/$defs/node"}, {"type": "integer"}], "items": False},
        },
        "anyOf": [{"$ref": "#/$defs/node"}, {"$ref": "#/$defs/pair"}],
    }
    compiled = compile_schema(schema)
    assert compiled.exact
    assert invalid_walks(schema, compiled, 50) == []
    grammar = Grammar.parse(compiled.grammar or "")
    assert [text for text in ("[]", "[{}]", '[{"p":[]}]', "1") if grammar.matches(text)] == ["[]"]


def _merged_levels(n: int) -> dict[str, Any]:
    """``n`` levels of two alternatives, each merging the level below (an allOf with its ref)
    with one more constraint: the merged subschemas double at every level."""
    defs: dict[str, Any] = {"d0": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5)}}}
    for i in range(n):
        below = {"$ref": f"#/$defs/d{i}"}
        defs[f"d{i + 1}"] = {
            "anyOf": [
                {"allOf": [below, {"required": [f"p{i % 5}"]}]},
                {"allOf": [below, {"properties": {f"p{(i + 1) % 5}": {"maxLength": 9}}}]},
            ]
        }
    return {"$defs": defs, "$ref": f"#/$defs/d{n}"}


def test_a_compile_past_its_work_budget_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # 14 such levels (3 KB) took 10 s, 20 levels hours: the budget stops them at a few seconds
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", 50_000, raising=False)
    generated = [0]
    real = compile_module._Compiler.gen

    def gen(self: Any, node: Any, path: str, depth: int, bare: frozenset[str]) -> str:
        generated[0] += 1
        if generated[0] > 100_000:
            raise Runaway
        return real(self, node, path, depth, bare)

    monkeypatch.setattr(compile_module._Compiler, "gen", gen)
    compiled = compile_schema(_merged_levels(20))
    assert compiled.grammar is None and [r.construct for r in compiled.refusals] == ["size"]
    assert compiled.refusals[0].path.startswith("$.$defs.d20[")
    assert generated[0] < 10_000
    # a schema that needs the whole budget compiles (exactly), one step less refuses it
    spent = [0]
    spend = compile_module._Compiler.spend

    def counted(self: Any, work: int, path: str) -> None:
        spent[0] += work
        spend(self, work, path)

    monkeypatch.setattr(compile_module._Compiler, "spend", counted)
    small = _merged_levels(5)
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", 10**9)
    compile_schema(small)
    needed = spent[0]
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", needed)
    assert invalid_walks(small, compile_schema(small), 50) == []
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", needed - 1)
    assert [r.construct for r in compile_schema(small).refusals] == ["size"]


def test_a_budget_run_out_where_a_refusal_is_caught_still_refuses_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    # an extension pair whose value is refused is left out (the object generated closed):
    # the budget running out there left a grammar without the "^a" keys, and no word of it
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", 50_000, raising=False)
    levels = _merged_levels(20)
    schema = {
        "$defs": levels["$defs"],
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "patternProperties": {"^a": levels},
        "additionalProperties": False,
    }
    compiled = compile_schema(schema)
    assert compiled.grammar is None and [r.construct for r in compiled.refusals] == ["size"]


def test_alternatives_written_out_for_their_trials_are_steps_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # an allOf of two anyOfs whose products mostly contradict each other, merged into each
    # property: every property wrote all 144 products out again to look up their kept trial
    # verdicts, uncounted (300 properties of 16-branch anyOfs: 16 s within the steps)
    def branch(i: int, tag: str) -> dict[str, Any]:
        names = {f"{tag}{i}_{j}": {"type": "string", "maxLength": j + 1} for j in range(4)}
        return {"type": "object", "properties": {"t": {"const": i}, **names}, "required": ["t"]}

    pair = {"allOf": [{"anyOf": [branch(i, "a") for i in range(12)]}, {"anyOf": [branch(i, "b") for i in range(12)]}]}
    schema = {
        "$defs": {"pair": pair},
        "type": "object",
        "properties": {f"p{j}": {"allOf": [{"$ref": "#/$defs/pair"}, {"minProperties": 1 + j % 3}]} for j in range(20)},
    }
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", 200_000, raising=False)
    assert compile_schema(schema).exact
    # the subschemas generated and merged take ~38,000 steps; the products written out ~47,000 more
    monkeypatch.setattr(compile_module, "MAX_COMPILE_WORK", 60_000)
    assert [r.construct for r in compile_schema(schema).refusals] == ["size"]


def test_one_of_branches_sharing_schemas_are_told_apart_once_per_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    # each level's object requires "p" and "q" of the level below: read as a tree, the pair of
    # branches was compared ~4^n times (10 levels, 2.6 KB: 26 s)
    defs: dict[str, Any] = {"x0": {"type": "object"}, "y0": {"type": "object"}}
    for i in range(10):
        for k in "xy":
            below = {"$ref": f"#/$defs/{k}{i}"}
            defs[f"{k}{i + 1}"] = {"type": "object", "properties": {"p": below, "q": below}, "required": ["p", "q"]}
    schema = {"$defs": defs, "oneOf": [{"$ref": "#/$defs/x10"}, {"$ref": "#/$defs/y10"}]}
    compared = [0]
    real = compile_module._Compiler.excludes

    def excludes(self: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> bool:
        compared[0] += 1
        if compared[0] > 10_000:
            raise Runaway
        return real(self, a, b, *args, **kwargs)

    monkeypatch.setattr(compile_module._Compiler, "excludes", excludes)
    compile_schema(schema)
    assert compared[0] <= 100  # 11 pairs, each asked again for its other property and direction


def test_a_pair_of_recursive_branches_met_again_is_not_proven_apart() -> None:
    # deciding a against b met a against b again (through a's "p" and b2's "q"): the
    # recursion ran to Python's limit and the whole schema was refused as nesting too deeply
    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"#/$defs/{name}"}

    schema = {
        "$defs": {
            "a": {"type": "object", "properties": {"p": ref("a2"), "k": {"const": 1}}, "required": ["p"]},
            "a2": {"type": "object", "properties": {"q": ref("a")}},
            "b": {"type": "object", "properties": {"p": ref("b2"), "k": {"const": 2}}},
            "b2": {"type": "object", "properties": {"q": ref("b")}, "required": ["q"]},
        },
        "oneOf": [ref("a"), ref("b")],
    }
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 100) == []
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('{"p":{}}') and grammar.matches('{"k":2}') and not grammar.matches('{"p":{},"k":2}')


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


# a ref met again where no input was consumed, but as a conjunct of what is being generated
# (it cannot reach itself in place): refused as left recursion before, though the schema is
# no recursion at all
_CONJUNCTS = [
    # JSON Schema Store's devinit: the same ref under allOf and anyOf of one subschema
    (
        {
            "$defs": {
                "run": {"type": "object", "properties": {"tool": {"enum": ["npm", "apt"]}}, "required": ["tool"]}
            },
            "type": "array",
            "items": {"allOf": [_ref("run")], "anyOf": [_ref("run")]},
        },
        ['[{"tool":"npm"}]', "[]"],
        ['[{"tool":"pip"}]', "[{}]"],
    ),
    # an allOf of a ref and an "if" whose "then" names it again
    (
        {
            "$defs": {"s": {"type": "string", "maxLength": 3}, "c": {"if": {"minimum": 3}, "then": _ref("s")}},
            "allOf": [_ref("c"), _ref("s")],
        },
        ['"abc"', '""'],
        ['"abcd"', "7"],
    ),
    # an anyOf branch naming the ref its sibling allOf merged; the ref recursive only
    # through what consumes input (CWL's CwlType: an array of CwlType)
    (
        {
            "$defs": {"t": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "array", "items": _ref("t")}]}},
            "allOf": [_ref("t"), {"anyOf": [_ref("t"), {"type": "null"}]}],
        },
        ['"ab"', '[["a"],[]]'],
        ["null", '[["abc"]]', "1"],
    ),
]


@pytest.mark.parametrize(("schema", "valid", "invalid"), _CONJUNCTS)
def test_a_ref_met_again_as_a_conjunct_is_generated_again(schema: Any, valid: list[str], invalid: list[str]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    grammar = Grammar.parse(compiled.grammar)
    assert [text for text in valid if not grammar.matches(text)] == []
    assert [text for text in invalid if grammar.matches(text)] == []
    assert invalid_walks(schema, compiled, 200) == []


@pytest.mark.parametrize(
    "schema",
    [
        # the ref reaches itself in place: through another ref, an allOf, an if's then
        {"$defs": {"a": {"anyOf": [_ref("b"), {"type": "null"}]}, "b": {"allOf": [_ref("a")]}}, "$ref": "#/$defs/a"},
        {"$defs": {"a": {"allOf": [{"if": {"type": "string"}, "then": _ref("a")}, {"maxLength": 2}]}}, **_ref("a")},
        # through structure to another ref, then in place back
        {
            "$defs": {
                "x": {"anyOf": [{"type": "array", "items": _ref("y")}, _ref("y")]},
                "y": {"anyOf": [_ref("x"), {"type": "null"}]},
            },
            "allOf": [_ref("x"), {"anyOf": [_ref("x"), {"type": "null"}]}],
        },
    ],
)
def test_a_ref_that_reaches_itself_in_place_is_still_left_recursion(schema: Any) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == ["$ref"]


def test_a_ref_generated_again_as_a_conjunct_keeps_one_rule_for_every_use() -> None:
    # r's rule is first made where "a" is also required (a conjunct met again inside r); used
    # under "other" where nothing else applies, it must still require all r requires
    schema = {
        "$defs": {
            "need_a": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            "r": {"allOf": [_ref("need_a"), {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
        },
        "type": "object",
        "properties": {
            "first": {"allOf": [_ref("need_a"), {"anyOf": [_ref("r"), {"required": ["c"]}]}]},
            "other": _ref("r"),
        },
    }
    compiled = compile_schema(schema, open_objects=False)
    assert compiled.grammar is not None, compiled.refusals
    grammar = Grammar.parse(compiled.grammar)
    assert grammar.matches('{"other":{"a":1,"b":2}}')
    assert not grammar.matches('{"other":{"b":2}}') and not grammar.matches('{"first":{"b":2}}')
    assert invalid_walks(schema, compiled, 200) == []


# ---------------------------------------------------------------------------- llama.cpp's repeat limit


@pytest.mark.parametrize(
    ("body", "seen", "refused"),
    [
        # the group makes itself, 99 + 99 repeat rules: 199 × 11 is past 2,000; × 10 is not
        ("( class{1,100} class-2{1,100} ){0,11} class{1,100}", {"class", "class-2"}, (0, 31)),
        ("( class{1,100} class-2{1,100} ){0,10} class{1,100}", {"class", "class-2"}, None),
        # a name first met in the group makes a rule too: 2 × 999 is under, 3 × 999 past
        ("( COMMA value ){0,999}", set(), None),
        ('"[" ( COMMA item other ){0,999} "]"', set(), (4, 24)),
        ('"[" ( COMMA item other ){0,999} "]"', {"item", "other"}, None),
        # the least count when unbounded; a repeated name or class makes no rule in itself
        ("( [a-z]{1,10} [-] ){300,}", set(), (0, 19)),
        ("x{0,1000} [a]{0,1000}", set(), None),
    ],
)
def test_llamas_repeat_limit_is_counted_as_its_parser_counts(
    body: str, seen: set[str], refused: tuple[int, int] | None
) -> None:
    assert compile_module._llama_refused_group(body, seen) == refused


def test_a_group_repeated_past_llamas_limit_is_made_a_rule_of_its_own() -> None:
    # "( [a-z]{1,10} [-] ){0,300}": 10 rules × 300, and the pinned llama-server refused the
    # whole grammar ("failed to parse grammar"); now the group is a rule, repeated by name
    schema = {"type": "string", "pattern": "^(?:[a-z]{1,10}-){0,300}$"}
    compiled = compile_schema(schema)
    assert compiled.exact and compiled.grammar is not None
    rules = dict(line.split(" ::= ", 1) for line in compiled.grammar.splitlines())
    assert rules["group"] == "[a-z]{1,10} [\\x2D]" and "group{0,300}" in rules["root"] + rules.get("pattern", "")
    seen: set[str] = set()
    for name, body in rules.items():  # as llama.cpp reads them, in order
        seen.add(name)
        assert compile_module._llama_refused_group(body, seen) is None, name
        seen.update(compile_module._gbnf_names(body))
    g = Grammar.parse(compiled.grammar)
    assert g.matches(json.dumps("abcdefghij-" * 300)) and g.matches('""')
    assert not g.matches(json.dumps("a-" * 301)) and not g.matches(json.dumps("abcdefghijk-"))
    assert invalid_walks(schema, compiled, 100) == []


@pytest.mark.parametrize(
    ("pattern", "repeated"),
    [
        # JSONSchemaBench o62947's id: an alternative that is empty, repeated without end
        ("^\\w+(|\\.[\\w,]+)*$", "( [\\x2E] [\\x2C0-9A-Z\\x5Fa-z]+ )*"),
        ("^(a?b?)+$", "( [a] | [b] )*"),
        ("^(?:x{0,3}|y){2,}$", "( [x] | [y] )*"),
        ("^(a|)*c$", "[a]*"),
    ],
)
def test_an_endless_repeat_of_what_may_be_empty_repeats_its_non_empty_part(pattern: str, repeated: str) -> None:
    # "X' ::= X X' |" with X nullable is a left recursion: the pinned llama-server refused
    # the whole grammar ("left recursion detected"); the same strings, without it
    compiled = compile_schema({"type": "string", "pattern": pattern})
    assert compiled.exact and compiled.grammar is not None and repeated in compiled.grammar
    g = Grammar.parse(compiled.grammar)
    rng = random.Random(pattern)
    for _ in range(400):
        text = "".join(rng.choice("abcxy.,_") for _ in range(rng.randint(0, 8)))
        assert g.matches(json.dumps(text)) == bool(search(pattern, text)), text


@pytest.mark.parametrize("space", [False, True])
def test_literals_holding_the_separators_placeholder_names_are_kept(space: bool) -> None:
    # the compiler writes "COMMA" and "COLON" for the separators until the grammar is done:
    # JSON Schema Store's jreleaser enum "COMMAND" became "\"","ND\"" (llama-server refused
    # the grammar; our interpreter could not parse it)
    schema = {
        "type": "object",
        "properties": {
            "mode": {"enum": ["COMMAND", "COLONEL", "SEMICOLON", "COMMA"]},
            "COLON": {"const": "COMMAS"},
        },
        "required": ["mode", "COLON"],
        "additionalProperties": False,
    }
    compiled = compile_schema(schema, space=space)
    assert compiled.exact and compiled.grammar is not None
    assert '"\\"\\x43OMMAND\\""' in compiled.grammar and '"\\"\\x43OLON\\""' in compiled.grammar  # "C" escaped
    g = Grammar.parse(compiled.grammar)
    for mode in ("COMMAND", "COLONEL", "SEMICOLON", "COMMA"):
        assert g.matches(json.dumps({"mode": mode, "COLON": "COMMAS"}, separators=(",", ":"))), mode
    assert not g.matches('{"mode":"COMMAN","COLON":"COMMAS"}')
    assert invalid_walks(schema, compiled, 100) == []


def test_overlapping_pattern_properties_are_those_whose_prefixes_do_not_diverge() -> None:
    """The patterns a name may match along with each one, read by prefix: the same as pair by
    pair (two anchored patterns whose literal prefixes diverge match no name together)."""
    rng = random.Random(3)
    parts = ["^", "^a", "^ab", "^b", "a", "^a|b", "^a*", "^ab?", "^[a]", "^abc$", "^a\\.", ""]

    def pairwise(patterns: list[str]) -> list[list[int]]:
        prefixes = [compile_module._literal_prefix(p) for p in patterns]

        def overlap(a: str | None, b: str | None) -> bool:
            return a is None or b is None or a[: len(b)] == b[: len(a)]

        return [[j for j, q in enumerate(prefixes) if j != i and overlap(p, q)] for i, p in enumerate(prefixes)]

    for _ in range(500):
        patterns = list(dict.fromkeys(rng.choice(parts) + rng.choice(["", "x", "xy", "b"]) for _ in range(8)))
        assert compile_module._overlapping(patterns) == pairwise(patterns), patterns


def test_thousands_of_pattern_properties_compile_in_seconds() -> None:
    """Each pattern was compared with each other (and its prefix read again each time): 3,000
    took 11.6 s, 6,000 (190 KB, within a request's 256 KiB) ~50 s holding the GIL."""
    grammar = in_child(
        """
        import json
        from localllm.grammar.compile import compile_schema
        patterns = {f"^k{i}$": {"type": "integer"} for i in range(6_000)}
        compiled = compile_schema({"type": "object", "patternProperties": patterns, "additionalProperties": False})
        print(json.dumps(compiled.grammar))
        """,
        timeout=30,
    )
    assert grammar is not None
    parsed = Grammar.parse(grammar)
    assert parsed.matches('{"k5999":1,"k1":2}') and not parsed.matches('{"k6000":1}')


def test_schemas_past_the_branch_and_pattern_caps_are_refused_before_the_costly_work() -> None:
    """A oneOf past 64 alternatives was refused only after proving each pair of its branches
    disjoint (1,000 consts, 18 KB: 17 s); a string's joined patterns were parsed whole at each
    join (400 under not/anyOf, 7 KB: 17 s)."""
    refused = in_child(
        """
        import json
        from localllm.grammar.compile import compile_schema
        schemas = [
            {"oneOf": [{"const": f"c{i}"} for i in range(2_000)]},
            {"type": "string", "not": {"anyOf": [{"pattern": f"^x{i}"} for i in range(600)]}},
        ]
        out = []
        for schema in schemas:
            compiled = compile_schema(schema)
            out.append([compiled.grammar, [(r.path, r.construct) for r in compiled.refusals]])
        print(json.dumps(out))
        """,
        timeout=20,
    )
    assert refused == [[None, [["$", "oneOf"]]], [None, [["$", "pattern"]]]]
    joined = compile_schema({"type": "string", "not": {"anyOf": [{"pattern": f"^x{i}"} for i in range(20)]}})
    assert joined.grammar is not None
    assert Grammar.parse(joined.grammar).matches('"y0"') and not Grammar.parse(joined.grammar).matches('"x19z"')


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 1e308, "maximum": 7},
        {"type": "number", "minimum": 10**400, "maximum": 7},
        {"type": "integer", "minimum": -7, "exclusiveMaximum": -(10**40)},
        {"type": "number", "exclusiveMinimum": 10**40, "maximum": 10**40},
    ],
)
def test_bounds_no_value_meets_are_unsatisfiable_whatever_their_size(schema: dict[str, Any]) -> None:
    # a bound too large to compile was refused first ("bound too large"): the schema read as one
    # the compiler cannot express rather than one no value meets, so the service sent a strict
    # request to llama.cpp's converter (which admitted 7: a 502) instead of its 400
    compiled = compile_schema(schema)
    assert compiled.unsatisfiable and [r.construct for r in compiled.refusals] == ["minimum"]
