"""Runtime.call overhead with an in-process agent vs calling the function directly.

    python tests/bench/bench_runtime.py [--n N] [--quick] [--json OUT]

Measured side by side in one run, interleaved in blocks: (1) the bare function, (2)
Runtime.call without a schema or trace, (3) with schema validation, (4) with schema and a
JSONL trace (fsync per event). Prints µs per call and the ratios; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._provenance import provenance, results_path  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"enum": ["yes", "no"]}, "score": {"type": "number"}},
    "required": ["verdict", "score"],
}


def agent(_: Any) -> dict[str, Any]:
    return {"verdict": "yes", "score": 0.5}


def per_call_us(fn: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="CI: every variant, 50 calls (results to a temp file)")
    parser.add_argument("--json", type=Path, default=None, help="default: tests/bench/results/runtime.json")
    args = parser.parse_args()
    n = 50 if args.smoke else 200 if args.quick else args.n
    out = args.json or results_path("runtime", smoke=args.smoke)
    from localllm import Runtime, load_config
    from localllm.wire import AskRequest

    with tempfile.TemporaryDirectory(dir=REPO) as tmp:
        cfg = Path(tmp) / "app.yaml"
        cfg.write_text("agent_plugins:\n  agent.fn: {plugin: builtin.inprocess}\n")
        config = load_config(cfg)
        request = AskRequest(
            session_id="s",
            turn=1,
            state_path="x",
            verb="decide",
            prompt="p",
            call_id="c",
            deadline="2030-01-01T00:00:00.000000000Z",
        )
        plain = Runtime(config)
        traced = Runtime(config, trace=Path(tmp) / "t.jsonl")
        for rt in (plain, traced):
            rt.register_inprocess("agent.fn", agent)
        variants = {
            "direct function": lambda: agent(request),
            "Runtime.call": lambda: plain.call("decide", agent="agent.fn", prompt="p"),
            "Runtime.call + schema": lambda: plain.call("decide", agent="agent.fn", prompt="p", schema=SCHEMA),
            "Runtime.call + schema + trace": lambda: traced.call("decide", agent="agent.fn", prompt="p", schema=SCHEMA),
        }
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up: compile the validator, open files
            per_call_us(fn, 20)
        for _ in range(5):  # interleaved blocks, so drift hits every variant alike
            for name, fn in variants.items():
                block = max(1, n // 5) if name != "Runtime.call + schema + trace" else max(1, n // 50)
                samples[name].append(per_call_us(fn, block))
        plain.close()
        traced.close()
    result = {name: statistics.median(v) for name, v in samples.items()}
    base = result["direct function"]
    print(f"{'variant':34} {'µs/call':>10} {'× direct':>10}")
    for name, us in result.items():
        print(f"{name:34} {us:10.1f} {us / base:10.0f}")
    print(
        f"Runtime.call overhead per call: {result['Runtime.call'] - base:.0f} µs "
        f"(a worker thread per call, request building, call_id, loose JSON parse)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**provenance(smoke=args.smoke), "n": n, "us_per_call": result}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
