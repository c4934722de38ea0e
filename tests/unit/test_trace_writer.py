"""TraceWriter: file shape, write-time rules, lock, replacement, torn lines, round trips."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import localllm.trace
from localllm.errors import TraceCorrupted, TraceError, TraceLocked, TraceReplaced, TraceWriteRejected
from localllm.trace import Event, TraceWriter, format_ts, read_trace

# Go's RFC3339Nano: 1-9 fractional digits, no trailing zero, no dot for a whole second
TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z")


def lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data.split(b"\n")[:-1]


# --------------------------------------------------------------------------- public surface


def test_all_is_sorted_and_exported() -> None:
    names = localllm.trace.__all__
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for name in (
        "Event",
        "Trace",
        "TraceWriter",
        "read_trace",
        "write_prompt",
        "write_response",
        "write_transcript",
        "needs_sidecar",
        "SIDECAR_THRESHOLD",
        "HEADER_KIND",
        "SCHEMA_VERSION",
        "format_ts",
    ):
        assert name in names
        assert getattr(localllm.trace, name) is not None


def test_import_is_stdlib_only() -> None:
    code = "import sys, localllm.trace; print(sorted(m for m in ('numpy', 'jsonschema', 'httpx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- format


def test_format_ts_is_rfc3339nano_utc() -> None:
    assert format_ts(1_768_467_600_123_456_789) == "2026-01-15T09:00:00.123456789Z"
    # Go's RFC3339Nano: trailing zeros trimmed, the dot too when the fraction is zero
    assert format_ts(0) == "1970-01-01T00:00:00Z"
    assert format_ts(1_768_467_600_120_000_000) == "2026-01-15T09:00:00.12Z"
    assert format_ts(1_768_467_600_000_000_001) == "2026-01-15T09:00:00.000000001Z"
    assert TS_RE.fullmatch(format_ts())


def test_open_creates_parents_and_header(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "run.jsonl"
    with TraceWriter.open(path) as w:
        assert w.path == path
        assert w.dir == path.parent
    (line,) = lines_of(path)
    assert line.startswith(b'{"kind":"session.header","schema_version":1,"written_at":"')
    header = json.loads(line)
    assert list(header) == ["kind", "schema_version", "written_at"]
    assert TS_RE.fullmatch(header["written_at"])


def test_event_line_field_order_compact_and_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        ev = w.append(
            "agent.call.start",
            {"z": 1, "a": "café ✓", "m": [1, 2.5, None, True]},
            turn=3,
            state_path="foyer",
            parent_turn=2,
            call_id="7f65dee5291ba5d4",
            episode_id="ep-01",
            match_idx=0,
        )
    line = lines_of(path)[1]
    # the reference writer's order (payload last); a zero match_idx omitted as Go's omitempty does
    assert (
        line
        == (
            '{"turn":3,"seq":0,"ts":"' + ev.ts + '","kind":"agent.call.start","state_path":"foyer",'
            '"parent_turn":2,"call_id":"7f65dee5291ba5d4","episode_id":"ep-01",'
            '"payload":{"z":1,"a":"café ✓","m":[1,2.5,null,true]}}'
        ).encode()
    )
    assert TS_RE.fullmatch(ev.ts)
    assert read_trace(path).events[0] == ev  # match_idx 0 reads back beside its episode_id


def test_go_encoding_escapes_and_floats(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append(
            "a.b",
            {"html": "<a href='x'>&</a>", "ls": "x\u2028y\u2029", "f": [1.0, 1e-07, 2.5e21, 1e16, 0.1, -0.0, 7]},
            turn=1,
            state_path="<s>",
            match_idx=3,
        )
    line = lines_of(path)[1]
    assert b"<" not in line and b">" not in line and b"&" not in line
    assert "\u2028".encode() not in line
    assert line.endswith(
        b'"state_path":"\\u003cs\\u003e","match_idx":3,"payload":{"html":"\\u003ca href=\'x\'\\u003e\\u0026\\u003c/a\\u003e",'
        b'"ls":"x\\u2028y\\u2029","f":[1,1e-7,2.5e+21,10000000000000000,0.1,-0,7]}}'
    )
    (event,) = read_trace(path).events
    assert event.payload["html"] == "<a href='x'>&</a>" and event.state_path == "<s>"


def test_absent_optionals_are_omitted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("turn.end", turn=1)
    obj = json.loads(lines_of(path)[1])
    assert list(obj) == ["turn", "seq", "ts", "kind", "payload"]
    assert obj["payload"] == {}


def test_seq_is_dense_per_turn_and_assigned_by_writer(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        got = [
            (e.turn, e.seq)
            for e in (
                w.append("session.story", {}, turn=0),
                w.append("turn.start", {}, turn=1, state_path="s"),
                w.append("turn.input", {}, turn=1, state_path="s"),
                w.append("mining.proposal_raised", {}, turn=2, parent_turn=1),
                w.append("turn.end", {}, turn=1, state_path="s"),
            )
        ]
        assert w.next_seq(1) == 2
        assert w.next_seq(2) == 2
        assert w.next_seq(9) == 0
        with pytest.raises(TypeError):
            w.append("x.y", {}, turn=1, seq=5)  # type: ignore[call-arg]
    # the late turn-1 event lands in turn 2 (the latest), naming turn 1 as its parent
    assert got == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1)]
    events = read_trace(path).events
    assert [(e.turn, e.seq) for e in events] == got
    assert (events[-1].parent_turn, events[-1].state_path) == (1, "s")


def test_reopen_continues_seq_and_history(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("turn.start", {}, turn=1, state_path="s")
        w.append("turn.end", {}, turn=1, state_path="s")
    before = path.read_bytes()
    with TraceWriter.open(path) as w:
        assert [(e.turn, e.seq) for e in w.history()] == [(1, 0), (1, 1)]
        ev = w.append("story.changed", {"hash": "h"}, turn=1, state_path="s")
        assert ev.seq == 2
        assert w.lines() == lines_of(path)[1:]
    assert path.read_bytes().startswith(before)
    assert len(read_trace(path).events) == 3


def test_ts_never_goes_backwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([2_000_000_000_000_000_000, 1_000_000_000_000_000_000])
    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        monkeypatch.setattr(time, "time_ns", lambda: next(clock))
        a = w.append("a.b", turn=1)
        b = w.append("a.b", turn=1)
    assert a.ts == b.ts == format_ts(2_000_000_000_000_000_000)


def test_payload_is_copied(tmp_path: Path) -> None:
    payload: dict[str, Any] = {"items": [1]}
    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        ev = w.append("a.b", payload, turn=1)
        payload["items"].append(2)
        assert w.history()[0].payload == {"items": [1]}
    assert ev.payload == {"items": [1]}


# --------------------------------------------------------------------------- write-time rules


class Weird:
    pass


def _cycle() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep(n: int) -> Any:
    value: Any = 0
    for _ in range(n):
        value = [value]
    return value


P = "trace event rejected: "
REJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "crlf",
        {"payload": {"a": "x\r\ny"}},
        P + "payload.a: string contains CRLF; trace text uses LF only (normalise line endings)",
    ),
    (
        "crlf-nested",
        {"payload": {"a": [{"b": 1}, {"c": "1\r\n"}]}},
        P + "payload.a[1].c: string contains CRLF; trace text uses LF only (normalise line endings)",
    ),
    (
        "nul",
        {"payload": {"a": "x\x00"}},
        P + "payload.a: string contains a NUL byte (base64-encode binary data or move it to a sidecar file)",
    ),
    (
        "nul-key",
        {"payload": {"a\x00": 1}},
        P
        + 'payload["a\\u0000"] (key): string contains a NUL byte '
        + "(base64-encode binary data or move it to a sidecar file)",
    ),
    (
        "nfd",
        {"payload": {"a": "e\u0301"}},
        P + 'payload.a: string is not NFC-normalised (apply unicodedata.normalize("NFC", ...) first)',
    ),
    (
        "nfd-key",
        {"payload": {"cafe\u0301": 1}},
        P
        + 'payload["cafe\\u0301"] (key): string is not NFC-normalised (apply unicodedata.normalize("NFC", ...) first)',
    ),
    (
        "dotted-key",
        {"payload": {"a.b": "\x00"}},
        P + 'payload["a.b"]: string contains a NUL byte (base64-encode binary data or move it to a sidecar file)',
    ),
    (
        "surrogate",
        {"payload": {"a": "\ud800"}},
        P + "payload.a: string contains a lone surrogate and is not valid UTF-8",
    ),
    ("nan", {"payload": {"x": float("nan")}}, P + "payload.x: NaN is not valid JSON"),
    ("inf", {"payload": {"x": [float("inf")]}}, P + "payload.x[0]: Infinity is not valid JSON"),
    ("-inf", {"payload": {"x": float("-inf")}}, P + "payload.x: Infinity is not valid JSON"),
    (
        "set",
        {"payload": {"x": {1}}},
        P + "payload.x: value of type set is not a JSON type (use dict, list, str, int, float, bool or None)",
    ),
    (
        "bytes",
        {"payload": {"x": b"1"}},
        P + "payload.x: value of type bytes is not a JSON type (use dict, list, str, int, float, bool or None)",
    ),
    (
        "object",
        {"payload": {"x": Weird()}},
        P + "payload.x: value of type Weird is not a JSON type (use dict, list, str, int, float, bool or None)",
    ),
    ("int-key", {"payload": {"x": {1: 2}}}, P + "payload.x: object key 1 is not a string"),
    ("bigint", {"payload": {"x": 2**64}}, P + f"payload.x: integer {2**64} does not fit in 64 bits"),
    ("cycle", {"payload": _cycle()}, P + "payload.self: contains a reference cycle"),
    ("deep", {"payload": {"x": _deep(150)}}, P + "payload.x" + "[0]" * 99 + ": nested deeper than 100 levels"),
    ("payload-list", {"payload": [1]}, P + "payload: must be a JSON object (dict), got list"),
    ("kind-empty", {"kind": ""}, P + "kind: must be a non-empty string"),
    ("kind-type", {"kind": 3}, P + "kind: must be a non-empty string"),
    (
        "kind-crlf",
        {"kind": "a\r\nb"},
        P + "kind: string contains CRLF; trace text uses LF only (normalise line endings)",
    ),
    ("kind-header", {"kind": "session.header"}, P + 'kind: "session.header" is reserved for line 1'),
    ("turn-neg", {"turn": -1}, P + "turn: must be a non-negative 64-bit integer, got -1"),
    ("turn-bool", {"turn": True}, P + "turn: must be a non-negative 64-bit integer, got True"),
    ("turn-str", {"turn": "1"}, P + "turn: must be a non-negative 64-bit integer, got '1'"),
    (
        "state-nul",
        {"state_path": "a\x00"},
        P + "state_path: string contains a NUL byte (base64-encode binary data or move it to a sidecar file)",
    ),
    ("state-type", {"state_path": 1}, P + "state_path: must be a string, got int"),
    (
        "call-id-nfd",
        {"call_id": "e\u0301"},
        P + 'call_id: string is not NFC-normalised (apply unicodedata.normalize("NFC", ...) first)',
    ),
    (
        "episode-crlf",
        {"episode_id": "\r\n"},
        P + "episode_id: string contains CRLF; trace text uses LF only (normalise line endings)",
    ),
    ("parent-neg", {"parent_turn": -2}, P + "parent_turn: must be a non-negative 64-bit integer, got -2"),
    ("match-float", {"match_idx": 1.0}, P + "match_idx: must be a non-negative 64-bit integer, got 1.0"),
]


@pytest.mark.parametrize(("case", "override", "message"), REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_write_time_rules_reject_and_leave_file_unmodified(
    tmp_path: Path, case: str, override: dict[str, Any], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("turn.start", {"ok": True}, turn=1, state_path="s")
        before = path.read_bytes()
        call: dict[str, Any] = {"kind": "agent.call.start", "payload": {}, "turn": 1}
        call.update(override)
        kind, payload = call.pop("kind"), call.pop("payload")
        with pytest.raises(TraceWriteRejected) as info:
            w.append(kind, payload, **call)
        assert str(info.value) == message
        assert path.read_bytes() == before
        assert len(w.history()) == 1
        # the writer is still usable and seq did not advance
        assert w.append("turn.end", {}, turn=1, state_path="s").seq == 1


def test_lone_cr_and_lf_in_strings_are_allowed(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("a.b", {"text": "one\ntwo\rthree", "u": "\u2028"}, turn=1)
    (ev,) = read_trace(path).events
    assert ev.payload == {"text": "one\ntwo\rthree", "u": "\u2028"}


# --------------------------------------------------------------------------- round trips


GO_STYLE = [
    b'{"turn":0,"seq":0,"ts":"2026-06-09T12:00:00Z","kind":"session.story","payload":{"hash":"\\u003cabc\\u003e"}}',
    b'{"turn":1,"seq":0,"ts":"2026-06-09T12:00:00.1Z","kind":"turn.start","state_path":"foyer","payload":{"direct":true}}',
    b'{"turn":1,"seq":1,"ts":"2026-06-09T12:00:01Z","kind":"machine.state_exited","state_path":"foyer","payload":{}}',
    b'{"turn":1,"seq":2,"ts":"2026-06-09T12:00:01Z","kind":"machine.state_entered","state_path":"hall","payload":{"n":1.50}}',
    b'{ "turn": 1, "seq": 3, "ts": "2026-06-09T12:00:03Z", "kind": "turn.end", '
    b'"state_path": "hall", "payload": {"to": "hall"} }',
    b'{"turn":2,"seq":0,"ts":"2026-06-09T12:00:02Z","kind":"mining.proposal_raised","parent_turn":1,"payload":{"recipe_id":"r"},"future_field":[1]}',
]


def test_raw_round_trip_is_byte_identical_with_unknown_kinds(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    header = b'{"kind":"session.header","schema_version":1,"written_at":"2026-06-09T12:00:00Z"}'
    src.write_bytes(b"\n".join([header, *GO_STYLE]) + b"\n")
    trace = read_trace(src)
    assert [e.kind for e in trace.events][2:6] == [
        "machine.state_exited",
        "machine.state_entered",
        "turn.end",
        "mining.proposal_raised",
    ]
    dst = tmp_path / "dst.jsonl"
    with TraceWriter.open(dst, header=trace.header_line) as w:
        for raw in trace.raw_lines:
            w.append_raw(raw)
        assert w.lines() == list(trace.raw_lines)
    assert dst.read_bytes() == src.read_bytes()


def test_event_round_trip_is_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    with TraceWriter.open(src) as w:
        w.append("session.story", {"app_id": "a", "files": {"x": "YWJj"}}, turn=0)
        w.append(
            "turn.start", {"input": "go west", "routed_by": "semantic", "confidence": 0.9}, turn=1, state_path="foyer"
        )
        w.append("agent.call.start", {"verb": "decide", "prompt": "ünïcode"}, turn=1, state_path="foyer", call_id="c1")
        w.append("operation.abandoned", {"reason": "exit"}, turn=1, state_path="foyer")
        w.append("mining.proposal_decided", {"verdict": "accept"}, turn=2, parent_turn=1)
        w.append(
            "agent.call.complete",
            {"duration_ms": 5},
            turn=1,
            state_path="foyer",
            call_id="c1",
            episode_id="ep",
            match_idx=3,
        )
    trace = read_trace(src)
    dst = tmp_path / "dst.jsonl"
    with TraceWriter.open(dst, header=trace.header_line) as w:
        for ev in trace.events:
            assert w.append_event(ev) == ev
    assert dst.read_bytes() == src.read_bytes()


def test_append_event_reassigns_seq(tmp_path: Path) -> None:
    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        ev = w.append_event(Event(turn=4, seq=99, ts="2026-01-15T09:00:00Z", kind="a.b", payload={}))
    assert (ev.turn, ev.seq, ev.ts) == (4, 0, "2026-01-15T09:00:00Z")


def test_append_event_rejects_bad_ts(tmp_path: Path) -> None:
    with TraceWriter.open(tmp_path / "t.jsonl") as w, pytest.raises(TraceWriteRejected) as info:
        w.append_event(Event(turn=1, seq=0, ts="2026-01-15 09:00:00", kind="a.b", payload={}))
    assert str(info.value) == P + "ts: '2026-01-15 09:00:00' is not an RFC3339 UTC timestamp ending in Z"


RAW_REJECTIONS = [
    (
        b'{"turn":1,"seq":1,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}',
        P + "seq: 1 is not the next seq of turn 1 (expected 0)",
    ),
    (
        b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}\n',
        P + "line: contains a newline; pass exactly one line",
    ),
    (
        b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}\r',
        P + "line: ends with CR (CRLF line ending)",
    ),
    (b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a\x00","payload":{}}', P + "line: contains a NUL byte"),
    (b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"\xff","payload":{}}', P + "line: is not valid UTF-8"),
    (b"[1]", P + "line: is not a JSON object"),
    (b'{"turn":1}', P + 'line: missing required field "seq"'),
    (
        b'{"kind":"session.header","turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","payload":{}}',
        P + 'kind: "session.header" is reserved for line 1',
    ),
    (
        b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{"x":"\\r\\n"}}',
        P + "payload.x: string contains CRLF; trace text uses LF only (normalise line endings)",
    ),
    (
        b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{},"extra":"\\u0000"}',
        P + "extra: string contains a NUL byte (base64-encode binary data or move it to a sidecar file)",
    ),
]


@pytest.mark.parametrize(("raw", "message"), RAW_REJECTIONS)
def test_append_raw_rejections(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        before = path.read_bytes()
        with pytest.raises(TraceWriteRejected) as info:
            w.append_raw(raw)
        assert str(info.value) == message
    assert path.read_bytes() == before


def test_bad_header_argument_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteRejected) as info:
        TraceWriter.open(
            tmp_path / "t.jsonl",
            header=b'{"kind":"session.header","schema_version":2,"written_at":"2026-01-15T09:00:00Z"}',
        )
    assert str(info.value) == P + "header: schema_version 2 on disk exceeds highest supported 1"
    assert not (tmp_path / "t.jsonl").exists()


# --------------------------------------------------------------------------- lock

HOLDER = """
import sys
from localllm.trace import TraceWriter
w = TraceWriter.open(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
w.append("a.b", {"from": "child"}, turn=1)
w.close()
"""

CONTENDER = """
import sys
from localllm.errors import TraceLocked
from localllm.trace import TraceWriter
try:
    TraceWriter.open(sys.argv[1])
except TraceLocked as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
print("opened")
"""


def test_second_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "locked"
            with pytest.raises(TraceLocked) as info:
                TraceWriter.open(path)
            assert str(info.value) == "trace file is locked by another writer"
            assert str(path) in info.value.hint
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                child.kill()
    # The lock went away with the child: we can write now.
    with TraceWriter.open(path) as w:
        assert w.append("a.b", turn=1).seq == 1


def test_other_process_is_refused_while_we_hold_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path):
        done = subprocess.run(
            [sys.executable, "-c", CONTENDER, str(path)], capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() == "TraceLocked trace file is locked by another writer"
    done = subprocess.run(
        [sys.executable, "-c", CONTENDER, str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "opened"


def test_second_writer_in_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    first = TraceWriter.open(path)
    with pytest.raises(TraceLocked, match=r"^trace file is locked by another writer$"):
        TraceWriter.open(path)
    first.close()
    first.close()  # idempotent
    assert first.closed
    with TraceWriter.open(path) as again:
        assert not again.closed


def test_closed_writer_refuses_appends(tmp_path: Path) -> None:
    w = TraceWriter.open(tmp_path / "t.jsonl")
    w.close()
    with pytest.raises(TraceError, match="is closed"):
        w.append("a.b", turn=1)


# --------------------------------------------------------------------------- replacement


def test_replaced_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("a.b", turn=1)
        other = tmp_path / "other"
        other.write_bytes(b"someone else's file\n")
        os.replace(other, path)
        with pytest.raises(TraceReplaced) as info:
            w.append("a.b", turn=1)
        assert str(info.value) == "trace file replaced under us"
    assert path.read_bytes() == b"someone else's file\n"


def test_deleted_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        path.unlink()
        with pytest.raises(TraceReplaced, match=r"^trace file replaced under us$"):
            w.append("a.b", turn=1)
    assert not path.exists()


# --------------------------------------------------------------------------- torn lines


def _valid_trace(path: Path, events: int = 2) -> bytes:
    with TraceWriter.open(path) as w:
        for _ in range(events):
            w.append("turn.start", {"x": 1}, turn=1, state_path="s")
    return path.read_bytes()


def test_torn_last_line_moves_to_torn_file_and_append_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    good = _valid_trace(path)
    torn = b'{"turn":1,"seq":2,"ts":"2026-01-1'
    path.write_bytes(good + torn)
    with caplog.at_level(logging.WARNING, logger="localllm.trace"), TraceWriter.open(path) as w:
        assert path.read_bytes() == good
        assert w.append("turn.end", {}, turn=1, state_path="s").seq == 2
    side = tmp_path / "t.jsonl.torn"
    assert side.read_bytes() == torn + b"\n"
    assert any("torn last line (33 bytes) moved to" in r.getMessage() for r in caplog.records)
    assert len(read_trace(path).events) == 3
    # A second crash appends to the same .torn file.
    path.write_bytes(path.read_bytes() + b"{")
    with TraceWriter.open(path):
        pass
    assert side.read_bytes() == torn + b"\n{\n"
    read_trace(path)


def test_torn_header_is_recovered(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"kind":"session.hea')
    with TraceWriter.open(path) as w:
        w.append("a.b", turn=1)
    assert (tmp_path / "t.jsonl.torn").read_bytes() == b'{"kind":"session.hea\n'
    assert len(read_trace(path).events) == 1


def test_empty_file_gets_a_header(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.touch()
    with TraceWriter.open(path):
        pass
    assert read_trace(path).header["schema_version"] == 1


def test_foreign_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello world")
    with pytest.raises(TraceCorrupted, match=r"^trace missing session.header on line 1$"):
        TraceWriter.open(path)
    assert path.read_bytes() == b"hello world"
    assert not (tmp_path / "notes.txt.torn").exists()


def test_corrupted_file_is_refused_untouched_and_unlocked(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = _valid_trace(path, 3)
    lines = good.split(b"\n")
    bad = b"\n".join([lines[0], lines[1], lines[3], lines[2], b""])
    path.write_bytes(bad + b'{"torn')
    for _ in range(2):  # a second attempt is not TraceLocked: the failed open released the lock
        with pytest.raises(TraceCorrupted, match=r"^gap in seq within turn 1 at line 3$"):  # as the reference says
            TraceWriter.open(path)
    assert path.read_bytes() == bad + b'{"torn'
    assert not (tmp_path / "t.jsonl.torn").exists()


def test_newer_schema_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"kind":"session.header","schema_version":2,"written_at":"2026-01-15T09:00:00Z"}\n')
    with pytest.raises(TraceCorrupted, match=r"^schema_version 2 on disk exceeds highest supported 1$"):
        TraceWriter.open(path)


def test_unopenable_path_is_a_trace_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(TraceError, match="cannot open trace"):
        TraceWriter.open(tmp_path / "file" / "t.jsonl")


# --------------------------------------------------------------------------- threads


def test_concurrent_appends_from_threads_stay_dense(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:

        def work(turn: int) -> None:
            for i in range(40):
                w.append("agent.tool_call", {"i": i}, turn=turn, state_path="s")

        threads = [threading.Thread(target=work, args=(t % 2 + 1,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(w.history()) == 160
    events = read_trace(path).events  # strict: turns never go down
    for turn in (1, 2):
        assert [e.seq for e in events if e.turn == turn] == list(range(len([e for e in events if e.turn == turn])))
        # a turn-1 event written after turn 2 began is in turn 2, with parent_turn 1
        assert len([e for e in events if (e.parent_turn or e.turn) == turn]) == 80
    stamps = [datetime.fromisoformat(e.ts[:26].rstrip("Z").ljust(26, "0")) for e in events]
    assert stamps == sorted(stamps)


def test_append_is_durable_per_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each append is one ``write`` of its whole line on an ``O_DSYNC`` descriptor: the
    kernel returns from it only once the bytes and the file size are on stable storage."""
    import fcntl

    real = os.write
    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        fd = w._fd
        writes: list[tuple[int, bytes]] = []

        def recording_write(target: int, data: bytes) -> int:
            if target == fd:
                writes.append((fcntl.fcntl(target, fcntl.F_GETFL), bytes(data)))
            return real(target, data)

        monkeypatch.setattr(os, "write", recording_write)
        w.append("a.b", turn=1)
        w.append("a.b", {"x": 1}, turn=1)
        w.append_group([{"kind": "a.c", "turn": 2}, {"kind": "a.d", "turn": 2}])
        monkeypatch.undo()
    assert [data.count(b"\n") for _, data in writes] == [1, 1, 2]
    assert all(flags & os.O_DSYNC == os.O_DSYNC for flags, _ in writes)
    assert all(data.endswith(b"\n") for _, data in writes)
    assert b"".join(data for _, data in writes) == b"".join(line + b"\n" for line in lines_of(tmp_path / "t.jsonl")[1:])


APPENDER = """
import os, sys
from localllm.trace import TraceWriter
w = TraceWriter.open(sys.argv[1])
for i in range(1000000):
    w.append("a.b", {"i": i, "pad": "x" * 300}, turn=1 + i // 7)
    os.write(1, b"%d\\n" % i)  # acknowledged: append returned
"""


def test_acknowledged_appends_survive_sigkill(tmp_path: Path) -> None:
    """A writer SIGKILLed while appending: every event whose append returned is in the
    file, complete, and the file reopens for appending (at most a torn line set aside)."""
    import signal

    path = tmp_path / "t.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen([sys.executable, "-c", APPENDER, str(path)], stdout=subprocess.PIPE, env=env) as child:
        assert child.stdout is not None
        acked = -1
        while acked < 200:
            line = child.stdout.readline()
            assert line, "the appender died before acknowledging 200 events"
            acked = int(line)
        child.send_signal(signal.SIGKILL)  # mid-stream: it keeps appending until the signal lands
        rest = child.stdout.read()
        child.wait()
    acked = max([acked, *(int(x) for x in rest.split())])
    events = read_trace(path, allow_torn=True).events
    assert [ev.payload["i"] for ev in events[: acked + 1]] == list(range(acked + 1))
    with TraceWriter.open(path) as w:
        assert len(w.history()) >= acked + 1
        w.append("a.b", turn=10**6)
    assert read_trace(path).events[-1].turn == 10**6


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("a\r\nb", "a\nb"),
        ("a\r\r\nb", "a\nb"),
        ("nul\x00", "nul\ufffd"),
        ("e\u0301", "\u00e9"),
        ("x\ud800y", "x\ufffd\ufffd\ufffdy"),
        ("lone\r", "lone\r"),
        ("plain", "plain"),
    ],
)
def test_clean_text_makes_free_text_writable(tmp_path: Path, raw: str, clean: str) -> None:
    assert localllm.trace.clean_text(raw) == clean
    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        w.append("agent.call.error", {"error": localllm.trace.clean_text(raw)}, turn=1)


def test_forgotten_writer_releases_lock_when_collected(tmp_path: Path) -> None:
    import gc

    path = tmp_path / "t.jsonl"
    w = TraceWriter.open(path)
    del w
    gc.collect()
    with TraceWriter.open(path) as again:
        assert again.append("a.b", turn=1).seq == 0


def test_open_waits_a_bounded_time_for_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    holder = TraceWriter.open(path)
    started = time.monotonic()
    with pytest.raises(TraceLocked) as info:
        TraceWriter.open(path, wait=0.2)
    assert 0.2 <= time.monotonic() - started < 2
    assert (info.value.path, info.value.waited) == (str(path), 0.2)
    assert str(info.value) == "trace file is locked by another writer"  # the spec's message
    timer = threading.Timer(0.3, holder.close)
    timer.start()
    started = time.monotonic()
    with TraceWriter.open(path, wait=10) as second:
        assert second.append("a.b", turn=1).seq == 0
    assert 0.25 <= time.monotonic() - started < 5
    timer.join()


def test_to_json_keeps_wire_order_and_omits_empty_optionals() -> None:
    # every combination of absent / empty / set optionals: the fields in EVENT_FIELDS order,
    # an optional left out exactly when it is None, "" or 0 (Go's omitempty)
    import itertools

    from localllm.trace.event import EVENT_FIELDS, OMIT_EMPTY

    choices = {
        "state_path": (None, "", "s"),
        "parent_turn": (None, 0, 2),
        "call_id": (None, "", "c"),
        "episode_id": (None, "", "e"),
        "match_idx": (None, 0, 3),
    }
    seen = 0
    for combo in itertools.product(*choices.values()):
        optional: dict[str, Any] = dict(zip(choices, combo, strict=True))
        ev = Event(turn=0, seq=0, ts="2026-12-02T00:00:00Z", kind="k", payload={}, **optional)
        want = [n for n in EVENT_FIELDS if n not in OMIT_EMPTY or optional[n] not in (None, "", 0)]
        assert list(ev.to_json()) == want
        assert ev.to_json() == {n: getattr(ev, n) for n in want}
        seen += 1
    assert seen == 3**5


def test_stamps_within_one_second_and_across_seconds() -> None:
    # format_ts caches the whole-seconds part: stamps of one second and of the next differ right
    base = 1_764_633_599 * 10**9  # 2025-12-01T23:59:59Z
    assert format_ts(base) == "2025-12-01T23:59:59Z"
    assert format_ts(base + 5) == "2025-12-01T23:59:59.000000005Z"
    assert format_ts(base + 10**9) == "2025-12-02T00:00:00Z"
    assert format_ts(base + 10**9 + 120_000_000) == "2025-12-02T00:00:00.12Z"
    assert format_ts(base + 1) == "2025-12-01T23:59:59.000000001Z"
