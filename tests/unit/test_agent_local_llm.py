"""builtin.local_llm against the fake llama-server process: managed and endpoint modes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm import _http
from localllm.agents.local_llm import LocalLLMAgent, normalize_endpoint, shape_statement, strip_fence
from localllm.config import Config, LocalLLMDecl
from localllm.errors import AgentError, ConfigError, ErrorKind, FetchError
from localllm.grammar import compile_schema
from localllm.grammar.walk import Grammar
from localllm.loading import load_config
from localllm.managed.server import CANARY_BODY
from localllm.runtime import Runtime
from localllm.trace import read_trace
from localllm.wire import AskRequest
from tests.unit.fakes.slow_model import MODEL_ID, SlowModel, slow_model

FAKE = Path(__file__).resolve().parent / "fakes" / "fake_llama_server.py"
DECIDE = {
    "type": "object",
    "properties": {"route": {"enum": ["billing", "support"]}, "confidence": {"type": "number"}},
    "required": ["route", "confidence"],
}
UNIQUE = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["tags"],
}
#: unique strings beside unevaluatedProperties: no exact grammar, none of llama.cpp's, and no
#: relaxed one (which keys count as evaluated would change with a keyword dropped)
UNRELAXED = {**UNIQUE, "unevaluatedProperties": False}


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    paths = {"spawn": tmp_path / "spawn.jsonl", "requests": tmp_path / "requests.jsonl"}
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(paths["spawn"]))
    monkeypatch.setenv("FAKE_LLAMA_REQUEST_LOG", str(paths["requests"]))
    return paths


def rows(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if event is None or r.get("event") == event]


def chat_requests(path: Path, *, canary: bool = False) -> list[dict[str, Any]]:
    """The chat requests the fake saw; the server's start-up grammar canary only if asked."""
    found = [r for r in rows(path) if r.get("path", "").endswith("/chat/completions")]
    return [r for r in found if (r["body"] == CANARY_BODY) == canary]


def managed_config(tmp_path: Path, server_bin: Path, extra: str = "") -> Config:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF fake weights")
    (tmp_path / "app.yaml").write_text(
        "app_id: t\nagent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, model: '{model}', server_bin: '{server_bin}', "
        f"parallel: 2, ctx_size: 512, health_timeout: 30{extra}}}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
    )
    return load_config(tmp_path / "app.yaml")


def test_helpers() -> None:
    assert normalize_endpoint("http://h:1") == "http://h:1/v1"
    assert normalize_endpoint("http://h:1/v1/") == "http://h:1/v1"
    assert strip_fence('```json\n{"a": 1}\n```') == '{"a": 1}'
    assert strip_fence("```\n[1]\n```") == "[1]"
    assert strip_fence(' {"a": 1} ') == '{"a": 1}'
    assert shape_statement({"type": "object"}).endswith('{"type":"object"}\n\n')


def test_nothing_spawned_before_first_call(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    config = managed_config(tmp_path, server_bin)
    with Runtime(config) as rt:
        rt.agent("agent.local")
        assert rows(logs["spawn"]) == []


def test_managed_decide_with_grammar(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    config = managed_config(tmp_path, server_bin)
    trace = tmp_path / "trace.jsonl"
    with Runtime(config, trace=trace) as rt:
        result = rt.call("decide", agent="agent.local", prompt="Route: my invoice is wrong", schema=DECIDE)
        pid = rows(logs["spawn"], "start")[0]["pid"]
    assert result.submission == {"route": "billing", "confidence": 0}
    assert result.meta["grammar"] is True and result.meta["grammar_source"] == "compiled"
    assert result.meta["json_schema"] is False
    assert result.meta["prompt_tokens"] > 0 and "timings" in result.meta
    start = rows(logs["spawn"], "start")
    assert len(start) == 1
    argv = start[0]["argv"]
    assert argv[argv.index("--parallel") + 1] == "2" and argv[argv.index("-c") + 1] == "1024"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    body = chat_requests(logs["requests"])[0]["body"]
    assert body["grammar"] == compile_schema(DECIDE, open_objects=False).grammar and "response_format" not in body
    assert body["temperature"] == 0.0 and body["max_tokens"] == 512
    # the static shape statement first, the varying prompt last (prefix-cache friendly)
    assert body["messages"] == [{"role": "user", "content": shape_statement(DECIDE) + "Route: my invoice is wrong"}]
    assert (result.meta["cache_n"], result.meta["prompt_n"]) == (0, result.meta["timings"]["prompt_n"])
    # stopped on close: SIGTERM, clean exit
    assert any(r["pid"] == pid and r["code"] == 0 for r in rows(logs["spawn"], "exit"))
    done = read_trace(trace).events[-1]
    ref = done.payload["transcript_ref"]
    assert ref["format"] == "openai-chat" and ref["events"] == 3
    lines = (tmp_path / ref["path"]).read_text().splitlines()
    assert json.loads(lines[0])["type"] == "request" and json.loads(lines[2])["usage"]["output_tokens"] >= 1
    assert (tmp_path / ref["path"]).with_suffix(".timings").read_text().splitlines()[0] == "0 0"


def test_the_health_poller_and_the_agent_share_one_tls_context(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CA bundle takes ~25 ms to load: built once per process (while the model loads, by the
    health poller), never again by the agent's client on the way to the first answer."""
    built: list[dict[str, Any]] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    _http.tls_context.cache_clear()
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        result = rt.call("decide", agent="agent.local", prompt="Route: my invoice is wrong", schema=DECIDE)
    assert result.submission == {"route": "billing", "confidence": 0}
    assert len(built) == 1


def test_schema_in_prompt_can_be_disabled(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    config = managed_config(tmp_path, server_bin, ", schema_in_prompt: false, temperature: 0.7, max_tokens: 64")
    with Runtime(config) as rt:
        rt.call("decide", agent="agent.local", prompt="Route it", schema=DECIDE)
    body = chat_requests(logs["requests"])[0]["body"]
    assert body["messages"][0]["content"] == "Route it"
    assert (body["temperature"], body["max_tokens"]) == (0.7, 64)


def test_out_of_subset_schema_is_sent_unconstrained_and_falls_back(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", "not json at all")
    config = managed_config(tmp_path, server_bin)
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.claude", lambda _: {"tags": ["a"]})
        result = rt.call("extract", agent="agent.local", prompt="tags?", schema=UNRELAXED)
    body = chat_requests(logs["requests"])[0]["body"]
    assert "response_format" not in body and "grammar" not in body
    assert result.agent == "agent.claude" and result.meta["fallback_of"] == "agent.local"
    done = read_trace(trace).events[-1].payload
    assert done["original_transcript_ref"]["format"] == "openai-chat"


def test_each_start_runs_one_grammar_canary_and_meta_reports_it(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        first = rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
        second = rt.call("decide", agent="agent.local", prompt="q", schema=DECIDE)
        free = rt.call("ask", agent="agent.local", prompt="hello")
    canaries = chat_requests(logs["requests"], canary=True)
    assert len(canaries) == 1 and len(chat_requests(logs["requests"])) == 3
    assert first.meta["grammar_enforced"] is True and second.meta["grammar_enforced"] is True
    assert "grammar_enforced" not in free.meta  # nothing was constrained


def test_a_server_that_ignores_grammars_is_marked(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"route": "billing", "confidence": 0.5}')  # grammar ignored
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        result = rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
    assert result.agent == "agent.local" and result.meta["grammar_source"] == "compiled"
    assert result.meta["grammar_enforced"] is False  # the canary was not answered "}{": marked
    assert result.meta["grammar"] is False  # §9: a fail-open server did not apply the constraint


@pytest.mark.parametrize("reproducible", [False, True])
def test_reproducible_evaluates_whole_prompts_one_call_at_a_time(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, reproducible: bool
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "0.3")
    monkeypatch.setenv("FAKE_LLAMA_MODE", "slow")
    config = managed_config(tmp_path, server_bin, f", reproducible: {str(reproducible).lower()}")
    with Runtime(config) as rt:
        agent = rt.agent("agent.local")
        assert isinstance(agent, LocalLLMAgent)
        agent.base_url()  # started (and its canary answered) before the race

        def one(i: int) -> None:
            rt.call("decide", agent="agent.local", prompt=f"ticket {i}", schema=DECIDE)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    sent = chat_requests(logs["requests"])
    assert len(sent) == 3
    assert all(
        ("cache_prompt" in r["body"], r["body"].get("seed")) == (reproducible, 0 if reproducible else None)
        for r in sent
    )
    # only the reproducible agent never has two of its calls in flight at once
    assert (max(r["inflight"] for r in sent) == 1) is reproducible


def test_compact_false_lets_the_compiled_grammar_take_one_space(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    with Runtime(managed_config(tmp_path, server_bin, ", compact: false")) as rt:
        rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
    (sent,) = chat_requests(logs["requests"])
    closed = compile_schema(DECIDE, open_objects=False).grammar
    assert sent["body"]["grammar"] == compile_schema(DECIDE, space=True, open_objects=False).grammar != closed


def test_open_objects_lets_the_compiled_grammar_take_undeclared_keys(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    with Runtime(managed_config(tmp_path, server_bin, ", open_objects: true")) as rt:
        rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
    (sent,) = chat_requests(logs["requests"])
    grammar = Grammar.parse(sent["body"]["grammar"])
    assert grammar.matches('{"route":"billing","confidence":0.5,"why":"x"}')
    assert not Grammar.parse(compile_schema(DECIDE, open_objects=False).grammar or "").matches(
        '{"route":"billing","confidence":0.5,"why":"x"}'
    )


def test_json_schema_wins_over_grammar(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    config = managed_config(tmp_path, server_bin, ", json_schema: true")
    with Runtime(config) as rt:
        result = rt.call("extract", agent="agent.local", prompt="tags?", schema=UNIQUE)
    assert result.meta["json_schema"] is True and result.meta["grammar"] is False
    assert result.meta["structured_output"] == "json_schema"
    assert chat_requests(logs["requests"])[0]["body"]["response_format"]["json_schema"]["schema"] == UNIQUE


def test_fenced_answer_is_stripped(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '```json\n{"route": "support", "confidence": 0.9}\n```')
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        assert rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE).submission["route"] == "support"


def test_http_error_is_transport_error_with_status_and_body(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    behaviour = tmp_path / "b.json"
    behaviour.write_text(json.dumps({"responses": [{"status": 500, "message": "kv cache full"}]}))
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(behaviour))
    calls: list[int] = []
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        rt.register_inprocess("agent.claude", lambda _: calls.append(1))
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "HTTP 500" in info.value.detail and "kv cache full" in info.value.detail
    assert calls == []  # never a fallback for transport errors


def test_output_the_server_refuses_under_its_grammar_is_schema_invalid_and_falls_back(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server's own check of a constrained answer: a 500 that is about the answer, not the transport
    behaviour = tmp_path / "b.json"
    behaviour.write_text(
        json.dumps(
            {
                "responses": [
                    {
                        "status": 500,
                        "message": "The model produced output that does not match the expected peg-native format",
                    }
                ]
            }
        )
    )
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(behaviour))
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        rt.register_inprocess("agent.claude", lambda _: {"route": "support", "confidence": 0.5})
        result = rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE)
    assert result.agent == "agent.claude" and result.meta["fallback_of"] == "agent.local"


@pytest.mark.slow
def test_slow_server_hits_deadline(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "5")
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        rt.call("ask", agent="agent.local", prompt="warm up", timeout=30)  # start-up outside the deadline
        monkeypatch.setenv("FAKE_LLAMA_DELAY", "5")
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p", timeout=1)
        assert time.monotonic() - started < 2.5
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED


def test_crashed_sidecar_is_respawned(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        assert rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE).ok
        first = rows(logs["spawn"], "start")[0]["pid"]
        os.kill(first, signal.SIGKILL)
        time.sleep(0.2)
        assert rt.call("decide", agent="agent.local", prompt="p", schema=DECIDE).ok
        starts = rows(logs["spawn"], "start")
    assert len(starts) == 2 and starts[1]["pid"] != first


def test_server_that_fails_to_start_is_transport_error(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "exit_during_start")
    with Runtime(managed_config(tmp_path, server_bin)) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "cannot start llama-server" in info.value.detail and "code 1" in info.value.detail


@pytest.fixture
def keyed_server(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> Iterator[str]:
    """A fake llama-server started by hand with --api-key (endpoint mode attaches to it)."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    proc = subprocess.Popen(
        [str(server_bin), "-m", str(model), "--port", "0", "--host", "127.0.0.1", "--api-key", "sekret-123"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    port = None
    deadline = time.monotonic() + 20
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "listening on http://127.0.0.1:" in line:
            port = int(line.rsplit(":", 1)[1].split()[0])
    assert port is not None
    yield f"http://127.0.0.1:{port}/"
    proc.terminate()
    proc.wait(10)
    proc.stderr.close()


def endpoint_config(tmp_path: Path, url: str) -> Config:
    (tmp_path / "ep.yaml").write_text(
        f"agent_plugins:\n  agent.glm: {{plugin: builtin.local_llm, endpoint: '{url}', api_key_env: GLM_KEY, "
        "model: glm-test}\n"
    )
    return load_config(tmp_path / "ep.yaml")


def test_endpoint_with_bearer_key(
    tmp_path: Path,
    keyed_server: str,
    logs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GLM_KEY", "sekret-123")
    trace = tmp_path / "t.jsonl"
    with Runtime(endpoint_config(tmp_path, keyed_server), trace=trace) as rt:
        result = rt.call("decide", agent="agent.glm", prompt="p", schema=DECIDE)
    assert result.submission["route"] == "billing"
    request = chat_requests(logs["requests"])[0]
    assert request["status"] == 200 and request["body"]["model"] == "glm-test"
    assert "sekret-123" not in trace.read_text()
    written = [trace, *(p for p in (tmp_path / "transcripts").iterdir() if p.is_file())]
    assert len(written) == 3 and all("sekret-123" not in p.read_text() for p in written)


def test_endpoint_wrong_key_is_transport_error(
    tmp_path: Path, keyed_server: str, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLM_KEY", "wrong")
    with Runtime(endpoint_config(tmp_path, keyed_server)) as rt, pytest.raises(AgentError) as info:
        rt.call("decide", agent="agent.glm", prompt="p", schema=DECIDE)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "HTTP 401" in info.value.detail
    assert "wrong" not in info.value.detail


def test_endpoint_unset_key_makes_no_request(tmp_path: Path, keyed_server: str, logs: dict[str, Path]) -> None:
    with Runtime(endpoint_config(tmp_path, keyed_server)) as rt, pytest.raises(AgentError) as info:
        rt.call("decide", agent="agent.glm", prompt="p", schema=DECIDE)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "api_key_env GLM_KEY is not set" in info.value.detail
    assert chat_requests(logs["requests"]) == []


def test_schema_the_compiler_refuses_falls_back_to_the_server_converter(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    # a decimal step with no bounds whose digits (75) are past MAX_STEP: no grammar of ours,
    # but llama.cpp's converter is in its subset for it (a warning only), so response_format
    # is sent.
    schema = {"type": "number", "multipleOf": 0.75}
    assert not compile_schema(schema).exact
    config = managed_config(tmp_path, server_bin)
    with Runtime(config) as rt:
        result = rt.call("ask", agent="agent.local", prompt="p", schema=schema)
    body = chat_requests(logs["requests"])[0]["body"]
    assert result.meta["grammar"] is True and result.meta["grammar_source"] == "server" and "grammar" not in body
    assert body["response_format"]["json_schema"]["schema"] == schema


TAGGED = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["tags", "n"],
}


def test_schema_neither_the_compiler_nor_the_converter_enforces_gets_the_relaxed_grammar(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    # unique strings: no exact grammar, and llama.cpp's converter drops uniqueItems (not in
    # its subset): before, nothing constrained the answer at all
    from localllm.grammar import check_subset
    from localllm.grammar.relax import relax

    assert not compile_schema(TAGGED).exact and any(v.severity == "error" for v in check_subset(TAGGED))
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        result = rt.call("ask", agent="agent.local", prompt="p", schema=TAGGED)
        decl = rt.agent("agent.local").decl  # type: ignore[attr-defined]
    body = chat_requests(logs["requests"])[0]["body"]
    relaxed = relax(TAGGED, space=not decl.compact, open_objects=decl.open_objects)
    assert relaxed is not None and body["grammar"] == relaxed.compiled.grammar and "response_format" not in body
    assert result.meta["grammar"] is True and result.meta["grammar_source"] == "relaxed"
    assert result.meta["grammar_relaxed"] == ["$.properties.tags uniqueItems"]
    assert result.agent == "agent.local" and set(result.submission) == {"tags", "n"}  # the grammar's first walk


def test_grammar_server_mode_never_relaxes(tmp_path: Path, server_bin: Path) -> None:
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        agent = rt.agent("agent.local")
        agent.decl = dataclasses.replace(agent.decl, grammar="server")  # type: ignore[attr-defined]
        fields, source, _ = agent.constraint(TAGGED)  # type: ignore[attr-defined]
    assert (fields, source) == ({}, "none")


def test_schemas_in_another_key_order_get_their_own_grammar(tmp_path: Path, server_bin: Path) -> None:
    # the grammar was kept by the schema's JSON with its keys sorted: a verb asking for its
    # "reason" first got the grammar of the schema asked before, in that one's order (past
    # ANY_ORDER properties the grammar generates them in the declared order)
    from localllm.grammar.compile import ANY_ORDER
    from localllm.grammar.walk import Grammar

    names = ["reason", *(f"p{i}" for i in range(ANY_ORDER)), "answer"]
    orders = [names[::-1], names]  # the answer first, then the reason first
    schemas = [
        {"type": "object", "properties": {n: {"type": "boolean"} for n in order}, "required": sorted(names)}
        for order in orders
    ]
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        agent = rt.agent("agent.local")
        grammars = [Grammar.parse(agent.constraint(s)[0]["grammar"]) for s in schemas]  # type: ignore[attr-defined]
    answers = ["{" + ",".join(f'"{n}":true' for n in order) + "}" for order in orders]
    assert [g.matches(a) for g in grammars for a in answers] == [True, False, False, True]


def test_grammar_server_mode_uses_the_converter(tmp_path: Path, server_bin: Path) -> None:
    config = managed_config(tmp_path, server_bin)
    with Runtime(config) as rt:
        agent = rt.agent("agent.local")
        agent.decl = dataclasses.replace(agent.decl, grammar="server")  # type: ignore[attr-defined]
        request = AskRequest(
            session_id="s",
            turn=1,
            state_path="x",
            verb="decide",
            prompt="p",
            call_id="c",
            deadline="2030-01-01T00:00:00.000000000Z",
            schema=DECIDE,
        )
        body, grammar, _, _ = agent.build_body(request)  # type: ignore[attr-defined]
    assert grammar == "server" and "grammar" not in body and body["response_format"]["type"] == "json_schema"


def test_endpoint_unreachable(tmp_path: Path) -> None:
    (tmp_path / "ep.yaml").write_text(
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9'}\n"
    )
    with Runtime(load_config(tmp_path / "ep.yaml")) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.x", prompt="p")
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "ConnectError" in info.value.detail


def test_build_body_request_shape(tmp_path: Path, server_bin: Path) -> None:
    config = managed_config(tmp_path, server_bin)
    with Runtime(config) as rt:
        agent = rt.agent("agent.local")
        request = AskRequest(
            session_id="s",
            turn=1,
            state_path="x",
            verb="ask",
            prompt="p",
            call_id="c",
            deadline="2030-01-01T00:00:00.000000000Z",
        )
        body, grammar, native, _ = agent.build_body(request)  # type: ignore[attr-defined]
    assert "response_format" not in body and "temperature" not in body
    assert (grammar, native) == ("none", False)


def test_call_that_hits_a_dying_server_gets_its_exit_and_stderr(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash_after_ready")
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AFTER", "1.0")
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "3")  # the answer would come after the crash
    with Runtime(managed_config(tmp_path, server_bin)) as rt:
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.local", prompt="p", timeout=20)
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR
        assert "llama-server died" in info.value.detail and "respawned on the next call" in info.value.detail


def test_missing_model_file_is_a_clear_transport_error(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    (tmp_path / "m.yaml").write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, model: models/none.gguf, server_bin: '{server_bin}'}}\n"
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "none.gguf").write_bytes(b"")
    config = load_config(tmp_path / "m.yaml")  # checked at load (tests/unit/test_config.py), gone by the call
    (tmp_path / "models" / "none.gguf").unlink()
    with Runtime(config) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert f"model file {tmp_path / 'models' / 'none.gguf'} not found" in info.value.detail
    assert rows(logs["spawn"]) == []


def _pinned_config(tmp_path: Path, server_bin: Path, model: str) -> Config:
    (tmp_path / "pinned.yaml").write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, model: {model}, server_bin: '{server_bin}'}}\n"
    )
    return load_config(tmp_path / "pinned.yaml")


def test_runtime_close_during_a_first_use_download_returns_within_a_second(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Path(os.environ["LOCALLLM_CACHE_DIR"])
    with slow_model(monkeypatch, size=1 << 20) as slow:  # 4 KiB/s: minutes to finish
        rt = Runtime(_pinned_config(tmp_path, server_bin, MODEL_ID))
        errors: list[BaseException] = []

        def call() -> None:
            try:
                rt.call("ask", agent="agent.local", prompt="p", timeout=120)
            except BaseException as exc:  # asserted below
                errors.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        slow.wait_for_partial(cache)
        started = time.monotonic()
        rt.close()
        elapsed = time.monotonic() - started
        caller.join(5)
    assert elapsed < 1.0
    assert not caller.is_alive() and len(errors) == 1
    assert isinstance(errors[0], AgentError) and errors[0].kind is ErrorKind.TRANSPORT_ERROR
    assert SlowModel.partial_files(cache) == []
    assert rows(logs["spawn"]) == []  # nothing was started after the cancel


def test_cache_dir_under_a_regular_file_is_a_clear_transport_error(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(blocker / "cache"))
    with Runtime(_pinned_config(tmp_path, server_bin, "gemma-3-270m")) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    cause = info.value.__cause__
    assert isinstance(cause, FetchError) and isinstance(cause.__cause__, NotADirectoryError)
    assert f"{blocker} is a regular file" in info.value.detail and "LOCALLLM_CACHE_DIR" in cause.hint
    assert rows(logs["spawn"]) == []


def test_extra_args_that_set_a_managed_flag_are_a_transport_error_not_a_value_error(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    with pytest.raises(ConfigError) as refused:  # the loader refuses it (a80b50e) ...
        managed_config(tmp_path, server_bin, ", extra_args: ['--port', '8080']")
    assert [p.key for p in refused.value.problems] == ["agent_plugins.agent.local.extra_args[0]"]
    # ... and a declaration built in Python, which no loader checked, fails its call clearly
    config = managed_config(tmp_path, server_bin)
    local = config.agents["agent.local"]
    assert isinstance(local, LocalLLMDecl)
    decl = dataclasses.replace(local, extra_args=("--port", "8080"))
    config = dataclasses.replace(config, agents={**config.agents, "agent.local": decl})
    with Runtime(config) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.local", prompt="p")
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and isinstance(info.value.__cause__, ValueError)
    assert "--port" in info.value.detail and rows(logs["spawn"]) == []


def test_a_prompt_past_the_own_servers_context_is_refused_before_it_is_asked(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    # llama.cpp splits a prompt at each special token, walking its list of pieces from the head
    # each time: 80 KB of "a\n" held the pinned server 13 s before its "exceeds the context" 400
    from tests.unit.test_service_pieces import vocab_gguf

    config = managed_config(tmp_path, server_bin)
    vocab_gguf(tmp_path / "tiny.gguf")  # the fake serves its -m file: a vocabulary with "\n" special
    with Runtime(config) as rt:
        fits = rt.call("ask", agent="agent.local", prompt="a\n" * 200, timeout=30)
        # a prompt within QUICK_BYTES is not counted: no /props, no vocabulary read
        assert [r["path"] for r in rows(logs["requests"]) if r["path"] == "/props"] == []
        with pytest.raises(AgentError) as caught:
            rt.call("ask", agent="agent.local", prompt="a\n" * 5000, timeout=30)  # past QUICK_BYTES
    assert fits.submission
    meta = caught.value.meta or {}
    assert caught.value.kind == "transport_error" and meta["context"] == 512
    assert meta["prompt_tokens_at_least"] > 512
    assert len(chat_requests(logs["requests"])) == 1  # the refused prompt never reached the server
    assert [r["path"] for r in rows(logs["requests"]) if r["path"] == "/props"] == ["/props"]  # asked once
