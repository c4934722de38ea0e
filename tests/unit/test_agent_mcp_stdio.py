"""``mcp_stdio`` against a real SDK MCP server (and a raw fake for protocol edges) as child processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from localllm.agents import _mcp
from localllm.agents.mcp_stdio import McpStdioAgent
from localllm.config import McpStdioDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import (
    MCP_SERVER,
    MCP_STDIO_FAKE,
    Resources,
    ask_request,
    assert_no_leaks,
    deadline,
    submission_of,
)


def make_agent(
    *,
    script: Path = MCP_SERVER,
    args: tuple[str, ...] = ("stdio",),
    tool: str = "ask",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> McpStdioAgent:
    decl = McpStdioDecl(
        alias="agent.tools.helper",
        plugin="mcp_stdio",
        command=sys.executable,
        args=(str(script), *args),
        env=env or {},
        cwd=cwd,
        tool=tool,
    )
    return McpStdioAgent(decl)


@pytest.fixture(scope="module")
def shared() -> Iterator[McpStdioAgent]:
    """One SDK server for the tests that leave it healthy (its start costs ~0.5 s)."""
    a = make_agent()
    yield a
    a.close()


def failure(agent: McpStdioAgent, prompt: str, seconds: float = 20.0) -> AgentError:
    with pytest.raises(AgentError) as info:
        agent.ask(ask_request(prompt), deadline=deadline(seconds))
    return info.value


# -- protocol and result rules -------------------------------------------------------------


def test_handshake_then_structured_content_is_the_submission(shared: McpStdioAgent) -> None:
    value = submission_of(shared, "hello", "abcdefabcdefabcd")
    assert value["echo"] == "hello" and value["call_id"] == "abcdefabcdefabcd"
    assert shared.protocol_version == _mcp.LATEST
    assert submission_of(shared, "again")["pid"] == value["pid"]  # one process, reused


def test_text_envelope_bare_and_raw_text(shared: McpStdioAgent) -> None:
    envelope = shared.ask(ask_request("envelope"), deadline=deadline())
    assert json.loads(envelope.submission or "") == {"answer": "from-envelope"}
    assert envelope.meta == {"model": "fixture"}
    bare = shared.ask(ask_request("bare"), deadline=deadline())
    assert bare.submission == '{"answer": 42}' and bare.meta is None
    raw = shared.ask(ask_request("rawtext"), deadline=deadline())
    assert raw.submission == "not json at all"  # the runtime reports it as schema_invalid


def test_is_error_is_transport_error_and_keeps_process(shared: McpStdioAgent) -> None:
    err = failure(shared, "toolerror")  # may be this worker's first call: it starts the server
    pid = shared.pid
    assert pid is not None and err.kind is ErrorKind.TRANSPORT_ERROR
    assert "the tool exploded" in err.detail
    err = failure(shared, "empty")
    assert err.kind is ErrorKind.TRANSPORT_ERROR and "no structuredContent" in err.detail
    assert shared.pid == pid


def test_unknown_tool_is_transport_error() -> None:
    a = make_agent(tool="nope")
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.TRANSPORT_ERROR
        assert "nope" in err.detail
    finally:
        a.close()


def test_env_and_cwd(tmp_path: Path) -> None:
    a = make_agent(env={"PLUGIN_DATA": "/data/x"}, cwd=tmp_path)
    try:
        assert submission_of(a, "env:PLUGIN_DATA") == {"value": "/data/x", "cwd": str(tmp_path)}
    finally:
        a.close()


def test_ping_answered_and_notifications_skipped() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=())
    try:
        assert submission_of(a, "hello") == {"ping_answered": True}
    finally:
        a.close()


def test_elicitation_declined_sampling_and_roots_refused() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=("--requests",))
    try:
        replies = submission_of(a, "hello")["replies"]
        assert [r["id"] for r in replies] == ["srv-0", "srv-1", "srv-2"]
        assert replies[0]["result"] == {"action": "decline"}  # even though every field has a default
        assert [r["error"]["code"] for r in replies[1:]] == [-32601, -32601]
    finally:
        a.close()


def test_unsupported_protocol_version_is_transport_error() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=("--version", "1999-01-01"))
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.TRANSPORT_ERROR
        assert "'1999-01-01'" in err.detail and _mcp.LATEST in err.detail
        assert a.pid is None  # useless server not kept
    finally:
        a.close()


def test_older_supported_version_is_accepted() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=("--version", "2024-11-05"))
    try:
        assert submission_of(a, "hello") == {"ping_answered": True}
        assert a.protocol_version == "2024-11-05"
    finally:
        a.close()


def test_jsonrpc_error_is_transport_error() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=("--rpc-error",))
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.TRANSPORT_ERROR
        assert "-32602" in err.detail and "Unknown tool" in err.detail
        assert a.pid is not None
    finally:
        a.close()


def test_stray_response_id_is_plugin_crash() -> None:
    a = make_agent(script=MCP_STDIO_FAKE, args=("--stray",))
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.PLUGIN_CRASH
        assert "does not match request id" in err.detail
        assert a.pid is None
    finally:
        a.close()


# -- crashes and deadlines -----------------------------------------------------------------


def test_crash_is_plugin_crash_then_respawn_and_reinitialise() -> None:
    a = make_agent()
    try:
        old = submission_of(a, "warm")["pid"]
        err = failure(a, "crash")
        assert err.kind is ErrorKind.PLUGIN_CRASH
        assert "exit code 4" in err.detail and "crashing on purpose" in err.detail
        assert submission_of(a, "next")["pid"] != old
    finally:
        a.close()


def test_missing_command_is_plugin_crash(tmp_path: Path) -> None:
    a = McpStdioAgent(McpStdioDecl(alias="agent.p.s", plugin="mcp_stdio", command=str(tmp_path / "nope")))
    try:
        err = failure(a, "hello")
        assert err.kind is ErrorKind.PLUGIN_CRASH and "nope" in err.detail
    finally:
        a.close()


@pytest.mark.slow
def test_slow_tool_is_deadline_exceeded_and_killed() -> None:
    a = make_agent()
    try:
        pid = submission_of(a, "warm")["pid"]
        err = failure(a, "slow:30", seconds=1.0)
        assert err.kind is ErrorKind.DEADLINE_EXCEEDED
        assert not psutil.pid_exists(pid)
        assert submission_of(a, "next")["pid"] != pid
    finally:
        a.close()


def test_stderr_chatter_is_drained(shared: McpStdioAgent) -> None:
    assert submission_of(shared, "stderr:512")["echo"] == "stderr:512"


# -- reliability -----------------------------------------------------------------------------


def test_200_sequential_and_32_concurrent_calls_then_no_leaks() -> None:
    before = Resources.now()
    a = make_agent()
    try:
        pids = {submission_of(a, f"seq {i}", f"{i:016x}")["pid"] for i in range(200)}
        assert len(pids) == 1
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda i: submission_of(a, f"par {i}", f"{i:016x}"), range(32)))
        assert all(r["echo"] == f"par {int(r['call_id'], 16)}" for r in results)
        assert len({r["call_id"] for r in results}) == 32
    finally:
        a.close()
    assert_no_leaks(before)


def test_server_killed_mid_call_costs_exactly_one_plugin_crash() -> None:
    before = Resources.now()
    a = make_agent()
    try:
        pid = submission_of(a, "warm")["pid"]
        threading.Timer(0.3, os.kill, args=(pid, signal.SIGKILL)).start()
        outcomes: list[str] = []
        for i in range(4):
            try:
                submission_of(a, "slow:2" if i == 0 else f"after {i}")
                outcomes.append("ok")
            except AgentError as exc:
                outcomes.append(exc.kind.value)
        assert outcomes == ["plugin_crash", "ok", "ok", "ok"]
    finally:
        a.close()
    assert_no_leaks(before)
