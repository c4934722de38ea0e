"""Endpoint mode against servers nobody here wrote, offline: llama-cpp-python's OpenAI server,
the LiteLLM proxy in front of it, and our llama-server started by hand with ``--api-key``.

The third-party servers live in their own venvs in the user cache (``make e2e-endpoints``
builds them once). One backend set runs at a time: the session fixture is parametrized, so
pytest runs every test of one backend before starting the next, and stops the previous set
first. Each test asserts on data: the style that ran, the schema-validity of the answer, the
error kind and hint, the request count of the probe.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest

from localllm.config import EmbedderDecl
from localllm.embed.local import embedder_from_decl
from localllm.errors import AgentError, EmbedServerError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime
from tests.conftest import SHARED
from tests.e2e.conftest import E2E_HOME

LLCP_VENV = Path(os.environ.get("LOCALLLM_TEST_LLCP_VENV") or E2E_HOME / "venvs" / "llama-cpp-python-0.3.36-noamx")
LITELLM_VENV = Path(os.environ.get("LOCALLLM_TEST_LITELLM_VENV") or E2E_HOME / "venvs" / "litellm-1.106.12")
KEY = "sk-interop-upstream"
GATEWAY_KEY = "sk-interop-gateway"
DECIDE = {
    "type": "object",
    "properties": {
        "choice": {"type": "string", "enum": ["red", "green", "blue"]},
        "reason": {"type": "string", "maxLength": 40},
    },
    "required": ["choice", "reason"],
    "additionalProperties": False,
}
#: the style ``auto`` must pick on each backend (issue 12 "Done when")
EXPECTED_STYLE = {"llama-server": "grammar", "llama-cpp-python": "json_object", "litellm": "json_object"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """One server process: started, health-checked, stopped, restartable on the same port."""

    name: str
    argv: list[str]
    port: int
    health: str
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0

    def start(self, timeout: float = 600.0) -> None:
        began = time.monotonic()
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, **self.env},
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.port}{self.health}"
        while time.monotonic() - began < timeout:
            code = self.popen.poll()
            if code is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise AssertionError(f"{self.name} exited with {code} while starting:\n{tail}")
            try:
                if httpx.get(url, headers=self.headers, timeout=5, trust_env=False).status_code == 200:
                    self.started_s = time.monotonic() - began
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{self.name} not healthy at {url} after {timeout}s")

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=20)


@dataclass
class Backend:
    kind: str
    #: what the agent attaches to (the gateway, for litellm)
    chat: Proc
    embed: Proc
    key: str
    procs: list[Proc]
    chat_model: str
    embed_model: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.chat.port}"

    @property
    def embed_url(self) -> str:
        return f"http://127.0.0.1:{self.embed.port}"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def _llama_server(tmp: Path, server_bin: Path, chat_gguf: Path, embed_gguf: Path) -> Backend:
    auth = {"Authorization": f"Bearer {KEY}"}
    chat_port, embed_port = free_port(), free_port()
    chat = Proc(
        "llama-server",
        [
            str(server_bin),
            "-m",
            str(chat_gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(chat_port),
            "--api-key",
            KEY,
            "-c",
            "2048",
        ],
        chat_port,
        "/health",
        tmp / "llama-server.log",
        headers=auth,
    )
    embed = Proc(
        "llama-server --embeddings",
        [
            str(server_bin),
            "-m",
            str(embed_gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(embed_port),
            "--api-key",
            KEY,
            "--embeddings",
            "--pooling",
            "mean",
            "-ub",
            "512",
            "-b",
            "512",
            "-c",
            "512",
        ],
        embed_port,
        "/health",
        tmp / "llama-server-embed.log",
        headers=auth,
    )
    return Backend("llama-server", chat, embed, KEY, [chat, embed], "gemma", "all-minilm-l6-v2")


def _llcp(tmp: Path, chat_gguf: Path, embed_gguf: Path) -> tuple[Proc, Proc]:
    python = LLCP_VENV / "bin" / "python"
    if not python.is_file():
        raise AssertionError(f"{python} is missing: run `make e2e-endpoints` (builds llama-cpp-python once)")
    auth = {"Authorization": f"Bearer {KEY}"}
    chat_port, embed_port = free_port(), free_port()
    base = [str(python), "-m", "llama_cpp.server", "--host", "127.0.0.1", "--api_key", KEY]
    chat = Proc(
        "llama-cpp-python",
        [
            *base,
            "--model",
            str(chat_gguf),
            "--port",
            str(chat_port),
            "--n_ctx",
            "2048",
            "--model_alias",
            "gemma",
            "--chat_format",
            "gemma",
        ],
        chat_port,
        "/v1/models",
        tmp / "llcp.log",
        headers=auth,
    )
    embed = Proc(
        "llama-cpp-python --embedding",
        [
            *base,
            "--model",
            str(embed_gguf),
            "--port",
            str(embed_port),
            "--embedding",
            "true",
            "--model_alias",
            "all-minilm-l6-v2",
        ],
        embed_port,
        "/v1/models",
        tmp / "llcp-embed.log",
        headers=auth,
    )
    return chat, embed


def _litellm(tmp: Path, chat: Proc, embed: Proc) -> Proc:
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.is_file():
        raise AssertionError(f"{binary} is missing: run `make e2e-endpoints`")
    config = tmp / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "gemma",
                        "litellm_params": {
                            "model": "openai/gemma",
                            "api_key": KEY,
                            "api_base": f"http://127.0.0.1:{chat.port}/v1",
                        },
                    },
                    {
                        "model_name": "all-minilm-l6-v2",
                        "litellm_params": {
                            "model": "openai/all-minilm-l6-v2",
                            "api_key": KEY,
                            "api_base": f"http://127.0.0.1:{embed.port}/v1",
                        },
                    },
                ],
                "general_settings": {"master_key": GATEWAY_KEY},
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "NO_PROXY": "*", "HOME": str(tmp)}
    return Proc(
        "litellm",
        [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        port,
        "/health/liveliness",
        tmp / "litellm.log",
        env=env,
    )


class Backends:
    """The one running backend set; asking for another stops it first."""

    def __init__(self, tmp: Path, server_bin: Path, chat_gguf: Path, embed_gguf: Path) -> None:
        self.tmp, self.server_bin, self.chat_gguf, self.embed_gguf = tmp, server_bin, chat_gguf, embed_gguf
        self.current: Backend | None = None
        #: what the tests measured, printed at the end of the session (ENDPOINT-README.md)
        self.measured: dict[str, dict[str, Any]] = {}

    def use(self, kind: str) -> Backend:
        if self.current is not None and self.current.kind == kind:
            return self.current
        self.close()
        if kind == "llama-server":
            backend = _llama_server(self.tmp, self.server_bin, self.chat_gguf, self.embed_gguf)
        else:
            chat, embed = _llcp(self.tmp, self.chat_gguf, self.embed_gguf)
            if kind == "llama-cpp-python":
                backend = Backend(kind, chat, embed, KEY, [chat, embed], "gemma", "all-minilm-l6-v2")
            else:
                gateway = _litellm(self.tmp, chat, embed)
                backend = Backend(
                    kind, gateway, gateway, GATEWAY_KEY, [chat, embed, gateway], "gemma", "all-minilm-l6-v2"
                )
        self.current = backend
        for proc in backend.procs:
            proc.start()
        self.note(kind, "start_s", {p.name: round(p.started_s, 1) for p in backend.procs})
        return backend

    def note(self, kind: str, what: str, value: Any) -> None:
        self.measured.setdefault(kind, {})[what] = value

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="session")
def backends(
    tmp_path_factory: pytest.TempPathFactory, server_bin: Path, chat_gguf: Path, embed_gguf: Path
) -> Iterator[Backends]:
    found = Backends(tmp_path_factory.mktemp("interop"), server_bin, chat_gguf, embed_gguf)
    try:
        yield found
    finally:
        found.close()
        print("\ninterop measurements:", json.dumps(found.measured, indent=1, sort_keys=True))


@pytest.fixture(scope="session", params=["llama-server", "llama-cpp-python", "litellm"])
def backend(request: pytest.FixtureRequest, backends: Backends) -> Backend:
    return backends.use(request.param)


def runtime(
    tmp_path: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
    *,
    key: str | None = None,
    timeout: float = 600.0,
    max_tokens: int = 64,
) -> Runtime:
    monkeypatch.setenv("INTEROP_KEY", key if key is not None else backend.key)
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        f"  agent.remote: {{plugin: builtin.local_llm, endpoint: '{backend.url}', model: {backend.chat_model}, "
        f"api_key_env: INTEROP_KEY, response_format: probe, fallback: none, max_tokens: {max_tokens}, timeout: {timeout}}}\n",
        encoding="utf-8",
    )
    return Runtime(load_config(tmp_path / "app.yaml"), trace=tmp_path / "trace.jsonl")


def counted(rt: Runtime) -> list[str]:
    """The URLs the agent's HTTP client requests from now on."""
    sent: list[str] = []
    client = rt.agent("agent.remote")._http()  # type: ignore[attr-defined]
    client.event_hooks["request"].append(lambda request: sent.append(str(request.url)))
    return sent


PROMPT = "Pick the colour of grass and say why in a few words."


def test_auto_decides_schema_valid_and_names_the_style(
    tmp_path: Path, backend: Backend, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    with runtime(tmp_path, backend, monkeypatch) as rt:
        sent = counted(rt)
        started = time.monotonic()
        first = rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
        first_s = time.monotonic() - started
        probe_requests = len(sent)
        started = time.monotonic()
        second = rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
        second_s = time.monotonic() - started
    expected = EXPECTED_STYLE[backend.kind]
    for result in (first, second):
        jsonschema.validate(result.submission, DECIDE)
        assert result.meta["structured_output"] == expected
    assert probe_requests == 2 and len(sent) == 3  # probe + call, then the call alone
    probe = first.meta["structured_probe"]
    assert probe["style"] == expected and "structured_probe" not in second.meta
    backends.note(
        backend.kind,
        "decide",
        {
            "style": expected,
            "probe": probe,
            "first_call_s": round(first_s, 2),
            "second_call_s": round(second_s, 2),
            "answer": first.submission,
        },
    )


def test_wrong_key_says_check_api_key_env(
    tmp_path: Path, backend: Backend, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    with runtime(tmp_path, backend, monkeypatch, key="sk-wrong") as rt, pytest.raises(AgentError) as info:
        rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert "check api_key_env INTEROP_KEY" in info.value.hint
    assert "Traceback" not in str(info.value) and len(str(info.value)) < 600
    backends.note(backend.kind, "wrong_key", str(info.value))


def test_deadline_is_kept(
    tmp_path: Path, backend: Backend, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an answer of thousands of tokens: far past 1 s on any machine that runs this suite
    with runtime(tmp_path, backend, monkeypatch, max_tokens=4000) as rt:
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.remote", prompt="Count from 1 to 2000, one number per line.", timeout=1.0)
        elapsed = time.monotonic() - started
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert elapsed < 3.0
    backends.note(backend.kind, "deadline_1s_returned_after_s", round(elapsed, 2))


def test_restart_mid_session(
    tmp_path: Path, backend: Backend, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    with runtime(tmp_path, backend, monkeypatch) as rt:
        before = rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
        backend.chat.stop()
        with pytest.raises(AgentError) as down:
            rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
        backend.chat.start()
        after = rt.call("decide", agent="agent.remote", prompt=PROMPT, schema=DECIDE)
    assert down.value.kind is ErrorKind.TRANSPORT_ERROR
    jsonschema.validate(after.submission, DECIDE)
    assert before.meta["structured_output"] == after.meta["structured_output"] == EXPECTED_STYLE[backend.kind]
    backends.note(
        backend.kind, "restart", {"while_down": str(down.value)[:200], "restart_s": round(backend.chat.started_s, 1)}
    )


def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SHARED / "models" / "all-minilm-l6-v2.reference.json").read_text())
    return data


def test_embeddings_match_the_reference(
    tmp_path: Path, backend: Backend, backends: Backends, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INTEROP_KEY", backend.key)
    items = _reference()["items"][:4]
    decl = EmbedderDecl(name="remote", endpoint=backend.embed_url, model=backend.embed_model, api_key_env="INTEROP_KEY")
    with embedder_from_decl(decl) as embedder:
        vectors = embedder.embed([item["text"] for item in items], "document")
        normalised_here = embedder.normalized_here
    reference = np.asarray([item["vector"] for item in items], dtype=np.float32)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    cosines = (vectors * reference).sum(axis=1)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-4)
    assert cosines.min() > 0.99
    # llama-server normalises (its default); llama-cpp-python does not: auto does it here
    assert normalised_here is (backend.kind != "llama-server")
    monkeypatch.setenv("INTEROP_KEY", "sk-wrong")
    with embedder_from_decl(decl) as embedder, pytest.raises(EmbedServerError) as info:
        embedder.embed(["x"], "document")
    assert "check api_key_env INTEROP_KEY" in info.value.hint
    backends.note(
        backend.kind,
        "embeddings",
        {
            "min_cosine": round(float(cosines.min()), 6),
            "normalised_here": normalised_here,
            "wrong_key": str(info.value),
        },
    )
