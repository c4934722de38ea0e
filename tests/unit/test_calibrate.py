"""The calibration maths against values computed by hand (or from closed forms)."""

from __future__ import annotations

import math

import pytest

from localllm.calibrate import (
    CurvePoint,
    Threshold,
    choose_threshold,
    coverage_precision,
    expected_calibration_error,
    novelty_bar,
    precision_lower_bound,
    risk_coverage,
    split,
)


def test_risk_coverage_one_point_per_distinct_score_highest_first() -> None:
    scores = [0.9, 0.8, 0.8, 0.5]
    correct = [True, True, False, False]
    assert risk_coverage(scores, correct) == [
        CurvePoint(0.9, 1, 0.25, 1.0),
        CurvePoint(0.8, 3, 0.75, 2 / 3),  # the tie enters together
        CurvePoint(0.5, 4, 1.0, 0.5),
    ]


def test_risk_coverage_degenerate_inputs() -> None:
    assert risk_coverage([], []) == []
    assert risk_coverage([0.7, 0.7], [False, False]) == [CurvePoint(0.7, 2, 1.0, 0.0)]
    with pytest.raises(ValueError):
        risk_coverage([0.5], [True, False])
    with pytest.raises(ValueError):
        risk_coverage([1.5], [True])


def test_expected_calibration_error_by_hand() -> None:
    # bin [0.9,1.0]: scores 0.9, 1.0 → mean 0.95, accuracy 0.5 → |0.45| · 2/4
    # bin [0.2,0.3): score 0.2 → accuracy 0 → 0.2 · 1/4 ; bin [0.6,0.7): 0.6 → acc 1 → 0.4 · 1/4
    ece = expected_calibration_error([0.9, 1.0, 0.2, 0.6], [True, False, False, True])
    assert ece == pytest.approx(0.45 * 0.5 + 0.2 * 0.25 + 0.4 * 0.25)
    assert expected_calibration_error([], []) == 0.0
    assert expected_calibration_error([1.0, 0.0], [True, False]) == 0.0  # perfectly calibrated
    assert expected_calibration_error([0.5, 0.5], [True, False], bins=1) == 0.0
    with pytest.raises(ValueError):
        expected_calibration_error([0.5], [True], bins=0)


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (10, 10, 0.05 ** (1 / 10)),  # k == n: (1 - c) ** (1/n) = 0.7411
        (1, 1, 0.05),
        (1, 10, 1 - 0.95 ** (1 / 10)),  # k == 1: 1 - (1-(1-c)) ** (1/n) = 0.005116
        (9, 10, 0.6058),  # the lower end of the two-sided 90% Clopper–Pearson interval for 9/10
        (5, 10, 0.2224),  # ... and for 5/10
        (0, 10, 0.0),
        (0, 0, 0.0),
    ],
)
def test_precision_lower_bound_clopper_pearson(k: int, n: int, expected: float) -> None:
    assert precision_lower_bound(k, n, 0.95) == pytest.approx(expected, abs=5e-5)


def test_precision_lower_bound_grows_with_evidence_and_rejects_nonsense() -> None:
    assert precision_lower_bound(19, 20) < precision_lower_bound(95, 100) < precision_lower_bound(950, 1000) < 0.95
    assert precision_lower_bound(9, 10, 0.99) < precision_lower_bound(9, 10, 0.9)
    for k, n, c in [(3, 2, 0.95), (-1, 2, 0.95), (1, 2, 1.0), (1, 2, 0.0)]:
        with pytest.raises(ValueError):
            precision_lower_bound(k, n, c)


def test_choose_threshold_takes_the_lowest_threshold_meeting_the_bound() -> None:
    # 20 right answers at 0.9, then 2 wrong at 0.5, then 18 right at 0.4
    scores = [0.9] * 20 + [0.5] * 2 + [0.4] * 18
    correct = [True] * 20 + [False] * 2 + [True] * 18
    # target 0.8: at 0.9 bound is 0.05**(1/20) = 0.8609 ok; at 0.5, 20/22 → bound 0.74 no;
    # at 0.4, 38/40 → bound ≈ 0.852 ok → lowest is 0.4
    chosen = choose_threshold(scores, correct, 0.8)
    assert chosen.value == 0.4
    assert chosen.coverage == 1.0
    assert chosen.precision == pytest.approx(38 / 40)
    assert chosen.lower_bound == pytest.approx(precision_lower_bound(38, 40))
    assert chosen.n == 40
    # target 0.86: only the top 20 qualify (0.8609)
    top = choose_threshold(scores, correct, 0.86)
    assert (top.value, top.coverage, top.precision) == (0.9, 0.5, 1.0)
    assert top.accepts(0.95) and top.accepts(0.9) and not top.accepts(0.89) and not top.accepts(None)


def test_choose_threshold_accepts_nothing_when_the_evidence_is_too_small() -> None:
    # 5 of 5 right: the bound is 0.05 ** 0.2 = 0.549, far below 0.95
    chosen = choose_threshold([0.99] * 5, [True] * 5, 0.95)
    assert chosen == Threshold(math.inf, 0.0, 0.0, 0.0, 5)
    assert chosen.accepts_nothing and not chosen.accepts(1.0)
    assert chosen.to_dict()["value"] is None
    assert choose_threshold([], [], 0.9).accepts_nothing


def test_coverage_precision_at_a_threshold() -> None:
    assert coverage_precision([0.9, 0.8, 0.1], [True, False, True], 0.5) == (2 / 3, 0.5, 2)
    assert coverage_precision([0.9], [True], math.inf) == (0.0, 0.0, 0)
    assert coverage_precision([], [], 0.5) == (0.0, 0.0, 0)


def test_split_is_deterministic_and_stratified() -> None:
    items = [("a", i) for i in range(10)] + [("b", i) for i in range(4)]
    cal, held = split(items, 0.5, seed=7, key=lambda it: it[0])
    assert split(items, 0.5, seed=7, key=lambda it: it[0]) == (cal, held)
    assert sorted(cal + held) == sorted(items)
    assert sum(1 for it in held if it[0] == "a") == 5
    assert sum(1 for it in held if it[0] == "b") == 2
    assert cal == [it for it in items if it in cal]  # input order kept
    assert split(items, 0.5, seed=8, key=lambda it: it[0]) != (cal, held)
    plain_cal, plain_held = split(list(range(10)), 0.3, seed=1)
    assert len(plain_held) == 3 and len(plain_cal) == 7
    assert split([], 0.5, seed=1) == ([], [])
    assert split([1, 2], 0.0, seed=1) == ([1, 2], [])
    with pytest.raises(ValueError):
        split([1], 1.5, seed=1)


def test_novelty_bar_is_the_highest_out_of_scope_score_with_a_conformal_bound() -> None:
    bar = novelty_bar([0.2, 0.5, 0.3])
    assert (bar.value, bar.n, bar.pass_rate_bound) == (0.5, 3, 0.25)  # 1 / (3 + 1)
    assert bar.admits(0.51) and not bar.admits(0.5) and not bar.admits(0.1)  # strictly above
    assert bar.to_dict() == {"value": 0.5, "n": 3, "pass_rate_bound": 0.25}
    negative = novelty_bar([-0.7, -0.2])
    assert negative.value == -0.2 and negative.admits(0.0)
    none = novelty_bar([])
    assert none.value == -math.inf and not none.measured and none.pass_rate_bound == 1.0
    assert none.admits(-5.0) and none.to_dict()["value"] is None
    with pytest.raises(ValueError):
        novelty_bar([0.1, math.nan])


def test_choose_threshold_is_the_lowest_qualifying_point_of_the_curve() -> None:
    """Checked against the definition: every curve point's bound computed, the lowest
    threshold that meets the target kept (the function now skips points whose precision is
    below the target and stops at the first that qualifies, lowest first)."""
    import random

    from localllm.calibrate import precision_lower_bound, risk_coverage

    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(0, 60)
        scores = [round(rng.random(), rng.choice([1, 2, 6])) for _ in range(n)]
        correct = [rng.random() < 0.3 + 0.7 * s for s in scores]
        target = rng.choice([0.5, 0.8, 0.9, 1.0])
        want = None
        for point in risk_coverage(scores, correct):
            bound = precision_lower_bound(round(point.precision * point.accepted), point.accepted, 0.95)
            if bound >= target:
                want = (point.threshold, bound)
        got = choose_threshold(scores, correct, target)
        assert (got.value, got.lower_bound) == want if want else got.accepts_nothing


def test_choose_threshold_computes_no_bound_a_point_cannot_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bound is an O(n) bisection: computing it at every point made `localllm run` of a
    min_precision gate pay 7.5 s for 2,000 scored answers."""
    import random

    from localllm import calibrate

    rng = random.Random(1)
    scores = [round(rng.random(), 6) for _ in range(2000)]
    correct = [rng.random() < 0.5 + s / 2 for s in scores]
    calls = []
    real = calibrate.precision_lower_bound

    def counted(k: int, n: int, confidence: float = 0.95) -> float:
        calls.append(n)
        return real(k, n, confidence)

    monkeypatch.setattr(calibrate, "precision_lower_bound", counted)
    found = choose_threshold(scores, correct, 0.9)
    possible = sum(p.precision >= 0.9 for p in calibrate.risk_coverage(scores, correct))
    assert not found.accepts_nothing
    assert len(calls) <= possible < len(set(scores))  # before: one per distinct score (2,000)


def _fallback_by_definition(
    scores: list[float], correct: list[bool], target: float, starts: list[tuple[float, float]]
) -> tuple[float, float] | None:
    """Wiens' fallback procedure written out: a level per hypothesis, a rejection's level
    added to the next hypothesis' own (0.05 in all)."""
    points = risk_coverage(scores, correct)
    levels = [0.0] * len(points)
    for share, at in starts:
        needed = math.ceil(math.log(share * 0.05) / math.log(target))
        for i, p in enumerate(points):
            if p.accepted >= needed and p.accepted >= at * len(scores):
                levels[i] += share * 0.05
                break
    rejected: list[tuple[float, float]] = []
    carry = 0.0
    for own, p in zip(levels, points, strict=True):
        level = own + carry
        bound = precision_lower_bound(round(p.precision * p.accepted), p.accepted, 1 - level) if level else 0.0
        carry = level if bound >= target else 0.0
        if bound >= target:
            rejected.append((p.threshold, bound))
    return min(rejected) if rejected else None


def test_fixed_sequence_with_fallback_is_wiens_procedure() -> None:
    import random

    from localllm.calibrate import fixed_sequence_threshold

    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(0, 300)
        scores = [round(rng.random(), rng.choice([1, 2, 6])) for _ in range(n)]
        correct = [rng.random() < rng.choice([0.97, 0.6 + 0.4 * s]) for s in scores]
        target = rng.choice([0.8, 0.9])
        starts = rng.choice([[(0.8, 0.0), (0.2, 0.5)], [(1.0, 0.0)], [(0.3, 0.0), (0.3, 0.2), (0.4, 0.9)]])
        want = _fallback_by_definition(scores, correct, target, starts)
        got = fixed_sequence_threshold(scores, correct, target, starts=starts)
        assert (got.value, got.lower_bound) == want if want else got.accepts_nothing


def test_fixed_sequence_keeps_its_promise_and_the_fallback_buys_coverage() -> None:
    """On independent answers: below the target at every score, some bar is certified in at
    most ~5 % of calibrations; 97 % right at every score, the plain sequence (ended by one
    wrong answer among its strictest 29) certifies nothing in most calibrations and the
    default's second start in few."""
    import random

    from localllm.calibrate import fixed_sequence_threshold

    rng = random.Random(11)
    plain = ((1.0, 0.0),)

    def draws(p: float, n: int, times: int) -> list[tuple[list[float], list[bool]]]:
        return [([rng.random() for _ in range(n)], [rng.random() < p for _ in range(n)]) for _ in range(times)]

    below = draws(0.88, 200, 300)
    assert sum(not fixed_sequence_threshold(s, c, 0.9).accepts_nothing for s, c in below) <= 0.06 * 300
    flat = draws(0.97, 400, 60)
    plain_none = sum(fixed_sequence_threshold(s, c, 0.9, starts=plain).accepts_nothing for s, c in flat)
    fallback_none = sum(fixed_sequence_threshold(s, c, 0.9).accepts_nothing for s, c in flat)
    assert plain_none >= 30 and fallback_none <= 6


@pytest.mark.parametrize("starts", [(), ((0.0, 0.0),), ((0.5, 1.5),), ((0.7, 0.0), (0.7, 0.5)), ((1.2, 0.0),)], ids=str)
def test_fixed_sequence_refuses_starts_that_spend_no_budget_or_too_much(
    starts: tuple[tuple[float, float], ...],
) -> None:
    from localllm.calibrate import fixed_sequence_threshold

    with pytest.raises(ValueError, match="starts"):
        fixed_sequence_threshold([0.9, 0.8], [True, True], 0.9, starts=starts)
