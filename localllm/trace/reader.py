"""Read a trace file, enforcing every read-time rule (trace-format §7).

Rejections raise ``TraceCorrupted`` with the spec's message (plus a hint naming the file):

    trace corrupted: missing trailing newline at EOF     (torn last line; see ``allow_torn``)
    trace corrupted: CRLF line ending at line N
    trace corrupted: NUL byte in line N
    trace corrupted: byte order mark at start of file    (the spec leaves this one's text open)
    trace corrupted: invalid UTF-8 in line N
    trace missing session.header on line 1
    duplicate session.header at line N
    schema_version N on disk exceeds highest supported 1
    duplicate (turn,seq) at line N
    out-of-order (turn,seq) at line N
    out-of-order (turn,seq) at line N: turn=T arrives after turn=M (cross-turn ordering violation)
    gap in seq within turn T at line N

plus ``trace corrupted: line N …`` for lines that are not JSON objects or lack a required
field, and for what no writer obeying the write-time rules (§6) can produce: a string with
a lone surrogate (``"\\ud800"``: not UTF-8 text), an integer outside 64 bits, a number
that overflows to infinity (``1e400``), a sidecar reference (``prompt_file``,
``response_file``, ``transcript_ref.path``) that can never name a file (NUL, a name over
255 bytes). So everything a reader returns can be printed, encoded and stat-ed. Line
numbers are 1-based; the header is line 1. The first problem in file order wins.

Sequence rule. ``turn`` never goes down in file order (an event of turn 1 after one of
turn 2 is a cross-turn ordering violation: the reference reader refuses it, and so does
this one), and ``seq`` is dense per turn: each turn's events carry 0, 1, 2, … in file
order. A call that outlives its turn is recorded in the turn in flight with
``parent_turn`` naming its own (see ``localllm.trace.writer``), so it never breaks this.

``lenient=True`` reads traces written by localllm before it followed the reference's turn
order (they let turns interleave): only the cross-turn check is dropped, everything else
still holds. For the event at line N with turn T whose last seq so far is P (the
reference reader's classification, so both name the same fault):

- seq == P → ``duplicate (turn,seq) at line N``;
- seq < P → ``out-of-order (turn,seq) at line N``;
- seq != P + 1 (or != 0 for T's first event) → ``gap in seq within turn T at line N``.

Unknown kinds and unknown fields are carried through: ``Trace.raw_lines`` keeps every event
line byte-for-byte, parallel to ``Trace.events``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from localllm._fs import read_capped
from localllm.errors import TraceCorrupted
from localllm.trace import rules
from localllm.trace.event import HEADER_KIND, SCHEMA_VERSION, Event, go_float, is_rfc3339_utc
from localllm.trace.sidecars import name_problem, sidecar_refs
from localllm.wire import LONE_SURROGATE

__all__ = [
    "BOM",
    "Trace",
    "event_problem",
    "line_text",
    "load_object",
    "parse_json_line",
    "parse_trace",
    "raw_payload",
    "read_trace",
]

BOM = b"\xef\xbb\xbf"
_REQUIRED = ("turn", "seq", "ts", "kind", "payload")
_INT63 = 2**63
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Trace:
    """A parsed trace: the header, the events, their raw lines, and a torn tail if allowed."""

    header: dict[str, Any]
    events: tuple[Event, ...]
    raw_lines: tuple[bytes, ...]
    """Each event's line exactly as on disk, without the ``\\n``; parallel to ``events``."""
    torn_tail: bytes | None = None
    """Bytes after the last ``\\n`` (a torn last line), only with ``allow_torn=True``."""
    header_line: bytes = b""
    """Line 1 exactly as on disk, without the ``\\n``."""

    def __len__(self) -> int:
        return len(self.events)


def read_trace(path: str | Path, *, allow_torn: bool = False, lenient: bool = False) -> Trace:
    """Read and validate the trace at ``path``.

    Strict by default: a torn last line (no trailing newline) is ``TraceCorrupted``. With
    ``allow_torn=True`` the torn bytes are returned in ``Trace.torn_tail`` instead, and the
    complete lines before them are validated as usual. ``lenient=True`` accepts turns that
    interleave (traces from earlier localllm versions; see the module docstring). OS errors
    (missing file, permissions) propagate unchanged.
    """
    p = Path(path)
    data = read_capped(p, None)  # no limit (trace-format: sub-events have none), but never a device
    return parse_trace(data, allow_torn=allow_torn, path=p, lenient=lenient)


def parse_trace(
    data: bytes, *, allow_torn: bool = False, path: str | Path | None = None, lenient: bool = False
) -> Trace:
    """Validate trace bytes (see :func:`read_trace`); ``path`` only names the file in hints."""
    where = str(path) if path is not None else None
    if data.startswith(BOM):
        _corrupt("trace corrupted: byte order mark at start of file", where)
    cut = data.rfind(b"\n") + 1
    body, tail = data[:cut], data[cut:]
    if tail and not allow_torn:
        _corrupt("trace corrupted: missing trailing newline at EOF", where, torn=True)
    if not body:
        _corrupt("trace missing session.header on line 1", where)
    lines = body.split(b"\n")
    lines.pop()  # the empty string after the final newline

    header = _parse_header(lines[0], where)
    events: list[Event] = []
    first_error: TraceCorrupted | None = None
    for lineno, raw in enumerate(lines[1:], start=2):
        try:
            obj = parse_json_line(raw, lineno, where)
            if obj.get("kind") == HEADER_KIND:
                _corrupt(f"duplicate session.header at line {lineno}", where)
            problem = event_problem(obj)
            if problem:
                _corrupt(f"trace corrupted: line {lineno}: {problem}", where)
        except TraceCorrupted as exc:
            # A sequence error on an earlier line still wins, so check those first.
            first_error = exc
            break
        event = Event.from_json(obj)
        object.__setattr__(event, "raw_line", raw)  # frozen; the payload's bytes for a rewrite
        events.append(event)
    _check_sequence(events, where, lenient=lenient)
    if first_error is not None:
        raise first_error
    return Trace(
        header=header,
        events=tuple(events),
        raw_lines=tuple(lines[1 : 1 + len(events)]),
        torn_tail=tail or None,
        header_line=lines[0],
    )


def parse_json_line(raw: bytes, lineno: int, where: str | None = None) -> dict[str, Any]:
    """Byte-level checks and JSON parsing of one line; returns the JSON object."""
    obj, problem = load_object(line_text(raw, lineno, where))
    if obj is None:
        _corrupt(f"trace corrupted: line {lineno} {problem}", where)
    return obj


def line_text(raw: bytes, lineno: int, where: str | None = None) -> str:
    """The line decoded, after the CRLF, NUL and UTF-8 checks."""
    if raw.endswith(b"\r"):
        _corrupt(f"trace corrupted: CRLF line ending at line {lineno}", where)
    if b"\x00" in raw:
        _corrupt(f"trace corrupted: NUL byte in line {lineno}", where)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        _corrupt(f"trace corrupted: invalid UTF-8 in line {lineno}", where)


def load_object(text: str) -> tuple[dict[str, Any] | None, str]:
    """``(object, "")``, or ``(None, problem)`` when ``text`` is not one JSON object."""
    try:
        obj = _DECODER.decode(text)
    except RecursionError:
        return None, "is not valid JSON: nested too deeply"
    except json.JSONDecodeError as exc:
        # "Unterminated string starting at" already ends in "at": never "at at column"
        return None, f"is not valid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}"
    except ValueError as exc:  # NaN/Infinity, or an integer beyond Python's digit limit
        return None, f"is not valid JSON: {exc}"
    if not isinstance(obj, dict):
        return None, "is not a JSON object"
    if _SURROGATE_ESCAPE.search(text):  # the only way a lone surrogate gets into the object
        where = _surrogate_in(obj)
        if where is not None:
            return None, f"has a lone surrogate escape in {where} (trace text must be valid UTF-8)"
    return obj, ""


def _surrogate_in(obj: dict[str, Any]) -> str | None:
    """The field path of the first key or string holding a lone surrogate (iterative)."""
    stack: list[tuple[str, Any]] = [(rules.field_path("", key).lstrip("."), value) for key, value in obj.items()]
    stack += [(f"key {rules.field_path('', key).lstrip('.')}", key) for key in obj]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if LONE_SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            stack += [(rules.field_path(path, k), v) for k, v in value.items()]
            stack += [(f"key {rules.field_path(path, k)}", k) for k in value]
        elif isinstance(value, list):
            stack += [(rules.field_path(path, i), v) for i, v in enumerate(value)]
    return None


def event_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with an event object's fields, or ``None`` (shared with the writer)."""
    for name in _REQUIRED:
        if name not in obj:
            return f'missing required field "{name}"'
    for name in ("turn", "seq"):
        if not _is_count(obj[name]):
            return _count_problem(name, obj[name])
    if not is_rfc3339_utc(obj["ts"]):
        return 'field "ts" must be an RFC3339 UTC timestamp ending in Z'
    if not isinstance(obj["kind"], str) or not obj["kind"]:
        return 'field "kind" must be a non-empty string'
    if not isinstance(obj["payload"], dict):
        return 'field "payload" must be a JSON object'
    for name in ("state_path", "call_id", "episode_id"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            return f'field "{name}" must be a string'
    for name in ("parent_turn", "match_idx"):
        if obj.get(name) is not None and not _is_count(obj[name]):
            return _count_problem(name, obj[name])
    for key, rel in sidecar_refs(obj["payload"]):
        problem = name_problem(rel) if isinstance(rel, str) else None
        if problem:
            return f"payload.{key} {problem}"
    return None


def _parse_header(raw: bytes, where: str | None) -> dict[str, Any]:
    obj, _ = load_object(line_text(raw, 1, where))
    if obj is None or obj.get("kind") != HEADER_KIND:
        _corrupt("trace missing session.header on line 1", where)
    version = obj.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        _corrupt("trace corrupted: session.header schema_version must be a positive integer", where)
    if version > SCHEMA_VERSION:
        _corrupt(f"schema_version {version} on disk exceeds highest supported {SCHEMA_VERSION}", where)
    if not is_rfc3339_utc(obj.get("written_at")):
        _corrupt("trace corrupted: session.header written_at must be an RFC3339 UTC timestamp", where)
    return obj


def _check_sequence(events: list[Event], where: str | None, *, lenient: bool = False) -> None:
    """The reference reader's rules, in its order: turns never go down (unless ``lenient``),
    then per turn — the same seq as the last one is a duplicate, a lower one out of order,
    anything but the next (0 for a turn's first event) a gap."""
    last: dict[int, int] = {}
    latest = -1
    for index, ev in enumerate(events):
        lineno = index + 2
        if ev.turn < latest and not lenient:
            _corrupt(
                f"out-of-order (turn,seq) at line {lineno}: turn={ev.turn} arrives after turn={latest} "
                "(cross-turn ordering violation)",
                where,
                cross_turn=True,
            )
        latest = max(latest, ev.turn)
        prev = last.get(ev.turn)
        if prev is not None and ev.seq == prev:
            _corrupt(f"duplicate (turn,seq) at line {lineno}", where)
        if prev is not None and ev.seq < prev:
            _corrupt(f"out-of-order (turn,seq) at line {lineno}", where)
        if ev.seq != (0 if prev is None else prev + 1):
            _corrupt(f"gap in seq within turn {ev.turn} at line {lineno}", where)
        last[ev.turn] = ev.seq


_GO_COMPACT = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\r\n]+')


def raw_payload(line: bytes) -> tuple[str, Any] | None:
    """The ``payload`` value of an event line as written, compacted as Go's ``json.Compact``
    (whitespace outside strings dropped; numbers and string escapes kept byte for byte), and
    the value it parses to; ``None`` when ``line`` is not an object with a payload.

    The reference reader keeps an event's payload as raw bytes (``json.RawMessage``) and its
    writer writes them back so; this is what a rewrite of a read event must write.
    """
    try:
        text = line.decode("utf-8")
        idx = _skip_ws(text, 0)
        if text[idx : idx + 1] != "{":
            return None
        idx = _skip_ws(text, idx + 1)
        found: tuple[int, int, Any] | None = None
        while text[idx] != "}":
            key, idx = _DECODER.raw_decode(text, idx)
            start = _skip_ws(text, _skip_ws(text, idx) + 1)  # past the ":"
            value, end = _DECODER.raw_decode(text, start)
            if key == "payload":
                found = (start, end, value)  # a repeated key: the last wins, as in Go
            idx = _skip_ws(text, end)
            if text[idx] == ",":
                idx = _skip_ws(text, idx + 1)
    except (ValueError, IndexError, RecursionError):
        return None
    if found is None:
        return None
    start, end, value = found
    return _GO_COMPACT.sub(lambda m: m.group(1) or "", text[start:end]), value


def _skip_ws(text: str, idx: int) -> int:
    """The index of the first non-whitespace character of ``text`` at or after ``idx``."""
    while text[idx : idx + 1] in (" ", "\t", "\r", "\n"):
        idx += 1
    return idx


def _is_count(value: object) -> bool:
    # turn/parent_turn are Go int64, seq/match_idx Go int (64-bit): the reference reader
    # refuses 2^63 and above ("cannot unmarshal number … into … int64"), and so does the writer
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _INT63


def _count_problem(name: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= _INT63:
        return f'field "{name}" {value} does not fit in a signed 64-bit integer'
    return f'field "{name}" must be a non-negative integer'


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _int64(text: str) -> int | float:
    if text == "-0":
        return -0.0  # Go's float64 negative zero: keep it, so it is written back as -0
    if len(text) > 22:  # past any 64-bit integer and Go's integral float form (< 1e21)
        raise ValueError(f"integer {text[:24]}... does not fit in 64 bits")
    value = int(text)
    if len(text) > 18 and not rules.INT_MIN <= value < rules.INT_LIMIT:
        # Go writes a float64 in [2^64, 1e21) as an integer literal (100000000000000000000)
        if abs(value) < 10**21 and go_float(repr(float(value))) == text:
            return float(value)
        raise ValueError(f"integer {text[:24]}... does not fit in 64 bits")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:24]} overflows a 64-bit float")
    return value


# One decoder: building it per line is costly.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_int=_int64, parse_float=_finite)


def _corrupt(message: str, where: str | None, *, torn: bool = False, cross_turn: bool = False) -> NoReturn:
    hint = ""
    if where is not None and cross_turn:
        hint = (
            f"in {where}; the file was not modified. Earlier localllm versions let turns interleave: "
            f"`localllm trace verify --lenient {where}` (read_trace(..., lenient=True)) reads such a trace"
        )
    elif where is not None and torn:
        hint = (
            f"the last line of {where} is torn (a writer stopped mid-line); opening it for "
            f"append moves the torn bytes to {where}.torn"
        )
    elif where is not None:
        hint = f"in {where}; the file was not modified (`localllm trace verify {where}` checks it)"
    raise TraceCorrupted(message, hint=hint)
