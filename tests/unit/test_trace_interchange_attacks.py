"""Interchange with the reference engine (Kitsoki) under hostile and mutated traces.

Each defect test names what the reference does (trace-format §3, §7, §10.1 and the fixtures
in ``fixtures/kitsoki``): its ``store.Event`` keeps a read payload as ``json.RawMessage``
and writes it back as Go's ``json.Compact`` leaves it; ``turn``/``parent_turn`` are
``int64`` and ``seq``/``match_idx`` Go ``int``, so a value of 2^63 or more is refused at read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.errors import TraceCorrupted
from localllm.trace.reader import read_trace
from localllm.trace.writer import TraceWriter

FIXTURES = Path(__file__).parent / "fixtures" / "kitsoki" / "traces"
HEADER = b'{"kind":"session.header","schema_version":1,"written_at":"2024-01-01T00:00:00Z"}\n'


def _event(turn: int, seq: int, payload: bytes = b"{}", kind: bytes = b"x", extra: bytes = b"") -> bytes:
    return b'{"turn":%d,"seq":%d,"ts":"2024-01-01T00:00:01Z","kind":"%s"%s,"payload":%s}\n' % (
        turn,
        seq,
        kind,
        extra,
        payload,
    )


def _rewrite(src: Path, dst: Path) -> bytes:
    """localllm's read → rewrite (``append_event`` per event), as Kitsoki's OpenJSONL + Append."""
    trace = read_trace(src)
    with TraceWriter.open(dst, header=trace.header_line) as writer:
        for event in trace.events:
            writer.append_event(event)
    return dst.read_bytes()


# ------------------------------------------------------------- payload bytes kept on rewrite


def test_a_read_payload_is_rewritten_with_its_own_bytes_as_the_reference_keeps_them(tmp_path: Path) -> None:
    # canned_trace.jsonl line 4, its payload as a plugin's sub-event could hand it over (the
    # reference appends those verbatim): float text, exponent, escapes, spaces, a raw "<"
    canned = (FIXTURES / "canned_trace.jsonl").read_bytes().splitlines(keepends=True)
    mutated = canned[3].replace(
        b'"payload":{"from":"foyer","to":"bar.dark","intent":"go"}',
        b'"payload": { "from" : "foyer", "to":"bar.dark", "intent":"go",'
        b' "n": [1.0, 1E+2, 0.10, -0.0, 1e-07], "s": "\\u00e9 \\/ <b>" } ',
    )
    assert mutated != canned[3]
    src = tmp_path / "src.jsonl"
    src.write_bytes(b"".join([*canned[:3], mutated, *canned[4:]]))
    lines = _rewrite(src, tmp_path / "out.jsonl").splitlines(keepends=True)
    # Go's json.Compact of the RawMessage: whitespace out, <>& escaped, the rest byte for byte
    assert lines[3] == (
        b'{"turn":1,"seq":2,"ts":"2026-04-21T13:02:45.388Z","kind":"machine.transition","state_path":"foyer",'
        b'"payload":{"from":"foyer","to":"bar.dark","intent":"go","n":[1.0,1E+2,0.10,-0.0,1e-07],'
        b'"s":"\\u00e9 \\/ \\u003cb\\u003e"}}\n'
    )
    # every other line as the reference rewrites it (the fixture's rewrite)
    reference = (FIXTURES / "canned_trace.reference-rewrite.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[1:3] + lines[4:] == reference[1:3] + reference[4:]


def test_the_rewrite_of_a_rewrite_is_identical(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_bytes(HEADER + _event(1, 0, b'{"a": 1.50, "b": "\\u0041\\u2028"}'))
    first = _rewrite(src, tmp_path / "one.jsonl")
    assert first == HEADER + _event(1, 0, b'{"a":1.50,"b":"\\u0041\\u2028"}')
    assert _rewrite(tmp_path / "one.jsonl", tmp_path / "two.jsonl") == first


def test_a_payload_changed_after_reading_is_encoded_afresh(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_bytes(HEADER + _event(1, 0, b'{"a":1.0}') + _event(1, 1, b'{"a":1.0}'))
    events = read_trace(src).events
    events[0].payload["a"] = 2.5  # in place
    replaced = dataclasses.replace(events[1], payload={"a": 3.0})
    assert replaced.raw_line is None
    with TraceWriter.open(tmp_path / "out.jsonl", header=HEADER[:-1]) as writer:
        writer.append_event(events[0])
        writer.append_event(replaced)
    assert (tmp_path / "out.jsonl").read_bytes() == HEADER + _event(1, 0, b'{"a":2.5}') + _event(1, 1, b'{"a":3}')


# ------------------------------------------------------------- 64-bit fields


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            _event(2**63, 0),
            'trace corrupted: line 2: field "turn" 9223372036854775808 does not fit in a signed 64-bit integer',
        ),
        (
            _event(2**64 - 1, 0),
            'trace corrupted: line 2: field "turn" 18446744073709551615 does not fit in a signed 64-bit integer',
        ),
        (
            _event(2, 0, extra=b',"parent_turn":9223372036854775808'),
            'trace corrupted: line 2: field "parent_turn" 9223372036854775808 does not fit in a signed 64-bit integer',
        ),
        (
            _event(1, 0, extra=b',"episode_id":"e","match_idx":9223372036854775808'),
            'trace corrupted: line 2: field "match_idx" 9223372036854775808 does not fit in a signed 64-bit integer',
        ),
    ],
)
def test_a_count_past_int64_is_refused_at_read(line: bytes, message: str, tmp_path: Path) -> None:
    # before: read as valid (`trace verify`: ok), then the writer refused to rewrite it
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEADER + line)
    with pytest.raises(TraceCorrupted) as info:
        read_trace(path)
    assert info.value.message == message
    with pytest.raises(TraceCorrupted):
        TraceWriter.open(path)
    assert path.read_bytes() == HEADER + line


def test_the_largest_int64_turn_still_reads_and_rewrites(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_bytes(HEADER + _event(2**63 - 1, 0, extra=b',"parent_turn":9223372036854775807'))
    assert _rewrite(src, tmp_path / "out.jsonl") == src.read_bytes()


def test_trace_verify_refuses_a_turn_past_int64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(HEADER + _event(2**63, 0))
    assert main(["trace", "verify", str(path)]) == 1
    out = capsys.readouterr()
    assert "does not fit in a signed 64-bit integer" in out.out + out.err
    assert "Traceback" not in out.out + out.err


# ------------------------------------------------------------- attacks that held


ATTACKS = {
    "bom": (b"\xef\xbb\xbf" + HEADER + _event(1, 0), "trace corrupted: byte order mark at start of file"),
    "crlf": (HEADER + _event(1, 0)[:-1] + b"\r\n", "trace corrupted: CRLF line ending at line 2"),
    "torn": (HEADER + _event(1, 0)[:-1], "trace corrupted: missing trailing newline at EOF"),
    "gap": (HEADER + _event(1, 0) + _event(1, 2), "gap in seq within turn 1 at line 3"),
    "huge_unknown_after_gap": (
        HEADER + _event(1, 1) + _event(1, 2, b'{"a":"' + b"x" * 10_000_000 + b'"}', b"future.kind"),
        "gap in seq within turn 1 at line 2",
    ),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_hostile_traces_give_the_spec_message_and_write_nothing(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, message = ATTACKS[name]
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    with pytest.raises(TraceCorrupted) as info:
        read_trace(path)
    assert info.value.message == message
    for argv in (["cassette", "--app-id", "a", "-o", "c.yaml"], ["cases", "--gate", "g", "-o", "c.jsonl"]):
        out = tmp_path / argv[-1]
        assert main(["trace", argv[0], str(path), *argv[1:-1], str(out)]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert not out.exists()
    assert path.read_bytes() == data


def test_a_ten_megabyte_unknown_kind_line_round_trips(tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_bytes(HEADER + _event(1, 0, b'{"a":"' + b"\xc3\xa9" * 5_000_000 + b'"}', b"future.kind.v99"))
    assert _rewrite(src, tmp_path / "out.jsonl") == src.read_bytes()
