"""Several patterns on one string (allOf components, a pattern beside a negated literal
search) and a pattern whose repeats cannot be cut to its length bounds compile as the
product of their automata: each grammar admits exactly the probes the validator accepts
(a final newline, which Python's ``$`` also allows, is not generated), random walks and
one-edit mutations validate, and random pattern pairs never admit an invalid string."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from localllm.grammar import automaton
from localllm.grammar.automaton import Dfa, _minimal, _trimmed, normalize
from localllm.grammar.compile import MAX_PRODUCT_STATES, compile_schema
from localllm.grammar.walk import Grammar
from tests.unit.grammar_harness import Runaway, counterexample, invalid_walks, validator

D4 = "http://json-schema.org/draft-04/schema#"


def grammar(schema: Any) -> Grammar:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 200) == []
    parsed = Grammar.parse(compiled.grammar)
    rng = random.Random(1)
    assert counterexample(parsed, schema, [json.loads(parsed.sample(rng)) for _ in range(20)]) is None
    return parsed


def verdicts(schema: Any, texts: list[str]) -> tuple[list[str], list[str]]:
    """(the texts the grammar admits, the texts the validator accepts)."""
    parsed = grammar(schema)
    check = validator(schema)
    return (
        [t for t in texts if parsed.matches(json.dumps(t))],
        [t for t in texts if check.is_valid(t)],
    )


_ALNUM = ["a1", "1a", "abc9", "9", "a", "", "a-1", "A1", "1", "ab12cd", "z0z"]


@pytest.mark.parametrize(
    ("schema", "texts", "admitted"),
    [
        # two allOf patterns: an anchored class and a search
        (
            {"type": "string", "allOf": [{"pattern": "^[a-z]+$"}, {"pattern": "ab"}]},
            ["ab", "xaby", "abab", "a", "b", "ba", "aB", "AB", "ab1", "", "xa", "by"],
            ["ab", "xaby", "abab"],
        ),
        # the schema's own pattern and two more in its allOf: a letter, a digit, nothing else
        (
            {"type": "string", "pattern": "^[a-z0-9]+$", "allOf": [{"pattern": "\\d"}, {"pattern": "[a-z]"}]},
            _ALNUM,
            ["a1", "1a", "abc9", "ab12cd", "z0z"],
        ),
        # draft 4 reads pattern alike
        (
            {"$schema": D4, "type": "string", "allOf": [{"pattern": "^ab"}, {"pattern": "cd$"}]},
            ["abcd", "abxcd", "abc", "acd", "cdab", "abcdcd", "ab", "cd", "xabcd"],
            ["abcd", "abxcd", "abcdcd"],
        ),
        # alternatives in both
        (
            {"type": "string", "allOf": [{"pattern": "^(ab|c)+$"}, {"pattern": "^(a|bc)*c$|^c"}]},
            ["c", "abc", "ccab", "ab", "cab", "abab", "abcc", "ca", ""],
            ["c", "ccab", "cab", "abcc"],
        ),
        # with length bounds, counted in the product
        (
            {"type": "string", "minLength": 2, "maxLength": 3, "allOf": [{"pattern": "^[a-z]+$"}, {"pattern": "x"}]},
            ["x", "xa", "ax", "axa", "xxxx", "abxd", "ab", "x1", "abx"],
            ["xa", "ax", "axa", "abx"],
        ),
        # a pattern beside the negation of a literal search
        (
            {"type": "string", "pattern": "^[a-c]+$", "not": {"pattern": "ab"}},
            ["a", "ba", "cab", "ab", "aab", "bca", "acb", "", "abc", "d"],
            ["a", "ba", "bca", "acb"],
        ),
        # a group repeated beside length bounds its repeats cannot be cut to
        (
            {"type": "string", "pattern": "^(a+b)+$", "maxLength": 4},
            ["ab", "aab", "abab", "aaab", "aabab", "abb", "b", "", "ba", "aaaab"],
            ["ab", "aab", "abab", "aaab"],
        ),
        (
            {"type": "string", "pattern": "^(ab|c)+$", "minLength": 3, "maxLength": 4},
            ["c", "cc", "ccc", "abc", "cab", "abab", "cccc", "ccccc", "abcab", "abca"],
            ["ccc", "abc", "cab", "abab", "cccc"],
        ),
    ],
)
def test_patterns_on_one_string_admit_what_all_of_them_match(
    schema: dict[str, Any], texts: list[str], admitted: list[str]
) -> None:
    got, valid = verdicts(schema, texts)
    assert valid == admitted
    assert got == admitted


def test_an_enum_merged_with_two_patterns_keeps_only_values_matching_both() -> None:
    # the merged schema's one regex for both patterns is what its enum is checked with
    values = ["ab", "a", "b", "axb", "ba", "a\nb", 1]
    schema = {"allOf": [{"pattern": "^a"}, {"pattern": "b$"}, {"enum": values}]}
    parsed = grammar(schema)
    assert [v for v in values if parsed.matches(json.dumps(v))] == ["ab", "axb", "a\nb", 1]


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        # no string is both
        ({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "^b"}]}, 'no string matches "^a" and "^b"'),
        ({"type": "string", "allOf": [{"pattern": "^\\w+$"}, {"pattern": "@"}]}, "no string matches"),
        ({"type": "string", "maxLength": 2, "allOf": [{"pattern": "a"}, {"pattern": "bc"}]}, "length 0..2"),
        # the product is capped (each state is a rule of the grammar)
        (
            {"type": "string", "allOf": [{"pattern": "^[a-z]{0,9000}X"}, {"pattern": "Y$"}]},
            f"needs more than {MAX_PRODUCT_STATES:,} states",
        ),
        # and so is the time to build it
        (
            {"type": "string", "allOf": [{"pattern": "^(a*b?c?){0,2000}$"}, {"pattern": "^[abc]{0,900}$"}]},
            "visits more than 2,000,000 states",
        ),
        # one regex for both is what the validator checks the merged schema with
        (
            {"type": "string", "allOf": [{"pattern": "(?P<x>a)"}, {"pattern": "(?P<x>b)"}]},
            "no one regex for both compiles",
        ),
    ],
)
def test_patterns_with_no_product_are_refused_with_the_reason(schema: dict[str, Any], says: str) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [(r.path, r.construct) for r in compiled.refusals] == [("$", "pattern")]
    assert says in compiled.refusals[0].message


_ATOMS = ["a", "b", "c", "[ab]", "[^a]", ".", "\\d", "[a-c]", "(ab|c)", "((a|bc)*)", "(x?)", "(b|)"]


def _random_pattern(rng: random.Random) -> str:
    body = "".join(rng.choice(_ATOMS) + rng.choice(["", "", "*", "+", "?", "{1,2}"]) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.5:
        body = "^" + body
    if rng.random() < 0.5:
        body += "$"
    if rng.random() < 0.2:
        body += "|" + rng.choice(_ATOMS)
    return body


def _admits_exactly(schema: dict[str, Any], texts: list[str], *, newline_anywhere: bool = False) -> bool:
    """Does ``schema`` compile? When it does, its grammar admits no text the validator rejects,
    and rejects a valid one only for a newline that Python's ``$`` allows: at the end, or
    (``newline_anywhere``, ``$`` inside a pattern) anywhere. A refusal must be "no string"."""
    compiled = compile_schema(schema)
    if compiled.grammar is None:
        assert [r.message for r in compiled.refusals if "no string matches" not in r.message] == []
        return False
    parsed = Grammar.parse(compiled.grammar)
    check = validator(schema)
    for text in texts:
        admits, valid = parsed.matches(json.dumps(text)), check.is_valid(text)
        assert not admits or valid, (schema, text)  # a leak
        narrowed = "\n" in text if newline_anywhere else text.endswith("\n")
        assert admits or not valid or narrowed, (schema, text)
    return True


def test_random_pattern_pairs_admit_exactly_the_strings_matching_both() -> None:
    rng = random.Random(7)
    texts = sorted({"".join(rng.choice("abcx1\n") for _ in range(k)) for k in range(7) for _ in range(40)})
    compiled_count = 0
    for _ in range(120):
        lengths: dict[str, int] = {}
        if rng.random() < 0.3:
            lengths["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            lengths["maxLength"] = rng.randint(3, 6)
        schema = {"type": "string", **lengths, "allOf": [{"pattern": _random_pattern(rng)} for _ in range(2)]}
        compiled_count += _admits_exactly(schema, texts)
    assert compiled_count > 80


# o76776 of JSONSchemaBench's Github_hard: a path whose segments each end at a "/" or at the end
_SEGMENTS = "^(\\/?((\\.{2})|([a-z0-9][a-z0-9\\-.]*[a-z0-9]+)|([a-z0-9]*))($|\\/))+$"


@pytest.mark.parametrize(
    ("pattern", "texts", "admitted"),
    [
        (
            _SEGMENTS,
            ["a/b", "/a/b/", "..", "a/../b", "a//b", "/", "", "a/b/c-d.e", "A", "a-", "a/B", "a/b\n", "-a"],
            ["a/b", "/a/b/", "..", "a/../b", "a//b", "/", "", "a/b/c-d.e"],
        ),
        # a field list: each item after the start or a comma (which may also lead)
        ("^((^|,)[a-z]+)*$", ["a", "a,b", ",a", "a,,b", "", "ab,cd,e", "a,", "a b"], ["a", "a,b", ",a", "", "ab,cd,e"]),
        # an anchor inside an unanchored search: "x" at the start, or a "y" anywhere
        ("(^x|y)", ["x", "xa", "ax", "y", "aya", "a", ""], ["x", "xa", "y", "aya"]),
        # "$" inside, and something after it: only a "b" can follow a "1"
        ("^a(1$|2)b?$", ["a1", "a1b", "a2", "a2b", "a", "a1\n"], ["a1", "a2", "a2b"]),
    ],
)
def test_anchors_inside_a_pattern_are_read_where_they_stand(
    pattern: str, texts: list[str], admitted: list[str]
) -> None:
    got, valid = verdicts({"type": "string", "pattern": pattern}, texts)
    assert got == admitted
    # where the validator accepts more, it is only a final newline (Python's $ allows one)
    assert [t for t in valid if t not in got and not t.endswith("\n")] == []


_ANCHORED = ["(a$|b)", "(^a|b)", "(c|$)", "(^|x)", "($)", "(^)", "(b$)", "((^|,)a)"]


def test_random_patterns_with_anchors_inside_admit_exactly_what_they_match() -> None:
    rng = random.Random(11)
    texts = sorted({"".join(rng.choice("abcx,1\n") for _ in range(k)) for k in range(7) for _ in range(40)})
    compiled_count = 0
    for _ in range(150):
        atoms = _ATOMS + _ANCHORED * 2
        body = "".join(rng.choice(atoms) + rng.choice(["", "", "*", "+", "?"]) for _ in range(rng.randint(1, 4)))
        patterns = [body, *([_random_pattern(rng)] if rng.random() < 0.3 else [])]
        schema = {"type": "string", "allOf": [{"pattern": p} for p in patterns]}
        compiled_count += _admits_exactly(schema, texts, newline_anywhere=True)
    assert compiled_count > 100


def test_anchors_inside_a_negated_pattern_are_still_refused() -> None:
    # a complement is only as exact as the tree's reading, and ``$`` inside is read narrower
    compiled = compile_schema({"type": "string", "not": {"pattern": "^(a$|b)"}})
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == ["not"]


def test_the_automata_of_one_schema_share_one_work_budget() -> None:
    # one such pair compiles; a schema of twelve is refused once their work together passes
    # the budget (a client's schema cannot make the compiler work for minutes)
    pair = {"type": "string", "allOf": [{"pattern": "^(a*b?c?){0,40}$"}, {"pattern": "^[abc]{0,20}$"}]}
    assert compile_schema(pair).grammar is not None
    names = [f"p{i}" for i in range(12)]
    compiled = compile_schema({"type": "object", "properties": dict.fromkeys(names, pair), "required": names})
    assert compiled.grammar is None
    [refusal] = compiled.refusals
    assert refusal.construct == "pattern" and "in one schema" in refusal.message
    assert refusal.path not in ("$.properties.p0", "$.properties.p1")  # the first ones fit


@pytest.mark.parametrize(
    ("pattern", "compiles"),
    [
        # built as a chain of about 4,000 states, 992 once minimised: compiles
        ("^[a-z0-9]{0,990}(x|$)", True),
        # a chain of about 7,900 states that stays as long minimised: refused on the cap
        ("^(a|$)[ab]{0,7900}$", False),
    ],
)
def test_minimising_a_long_chain_of_states_takes_a_few_steps_per_state(
    monkeypatch: pytest.MonkeyPatch, pattern: str, compiles: bool
) -> None:
    # each link of the chain took a round over every state: about a million state signatures
    # for the first (27 s), sixty million for the second (minutes); now tens of thousands
    signatures = [0]
    joined = automaton._joined

    def counted(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        signatures[0] += 1
        if signatures[0] > 200_000:
            raise Runaway
        return joined(ranges)

    monkeypatch.setattr(automaton, "_joined", counted)
    schema = {"type": "string", "pattern": pattern}
    compiled = compile_schema(schema)
    assert (compiled.grammar is not None) == compiles, compiled.refusals
    if compiled.grammar is None:
        assert f"needs more than {MAX_PRODUCT_STATES:,} states" in compiled.refusals[0].message
    else:
        assert invalid_walks(schema, compiled, 50) == []


def _moore_classes(dfa: Dfa) -> int:
    """How many states ``dfa`` has minimised, by Moore's rounds over every state (the reference)."""
    classes = [int(a) for a in dfa.accepting]
    while True:
        signatures: dict[tuple[Any, ...], int] = {}
        refined = []
        for s, moves in enumerate(dfa.moves):
            merged: dict[int, list[tuple[int, int]]] = {}
            for ranges, t in moves:
                merged.setdefault(classes[t], []).extend(ranges)
            key = (classes[s], tuple(sorted((tuple(normalize(r)), c) for c, r in merged.items())))
            refined.append(signatures.setdefault(key, len(signatures)))
        if len(signatures) == len(set(classes)):
            return len(signatures)
        classes = refined


def _words(dfa: Dfa, n: int) -> set[str]:
    out, stack = set(), [(0, "")]
    while stack:
        s, word = stack.pop()
        if dfa.accepting[s]:
            out.add(word)
        if len(word) < n:
            stack.extend((t, word + chr(c)) for ranges, t in dfa.moves[s] for a, z in ranges for c in range(a, z + 1))
    return out


def test_minimised_automata_are_as_small_as_moores_and_read_the_same() -> None:
    rng = random.Random(3)
    checked = 0
    for _ in range(1500):
        n = rng.randint(1, 10)
        moves: list[list[tuple[tuple[tuple[int, int], ...], int]]] = []
        for _ in range(n):
            # overlapping letters in ranges split differently: the same moves written two ways
            cuts = sorted(rng.sample(range(97, 101), rng.randint(0, 2)))
            spans = [(a, b - 1) for a, b in zip([97, *cuts], [*cuts, 101], strict=True) if a < b]
            moves.append([(((a, z),), rng.randrange(n)) for a, z in spans if rng.random() < 0.8])
        trimmed = _trimmed([rng.random() < 0.4 for _ in range(n)], moves)
        if trimmed is None:
            continue
        checked += 1
        minimal = _minimal(trimmed)
        assert len(minimal.accepting) == _moore_classes(trimmed)
        assert _words(minimal, 4) == _words(trimmed, 4)
    assert checked > 800


def test_the_work_budget_counts_each_character_span_a_class_cuts() -> None:
    # a class of 45 separate characters cuts about 90 spans per state, each read on its own:
    # charged for only the few states they reach, twelve such chains took twice the time
    # the budget stands for (about as long as the two patterns refused above)
    odd = "".join(chr(c) for c in range(0x21, 0x7E, 2) if chr(c) not in "\\]^-[")
    names = [f"p{i}" for i in range(12)]
    chains = {n: {"type": "string", "pattern": f"^[{odd}]{{0,{900 + i}}}(x|$)"} for i, n in enumerate(names)}
    assert compile_schema(chains["p0"]).grammar is not None
    compiled = compile_schema({"type": "object", "properties": chains, "required": names})
    assert compiled.grammar is None
    [refusal] = compiled.refusals
    assert "in one schema" in refusal.message
    assert refusal.path in {f"$.properties.p{i}" for i in range(5, 9)}


def test_each_span_is_looked_up_once_however_many_moves_read_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A product state of hundreds of NFA states (``\\p{L}{9,46}``, ``a{11,48}``) reads a few
    classes, but each character span was looked up in the ranges of every move out of them
    (7.2 million lookups here, 39 s for another 422-byte schema) while the budget charged 3
    units a span: the moves are grouped by class and each class's spans found in one pass, so
    no more spans are looked up than the budget pays for."""
    pattern = "(.?bc?|[a-z]{8}y|.(\\p{L}{9,46}(a{17,}|azyb0axxcy){7}|.b*xz1x*b*)xc(a00*.)?|x{16,}[^\\d])a{11,48}."
    lookups: list[int] = []
    real = automaton._covers

    def counted(ranges: Any, lo: int) -> bool:
        lookups.append(lo)
        return real(ranges, lo)

    monkeypatch.setattr(automaton, "_covers", counted)
    [refusal] = compile_schema({"type": "string", "not": {"pattern": pattern}}).refusals
    assert "in one schema" in refusal.message
    assert len(lookups) <= automaton.WORK // automaton.SPAN_WORK


def test_the_classes_covering_each_span_are_those_a_lookup_finds() -> None:
    rng = random.Random(11)
    for _ in range(300):
        groups: list[tuple[tuple[tuple[int, int], ...], list[int]]] = []
        for _ in range(rng.randint(1, 6)):
            points = sorted(rng.sample(range(0, 60), 2 * rng.randint(1, 4)))
            ranges = normalize([(points[i], points[i + 1]) for i in range(0, len(points), 2)])
            groups.append((tuple(ranges), [rng.randrange(9)]))
        cuts = sorted({0, 61} | {b for ranges, _ in groups for a, z in ranges for b in (a, z + 1)})
        covering = automaton._covering(groups, cuts)
        for span, a in enumerate(cuts[:-1]):
            assert covering[span] == [i for i, (ranges, _) in enumerate(groups) if automaton._covers(ranges, a)]


def test_a_class_is_clipped_once_however_often_its_repeat_is_written_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A counted repeat wrote its class out again for each copy, each clipped to the universe
    anew (``\\p{L}``: 1,300 range pairs compared each time): once per class now, one tuple
    for all its moves, which the product then groups by identity."""
    clipped: list[int] = []
    real = automaton._clip

    def counted(ranges: Any, universe: Any) -> Any:
        clipped.append(len(ranges))
        return real(ranges, universe)

    monkeypatch.setattr(automaton, "_clip", counted)
    assert compile_schema({"type": "string", "not": {"pattern": "^[a-z]{1,90}x$"}}).grammar is not None
    assert len(clipped) == 2  # the class and the x


@pytest.mark.parametrize(
    ("pattern", "texts", "admitted"),
    [
        # Python's re reads "{,}" as "*" (and "{,2}" as "{0,2}"), not as the text "{,}"
        ("^a{,}$", ["", "a", "aaa", "a{,}", "{,}"], ["", "a", "aaa"]),
        ("^(x|$)b{,}$", ["", "x", "xbb", "b", "x{,}", "xb{,}"], ["", "x", "xbb"]),
        ("^a{,2}b$", ["b", "ab", "aab", "aaab", "a{,2}b"], ["b", "ab", "aab"]),
        # "{}" is the text
        ("^a{}$", ["a{}", "a", ""], ["a{}"]),
    ],
)
def test_braces_are_read_as_pythons_re_reads_them(pattern: str, texts: list[str], admitted: list[str]) -> None:
    got, valid = verdicts({"type": "string", "pattern": pattern}, texts)
    assert valid == admitted
    assert got == admitted


_INSIDE = ["(a$|b)", "(^a|b)", "(c|$)", "(^|x)", "(^)*", "($)*", "(a|$)+", "(^|,)", "(/|$)", "(b|$){,2}", "a{,}"]


def _inner_anchor_pattern(rng: random.Random) -> str:
    parts = [rng.choice(_ATOMS + _INSIDE * 2) for _ in range(rng.randint(1, 3))]
    body = "".join(p + ("" if p[-1] in "*+}" else rng.choice(["", "", "+", "?"])) for p in parts)
    return ("^" if rng.random() < 0.4 else "") + body + ("$" if rng.random() < 0.4 else "")


def _placed(rng: random.Random, pattern: str) -> dict[str, Any]:
    """``pattern`` where a string meets it: a value (beside length bounds or a format), a
    patternProperties key, a propertyNames."""
    place = rng.randrange(4)
    if place == 0:
        return {"type": "string", "pattern": pattern, "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 6)}
    if place == 1:
        return {"type": "string", "pattern": pattern, "format": rng.choice(["hostname", "email", "date"])}
    if place == 2:
        extra = rng.choice([False, {"type": "boolean"}])
        return {"type": "object", "patternProperties": {pattern: {"type": "integer"}}, "additionalProperties": extra}
    return {"type": "object", "propertyNames": {"pattern": pattern}, "properties": {"a": {"type": "integer"}}}


def test_random_patterns_with_anchors_inside_in_keys_formats_and_lengths_admit_only_matches() -> None:
    rng = random.Random(17)
    texts = sorted({"".join(rng.choice("abcx,/1.@\n") for _ in range(k)) for k in range(8) for _ in range(30)})
    compiled_count = walks = 0
    for _ in range(120):
        schema = _placed(rng, _inner_anchor_pattern(rng))
        compiled = compile_schema(schema)
        if compiled.grammar is None:
            continue
        compiled_count += 1
        assert invalid_walks(schema, compiled, 20, compiled_count) == [], schema
        walks += 20
        parsed = Grammar.parse(compiled.grammar)
        check = validator(schema)
        values: list[Any] = list(texts)
        if schema["type"] == "object":
            values = [{t: rng.choice([1, "s", True]) for t in rng.sample(texts, rng.randint(0, 2))} for _ in range(200)]
        for value in values:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            assert not parsed.matches(text) or check.is_valid(value), (schema, text)
    assert compiled_count > 90
