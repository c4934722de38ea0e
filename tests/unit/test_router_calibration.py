"""Router bars calibrated on the intents' own examples; none-of-these and the decide tier's probability."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from localllm.config import Intent
from localllm.embed.embedder import EmbedderIdentity
from localllm.embed.registry import lookup
from localllm.embed.router import NONE_OF_THESE, Router, calibrate, default_bars
from localllm.errors import ConfigError, EmbedError
from localllm.loading import load_config


class Table:
    """An embedder that looks vectors up by text (so every cosine is known by hand)."""

    identity = EmbedderIdentity("table", 3, "none", "", "")

    def __init__(self, vectors: Mapping[str, Sequence[float]]) -> None:
        self.vectors = vectors

    def embed(self, texts: Sequence[str], role: str) -> np.ndarray:
        return np.array([self.vectors[t] for t in texts], dtype=np.float64)


# a1·a2 = .8; b1·b2 = .5; a2·b1 = .6; a2·b2 = .3; a1·b1 = a1·b2 = 0
VECTORS = {
    "a1": (1.0, 0.0, 0.0),
    "a2": (0.8, 0.6, 0.0),
    "b1": (0.0, 1.0, 0.0),
    "b2": (0.0, 0.5, math.sqrt(0.75)),
}
SMALL = [Intent("a", ("a1", "a2")), Intent("b", ("b1", "b2"))]


def test_leave_one_out_bars_by_hand() -> None:
    # in-scope (own intent present, itself left out):
    #   a1 → a .8 vs b 0 (right, margin .8); a2 → a .8 vs b .6 (right, .2)
    #   b1 → a .6 vs b .5 (WRONG, .1);       b2 → b .5 vs a .3 (right, .2)
    # out-of-scope (own intent left out; any route is wrong): a1 0, a2 .6, b1 .6, b2 .3
    # similarity bar: at .8 two of two are right (precision 1, bound .05^(1/2) = .224 < .9);
    # at .6 three of six: the bar is .8, by the observed precision (the bound cannot reach .9)
    cal = calibrate(Router(SMALL, Table(VECTORS)), target_precision=0.9)
    assert cal.confident == pytest.approx(0.8)
    # above .8: a1 (margin .8) and a2 (margin .2), both right: the lowest margin, .2
    assert cal.margin == pytest.approx(0.2)
    assert (cal.in_scope, cal.out_of_scope, cal.accepted, cal.right) == (4, 4, 2, 2)
    assert cal.coverage == pytest.approx(0.5)
    assert cal.lower_bound == pytest.approx(0.05**0.5)
    assert cal.bound_met is False
    assert cal.needed == 29  # ceil(ln .05 / ln .9)
    doc = cal.as_dict()
    assert doc["precision"] == 1.0 and doc["confident"] == 0.8


def test_enough_examples_meet_the_bound_and_route_clear_matches() -> None:
    rng = np.random.default_rng(7)
    axes = np.eye(8)
    vectors: dict[str, Sequence[float]] = {}
    intents = []
    for k, name in enumerate(("alpha", "beta")):
        examples = []
        for i in range(40):
            v = axes[k] + rng.normal(0, 0.25, 8)
            vectors[f"{name}{i}"] = tuple(v / np.linalg.norm(v))
            examples.append(f"{name}{i}")
        intents.append(Intent(name, tuple(examples)))
    near = axes[0] + rng.normal(0, 0.25, 8)
    vectors["query near alpha"] = tuple(near / np.linalg.norm(near))
    vectors["off topic"] = tuple(axes[5])
    router = Router(intents, Table(vectors), confident=0.999, margin=0.5)  # bars that route nothing
    assert router.route("query near alpha").outcome == "miss"
    cal = calibrate(router, target_precision=0.9)
    # every in-scope decision is accepted and right; a few simulated out-of-scope ones slip in,
    # within what the 90% bound allows
    assert cal.bound_met and cal.coverage == 1.0 and cal.right == 80 and cal.accepted >= 80
    assert cal.lower_bound >= 0.9 and cal.right / cal.accepted >= 0.9
    router.apply(cal)
    hit = router.route("query near alpha")
    assert (hit.outcome, hit.intent, hit.routed_by, hit.bars["source"]) == ("route", "alpha", "semantic", "calibrated")
    assert router.route("off topic").outcome == "miss"  # far from every intent


def test_a_bar_of_one_still_routes_an_example_verbatim() -> None:
    """Examples too few or too confused for any bar give ``confident`` 1.0; an input that is
    one of the examples word for word must still route, though a float32 cosine of a vector
    with itself comes out 0.99999988 here."""

    def unit(*v: float) -> tuple[float, ...]:
        a = np.array(v, dtype=np.float32)
        return tuple((a / np.linalg.norm(a)).tolist())

    # each example is nearer the other intent's example than its own: every decision is wrong
    vectors = {"a1": unit(1, 2, 3), "b1": unit(1, 2, 3.3), "a2": unit(3, -2, 0.2), "b2": unit(3, -2, 0.5)}

    class Float32(Table):
        def embed(self, texts: Sequence[str], role: str) -> np.ndarray:
            return super().embed(texts, role).astype(np.float32)

    router = Router([Intent("a", ("a1", "a2")), Intent("b", ("b1", "b2"))], Float32(vectors))
    cal = calibrate(router)
    assert (cal.confident, cal.accepted) == (1.0, 0)
    router.apply(cal)
    verdict = router.semantic("a1")
    assert verdict.similarity is not None and verdict.similarity < 1.0  # the rounding the bar must allow for
    assert (verdict.outcome, verdict.intent) == ("route", "a")
    assert router.semantic("b2").intent == "b"


def test_a_single_example_cannot_be_calibrated() -> None:
    with pytest.raises(EmbedError):
        calibrate(Router([Intent("a", ("a1",))], Table(VECTORS)))


def test_decide_tier_none_of_these_and_probability() -> None:
    router = Router(SMALL, Table({**VECTORS, "x": (0.0, 0.0, 0.0)}), decide=lambda t, c: (NONE_OF_THESE, 0.7))
    verdict = router.route("x")
    assert (verdict.outcome, verdict.intent, verdict.routed_by, verdict.confidence) == ("none", None, "llm", 0.7)
    assert verdict.turn_start_payload()["intent"] == ""
    chosen = Router(SMALL, Table({**VECTORS, "x": (0.0, 0.0, 0.0)}), decide=lambda t, c: ("b", 0.9)).route("x")
    assert (chosen.outcome, chosen.intent, chosen.confidence) == ("route", "b", 0.9)
    assert chosen.similarity == 0.0  # the embedding tier's evidence is kept beside the decision
    with pytest.raises(EmbedError):
        Router([Intent(NONE_OF_THESE, ("a1",))], Table(VECTORS))


def test_calibrate_with_fixed_bars_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "embedders: {e: {endpoint: 'http://127.0.0.1:9', model: m}}\n"
        "intents: {a: {examples: [x]}}\n"
        "router: {embedder: e, calibrate: true, confident: 0.5}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert [p.key for p in info.value.problems] == ["router.calibrate"]


def test_registry_bars_per_embedder() -> None:
    minilm = lookup("all-minilm-l6-v2")
    confident, margin, source = default_bars(minilm)
    assert source == "registry:all-minilm-l6-v2" and confident < 0.82  # MiniLM's cosines run low
    assert (minilm.router_confident, minilm.router_margin) == (confident, margin)
    assert default_bars(lookup("some-unknown-model", warn=False)) == (0.82, 0.08, "default")


def test_an_example_under_two_intents_is_named_at_load_and_refused_by_calibrate(tmp_path: Path) -> None:
    # it routes as a tie for ever; calibrating counted both its decisions wrong and chose bars
    # whose accepted decisions were 0 % right
    (tmp_path / "c.yaml").write_text(
        "intents:\n  a: {examples: [a2, same]}\n  b: {examples: [b1, b2, same]}\n  c: {examples: [same]}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    problems = info.value.problems
    assert [p.key for p in problems] == ["intents.b.examples[2]", "intents.c.examples[0]"]
    assert all("intents.a.examples[1]" in p.message and p.hint for p in problems)
    vectors = {**VECTORS, "same": (0.0, 0.0, 1.0)}
    router = Router([Intent("a", ("a1", "same")), Intent("b", ("b1", "same"))], Table(vectors))
    with pytest.raises(EmbedError) as refused:
        calibrate(router)
    assert "'same'" in str(refused.value) and "'a'" in str(refused.value) and "'b'" in str(refused.value)
    # the same example twice under one intent is not this problem
    load_config(_write(tmp_path / "d.yaml", "intents: {a: {examples: [x, x]}, b: {examples: [y]}}\n"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_an_example_repeated_under_its_intent_is_one_example() -> None:
    # b1 again under b, as pasted twice (its case and spacing differ, its vector is b1's): held
    # out, b1 found its own copy and routed right at similarity 1.0 — a decision that is wrong
    # for b1 itself (a .6 beats b .5), so the bars promised a precision new inputs do not get
    twice = [Intent("a", ("a1", "a2")), Intent("b", ("b1", "b2", " B1  "))]
    cal = calibrate(Router(twice, Table({**VECTORS, " B1  ": VECTORS["b1"]})), target_precision=0.9)
    honest = calibrate(Router(SMALL, Table(VECTORS)), target_precision=0.9)
    assert (cal.in_scope, cal.out_of_scope, cal.accepted, cal.right) == (4, 4, 2, 2)
    assert {**cal.as_dict(), "duplicates": 0} == honest.as_dict()
    assert cal.duplicates == 1 and honest.duplicates == 0


def test_an_example_under_two_intents_but_for_case_and_spacing_is_the_same_example(tmp_path: Path) -> None:
    # the same text as an embedder sees it (an uncased model: the same vector) ties for ever
    (tmp_path / "c.yaml").write_text(
        "intents:\n  a: {examples: [a1, Cancel it]}\n  b: {examples: [b1, ' cancel  IT']}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert [p.key for p in info.value.problems] == ["intents.b.examples[1]"]
    assert "intents.a.examples[1]" in info.value.problems[0].message
    router = Router(
        [Intent("a", ("a1", "Cancel it")), Intent("b", ("b1", " cancel  IT"))],
        Table({**VECTORS, "Cancel it": (0.0, 0.0, 1.0), " cancel  IT": (0.0, 0.0, 1.0)}),
    )
    with pytest.raises(EmbedError):
        calibrate(router)
    # under one intent it loads: calibration counts it once
    load_config(_write(tmp_path / "d.yaml", "intents: {a: {examples: [x, ' X']}, b: {examples: [y]}}\n"))


def test_held_out_cases_are_routed_over_every_example() -> None:
    from localllm.embed.router import _held_out

    vectors = {**VECTORS, "qa": (1.0, 0.0, 0.0), "qb": (0.0, 1.0, 0.0), "qz": (0.0, 0.0, 1.0)}
    router = Router(SMALL, Table(vectors))
    # qa: a 1.0 (a1) vs b 0 → a, right; qb labelled a: b 1.0 (b1) vs a .6 (a2) → b, wrong;
    # qz of no intent: b .866 (b2) vs a 0 → routes, so wrong, and out of scope
    decisions = _held_out(router, [("qa", "a"), ("qb", "a"), ("qz", NONE_OF_THESE)])
    got = [(round(d.similarity, 3), round(d.margin, 3), d.correct, d.in_scope) for d in decisions]
    assert got == [(1.0, 1.0, True, True), (1.0, 0.4, False, True), (0.866, 0.866, False, False)]


def test_bars_certified_on_held_out_cases() -> None:
    vectors = dict(VECTORS)
    cases: list[tuple[str, str]] = []
    for i in range(30):  # a at 1.0 (a1), b at .866 (b2): every one right
        vectors[f"qa{i}"], vectors[f"qb{i}"] = (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)
        cases += [(f"qa{i}", "a"), (f"qb{i}", "b")]
    for i in range(5):  # of no intent, best a at 0 (margin .5): wrong, below every bar
        vectors[f"qz{i}"] = (0.0, -1.0, 0.0)
        cases.append((f"qz{i}", NONE_OF_THESE))
    cases.append((" A1", "a"))  # the example a1 (case and spacing aside): not held out
    cal = calibrate(Router(SMALL, Table(vectors)), target_precision=0.9, cases=cases)
    # strictest first: 1.0 takes 30 of 30 right (bound .05^(1/30) = .905), .866 takes 60 of 60
    # (.951); 0 would take the 5 wrong too (60 of 65, bound < .9): the sequence stops there
    assert cal.confident == pytest.approx(0.866, abs=1e-3) and cal.margin == 0.0
    assert (cal.bound_met, cal.source, cal.cases, cal.dropped_cases) == (True, "cases", 65, 1)
    assert (cal.in_scope, cal.out_of_scope, cal.accepted, cal.right) == (60, 5, 60, 60)
    assert cal.lower_bound == pytest.approx(0.05 ** (1 / 60)) and cal.coverage == 1.0
    doc = cal.as_dict()
    assert (doc["source"], doc["cases"], doc["dropped_cases"]) == ("cases", 65, 1)
    assert calibrate(Router(SMALL, Table(vectors))).as_dict()["source"] == "leave-one-out"


def test_held_out_cases_must_name_a_declared_intent_and_not_all_be_examples() -> None:
    router = Router(SMALL, Table({**VECTORS, "q": (1.0, 0.0, 0.0)}))
    with pytest.raises(EmbedError) as caught:
        calibrate(router, cases=[("q", "c")])
    assert "'c'" in str(caught.value)
    with pytest.raises(EmbedError) as caught:
        calibrate(router, cases=[("a1", "a"), ("B2", "b")])
    assert "2 are examples" in str(caught.value)


def test_a_held_out_case_repeated_is_one_answer_of_evidence() -> None:
    # 15 inputs of a and 15 of b, each pasted again (as given, or but for case and spacing: the
    # same vector). Before: 60 right decisions where 30 were ever made, certified (lower bound
    # 0.951), where the 30 alone certify nothing
    vectors = dict(VECTORS)
    once: list[tuple[str, str]] = []
    again: list[tuple[str, str]] = []
    for i in range(15):
        vectors[f"qa{i}"] = vectors[f" QA{i} "] = (1.0, 0.0, 0.0)
        vectors[f"qb{i}"] = (0.0, 0.0, 1.0)
        once += [(f"qa{i}", "a"), (f"qb{i}", "b")]
        again += [(f" QA{i} ", "a"), (f"qb{i}", "b")]
    router = Router(SMALL, Table(vectors))
    cal = calibrate(router, target_precision=0.9, cases=[*once, *again, ("A1", "a")])
    honest = calibrate(router, target_precision=0.9, cases=once)
    assert (cal.cases, cal.duplicate_cases, cal.dropped_cases) == (30, 30, 1)
    assert (cal.in_scope, cal.accepted, cal.right) == (30, 30, 30)
    assert {**cal.as_dict(), "duplicate_cases": 0, "dropped_cases": 0} == honest.as_dict()
    assert honest.duplicate_cases == 0
    # only repeats and examples: nothing held out, and the error says why
    with pytest.raises(EmbedError) as caught:
        calibrate(router, cases=[("a1", "a"), ("A1", "a")])
    assert "1 are examples, 1 repeat another" in caught.value.message


def test_a_held_out_text_under_two_intents_is_refused_naming_both_cases() -> None:
    router = Router(SMALL, Table({**VECTORS, "q": (1.0, 0.0, 0.0), "r": (0.0, 1.0, 0.0), " Q": (1.0, 0.0, 0.0)}))
    with pytest.raises(EmbedError) as caught:
        calibrate(router, cases=[("q", "a"), ("r", "b"), (" Q", NONE_OF_THESE)])
    assert "case 2 (' Q')" in caught.value.message and "case 0 ('q')" in caught.value.message
    assert "case 0 or case 2" in caught.value.hint


def test_route_cases_file_names_both_lines_of_a_text_under_two_intents(tmp_path: Path) -> None:
    from localllm.embed.router import load_route_cases

    path = tmp_path / "cases.jsonl"
    path.write_text(
        '{"text": "Cancel it", "intent": "a"}\n'
        '{"text": "hi", "intent": "b"}\n'
        '{"text": " cancel  IT", "intent": "a"}\n'  # line 1 again: read, calibration counts it once
        '{"args": {"text": "CANCEL IT"}, "expect": {"intent": "b"}}\n'
        '{"text": "hi", "intent": "none_of_these"}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_route_cases(path, ["a", "b"])
    problems = caught.value.problems
    assert [(p.file, p.key) for p in problems] == [(str(path), "line 4.expect.intent"), (str(path), "line 5.intent")]
    assert ["line 1" in problems[0].message, "line 2" in problems[1].message] == [True, True]
    assert "line 1 or line 4" in problems[0].hint
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    assert load_route_cases(path, ["a", "b"]) == [("Cancel it", "a"), ("hi", "b"), (" cancel  IT", "a")]


def test_fixed_sequence_stops_at_the_first_failure_where_the_lowest_passing_goes_on() -> None:
    from localllm.calibrate import choose_threshold, fixed_sequence_threshold

    # 40 right at distinct high scores, then 10 wrong at one score (40 of 50: fails), then
    # 400 right below: 440 of 450 passes again, so the lowest passing bar is far below
    scores = [0.99 - i * 0.001 for i in range(40)] + [0.9] * 10 + [0.5 - i * 0.0001 for i in range(400)]
    correct = [True] * 40 + [False] * 10 + [True] * 400
    plain = ((1.0, 0.0),)
    lowest = choose_threshold(scores, correct, 0.9)
    fixed = fixed_sequence_threshold(scores, correct, 0.9, starts=plain)
    assert lowest.value == pytest.approx(scores[-1]) and lowest.coverage == 1.0
    assert fixed.value == pytest.approx(scores[39]) and round(fixed.coverage * fixed.n) == 40
    assert fixed.lower_bound == pytest.approx(0.05 ** (1 / 40))
    # the sequence starts where a bar could pass (29 answers at 0.9): one wrong answer among
    # the strictest 29 ends it before anything is accepted
    assert fixed_sequence_threshold(
        [0.9] * 28 + [0.8] + [0.5] * 100, [True] * 28 + [False] + [True] * 100, 0.9, starts=plain
    ).accepts_nothing
    # the default's second sequence (a fifth of the budget, from half the answers) goes on
    # past the failure, certified at level 0.01
    fallback = fixed_sequence_threshold(scores, correct, 0.9)
    assert fallback.value == pytest.approx(scores[-1]) and fallback.coverage == 1.0
    assert 0.9 <= fallback.lower_bound < lowest.lower_bound


def test_route_cases_file_lines_and_keys(tmp_path: Path) -> None:
    from localllm.embed.router import load_route_cases

    good = tmp_path / "cases.jsonl"
    good.write_text(
        '{"text": "hi", "intent": "a"}\n\n{"id": "x", "args": {"text": "bye"}, "expect": {"intent": "none_of_these"}}\n'
    )
    assert load_route_cases(good, ["a", "b"]) == [("hi", "a"), ("bye", NONE_OF_THESE)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi", "intent": "a"}\n{"text": "x"}\nnot json\n{"text": "y", "intent": "zz"}\n')
    with pytest.raises(ConfigError) as caught:
        load_route_cases(bad, ["a", "b"])
    assert [(p.file, p.key) for p in caught.value.problems] == [
        (str(bad), "line 2.intent"),
        (str(bad), "line 3"),
        (str(bad), "line 4.intent"),
    ]


def test_calibration_cases_in_the_config_resolve_under_it_and_are_checked_at_load(tmp_path: Path) -> None:
    head = "embedders: {e: {endpoint: 'http://127.0.0.1:9', model: m}}\nintents: {a: {examples: [x]}}\n"
    (tmp_path / "held").mkdir()
    cases = tmp_path / "held" / "cases.jsonl"
    cases.write_text('{"text": "y", "intent": "a"}\n{"text": "z", "intent": "none_of_these"}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(head + "router: {embedder: e, calibrate: true, calibration_cases: held/cases.jsonl}\n")
    router = load_config(cfg).router
    assert router is not None and router.calibration_cases == cases
    cases.write_text('{"text": "y", "intent": "a"}\n{"text": "z", "intent": "b"}\n')
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    [problem] = info.value.problems
    assert problem.key == "router.calibration_cases" and problem.message.startswith(f"{cases} line 2.intent:")
    cfg.write_text(head + "router: {embedder: e, calibration_cases: held/cases.jsonl}\n")  # calibrate is off
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert "router.calibration_cases" in [p.key for p in info.value.problems]
