"""read_trace: every read-time rejection with its exact message, and a fuzzed corpus."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.errors import TraceCorrupted, TraceError
from localllm.trace import TraceWriter, parse_trace, read_trace

HEADER = b'{"kind":"session.header","schema_version":1,"written_at":"2026-01-15T09:00:00.000000000Z"}'


def ev(turn: int, seq: int, kind: str = "turn.start", extra: str = "") -> bytes:
    return (
        f'{{"turn":{turn},"seq":{seq},"ts":"2026-01-15T09:00:00.123456789Z","kind":"{kind}",'
        f'"state_path":"foyer","payload":{{}}{extra}}}'
    ).encode()


def trace_bytes(*lines: bytes) -> bytes:
    return b"".join(line + b"\n" for line in (HEADER, *lines))


def corrupted(data: bytes) -> str:
    with pytest.raises(TraceCorrupted) as info:
        parse_trace(data)
    return str(info.value)


# --------------------------------------------------------------------------- valid shapes


def test_reads_header_events_and_raw_lines(tmp_path: Path) -> None:
    lines = [ev(1, 0), ev(1, 1, "machine.state_entered"), ev(2, 0, "mining.proposal_raised", ',"parent_turn":1')]
    path = tmp_path / "t.jsonl"
    path.write_bytes(trace_bytes(*lines))
    trace = read_trace(path)
    assert trace.header == {
        "kind": "session.header",
        "schema_version": 1,
        "written_at": "2026-01-15T09:00:00.000000000Z",
    }
    assert trace.header_line == HEADER
    assert trace.raw_lines == tuple(lines)
    assert [(e.turn, e.seq, e.kind) for e in trace.events] == [
        (1, 0, "turn.start"),
        (1, 1, "machine.state_entered"),
        (2, 0, "mining.proposal_raised"),
    ]
    assert trace.events[2].parent_turn == 1
    assert trace.torn_tail is None
    assert len(trace) == 3


def test_unknown_fields_and_kinds_are_carried_byte_for_byte() -> None:
    odd = (
        b'{"payload":{"b":1,"a":2},"kind":"dynamic.workflow.generated",'
        b'"ts":"2026-06-09T12:00:00Z","seq":0,"turn":1,"x":[1]}'
    )
    trace = parse_trace(trace_bytes(odd))
    assert trace.raw_lines == (odd,)
    assert list(trace.events[0].payload) == ["b", "a"]


def test_interleaved_turns_are_refused_unless_lenient() -> None:
    # the reference reader's rule (trace-format §7): a turn never goes down in file order
    data = trace_bytes(ev(0, 0), ev(1, 0), ev(2, 0), ev(1, 1), ev(0, 1), ev(2, 1))
    with pytest.raises(TraceCorrupted) as info:
        parse_trace(data)
    assert str(info.value).startswith("out-of-order (turn,seq) at line 5: turn=1 arrives after turn=2")
    # traces from earlier localllm versions interleaved turns: lenient reads them
    trace = parse_trace(data, lenient=True)
    assert [(e.turn, e.seq) for e in trace.events] == [(0, 0), (1, 0), (2, 0), (1, 1), (0, 1), (2, 1)]
    # lenient still enforces every other rule
    with pytest.raises(TraceCorrupted, match="gap in seq within turn 1 at line 4"):
        parse_trace(trace_bytes(ev(1, 0), ev(2, 0), ev(1, 2)), lenient=True)


def test_turns_start_at_zero() -> None:
    trace = parse_trace(trace_bytes(ev(0, 0), ev(0, 1), ev(1, 0), ev(2, 0), ev(2, 1)))
    assert [(e.turn, e.seq) for e in trace.events] == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]


def test_header_only_is_valid() -> None:
    assert parse_trace(trace_bytes()).events == ()


def test_null_optionals_read_as_absent() -> None:
    trace = parse_trace(trace_bytes(ev(1, 0, extra=',"call_id":null,"parent_turn":null')))
    assert trace.events[0].call_id is None
    assert trace.events[0].parent_turn is None


def test_go_trimmed_timestamps_are_accepted() -> None:
    line = b'{"turn":1,"seq":0,"ts":"2026-06-09T12:00:00Z","kind":"a","payload":{}}'
    assert parse_trace(trace_bytes(line)).events[0].ts == "2026-06-09T12:00:00Z"


# --------------------------------------------------------------------------- §7 rejections

SPEC_CASES = [
    ("missing-newline", trace_bytes(ev(1, 0))[:-1], "trace corrupted: missing trailing newline at EOF"),
    ("torn-last-line", trace_bytes(ev(1, 0)) + b'{"turn":1,"se', "trace corrupted: missing trailing newline at EOF"),
    ("crlf", trace_bytes(ev(1, 0), ev(1, 1) + b"\r"), "trace corrupted: CRLF line ending at line 3"),
    ("crlf-header", HEADER + b"\r\n", "trace corrupted: CRLF line ending at line 1"),
    ("nul", trace_bytes(ev(1, 0), ev(1, 1)[:5] + b"\x00" + ev(1, 1)[5:]), "trace corrupted: NUL byte in line 3"),
    ("bom", b"\xef\xbb\xbf" + trace_bytes(ev(1, 0)), "trace corrupted: byte order mark at start of file"),
    (
        "non-utf8",
        trace_bytes(ev(1, 0), ev(1, 1).replace(b"turn.start", b"turn.st\xffrt")),
        "trace corrupted: invalid UTF-8 in line 3",
    ),
    (
        "overlong-utf8",
        trace_bytes(ev(1, 0).replace(b"foyer", b"fo\xc0\xafer")),
        "trace corrupted: invalid UTF-8 in line 2",
    ),
    ("no-header", ev(1, 0) + b"\n", "trace missing session.header on line 1"),
    ("garbage-header", b"hello\n", "trace missing session.header on line 1"),
    ("empty-file", b"", "trace missing session.header on line 1"),
    ("array-header", b"[]\n", "trace missing session.header on line 1"),
    ("duplicate-header", trace_bytes(ev(1, 0), HEADER), "duplicate session.header at line 3"),
    (
        "schema-too-new",
        trace_bytes().replace(b'"schema_version":1', b'"schema_version":7'),
        "schema_version 7 on disk exceeds highest supported 1",
    ),
    ("duplicate-seq", trace_bytes(ev(1, 0), ev(1, 1), ev(1, 1)), "duplicate (turn,seq) at line 4"),
    # classified as the reference reader does: same seq as the last → duplicate, lower →
    # out-of-order, anything but the next → gap (its catalogue's out_of_order_turn_seq is a gap)
    ("out-of-order-earlier-seq", trace_bytes(ev(1, 0), ev(1, 1), ev(1, 0)), "out-of-order (turn,seq) at line 4"),
    ("skip-then-back", trace_bytes(ev(1, 0), ev(1, 2), ev(1, 1)), "gap in seq within turn 1 at line 3"),
    ("first-not-zero", trace_bytes(ev(1, 1), ev(1, 0)), "gap in seq within turn 1 at line 2"),
    ("gap", trace_bytes(ev(1, 0), ev(1, 1), ev(1, 3)), "gap in seq within turn 1 at line 4"),
    ("gap-new-turn", trace_bytes(ev(1, 0), ev(4, 2)), "gap in seq within turn 4 at line 3"),
]


@pytest.mark.parametrize(("case", "data", "message"), SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_spec_read_time_rejections(case: str, data: bytes, message: str) -> None:
    assert corrupted(data) == message


LINE_CASES = [
    (
        "not-json",
        trace_bytes(ev(1, 0), b"{oops"),
        "trace corrupted: line 3 is not valid JSON: Expecting property name enclosed in double quotes at column 2",
    ),
    (
        "blank-line",
        trace_bytes(ev(1, 0), b""),
        "trace corrupted: line 3 is not valid JSON: Expecting value at column 1",
    ),
    (
        "nan",
        trace_bytes(ev(1, 0, extra=',"x":NaN')),
        "trace corrupted: line 2 is not valid JSON: NaN is not valid JSON",
    ),
    (
        "deep",
        trace_bytes(b"[" * 100_000 + b"]" * 100_000),
        "trace corrupted: line 2 is not valid JSON: nested too deeply",
    ),
    ("array", trace_bytes(b"[1,2]"), "trace corrupted: line 2 is not a JSON object"),
    (
        "missing-turn",
        trace_bytes(b'{"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: missing required field "turn"',
    ),
    (
        "missing-payload",
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a"}'),
        'trace corrupted: line 2: missing required field "payload"',
    ),
    (
        "turn-negative",
        trace_bytes(b'{"turn":-1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "turn" must be a non-negative integer',
    ),
    (
        "seq-float",
        trace_bytes(b'{"turn":1,"seq":0.0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "seq" must be a non-negative integer',
    ),
    (
        "seq-bool",
        trace_bytes(b'{"turn":1,"seq":false,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "seq" must be a non-negative integer',
    ),
    (
        "ts-month-13",  # digits in the right places, but no such instant (Go's time.Parse refuses it)
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-13-45T99:99:99Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "ts" must be an RFC3339 UTC timestamp ending in Z',
    ),
    (
        "ts-february-30",
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-02-30T00:00:00Z","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "ts" must be an RFC3339 UTC timestamp ending in Z',
    ),
    (
        "ts-offset",
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00+00:00","kind":"a","payload":{}}'),
        'trace corrupted: line 2: field "ts" must be an RFC3339 UTC timestamp ending in Z',
    ),
    (
        "kind-empty",
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"","payload":{}}'),
        'trace corrupted: line 2: field "kind" must be a non-empty string',
    ),
    (
        "payload-list",
        trace_bytes(b'{"turn":1,"seq":0,"ts":"2026-01-15T09:00:00Z","kind":"a","payload":[]}'),
        'trace corrupted: line 2: field "payload" must be a JSON object',
    ),
    (
        "state-path-int",
        trace_bytes(ev(1, 0, extra=',"state_path":3')),
        'trace corrupted: line 2: field "state_path" must be a string',
    ),
    (
        "call-id-int",
        trace_bytes(ev(1, 0, extra=',"call_id":3')),
        'trace corrupted: line 2: field "call_id" must be a string',
    ),
    (
        "match-idx-neg",
        trace_bytes(ev(1, 0, extra=',"match_idx":-1')),
        'trace corrupted: line 2: field "match_idx" must be a non-negative integer',
    ),
    (
        "schema-zero",
        trace_bytes().replace(b'"schema_version":1', b'"schema_version":0'),
        "trace corrupted: session.header schema_version must be a positive integer",
    ),
    (
        "schema-string",
        trace_bytes().replace(b'"schema_version":1', b'"schema_version":"1"'),
        "trace corrupted: session.header schema_version must be a positive integer",
    ),
    (
        "written-at",
        trace_bytes().replace(b"2026-01-15T09:00:00.000000000Z", b"yesterday"),
        "trace corrupted: session.header written_at must be an RFC3339 UTC timestamp",
    ),
]


@pytest.mark.parametrize(("case", "data", "message"), LINE_CASES, ids=[c[0] for c in LINE_CASES])
def test_malformed_lines_are_named(case: str, data: bytes, message: str) -> None:
    assert corrupted(data) == message


def test_first_problem_in_file_order_wins() -> None:
    assert corrupted(trace_bytes(ev(1, 0), ev(1, 2), b"{bad", b"\x00")) == "gap in seq within turn 1 at line 3"
    assert corrupted(trace_bytes(ev(1, 0), b"{bad", ev(1, 5))).startswith("trace corrupted: line 3 is not valid JSON")


def test_allow_torn_returns_the_tail_separately(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(trace_bytes(ev(1, 0)) + b'{"turn":1')
    with pytest.raises(TraceCorrupted, match=r"^trace corrupted: missing trailing newline at EOF$") as info:
        read_trace(path)
    assert f"{path}.torn" in info.value.hint
    trace = read_trace(path, allow_torn=True)
    assert trace.torn_tail == b'{"turn":1'
    assert len(trace.events) == 1
    # complete lines are still checked when the tail is allowed
    path.write_bytes(trace_bytes(ev(1, 1)) + b"{")
    with pytest.raises(TraceCorrupted, match="gap in seq"):
        read_trace(path, allow_torn=True)


def test_hint_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(trace_bytes(ev(1, 1)))
    with pytest.raises(TraceCorrupted) as info:
        read_trace(path)
    assert str(path) in info.value.hint


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------- fuzzing


def _base_trace() -> bytes:
    return trace_bytes(
        ev(0, 0, "session.story"),
        ev(1, 0),
        ev(1, 1, "agent.call.start", ',"call_id":"7f65dee5291ba5d4"'),
        b'{"turn":1,"seq":2,"ts":"2026-01-15T09:00:00Z","kind":"agent.call.complete","state_path":"f",'
        b'"payload":{"response":{"x":[1,2.5,"caf\xc3\xa9"]},"duration_ms":12},"call_id":"7f65dee5291ba5d4"}',
        ev(2, 0, "mining.proposal_raised", ',"parent_turn":1'),
        ev(1, 3, "turn.end"),
    )


BASE = _base_trace()
SPECIAL = [b"\r", b"\n", b"\x00", b"\xef\xbb\xbf", b"\xff", b"\xc3", b"{", b"}", b'"', b",", b"9", b"-", b"[", b"\\"]


@st.composite
def mutated_traces(draw: st.DrawFn) -> bytes:
    data = bytearray(BASE)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "shuffle", "dup", "drop", "splice"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=4))
        elif op == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        else:
            lines = bytes(data).split(b"\n")
            if op == "shuffle":
                lines = draw(st.permutations(lines))
            elif op == "dup" and lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(draw(st.integers(0, len(lines))), lines[i])
            elif op == "drop" and lines:
                del lines[draw(st.integers(0, len(lines) - 1))]
            elif op == "splice" and lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines[i] = lines[i].replace(b'"seq":', b'"seq":1', 1).replace(b'"turn":', b'"turn":-', 1)
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def test_fuzzed_traces_raise_only_trace_errors() -> None:
    seen: list[bytes] = []
    outcomes = {"ok": 0, "corrupted": 0}

    @settings(
        max_examples=1200, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(mutated_traces())
    def check(data: bytes) -> None:
        seen.append(data)
        for allow_torn in (False, True):
            try:
                trace = parse_trace(data, allow_torn=allow_torn)
            except TraceCorrupted:
                outcomes["corrupted"] += 1
                continue
            outcomes["ok"] += 1
            # whatever parses must be internally consistent
            assert len(trace.events) == len(trace.raw_lines)
            assert trace.torn_tail is None or allow_torn

    check()
    assert len(set(seen)) >= 1000
    assert outcomes["corrupted"] > 0 and outcomes["ok"] > 0


def test_fuzzed_files_reopen_or_raise_only_trace_errors() -> None:
    count = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"

        @settings(
            max_examples=250,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(mutated_traces())
        def check(data: bytes) -> None:
            nonlocal count
            count += 1
            for side in (path, path.with_name("t.jsonl.torn")):
                if side.exists():
                    os.unlink(side)
            path.write_bytes(data)
            try:
                writer = TraceWriter.open(path)
            except TraceError:
                assert path.read_bytes() == data  # refused files are never modified
                return
            with writer:
                writer.append("a.b", {}, turn=1)
            read_trace(path)  # anything the writer accepted is strictly valid afterwards

        check()
    assert count >= 250


# --------------------------------------------------------------------------- hostile values (issue 11 item 17)


@pytest.mark.parametrize(
    ("line", "where"),
    [
        (ev(1, 0, extra="").replace(b'"payload":{}', b'"payload":{"prompt_file":"\\ud800"}'), "payload.prompt_file"),
        (ev(1, 0, kind="x\\ud800"), "kind"),
        (ev(1, 0, kind="x\\uDFFF"), "kind"),
        (ev(1, 0).replace(b'"payload":{}', b'"payload":{"a":[{"\\udc00":1}]}'), 'key payload.a[0]["\\udc00"]'),
        (
            ev(1, 0).replace(b'"payload":{}', b'"payload":{"deep":' + b"[" * 50 + b'"\\ud83d"' + b"]" * 50 + b"}"),
            "payload.deep" + "[0]" * 50,
        ),
    ],
    ids=["prompt_file", "kind", "kind-upper", "key", "deep"],
)
def test_lone_surrogate_escapes_are_corruption_naming_the_field(line: bytes, where: str) -> None:
    message = corrupted(trace_bytes(line))
    assert message.startswith("trace corrupted: line 2 has a lone surrogate escape in ")
    assert where in message
    message.encode("utf-8")  # the error itself is always printable


def test_surrogate_pairs_and_escaped_backslashes_are_fine() -> None:
    line = ev(1, 0).replace(b'"payload":{}', b'"payload":{"emoji":"\\ud83d\\ude00","text":"\\\\ud800"}')
    trace = parse_trace(trace_bytes(line))
    assert trace.events[0].payload == {"emoji": "\U0001f600", "text": "\\ud800"}


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (
            b'{"prompt_file":"agent-prompts/' + b"a" * 300 + b'.txt"}',
            "payload.prompt_file has a file name of 304 bytes",
        ),
        (b'{"response_file":"' + b"a/" * 2100 + b'x"}', "payload.response_file is 4201 bytes long"),
        (b'{"prompt_file":"a\\u0000b"}', "payload.prompt_file contains a NUL character"),
        (b'{"transcript_ref":{"path":"' + b"t" * 256 + b'"}}', "payload.transcript_ref has a file name of 256 bytes"),
    ],
    ids=["long-name", "long-path", "nul", "transcript"],
)
def test_sidecar_refs_that_can_never_name_a_file_are_corruption(payload: bytes, problem: str) -> None:
    message = corrupted(trace_bytes(ev(1, 0).replace(b'"payload":{}', b'"payload":' + payload)))
    assert message.startswith(f"trace corrupted: line 2: {problem}")


@pytest.mark.parametrize(
    ("number", "problem"),
    [
        (b"1e400", "overflows a 64-bit float"),
        (b"-1e999", "overflows a 64-bit float"),
        (b"1" + b"0" * 25, "does not fit in 64 bits"),
        (b"-" + b"9" * 19, "does not fit in 64 bits"),
    ],
)
def test_numbers_no_writer_can_write_are_corruption(number: bytes, problem: str) -> None:
    message = corrupted(trace_bytes(ev(1, 0).replace(b'"payload":{}', b'"payload":{"duration_ms":' + number + b"}")))
    assert message.startswith("trace corrupted: line 2 is not valid JSON: ") and problem in message


def test_64_bit_edges_are_kept() -> None:
    payload = b'{"a":18446744073709551615,"b":-9223372036854775808,"c":1.7976931348623157e308}'
    trace = parse_trace(trace_bytes(ev(1, 0).replace(b'"payload":{}', b'"payload":' + payload)))
    assert trace.events[0].payload == {"a": 2**64 - 1, "b": -(2**63), "c": 1.7976931348623157e308}


@pytest.mark.parametrize("command", ["verify", "show", "stats"])
@pytest.mark.parametrize(
    "payload",
    [b'{"prompt_file":"\\ud800"}', b'{"prompt_file":"' + b"p" * 300 + b'"}', b'{"duration_ms":1e400}'],
    ids=["surrogate", "enametoolong", "overflow"],
)
def test_trace_commands_report_hostile_files_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, payload: bytes
) -> None:
    from localllm.cli import main

    path = tmp_path / "t.jsonl"
    path.write_bytes(
        trace_bytes(ev(1, 0, kind="agent.call.complete").replace(b'"payload":{}', b'"payload":' + payload))
    )
    assert main(["trace", command, str(path), "--json"]) == 1
    captured = capsys.readouterr()
    assert "trace corrupted: line 2" in captured.out + captured.err


def test_traces_of_earlier_localllm_versions_still_read() -> None:
    # 9-digit stamps, payload before parent_turn/call_id, a written zero match_idx, and (the
    # only thing strict reading refuses) a turn-1 call completing after turn 2 began
    old = [
        b'{"kind":"session.header","schema_version":1,"written_at":"2026-11-01T09:00:00.000000000Z"}',
        b'{"turn":1,"seq":0,"ts":"2026-11-01T09:00:00.120000000Z","kind":"agent.call.start","state_path":"g",'
        b'"payload":{"verb":"decide","input":{"schema_path":"/home/me/app/s.json","args":{}}},"call_id":"c1",'
        b'"episode_id":"ep","match_idx":0}',
        b'{"turn":2,"seq":0,"ts":"2026-11-01T09:00:01.000000000Z","kind":"turn.start","state_path":"route","payload":{}}',
        b'{"turn":1,"seq":1,"ts":"2026-11-01T09:00:02.000000000Z","kind":"agent.call.complete","state_path":"g",'
        b'"payload":{"verb":"decide","response":{"verdict":"yes"}},"call_id":"c1"}',
    ]
    data = b"\n".join(old) + b"\n"
    with pytest.raises(TraceCorrupted, match="cross-turn"):
        parse_trace(data)
    trace = parse_trace(data, lenient=True)
    start, _, done = trace.events
    assert (start.kind, start.match_idx, start.call_id) == ("agent.call.start", 0, "c1")
    from localllm.eval.fromtrace import submission_of

    # the bare submission of an earlier trace, and the reference's shape written now
    assert submission_of(done.payload["response"]) == {"verdict": "yes"}
    assert submission_of({"submission": {"verdict": "yes"}, "meta": {}}) == {"verdict": "yes"}
    # without the interleaving, an old trace reads strictly
    assert len(parse_trace(b"\n".join(old[:3]) + b"\n").events) == 2
