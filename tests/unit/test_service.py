"""``localllm serve`` against fake llama-server *processes*: auth, routing, pool rules, discovery, attach."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.agents.local_llm import LocalLLMAgent
from localllm.cli import main
from localllm.config import EmbedderDecl, LocalLLMDecl
from localllm.errors import AgentError, ErrorKind, ServiceError, ServiceRunning, ServiceUnavailable
from localllm.loading import load_config
from localllm.managed import discovery
from localllm.managed.server import CANARY_BODY, GRAMMAR_HEADER
from localllm.service import control
from localllm.service.daemon import ServeOptions, Service, parse_duration, parse_size
from localllm.wire import AskRequest
from tests.conftest import REPO, pid_gone

Factory = Callable[..., Service]


@pytest.fixture
def env(tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Three path models (distinct bytes), a config serving them, the fake on LOCALLLM_SERVER_BIN."""
    paths = {
        "spawn": tmp_path / "spawn.jsonl",
        "requests": tmp_path / "requests.jsonl",
        "cache": tmp_path / "cache",
        "config": tmp_path / "app.yaml",
    }
    for name in ("chat", "other", "third", "all-minilm-l6-v2-f16"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF " + name.encode())
        paths[name] = tmp_path / f"{name}.gguf"
    paths["config"].write_text(
        "agent_plugins:\n"
        "  agent.chat: {plugin: builtin.local_llm, model: chat.gguf, parallel: 2}\n"
        "  agent.other: {plugin: builtin.local_llm, model: other.gguf}\n"
        "  agent.third: {plugin: builtin.local_llm, model: third.gguf}\n"
        "embedders:\n  e: {model: all-minilm-l6-v2-f16.gguf}\n"
    )
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(paths["spawn"]))
    monkeypatch.setenv("FAKE_LLAMA_REQUEST_LOG", str(paths["requests"]))
    return paths


@pytest.fixture
def make_service(env: dict[str, Path]) -> Iterator[Factory]:
    made: list[Service] = []

    def make(*, after_load: Callable[[], object] | None = None, **options: Any) -> Service:
        options.setdefault("port", 0)
        service = Service(ServeOptions(**options), config=load_config(env["config"]))
        if after_load is not None:  # the config was valid when loaded; the disk changes after
            after_load()
        made.append(service.start())
        return service

    yield make
    for service in made:
        service.close()


def rows(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if event is None or r.get("event") == event]


def client(service: Service, token: str | None = "") -> httpx.Client:
    key = service.token if token == "" else token
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=service.url, headers=headers, trust_env=False, timeout=30.0)


def chat(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    return http.post(
        "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    )


def eventually(probe: Callable[[], Any], within: float = 2.0) -> Any:
    """``probe()`` once it is truthy, or its last value after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not (value := probe()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def alive_servers(spawn: Path) -> set[int]:
    return {r["pid"] for r in rows(spawn, "start") if not pid_gone(r["pid"])}


# -- auth ---------------------------------------------------------------------------------
def test_requests_need_the_token(make_service: Factory) -> None:
    service = make_service()
    assert service.token and len(service.token) >= 32
    with client(service, token=None) as anon, client(service, token="wrong") as wrong, client(service) as ok:
        assert anon.get("/v1/models").status_code == 401
        assert chat(anon, "chat").status_code == 401
        denied = wrong.post("/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", "input": "x"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert "instance" not in anon.get("/health").json()  # liveness only, no identity
        assert ok.get("/health").json()["instance"] == service.instance
        assert ok.get("/v1/models").status_code == 200


def test_no_auth_is_loopback_only(make_service: Factory) -> None:
    service = make_service(no_auth=True)
    with client(service, token=None) as anon:
        assert anon.get("/v1/models").status_code == 200
    assert not service.token_path.exists()
    with pytest.raises(ServiceError, match="without a token"):
        Service(ServeOptions(host="0.0.0.0", no_auth=True))


def test_api_key_env_token_is_used(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["serve", "--port", "0", "--api-key-env", "UNSET_KEY"]) == 2  # bad usage, nothing started
    assert not (env["cache"] / "run" / "service.json").exists()
    key = "k-" + "x" * 30
    monkeypatch.setenv("MY_KEY", key)
    proc, found = _serve_process(env, "--api-key-env", "MY_KEY")
    try:
        assert discovery.read_token(found.token_file) == key  # attachers read it from the 0600 file
        with httpx.Client(base_url=found.url, trust_env=False) as http:
            assert http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
            assert http.get("/v1/models").status_code == 401
    finally:
        proc.terminate()
        proc.wait(15)


# -- models and routing -----------------------------------------------------------------
def test_models_lists_config_and_pinned_ids_with_flags(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        before = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert {"chat", "other", "all-minilm-l6-v2-f16", "gemma-3-270m", "all-minilm-l6-v2"} <= set(before)
        assert before["chat"]["cached"] is True and before["chat"]["loaded"] is False
        assert before["gemma-3-270m"]["cached"] is False  # pinned, not in this cache
        assert before["all-minilm-l6-v2-f16"]["role"] == "embedding"
        assert chat(http, "chat").status_code == 200
        after = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert after["chat"]["loaded"] is True and after["other"]["loaded"] is False


def test_routing_by_model_and_bodies_pass_through(make_service: Factory, env: dict[str, Path]) -> None:
    # a chat body keeps every field it was sent with (a client's own grammar too); what the
    # service adds or compiles (max_tokens, stop, response_format) is in test_service_front.py
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", grammar='root ::= "x"', top_k=5, cache_prompt=True)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"] == "x"  # the grammar reached the server
        assert answer.headers[GRAMMAR_HEADER] == "true"  # the chat server passed the start-up canary
        (row,) = [m for m in http.get("/localllm/ps").json()["models"] if m["id"] == "chat"]
        assert row["grammar_enforced"] is True
        assert chat(http, "other").status_code == 200
        emb = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", "input": ["query text"]})
        assert emb.status_code == 200 and len(emb.json()["data"][0]["embedding"]) == 384
        assert GRAMMAR_HEADER not in emb.headers  # the canary concerns chat servers only
        missing = chat(http, "no-such-model")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert chat(http, "").status_code == 400
    starts = {Path(r["argv"][r["argv"].index("-m") + 1]).name: r["argv"] for r in rows(env["spawn"], "start")}
    assert set(starts) == {"chat.gguf", "other.gguf", "all-minilm-l6-v2-f16.gguf"}
    assert starts["chat.gguf"][starts["chat.gguf"].index("--parallel") + 1] == "2"  # the config's slots
    embed_argv = starts["all-minilm-l6-v2-f16.gguf"]
    assert "--embeddings" in embed_argv and embed_argv[embed_argv.index("--pooling") + 1] == "mean"

    def posts() -> list[dict[str, Any]]:  # the servers' start-up canaries aside
        return [r for r in rows(env["requests"]) if r["method"] == "POST" and r["body"] != CANARY_BODY]

    sent = posts()
    chat_body = next(r["body"] for r in sent if r["path"] == "/v1/chat/completions")
    assert chat_body["grammar"] == 'root ::= "x"' and chat_body["top_k"] == 5 and chat_body["cache_prompt"] is True
    embed_body = next(r["body"] for r in sent if r["path"] == "/v1/embeddings")
    assert embed_body["input"] == ["query text"]  # no prefix added in the OpenAI surface
    # the upstream servers demand a key of their own: other local users cannot bypass the service
    assert all(r["headers"]["authorization"] == "Bearer ***" for r in sent)
    assert all(r["api_key_set"] for r in rows(env["spawn"], "start"))


def test_streamed_chat_is_relayed_chunk_by_chunk(make_service: Factory) -> None:
    service = make_service()
    with (
        client(service) as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ) as reply,
    ):
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == "Hello from the fake llama-server."
    assert len(events) >= 6


def test_request_log_line_has_numbers_not_bodies(make_service: Factory, caplog: pytest.LogCaptureFixture) -> None:
    service = make_service()
    with caplog.at_level(logging.INFO, logger="localllm.service"), client(service) as http:
        http.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "secret prompt words"}]},
        )
        deadline = time.monotonic() + 2  # the line is written once the answer is out
        while time.monotonic() < deadline:
            lines = [r.getMessage() for r in caplog.records if "/v1/chat/completions" in r.getMessage()]
            if lines:
                break
            time.sleep(0.02)
    assert len(lines) == 1
    assert "model=chat status=200 prompt_tokens=3 completion_tokens=8 ms=" in lines[0]
    assert not any("secret" in r.getMessage() for r in caplog.records)
    with client(service) as http:
        metrics = http.get("/metrics").text
    assert 'localllm_model_requests_total{model="chat",status="200"} 1' in metrics
    assert 'localllm_prompt_tokens_total{model="chat"} 3' in metrics


# -- pool rules -----------------------------------------------------------------------------
def test_keep_alive_unloads_an_idle_model(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service(keep_alive=0.4)
    with client(service) as http:
        assert chat(http, "chat").status_code == 200
        loaded = http.get("/localllm/ps").json()["models"]
        assert [m["id"] for m in loaded] == ["chat"]
        pid = loaded[0]["pid"]
        deadline = time.monotonic() + 5
        while http.get("/localllm/ps").json()["models"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get("/localllm/ps").json()["models"] == []
    assert pid_gone(pid, within=2.0)
    assert time.monotonic() < deadline  # unloaded well before the bound


def test_ps_shows_an_unloading_model_until_its_server_has_exited(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real server takes a while to free its model after SIGTERM: `ps` said "no models"
    # while its llama-server still ran (the e2e keep-alive test saw the process after `ps`)
    monkeypatch.setenv("FAKE_LLAMA_EXIT_DELAY", "0.6")
    service = make_service(keep_alive=0.2)
    states: list[str] = []
    with client(service) as http:
        assert chat(http, "chat").status_code == 200
        pid = http.get("/localllm/ps").json()["models"][0]["pid"]
        deadline = time.monotonic() + 5
        while (models := http.get("/localllm/ps").json()["models"]) and time.monotonic() < deadline:
            states += [m["state"] for m in models if m["pid"] == pid]
            time.sleep(0.02)
        assert models == []
        assert pid_gone(pid)  # at once: no grace once `ps` is empty
    assert "stopping" in states
    assert states[-1] == "stopping"


def test_max_models_one_unloads_before_the_next_loads(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service(max_models=1)
    with client(service) as http:
        for model in ("chat", "other", "chat", "other"):
            assert chat(http, model).status_code == 200
            assert len(alive_servers(env["spawn"])) == 1
    # the spawn log is in process order: every start after the first follows an exit
    events = [r["event"] for r in rows(env["spawn"]) if r["event"] in ("start", "exit")]
    assert events == ["start", "exit", "start", "exit", "start", "exit", "start"]


def test_lru_idle_model_is_evicted_first(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service(max_models=2)
    with client(service) as http:
        for model in ("chat", "other", "chat", "third"):
            assert chat(http, model).status_code == 200
        loaded = {m["id"] for m in http.get("/localllm/ps").json()["models"]}
    assert loaded == {"chat", "third"}  # "other" was the least recently used


def test_lru_is_by_when_a_request_ended_not_when_its_release_ran(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # releases run on threads of their own, in either order: under load "other"'s release ran
    # after the later "chat" request's, stamped "other" the more recent, and "chat" was evicted
    service = make_service(max_models=2)
    pool = service.pool
    assert pool is not None
    release = pool.release

    def late(held: Any, *rest: Any) -> None:
        if held.lease.model == "other":
            time.sleep(0.3)
        release(held, *rest)

    monkeypatch.setattr(pool, "release", late)
    with client(service) as http:
        for model in ("chat", "other", "chat"):
            assert chat(http, model).status_code == 200
        assert eventually(lambda: all(m["slots_busy"] == 0 for m in http.get("/localllm/ps").json()["models"]))
        assert chat(http, "third").status_code == 200
        loaded = {m["id"] for m in http.get("/localllm/ps").json()["models"]}
    assert loaded == {"chat", "third"}


def test_memory_budget_evicts(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service(memory_budget=1)  # any loaded server is over one byte
    with client(service) as http:
        assert chat(http, "chat").status_code == 200
        assert chat(http, "other").status_code == 200  # loads alone once chat is unloaded
        assert [m["id"] for m in http.get("/localllm/ps").json()["models"]] == ["other"]


def test_concurrent_requests_for_a_loading_model_share_one_spawn(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_LOAD_DELAY", "1.0")
    service = make_service()
    statuses: list[int] = []
    barrier = threading.Barrier(6)

    def one() -> None:
        with client(service) as http:
            barrier.wait()
            statuses.append(chat(http, "chat").status_code)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert statuses == [200] * 6
    assert len(rows(env["spawn"], "start")) == 1


def test_busy_models_make_a_new_one_wait_bounded(
    env: dict[str, Path], make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "1.5")
    service = make_service(max_models=1, load_wait=0.3)
    with client(service) as http:
        slow = threading.Thread(target=lambda: chat(http, "chat"))
        slow.start()
        time.sleep(0.8)  # chat loaded and busy
        with client(service) as second:
            refused = chat(second, "other")
        slow.join(10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_busy"


def test_waiters_for_another_model_do_not_hold_back_the_release_they_wait_for(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one streamed answer holds "chat" (max_models=1); 70 requests wait for room for "other"
    # (more than the 64 lease threads the front had, whose queue the release of "chat" joined)
    monkeypatch.setenv("FAKE_LLAMA_STREAM_DELAY", "0.25")
    service = make_service(max_models=1, load_wait=12)
    statuses: list[int] = []
    with client(service) as http:
        assert chat(http, "chat").status_code == 200
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        slow = threading.Thread(
            target=lambda: statuses.append(http.post("/v1/chat/completions", json=body).status_code)
        )
        slow.start()
        time.sleep(0.3)
        waiters = [threading.Thread(target=lambda: statuses.append(chat(http, "other").status_code)) for _ in range(70)]
        for t in waiters:
            t.start()
        time.sleep(0.5)
        started = time.monotonic()
        listed = http.get("/v1/models")
        listing = time.monotonic() - started
        for t in [slow, *waiters]:
            t.join(30)
    assert listed.status_code == 200 and listing < 5  # was held until the waiters gave up (load_wait)
    assert statuses == [200] * 71


def test_slots_answers_while_every_pooled_connection_generates(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "6")
    service = make_service()  # "chat": parallel 2, so 3 pooled connections
    with client(service) as http:
        assert http.post("/tokenize", json={"model": "chat", "content": "hi"}).status_code == 200  # loaded
        busy = [threading.Thread(target=lambda: chat(http, "chat")) for _ in range(3)]
        for t in busy:
            t.start()
        time.sleep(0.5)
        slots = http.get("/localllm/slots/chat")
        generating = sum(t.is_alive() for t in busy)
        for t in busy:
            t.join(30)
    assert slots.status_code == 404  # the fake's own answer to /slots, passed on
    assert generating == 3  # answered while all three generate (before: queued until one ended, 6 s in)
    assert any(r["method"] == "GET" and r["path"] == "/slots" for r in rows(env["requests"]))


def test_load_failure_is_a_503_naming_the_cause(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    env["other"].unlink()
    with client(service) as http:
        failed = chat(http, "other")
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "model_load_failed"
        assert "other.gguf" in failed.json()["error"]["message"]
        assert chat(http, "chat").status_code == 200  # the service is still fine


# -- operate: ps, stop -------------------------------------------------------------------------
def test_ps_and_stop_through_the_cli(
    make_service: Factory, env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    service = make_service()
    with client(service) as http:
        chat(http, "chat")
        chat(http, "chat")
    capsys.readouterr()
    assert main(["ps", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["models"]
    assert row["id"] == "chat" and row["requests_served"] == 2 and row["slots_total"] == 2
    assert row["slots_busy"] == 0 and row["pid"] in alive_servers(env["spawn"]) and row["rss_bytes"] > 0
    assert data["service"]["pid"] == os.getpid()
    assert main(["ps"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert (header.split()[-1], line.split()[-1]) == ("GRAMMAR", "enforced")
    assert main(["stop", "chat"]) == 0
    assert "unloaded chat" in capsys.readouterr().out
    assert pid_gone(row["pid"], within=2.0)
    assert main(["stop", "chat"]) == 0
    assert "was not loaded" in capsys.readouterr().out
    assert main(["stop"]) == 2


def test_ps_without_a_service_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ps"]) == 1
    assert "no localllm service is running" in capsys.readouterr().err


# -- discovery --------------------------------------------------------------------------------
def test_discovery_file_is_private_and_verified(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    run = env["cache"] / "run"
    found = discovery.read_discovery(env["cache"])
    assert found is not None and found.pid == os.getpid() and found.port == service.port
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for name in ("service.json", "token"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o600
    assert (run / "token").read_text().strip() == service.token
    assert service.token not in (run / "service.json").read_text()
    build = discovery.file_sha256(Path(os.environ["LOCALLLM_SERVER_BIN"]))
    attached = discovery.discover(env["cache"], build, discovery.file_sha256(env["chat"]))
    assert attached is not None and attached.model == "chat" and attached.token == service.token
    assert service.token not in repr(attached)
    assert discovery.discover(env["cache"], "0" * 64, discovery.file_sha256(env["chat"])) is None  # other build
    assert discovery.discover(env["cache"], build, "0" * 64) is None  # a model it does not serve
    minilm = discovery.file_sha256(env["all-minilm-l6-v2-f16"])
    assert discovery.discover(env["cache"], build, minilm) is None  # served, but as an embedding server
    assert discovery.discover(env["cache"], build, minilm, "embedding") is not None
    service.close()
    assert not (run / "service.json").exists() and not (run / "token").exists()
    assert discovery.discover(env["cache"], build, discovery.file_sha256(env["chat"])) is None


def test_stale_or_foreign_discovery_is_ignored(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    found = discovery.read_discovery(env["cache"])
    assert found is not None
    # another instance's file at the same port: /health names a different instance
    discovery.write_discovery(env["cache"], discovery.Discovery(**{**found.__dict__, "instance": "someone-else"}))
    with pytest.raises(ServiceUnavailable):
        control.connect(env["cache"])
    # a world-readable file is not trusted at all
    discovery.write_discovery(env["cache"], found)
    os.chmod(env["cache"] / "run" / "service.json", 0o644)
    assert discovery.read_discovery(env["cache"]) is None
    os.chmod(env["cache"] / "run" / "service.json", 0o600)
    assert control.connect(env["cache"])[0].instance == service.instance


def test_second_service_on_the_same_cache_is_refused(make_service: Factory, env: dict[str, Path]) -> None:
    first = make_service()
    with pytest.raises(ServiceRunning) as info:
        make_service()
    assert info.value.pid == os.getpid() and info.value.port == first.port
    assert discovery.read_discovery(env["cache"]) is not None  # the first one's file is untouched


# -- attach -------------------------------------------------------------------------------------
def _agent(env: dict[str, Path], **fields: Any) -> LocalLLMAgent:
    decl = LocalLLMDecl(alias="agent.chat", plugin="builtin.local_llm", model="chat.gguf", **fields)
    return LocalLLMAgent(decl, base_dir=env["chat"].parent)


def _ask(agent: LocalLLMAgent, schema: dict[str, Any] | None = None) -> Any:
    verb = "ask" if schema is None else "decide"
    request = AskRequest(
        session_id="s", turn=1, state_path="x", verb=verb, prompt="hi", call_id="c1", deadline="", schema=schema
    )
    return agent.ask(request, deadline=time.monotonic() + 30)


def test_managed_agent_attaches_to_a_running_service(make_service: Factory, env: dict[str, Path]) -> None:
    make_service()
    agent = _agent(env)
    try:
        first, second = _ask(agent), _ask(agent)
        constrained = _ask(agent, schema={"enum": ["yes", "no"]})
    finally:
        agent.close()
    assert first.meta["served_by"] == "service" and second.meta["served_by"] == "service"
    meta = constrained.meta or {}
    assert meta["grammar"] is True and meta["grammar_source"] == "compiled" and meta["grammar_enforced"] is True
    assert first.submission == "Hello from the fake llama-server."
    assert len(rows(env["spawn"], "start")) == 1  # the service's server, none of the agent's own
    assert agent.upstream.own_server is None


def test_service_never_and_required(make_service: Factory, env: dict[str, Path]) -> None:
    required = _agent(env, service="required")
    with pytest.raises(AgentError) as info:
        _ask(required)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "no localllm service" in info.value.detail
    assert rows(env["spawn"], "start") == []  # required never spawns its own
    make_service()
    never = _agent(env, service="never")
    try:
        assert _ask(never).meta["served_by"] == "sidecar"
    finally:
        never.close()
    assert len(rows(env["spawn"], "start")) == 1  # its own sidecar; the service loaded nothing


def test_a_service_dying_mid_call_is_retried_once_on_a_sidecar(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the upstream's one failure rule: the broken connection is retried once on a fresh
    # resolution; the service is gone, so under service: auto the agent's own sidecar answers
    service = make_service()
    agent = _agent(env)
    try:
        first = _ask(agent)
        assert first.meta["served_by"] == "service" and "upstream_retries" not in first.meta
        service.close()
        retried = _ask(agent)
        assert retried.meta["served_by"] == "sidecar" and retried.meta["upstream_retries"] == 1
        later = _ask(agent)
        assert later.meta["served_by"] == "sidecar" and "upstream_retries" not in later.meta
    finally:
        agent.close()
    assert len(rows(env["spawn"], "start")) == 2  # the service's server, then the agent's own


def test_concurrent_first_calls_attach_once(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # thread-safety of attach: the agent's route is resolved once, under the upstream's lock,
    # however many calls race to be first
    from localllm.managed import upstream as upstream_mod

    make_service()
    lookups: list[str] = []
    real_attach = upstream_mod.attach

    def counting(*args: Any, **kwargs: Any) -> Any:
        lookups.append(args[0])
        time.sleep(0.05)  # widen the window a racing caller would slip through
        return real_attach(*args, **kwargs)

    monkeypatch.setattr(upstream_mod, "attach", counting)
    agent = _agent(env)
    barrier = threading.Barrier(8)
    answers: list[Any] = []

    def first_call() -> None:
        barrier.wait()
        answers.append(_ask(agent))

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        agent.close()
    assert len(answers) == 8 and {a.meta["served_by"] for a in answers} == {"service"}
    assert lookups == ["chat.gguf"]  # one discovery lookup for eight racing first calls
    assert len(rows(env["spawn"], "start")) == 1  # the service's server; the agent spawned none


def test_the_service_retries_a_crash_mid_call_once_like_an_agent(
    make_service: Factory, env: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the service's own models hold the same Upstream: a crash before any byte reached the
    # client is retried once on a respawned server
    marker = tmp_path / "crashed-once"
    monkeypatch.setenv("FAKE_LLAMA_CRASH_MID_CALL", f"once:{marker}")
    service = make_service()
    with client(service) as http:
        reply = chat(http, "chat")
        embedded = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", "input": "x"})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    assert marker.exists() and embedded.status_code == 200
    starts = [r for r in rows(env["spawn"], "start") if any("chat.gguf" in a for a in r["argv"])]
    assert len(starts) == 2  # the chat model's server crashed mid-call and was respawned once


def test_managed_embedder_attaches(make_service: Factory, env: dict[str, Path]) -> None:
    from localllm.embed.local import embedder_from_decl

    make_service()
    embedder = embedder_from_decl(
        EmbedderDecl(name="e", model="all-minilm-l6-v2-f16.gguf"), base_dir=env["chat"].parent
    )
    try:
        vectors = embedder.embed(["a text"], "query")
    finally:
        embedder.close()
    assert vectors.shape == (1, 384)
    assert embedder.served_by == "service"
    assert len(rows(env["spawn"], "start")) == 1
    bodies = [r["body"] for r in rows(env["requests"]) if r["path"] == "/v1/embeddings"]
    assert bodies[0]["model"] == "all-minilm-l6-v2-f16"


def test_config_rejects_a_bad_service_policy(tmp_path: Path) -> None:
    from localllm.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text(
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, model: m.gguf, service: always}\n"
        "embedders:\n  e: {model: e.gguf, service: maybe}\n"
    )
    for name in ("m.gguf", "e.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    keys = sorted(p.key for p in info.value.problems)
    assert keys == ["agent_plugins.agent.x.service", "embedders.e.service"]


# -- the process: signals, kill -9, detach ------------------------------------------------------
def _serve_process(env: dict[str, Path], *extra: str) -> tuple[subprocess.Popen[bytes], discovery.Discovery]:
    log = env["config"].with_name("serve.log")
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localllm", "serve", "--port", "0", "--config", str(env["config"]), *extra],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=dict(os.environ),
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = discovery.read_discovery(env["cache"])
        if found is not None and found.pid == proc.pid:
            return proc, found
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("serve did not publish its discovery file")


def _load_one(found: discovery.Discovery) -> int:
    token = discovery.read_token(found.token_file)
    with httpx.Client(
        base_url=found.url, headers={"Authorization": f"Bearer {token}"}, trust_env=False, timeout=30
    ) as http:
        assert chat(http, "chat").status_code == 200
        (row,) = http.get("/localllm/ps").json()["models"]
    pid: int = row["pid"]
    return pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_everything_and_removes_discovery(env: dict[str, Path], sig: signal.Signals) -> None:
    proc, found = _serve_process(env)
    server_pid = _load_one(found)
    proc.send_signal(sig)
    assert proc.wait(15) == 0
    assert pid_gone(server_pid, within=1.0)
    assert not (env["cache"] / "run" / "service.json").exists()
    assert not (env["cache"] / "run" / "token").exists()


def test_sigkill_leaves_no_llama_server(env: dict[str, Path]) -> None:
    proc, found = _serve_process(env)
    server_pid = _load_one(found)
    proc.kill()
    proc.wait(5)
    assert pid_gone(server_pid, within=2.0)  # the watchdog's doing
    assert discovery.discover(env["cache"], found.build_sha256, discovery.file_sha256(env["chat"])) is None


def test_second_serve_process_refuses_and_names_the_first(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proc, found = _serve_process(env)
    handlers = list(logging.getLogger("localllm.service").handlers)
    try:
        assert main(["serve", "--port", "0"]) == 1
        message = capsys.readouterr().err
        assert f"pid {found.pid}" in message and f"port {found.port}" in message
        # no handler left on capsys's stream (CI: "Logging error … I/O operation on closed file")
        assert logging.getLogger("localllm.service").handlers == handlers
    finally:
        proc.terminate()
        proc.wait(15)


def test_detach_then_stop_all(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--detach", "--port", "0", "--config", str(env["config"])]) == 0
    out = capsys.readouterr().out
    found = discovery.read_discovery(env["cache"])
    assert found is not None and f"pid {found.pid}" in out and found.pid != os.getpid()
    server_pid = _load_one(found)
    assert main(["stop", "--all"]) == 0
    assert pid_gone(found.pid, within=1.0) and pid_gone(server_pid, within=1.0)
    os.waitpid(found.pid, 0)  # spawned by this test process: reap it
    log = (env["cache"] / "run" / "service.log").read_text()
    assert "POST /v1/chat/completions model=chat status=200" in log
    assert "service stopped" in log


def test_durations_and_sizes() -> None:
    assert parse_duration("5m") == 300 and parse_duration("2s") == 2 and parse_duration("250ms") == 0.25
    assert parse_duration("-1") == -1 and parse_duration("1h") == 3600
    assert parse_size("6") == 6 << 30 and parse_size("512MiB") == 512 << 20
    for bad in ("soon", "5 days"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert main(["serve", "--keep-alive", "soon"]) == 2
    for flag in ("--header-timeout", "--idle-timeout"):
        for bad in ("nan", "inf", "0", "-1", "1e9"):
            assert main(["serve", flag, bad]) == 2, (flag, bad)  # bad usage, nothing started


def test_a_busy_port_is_a_clear_error_foreground_and_detached(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert main(["serve", "--port", port]) == 1
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
        assert not (env["cache"] / "run" / "service.json").exists()
        assert main(["serve", "--detach", "--port", port]) == 1
        message = capsys.readouterr().err
        assert "localllm serve exited with code 1" in message and "cannot listen" in message
    assert main(["serve", "--no-auth", "--host", "0.0.0.0", "--port", "0"]) == 2


@pytest.mark.parametrize(
    "flags",
    [
        ["--allow-origin", "localhost:3000"],  # no scheme: never what a browser sends
        ["--allow-origin", "http://localhost:3000/app"],  # a path: never in an Origin header
        ["--allow-host", ""],
        ["--allow-host", "box.lan:8911"],  # the port is --port's
        ["--allow-host", "http://box.lan"],
    ],
)
def test_an_origin_or_host_that_could_never_match_is_a_usage_error(env: dict[str, Path], flags: list[str]) -> None:
    # each was accepted, the service served on, and the flag matched no request, silently
    # (a child process: before the fix it served until the timeout)
    argv = [sys.executable, "-m", "localllm", "serve", "--port", "0", *flags]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, env=dict(os.environ), timeout=30, check=False)
    assert done.returncode == 2, done.stderr
    assert not (env["cache"] / "run" / "service.json").exists()


def test_a_host_of_another_machine_gets_the_host_hint_and_ipv6_a_bracketed_url(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--host", "192.0.2.1", "--port", "0"]) == 1  # TEST-NET-1: never this machine's
    assert "hint: --host must be an address of this machine" in capsys.readouterr().err
    assert discovery.http_url("::1", 8911) == "http://[::1]:8911"  # was http://::1:8911
    assert discovery.http_url("0.0.0.0", 8911) == "http://127.0.0.1:8911"


def test_answers_are_not_held_back_by_nagle(make_service: Factory) -> None:
    # headers and body leave in two writes; without TCP_NODELAY the body waits ~40 ms for
    # the client's delayed ACK on every keep-alive request
    service = make_service()
    with client(service) as http:
        http.get("/v1/models")
        times = []
        for _ in range(10):
            started = time.perf_counter()
            assert http.get("/v1/models").status_code == 200
            times.append(time.perf_counter() - started)
    assert sorted(times)[5] < 0.02


def test_missing_files_do_not_stop_the_service_starting(make_service: Factory, env: dict[str, Path]) -> None:
    (env["chat"].parent / "own.gguf").write_bytes(b"GGUF own")
    own_bin = env["chat"].parent / "own-llama-server"
    own_bin.write_text("#!/bin/sh\nexit 1\n")
    own_bin.chmod(0o755)
    text = env["config"].read_text()  # an agent with a server_bin that goes away after the load
    env["config"].write_text(
        text.replace(
            "embedders:",
            f"  agent.own: {{plugin: builtin.local_llm, model: own.gguf, server_bin: {own_bin}}}\nembedders:",
        )
    )

    def remove() -> None:
        env["third"].unlink()
        own_bin.unlink()

    service = make_service(after_load=remove)
    found = discovery.read_discovery(env["cache"])
    assert found is not None and "chat" in found.models
    assert "third" not in found.models and "own" not in found.models  # not offered for attach
    with client(service) as http:
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        assert listed["third"]["cached"] is False
        assert chat(http, "third").json()["error"]["code"] == "model_load_failed"


def test_a_server_dying_mid_stream_breaks_the_stream_then_respawns(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash_after_ready")
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AFTER", "1.0")
    monkeypatch.setenv("FAKE_LLAMA_STREAM_DELAY", "0.4")
    service = make_service()
    received: list[str] = []
    with client(service) as http:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            ) as reply,
        ):
            assert reply.status_code == 200
            received.extend(line for line in reply.iter_lines() if line.startswith("data: "))
        assert 0 < len(received) < 7 and "data: [DONE]" not in received  # cut off, not a tidy end
        again = chat(http, "chat")
    assert again.status_code == 200
    assert len(rows(env["spawn"], "start")) == 2  # respawned for the next request


# -- metrics and the log line --------------------------------------------------------------
def test_metrics_count_routes_not_paths_and_escape_labels(
    make_service: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    service = make_service()
    injected = "/x%22%7D%201%0Alocalllm_models_loaded%2042%0A%23"  # decoded: x"} 1\nlocalllm_models_loaded 42\n#
    with caplog.at_level(logging.INFO, logger="localllm.service"), client(service, token=None) as anonymous:
        for n in range(50):
            assert anonymous.get(f"/{n}{'a' * 3000}").status_code == 401
        assert anonymous.get(injected).status_code == 401
        assert anonymous.get("/v1/models/some-id").status_code == 401
        assert anonymous.post("/localllm/stop", json={"model": "z" * 3000}).status_code == 401
    with client(service) as http:
        assert http.post("/localllm/stop", json={"model": "y" * 3000}).status_code == 200
        metrics = http.get("/metrics").text
    series = [line for line in metrics.splitlines() if line.startswith("localllm_requests_total{")]
    assert sorted(series) == [
        'localllm_requests_total{path="/localllm/stop",status="200"} 1',
        'localllm_requests_total{path="/localllm/stop",status="401"} 1',
        'localllm_requests_total{path="/v1/models/{id}",status="401"} 1',
        'localllm_requests_total{path="other",status="401"} 51',
    ]
    assert [line for line in metrics.splitlines() if "localllm_models_loaded" in line] == [
        "# TYPE localllm_models_loaded gauge",
        "localllm_models_loaded 0",
    ]
    assert "yyy" not in metrics  # an unknown model given to stop is no label either
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GET /")]
    assert len([line for line in lines if " status=401 " in line]) == 52
    assert all("\n" not in line and '"' not in line and len(line) < 400 for line in lines)


def test_metrics_label_values_are_escaped() -> None:
    from localllm.service.api import Metrics

    metrics = Metrics()
    metrics.add("c", model='a"b\\c\nd')
    assert metrics.render().splitlines() == ["# TYPE c counter", 'c{model="a\\"b\\\\c\\nd"} 1']
