"""`localllm trace verify|show|stats`, run through localllm.cli.main."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm import cli
from localllm.trace import TraceWriter, write_prompt, write_response, write_transcript
from localllm.trace.stats import percentile
from localllm.wire import Transcript

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run cli.main; returns (exit code, stdout, stderr)."""

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def make_trace(path: Path) -> None:
    d = path.parent
    with TraceWriter.open(path) as w:
        w.append("turn.start", {"input": "go"}, turn=1, state_path="foyer")
        w.append(
            "agent.call.start",
            {"verb": "decide", "agent": "agent.local", "prompt_file": write_prompt(d, "c1", "p" * 2000)},
            turn=1,
            state_path="foyer",
            call_id="c1",
        )
        ref = write_transcript(d, "c1", Transcript("openai-chat", ["{}", "{}", "{}"], [0, 1, 2]))
        w.append(
            "agent.call.complete",
            {
                "verb": "decide",
                "agent": "agent.local",
                "duration_ms": 100,
                "response_file": write_response(d, "c1", {"a": "b" * 2000}),
                "transcript_ref": ref,
            },
            turn=1,
            state_path="foyer",
            call_id="c1",
        )
        w.append(
            "agent.call.start", {"verb": "decide", "agent": "agent.local"}, turn=2, state_path="hall", call_id="c2"
        )
        w.append(
            "agent.call.complete",
            {"verb": "decide", "agent": "agent.local", "duration_ms": 300, "meta": {"fallback_of": "agent.local"}},
            turn=2,
            state_path="hall",
            call_id="c2",
        )
        w.append(
            "agent.call.error",
            {
                "verb": "ask",
                "agent": "agent.claude",
                "duration_ms": 50,
                "error": "boom",
                "substitution": {"from": "agent.local"},
            },
            turn=2,
            state_path="hall",
            call_id="c3",
        )
        w.append("machine.state_entered", {}, turn=2, state_path="hall")


def test_verify_ok(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    code, out, _ = run("trace", "verify", str(path))
    assert code == 0
    assert out == f"{path}: ok (7 events in 2 turns)\n"
    code, out, _ = run("trace", "verify", str(path), "--json")
    assert code == 0
    assert json.loads(out) == {"path": str(path), "ok": True, "events": 7, "turns": 2, "torn_bytes": 0, "problems": []}


def test_verify_prints_the_spec_message(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3] + b"\r"
    path.write_bytes(b"\n".join(lines))
    code, out, _ = run("trace", "verify", str(path))
    assert code == 1
    assert out == f"{path}: trace corrupted: CRLF line ending at line 4\n"


def test_verify_reports_torn_last_line(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    path.write_bytes(path.read_bytes() + b'{"turn":2,"se')
    code, out, _ = run("trace", "verify", str(path))
    assert code == 1
    assert out == (
        f"{path}: trace corrupted: missing trailing newline at EOF (torn last line, 13 bytes; "
        "opening the trace for append moves them to t.jsonl.torn)\n"
    )
    code, out, _ = run("trace", "verify", "--json", str(path))
    assert json.loads(out)["torn_bytes"] == 13


def test_verify_reports_missing_sidecars(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    (tmp_path / "agent-prompts" / "c1-response.json").unlink()
    (tmp_path / "transcripts" / "c1.jsonl").write_text("{}\n")
    code, out, _ = run("trace", "verify", str(path))
    assert code == 1
    assert out.splitlines() == [
        f"{path}: line 4: payload.response_file: sidecar file agent-prompts/c1-response.json is missing",
        f"{path}: line 4: payload.transcript_ref: transcript has 1 lines but the ref says events=3",
    ]


def test_verify_refuses_escaping_sidecar_paths(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as w:
        w.append("agent.call.start", {"prompt_file": "../../etc/passwd"}, turn=1)
    code, out, _ = run("trace", "verify", str(path))
    assert code == 1
    assert out == f"{path}: line 2: payload.prompt_file '../../etc/passwd' points outside the trace directory\n"


def test_missing_file_is_one_line_usage_error(tmp_path: Path, run: Run) -> None:
    code, out, err = run("trace", "show", str(tmp_path / "nope.jsonl"))
    assert code == 2  # a named input that does not exist: the command line is wrong
    assert out == ""
    assert err.splitlines()[0] == f"localllm: error: trace file {tmp_path / 'nope.jsonl'}: no such file"


def test_show_table_and_filters(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    code, out, _ = run("trace", "show", str(path))
    assert code == 0
    rows = out.splitlines()
    assert rows[0].split() == ["LINE", "TURN", "SEQ", "TS", "KIND", "CALL_ID"]
    assert len(rows) == 8
    assert rows[2].split()[:3] == ["3", "1", "1"]
    assert rows[2].split()[4:] == ["agent.call.start", "c1"]
    code, out, _ = run("trace", "show", str(path), "--kind", "agent.call")
    assert [r.split()[4] for r in out.splitlines()[1:]] == [
        "agent.call.start",
        "agent.call.complete",
        "agent.call.start",
        "agent.call.complete",
        "agent.call.error",
    ]
    code, out, _ = run("trace", "show", str(path), "--kind", "agent.call.error", "--kind", "turn.start", "--json")
    events = json.loads(out)
    assert [e["kind"] for e in events] == ["turn.start", "agent.call.error"]
    assert list(events[1]) == ["turn", "seq", "ts", "kind", "state_path", "call_id", "payload"]


def test_show_warns_about_torn_tail(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    path.write_bytes(path.read_bytes() + b"{")
    code, out, err = run("trace", "show", str(path))
    assert code == 0
    assert len(out.splitlines()) == 8
    assert err == f"localllm: warning: {path}: torn last line (1 bytes) ignored\n"


def test_show_corrupted_trace_fails_with_message_and_hint(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"not a trace\n")
    code, _, err = run("trace", "show", str(path))
    assert code == 1
    lines = err.splitlines()
    assert lines[0] == "localllm: error: trace missing session.header on line 1"
    assert lines[1].startswith(f"hint: in {path}")


def test_stats_json(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    code, out, _ = run("trace", "stats", str(path), "--json")
    assert code == 0
    stats = json.loads(out)
    assert stats["events"] == 7
    assert stats["kinds"] == {
        "agent.call.complete": 2,
        "agent.call.error": 1,
        "agent.call.start": 2,
        "machine.state_entered": 1,
        "turn.start": 1,
    }
    assert stats["calls"] == {"total": 3, "ok": 2, "error": 1, "fallbacks": 2, "late": 0, "p50_ms": 100, "p95_ms": 300}
    assert stats["agents"] == {
        "agent.claude": {"total": 1, "ok": 0, "error": 1, "fallbacks": 1, "late": 0, "p50_ms": 50, "p95_ms": 50},
        "agent.local": {"total": 2, "ok": 2, "error": 0, "fallbacks": 1, "late": 0, "p50_ms": 100, "p95_ms": 300},
    }


def test_stats_table(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    code, out, _ = run("trace", "stats", str(path))
    assert code == 0
    assert "agent calls: 3 (ok 2, error 1, fallbacks 2); duration p50 100, p95 300" in out
    agent_rows = [line.split() for line in out.splitlines() if line.startswith("agent.local ")]
    assert agent_rows == [["agent.local", "2", "2", "0", "1", "100", "300"]]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5], 95) == 5
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile([3, 1, 2], 50) == 2


def test_real_cli_routes_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    make_trace(path)
    assert cli.main(["trace", "verify", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok (7 events in 2 turns)\n"
