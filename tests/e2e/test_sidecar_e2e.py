"""Sidecar lifecycle on the real llama-server with real GGUFs."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from localllm.managed.server import ManagedServer, ServerState
from tests.conftest import pid_gone

pytestmark = pytest.mark.e2e

EMBED_ARGS = ["--embeddings", "--pooling", "mean"]


def _embed(client: httpx.Client, url: str, text: str) -> list[float]:
    response = client.post(url + "/v1/embeddings", json={"input": text})
    assert response.status_code == 200, response.text
    vector: list[float] = response.json()["data"][0]["embedding"]
    return vector


def test_embedding_sidecar_port_zero_request_and_clean_stop(server_bin: Path, embed_gguf: Path) -> None:
    sc = ManagedServer(server_bin, embed_gguf, args=EMBED_ARGS, parallel=1, ctx_per_slot=512, name="embed")
    try:
        url = sc.ensure_ready()
        assert sc.state is ServerState.READY
        argv = sc.argv()
        assert argv[argv.index("--port") + 1] == "0"
        assert "--no-webui" in argv  # this build lists it in --help
        # The bound port came from the server's own "listening on" line.
        announced = re.findall(r"listening on http://127\.0\.0\.1:(\d+)", sc.stderr_tail(200))
        assert url == f"http://127.0.0.1:{announced[-1]}"
        with httpx.Client(trust_env=False, timeout=30.0) as client:
            assert client.get(url + "/health").json() == {"status": "ok"}
            vector = _embed(client, url, "The quick brown fox")
            assert len(vector) == 384
            assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)
            slots = client.get(url + "/props").json()["total_slots"]
            assert slots == 1
        pid = sc.pid
        assert pid is not None
    finally:
        code = sc.stop()
    assert code == 0  # the first SIGTERM was enough: a clean shutdown
    assert sc.state is ServerState.STOPPED and pid_gone(pid, within=0.0)


def test_killed_real_server_is_respawned_on_next_call(server_bin: Path, embed_gguf: Path) -> None:
    sc = ManagedServer(server_bin, embed_gguf, args=EMBED_ARGS, parallel=1, ctx_per_slot=512, name="embed")
    try:
        sc.ensure_ready()
        first = sc.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        detail = sc.crash_detail()
        assert detail is not None and "killed by SIGKILL" in detail
        url = sc.ensure_ready()
        assert sc.pid != first and sc.state is ServerState.READY
        with httpx.Client(trust_env=False, timeout=30.0) as client:
            assert len(_embed(client, url, "after the respawn")) == 384
    finally:
        assert sc.stop() == 0


def test_chat_sidecar_answers_with_parallel_slots(server_bin: Path, chat_gguf: Path) -> None:
    with ManagedServer(server_bin, chat_gguf, parallel=2, ctx_per_slot=1024, threads=2) as sc:
        url = sc.ensure_ready()
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(10.0, read=120.0)) as client:
            props = client.get(url + "/props").json()
            assert props["total_slots"] == 2
            n_ctx = client.get(url + "/v1/models").json()["data"][0]["meta"]["n_ctx"]
            assert n_ctx == 1024  # -c is per-slot x parallel, split evenly across slots
            body = {
                "messages": [{"role": "user", "content": "Say yes or no."}],
                "max_tokens": 64,  # the grammar lets it pretty-print
                "temperature": 0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "submission",
                        "strict": True,
                        "schema": {
                            "type": "object",
                            "properties": {"answer": {"enum": ["yes", "no"]}},
                            "required": ["answer"],
                        },
                    },
                },
            }
            answer = client.post(url + "/v1/chat/completions", json=body).json()
            assert answer["usage"]["completion_tokens"] >= 1
            assert json.loads(answer["choices"][0]["message"]["content"]) in ({"answer": "yes"}, {"answer": "no"})
    assert sc.state is ServerState.STOPPED and sc.returncode == 0


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from localllm.managed.server import ManagedServer

    sc = ManagedServer(Path(sys.argv[1]), Path(sys.argv[2]), args=["--embeddings", "--pooling", "mean"],
                 parallel=1, ctx_per_slot=512)
    sc.ensure_ready()
    print(sc.pid, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_parent_leaves_no_real_server(tmp_path: Path, server_bin: Path, embed_gguf: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(server_bin), str(embed_gguf)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    server_pid = int(child.stdout.readline())
    child.stdout.close()
    assert psutil.Process(server_pid).name().startswith("llama-server")
    child.kill()
    child.wait()
    # no orphan: the watchdog ends it in well under a second; 10 s is room for a loaded box
    assert pid_gone(server_pid, within=10.0)
