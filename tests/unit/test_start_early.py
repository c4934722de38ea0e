"""Starting the managed server while the call is prepared: ``LocalLLMAgent.prepare(wait=False)`` and the CLI.

Against the fake llama-server (a real process): one spawn per start, the start's outcome
(its error included) taken by the first call, and ``localllm run``/``call`` starting the
gate's server before the call is built — but never a server a cassette or selection replaces.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.local_llm import LocalLLMAgent
from localllm.errors import AgentError, ErrorKind
from localllm.loading import load_config
from localllm.managed.server import ManagedServer
from localllm.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "unit" / "fakes" / "fake_llama_server.py"
DECIDE = {
    "type": "object",
    "properties": {"route": {"enum": ["billing", "support"]}},
    "required": ["route"],
}


def write_config(tmp_path: Path, server_bin: Path, model: str | None = None) -> Path:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake weights")
    (tmp_path / "decide.json").write_text(json.dumps(DECIDE))
    path = tmp_path / "app.yaml"
    path.write_text(
        "app_id: t\nagent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, model: '{model or gguf}', server_bin: '{server_bin}', "
        "parallel: 1, ctx_size: 256, health_timeout: 30, service: never}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
        "gates:\n  route:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with: {prompt: 'Route: {{ args.ticket }}', schema: decide.json}\n"
    )
    return path


def starts(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["event"] == "start"]


@pytest.fixture
def spawn_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "spawn.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(path))
    return path


def test_prepare_without_waiting_returns_at_once_and_the_call_uses_that_server(
    tmp_path: Path, server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_LOAD_DELAY", "1.0")
    config = load_config(write_config(tmp_path, server_bin))
    with Runtime(config) as runtime:
        agent = runtime.agent("agent.local")
        assert isinstance(agent, LocalLLMAgent)
        agent.prepare(wait=False)
        agent.prepare(wait=False)  # a second request while starting: still one start
        assert agent._server is None or agent._server.base_url is None  # returned before the load ended
        result = runtime.run_gate("route", {"ticket": "refund"})
        agent.prepare(wait=False)  # started already: nothing to do
    assert result.ok and result.submission == {"route": "billing"}
    assert len(starts(spawn_log)) == 1


def test_a_failed_early_start_is_the_first_calls_error_and_not_retried_by_it(
    tmp_path: Path, server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_MODE", "exit_during_start")
    config = load_config(write_config(tmp_path, server_bin))
    with Runtime(config) as runtime:
        agent = runtime.agent("agent.local")
        assert isinstance(agent, LocalLLMAgent)
        agent.prepare(wait=False)
        with pytest.raises(AgentError) as caught:
            agent.base_url()
        assert caught.value.kind is ErrorKind.TRANSPORT_ERROR
        assert len(starts(spawn_log)) == 1  # the call took the early start's outcome
        with pytest.raises(AgentError):
            runtime.run_gate("route", {"ticket": "refund"})  # a later call starts again
    assert len(starts(spawn_log)) == 2


def test_close_while_starting_early_leaves_no_server(
    tmp_path: Path, server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_LOAD_DELAY", "5")
    config = load_config(write_config(tmp_path, server_bin))
    runtime = Runtime(config)
    agent = runtime.agent("agent.local")
    assert isinstance(agent, LocalLLMAgent)
    agent.prepare(wait=False)
    threading.Event().wait(0.5)
    runtime.close()
    assert agent._starter is not None and not agent._starter.is_alive()
    for row in starts(spawn_log):
        assert subprocess.run(["kill", "-0", str(row["pid"])], capture_output=True, check=False).returncode != 0


def test_close_does_not_wait_forever_for_a_wedged_early_start(
    tmp_path: Path, server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Runtime(load_config(write_config(tmp_path, server_bin)))
    agent = runtime.agent("agent.local")
    assert isinstance(agent, LocalLLMAgent)
    wedged, release = threading.Event(), threading.Event()

    def stuck() -> None:  # a start blocked in a call that does not return
        wedged.set()
        release.wait(120)

    monkeypatch.setattr(agent, "_start_now", stuck)
    agent.prepare(wait=False)
    assert wedged.wait(10)
    closer = threading.Thread(target=runtime.close, daemon=True)
    closer.start()
    closer.join(30)  # generous: without a bound, close() waits for the start forever
    closed = not closer.is_alive()
    release.set()
    assert closed


def test_endpoint_mode_has_nothing_to_start(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n  agent.remote: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9', model: m}\n"
    )
    with Runtime(load_config(tmp_path / "app.yaml")) as runtime:
        agent = runtime.agent("agent.remote")
        assert isinstance(agent, LocalLLMAgent)
        agent.prepare(wait=False)
        assert agent._starter is None


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "localllm", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_run_starts_the_server_before_building_the_call(tmp_path: Path, spawn_log: Path) -> None:
    # The spawn must not wait for the call's own preparation: with the early start the
    # server is spawned before run_gate() even begins (it is stamped on entry).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    server_bin = bindir / "llama-server"
    spawned_at = tmp_path / "spawned-at"
    server_bin.write_text(
        f'#!/bin/sh\ncase "$*" in *--help*) ;; *) date +%s.%N >> "{spawned_at}" ;; esac\n'
        f'exec "{sys.executable}" "{FAKE}" "$@"\n'
    )
    server_bin.chmod(0o755)
    config = write_config(tmp_path, server_bin)
    # a first start of this build: its --help and canary are remembered (not asked in the run)
    with ManagedServer(server_bin, tmp_path / "tiny.gguf", health_timeout=30) as first:
        first.ensure_ready()
    marker = tmp_path / "run-gate-at"
    sitecustomize = tmp_path / "site"
    sitecustomize.mkdir()
    (sitecustomize / "sitecustomize.py").write_text(
        "import time, localllm.runtime as r\n"
        "_orig = r.Runtime.run_gate\n"
        "def run_gate(self, *a, **k):\n"
        f"    open({str(marker)!r}, 'a').write(repr(time.time()) + '\\n')\n"
        "    time.sleep(2.0)  # a slow preparation\n"
        "    return _orig(self, *a, **k)\n"
        "r.Runtime.run_gate = run_gate\n"
    )
    done = _cli(
        "run",
        "route",
        "-c",
        str(config),
        "--arg",
        "ticket=refund",
        "--json",
        env={"PYTHONPATH": f"{REPO}:{sitecustomize}", "FAKE_LLAMA_LOAD_DELAY": "0.5"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["submission"] == {"route": "billing"}
    assert len(starts(spawn_log)) == 2
    spawns = [float(t) for t in spawned_at.read_text().split()]
    run_gate_entered = float(marker.read_text().splitlines()[0])
    assert len(spawns) == 2 and spawns[1] < run_gate_entered + 2.0  # spawned while the call was prepared


def test_run_with_a_cassette_starts_no_server(tmp_path: Path, server_bin: Path, spawn_log: Path) -> None:
    config = write_config(tmp_path, server_bin)
    done = _cli("run", "route", "-c", str(config), "--arg", "ticket=x", "--cassette", str(tmp_path / "none.yaml"))
    assert done.returncode != 0  # the cassette is missing: the call fails ...
    assert starts(spawn_log) == []  # ... and no server was started for the agent it replaces


def _stamping_server(tmp_path: Path) -> tuple[Path, Path]:
    """A llama-server (the fake) that stamps the time of each real spawn, its build's probes remembered."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    server_bin = bindir / "llama-server"
    spawned_at = tmp_path / "spawned-at"
    server_bin.write_text(
        f'#!/bin/sh\ncase "$*" in *--help*) ;; *) date +%s.%N >> "{spawned_at}" ;; esac\n'
        f'exec "{sys.executable}" "{FAKE}" "$@"\n'
    )
    server_bin.chmod(0o755)
    with ManagedServer(server_bin, tmp_path / "tiny.gguf", health_timeout=30) as first:
        (tmp_path / "tiny.gguf").write_bytes(b"GGUF fake weights")
        first.ensure_ready()
    return server_bin, spawned_at


def _stamp_on_entry(tmp_path: Path, module: str, function: str, marker: Path, sleep: float) -> Path:
    """A sitecustomize that stamps (and slows) ``module.function`` on entry."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import time, {module} as m\n"
        f"_orig = m.{function}\n"
        "def stamped(*a, **k):\n"
        f"    open({str(marker)!r}, 'a').write(repr(time.time()) + '\\n')\n"
        f"    time.sleep({sleep})\n"
        "    return _orig(*a, **k)\n"
        f"m.{function} = stamped\n"
    )
    return site


@pytest.mark.parametrize("command", ["run", "call"])
def test_the_server_is_spawned_before_the_configs_schema_checks(tmp_path: Path, spawn_log: Path, command: str) -> None:
    # the early start happens at parse time: the model loads while the schema and grammar
    # checks (jsonschema, the compiled grammar) run
    server_bin, spawned_at = _stamping_server(tmp_path)
    config = write_config(tmp_path, server_bin)
    marker = tmp_path / "checks-at"
    site = _stamp_on_entry(tmp_path, "localllm.loading", "_check_schemas", marker, 1.0)
    argv = (
        ["run", "route", "--arg", "ticket=refund"]
        if command == "run"
        else [
            "call",
            "decide",
            "--agent",
            "agent.local",
            "--prompt",
            "Route: refund",
            "--schema",
            str(tmp_path / "decide.json"),
        ]
    )
    done = _cli(
        *argv, "-c", str(config), "--json", env={"PYTHONPATH": f"{REPO}:{site}", "FAKE_LLAMA_LOAD_DELAY": "0.5"}
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["submission"] == {"route": "billing"}
    assert len(starts(spawn_log)) == 2  # the probing start above, then this command's one
    spawns = [float(t) for t in spawned_at.read_text().split()]
    checks_entered = float(marker.read_text().splitlines()[0])
    assert len(spawns) == 2 and spawns[1] < checks_entered


def test_a_config_failing_a_later_check_stops_the_early_server_and_reports_as_before(
    tmp_path: Path, spawn_log: Path
) -> None:
    # parses cleanly (the early start happens), then the gate's schema is outside what the
    # grammar can enforce: the same exit 2 and problem as `localllm check`, and no server left
    server_bin, _ = _stamping_server(tmp_path)
    config = write_config(tmp_path, server_bin)
    (tmp_path / "decide.json").write_text(
        json.dumps({"type": "object", "properties": {"route": {"type": "string", "pattern": "(?=x)"}}})
    )
    checked = _cli("check", str(config))
    assert checked.returncode == 2, checked.stderr
    marker = tmp_path / "checks-at"
    site = _stamp_on_entry(tmp_path, "localllm.loading", "_check_schemas", marker, 0.5)
    done = _cli("run", "route", "-c", str(config), "--arg", "ticket=x", env={"PYTHONPATH": f"{REPO}:{site}"})
    assert done.returncode == 2
    problem = [line for line in checked.stderr.splitlines() if "gates.route.with.schema" in line]
    assert problem and problem[0] in done.stderr
    rows = starts(spawn_log)
    assert len(rows) == 2  # the early start did spawn ...
    for row in rows:  # ... and nothing survives the command
        assert subprocess.run(["kill", "-0", str(row["pid"])], capture_output=True, check=False).returncode != 0


def test_runtime_adopts_only_an_agent_of_its_own_declaration(tmp_path: Path, server_bin: Path) -> None:
    import dataclasses

    from localllm.config import LocalLLMDecl
    from localllm.errors import CallError

    config = load_config(write_config(tmp_path, server_bin))
    decl = config.agents["agent.local"]
    assert isinstance(decl, LocalLLMDecl)
    other = LocalLLMAgent(dataclasses.replace(decl, parallel=2), base_dir=config.base_dir)
    mine = LocalLLMAgent(decl, base_dir=config.base_dir)
    with Runtime(config) as runtime:
        with pytest.raises(CallError) as caught:
            runtime.adopt_agent("agent.local", other)
        assert caught.value.key == "agent"
        runtime.adopt_agent("agent.local", mine)
        assert runtime.agent("agent.local") is mine
    assert mine._closed  # closed with the Runtime
