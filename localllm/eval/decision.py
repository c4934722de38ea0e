"""The decision an eval report puts in front of a person: per tier, how far its confidence
can be trusted, and what a ``min_precision`` cascade would keep local.

From the report's rows (one per call, with ``confidence`` from the answer's meta):

- per tier (agent, or ``examples``): the risk–coverage curve and the expected calibration
  error over its scored answers; the cases split (stratified by label, seeded) into a
  *calibration* half, on which the threshold for each target precision is chosen
  (:func:`localllm.calibrate.choose_threshold`, one-sided 95% Clopper–Pearson), and a
  *held-out* half on which that threshold's coverage and precision are reported. The
  calibration split's (score, correct) pairs are kept: ``selection: {min_precision:}``
  chooses its thresholds from them at run time.
- :func:`simulate_cascade`: on the held-out cases, the tiers in order (local first), each
  answer accepted when its confidence clears the tier's threshold, else the next tier;
  the last (strong) tier answers the rest. Local share, local precision, the cascade's
  accuracy against the strong tier's alone, and latency/cost against all-strong.

A missing confidence (an agent that does not report one) is never accepted: that tier's
calls all escalate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localllm.calibrate import (
    choose_threshold,
    coverage_precision,
    expected_calibration_error,
    precision_lower_bound,
    risk_coverage,
    score_of,
    split,
)

__all__ = [
    "DEFAULT_HOLDOUT",
    "DEFAULT_SEED",
    "TARGETS",
    "Outcome",
    "ascii_curve",
    "calibration_block",
    "confidence_of",
    "decision_block",
    "simulate_cascade",
]

TARGETS = (0.9, 0.95)
DEFAULT_HOLDOUT = 0.5
DEFAULT_SEED = 0


def confidence_of(meta: Mapping[str, Any] | None) -> float | None:
    """``meta.confidence`` when it is a number in [0, 1], else ``None`` (not calibrated)."""
    return score_of((meta or {}).get("confidence"))


@dataclass(frozen=True)
class Outcome:
    """One tier's answer to one case: right or not, its confidence, what it cost."""

    correct: bool
    confidence: float | None
    ms: float = 0.0
    cost: float = 0.0


def _pairs(outcomes: Sequence[Outcome]) -> tuple[list[float], list[bool]]:
    scored = [o for o in outcomes if o.confidence is not None]
    return [o.confidence for o in scored if o.confidence is not None], [o.correct for o in scored]


def calibration_block(
    tiers: Mapping[str, Mapping[str, Outcome]],
    label_of: Mapping[str, str],
    *,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = DEFAULT_SEED,
    targets: Sequence[float] = TARGETS,
    in_scope: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The report's ``calibration`` section: tier → case id → outcome, split by case.

    ``in_scope`` (the examples tier's out-of-scope verdict per case) applies the
    out-of-scope rule: a case out of scope never reaches a local tier, so each tier's
    threshold is chosen on (and checked against) the in-scope cases only, and only their
    pairs are kept for ``selection:``. The curve and the accuracy stay over every case."""
    cases = sorted(label_of)
    cal_ids, held_ids = split(cases, holdout, seed, key=lambda c: label_of[c])
    out: dict[str, Any] = {"holdout_fraction": holdout, "seed": seed, "confidence": 0.95, "tiers": {}}
    if in_scope is not None:
        out["out_of_scope"] = {
            "cases": sum(1 for c in cases if in_scope.get(c) is False),
            "calibration_cases": sum(1 for c in cal_ids if in_scope.get(c) is False),
        }
        cal_ids = [c for c in cal_ids if in_scope.get(c) is not False]
    for alias, by_case in tiers.items():
        everything = list(by_case.values())
        cal = [by_case[c] for c in cal_ids if c in by_case]
        held = [by_case[c] for c in held_ids if c in by_case and (in_scope is None or in_scope.get(c) is not False)]
        scores, correct = _pairs(everything)
        cal_scores, cal_correct = _pairs(cal)
        held_scores, held_correct = _pairs(held)
        row: dict[str, Any] = {
            "calls": len(everything),
            "scored": len(scores),
            "accuracy": round(sum(o.correct for o in everything) / len(everything), 6) if everything else None,
            "ece": round(expected_calibration_error(scores, correct), 6) if scores else None,
            "curve": [
                [round(p.threshold, 6), round(p.coverage * len(scores) / len(everything), 6), round(p.precision, 6)]
                for p in risk_coverage(scores, correct)
            ],
            "calibration": {"scores": [round(s, 6) for s in cal_scores], "correct": cal_correct},
            "targets": {},
        }
        for target in targets:
            chosen = choose_threshold(cal_scores, cal_correct, target)
            _, precision, accepted = coverage_precision(held_scores, held_correct, chosen.value)
            right = round(precision * accepted)
            row["targets"][f"{target:g}"] = {
                "threshold": chosen.to_dict(),
                "held_out": {
                    "n": len(held),
                    "accepted": accepted,
                    "coverage": round(accepted / len(held), 6) if held else None,
                    "precision": round(precision, 6) if accepted else None,
                    "lower_bound": round(precision_lower_bound(right, accepted), 6),
                },
            }
        out["tiers"][alias] = row
    out["held_out_cases"] = held_ids
    return out


def simulate_cascade(
    order: Sequence[str],
    thresholds: Mapping[str, float],
    tiers: Mapping[str, Mapping[str, Outcome]],
    cases: Sequence[str],
) -> dict[str, Any]:
    """Run the cascade ``order`` (the last is the strong tier, always accepted) over ``cases``.

    ``thresholds`` gives each local tier's threshold (``math.inf``: never accepted). A case
    a tier has no outcome for escalates. Latency and cost add up over every tier asked."""
    local = accepted_right = right = 0
    ms: list[float] = []
    cost = 0.0
    strong = order[-1]
    answered = 0
    for case in cases:
        spent_ms = spent = 0.0
        final: Outcome | None = None
        for index, alias in enumerate(order):
            outcome = tiers.get(alias, {}).get(case)
            if outcome is None:
                continue
            spent_ms += outcome.ms
            spent += outcome.cost
            last = index == len(order) - 1
            threshold = thresholds.get(alias, math.inf)
            if last or (outcome.confidence is not None and outcome.confidence >= threshold):
                final = outcome
                if not last:
                    local += 1
                    accepted_right += outcome.correct
                break
        if final is None:
            continue
        answered += 1
        right += final.correct
        ms.append(spent_ms)
        cost += spent
    strong_alone = [tiers.get(strong, {}).get(c) for c in cases]
    strong_known = [o for o in strong_alone if o is not None]
    strong_acc = sum(o.correct for o in strong_known) / len(strong_known) if strong_known else None
    n = len(cases)
    accuracy = right / answered if answered else None
    ms_sorted = sorted(ms)
    return {
        "order": list(order),
        "thresholds": {k: (None if math.isinf(v) else v) for k, v in thresholds.items()},
        "cases": n,
        "local_share": round(local / n, 6) if n else None,
        "local_precision": round(accepted_right / local, 6) if local else None,
        "cascade_accuracy": round(accuracy, 6) if accuracy is not None else None,
        "strong_accuracy": round(strong_acc, 6) if strong_acc is not None else None,
        "relative_accuracy": round(accuracy / strong_acc, 6) if accuracy is not None and strong_acc else None,
        "p50_ms": ms_sorted[len(ms_sorted) // 2] if ms_sorted else None,
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else None,
        "strong_mean_ms": round(sum(o.ms for o in strong_known) / len(strong_known), 3) if strong_known else None,
        "cost_usd": round(cost, 6),
        "strong_cost_usd": round(sum(o.cost for o in strong_known), 6),
    }


def ascii_curve(curve: Sequence[Sequence[float]], *, width: int = 40, height: int = 10) -> list[str]:
    """A risk–coverage curve (``[threshold, coverage, precision]`` points) as text: precision
    (0.5–1.0) up, coverage (0–1) across; ``*`` marks each point."""
    grid = [[" "] * (width + 1) for _ in range(height + 1)]
    for _, coverage, precision in curve:
        x = round(min(max(coverage, 0.0), 1.0) * width)
        y = round((min(max(precision, 0.5), 1.0) - 0.5) / 0.5 * height)
        grid[height - y][x] = "*"
    lines = []
    for row, cells in enumerate(grid):
        label = 1.0 - row * 0.5 / height
        lines.append(f"{label:4.2f} |" + "".join(cells))
    lines.append("     +" + "-" * (width + 1))
    lines.append("      0" + " " * (width // 2 - 3) + "coverage" + " " * (width // 2 - 6) + "1")
    return lines


def decision_block(
    calibration: Mapping[str, Any],
    tiers: Mapping[str, Mapping[str, Outcome]],
    local: Sequence[str],
    strong: str | None,
    *,
    targets: Sequence[float] = TARGETS,
    in_scope: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """Per target precision: the cascade ``local`` tiers → ``strong`` on the held-out cases
    (a case ``in_scope`` says is out of scope goes straight to ``strong``)."""
    if strong is None or not local:
        return {}
    held = list(calibration.get("held_out_cases") or [])
    if in_scope is not None:
        tiers = {
            alias: (rows if alias not in local else {c: o for c, o in rows.items() if in_scope.get(c) is not False})
            for alias, rows in tiers.items()
        }
    out: dict[str, Any] = {}
    for target in targets:
        thresholds: dict[str, float] = {}
        for alias in local:
            value = calibration["tiers"][alias]["targets"][f"{target:g}"]["threshold"]["value"]
            thresholds[alias] = math.inf if value is None else float(value)
        out[f"{target:g}"] = simulate_cascade([*local, strong], thresholds, tiers, held)
    return out
