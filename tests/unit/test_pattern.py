"""Answer validation matches ``pattern`` in linear time with ``re``'s verdicts on the pattern
read as ECMA-262 reads it (localllm.grammar.pattern).

Python's ``re`` backtracks exponentially on ``^(a+)+$`` against a near miss and holds the
GIL meanwhile: one answer froze a whole process. These tests compare every verdict with
``re`` running the ECMA reading of the pattern (``ecma_regex``: random patterns, the schema
corpora's patterns, every character class over sampled code points), hold that reading to
ECMA-262's (the JSON-Schema-Test-Suite's regex tests, and facts), and run the hostile cases in
a child process with a deadline, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm.errors import AgentError, ErrorKind
from localllm.grammar.compile import compile_schema, schema_problem, validator_class
from localllm.grammar.pattern import (
    MAX_STATES,
    PatternTooCostly,
    PatternUnsupported,
    check,
    ecma_regex,
    python_pattern,
    search,
    search_group,
    unsupported_reason,
)
from localllm.grammar.walk import Grammar
from localllm.schema import SchemaSet
from localllm.service.chat import _violation
from tests.conftest import REPO, in_child
from tests.unit.grammar_harness import both_paths

NEAR_MISS = "a" * 40 + "!"  # re needs ~2**40 steps to reject it against ^(a+)+$
EVIL = "^(a+)+$"

# -- the same verdicts as re ----------------------------------------------------------------
_ATOMS = [
    "a", "b", r"\d", r"\w", r"\s", r"\W", r"\D", r"\S", ".", "[ab]", "[^a]", r"[a-c\d]", r"\n", "é", "٣", "_",
    " ", r"\b", r"\B", "^", "$", r"\A", r"\Z", "(?=a)", "(?!b)", "(?<=a)", "(?<!b)", r"[\s\d]", r"\x1c", "[^\\W_]",
]  # fmt: skip
_FLAGS = ["", "(?i)", "(?m)", "(?s)", "(?a)", "(?x)", "(?ims)"]
_ALPHABET = "abAB1٣_ \n\x1cé\t.-"


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice(_ATOMS)
    if roll < 0.55:
        return "".join(_random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
    if roll < 0.7:
        return "(?:" + "|".join(_random_pattern(rng, depth + 1) for _ in range(rng.randint(2, 3))) + ")"
    quantifier = rng.choice(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "*?", "+?", "{2,}"])
    return "(" + _random_pattern(rng, depth + 1) + ")" + quantifier


def test_random_patterns_give_re_s_verdicts() -> None:
    rng = random.Random(20261203)
    checked = 0
    for _ in range(3000):
        pattern = rng.choice(_FLAGS) + _random_pattern(rng)
        if rng.random() < 0.1:
            pattern = "(?i:" + re.sub(r"\(\?[a-z]+\)", "", pattern) + ")"  # scoped flags
        try:
            compiled = ecma_regex(pattern)
        except re.error:
            continue
        for _ in range(5):
            text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8)))
            assert search(pattern, text) == (compiled.search(text) is not None), (pattern, text)
            checked += 1
    assert checked > 10_000


# -- the same group as re ---------------------------------------------------------------------
_NO_GROUP = ("a repeat whose body can match the empty string", "inside a lookaround", "backreference", "conditional")


def test_random_patterns_give_re_s_groups() -> None:
    rng = random.Random(20261204)
    checked, refused = 0, 0
    for _ in range(3000):
        pattern = rng.choice(_FLAGS) + _random_pattern(rng)
        try:
            compiled = ecma_regex(pattern)
        except re.error:
            continue
        for number in range(1, min(compiled.groups, 3) + 1):
            try:
                search_group(pattern, "", number)
            except PatternUnsupported as exc:
                assert any(why in str(exc) for why in _NO_GROUP), (pattern, exc)
                refused += 1
                continue
            for _ in range(5):
                text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8)))
                found = compiled.search(text)
                want = found.group(number) if found is not None else None
                assert search_group(pattern, text, number) == want, (pattern, number, text)
                checked += 1
    assert checked > 5_000 and refused > 100


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        (r"^review\.(\w+)", "review.code", "code"),
        (r"x(a|ab)(c|bcd)", "xabcd", "a"),  # the first alternative that leads to a match, not the longest
        (r"(a+?)a*", "aaa", "a"),  # lazy
        (r"(a+)a*", "aaa", "aaa"),  # greedy
        (r"(?:(x)|y)z", "yz", None),  # the group takes no part
        (r"(a)+", "aaa", "a"),  # the last round
        (r"b(a{2})", "aaba", None),
        (r"(?<=b)(a)", "aba", "a"),
        (r"(?i)(A)", "a", "a"),
    ],
)
def test_groups_match_re(pattern: str, text: str, expected: str | None) -> None:
    found = ecma_regex(pattern).search(text)
    assert (found.group(1) if found else None) == expected
    assert search_group(pattern, text) == expected


@pytest.mark.parametrize("pattern", [r"(a*)*", r"(a|)+b", r"((?:x?)*)y", r"(?=(a))a", r"(a)\1"])
def test_a_group_with_no_linear_answer_is_refused(pattern: str) -> None:
    with pytest.raises(PatternUnsupported):
        search_group(pattern, "aa")
    found = ecma_regex(pattern).search("aa")  # with fallback, re's answer (taken on a text known to match)
    assert search_group(pattern, "aa", fallback=True) == (found.group(1) if found else None)
    with pytest.raises(IndexError):
        search_group("(a)", "a", 2)


def test_a_group_behind_a_failing_alternative_is_found_without_backtracking() -> None:
    # re tries (?:a+)+b first and backtracks ~2**len(text) times before the second alternative
    found = in_child(
        """
        import json
        from localllm.grammar.pattern import search_group
        text = "a" * 5000
        print(json.dumps([search_group(r"^(?:(?:a+)+b|(a+))$", t) for t in (text, "a" * 40 + "!")]))
        """
    )
    assert found == ["a" * 5000, None]


def _corpus_patterns() -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("enum", "const", "default", "examples"):
                    continue
                if key == "pattern" and isinstance(value, str):
                    found.add(value)
                if key == "patternProperties" and isinstance(value, dict):
                    found.update(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted((REPO / "grammar" / "corpus").glob("*.json")):
        walk(json.loads(path.read_text()))
    for path in (
        REPO / "grammar" / "realworld" / "schemas.jsonl",
        REPO / "tests/bench/data/jsonschemabench_sample.jsonl",
    ):
        for line in path.read_text().splitlines():
            walk(json.loads(line))
    return found


def test_the_corpora_s_patterns_give_re_s_verdicts_and_none_is_refused() -> None:
    patterns = _corpus_patterns()
    assert len(patterns) > 150
    probes = ["", "a", "abc", "ABC-123", "2024-01-31", "user@example.com", "https://x.org/a?b=1", " x ", "\n", "é٣"]
    rng = random.Random(7)
    compared = 0
    for pattern in sorted(patterns):
        try:
            compiled = ecma_regex(pattern)
        except re.error:  # ECMA-only syntax: the validator reports it (schema_invalid), not us
            continue
        assert unsupported_reason(pattern) is None, pattern
        own = [c for c in pattern if c.isprintable()] or ["a"]
        texts = probes + ["".join(rng.choice(own) for _ in range(rng.randint(1, 12))) for _ in range(20)]
        for text in texts:
            assert search(pattern, text) == (compiled.search(text) is not None), (pattern, text)
            compared += 1
    assert compared > 4000


_CLASSES = [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", ".", r"[^\W\d]", r"\b."]
_SAMPLED = [*range(0, 0x250), *range(0x250, 0x110000, 251)]
_SAMPLED += [0x1C, 0x1F, 0x85, 0xA0, 0x130, 0x131, 0x17F, 0x212A, 0x660, 0x1680, 0x2007, 0x2028, 0x3000, 0xFEFF]
_SAMPLED += [0x10400, 0x1D7CE]
# ECMA-262 §12.2 WhiteSpace and §12.3 LineTerminator: what its \s reads
_ECMA_SPACE = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029}
_ECMA_SPACE |= {0x202F, 0x205F, 0x3000, 0xFEFF}
_ASCII_WORD = {ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"}
_ECMA_CLASS: dict[str, Callable[[int], bool]] = {
    r"\d": lambda cp: 0x30 <= cp <= 0x39,
    r"\w": lambda cp: cp in _ASCII_WORD,
    r"\s": lambda cp: cp in _ECMA_SPACE,
    r"\D": lambda cp: not 0x30 <= cp <= 0x39,
    r"\W": lambda cp: cp not in _ASCII_WORD,
    r"\S": lambda cp: cp not in _ECMA_SPACE,
    ".": lambda cp: cp not in (0x0A, 0x0D, 0x2028, 0x2029),
    r"[^\W\d]": lambda cp: cp in _ASCII_WORD and not 0x30 <= cp <= 0x39,
    r"\b.": lambda cp: cp in _ASCII_WORD,
}


@pytest.mark.parametrize("item", _CLASSES)
@pytest.mark.parametrize("flags", ["", "(?a)", "(?s)"])
def test_character_classes_read_as_ecma_262_does(item: str, flags: str) -> None:
    """``\\d``, ``\\w``, ``\\b`` ASCII, ``\\s`` ECMA's spaces (U+FEFF, not U+001C or U+0085 as
    ``re`` has it), ``.`` no line terminator: every verdict was ``re``'s before (a Bengali
    digit a ``\\d``, ``é`` a ``\\w``, ``ab\\n`` a match of ``^ab$``)."""
    pattern = f"{flags}^{item}$"
    for cp in _SAMPLED:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        expected = True if item == "." and flags == "(?s)" else _ECMA_CLASS[item](cp)
        assert search(pattern, chr(cp)) == expected, (pattern, hex(cp))


@pytest.mark.parametrize("item", _CLASSES)
@pytest.mark.parametrize("flags", ["", "(?a)", "(?i)", "(?s)"])
def test_character_classes_match_re_over_sampled_code_points(item: str, flags: str) -> None:
    pattern = f"{flags}^{item}$"
    compiled = ecma_regex(pattern)
    for cp in _SAMPLED:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        text = chr(cp)
        assert search(pattern, text) == (compiled.search(text) is not None), (pattern, hex(cp))


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("^ab$", "ab\n", False),  # ECMA-262's $ is the very end (re's also before a final newline)
        (r"^ab\Z", "ab\n", False),
        (r"\b", "", False),  # no word character, no boundary
        (r"\B", "", True),  # ECMA-262 (re fails \B in an empty text)
        ("(?m)^b$", "a\nb\nc", True),
        (r"(?<=\ba)b", "ab", True),
        (r"(?<!a)b", "ab", False),
        ("(?=.*[A-Z])(?=.*\\d).{8,}", "abcdefgH1", True),
        ("(?i)straße", "STRASSE", False),
        ("(?i)ǅ", "ǆ", True),
        (r"^\d+$", "৪২", False),  # Bengali digits: ECMA's \d is ASCII
        (r"^\w+$", "école", False),
        (r"^\s$", "\ufeff", True),
        (r"^.$", "\r", False),
    ],
)
def test_edge_cases_match_ecma(pattern: str, text: str, expected: bool) -> None:
    assert (ecma_regex(pattern).search(text) is not None) is expected  # the premise
    assert search(pattern, text) is expected
    assert search(pattern, text, fallback=True) is expected


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("^[[a]+$", ["[a[", "a"], ["]", "b"]),  # re: "Possible nested set"
        ("^[+--]$", ["+", ",", "-"], ["*", "."]),  # a range ending at "-": "Possible set difference"
        ("^[a&&b]$", ["&", "a"], ["c"]),  # "Possible set intersection"
        ("^[x||y~~]$", ["|", "~", "y"], ["z"]),  # union, symmetric difference
        ("^[--/]$", ["-", ".", "/"], [","]),  # a range from "-"
    ],
)
def test_class_syntax_re_warns_of_is_read_as_ecma_262_reads_it_quietly(
    pattern: str, inside: list[str], outside: list[str]
) -> None:
    # re reads each as ECMA-262 does but warns (FutureWarning: an error here, as in every
    # test); the compiler and `grammar compile` printed "localllm: warning: Possible nested
    # set at position 2" for a valid schema, two or three times
    assert [t for t in inside if not search(pattern, t)] == [] and [t for t in outside if search(pattern, t)] == []
    compiled = compile_schema({"type": "string", "pattern": pattern})
    assert compiled.exact, compiled.refusals
    grammar = Grammar.parse(compiled.grammar or "")
    assert all(grammar.matches(json.dumps(t)) for t in inside) and not any(
        grammar.matches(json.dumps(t)) for t in outside
    )
    assert python_pattern("[a-z]|a--b&&c") == "[a-z]|a--b&&c"  # outside a class: nothing to escape, kept


# -- linear time ---------------------------------------------------------------------------
_HOSTILE = {
    EVIL: NEAR_MISS,
    r"^\d*\d*\d*\d*$": "1" * 5000 + "x",  # polynomial for re: ~10**13 steps
    "a*b": "a" * 50_000,  # quadratic for re's search
    r"^(\w|\d)+$": "1" * 40 + "!",
    "^(?=(a+)+$)": NEAR_MISS,
}


def test_hostile_patterns_are_decided_without_backtracking() -> None:
    verdicts = in_child(
        f"""
        import json
        from localllm.grammar.pattern import search
        print(json.dumps([search(p, t) for p, t in {_HOSTILE!r}.items()]))
        """
    )
    assert verdicts == [False] * len(_HOSTILE)


@pytest.mark.slow
def test_a_huge_repeat_searched_unanchored_in_a_long_text_stops_at_its_work_bound(tmp_path: Path) -> None:
    """O(text × pattern) is still 20,000 × 18,000 steps for ``[a-z]{0,9000}X``: 100 s and
    3 GiB before the bound; now the check fails after ~1.5 million steps, on every path."""
    pattern, text = "[a-z]{0,9000}X", "a" * 20_000
    with pytest.raises(PatternTooCostly):
        search(pattern, text)
    assert search("^" + pattern, text) is False  # anchored, the same text is cheap
    assert search(pattern, "a" * 20 + "X") is True
    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(AgentError) as caught:
        SchemaSet(tmp_path).validate(json.dumps(text), schema)
    assert caught.value.kind is ErrorKind.SCHEMA_INVALID and "cannot be checked" in str(caught.value)
    assert "cannot be checked" in (_violation(schema, text) or "")
    named = {"type": "object", "properties": {text: {}}, "patternProperties": {pattern: {"type": "integer"}}}
    refusals = compile_schema(named).refusals
    assert [r.construct for r in refusals] == ["patternProperties"] and "cannot be checked" in refusals[0].message


@pytest.mark.parametrize("pattern", [r"(?=[ab]*x)c", r"(?<=x[ab]*)c"])
def test_a_lookaround_at_every_position_of_a_long_text_stops_at_its_work_bound(pattern: str) -> None:
    """Unanchored, a lookaround's sub-search runs at every position and reads on to the end (or
    back to the start) each time, all of it from the DFA cache, whose steps cost nothing: 8,000
    characters took 6.8 s and 50,000 minutes. A cached step costs one now."""
    verdict = in_child(
        f"""
        import json
        from localllm.grammar.pattern import PatternTooCostly, search
        try:
            print(json.dumps(search({pattern!r}, "ab" * 25_000 + "c")))
        except PatternTooCostly:
            print(json.dumps("too costly"))
        """,
        timeout=30,
    )
    assert verdict == "too costly"
    assert search(pattern, "ab" * 50 + "c") is False  # a short text is still decided
    assert search(pattern.replace("c", "[abc]"), "abxa") is True


_KEYWORD_SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "pattern": ({"pattern": EVIL}, NEAR_MISS),
    "patternProperties": ({"patternProperties": {EVIL: {"type": "integer"}}}, {NEAR_MISS: 1, "aa": "x"}),
    "additionalProperties": ({"patternProperties": {EVIL: {}}, "additionalProperties": False}, {NEAR_MISS: 1}),
    "unevaluatedProperties": ({"patternProperties": {EVIL: {}}, "unevaluatedProperties": False}, {NEAR_MISS: 1}),
    "propertyNames": ({"propertyNames": {"pattern": EVIL}}, {NEAR_MISS: 1}),
    "nested unevaluated": (
        {"allOf": [{"patternProperties": {EVIL: {}}}], "unevaluatedProperties": False},
        {NEAR_MISS: 1, "aaa": 2},
    ),
}
_DRAFTS = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "2019-09": "https://json-schema.org/draft/2019-09/schema",
    "2020-12": "https://json-schema.org/draft/2020-12/schema",
}


def test_every_regex_keyword_of_every_draft_validates_a_near_miss_promptly() -> None:
    """Both validator paths (the runtime's SchemaSet and validator_class: service, grammar)."""
    cases = [
        (name, draft, {"$schema": uri, **schema}, instance)
        for name, (schema, instance) in _KEYWORD_SCHEMAS.items()
        for draft, uri in _DRAFTS.items()
        if not (name.endswith("unevaluated") or name == "unevaluatedProperties") or draft in ("2019-09", "2020-12")
        if not (name == "propertyNames" and draft == "draft4")
    ]
    found = in_child(
        f"""
        import json
        from pathlib import Path
        from localllm.grammar.compile import validator_class
        from localllm.schema import SchemaSet
        from localllm.errors import AgentError
        out = []
        for name, draft, schema, instance in {cases!r}:
            errors = [e.validator for e in validator_class(schema)(schema).iter_errors(instance)]
            try:
                SchemaSet(Path(".")).validate(json.dumps(instance), schema)
                kind = None
            except AgentError as exc:
                kind = exc.kind.value
            out.append([name, draft, errors, kind])
        print(json.dumps(out))
        """,
        timeout=120,
    )
    assert len(found) == len(cases) >= 19
    for name, draft, errors, kind in found:
        assert errors and kind == "schema_invalid", (name, draft, errors, kind)


def test_the_grammar_compiler_and_checker_match_schema_patterns_promptly() -> None:
    """A declared property name is a near miss of a patternProperties pattern: the compiler and
    the subset checker search one in the other (a service request's schema reaches both)."""
    schema = {
        "type": "object",
        "properties": {NEAR_MISS: {"type": "string"}},
        "patternProperties": {EVIL: {"type": "integer"}},
    }
    found = in_child(
        f"""
        import json
        from localllm.grammar.compile import compile_schema, schema_problem
        from localllm.grammar.subset import check_subset
        schema = {schema!r}
        compiled = compile_schema(schema)
        print(json.dumps([
            schema_problem(schema),
            compiled.grammar is not None or [r.construct for r in compiled.refusals],
            [v.severity for v in check_subset(schema) if v.severity == "error"],
        ]))
        """
    )
    assert found == [None, True, []]


def test_bounded_validators_keep_jsonschema_s_verdicts_and_messages() -> None:
    import jsonschema

    schema = {"pattern": "^[a-z]+$", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}
    for instance in ("abc", "ab1", {"x1": 1, "y": 2}, {"x1": "s"}):
        ours = [(e.validator, e.message) for e in validator_class(schema)(schema).iter_errors(instance)]
        theirs = [(e.validator, e.message) for e in jsonschema.Draft202012Validator(schema).iter_errors(instance)]
        assert ours == theirs, instance
    assert validator_class(schema) is not jsonschema.Draft202012Validator  # and jsonschema's own stays re's
    assert jsonschema.Draft202012Validator.VALIDATORS["pattern"].__globals__["re"] is re


# -- what cannot be matched in linear time is refused when the schema is checked ------------
@pytest.mark.parametrize(
    ("schema", "where", "construct"),
    [
        ({"type": "string", "pattern": r"^(a)\1$"}, "$.pattern", "backreference"),
        ({"properties": {"x": {"pattern": "(?P<q>a)(?P=q)"}}}, "$.properties.x.pattern", "backreference"),
        ({"patternProperties": {r"^(\w)\1": {}}}, "$.patternProperties", "backreference"),
        ({"$schema": _DRAFTS["draft7"], "items": [{"pattern": "(?>a+)b"}]}, "$.items[0].pattern", "atomic group"),
        ({"pattern": "a++"}, "$.pattern", "possessive"),
        ({"pattern": "a{0,30000}"}, "$.pattern", f"{MAX_STATES:,} states"),
        # the cap is the whole pattern's: 50 lookaheads of 18,000 states each were 900,000
        ({"pattern": "(?=a{0,9000})" * 50}, "$.pattern", f"{MAX_STATES:,} states"),
    ],
)
def test_schema_checks_refuse_patterns_without_a_linear_match(
    schema: dict[str, Any], where: str, construct: str
) -> None:
    problem = schema_problem(schema)
    assert problem is not None
    assert problem[0].startswith(where) and construct in problem[1], problem


def test_schema_checks_accept_lookarounds_and_data_that_looks_like_a_pattern() -> None:
    assert schema_problem({"pattern": "^(?=.*[A-Z])(?=.*\\d).{8,}$"}) is None
    assert schema_problem({"enum": [{"pattern": r"(a)\1"}], "const": {"pattern": "a++"}}) is None
    assert schema_problem({"properties": {"pattern": {"type": "string"}}}) is None


def test_a_pattern_with_a_backreference_still_validates_where_checks_were_skipped(tmp_path: Path) -> None:
    schema = {"type": "string", "pattern": r"^(\w)\1$"}
    with pytest.raises(PatternUnsupported):
        search(r"^(\w)\1$", "aa")
    assert SchemaSet(tmp_path).validate('"aa"', schema) == "aa"  # re decides it, as before


# -- ECMA-262's own escapes: \cX and \p{…} ---------------------------------------------------
REGEX_SUITE = REPO / "tests" / "bench" / "data" / "json_schema_test_suite_regex.jsonl"


_SUITE_DRAFTS = {
    "draft4": _DRAFTS["draft4"],
    "draft6": "http://json-schema.org/draft-06/schema#",
    "draft7": _DRAFTS["draft7"],
    "draft2019-09": _DRAFTS["2019-09"],
    "draft2020-12": _DRAFTS["2020-12"],
}
#: the suite's `format: regex` instances answered otherwise on purpose (README, Structured
#: output): Python-only syntax is read as `re` reads it (schemas in the wild use inline flags)
_REGEX_FORMAT_DEVIATIONS = {
    "when used as a pattern",  # "\\a": re's bell
    "Python named group (?P<name>...) is not ECMA 262",
    "Python named backreference (?P=name) is not ECMA 262",
    "inline comment group (?#...) is not ECMA 262",
    "a single global inline flag (?i)",
    "multiple global inline flags (?ims)",
}


def _regex_suite(draft: str) -> Iterator[dict[str, Any]]:
    """The test suite's regex groups of ``draft``, each schema naming its draft."""
    for line in REGEX_SUITE.read_text(encoding="utf-8").splitlines():
        group = json.loads(line)
        if group["draft"] == draft:
            group["schema"] = {"$schema": _SUITE_DRAFTS[draft], **group["schema"]}
            yield group


@pytest.mark.parametrize("draft", _SUITE_DRAFTS)
def test_the_json_schema_test_suite_s_regex_tests_give_its_verdicts(tmp_path: Path, draft: str) -> None:
    """Every instance of the suite's `pattern`, `patternProperties`, `ecmascript-regex`,
    `non-bmp-regex` and `format: regex` tests, on the answer path and the service's: the 18
    per draft that use `\\cC` or `\\p{…}` failed (`re` cannot parse either), and 5 `format: regex`
    ones (ECMA's named groups, `\\k<name>`, `[]`, `[^]`, a variable-width lookbehind)."""
    wrong, seen = set(), 0
    for group in _regex_suite(draft):
        for test in group["tests"]:
            seen += 1
            if both_paths(tmp_path, group["schema"], test["data"]) != (test["valid"], test["valid"]):
                wrong.add(test["description"])
    assert seen > 100
    has_format_file = draft not in ("draft4", "draft6")
    assert wrong == (_REGEX_FORMAT_DEVIATIONS if has_format_file else set())


@pytest.mark.parametrize("draft", ["draft7", "draft2020-12"])
def test_no_regex_grammar_admits_an_instance_the_suite_calls_invalid(draft: str) -> None:
    admitted, tried, compiled = [], 0, set()
    for group in _regex_suite(draft):
        result = compile_schema(group["schema"])
        if result.grammar is None:
            continue
        compiled.add(group["description"])
        grammar = Grammar.parse(result.grammar)
        for test in group["tests"]:
            if not test["valid"]:
                tried += 1
                if grammar.matches(json.dumps(test["data"], ensure_ascii=False)):
                    admitted.append((group["description"], test["description"], test["data"]))
    assert {
        "ECMA 262 regex escapes control codes with \\c and upper letter",
        "pattern with non-ASCII digits",
    } <= compiled
    assert tried > 40
    assert admitted == []


@pytest.mark.parametrize(
    ("pattern", "admitted", "refused"),
    [
        (r"^\p{Lu}\p{Ll}+$", ["Łódź", "Émile"], ["łódź", "Ł", "Ab1"]),
        (r"^\p{Nd}+$", ["৪২", "123"], ["12a", ""]),
        (r"^[^\P{L}a]+$", ["bé", "Ω"], ["ab", "b1"]),  # letters but a: the complement in a class
        (r"^\p{General_Category=Letter}\P{gc=L}$", ["é1"], ["éé"]),
        (r"^\p{ASCII_Hex_Digit}{2}$", ["aF"], ["aG"]),
        (r"^\cJ\ca$", ["\n\x01"], ["cJca"]),
        (r"^[\cA-\cC]$", ["\x02"], ["\x04"]),
    ],
)
def test_ecma_property_and_control_escapes_validate_and_compile(
    tmp_path: Path, pattern: str, admitted: list[str], refused: list[str]
) -> None:
    schema = {"type": "string", "pattern": pattern}
    result = compile_schema(schema)
    assert result.grammar is not None, result.refusals
    grammar = Grammar.parse(result.grammar)
    for text in admitted:
        assert search(pattern, text) and grammar.matches(json.dumps(text, ensure_ascii=False)), text
        assert SchemaSet(tmp_path).validate(json.dumps(text), schema) == text
    for text in refused:
        assert not search(pattern, text) and not grammar.matches(json.dumps(text, ensure_ascii=False)), text


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        (r"^\p{Script=Greek}+$", "Script=Greek"),  # a property this module does not answer
        (r"\p{Foo}", "Foo"),
        (r"\pL", r"\p must be followed by {property}"),
        (r"\c1", r"\c must be followed by a letter"),
        (r"[\p{L}-z]", "range"),  # an error in ECMA-262 with the u flag too
        (r"[!-\p{L}]", "range"),
    ],
)
def test_an_unanswered_or_malformed_ecma_escape_is_refused_where_the_schema_is_checked(pattern: str, what: str) -> None:
    problem = schema_problem({"type": "string", "pattern": pattern})
    assert problem is not None and problem[0] == "$.pattern" and what in problem[1], problem
    assert compile_schema({"type": "string", "pattern": pattern}).grammar is None


def test_escapes_that_only_look_like_ecma_s_are_kept() -> None:
    assert search(r"^\\p{L}$", "\\p{L}") and not search(r"^\\p{L}$", "a")  # an escaped backslash
    assert search(r"^[--/]+$", "-./") and search(r"^[a-c-\p{Nd}]+$", "b-৪")  # a "-" after a range is one


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        (r"(?<=a+)b", "aab", True),
        (r"(?<=a+)b", "cb", False),
        (r"(?<=^a{1,3})b", "aaab", True),  # read at its least width this said no
        (r"(?<=^a{1,3})b", "aaaab", False),
        (r"(?<!x[0-9]*)y", "x12y", False),  # and this yes
        (r"(?<!x[0-9]*)y", "12y", True),
        (r"(?<=\bfo+)x", "a fooox", True),
        (r"(?<=\bfo+)x", "afooox", False),
        (r"(?m)(?<=^a*)b", "x\naab", True),
        (r"(?m)(?<=^a*)b", "xa\naxb", False),
        (r"(?<=(?:ab|c)+)d$", "ababcd", True),
    ],
)
def test_a_variable_width_lookbehind_is_read_right_to_left(pattern: str, text: str, expected: bool) -> None:
    """ES2018's variable-width lookbehinds, which `re` cannot compile: the body is built
    backwards and run over the reversed text (anchors swapped, \\b the same both ways)."""
    assert search(pattern, text) is expected
    check(pattern)
    assert schema_problem({"type": "string", "pattern": pattern}) is None


def _anchor_free(rng: random.Random, depth: int = 0) -> str:
    atom = rng.choice(
        ["a", "b", ".", "[ab]", r"\d", "(?:ab|1)"] + ([] if depth > 1 else ["(" + _anchor_free(rng, depth + 1) + ")"])
    )
    return "".join(atom + rng.choice(["", "*", "+", "?", "{1,3}", "{0,2}"]) for _ in range(rng.randint(1, 3)))


def test_variable_width_lookbehinds_match_a_brute_force_search() -> None:
    """Against every split of the text: ``(?<=B)c`` matches where some ``text[j:i]`` is a whole
    match of B before a ``c`` at i (B without anchors, so a slice reads as the text does)."""
    rng = random.Random(11)
    tried = 0
    for _ in range(400):
        body = _anchor_free(rng)
        whole = ecma_regex(body)
        for _ in range(5):
            text = "".join(rng.choice("ab1c") for _ in range(rng.randint(0, 9)))
            ends = [i for i, ch in enumerate(text) if ch == "c"]
            behind = [any(whole.fullmatch(text, j, i) for j in range(i + 1)) for i in ends]
            tried += 1
            assert search(f"(?<={body})c", text) is any(behind), (body, text)
            assert search(f"(?<!{body})c", text) is (not all(behind)), (body, text)
    assert tried == 2000


def test_a_lookaround_inside_a_variable_width_lookbehind_is_refused() -> None:
    with pytest.raises(PatternUnsupported, match="inside a variable-width lookbehind"):
        search(r"(?<=a+(?!x))c", "aac")
    with pytest.raises(re.error):
        check(r"(?<=a+(?!x))c")


def test_property_classes_past_their_written_size_are_an_error_at_once() -> None:
    """Each ``\\p{…}`` is written out as its ranges for re to parse (``\\p{L}``: 648 ranges,
    9,400 characters): an 18 KB answer to ``format: regex`` of 3,000 of them took 37 s to
    check, a schema's pattern of 1,000 of them 9 s."""
    assert python_pattern("\\p{L}" * 30)  # 19,440 ranges
    with pytest.raises(re.error):
        python_pattern("\\p{L}" * 31)
    assert python_pattern("\\\\p{L}" * 31) == "\\\\p{L}" * 31  # escaped backslashes: no property
    problem = schema_problem({"type": "string", "pattern": "^\\p{Lu}" + "\\p{L}" * 40 + "$"})
    assert problem is not None and problem[0] == "$.pattern"
    verdicts = in_child(
        """
        import json
        from localllm.grammar.compile import validator_class
        schema = {"type": "string", "format": "regex"}
        validator = validator_class(schema)
        from localllm.grammar.formats import format_checker
        checker = validator(schema, format_checker=format_checker(validator))
        print(json.dumps([checker.is_valid("\\\\p{L}" * 3000), checker.is_valid("\\\\p{L}+")]))
        """,
        timeout=20,
    )
    assert verdicts == [False, True]


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """Record each call of ``localllm.grammar.pattern``'s ``name`` (its first argument's type)."""
    import builtins

    from localllm.grammar import pattern

    calls: list[str] = []
    real = getattr(pattern, name, None) or getattr(builtins, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(type(args[0]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(pattern, name, counted, raising=False)
    return calls


def test_a_repeated_class_is_spelled_once_however_often_its_repeat_is_written_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The matchers are shared by each item's ``repr``: a ``\\p{L}`` class (648 ranges) was
    spelled again for each of a repeat's copies, 13 s for ``\\p{L}{20001}`` (46 bytes) and 43 s
    for two ``[\\p{L}\\p{N}\\p{M}]{19990}`` in one schema."""
    spelled = _counting(monkeypatch, "repr")
    assert search("^\\p{L}{500}[\\p{L}\\p{N}]{0,300}$", "é" * 700)
    assert spelled.count("list") == 2  # each class once, not once per copy


def test_a_pattern_without_a_linear_match_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why a pattern has no NFA is kept like the NFA itself: finding out takes a whole
    ``MAX_STATES`` build, and a config's schema (its patterns searched with ``fallback``) built
    it again for every value it checked."""
    builds = _counting(monkeypatch, "_build_matcher")
    pattern = f"^b{{{MAX_STATES}}}x$"
    reason = unsupported_reason(pattern)
    assert reason is not None and "20,000 states" in reason
    for _ in range(3):
        assert unsupported_reason(pattern) == reason
        assert search(pattern, "b", fallback=True) is False
        with pytest.raises(PatternUnsupported):
            search(pattern, "b")
    assert len(builds) == 1


def test_an_answer_to_format_regex_is_read_by_re_s_compiler_not_written_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``format: regex`` asks only whether the answer is a pattern: 200 strings ``b{19990}…``
    took 12 s to check (each repeat written out as an NFA); re's compiler writes none out.
    The NFA is built only for what re cannot compile (a variable-width lookbehind)."""
    builds = _counting(monkeypatch, "_build_matcher")
    for i in range(50):
        check(f"c{{19990}}{i}")
    assert builds == []
    check("(?<=q+)c")  # re: "look-behind requires fixed-width pattern"; the NFA reads it
    assert len(builds) == 1
    with pytest.raises(re.error):
        check("(?<=q+(?!x))c")  # nor has the NFA a reading: re's reason
    with pytest.raises(re.error):
        check("a{2,1}")


def test_a_schema_s_patterns_may_expand_to_so_many_states_in_all() -> None:
    """Each distinct pattern's NFA is built before any answer is checked (~2.5 µs a state):
    200 patterns ``a{19990}…`` (10 KB) took 12 s; a schema's patterns may hold
    ``MAX_SCHEMA_STATES`` in all (JSONSchemaBench's most: 16,162)."""
    from localllm.grammar.pattern import MAX_SCHEMA_STATES, expanded_states

    width = MAX_STATES - 10
    assert expanded_states(f"a{{{width}}}0") == width + 3  # start, accept, the 0
    fit = MAX_SCHEMA_STATES // (width + 3)

    def schema(n: int, *, repeat: bool = False) -> dict[str, Any]:
        names = [f"p{i}" for i in range(n)] + (["again"] if repeat else [])
        pats = [f"a{{{width}}}{i}" for i in range(n)] + ([f"a{{{width}}}0"] if repeat else [])
        return {
            "type": "object",
            "properties": {k: {"type": "string", "pattern": p} for k, p in zip(names, pats, strict=True)},
        }

    assert schema_problem(schema(fit, repeat=True)) is None  # a pattern given twice counts once
    assert compile_schema(schema(fit)).refusals[0].construct == "pattern"  # refused for its repeat's size only
    problem = schema_problem(schema(fit + 1))
    assert problem is not None and problem[0] == f"$.properties.p{fit}.pattern"
    assert f"more than {MAX_SCHEMA_STATES:,} NFA states" in problem[1]
    refused = compile_schema(schema(fit + 1)).refusals[0]
    assert (refused.path, refused.construct) == (f"$.properties.p{fit}.pattern", "pattern")


def test_every_pattern_of_a_schema_stays_built_while_its_answers_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NFAs are kept by their states, not by the 512 latest: 600 patterns of 150 states
    were built again for every value of every answer, 15 s for one of 385 KB."""
    n = 600
    item = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^x|a{{150}}{i}"} for i in range(n)},
    }
    schema = {"type": "array", "items": item}
    assert schema_problem(schema) is None
    validator = validator_class(schema)(schema)
    answer = [{f"p{i}": "x" for i in range(n)}] * 3
    assert validator.is_valid(answer)  # builds each pattern not yet built
    builds = _counting(monkeypatch, "_build_matcher")
    assert validator.is_valid(answer)
    assert builds == []


def test_a_property_class_is_written_out_in_characters_re_reads_fast() -> None:
    """``re``'s parser reads a character 5 times faster than an escape: ``\\p{L}`` was 9,400
    characters of escapes (3.9 ms to parse), now 1,678 — and every property's class, and its
    complement, parses to the same items as the all-escaped writing did, in every place a
    class can stand."""
    from localllm.grammar.pattern import _BINARY, _GENERAL_CATEGORIES, _class_text, _complement, property_ranges

    def escaped(ranges: tuple[tuple[int, int], ...]) -> str:
        def one(cp: int) -> str:
            return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"

        return "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in ranges)

    def items(text: str) -> Any:
        def plain(x: Any) -> Any:
            if isinstance(x, (list, tuple)) or type(x).__name__ == "SubPattern":
                return [plain(i) for i in x]
            return x

        return plain(re._parser.parse(text, 0))  # type: ignore[attr-defined]

    assert len(python_pattern("\\p{L}")) < len(escaped(property_ranges("L"))) // 5  # 1,678 and 9,400 on Python 3.11
    compared = 0
    for name in [*_GENERAL_CATEGORIES, *_BINARY]:
        for ranges in (property_ranges(name), _complement(property_ranges(name))):
            for where in ("[{}]", "[^a{}-]", "(?x)(b|[{}] )+", "(?i)[{}z]"):
                if ranges:
                    assert items(where.format(_class_text(ranges))) == items(where.format(escaped(ranges))), name
                    compared += 1
    rng = random.Random(7)
    for cp in [*range(0x3000), *rng.sample(range(0x3000, 0x110000), 3000)]:
        one = ((cp, cp),)
        assert items(f"[{_class_text(one)}z]") == items(f"[{escaped(one)}z]"), hex(cp)
    assert compared > 300


def test_a_class_s_matcher_is_compiled_once_for_every_pattern_that_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """re's compiler took ~7 ms for each ``\\p{L}`` of each pattern (200 patterns of one
    schema: 1.4 s): the one-character matchers are shared by all patterns."""
    from localllm.grammar import pattern

    compiled: list[str] = []
    real = pattern._one_char

    def counted(op: Any, av: Any, flags: int) -> Any:
        compiled.append(str(op))
        return real(op, av, flags)

    monkeypatch.setattr(pattern, "_one_char", counted)
    for i in range(20):
        assert search(f"^[\\p{{Lo}}\\p{{Nd}}]{{3}}-{i}$", f"ⴰ٣ⴱ-{i}")
    assert compiled.count("IN") == 1


def test_checking_a_pattern_compiles_no_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether re compiles a pattern never depends on what one of its characters reads, so
    ``check`` (``format: regex``, a schema's patterns) compiles each as an ``a``; and gives
    ``ecma_regex``'s verdict on random patterns."""
    from localllm.grammar import pattern

    before = ecma_regex.cache_info().currsize
    optimized: list[int] = []
    compiler = vars(pattern)["_compiler"]  # re's own compiler module
    real = compiler._optimize_charset

    def counted(*args: Any, **kwargs: Any) -> Any:
        optimized.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "_optimize_charset", counted)
    check("^\\p{L}{3}[\\p{N}\\s]+\\d$")
    assert optimized == [] and ecma_regex.cache_info().currsize == before
    monkeypatch.undo()
    rng = random.Random(20261206)
    tried = refused = 0
    for _ in range(2000):
        text = (
            rng.choice(_FLAGS)
            + _random_pattern(rng)
            + rng.choice(["", "(?<=a+)", "(?<=a|bc)", "\\1", "(a)\\2", "(?<!x*)"])
        )
        try:
            ecma_regex(text)
            expected = None
        except re.error:
            expected = re.error
        try:
            check(text)
            got = None
        except re.error:
            got = re.error
        # the NFA reads what re's compiler does not (a variable-width lookbehind)
        assert got is expected or (expected is re.error and got is None and unsupported_reason(text) is None), text
        tried, refused = tried + 1, refused + (got is re.error)
    assert tried == 2000 and refused > 100


def test_a_schema_s_patterns_may_hold_so_many_property_ranges_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``\\p{…}`` is read by re's parser in each distinct pattern that names it (~3 ms a
    ``\\p{L}`` to check and build): 200 patterns ``^\\p{L}{40}…$`` (11 KB) took 4 s to check,
    a 256 KiB schema of them minutes. Counted from the text, before any pattern is parsed."""
    from localllm.grammar.pattern import MAX_SCHEMA_PROPERTY_RANGES

    def schema(n: int) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {f"k{i}": {"type": "string", "pattern": f"^\\p{{L}}+{i}$"} for i in range(n)},
        }

    from localllm.grammar.pattern import property_ranges

    fit = MAX_SCHEMA_PROPERTY_RANGES // len(property_ranges("L"))  # 648 ranges on Python 3.11
    assert schema_problem(schema(fit)) is None
    parsed = _counting(monkeypatch, "python_pattern")
    for refused in (schema(fit + 1), schema(20_000)):
        problem = schema_problem(refused)
        assert problem is not None and problem[0] == f"$.properties.k{fit}.pattern"
        assert f"more than {MAX_SCHEMA_PROPERTY_RANGES:,} ranges" in problem[1]
        refusal = compile_schema(refused).refusals[0]
        assert (refusal.path, refusal.construct) == (f"$.properties.k{fit}.pattern", "pattern")
    assert parsed == []


def test_reading_answers_to_format_regex_is_a_step_of_the_meter() -> None:
    """100 answers of 30 ``\\p{L}`` each (19 KB) took 17 s to check (2.9 s with each class read
    faster, still linear in the answer's size): a step of the running check for every 4
    characters re reads."""
    from localllm.grammar.bounded import ValidationTooCostly
    from localllm.grammar.formats import format_checker

    schema = {"type": "array", "items": {"type": "string", "format": "regex"}}
    cls = validator_class(schema)
    validator = cls(schema, format_checker=format_checker(cls))
    assert validator.is_valid(["\\p{L}" * 30 + str(i) for i in range(10)])
    assert validator.is_valid(["[a-z]+(?:-[a-z0-9]+)*"] * 5000)  # a common answer's patterns cost little
    with pytest.raises(ValidationTooCostly):
        validator.is_valid(["\\p{L}" * 30 + str(i) for i in range(100)])
    assert not validator.is_valid(["\\p{L}" * 31])  # one pattern's own cap: an error, not a cost
