"""``subprocess`` transport against real child processes (tests/unit/agents_fixtures/jsonrpc_agent.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from localllm.agents.subprocess import SubprocessAgent
from localllm.config import SubprocessDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import JSONRPC_AGENT, Resources, ask_request, assert_no_leaks, deadline


def make_agent(
    *extra: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    command: str = sys.executable,
    args: tuple[str, ...] | None = None,
) -> SubprocessAgent:
    decl = SubprocessDecl(
        alias="agent.fixer",
        plugin="subprocess",
        command=command,
        args=args if args is not None else (str(JSONRPC_AGENT), *extra),
        env=env or {},
        cwd=cwd,
    )
    return SubprocessAgent(decl)


@pytest.fixture
def agent() -> Iterator[SubprocessAgent]:
    a = make_agent()
    yield a
    a.close()


def answer(
    agent: SubprocessAgent, prompt: str, call_id: str = "0123456789abcdef", seconds: float = 20.0
) -> dict[str, Any]:
    response = agent.ask(ask_request(prompt, call_id), deadline=deadline(seconds))
    assert response.submission is not None
    value = json.loads(response.submission)
    assert isinstance(value, dict)
    return value


def failure(agent: SubprocessAgent, prompt: str, seconds: float = 20.0) -> AgentError:
    with pytest.raises(AgentError) as info:
        agent.ask(ask_request(prompt), deadline=deadline(seconds))
    return info.value


# -- the happy path ---------------------------------------------------------------------


def test_lazy_spawn_round_trip_and_reuse(agent: SubprocessAgent) -> None:
    assert agent.pid is None  # nothing spawned before the first call
    first = agent.ask(ask_request("hello", "aaaaaaaaaaaaaaaa"), deadline=deadline())
    assert json.loads(first.submission or "")["echo"] == "hello"
    assert json.loads(first.submission or "")["call_id"] == "aaaaaaaaaaaaaaaa"
    assert first.meta == {"agent": "jsonrpc_agent"}
    pid = agent.pid
    assert pid is not None
    second = answer(agent, "again")
    assert second["pid"] == pid and second["calls"] == 2


def test_env_is_parent_plus_declaration_and_cwd_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_PARENT", "parent-value")
    a = make_agent(env={"FROM_DECL": "decl-value"}, cwd=tmp_path)
    try:
        assert answer(a, "env:FROM_DECL") == {"value": "decl-value", "cwd": str(tmp_path)}
        assert answer(a, "env:FROM_PARENT")["value"] == "parent-value"
    finally:
        a.close()


def test_stdout_noise_is_skipped_and_logged(agent: SubprocessAgent, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert answer(agent, "noise")["echo"] == "noise"
    assert "debug: thinking about it" in caplog.text
    assert answer(agent, "after")["calls"] == 2  # same process, stream still in sync


NOISY = """
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.write("stray line\\n" * 2000)
    result = {"submission": {"ok": True}}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


def test_stdout_noise_logs_a_few_lines_then_one_count_per_call(caplog: pytest.LogCaptureFixture) -> None:
    """One warning per stray stdout line: 2000 lines made 2000 warnings."""
    a = make_agent(args=("-c", NOISY))
    try:
        with caplog.at_level(logging.WARNING, logger="localllm.agents._child"):
            assert answer(a, "one") == {"ok": True}
            assert answer(a, "two") == {"ok": True}
    finally:
        a.close()
    warnings = [r for r in caplog.records if r.name == "localllm.agents._child" and r.levelno == logging.WARNING]
    assert len(warnings) == 2 * (5 + 1)  # per call: the first five lines, then one count of the rest
    counts = [r.args[1] for r in warnings if isinstance(r.args, tuple) and isinstance(r.args[1], int)]
    assert counts == [1995, 1995]


def test_heavy_stderr_is_drained_not_deadlocked(agent: SubprocessAgent) -> None:
    # 512 KiB of stderr is far beyond a pipe buffer: without a drain thread the child blocks.
    assert answer(agent, "stderr:512")["echo"] == "stderr:512"
    err = failure(agent, "crash")
    assert "panic: something broke in the agent" in err.detail
    assert len(err.detail.encode()) < 1024  # only the tail is quoted


# -- plugin_crash -----------------------------------------------------------------------


def test_crash_before_answer_is_plugin_crash_with_stderr_then_respawn(agent: SubprocessAgent) -> None:
    old = answer(agent, "warm")["pid"]
    err = failure(agent, "crash")
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert "exited before answering" in err.detail
    assert "exit code 3" in err.detail
    assert "panic: something broke in the agent" in err.detail
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
    fresh = answer(agent, "next")
    assert fresh["pid"] != old and fresh["calls"] == 1


FORK_THEN_CRASH = """
import os, sys, time
sys.stdin.readline()
helper = os.fork()
if helper == 0:  # keeps stdout and stderr open
    if sys.argv[2] == "setsid":
        os.setsid()
    time.sleep(60)
    os._exit(0)
open(sys.argv[1], "w").write(str(helper))
sys.stderr.write("fatal\\n")
sys.stderr.flush()
os._exit(3)
"""


@pytest.mark.parametrize("where", ["group", "setsid"])
def test_crash_leaving_a_helper_holding_stdout_is_plugin_crash_and_kills_it(tmp_path: Path, where: str) -> None:
    """The call waited out its whole deadline (deadline_exceeded) while the helper held
    stdout open, and a setsid helper survived as an orphan."""
    pidfile = tmp_path / "helper.pid"
    a = make_agent(args=("-c", FORK_THEN_CRASH, str(pidfile), where))
    try:
        started = time.monotonic()
        err = failure(a, "hello", seconds=30.0)
        elapsed = time.monotonic() - started
    finally:
        a.close()
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert elapsed < 10  # well before the 30 s deadline
    helper, end = int(pidfile.read_text()), time.monotonic() + 5
    while _running(helper) and time.monotonic() < end:
        time.sleep(0.05)  # SIGKILLed: gone once the signal lands
    assert not _running(helper)


def _running(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def test_crash_on_start_is_plugin_crash_with_stderr() -> None:
    a = make_agent("--crash-on-start")
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.PLUGIN_CRASH
        assert "fatal: cannot load model weights" in err.detail
        assert "exit code 2" in err.detail
    finally:
        a.close()


def test_partial_frame_is_plugin_crash(agent: SubprocessAgent) -> None:
    err = failure(agent, "partial")
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert "partial frame" in err.detail and '"resu' in err.detail
    assert answer(agent, "next")["echo"] == "next"


def test_mismatched_id_is_plugin_crash_and_restarts(agent: SubprocessAgent) -> None:
    old = answer(agent, "warm")["pid"]
    err = failure(agent, "wrongid")
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert "does not match request id" in err.detail
    assert answer(agent, "next")["pid"] != old  # desynchronised stream: process replaced


def test_stray_notification_frame_is_plugin_crash(agent: SubprocessAgent) -> None:
    err = failure(agent, "notify")
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert "response id None" in err.detail


@pytest.mark.parametrize("prompt", ["garbage", "deep"])  # deep: was "raised RecursionError"
def test_malformed_frame_is_plugin_crash(agent: SubprocessAgent, prompt: str) -> None:
    err = failure(agent, prompt)
    assert err.kind is ErrorKind.PLUGIN_CRASH
    assert "malformed frame" in err.detail


def test_noise_is_reported_in_crash_detail() -> None:
    a = make_agent("--banner")
    try:
        err = failure(a, "crash")
        assert err.kind is ErrorKind.PLUGIN_CRASH
        assert "stdout noise: jsonrpc_agent ready" in err.detail
    finally:
        a.close()


def test_missing_command_is_plugin_crash_naming_it(tmp_path: Path) -> None:
    a = make_agent(command=str(tmp_path / "no-such-agent"), args=())
    try:
        err = failure(a, "hello")
        assert (err.kind, err.alias) == (ErrorKind.PLUGIN_CRASH, "agent.fixer")
        assert "no-such-agent" in err.detail
        assert err.hint == "check agent_plugins.agent.fixer.command and cwd"
    finally:
        a.close()


def test_secrets_from_env_are_redacted_in_details() -> None:
    secret = "sk-live-0123456789abcdef"
    a = make_agent("--banner", env={"API_KEY": secret})
    try:
        assert secret not in repr(a)
        err = failure(a, "leak:API_KEY")
        assert err.kind is ErrorKind.PLUGIN_CRASH
        assert secret not in str(err)
        assert "auth failed with token ***" in err.detail  # stderr tail, redacted
        assert "token is ***" in err.detail  # stdout noise, redacted
    finally:
        a.close()


# -- transport_error: in-protocol failures keep the process ------------------------------


def test_jsonrpc_error_object_is_transport_error_and_keeps_process(agent: SubprocessAgent) -> None:
    pid = answer(agent, "warm")["pid"]
    err = failure(agent, "rpcerror")
    assert (err.kind, err.alias) == (ErrorKind.TRANSPORT_ERROR, "agent.fixer")
    assert "-32000" in err.detail and "agent refused the task" in err.detail
    assert answer(agent, "next")["pid"] == pid


def test_non_object_result_is_transport_error(agent: SubprocessAgent) -> None:
    err = failure(agent, "badresult")
    assert (err.kind, err.alias) == (ErrorKind.TRANSPORT_ERROR, "agent.fixer")
    assert str(err).startswith("agent: transport_error: agent.fixer: result is not an AskResponse object")


# -- deadline_exceeded ---------------------------------------------------------------------


def test_slow_agent_is_deadline_exceeded_and_killed(agent: SubprocessAgent) -> None:
    pid = answer(agent, "warm")["pid"]
    err = failure(agent, "slow:30", seconds=0.5)
    assert err.kind is ErrorKind.DEADLINE_EXCEEDED
    assert "process killed" in err.detail
    assert not psutil.pid_exists(pid)
    assert answer(agent, "next")["pid"] != pid  # the late answer can never be read


def test_cancel_from_another_thread_kills_the_child(agent: SubprocessAgent) -> None:
    pid = answer(agent, "warm", call_id="1111111111111111")["pid"]
    timer = threading.Timer(0.3, agent.cancel, args=("2222222222222222",))
    timer.start()
    with pytest.raises(AgentError) as info:
        agent.ask(ask_request("hang", "2222222222222222"), deadline=deadline(60))
    timer.join()
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert "cancelled" in info.value.detail
    assert not psutil.pid_exists(pid)


def test_cancel_of_another_call_id_is_ignored(agent: SubprocessAgent) -> None:
    pid = answer(agent, "warm")["pid"]
    agent.cancel("ffffffffffffffff")
    assert answer(agent, "next")["pid"] == pid


def test_deadline_kills_grandchildren_too(tmp_path: Path) -> None:
    # sh stays the parent of python: the kill must reach the whole process group.
    script = f"{sys.executable} {JSONRPC_AGENT}; true"
    before = Resources.now()
    a = make_agent(command="/bin/sh", args=("-c", script))
    try:
        assert answer(a, "warm")["echo"] == "warm"
        err = failure(a, "slow:30", seconds=0.5)
        assert err.kind is ErrorKind.DEADLINE_EXCEEDED
    finally:
        a.close()
    assert_no_leaks(before)


# -- close -----------------------------------------------------------------------------


def test_close_is_graceful_and_idempotent(agent: SubprocessAgent) -> None:
    pid = answer(agent, "warm")["pid"]
    proc = psutil.Process(pid)
    agent.close()
    agent.close()
    assert not proc.is_running()
    err = failure(agent, "after close")
    assert err.kind is ErrorKind.TRANSPORT_ERROR and "closed" in err.detail


@pytest.mark.parametrize("flag", ["--linger", pytest.param("--ignore-term", marks=pytest.mark.slow)])
def test_close_escalates_to_sigterm_and_sigkill(flag: str) -> None:
    before = Resources.now()
    a = make_agent(flag)
    pid = answer(a, "warm")["pid"]
    a.close()
    assert not psutil.pid_exists(pid)
    assert_no_leaks(before)


def test_close_during_a_call_ends_the_call() -> None:
    before = Resources.now()
    a = make_agent()
    answer(a, "warm")
    errors: list[AgentError] = []

    def call() -> None:
        try:
            a.ask(ask_request("hang"), deadline=deadline(60))
        except AgentError as exc:
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.3)
    a.close()
    worker.join(timeout=15)
    assert not worker.is_alive()
    assert [e.kind for e in errors] == [ErrorKind.DEADLINE_EXCEEDED]
    assert_no_leaks(before)


# -- reliability -------------------------------------------------------------------------


def test_200_sequential_calls_then_no_leaks() -> None:
    before = Resources.now()
    a = make_agent()
    try:
        pids = {answer(a, f"seq {i}", call_id=f"{i:016x}")["pid"] for i in range(200)}
        assert len(pids) == 1
    finally:
        a.close()
    assert_no_leaks(before)


def test_32_concurrent_calls_then_no_leaks() -> None:
    before = Resources.now()
    a = make_agent()
    try:
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda i: answer(a, f"par {i}", call_id=f"{i:016x}"), range(32)))
        # each call got its own answer, not a neighbour's
        assert sorted(r["call_id"] for r in results) == sorted(f"{i:016x}" for i in range(32))
        assert all(r["echo"] == f"par {int(r['call_id'], 16)}" for r in results)
    finally:
        a.close()
    assert_no_leaks(before)


def test_plugin_killed_mid_call_costs_exactly_one_plugin_crash() -> None:
    before = Resources.now()
    a = make_agent()
    try:
        pid = answer(a, "warm")["pid"]
        threading.Timer(0.3, os.kill, args=(pid, signal.SIGKILL)).start()
        outcomes: list[str] = []
        for i in range(5):
            try:
                answer(a, "slow:2" if i == 0 else f"after {i}")
                outcomes.append("ok")
            except AgentError as exc:
                outcomes.append(exc.kind.value)
        assert outcomes == ["plugin_crash", "ok", "ok", "ok", "ok"]
    finally:
        a.close()
    assert_no_leaks(before)
