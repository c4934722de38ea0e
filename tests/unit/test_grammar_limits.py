"""A client's GBNF is bounded before a shared llama-server parses it (localllm.grammar.limits);
tests/e2e/test_service_front_e2e.py sends the crashing one and one at every limit to the real server."""

from __future__ import annotations

import pytest

from localllm.grammar.limits import (
    MAX_ALTERNATIVES,
    MAX_GRAMMAR_BYTES,
    MAX_NESTING,
    MAX_RULES,
    MAX_SKIPS,
    grammar_problem,
    skips_in_a_row,
)


def _nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth + "\n"


def _alternatives(bars: int) -> str:
    return "root ::= " + " | ".join(f'"a{i}"' for i in range(bars + 1)) + "\n"


def _rules(count: int) -> str:
    return "".join(f"r{i}::=r{i + 1}\n" for i in range(count - 1)) + f'r{count - 1}::="a"\n'


@pytest.mark.parametrize(
    ("make", "limit", "word"),
    [(_nested, MAX_NESTING, "deep"), (_alternatives, MAX_ALTERNATIVES, "alternatives"), (_rules, MAX_RULES, "rules")],
)
def test_each_limit_admits_itself_and_refuses_one_more(make: object, limit: int, word: str) -> None:
    assert callable(make)
    assert grammar_problem(make(limit)) is None
    problem = grammar_problem(make(limit + 1))
    assert problem is not None and word in problem and f"{limit + 1:,}" in problem


def test_literals_classes_and_comments_count_for_nothing() -> None:
    quiet = 'root ::= "(((|||" [(|)] "\\"(((" # ((( ||| ::=\n' * 200
    assert grammar_problem(quiet) is None
    assert grammar_problem(quiet + _nested(MAX_NESTING + 1)) is not None


def test_size_and_type() -> None:
    assert grammar_problem('root ::= "a"' + " " * MAX_GRAMMAR_BYTES) == (
        f"is {MAX_GRAMMAR_BYTES + 12:,} bytes: at most {MAX_GRAMMAR_BYTES:,}"
    )
    assert grammar_problem(5) == "must be a string of GBNF"
    assert grammar_problem('root ::= "\ud800"') is None  # a lone surrogate is llama-server's to refuse


@pytest.mark.parametrize(
    "repeat",
    [
        '"a"{1,0}',
        '"a"{ 5 , 1 }',
        "[0-9]{16,15}",
        '("a" # one\n {10, # the most\n 9})',
        '"a"{100,0099}',
        '"a"{' + "9" * 5000 + ",1}",
    ],
)
def test_a_repeat_whose_minimum_passes_its_maximum_is_refused(repeat: str) -> None:
    # on the pinned llama-server "a"{1,0} took 3.5 GB in 10 s and grew on (measured in a child
    # under RLIMIT_AS): its parser never ends such a repeat
    problem = grammar_problem(f"root ::= {repeat}\n")
    assert problem is not None and "minimum passes the maximum" in problem


@pytest.mark.parametrize(
    "fine", ['"a"{0,0}', '"a"{2,2}', '"a"{2,}', '"a"{3}', '"a"{0099,100}', '"{5,1}" [{5,1}]', 'x # {5,1}\nx ::= "a"']
)
def test_other_repeats_and_braces_in_literals_classes_and_comments_pass(fine: str) -> None:
    assert grammar_problem(f"root ::= {fine}\n") is None


def _optional_a(copies: int) -> str:
    return "root ::= " + " ".join(['"a"?'] * copies) + "\n"


@pytest.mark.parametrize(
    "grammar",
    [
        _optional_a(MAX_SKIPS + 1),
        f'root ::= ("a"?){{{MAX_SKIPS + 1}}}\n',
        'root ::= ("a"?){0,160}\n',
        'root ::= ("a"*){1000}\n',  # 24 bytes (a row of 160: 21 s for one token on the pinned server)
        'root ::= (("a"?){9}){8}\n',
        "root ::= x x x x\nx ::= " + " ".join(['"a"?'] * 17) + "\n",
        # a rule doubling the row at each level, each behind a rule that only names the next
        "root ::= x7\n"
        + "".join(f"x{i} ::= y{i}\ny{i} ::= x{i - 1} x{i - 1}\n" for i in range(1, 8))
        + 'x0 ::= "a"?\n',
    ],
)
def test_a_row_of_copies_that_may_match_nothing_past_the_limit_is_refused(grammar: str) -> None:
    # measured on the pinned llama-server, one token: 40 in a row 0.24 s, 80 1.35 s, 160 15-26 s
    problem = grammar_problem(grammar)
    assert skips_in_a_row(grammar) > MAX_SKIPS
    assert problem is not None and "in a row" in problem


@pytest.mark.parametrize(
    "grammar",
    [
        _optional_a(MAX_SKIPS),
        'root ::= "a"{0,160}\n',  # one optional, nested: 0.06 s
        'root ::= ("a" "b"?){100}\n',  # each copy starts with a character
        # different optional elements (an object's properties): 160 cost 64 ms a token, not 20 s
        "root ::= " + " ".join(f'("," "\\"k{i}\\":" [0-9])?' for i in range(160)) + "\n",
        # a cycle, and a chain of 12,000 rules (about what the byte limit allows)
        'root ::= a\na ::= b "x"? "x"?\nb ::= a? "c"\n',
        # (a fixed point reading every rule again for each found empty took 9 minutes on this one)
        "root ::= r1\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(1, 12_000)) + 'r12000 ::= "a"?\n',
    ],
)
def test_rows_within_the_limit_and_rows_of_different_elements_pass(grammar: str) -> None:
    assert 1 <= skips_in_a_row(grammar) <= MAX_SKIPS  # parsed and counted (0: not parsed)
    assert grammar_problem(grammar) is None


def test_no_grammar_the_compiler_writes_for_the_corpus_has_a_row() -> None:
    # optional properties are different elements: JSONSchemaBench's 3,000 sampled grammars have
    # rows of 1 at most (measured); the corpus here the same
    from localllm.grammar.compile import compile_schema
    from tests.unit.grammar_harness import corpus, realworld

    rows = [skips_in_a_row(g) for _, s in [*corpus(), *realworld()] if (g := compile_schema(s).grammar)]
    assert rows and max(rows) <= 1


def test_rows_are_counted_at_every_depth_the_scan_admits() -> None:
    # counted without recursion: a recursive count ran out of Python's stack 256 groups deep
    # and read the grammar at every limit (the e2e test's) as a row past the limit
    at_limits = "root ::= " + "(" * MAX_NESTING + " | ".join(f'"a{i}"' for i in range(513)) + ")" * MAX_NESTING
    assert grammar_problem(at_limits) is None
    deep_row = "root ::= " + "(" * MAX_NESTING + " ".join(['"a"?'] * (MAX_SKIPS + 1)) + ")" * MAX_NESTING
    assert skips_in_a_row(deep_row) > MAX_SKIPS
