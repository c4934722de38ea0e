"""``localllm trace verify|show|stats F`` — read-only commands over a trace file."""

from __future__ import annotations

import argparse
import math
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from localllm.errors import TraceCorrupted, TraceError
from localllm.trace.event import Event
from localllm.trace.reader import Trace, load_object, read_trace
from localllm.trace.writer import TORN_SUFFIX

__all__ = ["add_commands", "percentile", "sidecar_problems", "trace_stats"]

_CALL_END = ("agent.call.complete", "agent.call.error")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trace verify|show|stats`` to the CLI."""
    trace = sub.add_parser("trace", help="verify, show or summarise a JSONL trace")
    tsub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)

    verify = tsub.add_parser("verify", help="check every read-time rule and the sidecar files")
    verify.add_argument("file", type=Path)
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.set_defaults(handler=_verify)

    show = tsub.add_parser("show", help="list the events (line, turn, seq, ts, kind, call_id)")
    show.add_argument("file", type=Path)
    show.add_argument("--json", action="store_true", help="print the events as JSON")
    show.add_argument(
        "--kind", action="append", metavar="K", help="only kind K or kinds under K. (repeatable)"
    )
    show.set_defaults(handler=_show)

    stats = tsub.add_parser("stats", help="counts per kind, agent calls, fallbacks, durations")
    stats.add_argument("file", type=Path)
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.set_defaults(handler=_stats)


# --------------------------------------------------------------------------- verify


def _verify(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json

    path: Path = args.file
    problems: list[str] = []
    trace: Trace | None = None
    try:
        trace = read_trace(path, allow_torn=True)
    except TraceCorrupted as exc:
        problems.append(str(exc))
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if trace is not None:
        if trace.torn_tail is not None:
            problems.append(
                f"trace corrupted: missing trailing newline at EOF (torn last line, {len(trace.torn_tail)} "
                f"bytes; opening the trace for append moves them to {path.name}{TORN_SUFFIX})"
            )
        problems.extend(sidecar_problems(trace, path.parent))
    if args.json:
        emit_json(
            {
                "path": str(path),
                "ok": not problems,
                "events": len(trace.events) if trace else None,
                "turns": len({ev.turn for ev in trace.events}) if trace else None,
                "torn_bytes": len(trace.torn_tail) if trace and trace.torn_tail else 0,
                "problems": problems,
            }
        )
    elif problems:
        for problem in problems:
            print(f"{path}: {problem}")
    else:
        assert trace is not None
        turns = len({ev.turn for ev in trace.events})
        print(f"{path}: ok ({len(trace.events)} events in {turns} turns)")
    return 1 if problems else 0


def sidecar_problems(trace: Trace, trace_dir: Path) -> list[str]:
    """Missing or escaping sidecar files referenced by ``prompt_file``/``response_file``/``transcript_ref``."""
    problems: list[str] = []
    for index, ev in enumerate(trace.events):
        lineno = index + 2
        for key, rel in _sidecar_refs(ev.payload):
            where = f"line {lineno}: payload.{key}"
            if not isinstance(rel, str) or not rel:
                problems.append(f"{where} must be a relative path string")
                continue
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts:
                problems.append(f"{where} {rel!r} points outside the trace directory")
                continue
            target = trace_dir / pure
            if not target.is_file():
                problems.append(f"{where}: sidecar file {rel} is missing")
                continue
            if key.endswith("transcript_ref"):
                problems.extend(_transcript_problems(ev.payload[key], target, where))
    return problems


def _sidecar_refs(payload: dict[str, Any]) -> list[tuple[str, object]]:
    refs: list[tuple[str, object]] = []
    for key in ("prompt_file", "response_file"):
        if key in payload:
            refs.append((key, payload[key]))
    for key, value in payload.items():
        if key.endswith("transcript_ref"):
            refs.append((key, value.get("path") if isinstance(value, dict) else None))
    return refs


def _transcript_problems(ref: dict[str, Any], target: Path, where: str) -> list[str]:
    problems: list[str] = []
    try:
        data = target.read_bytes()
    except OSError as exc:
        return [f"{where}: cannot read {target.name}: {exc.strerror or exc}"]
    count = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    events = ref.get("events")
    if events != count:
        problems.append(f"{where}: transcript has {count} lines but the ref says events={events!r}")
    timings = target.with_suffix(".timings")
    if not timings.is_file():
        problems.append(f"{where}: timings file {timings.name} is missing")
    return problems


# --------------------------------------------------------------------------- show


def _show(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json

    trace = _load(args.file)
    kinds: list[str] = args.kind or []
    rows = [
        (index + 2, ev, raw)
        for index, (ev, raw) in enumerate(zip(trace.events, trace.raw_lines, strict=True))
        if not kinds or any(ev.kind == k or ev.kind.startswith(k.rstrip(".") + ".") for k in kinds)
    ]
    if args.json:
        out = []
        for _, _, raw in rows:
            obj, _problem = load_object(raw.decode("utf-8"))
            out.append(obj)
        emit_json(out)
        return 0
    table = [("LINE", "TURN", "SEQ", "TS", "KIND", "CALL_ID")]
    table += [(str(n), str(ev.turn), str(ev.seq), ev.ts, ev.kind, ev.call_id or "") for n, ev, _ in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


# --------------------------------------------------------------------------- stats


def _stats(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json

    trace = _load(args.file)
    stats = trace_stats(trace.events)
    if args.json:
        emit_json(stats)
        return 0
    print(f"{args.file}: {stats['events']} events in {stats['turns']} turns")
    print()
    width = max([len(k) for k in stats["kinds"]] + [4])
    print(f"{'KIND'.ljust(width)}  COUNT")
    for kind, count in stats["kinds"].items():
        print(f"{kind.ljust(width)}  {count}")
    calls = stats["calls"]
    print()
    print(
        f"agent calls: {calls['total']} (ok {calls['ok']}, error {calls['error']}, "
        f"fallbacks {calls['fallbacks']}); duration p50 {_ms(calls['p50_ms'])}, p95 {_ms(calls['p95_ms'])}"
    )
    if stats["agents"]:
        header = ("AGENT", "CALLS", "OK", "ERROR", "FALLBACKS", "P50_MS", "P95_MS")
        table = [header] + [
            (
                name,
                str(a["total"]),
                str(a["ok"]),
                str(a["error"]),
                str(a["fallbacks"]),
                _ms(a["p50_ms"]),
                _ms(a["p95_ms"]),
            )
            for name, a in stats["agents"].items()
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        print()
        for row in table:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def trace_stats(events: tuple[Event, ...] | list[Event]) -> dict[str, Any]:
    """Counts per kind; agent calls ok/error/fallbacks and duration percentiles, overall and per agent.

    A call is one ``agent.call.complete`` (ok) or ``agent.call.error`` event. It counts as a
    fallback when its payload has ``substitution`` or its ``meta`` has ``fallback_of`` or
    ``substitution``. Percentiles use the nearest-rank method over ``duration_ms``.
    """
    kinds = Counter(ev.kind for ev in events)
    overall = _CallTally()
    agents: dict[str, _CallTally] = {}
    for ev in events:
        if ev.kind not in _CALL_END:
            continue
        agent = ev.payload.get("agent")
        name = agent if isinstance(agent, str) and agent else "(unnamed)"
        for tally in (overall, agents.setdefault(name, _CallTally())):
            tally.add(ev)
    return {
        "events": len(events),
        "turns": len({ev.turn for ev in events}),
        "kinds": dict(sorted(kinds.items())),
        "calls": overall.summary(),
        "agents": {name: agents[name].summary() for name in sorted(agents)},
    }


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (``pct`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


class _CallTally:
    def __init__(self) -> None:
        self.ok = 0
        self.error = 0
        self.fallbacks = 0
        self.durations: list[float] = []

    def add(self, ev: Event) -> None:
        if ev.kind == "agent.call.complete":
            self.ok += 1
        else:
            self.error += 1
        meta = ev.payload.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        if "substitution" in ev.payload or "fallback_of" in meta or "substitution" in meta:
            self.fallbacks += 1
        duration = ev.payload.get("duration_ms")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool) and math.isfinite(duration):
            self.durations.append(duration)

    def summary(self) -> dict[str, Any]:
        return {
            "total": self.ok + self.error,
            "ok": self.ok,
            "error": self.error,
            "fallbacks": self.fallbacks,
            "p50_ms": percentile(self.durations, 50),
            "p95_ms": percentile(self.durations, 95),
        }


# --------------------------------------------------------------------------- helpers


def _load(path: Path) -> Trace:
    """Read for display: a torn last line is reported on stderr, not fatal."""
    from localllm.cli import err

    try:
        trace = read_trace(path, allow_torn=True)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if trace.torn_tail is not None:
        err(f"localllm: warning: {path}: torn last line ({len(trace.torn_tail)} bytes) ignored")
    return trace


def _unreadable(path: Path, exc: OSError) -> TraceError:
    error = TraceError(f"cannot read trace {path}: {exc.strerror or exc}")
    error.hint = "check the path"
    return error


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}"
