"""``localllm trace verify | show | stats | cases | cassette F``: commands over a trace file.

``cases`` and ``cassette`` turn recorded calls into eval cases and a replayable cassette
(:mod:`localllm.eval.fromtrace`); they write to stdout or, with ``-o``, a file written whole.

Exit 2 when F, ``-c`` or ``-o`` is not a usable path (missing, a directory), or the ``-c``
config fails its load-time checks, before anything is read; 1 when the trace itself is
malformed (for ``verify``: any problem found) — the trace is the data examined, so its flaws
are the verdict, not a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    emit_json,
    err,
    input_path,
    out,
    output_path,
    path_arg,
    warn,
)

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.trace.reader import Trace


def _setup(parser: argparse.ArgumentParser) -> None:
    tsub = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)

    verify = tsub.add_parser("verify", help="check every read-time rule and the sidecar files")
    verify.add_argument("file", type=path_arg, metavar="F")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.add_argument(
        "--lenient", action="store_true", help="accept interleaved turns (traces from earlier localllm versions)"
    )
    verify.set_defaults(handler=_verify)

    show = tsub.add_parser("show", help="list the events (line, turn, seq, ts, kind, call_id)")
    show.add_argument("file", type=path_arg, metavar="F")
    show.add_argument("--json", action="store_true", help="print the events as JSON")
    show.add_argument("--kind", action="append", metavar="K", help="only kind K or kinds under K. (repeatable)")
    show.set_defaults(handler=_show)

    stats = tsub.add_parser("stats", help="counts per kind, agent calls, fallbacks, durations")
    stats.add_argument("file", type=path_arg, metavar="F")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.set_defaults(handler=_stats)

    cases = tsub.add_parser("cases", help="turn a gate's recorded calls into eval cases (unlabelled)")
    cases.add_argument("file", type=path_arg, metavar="F")
    cases.add_argument("--gate", required=True, metavar="G", help="the gate whose calls become cases")
    cases.add_argument("--exact", action="store_true", help="expect the exact recorded submission")
    cases.add_argument(
        "-c", "--config", type=path_arg, metavar="FILE", help="the app config: recorded schema paths are relative to it"
    )
    cases.add_argument("-o", "--output", type=path_arg, metavar="OUT", help="write the JSONL here (default: stdout)")
    cases.add_argument("--json", action="store_true", help="print the cases (or, with -o, what was written) as JSON")
    cases.set_defaults(handler=_cases)

    cassette = tsub.add_parser("cassette", help="turn recorded calls into a replayable cassette (YAML)")
    cassette.add_argument("file", type=path_arg, metavar="F")
    cassette.add_argument("--agent", metavar="ALIAS", help="only the answers of this agent (e.g. agent.claude)")
    cassette.add_argument("--replay-any", action="store_true", help="let every episode replay for ever")
    cassette.add_argument(
        "--match-handler", action="store_true", help="match the routed alias too (default: schema and args only)"
    )
    cassette.add_argument(
        "-c", "--config", type=path_arg, metavar="FILE", help="the app config: its app_id heads the cassette"
    )
    cassette.add_argument(
        "--app-id", metavar="ID", help="the cassette's app_id (default: the config's, or the trace's)"
    )
    cassette.add_argument("-o", "--output", type=path_arg, metavar="OUT", help="write the YAML here (default: stdout)")
    cassette.add_argument(
        "--json", action="store_true", help="print the cassette (or, with -o, what was written) as JSON"
    )
    cassette.set_defaults(handler=_cassette)


SETUP = {"trace": _setup}


def _verify(args: argparse.Namespace) -> int:
    from localllm.trace.verify import verify_trace

    report = verify_trace(input_path(args.file, "trace file"), lenient=args.lenient)
    if args.json:
        emit_json(report.to_json())
    elif report.problems:
        for problem in report.problems:
            out(f"{args.file}: {problem}")
    else:
        assert report.trace is not None
        turns = report.to_json()["turns"]
        out(f"{args.file}: ok ({len(report.trace.events)} events in {turns} turns)")
    return EXIT_OK if report.ok else EXIT_FAILED


def _show(args: argparse.Namespace) -> int:
    from localllm.trace.reader import load_object

    trace = _load(args.file)
    kinds: list[str] = args.kind or []
    rows = [
        (index + 2, ev, raw)
        for index, (ev, raw) in enumerate(zip(trace.events, trace.raw_lines, strict=True))
        if not kinds or any(ev.kind == k or ev.kind.startswith(k.rstrip(".") + ".") for k in kinds)
    ]
    if args.json:
        emit_json([load_object(raw.decode("utf-8"))[0] for _, _, raw in rows])
        return EXIT_OK
    table = [("LINE", "TURN", "SEQ", "TS", "KIND", "CALL_ID")]
    table += [(str(n), str(ev.turn), str(ev.seq), ev.ts, ev.kind, ev.call_id or "") for n, ev, _ in rows]
    _print_table(table)
    return EXIT_OK


def _stats(args: argparse.Namespace) -> int:
    from localllm.trace.stats import trace_stats

    stats = trace_stats(_load(args.file).events)
    if args.json:
        emit_json(stats)
        return EXIT_OK
    out(f"{args.file}: {stats['events']} events in {stats['turns']} turns")
    out("")
    width = max([len(k) for k in stats["kinds"]] + [4])
    out(f"{'KIND'.ljust(width)}  COUNT")
    for kind, count in stats["kinds"].items():
        out(f"{kind.ljust(width)}  {count}")
    calls = stats["calls"]
    out("")
    out(
        f"agent calls: {calls['total']} (ok {calls['ok']}, error {calls['error']}, "
        f"fallbacks {calls['fallbacks']}); duration p50 {_ms(calls['p50_ms'])}, p95 {_ms(calls['p95_ms'])}"
    )
    if stats["agents"]:
        table = [("AGENT", "CALLS", "OK", "ERROR", "FALLBACKS", "P50_MS", "P95_MS")]
        table += [
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
        out("")
        _print_table(table)
    return EXIT_OK


def _cases(args: argparse.Namespace) -> int:
    from localllm.eval.fromtrace import cases_from_calls, recorded_calls

    _check_paths(args)
    config = _config(args)
    search = ((config.base_dir,) if config is not None else ()) + (args.file.parent,)
    lines = cases_from_calls(recorded_calls(args.file), args.gate, exact=args.exact, search=search)
    if not lines:
        raise UsageError(
            f"{args.file}: no successful call of gate {args.gate!r}",
            hint="check the gate name (`localllm trace show F --kind agent.call`)",
        )
    if args.json and args.output is None:
        import json

        emit_json({"cases": [json.loads(line) for line in lines], "labelled": False})
        return EXIT_OK
    _write("".join(line + "\n" for line in lines), args.output)
    if args.json:
        emit_json({"output": str(args.output), "cases": len(lines), "labelled": False})
        return EXIT_OK
    warn(f'{len(lines)} cases written unlabelled: check each expect, then set "labelled": true')
    return EXIT_OK


def _cassette(args: argparse.Namespace) -> int:
    import yaml

    _check_paths(args)
    from localllm.eval.fromtrace import cassette_from_calls, recorded_calls, trace_app_id

    config = _config(args)
    app_id = args.app_id
    if app_id is None and config is not None:
        app_id = config.app_id
    if app_id is None:
        app_id = trace_app_id(args.file)
    if app_id is None:
        warn(f"{args.file}: no app_id known (pass -c CONFIG or --app-id ID); the cassette has none")
    doc = cassette_from_calls(
        recorded_calls(args.file),
        agent=args.agent,
        replay_any=args.replay_any,
        match_handler=args.match_handler,
        app_id=app_id,
    )
    if args.json and args.output is None:
        emit_json(doc)
        return EXIT_OK
    try:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
    except RecursionError:  # the YAML emitter recurses per level: a few hundred levels are too many
        from localllm.errors import TraceError

        raise TraceError(
            f"{args.file}: a recorded call nests too deeply to write as a YAML cassette",
            hint="pass --json for the cassette as JSON (the reference reads both)",
        ) from None
    _write(text, args.output)
    if args.json:
        emit_json({"output": str(args.output), "episodes": len(doc.get("episodes", []))})
    return EXIT_OK


def _check_paths(args: argparse.Namespace) -> None:
    """``cases``/``cassette``: the trace, ``-c`` and ``-o`` as usable paths, before reading (exit 2)."""
    input_path(args.file, "trace file")
    if args.config is not None:
        input_path(args.config, "-c/--config")
    if args.output is not None:
        output_path(args.output, "-o/--output")
    _refuse_own_files(args.file, args.output)


def _config(args: argparse.Namespace) -> Config | None:
    """``-c`` loaded and checked as every command's ``-c`` is (one failing its checks is the
    config error, exit 2, before anything is written); ``None`` without ``-c``: no discovery,
    the trace's own directory stands in."""
    if args.config is None:
        return None
    from localllm.cli.foundation import load

    return load(args.config)


def _refuse_own_files(trace: Path, target: Path | None) -> None:
    """``-o`` naming the trace read, or a file in its sidecar directories, would replace the
    recording it was made from (the trace alone may be the only copy): refused before reading."""
    if target is None:
        return
    import os

    from localllm.trace.sidecars import PROMPTS_DIR, TRANSCRIPTS_DIR

    real = Path(os.path.realpath(target))
    with contextlib.suppress(OSError):
        if real.exists() and real.samefile(trace):
            raise UsageError(
                f"{target} is the trace being read: writing there would replace it",
                hint="pass another -o OUT (or none, for stdout)",
            )
    base = Path(os.path.realpath(trace)).parent
    if any(real.is_relative_to(base / sub) for sub in (PROMPTS_DIR, TRANSCRIPTS_DIR)):
        raise UsageError(
            f"{target} is in the trace's sidecar directory: writing there could replace a recorded sidecar",
            hint="pass an -o OUT outside the trace's agent-prompts/ and transcripts/",
        )


def _write(text: str, target: Path | None) -> None:
    if target is None:
        sys.stdout.write(text)
        return
    import os

    from localllm._fs import atomic_write
    from localllm.errors import TraceError

    real = Path(os.path.realpath(target))  # a link's file is written, the link kept
    try:
        if real.exists() and not real.is_file():
            # /dev/stdout, /dev/null, a FIFO: written through; a rename would replace the node
            with open(real, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            atomic_write(real, text)
    except OSError as exc:
        raise TraceError(
            f"cannot write {target}: {exc.strerror or exc}", hint="check that the directory is writable and has space"
        ) from exc
    err(f"wrote {target}")


def _load(path: Path) -> Trace:
    """Read for display: a torn last line is a warning on stderr, not fatal; interleaved
    turns (a trace from an earlier localllm) are read too (``verify`` says whether it is strict)."""
    from localllm.trace.reader import read_trace
    from localllm.trace.verify import unreadable

    input_path(path, "trace file")
    try:
        trace = read_trace(path, allow_torn=True, lenient=True)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if trace.torn_tail is not None:
        warn(f"{path}: torn last line ({len(trace.torn_tail)} bytes) ignored")
    return trace


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
