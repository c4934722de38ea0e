"""``verify_trace``: every read-time rule of a trace file, plus its sidecar files.

A torn last line is reported, not fatal; a sidecar reference must be a relative path
inside the trace directory to a file that exists, and a transcript must have the line
count its ref states and a ``.timings`` file beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from localllm._fs import inside, read_capped
from localllm.errors import TraceCorrupted, TraceError
from localllm.trace.reader import Trace, read_trace
from localllm.trace.sidecars import is_temp_ref, sidecar_refs
from localllm.trace.writer import TORN_SUFFIX

__all__ = ["TraceReport", "sidecar_problems", "unreadable", "verify_trace"]


@dataclass(frozen=True)
class TraceReport:
    """The verdict on one trace file: ``ok`` when ``problems`` is empty."""

    path: Path
    trace: Trace | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        trace = self.trace
        return {
            "path": str(self.path),
            "ok": self.ok,
            "events": len(trace.events) if trace is not None else None,
            "turns": len({ev.parent_turn if ev.parent_turn is not None else ev.turn for ev in trace.events})
            if trace is not None
            else None,
            "torn_bytes": len(trace.torn_tail) if trace is not None and trace.torn_tail else 0,
            "problems": list(self.problems),
        }


def verify_trace(path: Path, *, lenient: bool = False) -> TraceReport:
    """Check ``path``; an unreadable file raises ``TraceError``, a broken one is a report.

    ``lenient=True`` accepts interleaved turns (traces from earlier localllm versions).
    """
    problems: list[str] = []
    trace: Trace | None = None
    try:
        trace = read_trace(path, allow_torn=True, lenient=lenient)
    except TraceCorrupted as exc:
        problem = str(exc)
        if "cross-turn ordering violation" in problem:
            problem += " (earlier localllm versions let turns interleave: --lenient reads such a trace)"
        problems.append(problem)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if trace is not None:
        if trace.torn_tail is not None:
            problems.append(
                f"trace corrupted: missing trailing newline at EOF (torn last line, {len(trace.torn_tail)} "
                f"bytes; opening the trace for append moves them to {path.name}{TORN_SUFFIX})"
            )
        problems.extend(sidecar_problems(trace, path.parent))
    return TraceReport(path, trace, problems)


def unreadable(path: Path, exc: OSError) -> TraceError:
    """The error for a trace file that cannot be opened or read."""
    return TraceError(f"cannot read trace {path}: {exc.strerror or exc}", hint="check the path")


def sidecar_problems(trace: Trace, trace_dir: Path) -> list[str]:
    """Missing or escaping sidecar files referenced by ``prompt_file``/``response_file``/``transcript_ref``."""
    problems: list[str] = []
    for index, ev in enumerate(trace.events):
        lineno = index + 2
        for key, rel in sidecar_refs(ev.payload):
            where = f"line {lineno}: payload.{key}"
            if not isinstance(rel, str) or not rel:
                problems.append(f"{where} must be a relative path string")
                continue
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts:
                problems.append(f"{where} {rel!r} points outside the trace directory")
                continue
            if is_temp_ref(rel):  # what a write left half-done is never a sidecar
                problems.append(f"{where} {rel!r} names a temp file of an unfinished write, not a sidecar")
                continue
            target = trace_dir / pure
            try:
                present = target.is_file()
            except OSError:  # EACCES on a parent: pathlib re-raises it
                present = False
            if present and inside(trace_dir, rel) is None:
                problems.append(f"{where} {rel!r} is a symlink out of the trace directory")
                continue
            if not present:
                problems.append(f"{where}: sidecar file {rel} is missing")
                continue
            if key.endswith("transcript_ref"):
                problems.extend(_transcript_problems(ev.payload[key], target, where))
    return problems


def _transcript_problems(ref: dict[str, Any], target: Path, where: str) -> list[str]:
    problems: list[str] = []
    try:
        data = read_capped(target, None, regular=True)  # never a device, never a named pipe
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
