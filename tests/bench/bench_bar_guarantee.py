"""Benchmark: do calibrated bars keep their 95 % promise on *new* inputs? Resampled.

    python tests/bench/bench_bar_guarantee.py [--seeds N] [--splits N] [--json OUT]
    python tests/bench/bench_bar_guarantee.py --smoke      # seconds: synthetic only, few seeds

A bar chosen at target precision ``p`` with a 95 % lower bound promises that the answers it
accepts on fresh inputs from the same distribution are right at least ``p`` of the time, in
at least 95 % of calibrations. Each arm calibrates many times on independent draws and
counts the draws whose fresh precision falls below ``p`` (the *violation rate*: at most
~5 % if the promise holds), with the coverage each calibration bought:

- ``router-synthetic``: :func:`localllm.embed.router.calibrate` on clustered intents (unit
  vectors around random centres sharing a common direction, so intents overlap), checked
  against a population of 4,000 fresh inputs routed as the leave-one-out pool routes its
  examples: among all intents (in scope) and with their own intent left out (out of
  scope, any route wrong). Also reported: precision with out-of-scope inputs from intents
  never seen, and in-scope inputs alone.
- ``router-cases``: the same draws, the bars certified instead on ``--cases`` (400) held-out
  labelled inputs (80 % from the intents, 20 % from other intents never seen, labelled
  ``none_of_these``) by ``calibrate(router, cases=...)``; checked on the 4,000 fresh in-scope
  inputs and the inputs of unseen intents, weighted to the cases' mix. ``--no-clinc``:
  the synthetic arms alone.
- ``examples-synthetic``: the examples tier's k-NN vote (k=5) over the same kind of data,
  threshold by :func:`localllm.calibrate.choose_threshold` on its leave-one-out answers.
- ``router-clinc`` / ``examples-clinc`` (not with ``--smoke``): the CLINC150 sample in
  ``tests/bench/data`` (9 intents × 45 utterances, CC BY 3.0) embedded with all-MiniLM
  (managed llama-server); each split takes ``k`` utterances per intent as examples and
  holds out the rest. The held-out set is small, so its own noise adds to the rate.
  ``router-cases-clinc``: half of each split's held-out inputs and half the ``oos`` ones
  certify the bars (``calibrate(router, cases=...)``), the other halves check them.

Writes ``tests/bench/results/bar_guarantee.json``. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import localllm.calibrate  # noqa: E402
from localllm.calibrate import choose_threshold, fixed_sequence_threshold  # noqa: E402
from localllm.config import Intent  # noqa: E402
from localllm.embed.embedder import EmbedderIdentity  # noqa: E402
from localllm.embed.examples import Example, Neighbour, vote  # noqa: E402
from localllm.embed.router import NONE_OF_THESE, Router, calibrate  # noqa: E402
from tests.bench._minilm import embed  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DATA = Path(__file__).parent / "data"
RESULTS = Path(__file__).parent / "results" / "bar_guarantee.json"
TARGET = 0.9
PLAIN = ((1.0, 0.0),)  # fixed-sequence testing from the strictest bar alone, for comparison
Array = Any  # numpy arrays (numpy's own stubs would make every helper generic)


class Rows:
    """An embedder that looks vectors up by their key (the texts are row names)."""

    def __init__(self, vectors: dict[str, Array], dims: int) -> None:
        self.vectors = vectors
        self.identity = EmbedderIdentity("rows", dims, "none", "", "")

    def embed(self, texts: Sequence[str], role: str) -> Array:
        return np.stack([self.vectors[t] for t in texts])


def unit(x: Array) -> Array:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def route(matrix: Array, labels: Array, groups: int, queries: Array, *, confident: float, margin: float) -> Array:
    """(accepted, best intent) of the router's semantic tier for every query row."""
    sims = queries @ matrix.T
    best = np.stack([sims[:, labels == g].max(axis=1) for g in range(groups)], axis=1)
    order = np.argsort(-best, axis=1, kind="stable")
    s1 = np.take_along_axis(best, order[:, :1], 1)[:, 0]
    s2 = np.take_along_axis(best, order[:, 1:2], 1)[:, 0]
    return (s1 >= confident - 1e-5) & (s1 - s2 >= margin - 1e-5), order[:, 0]


def router_check(
    matrix: Array, labels: Array, fresh: Array, fresh_labels: Array, unseen: Array | None
) -> dict[str, Any]:
    """Calibrate a Router on ``matrix`` (rows labelled 0..g-1), then measure it on ``fresh``."""
    groups = int(labels.max()) + 1
    keys = {f"r{i}": row for i, row in enumerate(matrix)}
    intents = [Intent(f"i{g}", tuple(f"r{i}" for i in np.flatnonzero(labels == g))) for g in range(groups)]
    cal = calibrate(Router(intents, Rows(keys, matrix.shape[1]), confident=0.99, margin=0.5), TARGET)
    accepted, chosen = route(matrix, labels, groups, fresh, confident=cal.confident, margin=cal.margin)
    right = int((accepted & (chosen == fresh_labels)).sum())
    wrong_out = 0  # each fresh input again, its own intent left out: any route is wrong
    for g in range(groups):
        keep = labels != g
        others = np.searchsorted(np.unique(labels[keep]), labels[keep])
        out, _ = route(
            matrix[keep], others, groups - 1, fresh[fresh_labels == g], confident=cal.confident, margin=cal.margin
        )
        wrong_out += int(out.sum())
    taken = int(accepted.sum())
    doc: dict[str, Any] = {
        "bound_met": cal.bound_met,
        "claimed_lower_bound": cal.lower_bound,
        "coverage": taken / len(fresh),
        "precision": right / (taken + wrong_out) if taken + wrong_out else None,
        "precision_in_scope": right / taken if taken else None,
    }
    if unseen is not None:
        wrong_new = int(route(matrix, labels, groups, unseen, confident=cal.confident, margin=cal.margin)[0].sum())
        doc["precision_unseen_intents"] = right / (taken + wrong_new) if taken + wrong_new else None
    return doc


def knn_answers(
    pool: Array, labels: Array, queries: Array, truth: Array, *, loo: bool, k: int = 5
) -> list[tuple[float, bool]]:
    sims = queries @ pool.T
    if loo:
        np.fill_diagonal(sims, -np.inf)
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    examples = [Example(str(i), "", {"y": int(label)}) for i, label in enumerate(labels)]
    out = []
    for r in range(len(queries)):
        v = vote([Neighbour(examples[j], float(sims[r, j])) for j in nearest[r]], ["y"])
        out.append((min(max(v.confidence, 0.0), 1.0), v.answer.get("y") == int(truth[r])))
    return out


def examples_check(pool: Array, labels: Array, fresh: Array, fresh_labels: Array) -> dict[str, Any]:
    cal = knn_answers(pool, labels, pool, labels, loo=True)
    chosen = choose_threshold([s for s, _ in cal], [c for _, c in cal], TARGET)
    if chosen.accepts_nothing:
        return {"bound_met": False, "coverage": 0.0, "precision": None}
    answers = knn_answers(pool, labels, fresh, fresh_labels, loo=False)
    taken = [c for s, c in answers if s >= chosen.value]
    return {
        "bound_met": True,
        "claimed_lower_bound": chosen.lower_bound,
        "coverage": len(taken) / len(answers),
        "precision": sum(taken) / len(taken) if taken else None,
    }


def cases_check(draw: tuple[Array, ...], starts: tuple[tuple[float, float], ...] | None = None) -> dict[str, Any]:
    """Certify a Router's bars on a :func:`synthetic` draw's held-out cases (label -1: of an
    unseen intent), then measure them on its fresh in-scope inputs and inputs of intents never
    seen, the unseen weighted to the cases' share of them (the population the cases came from).
    ``starts``: the fixed-sequence starts to certify with (default: the library's)."""
    matrix, labels, fresh, fresh_labels, unseen, cases, case_labels = draw
    share = float(np.mean(case_labels < 0))
    weight = share / (1.0 - share) * len(fresh) / len(unseen)
    groups = int(labels.max()) + 1
    keys = {f"r{i}": row for i, row in enumerate(matrix)} | {f"c{i}": row for i, row in enumerate(cases)}
    intents = [Intent(f"i{g}", tuple(f"r{i}" for i in np.flatnonzero(labels == g))) for g in range(groups)]
    router = Router(intents, Rows(keys, matrix.shape[1]), confident=0.99, margin=0.5)
    pairs = [(f"c{i}", f"i{g}" if g >= 0 else NONE_OF_THESE) for i, g in enumerate(case_labels)]
    default = localllm.calibrate.STARTS
    localllm.calibrate.STARTS = starts or default  # what `calibrate` certifies with
    try:
        cal = calibrate(router, TARGET, cases=pairs)
    finally:
        localllm.calibrate.STARTS = default
    accepted, chosen = route(matrix, labels, groups, fresh, confident=cal.confident, margin=cal.margin)
    right, taken = int((accepted & (chosen == fresh_labels)).sum()), int(accepted.sum())
    wrong_new = int(route(matrix, labels, groups, unseen, confident=cal.confident, margin=cal.margin)[0].sum())
    return {
        "bound_met": cal.bound_met,
        "claimed_lower_bound": cal.lower_bound,
        "coverage": taken / len(fresh),
        "precision": right / (taken + weight * wrong_new) if taken + wrong_new else None,
        "precision_in_scope": right / taken if taken else None,
    }


def synthetic(
    seed: int, intents: int, examples: int, fresh: int, *, cases: int = 0, oos_share: float = 0.2
) -> tuple[Array, Array, Array, Array, Array, Array, Array]:
    """Examples, their labels, fresh in-scope inputs, their labels, inputs of unseen intents,
    and ``cases`` held-out calibration inputs with their labels (``oos_share`` of them from
    other unseen intents, labelled -1), drawn after the rest so the other draws do not change."""
    rng = np.random.default_rng(seed)
    dims, spread, shared = 16, 0.9, 0.8
    common = unit(rng.normal(size=dims))

    def centre() -> Array:
        return unit(shared * common + unit(rng.normal(size=dims)))

    def draw(c: Array, n: int) -> Array:
        return unit(c + spread * rng.normal(size=(n, dims)) / np.sqrt(dims))

    centres = [centre() for _ in range(intents)]
    matrix = np.concatenate([draw(c, examples) for c in centres])
    per = fresh // intents
    queries = np.concatenate([draw(c, per) for c in centres])
    unseen = np.concatenate([draw(centre(), max(1, fresh // 40)) for _ in range(40)])
    inside = round(cases * (1.0 - oos_share)) // intents
    held = [draw(c, inside) for c in centres] + [draw(centre(), 1) for _ in range(cases - inside * intents)]
    held_labels = np.concatenate([np.repeat(np.arange(intents), inside), -np.ones(cases - inside * intents, int)])
    return (
        matrix,
        np.repeat(np.arange(intents), examples),
        queries,
        np.repeat(np.arange(intents), per),
        unseen,
        np.concatenate(held) if held else np.zeros((0, dims)),
        held_labels,
    )


#: precision of an answer scored ``s`` (scores uniform on [0, 1]) in the ``certify-iid`` arms
CURVES: dict[str, Any] = {
    "flat-0.97": lambda s: np.full_like(s, 0.97),
    "flat-0.93": lambda s: np.full_like(s, 0.93),
    "flat-0.88": lambda s: np.full_like(s, 0.88),
    "linear": lambda s: 0.6 + 0.4 * s,
    "logistic": lambda s: 1.0 / (1.0 + np.exp(-12.0 * (s - 0.5))),
    "steep-top": lambda s: np.where(s < 0.9, np.minimum(1.0, 0.5 + 0.55 * np.sqrt(s)), 0.995),
}


def iid_check(curve: Any, n: int, seed: int, starts: tuple[tuple[float, float], ...] | None) -> dict[str, Any]:
    """:func:`fixed_sequence_threshold` on ``n`` independent answers whose precision at each
    score is known (``curve``), so the fresh precision and coverage of the bar are exact."""
    rng = np.random.default_rng(seed)
    scores = rng.random(n)
    correct = rng.random(n) < curve(scores)
    chosen = fixed_sequence_threshold(scores.tolist(), correct.tolist(), TARGET, starts=starts)
    if chosen.accepts_nothing:
        return {"bound_met": False, "coverage": 0.0, "precision": None}
    grid = chosen.value + (1.0 - chosen.value) * (np.arange(2000) + 0.5) / 2000
    return {
        "bound_met": True,
        "claimed_lower_bound": chosen.lower_bound,
        "coverage": 1.0 - chosen.value,
        "precision": float(np.mean(curve(grid))),
    }


def summary(name: str, rows: list[dict[str, Any]], **setup: Any) -> dict[str, Any]:
    met = [r for r in rows if r["bound_met"]]

    def below(key: str) -> int:
        return sum(1 for r in met if r.get(key) is not None and r[key] < TARGET)

    doc: dict[str, Any] = {
        "arm": name,
        **setup,
        "draws": len(rows),
        "bound_met": len(met),
        "violations": below("precision"),
        "violation_rate": below("precision") / len(rows) if rows else None,
        "claimed_above_fresh": sum(
            1 for r in met if r["precision"] is not None and r["claimed_lower_bound"] > r["precision"]
        ),
        "mean_coverage_when_met": float(np.mean([r["coverage"] for r in met])) if met else None,
        "mean_coverage": float(np.mean([r["coverage"] for r in rows])) if rows else 0.0,
    }
    for extra in ("precision_in_scope", "precision_unseen_intents"):
        if any(extra in r for r in met):
            doc[f"violations_{extra}"] = below(extra)
    return doc


def clinc(splits: int, per_intent: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    for name in ("clinc150_examples.jsonl", "clinc150_cases.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            if line.strip():
                doc = json.loads(line)
                rows.append((str(doc["args"]["text"]), str(doc["expect"]["intent"])))
    vectors = unit(np.asarray(embed([t for t, _ in rows], "bar-guarantee-bench")[0]).astype(np.float32))
    labels = np.asarray([label for _, label in rows])
    names = sorted(set(labels) - {"oos"})
    out = []
    oos = vectors[labels == "oos"]
    for k in per_intent:
        router_rows, example_rows, cases_rows, plain_rows = [], [], [], []
        for split in range(splits):
            rng = np.random.default_rng(split)
            ex, ex_l, held, held_l = [], [], [], []
            for g, name in enumerate(names):
                order = rng.permutation(np.flatnonzero(labels == name))
                ex.append(vectors[order[:k]])
                held.append(vectors[order[k:]])
                ex_l += [g] * k
                held_l += [g] * (len(order) - k)
            m, ml, h, hl = np.concatenate(ex), np.asarray(ex_l), np.concatenate(held), np.asarray(held_l)
            router_rows.append(router_check(m, ml, h, hl, oos))
            example_rows.append(examples_check(m, ml, h, hl))
            # router-cases: half the held-out inputs (and half the oos ones) certify, the rest check
            cal, chk = np.array_split(rng.permutation(len(hl)), 2)
            cal_oos, chk_oos = np.array_split(rng.permutation(len(oos)), 2)
            cases = np.concatenate([h[cal], oos[cal_oos]])
            case_labels = np.concatenate([hl[cal], -np.ones(len(cal_oos), int)])
            check = (m, ml, h[chk], hl[chk], oos[chk_oos], cases, case_labels)
            cases_rows.append(cases_check(check))
            plain_rows.append(cases_check(check, PLAIN))
        setup = {"data": "clinc150-9", "examples_per_intent": k, "held_out": len(hl)}
        out += [
            summary("router-clinc", router_rows, **setup),
            summary("router-cases-clinc", cases_rows, **setup, cases=len(cal) + len(cal_oos)),
            summary("router-cases-plain-clinc", plain_rows, **setup, cases=len(cal) + len(cal_oos)),
            summary("examples-clinc", example_rows, **setup),
        ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=200, help="synthetic draws per arm")
    parser.add_argument("--splits", type=int, default=200, help="CLINC150 random splits per k")
    parser.add_argument("--json", type=Path, default=None, help=f"default {RESULTS}")
    parser.add_argument(
        "--cases", type=int, default=400, help="held-out calibration inputs per synthetic draw (router-cases arm)"
    )
    parser.add_argument("--no-clinc", action="store_true", help="synthetic arms only")
    parser.add_argument("--smoke", action="store_true", help="seconds: synthetic only, a few seeds, small fresh sets")
    args = parser.parse_args(argv)
    if args.json is None:
        args.json = results_path("bar_guarantee", smoke=True) if args.smoke else RESULTS
    seeds, fresh = (4, 400) if args.smoke else (args.seeds, 4000)
    arms: list[dict[str, Any]] = []
    configs = [(4, 30)] if args.smoke else [(4, 30), (8, 20)]
    for intents, examples in configs:
        draws = [synthetic(s, intents, examples, fresh, cases=args.cases) for s in range(seeds)]
        setup = {"data": "synthetic", "intents": intents, "examples_per_intent": examples, "fresh": fresh}
        arms.append(summary("router-synthetic", [router_check(*d[:5]) for d in draws], **setup))
        arms.append(summary("router-cases", [cases_check(d) for d in draws], **setup, cases=args.cases))
        plain = [cases_check(d, PLAIN) for d in draws]
        arms.append(summary("router-cases-plain", plain, **setup, cases=args.cases))
        arms.append(summary("examples-synthetic", [examples_check(*d[:4]) for d in draws], **setup))
    for n in (136, 400):
        for curve_name, curve in CURVES.items():
            setup = {"data": "iid", "curve": curve_name, "cases": n}
            for name, starts in (("certify-iid", None), ("certify-iid-plain", PLAIN)):
                arms.append(summary(name, [iid_check(curve, n, s, starts) for s in range(seeds)], **setup))
    if not args.smoke and not args.no_clinc:
        arms += clinc(args.splits, (20, 30))
    report = {**provenance(smoke=args.smoke), "target_precision": TARGET, "level": 0.95, "arms": arms}
    for arm in arms:
        shape = arm.get("curve") or f"{arm.get('intents', 9)}x{arm['examples_per_intent']}"
        cases = f" n={arm['cases']}" if "cases" in arm else ""
        print(
            f"{arm['arm']:24s} {shape}{cases}: "
            f"bound met {arm['bound_met']}/{arm['draws']}, fresh precision < {TARGET} in {arm['violations']} "
            f"({arm['violation_rate']:.1%} of draws), coverage {arm['mean_coverage_when_met'] or 0:.3f} "
            f"when met, {arm['mean_coverage']:.3f} over all draws",
            file=sys.stderr,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
