"""Benchmark: TraceWriter appends/s against a bare write+flush+fsync loop, side by side.

    python tests/bench/bench_trace.py [--smoke] [--n N] [--rounds R] [--json OUT]

Four arms write lines of equal size to four files in a temp directory on the repository's
filesystem, interleaved event by event in every order in turn, so all see the same disk:
``TraceWriter.append`` (checks, encoding, the replaced-file check, one ``O_DSYNC`` write); a bare
``write+flush+fsync`` of the bytes TraceWriter wrote (the physical limit of a durable
line, and the baseline the goal ratio, ``>= 0.9``, is stated against); ``json.dumps`` of
the event + write + flush + fsync (the least a JSONL logger that fsyncs does); and a bare
``write`` on an ``O_DSYNC`` descriptor (the bare equivalent of what TraceWriter does: one
syscall, durable when it returns). The table shows medians over rounds, and what an append costs beyond the
bare write in µs (the stable figure: fsync latency drifts with the disk). A second table
breaks an append into its steps (checks, timestamp, encoding, the replaced-file ``stat``), each
timed on its own right after a synchronous write, right after a 200 µs ``time.sleep`` (a block
with no I/O) and in a hot loop, beside two controls (a ``json.dumps`` and a 12 µs busy-wait):
where the time beyond the bare write goes. A third
compares ``read_trace`` with a bare ``split + json.loads`` over the same file. Results go to
``tests/bench/results/trace.json`` unless ``--json`` says otherwise (``--smoke``: a temp file).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.trace import Event, TraceWriter, format_ts, read_trace, rules  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

PAYLOAD: dict[str, Any] = {
    "verb": "decide",
    "agent": "agent.local",
    "model": "gemma-3-270m-q4_k_m",
    "duration_ms": 412,
    "response": {"intent": "go_west", "slots": {"n": "1"}, "confidence": 0.91},
    "meta": {"model": "gemma-3-270m-q4_k_m", "prompt_tokens": 213, "completion_tokens": 17, "grammar": True},
}


def run_interleaved(paths: tuple[Path, Path, Path, Path], n: int, before: Any = None) -> dict[str, Any]:
    """Time each TraceWriter append, each bare write of the same line and each dumps+write.

    Interleaving (every order of the arms in turn) puts all under the same disk conditions:
    fsync latency drifts by tens of percent over seconds on a shared disk. ``before``: an
    older TraceWriter class (``--before``), one more arm.
    """
    ours_path, bare_path, dumps_path, dsync_path = paths
    arms = ARMS + (["before"] if before is not None else [])
    # every order in turn, not a rotation: a rotation keeps each arm behind the same one, and
    # an fsync's cost depends on what the previous one left in the journal
    orders = list(itertools.permutations(arms))
    spent = dict.fromkeys(arms, 0.0)
    total_bytes = 0
    with contextlib.ExitStack() as stack:
        w = stack.enter_context(TraceWriter.open(ours_path))
        fh = stack.enter_context(open(bare_path, "ab"))
        dh = stack.enter_context(open(dumps_path, "ab"))
        old: Any = stack.enter_context(before.open(ours_path.with_name("before-" + ours_path.name))) if before else None
        fd, dfd = fh.fileno(), dh.fileno()
        # the bare equivalent of what TraceWriter does: one write on an O_DSYNC descriptor
        sfd = os.open(dsync_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC, 0o644)
        stack.callback(os.close, sfd)
        line = b""
        for i in range(n):
            kwargs: dict[str, Any] = {"turn": 1 + i // 10, "state_path": "foyer", "call_id": "7f65dee5291ba5d4"}
            for arm in orders[i % len(orders)]:
                t0 = time.perf_counter()
                if arm == "ours":
                    ev = w.append("agent.call.complete", PAYLOAD, **kwargs)
                elif arm == "before":
                    old.append("agent.call.complete", PAYLOAD, **kwargs)
                elif arm == "bare":
                    # before the first append, a line of the size the writer is about to write
                    fh.write(line or b"x" * 400 + b"\n")
                    fh.flush()
                    os.fsync(fd)
                elif arm == "bare_dsync":
                    os.write(sfd, line or b"x" * 400 + b"\n")
                else:
                    record = {"turn": kwargs["turn"], "seq": i % 10, "ts": "2026-12-01T22:00:00.000000000Z"}
                    record.update(kind="agent.call.complete", state_path="foyer", payload=PAYLOAD)
                    record["call_id"] = kwargs["call_id"]
                    dh.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
                    dh.flush()
                    os.fsync(dfd)
                spent[arm] += time.perf_counter() - t0
                if arm == "ours":
                    line = ev.to_line() + b"\n"
            total_bytes += len(line)
    return {**spent, "bytes": total_bytes}


ARMS = ["ours", "bare", "dumps", "bare_dsync"]


def before_writer(ref: str, tmp: Path) -> Any:
    """TraceWriter as it was at ``ref``: the package copied as ``localllm_before`` (imports renamed)."""
    archive = subprocess.run(["git", "archive", ref, "localllm"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    package = tmp / "localllm_before"
    (tmp / "localllm").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\b(from|import) localllm\b", r"\1 localllm_before", text)
        path.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(tmp))
    module = importlib.import_module("localllm_before.trace.writer")
    return module.TraceWriter


def after_a_sync(directory: Path, n: int) -> list[dict[str, Any]]:
    """Each step of an append on its own, right after a synchronous write and in a hot loop.

    Every step runs before a bare ``O_DSYNC`` write, the steps shuffled event by event (as in
    :func:`run_interleaved`, every step runs right after some file's synchronous write). What
    a step adds to the bare write is its cost after a sync; the same step right after a
    200 µs ``time.sleep`` (the thread blocks, no I/O) is its cost after any block; the same
    call repeated back to back is its cost hot.
    """
    line = b"x" * 400 + b"\n"
    stat_path = directory / "stat-target"
    stat_path.touch()
    event = Event(1, 0, format_ts(), "agent.call.complete", PAYLOAD, "foyer", None, "7f65dee5291ba5d4")

    def busy_12us() -> None:
        until = time.perf_counter() + 12e-6
        while time.perf_counter() < until:
            pass

    bare = "nothing (the bare O_DSYNC write)"
    steps: dict[str, Any] = {
        bare: lambda: None,
        "checks: rules.check_value(payload)": lambda: rules.check_value(PAYLOAD, "payload"),
        "timestamp: format_ts()": format_ts,
        "the encoding: Event.to_line()": event.to_line,
        "the replaced-file check: os.stat(path)": lambda: os.stat(stat_path),
        "control: json.dumps(payload)": lambda: json.dumps(PAYLOAD),
        "control: a 12 us busy-wait": busy_12us,
    }
    # the files rotate among the steps event by event: a file's sync cost depends on where
    # its blocks lie, so each step writes to each file equally often
    place = {name: i for i, name in enumerate(steps)}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC
    fds = [os.open(directory / f"steps-{i}", flags, 0o644) for i in range(len(steps))]
    spent = dict.fromkeys(steps, 0.0)
    names = list(steps)
    shuffle = random.Random(7).shuffle
    try:
        for i in range(n):
            shuffle(names)
            for name in names:
                step, fd = steps[name], fds[(place[name] + i) % len(fds)]
                t0 = time.perf_counter()
                step()
                os.write(fd, line)
                spent[name] += time.perf_counter() - t0
    finally:
        for fd in fds:
            os.close(fd)
    # the same steps right after a 200 us sleep, no I/O at all: is it the sync, or any block?
    slept = dict.fromkeys(steps, 0.0)
    for _ in range(n):
        shuffle(names)
        for name in names:
            time.sleep(200e-6)
            t0 = time.perf_counter()
            steps[name]()
            slept[name] += time.perf_counter() - t0
    rows = []
    for name, step in steps.items():
        start = time.perf_counter()
        for _ in range(n):
            step()
        hot_us = (time.perf_counter() - start) / n * 1e6
        after_us = (spent[name] - spent[bare]) / n * 1e6
        sleep_us = (slept[name] - slept[bare]) / n * 1e6
        rows.append({"step": name, "after_sync_us": after_us, "after_sleep_us": sleep_us, "hot_us": hot_us})
    return rows


def encode_only(n: int) -> float:
    """The writer's CPU work per event without the I/O: write-time checks + encoding."""
    start = time.perf_counter()
    for i in range(n):
        clean = rules.check_value(PAYLOAD, "payload")
        Event(1 + i // 10, i % 10, format_ts(), "agent.call.complete", clean, "foyer", None, "x").to_line()
    return time.perf_counter() - start


def checks_only(n: int) -> float:
    """The write-time checks alone (``rules.check_value`` of the payload)."""
    start = time.perf_counter()
    for _ in range(n):
        rules.check_value(PAYLOAD, "payload")
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="events per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--smoke", action="store_true", help="CI: 30 events, 1 round (results to a temp file)")
    parser.add_argument("--before", metavar="REF", help="a fourth arm: TraceWriter as of this git ref")
    parser.add_argument("--json", type=Path, default=None, help="default: tests/bench/results/trace.json")
    args = parser.parse_args(argv)
    n, rounds = (30, 1) if args.smoke else (args.n, args.rounds)
    out = args.json or results_path("trace", smoke=args.smoke)

    tmp = Path(tempfile.mkdtemp(prefix=".bench-trace-", dir=REPO))
    try:
        before = before_writer(args.before, tmp) if args.before else None
        runs: list[dict[str, Any]] = []
        reads_ours: list[float] = []
        reads_bare: list[float] = []
        for r in range(rounds):
            trace_path = tmp / f"ours-{r}.jsonl"
            paths = (trace_path, tmp / f"bare-{r}.jsonl", tmp / f"dumps-{r}.jsonl", tmp / f"dsync-{r}.jsonl")
            runs.append(run_interleaved(paths, n, before))
            reads_ours.append(read_ours(trace_path))
            reads_bare.append(read_bare(trace_path))
        steps = after_a_sync(tmp, n)
        line_bytes = round(runs[-1]["bytes"] / n)
        encode_s = statistics.median(encode_only(n) for _ in range(rounds))
        checks_s = statistics.median(checks_only(n) for _ in range(rounds))
        w_ours, w_bare, w_dumps, w_dsync = (statistics.median(run[arm] for run in runs) for arm in ARMS)
        r_ours, r_bare = statistics.median(reads_ours), statistics.median(reads_bare)
        fs = os.statvfs(tmp)
        result = {
            **provenance(smoke=args.smoke),
            "n": n,
            "rounds": rounds,
            "line_bytes": line_bytes,
            "dir": str(tmp.parent),
            "fs_block_size": fs.f_bsize,
            "fsync_policy": "one O_DSYNC write per event (data and file size durable), before append() returns",
            "write": {
                "tracewriter_appends_per_s": n / w_ours,
                "bare_fsync_appends_per_s": n / w_bare,
                "dumps_fsync_appends_per_s": n / w_dumps,
                "bare_dsync_appends_per_s": n / w_dsync,
                "ratio_tracewriter_over_bare": w_bare / w_ours,
                "ratio_tracewriter_over_bare_dsync": w_dsync / w_ours,
                "ratio_bare_dsync_over_bare": w_bare / w_dsync,
                "ratio_tracewriter_over_dumps": w_dumps / w_ours,
                "ratios_per_round": [run["bare"] / run["ours"] for run in runs],
                "ratios_over_bare_dsync_per_round": [run["bare_dsync"] / run["ours"] for run in runs],
                "encode_only_us_per_event": encode_s / n * 1e6,
                "checks_only_us_per_event": checks_s / n * 1e6,
                "encoding_us_per_event": (encode_s - checks_s) / n * 1e6,
                "tracewriter_us_per_event": w_ours / n * 1e6,
                "bare_us_per_event": w_bare / n * 1e6,
                "dumps_us_per_event": w_dumps / n * 1e6,
                "bare_dsync_us_per_event": w_dsync / n * 1e6,
                "beyond_bare_us_per_event": (w_ours - w_bare) / n * 1e6,
                "tracewriter_s": [run["ours"] for run in runs],
                "bare_s": [run["bare"] for run in runs],
                "dumps_s": [run["dumps"] for run in runs],
                "bare_dsync_s": [run["bare_dsync"] for run in runs],
                **(
                    {
                        "before_ref": args.before,
                        "before_appends_per_s": n / statistics.median(run["before"] for run in runs),
                        "ratio_before_over_bare": w_bare / statistics.median(run["before"] for run in runs),
                        "before_ratios_per_round": [run["bare"] / run["before"] for run in runs],
                        "before_s": [run["before"] for run in runs],
                    }
                    if before is not None
                    else {}
                ),
            },
            "after_a_sync": steps,
            "read": {
                "read_trace_events_per_s": n / r_ours,
                "bare_json_loads_events_per_s": n / r_bare,
                "ratio_read_trace_over_bare": r_bare / r_ours,
            },
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    wr, rd = result["write"], result["read"]
    print(
        f"trace bench: {n} events x {rounds} rounds, ~{line_bytes} bytes/line, dir {result['dir']}, "
        f"commit {result['commit']}"
    )
    print()
    print(f"{'write (durable per event)':<34}{'appends/s':>12}{'vs bare':>10}{'us/event':>10}")
    rows: list[tuple[str, float, float, float]] = [
        ("TraceWriter.append", wr["tracewriter_appends_per_s"], wr["ratio_tracewriter_over_bare"], w_ours),
        ("bare write+flush+fsync", wr["bare_fsync_appends_per_s"], 1.0, w_bare),
        ("json.dumps+write+flush+fsync", wr["dumps_fsync_appends_per_s"], w_bare / w_dumps, w_dumps),
        ("bare O_DSYNC write", wr["bare_dsync_appends_per_s"], w_bare / w_dsync, w_dsync),
    ]
    if before is not None:
        w_before = statistics.median(run["before"] for run in runs)
        rows.append((f"TraceWriter.append at {args.before}", n / w_before, w_bare / w_before, w_before))
    for name, rate, ratio, spent in rows:
        print(f"{name:<34}{rate:>12.0f}{ratio:>10.2f}{spent / n * 1e6:>10.0f}")
    print(
        f"(an append beyond a bare fsync'd write: {wr['beyond_bare_us_per_event']:.1f} us; checks + encoding alone: "
        f"{wr['encode_only_us_per_event']:.1f} us, of which checks {wr['checks_only_us_per_event']:.1f} us and "
        f"the event + its encoding {wr['encoding_us_per_event']:.1f} us; ratio per round: "
        f"{', '.join(f'{x:.2f}' for x in wr['ratios_per_round'])})"
    )
    print(
        f"(the goal's ratio is against bare write+flush+fsync; against a bare O_DSYNC write, what TraceWriter "
        f"now does: {wr['ratio_tracewriter_over_bare_dsync']:.2f}, per round "
        f"{', '.join(f'{x:.2f}' for x in wr['ratios_over_bare_dsync_per_round'])})"
    )
    print()
    print(f"{'one step, then a bare O_DSYNC write':<56}{'+us after a sync':>18}{'after a sleep':>15}{'us hot':>9}")
    for row in steps:
        print(f"{row['step']:<56}{row['after_sync_us']:>18.1f}{row['after_sleep_us']:>15.1f}{row['hot_us']:>9.1f}")
    print()
    print(f"{'read':<34}{'events/s':>12}{'vs bare':>10}")
    ratio = rd["ratio_read_trace_over_bare"]
    print(f"{'read_trace (all rules)':<34}{rd['read_trace_events_per_s']:>12.0f}{ratio:>10.2f}")
    print(f"{'bare split + json.loads':<34}{rd['bare_json_loads_events_per_s']:>12.0f}{1.0:>10.2f}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
