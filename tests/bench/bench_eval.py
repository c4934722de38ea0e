"""Benchmark: ``localllm eval`` throughput with the gate's ``parallel`` slots vs one by one.

    python tests/bench/bench_eval.py [--quick] [--n N] [--rounds R] [--json OUT]

The demo's triage gate (``examples/demo``: gemma-3-270m, grammar-constrained decide,
``parallel: 2``) over the first N hand-labelled cases of ``examples/demo/evals/triage``.
Each round runs the eval twice against the same kind of sidecar (``--parallel 2``): once
with a thread pool sized to the agent's slots (2), once with 1 worker, alternating which
goes first. Cases/s counts the calls' wall time only (the sidecar is started before the
clock runs, see ``localllm.eval.run``). Prints a table, writes
``tests/bench/results/eval.json`` (``--quick``: ``eval.quick.json``). Not a test: no asserts.
Needs the real llama-server (``LOCALLLM_TEST_SERVER_BIN`` or the user cache) and the model
through ``~/.cache/localllm-e2e/mirror`` (``make e2e-models``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._provenance import provenance, results_path  # noqa: E402

DEMO = REPO / "examples" / "demo"
MIRROR = Path.home() / ".cache" / "localllm-e2e" / "mirror"


def one_run(config: Any, cases: list[Any], workers: int, out: Path) -> dict[str, Any]:
    from localllm.eval import evaluate

    report = evaluate(
        config, "triage", cases=cases, cases_path=DEMO / "evals/triage/cases.jsonl", workers=workers, out_dir=out
    ).report
    row: dict[str, Any] = report["agents"]["agent.local"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 cases, 1 round")
    parser.add_argument("--smoke", action="store_true", help="CI: 2 cases, 1 round (results to a temp file)")
    parser.add_argument("--n", type=int, default=16, help="cases per run (default 16)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    n, rounds = (2, 1) if args.smoke else (6, 1) if args.quick else (args.n, args.rounds)
    if MIRROR.is_dir():
        os.environ.setdefault("LOCALLLM_MIRROR", str(MIRROR))
    if os.environ.get("LOCALLLM_TEST_SERVER_BIN"):
        os.environ.setdefault("LOCALLLM_SERVER_BIN", os.environ["LOCALLLM_TEST_SERVER_BIN"])

    from localllm.eval import load_cases
    from localllm.loading import load_config

    config = load_config(DEMO / "config.yaml")
    cases = load_cases(DEMO / "evals" / "triage" / "cases.jsonl")[:n]
    rates: dict[int, list[float]] = {2: [], 1: []}
    accuracy: dict[int, list[float]] = {2: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        for r in range(rounds):
            order = (2, 1) if r % 2 == 0 else (1, 2)
            for workers in order:
                row = one_run(config, cases, workers, Path(tmp) / f"r{r}w{workers}")
                rates[workers].append(row["cases_per_s"])
                accuracy[workers].append(row["accuracy"])
                print(
                    f"round {r + 1}: workers {workers}: {row['cases_per_s']:.3f} cases/s, "
                    f"p50 {row['latency_ms']['p50']} ms, accuracy {row['accuracy']}",
                    file=sys.stderr,
                )
    par, seq = statistics.median(rates[2]), statistics.median(rates[1])
    result = {
        **provenance(smoke=args.smoke),
        "cases": n,
        "rounds": rounds,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "cases_per_s": {"parallel_2": par, "one_by_one": seq},
        "speedup": round(par / seq, 3),
        "runs": {"parallel_2": rates[2], "one_by_one": rates[1]},
        "accuracy": {"parallel_2": accuracy[2], "one_by_one": accuracy[1]},
    }
    print(f"{'arm':<14} {'cases/s':>8}")
    print(f"{'parallel 2':<14} {par:>8.3f}")
    print(f"{'one by one':<14} {seq:>8.3f}")
    print(f"speedup {par / seq:.2f}x (goal >= 1.5x on 2 cores)")
    target = args.json or results_path("eval", smoke=args.smoke, quick=args.quick)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
