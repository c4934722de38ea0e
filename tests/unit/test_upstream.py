"""The one upstream seam (``localllm.managed.upstream``): one URL rule, one failure and retry
rule for the chat agent and the embedder, and thread-safe resolution.

The crash tests run the fake llama-server as a real process that dies with the request
unanswered (``FAKE_LLAMA_CRASH_MID_CALL``): the chat agent and the embedder must behave the
same — retried once on a respawned server, and failing after exactly one retry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.agents.local_llm import LocalLLMAgent
from localllm.config import EmbedderDecl, LocalLLMDecl
from localllm.embed.local import LocalEmbedder, embedder_from_decl, embedding_spec
from localllm.errors import AgentError, EmbedServerError, ErrorKind
from localllm.managed.spec import ServerSpec
from localllm.managed.upstream import Route, Target, Upstream, broken_connection, openai_base, server_root
from localllm.wire import AskRequest


def rows(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if event is None or r.get("event") == event]


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    paths = {"spawn": tmp_path / "spawn.jsonl", "requests": tmp_path / "requests.jsonl"}
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(paths["spawn"]))
    monkeypatch.setenv("FAKE_LLAMA_REQUEST_LOG", str(paths["requests"]))
    return paths


def _request() -> AskRequest:
    return AskRequest(session_id="s", turn=1, state_path="x", verb="ask", prompt="hi", call_id="c1", deadline="")


# -- the URL rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("declared", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/", "http://h:1//"])
def test_one_url_rule_for_chat_and_embeddings(declared: str) -> None:
    assert server_root(declared) == "http://h:1" and openai_base(declared) == "http://h:1/v1"
    agent = LocalLLMAgent(LocalLLMDecl(alias="agent.x", plugin="builtin.local_llm", endpoint=declared))
    embedder = LocalEmbedder(declared, "all-minilm-l6-v2")
    try:
        assert agent.base_url() == "http://h:1/v1"
        chat, embed = agent.upstream.prepare(), embedder.upstream.prepare()
        assert chat == embed == Target(Route.ENDPOINT, "http://h:1")
        assert (chat.url("/v1/chat/completions"), embed.url("/tokenize")) == (
            "http://h:1/v1/chat/completions",
            "http://h:1/tokenize",
        )
    finally:
        agent.close()
        embedder.close()


def test_broken_connection_is_the_only_retried_failure() -> None:
    request = httpx.Request("POST", "http://h/")
    broken = [
        httpx.ConnectError("refused", request=request),
        httpx.ReadError("reset", request=request),
        httpx.WriteError("pipe", request=request),
        httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request),
        ConnectionResetError(104, "reset"),
        OSError("the upstream closed the connection mid-answer"),
    ]
    final = [
        httpx.ReadTimeout("slow", request=request),
        httpx.ConnectTimeout("slow", request=request),
        TimeoutError(),
        ValueError("bad json"),
        AgentError(ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request"),
    ]
    assert [broken_connection(e) for e in broken] == [True] * len(broken)
    assert [broken_connection(e) for e in final] == [False] * len(final)


def test_an_endpoint_is_never_retried() -> None:
    sent: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        raise httpx.ConnectError("refused", request=request)

    embedder = LocalEmbedder("http://dead.test/v1", "all-minilm-l6-v2", transport=httpx.MockTransport(refuse))
    with pytest.raises(EmbedServerError):
        embedder.embed(["a"], "query")
    assert sent == ["http://dead.test/v1/embeddings"] and embedder.retries == 0
    upstream = Upstream(endpoint="http://dead.test")
    target = upstream.prepare()
    assert upstream.recover(target, httpx.ConnectError("refused")) is None


def test_a_timeout_is_never_retried(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    upstream = Upstream(
        ServerSpec("m", "chat", str(gguf), server_bin=str(server_bin), health_timeout=30), policy="never"
    )
    calls: list[Target] = []

    def send(target: Target) -> None:
        calls.append(target)
        raise httpx.ReadTimeout("slow", request=httpx.Request("POST", target.url("/v1/chat/completions")))

    try:
        with pytest.raises(httpx.ReadTimeout):
            upstream.call(send)
    finally:
        upstream.close()
    assert len(calls) == 1 and len(rows(logs["spawn"], "start")) == 1


# -- one retry rule: a crash mid-call, chat and embeddings alike -----------------------------------
def _chat_client(tmp_path: Path, server_bin: Path) -> tuple[Callable[[], Any], Callable[[], None], Callable[[], int]]:
    gguf = tmp_path / "chat.gguf"
    gguf.write_bytes(b"GGUF chat")
    decl = LocalLLMDecl(
        alias="agent.chat",
        plugin="builtin.local_llm",
        model=str(gguf),
        server_bin=str(server_bin),
        parallel=1,
        ctx_size=512,
        health_timeout=30,
        service="never",
    )
    agent = LocalLLMAgent(decl)
    last: dict[str, Any] = {}

    def call() -> Any:
        try:
            answer = agent.ask(_request(), deadline=time.monotonic() + 60)
        except AgentError as exc:
            last["meta"] = exc.meta or {}
            raise
        last["meta"] = answer.meta
        return answer.submission

    return call, agent.close, lambda: int(last.get("meta", {}).get("upstream_retries", 0))


def _embed_client(tmp_path: Path, server_bin: Path) -> tuple[Callable[[], Any], Callable[[], None], Callable[[], int]]:
    gguf = tmp_path / "all-minilm-l6-v2-f16.gguf"
    gguf.write_bytes(b"GGUF embed")
    decl = EmbedderDecl(name="docs", model=str(gguf), server_bin=str(server_bin), health_timeout=30, service="never")
    embedder = embedder_from_decl(decl)
    state = {"before": 0, "retries": 0}

    def call() -> Any:
        state["before"] = embedder.retries
        try:
            return embedder.embed(["apple"], "document").tolist()
        finally:
            state["retries"] = embedder.retries - state["before"]

    return call, embedder.close, lambda: state["retries"]


CLIENTS = {"chat": _chat_client, "embeddings": _embed_client}


@pytest.mark.parametrize("kind", sorted(CLIENTS))
def test_a_crash_mid_call_is_retried_once_on_a_respawned_server(
    kind: str, tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "crashed-once"
    monkeypatch.setenv("FAKE_LLAMA_CRASH_MID_CALL", f"once:{marker}")
    call, close, retries = CLIENTS[kind](tmp_path, server_bin)
    try:
        first = call()  # the first server dies with the request unanswered; the call still answers
        assert marker.exists() and retries() == 1
        assert len(rows(logs["spawn"], "start")) == 2  # respawned once, by the retry
        again = call()
        assert again == first and retries() == 0  # the respawned server answers on its own
    finally:
        close()
    starts = rows(logs["spawn"], "start")
    assert len(starts) == 2
    assert rows(logs["spawn"], "exit")[0]["code"] == 134  # the crash was real


@pytest.mark.parametrize("kind", sorted(CLIENTS))
def test_a_server_that_crashes_every_call_fails_after_exactly_one_retry(
    kind: str, tmp_path: Path, server_bin: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CRASH_MID_CALL", "always")
    call, close, retries = CLIENTS[kind](tmp_path, server_bin)
    try:
        with pytest.raises((AgentError, EmbedServerError)) as info:
            call()
    finally:
        close()
    assert retries() == 1
    assert len(rows(logs["spawn"], "start")) == 2  # the first server and one respawn, no more
    if isinstance(info.value, AgentError):
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR
        assert (info.value.meta or {})["route"] == "sidecar"
    else:
        assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)


# -- thread safety ---------------------------------------------------------------------------------
def _together(n: int, fn: Callable[[], Any]) -> list[Any]:
    """``fn()`` from ``n`` threads released at once; their results (or exceptions) in order."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as exc:  # collected: the test asserts on them
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_concurrent_prepare_spawns_one_server(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    upstream = Upstream(ServerSpec("m", "chat", str(gguf), server_bin=str(server_bin), health_timeout=30))
    try:
        targets = _together(12, upstream.prepare)
    finally:
        upstream.close()
    assert all(isinstance(t, Target) for t in targets), targets
    assert len(set(targets)) == 1 and targets[0].route is Route.SIDECAR
    assert len(rows(logs["spawn"], "start")) == 1


def test_concurrent_recover_after_a_crash_respawns_once(
    tmp_path: Path, server_bin: Path, logs: dict[str, Path]
) -> None:
    import os
    import signal

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    upstream = Upstream(ServerSpec("m", "chat", str(gguf), server_bin=str(server_bin), health_timeout=30))
    try:
        dead = upstream.prepare()
        assert dead.pid is not None
        os.kill(dead.pid, signal.SIGKILL)
        broke = httpx.RemoteProtocolError("Server disconnected without sending a response.")
        fresh = _together(8, lambda: upstream.recover(dead, broke))
    finally:
        upstream.close()
    assert all(isinstance(t, Target) for t in fresh), fresh
    assert len(set(fresh)) == 1 and fresh[0].pid != dead.pid
    assert len(rows(logs["spawn"], "start")) == 2


def test_close_during_a_resolution_refuses_later_ones(tmp_path: Path, server_bin: Path, logs: dict[str, Path]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    upstream = Upstream(ServerSpec("m", "chat", str(gguf), server_bin=str(server_bin), health_timeout=30))
    upstream.close()
    with pytest.raises(Exception, match="closed"):
        upstream.prepare()
    assert rows(logs["spawn"], "start") == []


# -- one spec, built once from a declaration -------------------------------------------------------
def test_the_agent_embedder_and_service_start_the_same_server_for_a_declaration(tmp_path: Path) -> None:
    from localllm.loading import load_config
    from localllm.managed.pins import load_pins
    from localllm.service.catalog import build_catalog

    for name in ("all-minilm-l6-v2-f16.gguf", "c.gguf"):
        (tmp_path / name).write_bytes(b"GGUF " + name.encode())
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        "  agent.c: {plugin: builtin.local_llm, model: c.gguf, parallel: 3, ctx_size: 1024, threads: 2,"
        " extra_args: [--flash-attn, 'on']}\n"
        "embedders:\n  docs: {model: all-minilm-l6-v2-f16.gguf, parallel: 2, threads: 3}\n"
    )
    config = load_config(tmp_path / "app.yaml")
    catalog = build_catalog(load_pins(), config)
    agent = LocalLLMAgent(config.agents["agent.c"], base_dir=config.base_dir)  # type: ignore[arg-type]
    embedder = embedder_from_decl(config.embedders["docs"], base_dir=config.base_dir)
    try:
        assert embedder.server is not None and agent.upstream.server is not None  # built, nothing spawned
        # build, model, role and every flag but the port: the same server, from one spec builder
        assert catalog["all-minilm-l6-v2-f16"].server().key == embedder.server.key
        assert catalog["c"].server().key == agent.upstream.server.key
        assert "--flash-attn" in agent.upstream.server.key.flags
        assert embedding_spec(config.embedders["docs"], base_dir=config.base_dir).parallel == 2
    finally:
        agent.close()
        embedder.close()
