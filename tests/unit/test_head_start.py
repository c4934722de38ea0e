"""The head start (``localllm/_head_start.py``): a ``run``/``call`` spawns its last server before its imports.

Against the fake llama-server (a real process, behind a wrapper that stamps every real
spawn), through ``python -m localllm`` as a user runs it: the first run records its server;
the next run of the same command line spawns it before the config is even read, and the
command claims it — or, when anything differs (config, environment), stops it and spawns
its own; nothing it spawned outlives it, whatever happens to the command.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm import _head_start, _process
from tests.conftest import pid_gone

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "unit" / "fakes" / "fake_llama_server.py"
DECIDE = {"type": "object", "properties": {"route": {"enum": ["billing", "support"]}}, "required": ["route"]}


class App:
    """A config whose gate's agent is a managed local_llm on the stamping fake server."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        bindir = tmp_path / "bin"
        bindir.mkdir()
        self.server_bin = bindir / "llama-server"
        self.stamps = tmp_path / "spawned-at"
        self.spawn_log = tmp_path / "spawn.jsonl"
        self.server_bin.write_text(
            f'#!/bin/sh\ncase "$*" in *--help*) ;; *) date +%s.%N >> "{self.stamps}" ;; esac\n'
            f'exec "{sys.executable}" "{FAKE}" "$@"\n'
        )
        self.server_bin.chmod(0o755)
        (tmp_path / "tiny.gguf").write_bytes(b"GGUF fake weights")
        (tmp_path / "decide.json").write_text(json.dumps(DECIDE))
        self.config = tmp_path / "app.yaml"
        self.config.write_text(
            "app_id: t\nagent_plugins:\n"
            f"  agent.local: {{plugin: builtin.local_llm, model: '{tmp_path / 'tiny.gguf'}', "
            f"server_bin: '{self.server_bin}', parallel: 1, ctx_size: 256, health_timeout: 30, service: never}}\n"
            "  agent.claude: {plugin: builtin.inprocess}\n"
            "gates:\n  route:\n    invoke: host.agent.decide\n    agent: agent.local\n"
            "    with: {prompt: 'Route: {{ args.ticket }}', schema: decide.json}\n"
        )
        self.plan = Path(os.environ["LOCALLLM_CACHE_DIR"]) / _head_start.PLAN_FILE

    def run(
        self, ticket: str = "refund", *, env: dict[str, str] | None = None, site: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        path = f"{REPO}:{site}" if site is not None else str(REPO)
        return subprocess.run(
            [sys.executable, "-m", "localllm", "run", "route", "-c", str(self.config), "--arg", f"ticket={ticket}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.dir,
            env={**os.environ, "PYTHONPATH": path, "FAKE_LLAMA_SPAWN_LOG": str(self.spawn_log), **(env or {})},
        )

    def spawns(self) -> list[float]:
        return [float(t) for t in self.stamps.read_text().split()] if self.stamps.exists() else []

    def pids(self) -> list[int]:
        if not self.spawn_log.exists():
            return []
        rows = [json.loads(line) for line in self.spawn_log.read_text().splitlines() if line.strip()]
        return [r["pid"] for r in rows if r["event"] == "start"]

    def entries(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = json.loads(self.plan.read_text())["entries"]
        return entries

    def stamp_load_config(self, marker: Path, *, then: str = "") -> Path:
        """A sitecustomize stamping ``load_config``'s entry (and doing ``then`` there)."""
        site = self.dir / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import os, signal, time, localllm.loading as m\n"
            "_orig = m.load_config\n"
            "def stamped(*a, **k):\n"
            f"    open({str(marker)!r}, 'a').write(repr(time.time()) + '\\n')\n"
            f"    {then or 'pass'}\n"
            "    return _orig(*a, **k)\n"
            "m.load_config = stamped\n"
        )
        return site


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(tmp_path)


def test_the_next_run_spawns_its_server_before_reading_the_config_and_uses_it(app: App) -> None:
    umask = os.umask(0o002)  # a group-writable default (user private groups)
    try:
        first = app.run("refund")
    finally:
        os.umask(umask)
    assert first.returncode == 0, first.stderr
    (entry,) = app.entries()
    assert entry["argv"][0] == str(app.server_bin) and entry["files"][0][0] == str(app.config)
    assert "refund" not in app.plan.read_text()  # template values are not the plan's business
    assert stat.S_IMODE(app.plan.stat().st_mode) == 0o600  # it names a program to run
    marker = app.dir / "load-config-at"
    done = app.run("a different ticket", site=app.stamp_load_config(marker))
    assert done.returncode == 0, done.stderr
    spawns = app.spawns()
    assert len(spawns) == 2  # one per run: the second run's head start was claimed, not replaced
    assert spawns[1] < float(marker.read_text())  # spawned before the config was read
    assert all(pid_gone(pid, within=5.0) for pid in app.pids())


def test_a_changed_config_is_not_started_ahead(app: App) -> None:
    assert app.run().returncode == 0
    app.config.write_text(app.config.read_text() + "# edited\n")
    marker = app.dir / "load-config-at"
    done = app.run(site=app.stamp_load_config(marker))
    assert done.returncode == 0, done.stderr
    spawns = app.spawns()
    assert len(spawns) == 2 and spawns[1] > float(marker.read_text())  # after the parse, as without a plan


def test_a_server_unlike_the_one_the_command_wants_is_stopped_and_replaced(app: App) -> None:
    assert app.run().returncode == 0
    assert app.entries()[0]["env_set"]["GOMP_SPINCOUNT"] == "500"
    # the user's own spin count: the server the command computes differs from the plan's
    done = app.run(env={"GOMP_SPINCOUNT": "100"})
    assert done.returncode == 0, done.stderr
    assert len(app.spawns()) == 3  # the first run's, the head start, the command's own
    assert all(pid_gone(pid, within=5.0) for pid in app.pids())
    assert "GOMP_SPINCOUNT" not in app.entries()[0]["env_set"]  # recorded as it is now


def test_a_config_failing_a_later_check_stops_the_claimed_server(app: App) -> None:
    assert app.run().returncode == 0
    (app.dir / "decide.json").write_text(json.dumps({"type": "object", "properties": {"route": {"pattern": "(?=x)"}}}))
    done = app.run()
    assert done.returncode == 2 and "gates.route.with.schema" in done.stderr
    assert len(app.spawns()) == 2
    assert all(pid_gone(pid, within=5.0) for pid in app.pids())


def test_a_command_killed_before_its_config_loads_leaves_no_server(app: App) -> None:
    assert app.run().returncode == 0
    marker = app.dir / "load-config-at"
    site = app.stamp_load_config(marker, then="time.sleep(0.3); os.kill(os.getpid(), signal.SIGKILL)")
    done = app.run(site=site)
    assert done.returncode == -signal.SIGKILL
    assert len(app.spawns()) == 2  # the head start was running when the command died ...
    assert all(pid_gone(pid, within=5.0) for pid in app.pids())  # ... and its watchdog stopped it


def test_an_unclaimed_server_is_stopped_and_its_entry_forgotten(app: App) -> None:
    assert app.run().returncode == 0
    # the same command line now replays a cassette: the gate's agent is never started
    cassette = app.dir / "route.cassette.yaml"
    argv = ["run", "route", "-c", str(app.config), "--arg", "ticket=refund"]
    key = _head_start.line_key([*argv, "--cassette", str(cassette)], str(app.dir))
    entry = {**app.entries()[0], "key": key}
    app.plan.write_text(json.dumps({"version": 1, "entries": [entry]}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_LLAMA_SPAWN_LOG": str(app.spawn_log)}
    subprocess.run(
        [sys.executable, "-m", "localllm", *argv, "--cassette", str(cassette)],
        capture_output=True,
        timeout=120,
        check=False,
        cwd=app.dir,
        env=env,
    )
    assert len(app.spawns()) == 2  # spawned ahead, never claimed ...
    assert all(pid_gone(pid, within=5.0) for pid in app.pids())  # ... stopped ...
    assert app.entries() == []  # ... and not tried again


@pytest.mark.parametrize(
    "how",
    ["group-writable", "malformed", "deeply nested", "too large", "a NUL in a path", "a FIFO", "switched off"],
)
def test_a_plan_that_cannot_be_trusted_or_read_starts_nothing_ahead(app: App, how: str) -> None:
    assert app.run().returncode == 0
    env: dict[str, str] = {}
    if how == "group-writable":
        app.plan.chmod(0o664)
    elif how == "malformed":
        app.plan.write_text('{"version": 1, "entries": [{"key": 1}]')
    elif how == "deeply nested":
        app.plan.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "too large":  # a valid plan padded past the bound: not read
        doc = json.loads(app.plan.read_text())
        doc["padding"] = "x" * (2 << 20)
        app.plan.write_text(json.dumps(doc))
    elif how == "a FIFO":  # opened for reading, a FIFO with no writer would block
        app.plan.unlink()
        os.mkfifo(app.plan, 0o600)
    elif how == "a NUL in a path":
        (entry,) = app.entries()
        entry["files"][1][0] += "\u0000"
        app.plan.write_text(json.dumps({"version": 1, "entries": [entry]}))
        app.plan.chmod(0o600)
    else:
        env["LOCALLLM_NO_HEAD_START"] = "1"
    marker = app.dir / "load-config-at"
    done = app.run(env=env, site=app.stamp_load_config(marker))
    assert done.returncode == 0, done.stderr
    spawns = app.spawns()
    assert len(spawns) == 2 and spawns[1] > float(marker.read_text())


def test_the_line_key_leaves_out_the_calls_content_only() -> None:
    run = ["run", "triage", "-c", "app.yaml", "--arg", "ticket=a", "--json"]
    key = _head_start.line_key(run, "/w")
    assert key is not None
    assert _head_start.line_key(["run", "triage", "-c", "app.yaml", "--arg", "ticket=b", "--json"], "/w") == key
    assert _head_start.line_key(["run", "triage", "-c", "app.yaml", "--arg=ticket=b", "--json"], "/w") != key
    assert _head_start.line_key(["run", "other", "-c", "app.yaml", "--arg", "ticket=a", "--json"], "/w") != key
    assert _head_start.line_key(run, "/elsewhere") != key
    call = ["call", "decide", "--agent", "agent.local", "--prompt", "one"]
    assert _head_start.line_key(call, "/w") == _head_start.line_key([*call[:-1], "two"], "/w")
    for not_a_call in (["check", "app.yaml"], ["run", "triage", "--help"], ["--version"], []):
        assert _head_start.line_key(not_a_call, "/w") is None


def test_a_watchdog_that_cannot_start_leaves_no_server_and_no_open_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_head_start, "_state", _head_start._State())
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "app.yaml"
    config.write_text("app_id: t\n")
    words = ["run", "route", "-c", str(config)]
    _head_start._write_plan(
        [
            {
                "key": _head_start.line_key(words, os.getcwd()),
                "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                "env_set": {},
                "env_unset": [],
                "files": [_head_start._identity(config)],
            }
        ]
    )
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        spawned.append(real_spawn(*args, **kwargs))
        return spawned[-1]

    def no_watchdog(pid: int) -> subprocess.Popen[bytes]:
        raise OSError(24, "Too many open files")

    real_spawn = _process.spawn
    monkeypatch.setattr(_head_start, "spawn", spawn)
    monkeypatch.setattr(_head_start, "arm_watchdog", no_watchdog)
    _head_start.begin(words)
    assert len(spawned) == 1
    assert spawned[0].poll() is not None  # stopped at once
    assert spawned[0].stderr is not None and spawned[0].stderr.closed
    assert _head_start._state.held is None
