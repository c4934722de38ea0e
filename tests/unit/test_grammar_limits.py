"""A client's GBNF is bounded before a shared llama-server parses it (localllm.grammar.limits);
tests/e2e/test_service_front_e2e.py sends the crashing one and one at every limit to the real server."""

from __future__ import annotations

import pytest

from localllm.grammar.limits import MAX_ALTERNATIVES, MAX_GRAMMAR_BYTES, MAX_NESTING, MAX_RULES, grammar_problem


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
