"""Prompt/response/transcript sidecar files and the inline-or-sidecar decision."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localllm.errors import TraceError, TraceWriteRejected
from localllm.trace import SIDECAR_THRESHOLD, needs_sidecar, write_prompt, write_response, write_transcript
from localllm.wire import Transcript

CID = "2d8e4fbb0a78646d"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*.tmp"))


def test_threshold_is_1024_bytes() -> None:
    assert SIDECAR_THRESHOLD == 1024
    assert not needs_sidecar("x" * 1024)
    assert needs_sidecar("x" * 1025)
    assert needs_sidecar("é" * 513)  # 1026 UTF-8 bytes, 513 characters
    assert not needs_sidecar("é" * 512)


def test_values_are_measured_as_json() -> None:
    assert not needs_sidecar({"a": "x" * 1000})
    assert needs_sidecar({"a": "x" * 1020})  # {"a":"…"} is 1028 bytes
    assert not needs_sidecar([1, 2, 3])
    assert not needs_sidecar(None)


@pytest.mark.parametrize(
    "value",
    ["a\r\nb", "nul\x00", "e\u0301", {"k": "\r\n"}, {"e\u0301": 1}, float("nan"), {1, 2}, b"bytes", "\ud800"],
)
def test_values_the_trace_cannot_inline_need_a_sidecar(value: object) -> None:
    assert needs_sidecar(value)


def test_write_prompt_is_verbatim_and_relative(tmp_path: Path) -> None:
    text = "line one\r\nline two\x00 é\u0301\n" + "x" * 2000
    rel = write_prompt(tmp_path, CID, text)
    assert rel == f"agent-prompts/{CID}.txt"
    assert (tmp_path / rel).read_bytes() == text.encode("utf-8")
    assert leftovers(tmp_path) == []


def test_write_response_is_json(tmp_path: Path) -> None:
    value = {"intent": "go", "slots": {"n": "1"}, "text": "é" * 600}
    rel = write_response(tmp_path, CID, value)
    assert rel == f"agent-prompts/{CID}-response.json"
    raw = (tmp_path / rel).read_bytes()
    assert raw.endswith(b"}\n")
    assert json.loads(raw) == value
    assert "é".encode() in raw  # UTF-8, not \\u escapes


def test_write_response_rejects_non_json(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteRejected, match=r"^trace event rejected: response: is not JSON-serialisable"):
        write_response(tmp_path, CID, {"x": float("inf")})
    assert not (tmp_path / "agent-prompts" / f"{CID}-response.json").exists()


def test_suffix_keeps_attempts_apart_and_rewrites_replace(tmp_path: Path) -> None:
    a = write_prompt(tmp_path, CID, "first")
    b = write_prompt(tmp_path, CID, "fallback", suffix="-fallback")
    assert b == f"agent-prompts/{CID}-fallback.txt"
    write_prompt(tmp_path, CID, "second")
    assert (tmp_path / a).read_text() == "second"
    assert (tmp_path / b).read_text() == "fallback"


@pytest.mark.parametrize("call_id", ["../escape", "a/b", "", ".hidden", "x" * 200, "a b"])
def test_unsafe_call_ids_are_refused(tmp_path: Path, call_id: str) -> None:
    with pytest.raises(TraceWriteRejected) as info:
        write_prompt(tmp_path, call_id, "x")
    assert str(info.value) == (
        f"trace event rejected: call_id: {call_id!r} is not a safe file name (use letters, digits, '.', '_', '-')"
    )
    assert not (tmp_path / "agent-prompts").exists()


def test_unsafe_suffix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteRejected, match="suffix"):
        write_transcript(tmp_path, CID, Transcript("openai-chat", [], []), suffix="/../x")


def test_write_transcript_files_and_ref(tmp_path: Path) -> None:
    lines = [
        '{"message":{"content":"hi","role":"user"},"model":"m","type":"request"}',
        '{"type":"assistant",  "n": 1.50}',
        '{"result":"{}","type":"result","usage":{"input_tokens":3,"output_tokens":1}}',
    ]
    ref = write_transcript(tmp_path, CID, Transcript("openai-chat", lines, [0, 15, 1203]))
    assert ref == {
        "format": "openai-chat",
        "path": f"transcripts/{CID}.jsonl",
        "events": 3,
        "schema_version": 1,
    }
    assert list(ref) == ["format", "path", "events", "schema_version"]
    assert (tmp_path / ref["path"]).read_bytes() == ("\n".join(lines) + "\n").encode()
    assert (tmp_path / "transcripts" / f"{CID}.timings").read_text() == "0 0\n1 15\n2 1203\n"
    original = write_transcript(tmp_path, CID, Transcript("openai-chat", lines[:1], [4]), suffix="-original")
    assert original["path"] == f"transcripts/{CID}-original.jsonl"
    assert (tmp_path / "transcripts" / f"{CID}-original.timings").read_text() == "0 4\n"
    assert leftovers(tmp_path) == []


def test_empty_transcript(tmp_path: Path) -> None:
    ref = write_transcript(tmp_path, CID, Transcript("claude-stream-json", [], []))
    assert ref["events"] == 0
    assert (tmp_path / ref["path"]).read_bytes() == b""


def test_transcript_shape_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteRejected) as info:
        write_transcript(tmp_path, CID, Transcript("openai-chat", ["{}", "{}"], [0]))
    assert str(info.value) == "trace event rejected: transcript: has 2 lines but 1 offsets_ms (one offset per line)"
    with pytest.raises(TraceWriteRejected) as info:
        write_transcript(tmp_path, CID, Transcript("openai-chat", ["{}", "{\n}"], [0, 1]))
    assert str(info.value) == "trace event rejected: transcript.lines[1]: must be one line of text (no newline)"
    assert not (tmp_path / "transcripts").exists()


def test_failed_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(TraceError) as info:
        write_prompt(tmp_path, CID, "x")
    assert (
        str(info.value)
        == f"cannot write sidecar {tmp_path / 'agent-prompts' / (CID + '.txt')}: No space left on device"
    )
    assert os.listdir(tmp_path / "agent-prompts") == []


def _record_one(trace_dir: Path, call_id: str = "c1") -> list[str]:
    """One call with a large prompt, a large response and a transcript; the sidecar paths its end names."""
    from localllm.trace.reader import read_trace
    from localllm.trace.recorder import TraceRecorder
    from localllm.trace.writer import TraceWriter
    from localllm.wire import AskRequest, AskResponse

    big = "x" * 2000
    with TraceWriter.open(trace_dir / "t.jsonl") as writer:
        recorder = TraceRecorder(writer)
        request = AskRequest("s", 1, "g", "decide", big, call_id, "2030-01-01T00:00:00Z")
        record = recorder.call_started(request, alias="agent.x", schema_path=None, args={})
        answer = AskResponse(
            submission=json.dumps({"v": big}), transcript=Transcript("claude-stream-json", ["{}"], [5])
        )
        record.leg_finished("agent.x", answer, None, {"v": big})
        record.finished(call_id=call_id, duration_ms=3, meta={})
    start, end = read_trace(trace_dir / "t.jsonl").events[-2:]
    return [start.payload["prompt_file"], end.payload["response_file"], end.payload["transcript_ref"]["path"]]


def test_a_users_timings_file_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "transcripts").mkdir()
    (tmp_path / "transcripts" / "c1.timings").write_text("mine\n")
    paths = _record_one(tmp_path)
    assert (tmp_path / "transcripts" / "c1.timings").read_text() == "mine\n"  # before: replaced by "0 5"
    assert all("c1-1" in p for p in paths)


def test_a_name_another_writer_takes_after_the_check_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localllm.trace import recorder

    free = recorder._free_suffix

    def racing(trace_dir: Path, call_id: str, start: int = 0) -> tuple[int, str]:
        found = free(trace_dir, call_id, start)
        if found[0] == 0:  # another process writes c1's response right after the check
            (trace_dir / "agent-prompts").mkdir(exist_ok=True)
            (trace_dir / "agent-prompts" / "c1-response.json").write_text("theirs\n")
        return found

    monkeypatch.setattr(recorder, "_free_suffix", racing)
    paths = _record_one(tmp_path)
    assert (tmp_path / "agent-prompts" / "c1-response.json").read_text() == "theirs\n"  # before: replaced
    assert all("c1-1" in p for p in paths)
    assert not (tmp_path / "agent-prompts" / "c1.txt").exists()  # what the given-up attempt wrote is gone
