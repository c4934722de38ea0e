"""Runtime: dispatch, validation, deadlines, sub-events, fallback, trace events, concurrency."""

from __future__ import annotations

import ast
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.base import Agent
from localllm.cli import main
from localllm.config import Config
from localllm.errors import AgentError, CallError, ConfigError, ErrorKind
from localllm.loading import load_config
from localllm.redact import Redactor
from localllm.runtime import Runtime, render_prompt
from localllm.trace import derive_call_id, read_trace
from localllm.wire import AskRequest, AskResponse, Transcript
from tests.unit.agents_fixtures.helpers import McpHttpServer

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


def recording(asked: list[AskRequest]) -> Callable[[AskRequest], dict[str, Any]]:
    """An in-process agent that answers as :func:`good` and keeps every request in ``asked``."""

    def agent(request: AskRequest) -> dict[str, Any]:
        asked.append(request)
        return good(request)

    return agent


def test_call_validates_and_returns(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", good)
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert result.submission == {"verdict": "yes", "score": 0.5}
    assert result.submitted == result.submission
    assert (result.ok, result.exit_code, result.agent) == (True, 0, "agent.local")
    assert result.call_id == derive_call_id("my-app", "1:decide:0")


@pytest.mark.parametrize(
    ("given", "key", "where"),
    [
        ({"args": ["a"]}, "args", None),  # before: a bare ValueError from dict(["a"])
        ({"world": "abc"}, "world", None),
        # before: the trace kept one of the two keys (json.dumps makes 1 "1"), the agent saw both
        ({"args": {1: "a", "1": "b"}}, "args", "$"),
        ({"args": {"item": "x", "n": float("nan")}}, "args", "$.n"),  # before: null in the trace
        ({"args": {"item": {"when": object()}}}, "args", "$.item.when"),
        ({"world": {"user": b"bytes"}}, "world", "$.user"),
        # bytes that are not UTF-8 (a command line's --arg), as Python decodes them: before, the
        # local model's request failed to encode, reported as "cannot start llama-server"
        ({"args": {"item": "x \udcff"}}, "args", "$.item"),
        ({"world": {"\udcfe": "u"}}, "world", "$"),
        ({"prompt": "p \udcff"}, "prompt", None),
        ({"prompt": None}, "prompt", None),  # before: a bare TypeError from the template's regex
        ({"prompt": b"p"}, "prompt", None),
        ({"schema": 5}, "schema", None),  # before: a bare TypeError from Path(5)
        # before: a bare TypeError from json.dumps (sort_keys meeting 1 and "a"; an object()),
        # or an infinity taken into the grammar and the validator
        ({"schema": {"type": "object", "properties": {1: {"type": "string"}, "a": {}}}}, "schema", "$.properties"),
        ({"schema": {"type": "object", "properties": {"a": {"const": object()}}}}, "schema", "$.properties.a.const"),
        ({"schema": {"type": "number", "maximum": float("inf")}}, "schema", "$.maximum"),
        ({"schema": {"enum": [1, ("x", {"b": float("nan")})]}}, "schema", "$.enum[1][1].b"),
    ],
)
def test_call_inputs_that_are_not_json_are_call_errors_before_any_agent(
    config: Config, given: dict[str, Any], key: str, where: str | None
) -> None:
    asked: list[AskRequest] = []
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", recording(asked))
        with pytest.raises(CallError) as info:
            rt.call("decide", **{"agent": "agent.local", "prompt": "p", "schema": SCHEMA, **given})
        if key in ("args", "world"):  # a gate's prompt and schema are its own
            with pytest.raises(CallError) as gated:
                rt.run_gate("judge", **{"args": {"thing": "t"}, "world": {"user": "u"}, **given})
            assert gated.value.key == key
    assert info.value.key == key and asked == []
    if where is not None:
        assert f"not JSON data at {where}:" in str(info.value)


def test_the_python_api_names_a_wrong_type(config: Config, tmp_path: Path) -> None:
    # before: AttributeError / pathlib's TypeError from inside, or (a callable that is not) accepted
    with pytest.raises(TypeError, match="takes the config file's path, got NoneType"):
        load_config(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Runtime takes a Config, got str"):
        Runtime(str(tmp_path / "app.yaml"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trace must be a path or a TraceWriter, got int"):
        Runtime(config, trace=5)  # type: ignore[arg-type]
    with Runtime(config) as rt:
        with pytest.raises(TypeError, match="fn must be callable, got dict"):
            rt.register_inprocess("agent.local", {"verdict": "yes"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="agent must be an Agent, got object"):
            rt.register_agent("agent.local", object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ({"state_path": 5}, "state_path"),  # before: the agent was asked, then the trace refused the events
        ({"state_path": "a\x00b"}, "state_path"),
        ({"state_path": "a\r\nb"}, "state_path"),
        ({"selected_by": ["x"]}, "selected_by"),  # before: a bare TypeError from dict()
    ],
)
def test_a_call_s_state_path_and_selected_by_are_checked_before_any_agent(
    config: Config, tmp_path: Path, given: dict[str, Any], key: str
) -> None:
    asked: list[AskRequest] = []
    with Runtime(config, trace=tmp_path / "t.jsonl") as rt:
        rt.register_inprocess("agent.local", recording(asked))
        with pytest.raises(CallError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA, **given)
    assert info.value.key == key and asked == []
    assert read_trace(tmp_path / "t.jsonl").events == ()


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
def test_an_inprocess_agent_raising_system_exit_is_a_plugin_crash_on_record(
    config: Config, tmp_path: Path, raised: BaseException
) -> None:
    # before: re-raised in the caller (sys.exit() in the agent ended the program) and the call
    # left nothing in the trace
    def agent(_: AskRequest) -> dict[str, Any]:
        raise raised

    with Runtime(config, trace=tmp_path / "t.jsonl") as rt:
        rt.register_inprocess("agent.other", agent)
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.other", prompt="p", schema=SCHEMA)
    assert info.value.kind is ErrorKind.PLUGIN_CRASH and type(raised).__name__ in info.value.detail
    kinds = [e.kind for e in read_trace(tmp_path / "t.jsonl").events]
    assert kinds == ["agent.call.start", "agent.call.error"]


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
    answers = iter(
        [
            AskResponse(submission=None),
            AskResponse(submission="null"),
            AskResponse(submission="{oops"),
            AskResponse.of({"verdict": "maybe", "score": 0.2}),
        ]
    )
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
        result = rt.call("decide", agent="agent.local", prompt="p", schema="schemas/verdict.json")
    assert (result.ok, result.exit_code, result.submission) == (True, 0, {"verdict": "yes", "score": 0.5})


def test_undeclared_alias_is_a_call_error(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(CallError) as info:
        rt.call("ask", agent="agent.typo", prompt="p")
    assert (info.value.key, info.value.value) == ("agent", "agent.typo")
    assert not isinstance(info.value, ConfigError)  # a call-time problem, not the config's


def test_unknown_verb_is_a_call_error(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(CallError) as info:
        rt.call("ponder", agent="agent.local", prompt="p")
    assert (info.value.key, info.value.value) == ("verb", "ponder")
    assert "decide" in info.value.hint


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e300, 0, -1.0, True, "5"])
def test_a_timeout_that_is_no_deadline_is_a_call_error(config: Config, timeout: Any) -> None:
    # inf, nan and 1e300 raised a bare OverflowError / ValueError from timedelta (the soft
    # deadline is a timestamp); 0 and -1 called the agent anyway
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", good)
        with pytest.raises(CallError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA, timeout=timeout)
        assert info.value.key == "timeout"
        assert rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA, timeout=7 * 86_400).ok


def test_a_declared_timeout_past_a_week_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n  agent.local: {plugin: builtin.inprocess, timeout: 1.0e+300}\n"
        "gates:\n  g: {invoke: host.agent.ask, agent: agent.local, timeout: 0, with: {prompt: p}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "app.yaml")
    assert sorted(p.key for p in info.value.problems) == ["agent_plugins.agent.local.timeout", "gates.g.timeout"]


def test_unregistered_inprocess_is_plugin_unsupported(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.PLUGIN_UNSUPPORTED


def test_agent_exception_is_plugin_crash(config: Config) -> None:
    def boom(_: AskRequest) -> None:
        raise RuntimeError("kaput")

    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", boom)
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p")
    assert (info.value.kind, info.value.alias) == (ErrorKind.PLUGIN_CRASH, "agent.local")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value) == "agent: plugin_crash: agent.local: raised RuntimeError: kaput"  # the format under test


@pytest.mark.parametrize(
    "response",
    [
        AskResponse(submission={"verdict": "yes"}),  # type: ignore[arg-type]
        AskResponse(submission=5),  # type: ignore[arg-type]
        AskResponse(submission="{}", sub_events=["x"]),  # type: ignore[list-item]
        AskResponse(submission="{}", meta=["x"]),  # type: ignore[arg-type]
        AskResponse(submission="{}", transcript="t"),  # type: ignore[arg-type]
        AskResponse(submission="{}", episode_id="e", match_idx=True),
    ],
)
@pytest.mark.parametrize("schema", [SCHEMA, None])
def test_misshapen_response_is_plugin_crash(config: Config, response: AskResponse, schema: Any) -> None:
    """Wrong field types from an in-process agent left call() as a bare TypeError/AttributeError/ValueError."""
    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", lambda _: response)
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p", schema=schema)
    assert (info.value.kind, info.value.alias) == (ErrorKind.PLUGIN_CRASH, "agent.local")


def test_render_prompt() -> None:
    assert (
        render_prompt("a {{ args.x }} {{world.u.name}} {{ args.n }}", {"x": "X", "n": [1]}, {"u": {"name": "N"}})
        == "a X N [1]"
    )
    with pytest.raises(CallError) as info:
        render_prompt("{{ args.y }}", {}, {})
    assert (info.value.key, info.value.hint) == ("args.y", "pass --arg y=…")
    with pytest.raises(CallError) as info:
        render_prompt("{{ os.system }}", {}, {}, source="gates.g.with.prompt")
    assert info.value.key == "gates.g.with.prompt"
    with pytest.raises(CallError) as info:
        render_prompt("{{ args.s }}", {"s": {1, 2}}, {})
    assert info.value.key == "args.s"


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
    assert (info.value.kind, info.value.alias) == (ErrorKind.DEADLINE_EXCEEDED, "agent.local")
    assert 0.5 <= elapsed < 1.5  # cut at the hard deadline + at most 1 s


def test_declared_timeout_applies(config: Config) -> None:
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: time.sleep(3))
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.other", prompt="p")
        elapsed = time.monotonic() - started
    assert (info.value.kind, info.value.alias) == (ErrorKind.DEADLINE_EXCEEDED, "agent.other")
    assert 1.0 <= elapsed < 2.5  # agent.other declares timeout: 1


def sub_events_agent(kind: str, call_id: str | None = None) -> Any:
    def answer(request: AskRequest) -> AskResponse:
        event = {
            "kind": kind,
            "call_id": call_id or request.call_id,
            "payload": {"tool": "bash"},
            "ts": "1999-01-01T00:00:00Z",
            "turn": 99,
            "state_path": "elsewhere",
        }
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
    [
        ("agent.other.bash", None, ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION),
        ("agent.local.bash", "0000000000000000", ErrorKind.SUB_EVENT_CALL_ID_MISMATCH),
    ],
)
def test_sub_event_violations_are_atomic(
    config: Config, tmp_path: Path, kind: str, call_id: str | None, error: ErrorKind
) -> None:
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
        return AskResponse(
            submission='{"verdict":"yes","score":95}', transcript=Transcript("openai-chat", lines, [0, 5])
        )

    def claude(request: AskRequest) -> AskResponse:
        calls.append("claude")
        return AskResponse(
            submission='{"verdict":"yes","score":0.95}',
            meta={"cost_usd": 0.01},
            transcript=Transcript("claude-json", ['{"type":"result"}'], [0]),
        )

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
    assert done["substitution"] == {
        "reason": "schema_invalid",
        "original_plugin": "agent.local",
        "fallback_plugin": "agent.claude",
    }
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
    assert (info.value.kind, info.value.alias) == (ErrorKind.SCHEMA_INVALID, "agent.claude")
    assert info.value.original is not None and info.value.original.alias == "agent.local"
    assert info.value.original.detail.startswith("$: required constraint failed")
    error = read_trace(trace).events[-1].payload
    assert error["substitution"]["fallback_plugin"] == "agent.claude"
    assert (error["kind"], error.get("original_meta")) == ("schema_invalid", None)  # the local leg had no meta
    assert error["original_error"].startswith("agent: schema_invalid: agent.local: $: required")


def test_no_fallback_for_non_local_or_transport_errors(config: Config) -> None:
    calls: list[str] = []

    def claude(_: AskRequest) -> dict[str, Any]:
        calls.append("claude")
        return {"verdict": "yes", "score": 1}

    with Runtime(config) as rt:
        rt.register_inprocess("agent.claude", claude)
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
    assert json.loads((tmp_path / done.payload["response_file"]).read_text())["submission"] == {"text": big}
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
    assert request.with_ is not None and request.with_["args"] == {
        "item": "the PR",
        "fixed": 7,
        "thing": "the PR",
        "extra": "e",
    }
    assert request.schema == SCHEMA


def test_unknown_gate(config: Config) -> None:
    with Runtime(config) as rt, pytest.raises(CallError) as info:
        rt.run_gate("nope")
    assert (info.value.key, info.value.value) == ("gates", "nope")


def test_concurrent_calls_are_safe_and_traced(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"

    def slow(_: AskRequest) -> dict[str, Any]:
        time.sleep(0.01)
        return {"verdict": "yes", "score": 1}

    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", slow)
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
    cassette.write_text(
        "kind: host_cassette\nepisodes:\n  - id: ep-01\n    match: {handler: agent.local}\n"
        '    replay: any\n    agent: {verb: decide, response: \'{"verdict": "yes", "score": 1}\'}\n'
    )
    trace = tmp_path / "c.jsonl"
    code = main(
        [
            "call",
            "decide",
            "--config",
            str(config.path),
            "--agent",
            "agent.local",
            "--prompt",
            "hi",
            "--schema",
            str(tmp_path / "schemas" / "verdict.json"),
            "--cassette",
            str(cassette),
            "--trace",
            str(trace),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["submission"] == {"verdict": "yes", "score": 1}
    assert out["call_id"] == "594e8ae04f78354e"  # episode ep-01, match 0, app my-app
    events = read_trace(trace).events
    assert events[0].episode_id == "ep-01" and events[0].match_idx == 0
    assert main(["trace", "verify", str(trace)]) == 0
    # a second run appending to the same trace continues the episode's counter
    capsys.readouterr()
    assert (
        main(
            [
                "call",
                "decide",
                "--config",
                str(config.path),
                "--agent",
                "agent.local",
                "--prompt",
                "hi",
                "--cassette",
                str(cassette),
                "--trace",
                str(trace),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["call_id"] == "edcfdead886d7713"  # ep-01, match 1
    starts = [e for e in read_trace(trace).events if e.kind == "agent.call.start"]
    assert [(e.turn, e.match_idx) for e in starts] == [(1, 0), (2, 1)]


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
        event = {
            "kind": "agent.local.x",
            "call_id": request.call_id,
            "payload": {"out": "a\r\nb\x00c", "nfd": "e\u0301", "bad": float("nan")},
        }
        return AskResponse(
            submission='{"t": "x\\r\\ny"}', meta={"model": "m\x00", "note": "cr\r\nlf"}, sub_events=[event]
        )

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
    answers = iter([{"when": "not a date"}, {"when": "2026-11-29"}, {"code": "x"}, {"code": "a"}, {"code": "ab"}])
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: next(answers))
        schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
        with pytest.raises(AgentError, match=r"\$\.when: format constraint failed"):
            rt.call("extract", agent="agent.other", prompt="p", schema=schema)
        assert rt.call("extract", agent="agent.other", prompt="p", schema=schema).submission == {"when": "2026-11-29"}
        # an ECMA-262 named group (re writes (?P<x>…)) is read as ECMA-262 means it
        ecma = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?<x>a)$"}}}
        with pytest.raises(AgentError, match=r"\$\.code: pattern constraint failed"):
            rt.call("extract", agent="agent.other", prompt="p", schema=ecma)
        assert rt.call("extract", agent="agent.other", prompt="p", schema=ecma).submission == {"code": "a"}
        # a Unicode script property, not answered here: named, not raised from re
        behind = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^\\p{Script=Greek}$"}}}
        with pytest.raises(AgentError) as info:
            rt.call("extract", agent="agent.other", prompt="p", schema=behind)
    assert info.value.kind is ErrorKind.SCHEMA_INVALID and "cannot be checked" in info.value.detail


# -- the last boundary: nothing but a LocalLLMError leaves a call -------------------------


def test_cache_dir_under_a_regular_file_is_a_transport_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(blocker / "cache"))
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, model: gemma-3-270m}\n"
    )
    with Runtime(load_config(tmp_path / "app.yaml")) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="hi")
    error = info.value
    assert (error.kind, error.alias) == (ErrorKind.TRANSPORT_ERROR, "agent.local")
    causes = []
    cause: BaseException | None = error
    while cause is not None:
        causes.append(cause)
        cause = cause.__cause__
    assert any(isinstance(c, NotADirectoryError) for c in causes)
    assert "Traceback" not in str(error)


def test_lone_surrogate_in_mcp_args_is_an_agent_error(config: Config) -> None:
    from localllm.agents.mcp_stdio import McpStdioAgent
    from localllm.config import McpStdioDecl

    decl = McpStdioDecl(alias="agent.local", plugin="mcp_stdio", command=sys.executable, args=("\ud800",))
    with Runtime(config) as rt:
        rt.register_agent("agent.local", McpStdioAgent(decl))
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="hi")
    assert (info.value.kind, info.value.alias) == (ErrorKind.PLUGIN_CRASH, "agent.local")
    assert isinstance(info.value.__cause__, UnicodeEncodeError)
    assert "\ud800" not in str(info.value)  # printable: the surrogate is quoted, not embedded


def test_an_agent_returning_no_askresponse_is_plugin_crash(config: Config) -> None:
    class Broken(Agent):
        plugin = "test"

        def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
            return {"not": "a response"}  # type: ignore[return-value]

    with Runtime(config) as rt:
        rt.register_agent("agent.local", Broken("agent.local"))
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p")
    assert (info.value.kind, info.value.alias) == (ErrorKind.PLUGIN_CRASH, "agent.local")


def test_foreign_exception_classes_map_to_kinds(config: Config) -> None:
    raised: list[BaseException] = [
        PermissionError(13, "denied", "/x"),
        KeyError("k"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ]

    class Raiser(Agent):
        plugin = "test"

        def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
            raise raised.pop(0)

    kinds = []
    with Runtime(config) as rt:
        rt.register_agent("agent.local", Raiser("agent.local"))
        for _ in range(3):
            with pytest.raises(AgentError) as info:
                rt.call("ask", agent="agent.local", prompt="p")
            kinds.append((info.value.kind, type(info.value.__cause__).__name__, bool(info.value.hint)))
    assert kinds == [
        (ErrorKind.TRANSPORT_ERROR, "PermissionError", True),
        (ErrorKind.PLUGIN_CRASH, "KeyError", True),
        (ErrorKind.PLUGIN_CRASH, "UnicodeEncodeError", True),
    ]


# -- non-JSON numbers; a call always ends its trace group -----------------------------------

NAN_AGENT = """
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.write('{"jsonrpc": "2.0", "id": %d, "result": {"submission": {"verdict": "yes", "score": NaN}}}\\n'
                     % req["id"])
    sys.stdout.flush()
"""


@pytest.mark.parametrize("schema", [SCHEMA, None])
def test_subprocess_nan_answer_is_schema_invalid_and_the_group_ends(tmp_path: Path, schema: Any) -> None:
    script = tmp_path / "nan_agent.py"
    script.write_text(NAN_AGENT)
    (tmp_path / "app.yaml").write_text(
        f"agent_plugins:\n  agent.sub: {{plugin: subprocess, command: '{sys.executable}', args: ['{script}']}}\n"
    )
    trace = tmp_path / "t.jsonl"
    with Runtime(load_config(tmp_path / "app.yaml"), trace=trace) as rt:
        if schema is None:
            result = rt.call("ask", agent="agent.sub", prompt="p")
            assert result.submission == '{"verdict": "yes", "score": NaN}'  # not JSON: bound as raw text
        else:
            with pytest.raises(AgentError) as info:
                rt.call("decide", agent="agent.sub", prompt="p", schema=schema)
            assert info.value.kind is ErrorKind.SCHEMA_INVALID
    kinds = [e.kind for e in read_trace(trace).events]
    assert kinds == ["agent.call.start", "agent.call.complete" if schema is None else "agent.call.error"]
    assert main(["trace", "verify", str(trace)]) == 0


def test_an_unwritable_response_still_ends_the_group(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        # a value no trace line and no sidecar can hold (a lone surrogate in a key)
        rt.register_inprocess("agent.local", lambda _: AskResponse(submission='{"\\ud800": 1}'))
        result = rt.call("ask", agent="agent.local", prompt="p")
    assert result.submission == {"\ud800": 1}
    events = read_trace(trace).events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.complete"]
    assert "trace_error" in events[1].payload and "response" not in events[1].payload
    assert main(["trace", "verify", str(trace)]) == 0


# -- fallback: both legs told, the local leg's meta kept -------------------------------------

LOCAL_META = {
    "model": "gemma-3-270m",
    "grammar": True,
    "json_schema": False,
    "prompt_tokens": 40,
    "completion_tokens": 8,
    "finish_reason": "length",
    "max_tokens": 8,
    "timings": {"predicted_ms": 12.5},
}


def test_failed_fallback_names_both_legs_and_the_token_limit(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"

    def cut(_: AskRequest) -> AskResponse:
        return AskResponse(submission='{"verdict": "ye', meta=dict(LOCAL_META))

    def no_claude(_: AskRequest) -> None:
        raise AgentError(ErrorKind.TRANSPORT_ERROR, "claude CLI not found on PATH")

    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.local", cut, local_model=True)
        rt.register_inprocess("agent.claude", no_claude)
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    error = info.value
    assert (error.kind, error.alias) == (ErrorKind.TRANSPORT_ERROR, "agent.claude")
    assert error.original is not None
    assert (error.original.kind, error.original.alias) == (ErrorKind.SCHEMA_INVALID, "agent.local")
    assert "hit max_tokens=8" in error.original.detail
    assert error.original.hint.startswith("hit max_tokens=8; raise max_tokens or bound the schema's strings")
    assert "raise max_tokens" in error.hint  # the CLI prints the hint: the local leg's advice is in it
    text = str(error)  # what the user sees names both legs
    assert "claude CLI not found" in text and "schema_invalid" in text and "max_tokens=8" in text
    end = read_trace(trace).events[-1].payload
    assert end["original_meta"] == LOCAL_META
    assert end["substitution"]["original_plugin"] == "agent.local"


def test_successful_fallback_keeps_the_local_legs_meta(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess(
            "agent.local", lambda _: AskResponse(submission="{}", meta=dict(LOCAL_META)), local_model=True
        )
        rt.register_inprocess(
            "agent.claude", lambda _: AskResponse.of({"verdict": "no", "score": 0}, meta={"model": "claude-x"})
        )
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert (result.agent, result.meta["model"], result.meta["fallback_of"]) == (
        "agent.claude",
        "claude-x",
        "agent.local",
    )
    end = read_trace(trace).events[-1].payload
    assert end["original_meta"] == LOCAL_META
    assert end["meta"]["model"] == "claude-x"
    assert end["model"] == "claude-x"


# -- a trace is a session -------------------------------------------------------------------


def test_reopened_trace_continues_the_session(config: Config, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    big = "y" * 3000
    ids = []
    for run in range(2):
        with Runtime(config, trace=trace) as rt:
            rt.register_inprocess(
                "agent.local",
                lambda r: AskResponse(
                    submission='{"ok": true}', transcript=Transcript("openai-chat", [json.dumps({"p": r.prompt})], [0])
                ),
            )
            assert rt.turn == run + 1
            ids.append(rt.call("ask", agent="agent.local", prompt=big + str(run)).call_id)
    assert ids[0] != ids[1]
    assert ids == [derive_call_id("my-app", "1:ask:0"), derive_call_id("my-app", "2:ask:0")]
    events = read_trace(trace).events
    assert [(e.turn, e.seq) for e in events] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for run, start in enumerate(e for e in events if e.kind == "agent.call.start"):
        assert (tmp_path / start.payload["prompt_file"]).read_text() == big + str(run)
    assert main(["trace", "verify", str(trace)]) == 0


def test_sidecar_files_are_never_overwritten(config: Config, tmp_path: Path) -> None:
    big = "z" * 3000
    files = []
    for name in ("a.jsonl", "b.jsonl"):  # two sessions, one directory: same call_id on turn 1
        with Runtime(config, trace=tmp_path / name) as rt:
            rt.register_inprocess("agent.local", lambda r: {"n": r.prompt[-1]})
            rt.call("ask", agent="agent.local", prompt=big + name[0])
        files.append(read_trace(tmp_path / name).events[0].payload["prompt_file"])
    assert files[0] != files[1]
    assert [(tmp_path / f).read_text()[-1] for f in files] == ["a", "b"]


CASSETTE = (
    "kind: host_cassette\nepisodes:\n  - id: ep-01\n    match: {handler: agent.local}\n    replay: any\n"
    '    agent: {verb: decide, response: \'{"verdict": "yes", "score": 1}\'}\n'
)


def test_replay_any_match_idx_continues_across_runtimes(config: Config, tmp_path: Path) -> None:
    from localllm.agents.cassette import CassetteAgent

    (tmp_path / "c.yaml").write_text(CASSETTE)
    trace = tmp_path / "t.jsonl"
    ids = []
    for _ in range(2):
        with Runtime(config, trace=trace) as rt:
            rt.register_agent("agent.local", CassetteAgent(tmp_path / "c.yaml", alias="agent.local"))
            ids.append(rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA).call_id)
    with Runtime(config, trace=trace) as rt:  # a cassette registered again mid-session counts on too
        for _ in range(2):
            rt.register_agent("agent.local", CassetteAgent(tmp_path / "c.yaml", alias="agent.local"))
            ids.append(rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA).call_id)
    assert ids == [derive_call_id("my-app", f"ep-01:{n}") for n in range(4)]
    starts = [e for e in read_trace(trace).events if e.kind == "agent.call.start"]
    assert [(e.episode_id, e.match_idx) for e in starts] == [("ep-01", n) for n in range(4)]


def test_trace_lock_says_what_to_do_and_can_wait(config: Config, tmp_path: Path) -> None:
    from localllm.errors import TraceLocked
    from localllm.trace import TraceWriter

    trace = tmp_path / "t.jsonl"
    holder = TraceWriter.open(trace)
    with pytest.raises(TraceLocked) as info:
        Runtime(config, trace=trace)
    assert info.value.path == str(trace) and "trace_wait" in info.value.hint
    with pytest.raises(TraceLocked) as info:
        Runtime(config, trace=trace, trace_wait=0.2)
    assert info.value.waited == 0.2
    timer = threading.Timer(0.3, holder.close)
    timer.start()
    started = time.monotonic()
    with Runtime(config, trace=trace, trace_wait=10) as rt:
        assert rt.trace is not None and not rt.trace.closed
    assert 0.25 <= time.monotonic() - started < 5
    timer.join()


# -- secrets: one redaction where errors and trace payloads are built ------------------------

CANARY = "canary-5f1d9e0c-key"


class _EchoAuth(BaseHTTPRequestHandler):
    """An OpenAI-ish endpoint that quotes the Authorization header back in a 401."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"error": f"invalid key: {self.headers.get('authorization')}"}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_secret_canary_never_reaches_errors_or_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mcp_http_server: McpHttpServer
) -> None:
    from tests.unit.agents_fixtures.helpers import JSONRPC_AGENT

    monkeypatch.setenv("CANARY_KEY", CANARY)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoAuth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "app.yaml").write_text(
            "agent_plugins:\n"
            "  agent.local: {plugin: builtin.inprocess}\n"
            f"  agent.sub: {{plugin: subprocess, command: '{sys.executable}', args: ['{JSONRPC_AGENT}'],"
            " env: {TOKEN: '${CANARY_KEY}'}}\n"
            f"  agent.ep: {{plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:{server.server_port}',"
            " api_key_env: CANARY_KEY}\n"
            f"  agent.mcp: {{plugin: mcp_http, endpoint: '{mcp_http_server.base}/fault/echoauth',"
            " headers: {Authorization: 'Bearer ${CANARY_KEY}'}}\n"
        )
        trace = tmp_path / "traces" / "t.jsonl"
        echoes: Iterator[AskResponse | BaseException] = iter(
            [
                AskResponse(
                    submission=json.dumps({"echo": CANARY}),
                    meta={"auth": f"Bearer {CANARY}"},
                    sub_events=[],
                    transcript=Transcript("openai-chat", [json.dumps({"key": CANARY})], [0]),
                ),
                AgentError(ErrorKind.TRANSPORT_ERROR, f"server said: token {CANARY} rejected", hint=f"not {CANARY}"),
                RuntimeError(f"boom {CANARY}"),
            ]
        )

        def leaky(request: AskRequest) -> AskResponse:
            item = next(echoes)
            if isinstance(item, BaseException):
                raise item
            sub = {"kind": "agent.local.tool", "call_id": request.call_id, "payload": {CANARY: CANARY}}
            return AskResponse(item.submission, item.meta, [sub], item.transcript)

        errors: list[AgentError] = []
        with Runtime(load_config(tmp_path / "app.yaml"), trace=trace) as rt:
            rt.register_inprocess("agent.local", leaky)
            result = rt.call("ask", agent="agent.local", prompt=("x" * 2000) + CANARY, args={"k": CANARY})
            assert result.submission == {"echo": CANARY}  # the caller's own answer is untouched
            for alias, prompt in [
                ("agent.local", "p"),
                ("agent.local", "p"),
                ("agent.sub", "leak:TOKEN"),
                ("agent.ep", "p"),
                ("agent.mcp", "p"),
            ]:
                with pytest.raises(AgentError) as info:
                    rt.call("ask", agent=alias, prompt=prompt)
                errors.append(info.value)
    finally:
        server.shutdown()
        server.server_close()
    assert [e.kind for e in errors] == [
        ErrorKind.TRANSPORT_ERROR,
        ErrorKind.PLUGIN_CRASH,
        ErrorKind.PLUGIN_CRASH,
        ErrorKind.TRANSPORT_ERROR,
        ErrorKind.TRANSPORT_ERROR,
    ]
    assert all("***" in errors[i].detail for i in (0, 3, 4))  # the echoed key was there, and was masked
    for error in errors:
        assert CANARY not in str(error) and CANARY not in error.hint, error
    files = [p for p in (tmp_path / "traces").rglob("*") if p.is_file()]
    assert {p.parent.name for p in files} >= {"traces", "agent-prompts", "transcripts"}
    hits = [p for p in files if CANARY.encode() in p.read_bytes()]
    assert hits == []
    assert main(["trace", "verify", str(trace)]) == 0


def test_managed_local_meta_names_the_model_not_its_path(tmp_path: Path, server_bin: Path) -> None:
    model = tmp_path / "weights" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF fake weights")
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, model: '{model}', server_bin: '{server_bin}', max_tokens: 64,"
        " health_timeout: 30}\n"
    )
    with Runtime(load_config(tmp_path / "app.yaml")) as rt:
        meta = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA).meta
    assert meta["model"] == "tiny.gguf"
    assert (meta["max_tokens"], meta["finish_reason"]) == (64, "stop")


def test_ref_to_a_plain_schema_file_uses_the_referring_dialect(config: Config, tmp_path: Path) -> None:
    (tmp_path / "schemas" / "part.json").write_text(json.dumps({"type": "string", "maxLength": 3}))  # no $schema
    (tmp_path / "schemas" / "whole.json").write_text(
        json.dumps({"type": "object", "properties": {"p": {"$ref": "part.json"}}, "required": ["p"]})
    )
    answers = iter([{"p": "abc"}, {"p": "abcd"}])
    with Runtime(config) as rt:
        rt.register_inprocess("agent.other", lambda _: next(answers))
        assert rt.call("extract", agent="agent.other", prompt="p", schema="schemas/whole.json").submission == {
            "p": "abc"
        }
        with pytest.raises(AgentError) as info:
            rt.call("extract", agent="agent.other", prompt="p", schema="schemas/whole.json")
    assert info.value.kind is ErrorKind.SCHEMA_INVALID and info.value.detail.startswith("$.p: maxLength")


@pytest.mark.parametrize("ref", ["my%20part.json", "defs.json#/$defs/a%20part", "defs.json#/$defs/a part"])
def test_a_config_in_a_directory_with_a_space_resolves_its_file_refs(tmp_path: Path, ref: str) -> None:
    # A file URI percent-encodes the space in "My Configs/"; the ref's own %20 is a space too
    # (RFC 3986, and RFC 6901 section 6 for the fragment). Before, the load check refused the
    # %20 fragment and every validation of a cross-file ref in such a directory failed.
    root = tmp_path / "My Configs"
    (root / "schemas").mkdir(parents=True)
    part = {"type": "string", "maxLength": 3}
    (root / "schemas" / "my part.json").write_text(json.dumps(part))
    (root / "schemas" / "defs.json").write_text(json.dumps({"$defs": {"a part": part}}))
    whole = {"type": "object", "properties": {"p": {"$ref": ref}}, "required": ["p"]}
    (root / "schemas" / "whole.json").write_text(json.dumps(whole))
    (root / "app.yaml").write_text(
        "agent_plugins:\n  agent.other: {plugin: builtin.inprocess}\n"
        "gates:\n  g: {invoke: host.agent.extract, agent: agent.other, with: {prompt: p, schema: schemas/whole.json}}\n"
    )
    answers = iter([{"p": "abc"}, {"p": "abcd"}])
    with Runtime(load_config(root / "app.yaml")) as rt:
        rt.register_inprocess("agent.other", lambda _: next(answers))
        assert rt.call("extract", agent="agent.other", prompt="p", schema="schemas/whole.json").submission == {
            "p": "abc"
        }
        with pytest.raises(AgentError) as info:
            rt.call("extract", agent="agent.other", prompt="p", schema="schemas/whole.json")
    assert info.value.kind is ErrorKind.SCHEMA_INVALID and info.value.detail.startswith("$.p: maxLength")


# -- errors are data ---------------------------------------------------------------------------


def test_errors_take_message_hint_and_data_in_the_constructor() -> None:
    from localllm.errors import ConfigProblem, TraceError, UnsupportedPlatform

    assert (TraceError("x", hint="do y").message, TraceError("x", hint="do y").hint) == ("x", "do y")
    assert UnsupportedPlatform("no pin").hint.startswith("use endpoint mode")  # the class default stays
    assert ConfigError([ConfigProblem("f", "k", "m")]).hint  # ConfigError keeps its own constructor
    error = AgentError(ErrorKind.TRANSPORT_ERROR, "refused", alias="agent.x", hint="start it")
    assert (str(error), error.hint, error.alias) == ("agent: transport_error: agent.x: refused", "start it", "agent.x")


def _hand_prefixed(node: ast.AST) -> bool:
    """An f-string that starts with ``{alias}: `` / ``{self.alias}: `` / ``{label}: ``."""
    if not (isinstance(node, ast.JoinedStr) and len(node.values) > 1):
        return False
    head, tail = node.values[0], node.values[1]
    if not (isinstance(head, ast.FormattedValue) and isinstance(tail, ast.Constant)):
        return False
    name = head.value.attr if isinstance(head.value, ast.Attribute) else getattr(head.value, "id", "")
    return name in {"alias", "label"} and str(tail.value).startswith(": ")


def test_the_alias_prefix_is_added_in_one_place() -> None:
    # Every transport passes alias= and AgentError prefixes it; no detail names the agent by hand.
    package = Path(__file__).resolve().parents[2] / "localllm"
    found = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "AgentError"
        and any(_hand_prefixed(arg) for arg in [*node.args, *(k.value for k in node.keywords)])
    ]
    assert found == []
    # ... and hints are given to the constructor, not assigned to an error built earlier
    assigned = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "hint" and isinstance(node.ctx, ast.Store)
        if getattr(node.value, "id", "") != "self"
    ]
    assert assigned == []
    assert str(AgentError("plugin_crash", "boom", alias="agent.x")) == "agent: plugin_crash: agent.x: boom"
    assert str(AgentError("plugin_crash", "boom")) == "agent: plugin_crash: boom"


def test_agent_error_replace_and_redact_keep_class_cause_and_data() -> None:
    from localllm.agents.cassette import ReplayedAgentError

    cause = OSError("disk")
    try:
        try:
            raise cause
        except OSError as exc:
            raise ReplayedAgentError(
                "plugin_crash", "key sk-SECRET-1 leaked", episode_id="ep", match_idx=2, hint="rotate sk-SECRET-1"
            ) from exc
    except ReplayedAgentError as caught:
        error = caught
    clean = error.redacted(Redactor(["sk-SECRET-1"])).replace(alias="agent.r")
    assert type(clean) is ReplayedAgentError and clean.__cause__ is cause
    assert (clean.detail, clean.hint, clean.episode_id, clean.match_idx) == ("key *** leaked", "rotate ***", "ep", 2)
    assert str(clean) == "agent: plugin_crash: agent.r: key *** leaked"


def test_redactor_covers_escaped_forms_and_nested_values() -> None:
    redact = Redactor(['p"w/\u00e9-long', "abc", ""])  # short values are not secrets worth shredding text for
    assert redact('body {"k": "p\\"w/\\u00e9-long"}') == 'body {"k": "***"}'
    assert redact('raw p"w/\u00e9-long and abc') == "raw *** and abc"
    assert redact.value({'p"w/\u00e9-long': ['x p"w/\u00e9-long', 3, None]}) == {"***": ["x ***", 3, None]}
    assert not Redactor([]) and Redactor([]).value({"a": "b"}) == {"a": "b"}


def test_a_call_on_a_closed_runtime_is_a_call_error(config: Config) -> None:
    rt = Runtime(config)
    rt.close()
    with pytest.raises(CallError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.key == "runtime"


@pytest.mark.parametrize("name", ["bad\ud800.json", "nul\x00.json", "missing.json"])
def test_unreadable_schema_paths_are_schema_errors(config: Config, name: str) -> None:
    from localllm.errors import SchemaError

    with Runtime(config) as rt:
        rt.register_inprocess("agent.local", good)
        with pytest.raises(SchemaError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=name)
    str(info.value).encode("utf-8")  # printable as UTF-8: no lone surrogate in the message


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "meta",
    [
        {"n": 2**64},  # the trace's integers are 64-bit
        {"n": -(2**63) - 1},
        {"n": 10**5000},  # past Python's int → str digit limit
        {"x": _deep(150)},  # deeper than the trace's 100 levels
        {"x": _deep(600)},  # deeper than the scrub could recurse
    ],
    ids=["u64", "i64", "digits", "deep150", "deep600"],
)
def test_meta_the_trace_cannot_hold_is_cleaned_and_the_call_still_traced(
    config: Config, tmp_path: Path, meta: dict[str, Any]
) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess(
            "agent.local", lambda _: AskResponse(submission='{"verdict": "yes", "score": 1}', meta=meta)
        )
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert result.ok  # before: trace_write_rejected (or a bare RecursionError) failed a good answer
    kinds = [ev.kind for ev in read_trace(trace).events]
    assert kinds == ["agent.call.start", "agent.call.complete"]  # before: the header alone


def test_redacting_a_cycle_or_a_deep_value_ends() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    redactor = Redactor(["sk-SECRET-1"])
    out = redactor.value({"a": cycle, "b": _deep(900), "c": "key sk-SECRET-1"})  # before: RecursionError
    assert out["c"] == "key ***"
    assert json.dumps(out).count("<nested too deeply to redact>") == 2


def test_the_fallback_runs_within_the_calls_hard_cap(config: Config) -> None:
    """The fallback got a fresh timeout of its own: a 1.5 s call gave its fallback a deadline
    1.5 s after the local leg ended (2.5 s in). Now every leg ends by the call's cap."""
    deadlines: dict[str, float] = {}

    class Slow(Agent):
        plugin = "test"
        is_local_model = True

        def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
            deadlines[self.alias] = deadline
            time.sleep(1.0)
            return AskResponse.of({"verdict": "maybe"})  # not in the enum: the fallback answers

    class Fallback(Agent):
        plugin = "test"

        def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
            deadlines[self.alias] = deadline
            return AskResponse.of({"verdict": "yes", "score": 0.5})

    with Runtime(config) as rt:
        rt.register_agent("agent.local", Slow("agent.local"))
        rt.register_agent("agent.claude", Fallback("agent.claude"))
        started = time.monotonic()
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA, timeout=1.5)
    assert result.agent == "agent.claude"
    assert deadlines["agent.claude"] <= deadlines["agent.local"] + 0.01  # before: ~1 s later
    assert deadlines["agent.local"] - started <= 1.5 + 0.05


def test_a_closed_runtime_builds_no_embedder(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text("embedders:\n  docs: {model: all-minilm-l6-v2}\n")
    rt = Runtime(load_config(tmp_path / "app.yaml"))
    rt.close()
    with pytest.raises(CallError):
        rt.embedder("docs")  # before: built one (its server then started on first embed, owned by nobody)
