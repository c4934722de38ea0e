"""Prompt/response/transcript sidecar files and the inline-or-sidecar decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localllm.errors import TraceError, TraceWriteRejected
from localllm.trace import SIDECAR_THRESHOLD, needs_sidecar, write_prompt, write_response, write_transcript
from localllm.trace.sidecars import PROMPTS_DIR, TEMP_DIR, TEMP_GRACE_SECONDS, TRANSCRIPTS_DIR, sweep_stale_temps
from localllm.wire import Transcript
from tests.conftest import REPO

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
    assert os.listdir(tmp_path / "agent-prompts") == [TEMP_DIR]
    assert os.listdir(tmp_path / "agent-prompts" / TEMP_DIR) == []


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


# ---------------------------------------------------------------- temps of killed writers


def _reopen(trace_dir: Path) -> None:
    """What a new run does first: open the trace and its recorder (which sweeps)."""
    from localllm.trace.recorder import TraceRecorder
    from localllm.trace.writer import TraceWriter

    with TraceWriter.open(trace_dir / "t.jsonl") as writer:
        TraceRecorder(writer)


# Writes a prompt sidecar, stalling between its temp file and the link; the parent SIGKILLs it there.
_STALLED_WRITER = textwrap.dedent("""
    import os, sys, time
    from localllm.trace import sidecars

    def stall(*args, **kwargs):
        print("linking", flush=True)
        time.sleep(600)

    os.link = stall
    sidecars.write_prompt(sys.argv[1], "c9", "x" * 3000, exclusive=True)
""")


def test_a_killed_writers_temp_is_in_the_temp_directory_and_swept_at_the_next_open(tmp_path: Path) -> None:
    _record_one(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", _STALLED_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's localllm, like the test's
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "linking\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    prompts = tmp_path / PROMPTS_DIR
    [temp] = list((prompts / TEMP_DIR).iterdir())  # the killed writer's, in the temp directory
    assert temp.read_bytes() == b"x" * 3000
    assert sorted(p.name for p in prompts.iterdir() if p.name.startswith(".")) == [TEMP_DIR]
    assert not (prompts / "c9.txt").exists()
    _reopen(tmp_path)
    assert temp.exists()  # younger than the grace period: may be a live writer's
    os.utime(temp, (0, 0))
    _reopen(tmp_path)
    assert list((prompts / TEMP_DIR).iterdir()) == []


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory listed through os.scandir or os.listdir from now on."""
    calls: list[Path] = []
    scandir, listdir = os.scandir, os.listdir

    def counting_scandir(path: str | os.PathLike[str] = ".") -> object:
        calls.append(Path(path))
        return scandir(path)

    def counting_listdir(path: str | os.PathLike[str] = ".") -> list[str]:
        calls.append(Path(path))
        return listdir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "listdir", counting_listdir)
    return calls


def test_opening_a_recorder_lists_the_temp_directories_never_the_sidecars(tmp_path: Path, listed: list[Path]) -> None:
    _record_one(tmp_path)
    _record_one(tmp_path, "c2")
    listed.clear()
    _reopen(tmp_path)
    assert sorted(listed) == sorted([tmp_path / PROMPTS_DIR / TEMP_DIR, tmp_path / TRANSCRIPTS_DIR / TEMP_DIR])


def test_temps_an_earlier_localllm_left_beside_the_sidecars_are_swept_once(tmp_path: Path, listed: list[Path]) -> None:
    prompts = tmp_path / PROMPTS_DIR
    prompts.mkdir()  # as an earlier localllm left it: sidecars and temps side by side, no temp directory
    (prompts / "c1.txt").write_text("p")
    old, young = prompts / ".c2.txt.4242.0badc0de.tmp", prompts / ".c3.txt.4243.0badc0df.tmp"
    for path in (old, young):
        path.write_bytes(b"partial")
    os.utime(old, (0, 0))
    now = os.stat(young).st_mtime + 60
    assert sweep_stale_temps(tmp_path, now=now) == [old]
    assert not (prompts / TEMP_DIR).exists()  # a temp there is too young to judge: listed again next time
    assert sweep_stale_temps(tmp_path, now=now + TEMP_GRACE_SECONDS) == [young]
    assert (prompts / TEMP_DIR).is_dir()  # the old location is done with
    (prompts / ".c4.txt.1.00000000.tmp").write_bytes(b"left by an older writer after the upgrade")
    listed.clear()
    assert sweep_stale_temps(tmp_path, now=now + 10 * TEMP_GRACE_SECONDS) == []
    assert [p for p in listed if p.exists()] == [prompts / TEMP_DIR]  # transcripts/ does not exist
    assert (prompts / "c1.txt").read_text() == "p"


def test_a_temp_directory_that_is_a_link_is_never_written_or_swept_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / ".c1.txt.1.00000000.tmp"
    victim.write_bytes(b"user data")
    os.utime(victim, (0, 0))
    (tmp_path / "t" / PROMPTS_DIR).mkdir(parents=True)
    (tmp_path / "t" / PROMPTS_DIR / TEMP_DIR).symlink_to(elsewhere)
    with pytest.raises(TraceError):
        write_prompt(tmp_path / "t", "c1", "x")
    assert sweep_stale_temps(tmp_path / "t") == []
    assert sorted(p.name for p in elsewhere.iterdir()) == [victim.name]
    assert not (tmp_path / "t" / PROMPTS_DIR / "c1.txt").exists()


def test_verify_refuses_a_reference_to_a_temp_file(tmp_path: Path) -> None:
    from localllm.trace.verify import verify_trace

    rel = _record_one(tmp_path)[0]
    temp = f"{PROMPTS_DIR}/{TEMP_DIR}/.c1.txt.4242.0badc0de.tmp"
    (tmp_path / temp).write_bytes((tmp_path / rel).read_bytes())  # what a killed writer left, whole
    trace = tmp_path / "t.jsonl"
    assert verify_trace(trace).problems == []
    trace.write_text(trace.read_text().replace(json.dumps(rel), json.dumps(temp)))
    assert len(verify_trace(trace).problems) == 1
