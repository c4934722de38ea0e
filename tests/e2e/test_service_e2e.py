"""``localllm serve`` end to end: the real llama-server, gemma-3-270m and MiniLM, the official ``openai`` client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import psutil
import pytest

from localllm.managed import discovery
from tests.conftest import REPO, pid_gone

pytestmark = pytest.mark.e2e

CHAT = "gemma-3-270m"
EMBED = "all-minilm-l6-v2"
DECIDE = {
    "type": "object",
    "properties": {"route": {"enum": ["billing", "support"]}, "confident": {"type": "boolean"}},
    "required": ["route", "confident"],
    "additionalProperties": False,
}


class Served:
    """A ``localllm serve`` subprocess and how to reach it."""

    def __init__(self, proc: subprocess.Popen[bytes], found: discovery.Discovery, env: dict[str, str]) -> None:
        self.proc = proc
        self.found = found
        self.env = env
        self.token = discovery.read_token(found.token_file)

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.found.url + "/v1", api_key=api_key or self.token, max_retries=0, timeout=120)

    def ps(self) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "localllm", "ps", "--json"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            check=True,
            timeout=30,
        )
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def llama_servers(self) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in children if _is_llama(p)]


def _is_llama(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("llama-server") and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def serve(managed_env: Path, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start ``localllm serve --port 0`` on the e2e cache (the mirror feeds the pinned GGUFs)."""
    started: list[Served] = []
    env = dict(os.environ)

    def start(*extra: str) -> Served:
        log = open(tmp_path / f"serve-{len(started)}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "localllm", "serve", "--port", "0", *extra],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = discovery.read_discovery(managed_env)
            if found is not None and found.pid == proc.pid:
                served = Served(proc, found, env)
                started.append(served)
                return served
            assert proc.poll() is None, (tmp_path / f"serve-{len(started)}.log").read_text()
            time.sleep(0.05)
        proc.kill()
        raise AssertionError("localllm serve did not come up")

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.terminate()
            served.proc.wait(30)


def test_openai_client_chat_stream_json_schema_embeddings_models(serve: Callable[..., Served]) -> None:
    served = serve()
    client = served.client()
    ids = {m.id for m in client.models.list()}
    assert {CHAT, EMBED} <= ids

    reply = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, temperature=0
    )
    assert isinstance(reply.choices[0].message.content, str) and reply.choices[0].message.content.strip()
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=24,
            stream=True,
            temperature=0,
        )
        if c.choices
    ]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces).strip()

    import jsonschema

    from localllm.agents.local_llm import shape_statement

    structured = client.chat.completions.create(  # the prompt the builtin agent would send
        model=CHAT,
        temperature=0,
        max_tokens=128,
        messages=[{"role": "user", "content": shape_statement(DECIDE) + "My invoice is wrong. Route this ticket."}],
        response_format={"type": "json_schema", "json_schema": {"name": "decide", "strict": True, "schema": DECIDE}},
    )
    jsonschema.validate(json.loads(structured.choices[0].message.content or ""), DECIDE)

    models_dir = Path(os.environ["LOCALLLM_TEST_EMBED_GGUF"]).parent  # the reference vectors sit beside it
    reference = json.loads((models_dir / "all-minilm-l6-v2.reference.json").read_text())["items"][:3]
    vectors = client.embeddings.create(model=EMBED, input=[item["text"] for item in reference]).data
    assert [v.index for v in vectors] == [0, 1, 2]
    for item, got in zip(reference, vectors, strict=True):
        vec = np.asarray(got.embedding, dtype=np.float32)
        assert vec.shape == (384,)
        assert float(np.dot(vec, np.asarray(item["vector"])) / np.linalg.norm(vec)) > 0.99  # no prefix added

    models = {m.id: m for m in client.models.list()}
    extra = models[CHAT].model_extra
    assert extra is not None and extra["loaded"] is True

    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="not-the-token").models.list()
    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="not-the-token").chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "hi"}]
        )


_AGENT = textwrap.dedent("""
    import json, sys
    from localllm.loading import load_config
    from localllm.runtime import Runtime
    with Runtime(load_config(sys.argv[1])) as rt:
        result = rt.call("decide", agent="agent.local", prompt="My invoice is wrong. Route it.",
                         schema=sys.argv[2])
    print(json.dumps({"submission": result.submission, "served_by": result.meta.get("served_by")}))
""")


def test_two_agent_processes_share_one_llama_server(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve()
    config = tmp_path / "app.yaml"
    config.write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, model: {CHAT}}}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
    )
    schema = tmp_path / "decide.json"
    schema.write_text(json.dumps(DECIDE))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _AGENT, str(config), str(schema)],
            cwd=REPO,
            env=served.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    peak = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, len(served.llama_servers()))
        own = [c for p in procs if p.poll() is None for c in _children(p.pid) if _is_llama(c)]
        assert own == []  # neither agent process spawned a sidecar of its own
        time.sleep(0.05)
    outputs = [p.communicate(timeout=30) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        answer = json.loads(out)
        assert answer["served_by"] == "service"
        assert answer["submission"]["route"] in ("billing", "support")
    assert peak == 1
    (row,) = served.ps()["models"]
    assert row["id"] == CHAT and row["requests_served"] == 2


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_kill_9_leaves_no_llama_server(serve: Callable[..., Served]) -> None:
    served = serve()
    served.client().embeddings.create(model=EMBED, input=["warm up"])
    (server,) = served.llama_servers()
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait(5)
    # the guarantee is no orphan: the watchdog's SIGTERM (SIGKILL 0.5 s later) ends it in well
    # under a second; 10 s leaves room for a loaded 2-core box, an orphan never goes
    assert pid_gone(server.pid, within=10.0)


def test_keep_alive_unload_is_visible_in_ps(serve: Callable[..., Served]) -> None:
    # 4 s: the first `localllm ps` (a Python start-up) must see the model before it goes, on a
    # loaded box too; the upper bound tells "unloaded after keep-alive" from the 300-s default
    served = serve("--keep-alive", "4s")
    served.client().embeddings.create(model=EMBED, input=["keep me briefly"])
    used = time.monotonic()
    assert [m["id"] for m in served.ps()["models"]] == [EMBED]
    while served.ps()["models"] and time.monotonic() - used < 30:
        time.sleep(0.2)
    gone_after = time.monotonic() - used
    assert served.ps()["models"] == []
    assert 3.5 <= gone_after < 20.0
    assert served.llama_servers() == []


def test_max_models_one_alternating_keeps_one_loaded(serve: Callable[..., Served]) -> None:
    served = serve("--max-models", "1")
    client = served.client()
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], len(served.llama_servers()))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(2):
            reply = client.chat.completions.create(
                model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert reply.choices[0].message.content is not None
            assert len(client.embeddings.create(model=EMBED, input=["x"]).data[0].embedding) == 384
            assert [m["id"] for m in served.ps()["models"]] == [EMBED]
    finally:
        done.set()
        watcher.join()
    assert peak[0] == 1
    events = served.ps()["service"]
    assert events["max_models"] == 1
