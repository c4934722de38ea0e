"""Benchmark: the router's semantic tier on real all-MiniLM embeddings, fixed vs calibrated bars.

    python tests/bench/bench_router.py [--examples F] [--cases F] [--json OUT]

Data: a labelled intent set in the eval cases format (``args.text``, ``expect.intent``), an
examples pool and held-out cases; label ``oos`` marks out-of-scope inputs (never an intent).
Default: the seeded 9-intent CLINC150 sample in ``tests/bench/data`` (CC BY 3.0, see its
README). A second set is the demo's 32 labelled tickets (``queue`` as the intent), the first
3 per queue as examples and the rest held out.

For k = 3, 5, 10, 20 examples per intent, the held-out cases are routed by the embedding
tier alone with (a) the old fixed bars (0.82 / 0.08), (b) the registry's measured bars for
the model, (c) bars calibrated on those k examples (leave-one-out, target precision 0.9):
the share of in-scope cases routed semantically (coverage), the precision of the routed
cases (an out-of-scope case routed is wrong), the share of out-of-scope cases routed, and
the median best similarity of in-scope cases. The calibrated bars at the largest k are what
``embed/models.json`` records for the model (``router:``).

Writes ``tests/bench/results/router.json``. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.config import Intent  # noqa: E402
from localllm.embed.embedder import EmbedderIdentity  # noqa: E402
from localllm.embed.registry import lookup  # noqa: E402
from localllm.embed.router import Router, calibrate, default_bars  # noqa: E402
from tests.bench._minilm import MODEL, embed  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DATA = Path(__file__).parent / "data"
DEMO_CASES = REPO / "examples" / "demo" / "evals" / "triage" / "cases.jsonl"
RESULTS = Path(__file__).parent / "results" / "router.json"
OOS = "oos"


class Cached:
    """Vectors embedded once, looked up by text (every arm sees the same numbers)."""

    def __init__(self, identity: EmbedderIdentity, vectors: dict[str, np.ndarray]) -> None:
        self.identity = identity
        self.vectors = vectors

    def embed(self, texts: Sequence[str], role: str) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def read(path: Path, field: str = "intent") -> list[tuple[str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            doc = json.loads(line)
            text = doc["args"].get("text") or doc["args"].get("ticket")
            rows.append((str(text), str(doc["expect"][field])))
    return rows


def evaluate(router: Router, cases: list[tuple[str, str]]) -> dict[str, Any]:
    routed = right = oos_routed = in_scope = 0
    sims = []
    for text, label in cases:
        v = router.semantic(text)
        if label != OOS:
            in_scope += 1
            if v.similarity is not None:
                sims.append(v.similarity)
        if v.outcome == "route":
            routed += 1
            right += v.intent == label
            oos_routed += label == OOS
    oos = len(cases) - in_scope
    return {
        "coverage": round((routed - oos_routed) / in_scope, 3) if in_scope else None,
        "precision": round(right / routed, 3) if routed else None,
        "routed": routed,
        "oos_routed": round(oos_routed / oos, 3) if oos else None,
        "median_in_scope_similarity": round(statistics.median(sims), 3) if sims else None,
    }


def run_set(
    name: str, pool: list[tuple[str, str]], cases: list[tuple[str, str]], embedder: Any, ks: Sequence[int]
) -> list[dict[str, Any]]:
    out = []
    labels = list(dict.fromkeys(label for _, label in pool if label != OOS))
    registry = default_bars(lookup(MODEL))
    for k in ks:
        intents = [Intent(label, tuple([t for t, lab in pool if lab == label][:k])) for label in labels]
        if any(len(i.examples) < k for i in intents):
            continue
        row: dict[str, Any] = {"set": name, "k": k, "intents": len(intents), "cases": len(cases)}
        fixed = Router(intents, embedder, confident=0.82, margin=0.08)
        row["fixed_0.82"] = evaluate(fixed, cases)
        reg = Router(intents, embedder, confident=registry[0], margin=registry[1], source=registry[2])
        row["registry"] = {"bars": [registry[0], registry[1], registry[2]], **evaluate(reg, cases)}
        cal = calibrate(Router(intents, embedder), target_precision=0.9)
        tuned = Router(intents, embedder)
        tuned.apply(cal)
        row["calibrated"] = {"calibration": cal.as_dict(), **evaluate(tuned, cases)}
        out.append(row)
        print(json.dumps(row), file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, default=DATA / "clinc150_examples.jsonl")
    parser.add_argument("--cases", type=Path, default=DATA / "clinc150_cases.jsonl")
    parser.add_argument("--json", type=Path, default=None, help=f"default {RESULTS}")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: 3 examples per intent, 30 cases, results to a temp file"
    )
    args = parser.parse_args()
    if args.json is None:
        args.json = results_path("router", smoke=True) if args.smoke else RESULTS

    pool, cases = read(args.examples), read(args.cases)
    if args.smoke:
        cases = cases[::8]  # every label still represented
    demo = read(DEMO_CASES, "queue")
    demo_pool: list[tuple[str, str]] = []
    demo_cases: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for text, label in demo:
        seen[label] = seen.get(label, 0) + 1
        (demo_pool if seen[label] <= 3 else demo_cases).append((text, label))
    texts = sorted({t for t, _ in pool + cases + demo})
    matrix, identity = embed(texts, "router-bench")
    embedder = Cached(identity, dict(zip(texts, matrix, strict=True)))
    rows = run_set("clinc150-9", pool, cases, embedder, (3,) if args.smoke else (3, 5, 10, 20))
    rows += run_set("demo-tickets", demo_pool, demo_cases, embedder, (3,))
    report = {
        **provenance(smoke=args.smoke),
        "model": MODEL,
        "examples": str(args.examples.name),
        "cases": str(args.cases.name),
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
