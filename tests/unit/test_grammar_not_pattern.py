"""``not`` of a simple pattern: literal searches (plain characters, escaped punctuation),
each optionally anchored with ``^``/``$``, joined by ``|``, are negated into "strings none of
them finds" — the automaton of partial matches as a regex (Python's ``$`` also before a final
newline), with a minLength beside it counted in the automaton. Other patterns (classes,
groups, repeats) are complemented as automata (Python's ``$`` read exactly); those with
Unicode classes (read as their ASCII part) stay refused under ``not``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, validator


@pytest.mark.parametrize(
    "pattern", ["//", "ab", "aab", "abab", re.escape("a.b"), "http:", ",,|^,|,$", "^ab", "ab$", "a|b$|^ba"]
)
@pytest.mark.parametrize("min_length", [0, 1, 2])
def test_not_of_a_literal_search_compiles_exactly(pattern: str, min_length: int) -> None:
    schema = {"type": "string", "minLength": min_length, "not": {"pattern": pattern}}
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 200) == []
    g = grammar_of(schema)
    check = validator(schema)
    alphabet = [*sorted(set(pattern) - set("^$|\\")), "x"]
    for n in range(6):
        for chars in itertools.product(alphabet, repeat=n):
            for value in ("".join(chars), "".join(chars) + "\n"):
                text = json.dumps(value)
                assert g.matches(text) == check.is_valid(value), text


def test_bench_madness_expose_extensions() -> None:
    # JsonSchemaStore madness: comma-separated extensions, no empty one, or null
    schema = {"oneOf": [{"type": "string", "not": {"pattern": ",,|^,|,$"}}, {"type": "null"}]}
    g = grammar_of(schema)
    assert g.matches('"pdf,docx,xlsx,txt"') and g.matches('"pdf"') and g.matches('""')
    assert not g.matches('"pdf,,docx"') and not g.matches('",pdf"') and not g.matches('"pdf,"')
    assert g.matches('"pdf,\\n"')  # ECMA-262's $ is the very end: it ends in a newline, not a comma


def test_bench_madness_base_uri() -> None:
    # JsonSchemaStore madness: base_uri is a non-empty string without "//", or null
    schema = {"oneOf": [{"type": "string", "minLength": 1, "not": {"pattern": "//"}}, {"type": "null"}]}
    g = grammar_of(schema)
    assert g.matches('"/my-site"') and g.matches('"/"') and g.matches("null")
    assert not g.matches('"https://example.com"') and not g.matches('""') and not g.matches('"a//"')


#: strings around the patterns below: letters, digits (a Unicode one too), newlines, non-ASCII
_AROUND = sorted({"".join(p) for n in range(4) for p in itertools.product(["a", "b", "1", "\n", "é", "٣"], repeat=n)})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "not": {"pattern": "[ab]"}},
        {"type": "string", "not": {"pattern": "a+b"}},
        {"type": "string", "not": {"pattern": "(a|b)1"}},
        {"type": "string", "not": {"pattern": "^a.*"}},
        {"type": "string", "not": {"pattern": "a{2}"}},
        {"type": "string", "not": {"pattern": "^[a-b]*$"}},
        {"type": "string", "not": {"pattern": "^[a-b]*\\Z"}},
        {"type": "string", "not": {"pattern": "[^a]$"}},
        {"type": "string", "minLength": 1, "maxLength": 2, "not": {"pattern": "^(ab)+$"}},
        {"type": "string", "pattern": "^[a-z0-9]*\\Z", "not": {"pattern": "(1|a)b"}},
        {"not": {"pattern": "^[ab1]+$"}},
        {"type": "string", "allOf": [{"not": {"pattern": "^a"}}, {"not": {"pattern": "b$"}}]},
        # refused before: read as re reads them, their complement needed Unicode's digits and
        # word characters, or a final newline for one of $ and \Z; ECMA-262's are exact
        {"type": "string", "not": {"pattern": "\\d"}},
        {"type": "string", "not": {"pattern": "^\\w+$"}},
        {"type": "string", "not": {"pattern": "[^\\s]"}},
        {"type": "string", "not": {"pattern": "\\D"}},
        {"type": "string", "not": {"pattern": "^a$|^b\\Z"}},
    ],
)
def test_not_of_other_patterns_admits_exactly_the_strings_it_finds_nothing_in(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 200) == []
    g = grammar_of(schema)
    check = validator(schema)
    # raw non-ASCII: the grammar writes characters, not their \u escapes
    texts = [json.dumps(t, ensure_ascii=False) for t in _AROUND]
    assert [t for t in texts if g.matches(t)] == [t for t in texts if check.is_valid(json.loads(t))]
