"""The first jsonschema import happens before any worker thread starts (issue 10 item 1).

A worker thread's schema→grammar subset check and the calling thread's validator both import
jsonschema on first use; importing it from two threads at once can leave one of them with a
partially initialised module (``cannot import name 'Draft3Validator'``). Only a fresh process
sees a first import, so the route/decide path runs in many of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.test_embed_commands import _wrapper

RUNS = 30


def _server(tmp_path: Path, name: str, args: list[str]) -> Iterator[str]:
    from localllm.managed.server import ManagedServer

    gguf = tmp_path / f"{name}.gguf"
    gguf.write_bytes(b"GGUF")
    with ManagedServer(
        _wrapper(tmp_path), gguf, args=args, parallel=2, ctx_per_slot=512, name=name, health_timeout=30
    ) as server:
        yield server.ensure_ready()


@pytest.fixture
def chat(tmp_path: Path) -> Iterator[str]:
    yield from _server(tmp_path, "chat", [])


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    from localllm.embed.local import embedding_server_args
    from localllm.embed.registry import lookup

    yield from _server(tmp_path, "embed", embedding_server_args(lookup("all-minilm-l6-v2"), 2))


@pytest.fixture
def app(tmp_path: Path, endpoint: str, chat: str) -> Iterator[Path]:
    cfg = tmp_path / "app.yaml"
    cfg.write_text(
        "agent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, endpoint: '{chat}', fallback: none}}\n"
        "embedders:\n"
        f"  docs: {{endpoint: '{endpoint}', model: all-minilm-l6-v2}}\n"
        "intents:\n"
        "  greet: {examples: ['hello there', 'good morning']}\n"
        "  leave: {examples: ['goodbye now', 'see you later']}\n"
        "router: {embedder: docs, agent: agent.local}\n"
    )
    yield cfg


@pytest.mark.slow
def test_route_through_the_decide_tier_in_fresh_processes_never_tracebacks(app: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "localllm", "route", "what's the weather like", "--config", str(app), "--json"]

    def run(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, range(RUNS)))
    bad = [r for r in results if r.returncode not in (0, 1) or "Traceback" in r.stderr or "Error" in r.stderr]
    assert not bad, bad[0].stderr[-2000:]
    assert all(json.loads(r.stdout)["routed_by"] == "llm" for r in results), results[0].stdout


#: run in a fresh process: records which threads are alive when jsonschema is first imported
WATCH = """
import sys, threading
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "jsonschema" and not seen:
            seen.append(sorted(t.name for t in threading.enumerate() if t.name.startswith("localllm-")))
        return None
sys.meta_path.insert(0, Watch())
from localllm.cli import main
code = main(sys.argv[1:])
print("WORKERS", seen, file=sys.stderr)
sys.exit(code)
"""


def test_jsonschema_is_imported_before_the_agent_thread_starts(app: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", WATCH, "route", "what's the weather like", "--config", str(app), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "WORKERS [[]]" in done.stderr, done.stderr[-2000:]
