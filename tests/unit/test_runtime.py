"""Runtime: dispatch, validation, deadlines, sub-events, fallback, trace events, concurrency."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.config import Config
from localllm.errors import AgentError, ConfigError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime, render_prompt
from localllm.trace import derive_call_id, read_trace
from localllm.wire import AskRequest, AskResponse, Transcript

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"enum": ["yes", "no"]}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["verdict", "score"],
}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "verdict.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "app.yaml").write_text(
        "app_id: my-app\n"
        "agent_plugins:\n"
        "  agent.local: {plugin: builtin.inprocess}\n"
        "  agent.other: {plugin: builtin.inprocess, timeout: 1}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
        "gates:\n"
        "  judge:\n"
        "    invoke: host.agent.decide\n"
        "    agent: agent.local\n"
        "    with:\n"
        "      prompt: 'Judge {{ args.item }} for {{ world.user }}'\n"
        "      schema: schemas/verdict.json\n"
        "      args: {item: '{{ args.thing }}', fixed: 7}\n"
    )
    return load_config(tmp_path / "app.yaml")


def good(_: AskRequest) -> dict[str, Any]:
    return {"verdict": "yes", "score": 0.5}


def test_call_validates_and_returns(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", good)
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert result.submission == {"verdict": "yes", "score": 0.5}
    assert result.submitted == result.submission
    assert (result.ok, result.exit_code, result.agent) == (True, 0, "agent.local")
    assert result.call_id == derive_call_id("my-app", "1:decide:0")


def test_call_ids_are_deterministic_per_state_and_seq(config: Config) -> None:
    ids = []
    for _ in range(2):
        with Runtime(config) as rt:
            rt.register_inprocess("agent.local", good)
            ids.append([rt.call("decide", agent="agent.local", prompt="p").call_id for _ in range(3)])
    assert ids[0] == ids[1]
    assert len(set(ids[0])) == 3


def test_reference_call_id_vectors() -> None:
    assert derive_call_id("bugfix", "phase_1_repro_agent") == "7f65dee5291ba5d4"
    assert derive_call_id("my-app", "ep-01:0") == "594e8ae04f78354e"
    assert derive_call_id("my-app", "ep-01:1") == "edcfdead886d7713"


def test_schema_invalid_details(config: Config) -> None:
    answers = iter([AskResponse(submission=None), AskResponse(submission="null"), AskResponse(submission="{oops"),
                    AskResponse.of({"verdict": "maybe", "score": 0.2})])
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: next(answers))
        details = []
        for _ in range(4):
            with pytest.raises(AgentError) as info:
                rt.call("decide", agent="agent.other", prompt="p", schema=SCHEMA)
            assert info.value.kind is ErrorKind.SCHEMA_INVALID
            details.append(info.value.detail)
    assert details[0] == "no submission: the agent returned nothing"
    assert details[1].startswith("$: submission is JSON null")
    assert details[2].startswith("submission is not valid JSON")
    assert details[3].startswith("$.verdict: enum constraint failed")


def test_no_schema_binds_raw(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", lambda _: AskResponse(submission="plain words"))
        assert rt.call("ask", agent="agent.local", prompt="p").submission == "plain words"


def test_schema_path_relative_to_config(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", good)
        assert rt.call("decide", agent="agent.local", prompt="p", schema="schemas/verdict.json").ok


def test_undeclared_alias_is_config_error(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(ConfigError, match=r'agent "agent\.typo" is not declared'):
        rt.call("ask", agent="agent.typo", prompt="p")


def test_unregistered_inprocess_is_plugin_unsupported(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.PLUGIN_UNSUPPORTED


def test_agent_exception_is_plugin_crash(config: Config) -> None:
    def boom(_: AskRequest) -> None:
        raise RuntimeError("kaput")

    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", boom)
        with pytest.raises(AgentError, match=r"agent: plugin_crash: agent\.local raised RuntimeError: kaput"):
            rt.call("ask", agent="agent.local", prompt="p")


def test_render_prompt() -> None:
    assert render_prompt("a {{ args.x }} {{world.u.name}} {{ args.n }}", {"x": "X", "n": [1]}, {"u": {"name": "N"}}) \
        == "a X N [1]"
    with pytest.raises(ConfigError, match=r"\{\{ args.y \}\} has no value"):
        render_prompt("{{ args.y }}", {}, {})
    with pytest.raises(ConfigError, match="unsupported template"):
        render_prompt("{{ os.system }}", {}, {})


def test_hard_deadline_cuts_hanging_agent(config: Config) -> None:
    release = threading.Event()

    def hang(_: AskRequest) -> dict[str, Any]:
        release.wait(30)
        return {"late": True}

    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", hang)
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p", timeout=0.5)
        elapsed = time.monotonic() - started
    release.set()
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert "late answer is discarded" in info.value.detail
    assert 0.5 <= elapsed < 1.5  # cut at the hard deadline + at most 1 s


def test_declared_timeout_applies(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: time.sleep(3))
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.other", prompt="p")
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert "within 1s" in info.value.detail


def sub_events_agent(kind: str, call_id: str | None = None) -> Any:
    def answer(request: AskRequest) -> AskResponse:
        event = {"kind": kind, "call_id": call_id or request.call_id, "payload": {"tool": "bash"},
                 "ts": "1999-01-01T00:00:00Z", "turn": 99, "state_path": "elsewhere"}
        return AskResponse(submission='{"verdict":"no","score":0}', sub_events=[event])

    return answer


def test_sub_events_land_restamped_with_parent_turn(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", sub_events_agent("agent.local.bash.called"))
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    events = read_trace(trace).events
    assert [e.kind for e in events] == ["agent.call.start", "agent.local.bash.called", "agent.call.complete"]
    sub = events[1]
    assert (sub.turn, sub.state_path, sub.call_id) == (1, "decide", result.call_id)
    assert events[0].ts <= sub.ts <= events[2].ts
    assert sub.payload == {"tool": "bash"}


@pytest.mark.parametrize(
    ("kind", "call_id", "error"),
    [("agent.other.bash", None, ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION),
     ("agent.local.bash", "0000000000000000", ErrorKind.SUB_EVENT_CALL_ID_MISMATCH)],
)
def test_sub_event_violations_are_atomic(config: Config, tmp_path: Path, kind: str, call_id: str | None,
                                         error: ErrorKind) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", sub_events_agent(kind, call_id))
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert info.value.kind is error
    events = read_trace(trace).events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.error"]
    assert events[1].payload["kind"] == error.value
    assert main(["trace", "verify", str(trace)]) == 0


def test_fallback_exactly_once_same_call_id(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    calls: list[str] = []

    def local(request: AskRequest) -> AskResponse:
        calls.append("local")
        lines = ['{"type":"request"}', '{"type":"assistant"}']
        return AskResponse(submission='{"verdict":"yes","score":95}',
                           transcript=Transcript("openai-chat", lines, [0, 5]))

    def claude(request: AskRequest) -> AskResponse:
        calls.append("claude")
        return AskResponse(submission='{"verdict":"yes","score":0.95}', meta={"cost_usd": 0.01},
                           transcript=Transcript("claude-json", ['{"type":"result"}'], [0]))

    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert calls == ["local", "claude"]
    assert result.submission == {"verdict": "yes", "score": 0.95}
    assert result.agent == "agent.claude"
    assert result.meta["fallback_of"] == "agent.local"
    events = read_trace(trace).events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.complete"]
    assert {e.call_id for e in events} == {result.call_id}
    done = events[1].payload
    assert done["substitution"] == {"reason": "schema_invalid", "original_plugin": "agent.local",
                                    "fallback_plugin": "agent.claude"}
    assert done["transcript_ref"]["format"] == "claude-json"
    assert done["original_transcript_ref"]["format"] == "openai-chat"
    assert (tmp_path / done["original_transcript_ref"]["path"]).read_text().count("\n") == 2
    assert main(["trace", "verify", str(trace)]) == 0


def test_fallback_failure_records_substitution(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", lambda _: {"verdict": "maybe"}, local_model=True)
        rt.register_inprocess("agent.claude", lambda _: {"verdict": "perhaps"})
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert info.value.kind is ErrorKind.SCHEMA_INVALID
    error = read_trace(trace).events[-1].payload
    assert error["substitution"]["fallback_plugin"] == "agent.claude"
    assert "original_error" in error


def test_no_fallback_for_non_local_or_transport_errors(config: Config) -> None:
    calls: list[str] = []
    with Runtime(config) as rt:
        rt.register_inprocess("agent.claude", lambda _: calls.append("claude") or {"verdict": "yes", "score": 1})
        rt.register_inprocess("agent.other", lambda _: {"verdict": "maybe"})  # not a local model
        with pytest.raises(AgentError):
            rt.call("decide", agent="agent.other", prompt="p", schema=SCHEMA)

        def down(_: AskRequest) -> None:
            raise AgentError(ErrorKind.TRANSPORT_ERROR, "connection refused")

        rt.register_inprocess("agent.local", down, local_model=True)
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert calls == []


def test_large_prompt_and_response_go_to_sidecar_files(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    big = "x" * 3000
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", lambda _: {"text": big})
        result = rt.call("ask", agent="agent.local", prompt=big)
    start, done = read_trace(trace).events
    assert "prompt" not in start.payload
    assert (tmp_path / start.payload["prompt_file"]).read_text() == big
    assert json.loads((tmp_path / done.payload["response_file"]).read_text()) == {"text": big}
    assert start.payload["prompt_file"] == f"agent-prompts/{result.call_id}.txt"


def test_run_gate_renders_args_and_world(config: Config) -> None:
    seen: list[AskRequest] = []

    def capture(request: AskRequest) -> dict[str, Any]:
        seen.append(request)
        return {"verdict": "no", "score": 0}

    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", capture)
        result = rt.run_gate("judge", {"thing": "the PR", "extra": "e"}, world={"user": "ana"})
    assert result.submission == {"verdict": "no", "score": 0}
    request = seen[0]
    assert request.prompt == "Judge the PR for ana"
    assert request.state_path == "judge"
    assert request.with_ is not None and request.with_["args"] == {"item": "the PR", "fixed": 7, "thing": "the PR",
                                                                   "extra": "e"}
    assert request.schema == SCHEMA


def test_unknown_gate(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(ConfigError, match='no gate named "nope"'):
        rt.run_gate("nope")


def test_concurrent_calls_are_safe_and_traced(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", lambda _: (time.sleep(0.01), {"verdict": "yes", "score": 1})[1])
        results: list[str] = []
        lock = threading.Lock()

        def worker() -> None:
            for _ in range(5):
                r = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
                with lock:
                    results.append(r.call_id)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(set(results)) == 40
    events = read_trace(trace).events
    assert len(events) == 80
    assert [e.seq for e in events] == list(range(80))
    for start, done in zip(events[::2], events[1::2], strict=True):  # each call's events are contiguous
        assert (start.kind, done.kind, start.call_id) == ("agent.call.start", "agent.call.complete", done.call_id)


def test_cli_call_and_trace_verify(config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cassette = tmp_path / "c.yaml"
    cassette.write_text("kind: host_cassette\nepisodes:\n  - id: ep-01\n    match: {handler: agent.local}\n"
                        "    replay: any\n    agent: {verb: decide, response: '{\"verdict\": \"yes\", \"score\": 1}'}\n")
    trace = tmp_path / "c.jsonl"
    code = main(["call", "decide", "--config", str(config.path), "--agent", "agent.local", "--prompt", "hi",
                 "--schema", str(tmp_path / "schemas" / "verdict.json"), "--cassette", str(cassette),
                 "--trace", str(trace), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["submission"] == {"verdict": "yes", "score": 1}
    assert out["call_id"] == "594e8ae04f78354e"  # episode ep-01, match 0, app my-app
    events = read_trace(trace).events
    assert events[0].episode_id == "ep-01" and events[0].match_idx == 0
    assert main(["trace", "verify", str(trace)]) == 0


def test_cli_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good_cfg = tmp_path / "ok.yaml"
    good_cfg.write_text("agent_plugins:\n  agent.x: {plugin: builtin.inprocess}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent_plugins:\n  agent.x: {plugin: subprocess}\n  y: {plugin: mcp_http}\n")
    assert main(["check", str(good_cfg)]) == 0
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s) in config" in err
    assert "agent_plugins.agent.x: subprocess plugin requires command:" in err
    assert "Traceback" not in err


def test_hostile_plugin_text_never_breaks_the_trace(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"

    def nasty(request: AskRequest) -> AskResponse:
        event = {"kind": "agent.local.x", "call_id": request.call_id,
                 "payload": {"out": "a\r\nb\x00c", "nfd": "e\u0301", "bad": float("nan")}}
        return AskResponse(submission='{"t": "x\\r\\ny"}', meta={"model": "m\x00", "note": "cr\r\nlf"},
                           sub_events=[event])

    def crash(_: AskRequest) -> None:
        raise AgentError(ErrorKind.PLUGIN_CRASH, "stderr:\r\nboom\x00")

    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", nasty)
        assert rt.call("ask", agent="agent.local", prompt="p\r\n", args={"k": "v\r\n"}).submission == {"t": "x\r\ny"}
        rt.register_inprocess("agent.local", crash)
        with pytest.raises(AgentError):
            rt.call("ask", agent="agent.local", prompt="p")
    kinds = [e.kind for e in read_trace(trace).events]
    assert kinds == ["agent.call.start", "agent.local.x", "agent.call.complete", "agent.call.start", "agent.call.error"]
    sub = read_trace(trace).events[1].payload
    assert sub == {"out": "a\nb\ufffdc", "nfd": "\u00e9", "bad": None}
    assert main(["trace", "verify", str(trace)]) == 0


def test_formats_are_asserted_and_ecma_patterns_do_not_crash(config: Config) -> None:
    answers = iter([{"when": "not a date"}, {"when": "2026-11-29"}, {"code": "x"}])
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: next(answers))
        schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
        with pytest.raises(AgentError, match=r"\$\.when: format constraint failed"):
            rt.call("extract", agent="agent.other", prompt="p", schema=schema)
        assert rt.call("extract", agent="agent.other", prompt="p", schema=schema).submission == {"when": "2026-11-29"}
        ecma = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?<x>a)$"}}}
        with pytest.raises(AgentError) as info:
            rt.call("extract", agent="agent.other", prompt="p", schema=ecma)
    assert info.value.kind is ErrorKind.SCHEMA_INVALID and "cannot be checked" in info.value.detail
