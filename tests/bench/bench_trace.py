"""Benchmark: TraceWriter appends/s against a bare write+flush+fsync loop, side by side.

    python tests/bench/bench_trace.py [--n N] [--rounds R] [--json OUT]

Both write lines of equal size (the bare loop writes the bytes TraceWriter wrote) to two
files in a temp directory on the repository's filesystem, interleaved event by event with
the order alternating, so both see the same disk; the table shows medians over rounds. A second table
compares ``read_trace`` with a bare ``split + json.loads`` over the same file.
Results go to ``tests/bench/results/trace.json`` unless ``--json`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.trace import Event, TraceWriter, format_ts, read_trace, rules  # noqa: E402

PAYLOAD: dict[str, Any] = {
    "verb": "decide",
    "agent": "agent.local",
    "model": "gemma-3-270m-q4_k_m",
    "duration_ms": 412,
    "response": {"intent": "go_west", "slots": {"n": "1"}, "confidence": 0.91},
    "meta": {"model": "gemma-3-270m-q4_k_m", "prompt_tokens": 213, "completion_tokens": 17, "grammar": True},
}


def run_interleaved(ours_path: Path, bare_path: Path, n: int) -> tuple[float, float, int]:
    """Time each TraceWriter append and each bare write of the same line, event by event.

    Interleaving (and alternating which goes first) puts both under the same disk conditions:
    fsync latency drifts by tens of percent over seconds on a shared disk.
    """
    ours = bare = 0.0
    total_bytes = 0
    with TraceWriter.open(ours_path) as w, open(bare_path, "ab") as fh:
        fd = fh.fileno()
        line = b""
        for i in range(n):
            kwargs: dict[str, Any] = {"turn": 1 + i // 10, "state_path": "foyer", "call_id": "7f65dee5291ba5d4"}
            if i % 2 == 0:
                t0 = time.perf_counter()
                ev = w.append("agent.call.complete", PAYLOAD, **kwargs)
                t1 = time.perf_counter()
                line = ev.to_line() + b"\n"
                t2 = time.perf_counter()
                fh.write(line)
                fh.flush()
                os.fsync(fd)
                t3 = time.perf_counter()
            else:
                # the bare write goes first, with a line of the size the writer is about to write
                t2 = time.perf_counter()
                fh.write(line)
                fh.flush()
                os.fsync(fd)
                t3 = time.perf_counter()
                t0 = time.perf_counter()
                w.append("agent.call.complete", PAYLOAD, **kwargs)
                t1 = time.perf_counter()
            ours += t1 - t0
            bare += t3 - t2
            total_bytes += len(line)
    return ours, bare, total_bytes


def encode_only(n: int) -> float:
    """The writer's CPU work per event without the I/O: write-time checks + encoding."""
    start = time.perf_counter()
    for i in range(n):
        clean = rules.check_value(PAYLOAD, "payload")
        Event(1 + i // 10, i % 10, format_ts(), "agent.call.complete", clean, "foyer", None, "x").to_line()
    return time.perf_counter() - start


def read_ours(path: Path) -> float:
    start = time.perf_counter()
    read_trace(path)
    return time.perf_counter() - start


def read_bare(path: Path) -> float:
    start = time.perf_counter()
    data = path.read_bytes()
    for line in data.split(b"\n")[:-1]:
        json.loads(line)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="events per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--json", type=Path, default=REPO / "tests" / "bench" / "results" / "trace.json")
    args = parser.parse_args(argv)
    n, rounds = args.n, args.rounds

    tmp = Path(tempfile.mkdtemp(prefix=".bench-trace-", dir=REPO))
    try:
        ours: list[float] = []
        bare: list[float] = []
        reads_ours: list[float] = []
        reads_bare: list[float] = []
        line_bytes = 0
        for r in range(rounds):
            trace_path = tmp / f"ours-{r}.jsonl"
            o, b, nbytes = run_interleaved(trace_path, tmp / f"bare-{r}.jsonl", n)
            ours.append(o)
            bare.append(b)
            line_bytes = round(nbytes / n)
            reads_ours.append(read_ours(trace_path))
            reads_bare.append(read_bare(trace_path))
        encode_s = statistics.median(encode_only(n) for _ in range(rounds))
        w_ours, w_bare = statistics.median(ours), statistics.median(bare)
        r_ours, r_bare = statistics.median(reads_ours), statistics.median(reads_bare)
        fs = os.statvfs(tmp)
        result = {
            "n": n,
            "rounds": rounds,
            "line_bytes": line_bytes,
            "dir": str(tmp.parent),
            "fs_block_size": fs.f_bsize,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "write": {
                "tracewriter_appends_per_s": n / w_ours,
                "bare_fsync_appends_per_s": n / w_bare,
                "ratio_tracewriter_over_bare": w_bare / w_ours,
                "encode_only_us_per_event": encode_s / n * 1e6,
                "tracewriter_us_per_event": w_ours / n * 1e6,
                "bare_us_per_event": w_bare / n * 1e6,
                "tracewriter_s": ours,
                "bare_s": bare,
            },
            "read": {
                "read_trace_events_per_s": n / r_ours,
                "bare_json_loads_events_per_s": n / r_bare,
                "ratio_read_trace_over_bare": r_bare / r_ours,
            },
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    wr, rd = result["write"], result["read"]
    print(f"trace bench: {n} events x {rounds} rounds, ~{line_bytes} bytes/line, dir {result['dir']}")
    print()
    print(f"{'write (fsync per event)':<34}{'appends/s':>12}{'vs bare':>10}")
    print(
        f"{'TraceWriter.append':<34}{wr['tracewriter_appends_per_s']:>12.0f}{wr['ratio_tracewriter_over_bare']:>10.2f}"
    )
    print(f"{'bare write+flush+fsync':<34}{wr['bare_fsync_appends_per_s']:>12.0f}{1.0:>10.2f}")
    print(
        f"(checks + encoding alone: {wr['encode_only_us_per_event']:.1f} us/event; an append: "
        f"{wr['tracewriter_us_per_event']:.0f} us; a bare fsync'd write: {wr['bare_us_per_event']:.0f} us)"
    )
    print()
    print(f"{'read':<34}{'events/s':>12}{'vs bare':>10}")
    ratio = rd["ratio_read_trace_over_bare"]
    print(f"{'read_trace (all rules)':<34}{rd['read_trace_events_per_s']:>12.0f}{ratio:>10.2f}")
    print(f"{'bare split + json.loads':<34}{rd['bare_json_loads_events_per_s']:>12.0f}{1.0:>10.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
