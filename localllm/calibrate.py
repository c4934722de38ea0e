"""Calibration maths for per-answer confidence: curves, error, bounds, thresholds, splits.

An answer carries a confidence score in [0, 1]; an evaluation says whether it was correct.
Accepting every answer whose score is at least ``t`` gives, over a set of scored answers:

- **coverage**: the share of answers accepted (answered locally);
- **precision**: the share of the accepted answers that are correct.

:func:`risk_coverage` lists that pair for every distinct score (highest first, so coverage
only grows along the list). :func:`choose_threshold` picks the lowest ``t`` whose accepted
set is correct often enough *with statistical confidence*: the one-sided Clopper–Pearson
lower bound of its precision (:func:`precision_lower_bound`) must meet the target, so a
small evaluation cannot claim 95% from 5 of 5. :func:`fixed_sequence_threshold` tests the
same thresholds strictest first, in sequences that end at their first failure (Wiens'
fallback procedure), so on independent answers the 95% holds for the threshold it returns.
When no threshold qualifies the answer is "accept nothing": ``Threshold.value`` is
``math.inf`` (``None`` in :meth:`Threshold.to_dict`) and every answer escalates.

:func:`novelty_bar` is the out-of-scope rule's bar: from the novelty scores of inputs
known to be out of scope (for the examples tier: its out-of-scope examples, or each
example scored as if its own label were unknown), the highest of them, so that a new
out-of-scope input exchangeable with them clears it with probability at most
``1 / (n + 1)`` (split-conformal at the strictest level ``n`` scores support).

:func:`expected_calibration_error` is the usual equal-width-bin ECE; :func:`split` is the
deterministic (optionally stratified) calibration/held-out split.

:func:`same_text` is what leave-one-out holds out with an example: every example of the same
text, as an embedder sees it (a held-out example that finds its own twin is scored as if it
had been seen, and the bar measured on it is optimistic).

A leaf module: plain Python, it imports nothing from localllm.
"""

from __future__ import annotations

import math
import random
import unicodedata
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "CurvePoint",
    "NoveltyBar",
    "Threshold",
    "choose_threshold",
    "coverage_precision",
    "expected_calibration_error",
    "fixed_sequence_threshold",
    "novelty_bar",
    "precision_lower_bound",
    "risk_coverage",
    "same_text",
    "score_of",
    "split",
]

T = TypeVar("T")


@dataclass(frozen=True)
class CurvePoint:
    """Accepting every answer scored ``>= threshold``: how many, what share, how many right."""

    threshold: float
    accepted: int
    coverage: float
    precision: float


@dataclass(frozen=True)
class Threshold:
    """The chosen acceptance threshold and what it achieved on the data it was chosen on.

    ``value`` is ``math.inf`` when no threshold meets the target: accept nothing (then
    ``coverage`` is 0.0 and ``precision`` and ``lower_bound`` are 0.0). ``n`` is the number
    of scored answers the choice was made on; ``round(coverage * n)`` were accepted.
    """

    value: float
    coverage: float
    precision: float
    lower_bound: float
    n: int

    @property
    def accepts_nothing(self) -> bool:
        return math.isinf(self.value)

    def accepts(self, score: float | None) -> bool:
        """Whether an answer with this confidence is accepted (a missing score never is)."""
        return score is not None and not self.accepts_nothing and score >= self.value

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-safe: ``value`` is ``None`` for "accept nothing"."""
        return {
            "value": None if self.accepts_nothing else self.value,
            "coverage": self.coverage,
            "precision": self.precision,
            "lower_bound": self.lower_bound,
            "n": self.n,
        }


def score_of(value: object) -> float | None:
    """``value`` as a confidence score: a finite number in [0, 1], else ``None`` ("not
    calibrated"). One rule for the evidence and the runtime, so an answer the evaluation
    could not score (a plugin's ``95`` meaning 95 %, ``2**1024``, ``true``) is never
    accepted at run time either."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past the float range
        return None
    return number if 0.0 <= number <= 1.0 else None  # NaN fails both comparisons


def _check(scores: Sequence[float], correct: Sequence[bool]) -> None:
    if len(scores) != len(correct):
        raise ValueError(f"scores and correct differ in length ({len(scores)} vs {len(correct)})")
    for s in scores:
        if not (0.0 <= float(s) <= 1.0):
            raise ValueError(f"a confidence score must be within [0, 1], got {s!r}")


def risk_coverage(scores: Sequence[float], correct: Sequence[bool]) -> list[CurvePoint]:
    """One point per distinct score, highest threshold first; empty input gives ``[]``."""
    _check(scores, correct)
    total = len(scores)
    pairs = sorted(zip((float(s) for s in scores), (bool(c) for c in correct), strict=True), key=lambda p: -p[0])
    points: list[CurvePoint] = []
    accepted = right = 0
    i = 0
    while i < total:
        score = pairs[i][0]
        while i < total and pairs[i][0] == score:  # ties enter together: a threshold takes all of them
            accepted += 1
            right += pairs[i][1]
            i += 1
        points.append(CurvePoint(score, accepted, accepted / total, right / accepted))
    return points


def coverage_precision(scores: Sequence[float], correct: Sequence[bool], threshold: float) -> tuple[float, float, int]:
    """(coverage, precision, accepted) of accepting ``score >= threshold``; precision 0.0 if none."""
    _check(scores, correct)
    took = [bool(c) for s, c in zip(scores, correct, strict=True) if float(s) >= threshold]
    if not scores:
        return 0.0, 0.0, 0
    return len(took) / len(scores), (sum(took) / len(took) if took else 0.0), len(took)


def expected_calibration_error(scores: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """Σ_b (n_b / N) · |accuracy_b − mean score_b| over ``bins`` equal-width bins of [0, 1].

    A score of exactly 1.0 falls in the last bin; a bin edge belongs to the bin above it.
    Empty input gives 0.0.
    """
    _check(scores, correct)
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if not scores:
        return 0.0
    sums = [[0.0, 0.0, 0] for _ in range(bins)]  # score sum, correct count, n
    for s, c in zip(scores, correct, strict=True):
        b = min(int(float(s) * bins), bins - 1)
        sums[b][0] += float(s)
        sums[b][1] += bool(c)
        sums[b][2] += 1
    total = len(scores)
    return sum(n / total * abs(ok / n - ssum / n) for ssum, ok, n in sums if n)


def _binomial_upper_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if p <= 0.0:
        return 1.0 if k <= 0 else 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    lg_n = math.lgamma(n + 1)
    terms = (lg_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q for i in range(k, n + 1))
    return min(1.0, sum(math.exp(t) for t in terms))


def precision_lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper–Pearson lower bound on a proportion seen as ``k`` successes of ``n``.

    The largest ``p`` with ``P(X >= k | n, p) <= 1 - confidence``: the true precision is at
    least this with the given confidence. Exact (not the Wilson approximation), found by
    bisection to 1e-12. Degenerate cases: ``n == 0`` (no evidence) and ``k == 0`` give 0.0;
    ``k == n`` has the closed form ``(1 - confidence) ** (1 / n)``.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    if n == 0 or k == 0:
        return 0.0
    if k == n:
        return float(alpha ** (1.0 / n))
    lo, hi = 0.0, k / n  # the tail grows with p; at p = k/n it is above alpha for any sane alpha
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if _binomial_upper_tail(k, n, mid) > alpha:
            hi = mid
        else:
            lo = mid
    return lo


def choose_threshold(
    scores: Sequence[float],
    correct: Sequence[bool],
    target_precision: float,
    confidence: float = 0.95,
) -> Threshold:
    """The lowest score threshold whose accepted answers' precision lower bound meets the target.

    Lowest, so coverage is as large as the evidence allows. Precision along the curve need
    not be monotone; every distinct score is tried. If none qualifies (or there are no
    scores) the result accepts nothing (``value == math.inf``).
    """
    if not 0.0 < target_precision <= 1.0:
        raise ValueError(f"target_precision must be within (0, 1], got {target_precision}")
    n = len(scores)
    # lowest threshold first: the first that qualifies is the answer. A point whose observed
    # precision is below the target cannot qualify (its bound is below its precision), so
    # its bound, an O(n) bisection, is never computed: 2,000 scores took 7.5 s before.
    for point in reversed(risk_coverage(scores, correct)):
        if point.precision < target_precision:
            continue
        k = round(point.precision * point.accepted)
        bound = precision_lower_bound(k, point.accepted, confidence)
        if bound >= target_precision:
            return Threshold(point.threshold, point.coverage, point.precision, bound, n)
    return Threshold(math.inf, 0.0, 0.0, 0.0, n)


#: Where :func:`fixed_sequence_threshold`'s sequences start, and the share of ``1 - confidence``
#: each is given: 80 % at the strictest bar that can pass, 20 % at the bar accepting half the
#: answers (so one wrong answer among the strictest few no longer ends the search).
STARTS: tuple[tuple[float, float], ...] = ((0.8, 0.0), (0.2, 0.5))


def fixed_sequence_threshold(
    scores: Sequence[float],
    correct: Sequence[bool],
    target_precision: float,
    confidence: float = 0.95,
    *,
    starts: Sequence[tuple[float, float]] | None = None,
) -> Threshold:
    """The lowest threshold that fixed-sequence testing with fallback certifies, strictest first.

    Each distinct score is a hypothesis ("precision at this threshold is below the target"),
    rejected when the accepted answers' Clopper–Pearson lower bound, at the level the
    hypothesis is tested at, meets the target. The thresholds are tested in an order fixed
    before any correctness is looked at (strictest first), and the error budget
    ``alpha = 1 - confidence`` is split among ``starts``: ``(share, fraction)`` gives
    ``share * alpha`` to the strictest threshold accepting at least ``fraction`` of the
    answers and at least ``ceil(ln(share * alpha) / ln(target))`` of them (a stricter one
    cannot pass even when all its answers are right). A rejected hypothesis hands its whole
    level on to the next; one that is not rejected hands on nothing, so its sequence ends
    and the next start begins afresh. This is Wiens' fallback procedure (2003), a Bonferroni
    closed test: every threshold it certifies has true precision at least the target, all
    at once, with probability at least ``confidence``, whatever the dependence between the
    tests. ``starts`` defaults to :data:`STARTS`. Plain fixed-sequence testing is
    ``starts=((1.0, 0.0),)``; it stops for good at
    the first failure, so one wrong answer among the strictest 29 (target 0.9) certified
    nothing, which on answers 97 % right at every score happened in 109 of 200 400-case
    calibrations (the fallback: 4 of 200; ``tests/bench/bench_bar_guarantee.py``, README).

    The answers must be independent of each other (held-out inputs, not leave-one-out
    answers, whose shared examples correlate them). ``lower_bound`` is the bound at the
    level the chosen threshold was tested at, which is at least ``confidence``. None
    certified: accept nothing (``value == math.inf``).
    """
    if not 0.0 < target_precision <= 1.0:
        raise ValueError(f"target_precision must be within (0, 1], got {target_precision}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    starts = STARTS if starts is None else starts
    if not starts or any(not (0.0 < share <= 1.0 and 0.0 <= at <= 1.0) for share, at in starts):
        raise ValueError(f"starts must be (share, fraction) pairs within (0, 1] x [0, 1], got {list(starts)}")
    if sum(share for share, _ in starts) > 1.0 + 1e-9:
        raise ValueError(f"the shares of starts must add up to at most 1, got {list(starts)}")
    alpha, n = 1.0 - confidence, len(scores)
    points = risk_coverage(scores, correct)  # strictest first
    own: dict[int, float] = {}  # point index -> the level given to a sequence starting there
    for share, at in starts:
        needed = math.ceil(math.log(share * alpha) / math.log(target_precision)) if target_precision < 1.0 else 0
        first = next((i for i, p in enumerate(points) if p.accepted >= max(needed, at * n)), None)
        if first is not None:
            own[first] = own.get(first, 0.0) + share * alpha
    chosen = Threshold(math.inf, 0.0, 0.0, 0.0, n)
    handed = 0.0
    for i, point in enumerate(points):
        level, handed = own.get(i, 0.0) + handed, 0.0
        if level <= 0.0 or point.precision < target_precision:
            continue
        k = round(point.precision * point.accepted)
        bound = precision_lower_bound(k, point.accepted, 1.0 - level)
        if bound >= target_precision:
            chosen, handed = Threshold(point.threshold, point.coverage, point.precision, bound, n), level
    return chosen


@dataclass(frozen=True)
class NoveltyBar:
    """An input is *in scope* when its novelty score is strictly above ``value``.

    ``n`` out-of-scope scores set it; ``pass_rate_bound`` = ``1 / (n + 1)`` bounds the
    chance that a new out-of-scope input (exchangeable with them) clears it. ``value`` is
    ``-math.inf`` (every input in scope, nothing measured) when there were no scores.
    """

    value: float
    n: int
    pass_rate_bound: float

    @property
    def measured(self) -> bool:
        return self.n > 0

    def admits(self, score: float) -> bool:
        """Whether an input with this novelty score is in scope (strictly above the bar)."""
        return score > self.value

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-safe: ``value`` is ``None`` when nothing was measured."""
        return {
            "value": self.value if self.measured else None,
            "n": self.n,
            "pass_rate_bound": self.pass_rate_bound,
        }


def novelty_bar(out_of_scope_scores: Sequence[float]) -> NoveltyBar:
    """The bar an input's novelty score must clear to be answered locally.

    The scores are those of inputs known to be out of scope, each computed as a new input's
    would be (leave-one-out). The bar is their maximum: for a new out-of-scope input whose
    score is exchangeable with these ``n``, P(score > max) ≤ 1 / (n + 1) — the split-conformal
    bound at its strictest (rank ``n`` of ``n``). No scores: ``-inf``, bound 1.0 (no rule).
    """
    scores = [float(s) for s in out_of_scope_scores]
    for s in scores:
        if not math.isfinite(s):
            raise ValueError(f"a novelty score must be finite, got {s!r}")
    if not scores:
        return NoveltyBar(-math.inf, 0, 1.0)
    return NoveltyBar(max(scores), len(scores), 1.0 / (len(scores) + 1))


def same_text(text: str) -> str:
    """``text`` as leave-one-out compares it: NFKC, case-folded, runs of white space as one
    space. Two examples equal under it are one example (which an embedder normalises away:
    the same vector, or nearly), so holding one out holds out the other too."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def split(
    items: Sequence[T],
    holdout_fraction: float,
    seed: int,
    key: Callable[[T], Hashable] | None = None,
) -> tuple[list[T], list[T]]:
    """Deterministic (calibration, held-out) split; stratified by ``key`` when given.

    Each stratum (or the whole list) is shuffled by ``random.Random(seed)`` and
    ``round(len * holdout_fraction)`` of it held out; both parts keep the input order. The
    same items, fraction and seed always give the same split (strata are visited in order
    of first appearance, so hash randomisation cannot change it).
    """
    if not 0.0 <= holdout_fraction <= 1.0:
        raise ValueError(f"holdout_fraction must be within [0, 1], got {holdout_fraction}")
    strata: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        strata.setdefault(key(item) if key is not None else None, []).append(index)
    rng = random.Random(seed)
    held: set[int] = set()
    for indices in strata.values():
        shuffled = list(indices)
        rng.shuffle(shuffled)
        held.update(shuffled[: round(len(shuffled) * holdout_fraction)])
    calibration = [item for i, item in enumerate(items) if i not in held]
    holdout = [item for i, item in enumerate(items) if i in held]
    return calibration, holdout
