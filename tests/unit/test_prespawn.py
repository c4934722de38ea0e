"""``localllm run``'s head start (``localllm.managed.prespawn``) against the fake llama-server.

A run whose early agent spawns its own server writes a plan; the next run of the same
command starts that server before its config is parsed and the loaded config adopts it.
Never trusted: a stale, corrupt or mismatching plan costs the head start, never the
answer, and no server it started is left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.managed import prespawn
from tests.conftest import pid_gone

SCHEMA = {
    "type": "object",
    "properties": {"route": {"type": "string", "enum": ["billing", "other"]}},
    "required": ["route"],
    "additionalProperties": False,
}


@pytest.fixture
def app(tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(tmp_path / "spawn.jsonl"))
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF fake weights")
    (tmp_path / "route.json").write_text(json.dumps(SCHEMA))
    cfg = tmp_path / "app.yaml"
    cfg.write_text(
        "app_id: t\nagent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, model: tiny.gguf, server_bin: '{server_bin}', "
        "parallel: 2, ctx_size: 512, health_timeout: 30}\n"
        "gates:\n  route:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with:\n      prompt: 'Route: {{ args.text }}'\n      schema: route.json\n"
    )
    return cfg


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every server process started, planned or not (the fake may be stopped
    before it logs anything)."""
    from localllm.managed import server

    seen: list[tuple[int, list[str]]] = []
    real = server._Process.__init__

    def recording_init(self: Any, argv: list[str], *args: Any, **kwargs: Any) -> None:
        real(self, argv, *args, **kwargs)
        seen.append((self.pid, list(argv)))

    monkeypatch.setattr(server._Process, "__init__", recording_init)
    return seen


@pytest.fixture
def adopted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per spawn of a server: True when it was the planned one, adopted."""
    seen: list[bool] = []
    real = prespawn.take

    def recording_take(argv: list[str], env: dict[str, str]) -> Any:
        proc = real(argv, env)
        seen.append(proc is not None)
        return proc

    monkeypatch.setattr(prespawn, "take", recording_take)
    return seen


def run(cfg: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["run", "route", "-c", str(cfg), "--arg", "text=my invoice is wrong", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["submission"]["route"] in ("billing", "other")
    return doc


def started(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "spawn.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [row for row in rows if row["event"] == "start"]


def assert_all_gone(tmp_path: Path) -> None:
    for row in started(tmp_path):
        assert pid_gone(row["pid"], within=5.0), f"server {row['pid']} outlived the run"


def plan_of(cfg: Path) -> Path:
    return prespawn.plan_file(cfg, "run:route")


def test_the_second_run_adopts_the_server_its_plan_started(
    tmp_path: Path, app: Path, adopted: list[bool], capsys: pytest.CaptureFixture[str]
) -> None:
    run(app, capsys)
    plan = json.loads(plan_of(app).read_text())
    assert plan["target"] == "run:route" and plan["argv"][plan["argv"].index("--port") + 1] == "0"
    assert plan["model"]["path"] == str(tmp_path / "tiny.gguf")
    run(app, capsys)
    assert adopted == [False, True]
    assert len(started(tmp_path)) == 2  # one server per run: the second started from the plan
    assert_all_gone(tmp_path)


@pytest.mark.parametrize("change", ["config", "model", "environment", "corrupt", "not-an-object", "version"])
def test_a_stale_or_corrupt_plan_is_ignored_and_rewritten(
    app: Path,
    adopted: list[bool],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    tmp_path = app.parent
    run(app, capsys)
    path = plan_of(app)
    if change == "config":
        app.write_text(app.read_text() + "# edited\n")
    elif change == "model":
        (tmp_path / "tiny.gguf").write_bytes(b"GGUF other fake weights")
    elif change == "environment":
        monkeypatch.setenv("SOMETHING_NEW", "1")
    elif change == "corrupt":
        path.write_text('{"format": 1, "argv": [')
    elif change == "not-an-object":
        path.write_text("[1, 2]")
    else:
        plan = json.loads(path.read_text())
        path.write_text(json.dumps({**plan, "localllm": "0.0.0-older"}))
    run(app, capsys)
    assert adopted == [False, False]
    assert len(started(tmp_path)) == 2  # nothing started from the plan
    rewritten = json.loads(path.read_text())
    assert rewritten["config"]["size"] == app.stat().st_size
    assert rewritten["model"]["size"] == (tmp_path / "tiny.gguf").stat().st_size
    assert_all_gone(tmp_path)


def test_a_planned_server_the_config_does_not_ask_for_is_stopped(
    tmp_path: Path,
    app: Path,
    adopted: list[bool],
    spawned: list[tuple[int, list[str]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A plan whose argv is not what the loaded config asks (same inputs on record, as if
    the plan had been tampered with): its server starts, is refused, and is stopped."""
    run(app, capsys)
    path = plan_of(app)
    plan = json.loads(path.read_text())
    argv = plan["argv"]
    argv[argv.index("--parallel") + 1] = "3"
    path.write_text(json.dumps(plan))
    run(app, capsys)
    assert adopted == [False, False]
    assert len(spawned) == 3  # run 1, the planned one (refused), run 2's own
    assert spawned[1][1][spawned[1][1].index("--parallel") + 1] == "3"
    assert all(pid_gone(pid, within=5.0) for pid, _ in spawned)
    assert_all_gone(tmp_path)


def test_a_planned_server_is_stopped_when_the_config_fails(
    tmp_path: Path, app: Path, spawned: list[tuple[int, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The config file is unchanged (the plan holds) but a file it names fails a load-time
    check: the planned server, started at once, is stopped with the error."""
    run(app, capsys)
    (tmp_path / "route.json").write_text("{not json")
    assert main(["run", "route", "-c", str(app), "--arg", "text=x", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["ok"] is False
    assert len(spawned) == 2
    assert all(pid_gone(pid, within=5.0) for pid, _ in spawned)
    assert_all_gone(tmp_path)


def test_a_planned_server_for_a_gate_that_no_longer_asks_it_is_stopped(
    tmp_path: Path, app: Path, spawned: list[tuple[int, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate now goes to an in-process agent: no early start, so the planned server
    is stopped as soon as the config parses. (Same config file identity: the plan is
    copied over to the edited file's key to force the case.)"""
    run(app, capsys)
    plan = json.loads(plan_of(app).read_text())
    edited = app.read_text().replace("    agent: agent.local\n", "    agent: agent.other\n")
    edited = edited.replace("gates:", "  agent.other: {plugin: builtin.inprocess}\ngates:")
    app.write_text(edited)
    plan["config"] = prespawn._identity(app)  # as if the plan matched the edited file
    plan_of(app).write_text(json.dumps(plan))
    main(["run", "route", "-c", str(app), "--arg", "text=x", "--json"])
    capsys.readouterr()
    assert len(spawned) == 2  # run 1's server, then the planned one, refused at parse time
    assert all(pid_gone(pid, within=5.0) for pid, _ in spawned)


def test_start_and_discard_directly(
    tmp_path: Path, app: Path, spawned: list[tuple[int, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    run(app, capsys)
    assert prespawn.start(app, "run:route") is True
    pid = spawned[-1][0]
    assert len(spawned) == 2 and not pid_gone(pid)
    prespawn.discard()
    assert pid_gone(pid, within=5.0)
    assert prespawn.start(app, "run:other-gate") is False  # no plan for that target
    assert prespawn.start(tmp_path / "missing.yaml", "run:route") is False
    prespawn.discard()


def test_a_server_with_its_own_environment_is_never_planned(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API key lives in the server's environment: nothing of it may reach a plan file."""
    from localllm.managed.server import ManagedServer

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF fake")
    cfg = tmp_path / "x.yaml"
    cfg.write_text("app_id: x\n")
    assert prespawn.start(cfg, "run:g") is False  # arms this process's plan, like a run does
    with ManagedServer(server_bin, model, api_key="sekrit", health_timeout=30.0) as sc:
        sc.ensure_ready()
    assert not prespawn.plan_file(cfg, "run:g").exists()
    assert not any(b"sekrit" in p.read_bytes() for p in prespawn.plan_file(cfg, "run:g").parent.glob("*"))
    prespawn.discard()
    assert os.environ.get("LLAMA_API_KEY") is None
