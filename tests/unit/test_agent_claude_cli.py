"""builtin.claude_cli against a fake ``claude`` on PATH (a real subprocess per call)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from localllm.agents.claude_cli import ClaudeCliAgent, _meta, extract_json, schema_instruction
from localllm.config import ClaudeCliDecl
from localllm.errors import AgentError, ErrorKind
from localllm.wire import AskRequest
from tests.unit.fakes.fake_claude import MODEL, install

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["approve", "reject"]},
        "confidence": {"type": "number", "minimum": 0.5, "maximum": 1},
        "count": {"type": "integer", "exclusiveMinimum": 2, "maximum": 10},
        "reason": {"type": "string", "maxLength": 1},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "ok": {"type": ["null", "boolean"]},
    },
    "required": ["verdict", "confidence", "count", "reason", "tags", "ok"],
    "additionalProperties": False,
}
EXPECTED = {"verdict": "approve", "confidence": 0.5, "count": 3, "reason": "o", "tags": ["ok", "ok"], "ok": True}


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake claude shim first on PATH; every run is recorded to the returned file."""
    shim = install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    record = tmp_path / "claude-runs.jsonl"
    monkeypatch.setenv("FAKE_CLAUDE_RECORD", str(record))
    for var in ("FAKE_CLAUDE_MODE", "FAKE_CLAUDE_RESULT", "FAKE_CLAUDE_NO_CACHE"):
        monkeypatch.delenv(var, raising=False)
    yield record


def runs(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def make_agent(**kw: Any) -> ClaudeCliAgent:
    fields: dict[str, Any] = {"alias": "agent.claude", "plugin": "builtin.claude_cli"}
    fields.update(kw)
    return ClaudeCliAgent(ClaudeCliDecl(**fields))


def request(schema: dict[str, Any] | None = SCHEMA, call_id: str = "0123456789abcdef") -> AskRequest:
    return AskRequest(
        session_id="s1",
        turn=1,
        state_path="root",
        verb="decide",
        prompt="Should we merge PR 42?",
        call_id=call_id,
        deadline="2030-01-01T00:00:00Z",
        schema=schema,
    )


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


# -- success ----------------------------------------------------------------------------


def test_success_builds_answer_from_schema_and_reports_usage_and_cost(fake_claude: Path) -> None:
    agent = make_agent(model="opus", extra_args=("--max-turns", "1"))
    resp = agent.ask(request(), deadline=soon())
    assert json.loads(resp.submission or "") == EXPECTED
    assert resp.meta == {
        "usage": {
            "input_tokens": 12,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 2048,
        },
        "cache": {"read_tokens": 2048, "creation_tokens": 0, "hit": True},
        "cost_usd": 0.0123,
        "model": "opus",  # the fake reports --model as the model that wrote most output
        "session_id": "00000000-0000-4000-8000-000000000001",
        "num_turns": 1,
    }
    [run] = runs(fake_claude)
    assert run["argv"] == ["-p", "--output-format", "stream-json", "--verbose", "--model", "opus", "--max-turns", "1"]
    assert run["prompt"].startswith("Should we merge PR 42?")
    assert run["prompt"].endswith(schema_instruction(SCHEMA))
    assert json.dumps(SCHEMA, indent=2) in run["prompt"]
    assert "only that JSON" in run["prompt"]


def test_transcript_is_every_stream_event_verbatim(fake_claude: Path, tmp_path: Path) -> None:
    script = tmp_path / "claude"
    events = [
        '{"type":"system","subtype":"init","model":"claude-x","session_id":"s","n":1.50}',
        '{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Read"}]},"session_id":"s"}',
        '{"type":"user","message":{"content":[{"type":"tool_result","content":"\\u00e9"}]}}',
        '{"type":"result","subtype":"success","is_error":false,"result":"{\\"a\\": 1}","total_cost_usd":1e-3}',
    ]
    script.write_text("#!/bin/sh\ncat >/dev/null\n" + "".join(f"printf '%s\\n' '{e}'\n" for e in events))
    script.chmod(0o755)
    resp = make_agent(claude_bin=str(script)).ask(request(schema=None), deadline=soon())
    assert resp.transcript is not None
    assert resp.transcript.format == "claude-stream-json"
    assert resp.transcript.lines == events  # byte-verbatim: key order, literals, escapes
    assert len(resp.transcript.offsets_ms) == 4 and resp.transcript.offsets_ms == sorted(resp.transcript.offsets_ms)
    assert resp.submission == '{"a": 1}'
    assert resp.meta is not None
    assert (resp.meta["model"], resp.meta["cost_usd"]) == ("claude-x", 0.001)  # the init event's model


def test_the_fake_speaks_the_stream(fake_claude: Path) -> None:
    resp = make_agent().ask(request(), deadline=soon())
    assert resp.transcript is not None
    assert [json.loads(line)["type"] for line in resp.transcript.lines] == ["system", "assistant", "result"]
    assert json.loads(resp.transcript.lines[-1])["result"] == resp.submission
    assert resp.meta is not None and resp.meta["model"] == MODEL


@pytest.mark.parametrize("mode", ["linger", pytest.param("result_then_hang", marks=pytest.mark.slow)])
def test_answer_is_complete_at_the_result_event_not_at_eof(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A grandchild holding stdout (linger) or a CLI that never exits after its result
    (result_then_hang) must not hold the call until the deadline; nothing is left running."""
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_CLAUDE_MODE", mode)
    monkeypatch.setenv("FAKE_CLAUDE_PIDFILE", str(pidfile))
    started = time.monotonic()
    resp = make_agent().ask(request(), deadline=soon(60))
    assert time.monotonic() - started < 20  # the deadline was 60 s away
    assert json.loads(resp.submission or "") == EXPECTED
    assert all_gone(wait_for_pids(pidfile))


def test_given_result_text_is_the_submission(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_RESULT", '{"verdict": "reject"}')
    resp = make_agent().ask(request(), deadline=soon())
    assert resp.submission == '{"verdict": "reject"}'


def test_no_cache_keys_means_no_cache_view(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_NO_CACHE", "1")
    resp = make_agent().ask(request(), deadline=soon())
    assert resp.meta is not None
    assert "cache" not in resp.meta
    assert resp.meta["usage"] == {"input_tokens": 12, "output_tokens": 7}


def test_no_schema_prompt_is_sent_unchanged(fake_claude: Path) -> None:
    resp = make_agent().ask(request(schema=None), deadline=soon())
    assert json.loads(resp.submission or "") == {"answer": "ok"}
    [run] = runs(fake_claude)
    assert run["prompt"] == "Should we merge PR 42?"


def test_no_schema_free_text_becomes_a_json_string(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_RESULT", "Yes, merge it.")
    resp = make_agent().ask(request(schema=None), deadline=soon())
    assert resp.submission == '"Yes, merge it."'


# -- answer extraction --------------------------------------------------------------------


def test_fenced_answer_is_unwrapped(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "fenced")
    resp = make_agent().ask(request(), deadline=soon())
    assert json.loads(resp.submission or "") == EXPECTED
    assert not (resp.submission or "").startswith("```")


def test_single_object_in_prose_is_extracted(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "prose")
    resp = make_agent().ask(request(), deadline=soon())
    assert json.loads(resp.submission or "") == EXPECTED


def test_unextractable_answer_is_passed_on_raw(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_RESULT", "I think you should approve it.")
    resp = make_agent().ask(request(), deadline=soon())
    assert resp.submission == "I think you should approve it."


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        ('  {"a": 1}\n', None, '{"a": 1}'),
        ('```json\n{"a": 1}\n```', None, '{"a": 1}'),
        ('```\n{"a": 1}\n```', None, '{"a": 1}'),
        ('```python\n{"a": 1}\n```', None, '{"a": 1}'),  # via the prose rule
        ('Sure! {"a": {"b": [1, 2]}} done', None, '{"a": {"b": [1, 2]}}'),
        ('first {"a": 1} then {"b": 2}', None, None),  # ambiguous
        ("no json {here", None, None),
        ("items: [1, 2] ok", {"type": "array"}, "[1, 2]"),
        ("items: [1, 2] ok", {"type": "object"}, None),
        ("42", {"type": "integer"}, "42"),
        ('prose {"a":' + "[" * 5000, None, None),  # deeper than json decodes: RecursionError before
        ('ok {"a": 1} then {"b":' + "[" * 5000 + "]" * 5000 + "}", None, None),  # one is too deep: ambiguous
        ("[" * 5000, {"type": "array"}, None),
    ],
)
def test_extract_json_rule(text: str, schema: dict[str, Any] | None, expected: str | None) -> None:
    assert extract_json(text, schema) == expected


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        ({"total_cost_usd": float("inf")}, None),  # reached `call --json` as Infinity
        ({"total_cost_usd": float("nan")}, None),
        ({"total_cost_usd": 10**400}, None),  # float() raised OverflowError
        ({"total_cost_usd": float("nan"), "cost_usd": 0.5}, 0.5),
        ({"total_cost_usd": 2}, 2.0),
    ],
)
def test_only_a_finite_cost_is_reported(envelope: dict[str, Any], expected: float | None) -> None:
    assert _meta(envelope, None).get("cost_usd") == expected


# -- failures -----------------------------------------------------------------------------


def test_nonzero_exit_is_plugin_crash_with_stderr_tail(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "exit2")
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.PLUGIN_CRASH
    assert "exited with code 2" in info.value.detail
    assert "invalid API key" in info.value.detail
    assert str(info.value).startswith("agent: plugin_crash: ")


def test_error_envelope_is_plugin_crash_with_result_text(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "error_envelope")
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.PLUGIN_CRASH
    assert "Credit balance is too low" in info.value.detail


def test_garbage_stdout_is_plugin_crash_quoting_it(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "garbage")
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.PLUGIN_CRASH
    assert "Welcome to Claude! This is not JSON." in info.value.detail


def test_missing_binary_names_the_three_ways_to_set_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    agent = make_agent()  # constructing never needs the binary (agent.claude is injected)
    with pytest.raises(AgentError) as info:
        agent.ask(request(), deadline=soon())
    assert (info.value.kind, info.value.alias) == (ErrorKind.TRANSPORT_ERROR, "agent.claude")
    assert info.value.detail == "claude CLI not found on PATH"
    hint = info.value.hint
    assert "claude_bin:" in hint and "agent_plugins.agent.claude" in hint
    assert "LOCALLLM_CLAUDE_BIN" in hint and "PATH" in hint


def test_env_bin_that_does_not_exist_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALLLM_CLAUDE_BIN", str(tmp_path / "nope" / "claude"))
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "LOCALLLM_CLAUDE_BIN is" in info.value.detail
    assert str(tmp_path / "nope" / "claude") in info.value.detail
    assert info.value.hint.startswith("fix LOCALLLM_CLAUDE_BIN or unset it")


def test_decl_bin_wins_over_env_and_path(fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = install(tmp_path / "other-bin")
    monkeypatch.setenv("LOCALLLM_CLAUDE_BIN", str(tmp_path / "missing"))
    agent = make_agent(claude_bin=str(other))
    assert agent.resolve_bin() == str(other)
    assert json.loads(agent.ask(request(), deadline=soon()).submission or "") == EXPECTED


def test_env_bin_wins_over_path(fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = install(tmp_path / "env-bin")
    monkeypatch.setenv("LOCALLLM_CLAUDE_BIN", str(other))
    assert make_agent().resolve_bin() == str(other)


def test_decl_bin_by_name_is_looked_up_on_path(fake_claude: Path) -> None:
    assert make_agent(claude_bin="claude").resolve_bin() == str(fake_claude.parent / "bin" / "claude")


# -- deadline and cancel ------------------------------------------------------------------


def wait_for_pids(pidfile: Path) -> list[int]:
    limit = time.monotonic() + 20
    while time.monotonic() < limit:
        if pidfile.exists() and len(pidfile.read_text().split()) == 2:
            return [int(p) for p in pidfile.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the fake claude never started its child")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def all_gone(pids: list[int]) -> bool:
    """Whether every pid dies; SIGKILL is delivered asynchronously, so poll (bounded)."""
    limit = time.monotonic() + 10
    while time.monotonic() < limit:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow
def test_hang_is_killed_at_the_deadline_with_its_children(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "hang")
    monkeypatch.setenv("FAKE_CLAUDE_PIDFILE", str(pidfile))
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=time.monotonic() + 2.0)
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    pids = wait_for_pids(pidfile)
    assert all_gone(pids), pids


def test_cancel_from_another_thread_kills_the_call(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "hang")
    monkeypatch.setenv("FAKE_CLAUDE_PIDFILE", str(pidfile))
    agent = make_agent()
    errors: list[AgentError] = []

    def worker() -> None:
        try:
            agent.ask(request(call_id="feedfacefeedface"), deadline=soon(600))
        except AgentError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    pids = wait_for_pids(pidfile)
    agent.cancel("feedfacefeedface")
    thread.join(timeout=20)
    assert not thread.is_alive()
    [error] = errors
    assert error.kind is ErrorKind.DEADLINE_EXCEEDED
    assert "cancelled" in error.detail
    assert all_gone(pids), pids


def test_close_kills_in_flight_calls_and_refuses_new_ones(
    fake_claude: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("FAKE_CLAUDE_MODE", "hang")
    monkeypatch.setenv("FAKE_CLAUDE_PIDFILE", str(pidfile))
    agent = make_agent()
    errors: list[AgentError] = []
    thread = threading.Thread(target=lambda: errors.extend(_catch(lambda: agent.ask(request(), deadline=soon(600)))))
    thread.start()
    pids = wait_for_pids(pidfile)
    agent.close()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert [e.kind for e in errors] == [ErrorKind.DEADLINE_EXCEEDED]
    assert all_gone(pids), pids
    with pytest.raises(AgentError) as info:
        agent.ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "closed" in info.value.detail


def _catch(fn: Any) -> list[AgentError]:
    try:
        fn()
    except AgentError as exc:
        return [exc]
    return []


def test_passed_deadline_never_spawns(fake_claude: Path) -> None:
    with pytest.raises(AgentError) as info:
        make_agent().ask(request(), deadline=time.monotonic() - 1)
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert runs(fake_claude) == []


def test_concurrent_calls_each_get_their_answer(fake_claude: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = make_agent()
    results: dict[int, Any] = {}

    def worker(i: int) -> None:
        schema = {"type": "object", "properties": {"n": {"const": i}}, "required": ["n"]}
        resp = agent.ask(request(schema=schema, call_id=f"{i:016x}"), deadline=soon())
        results[i] = json.loads(resp.submission or "")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: {"n": i} for i in range(4)}


# -- through the runtime: a valid trace with the transcript sidecar ------------------------


def test_runtime_call_lands_in_a_valid_trace(fake_claude: Path, tmp_path: Path) -> None:
    from localllm.cli import main
    from localllm.loading import load_config
    from localllm.runtime import Runtime
    from localllm.trace import read_trace

    (tmp_path / "verdict.json").write_text(json.dumps(SCHEMA))
    config = tmp_path / "app.yaml"
    config.write_text("app_id: demo\n")  # agent.claude is injected
    trace = tmp_path / "run" / "trace.jsonl"
    trace.parent.mkdir()
    with Runtime(load_config(config), trace=trace) as runtime:
        result = runtime.call("decide", agent="agent.claude", prompt="merge?", schema="verdict.json")
    assert result.submission == EXPECTED
    assert result.meta["cost_usd"] == 0.0123
    assert main(["trace", "verify", str(trace)]) == 0
    events = read_trace(trace).events
    complete = next(e for e in events if e.kind == "agent.call.complete")
    payload: dict[str, Any] = dict(complete.payload)
    assert payload["meta"]["cache"] == {"read_tokens": 2048, "creation_tokens": 0, "hit": True}
    ref = payload["transcript_ref"]
    assert ref["format"] == "claude-stream-json" and ref["events"] == 3
    lines = (trace.parent / ref["path"]).read_text().splitlines()
    assert json.loads(lines[-1])["total_cost_usd"] == 0.0123
