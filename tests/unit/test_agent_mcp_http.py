"""``mcp_http`` against a real MCP server (official SDK, streamable HTTP on loopback)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from localllm.agents import _mcp
from localllm.agents.mcp_http import McpHttpAgent, safe_url
from localllm.config import McpHttpDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import (
    McpHttpServer,
    Resources,
    ask_request,
    assert_no_leaks,
    deadline,
    submission_of,
)

TOKEN = "s3cret-token"


def make_agent(
    endpoint: str,
    *,
    headers: dict[str, str] | None = None,
    tool: str = "ask",
    transport: httpx.BaseTransport | None = None,
) -> McpHttpAgent:
    decl = McpHttpDecl(alias="agent.remote", plugin="mcp_http", endpoint=endpoint, tool=tool, headers=headers or {})
    return McpHttpAgent(decl, transport=transport)


@pytest.fixture
def agent(mcp_http_server: McpHttpServer) -> Iterator[McpHttpAgent]:
    a = make_agent(f"{mcp_http_server.base}/mcp")
    yield a
    a.close()


def failure(agent: McpHttpAgent, prompt: str = "hello", seconds: float = 20.0) -> AgentError:
    with pytest.raises(AgentError) as info:
        agent.ask(ask_request(prompt), deadline=deadline(seconds))
    return info.value


# -- protocol ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/mcp", "/json/mcp"], ids=["sse", "json"])
def test_handshake_session_and_structured_content(mcp_http_server: McpHttpServer, path: str) -> None:
    a = make_agent(mcp_http_server.base + path)
    try:
        assert a.session_id is None  # nothing happens before the first call
        value = submission_of(a, "hello", "abcdefabcdefabcd")
        assert value["echo"] == "hello" and value["call_id"] == "abcdefabcdefabcd"
        assert a.protocol_version == _mcp.LATEST
        session = a.session_id
        assert session
        submission_of(a, "again")
        assert a.session_id == session  # one session per agent
    finally:
        a.close()


def test_text_envelope_bare_and_raw_text(agent: McpHttpAgent) -> None:
    envelope = agent.ask(ask_request("envelope"), deadline=deadline())
    assert json.loads(envelope.submission or "") == {"answer": "from-envelope"}
    assert envelope.meta == {"model": "fixture"}
    bare = agent.ask(ask_request("bare"), deadline=deadline())
    assert bare.submission == '{"answer": 42}' and bare.meta is None
    assert agent.ask(ask_request("rawtext"), deadline=deadline()).submission == "not json at all"


def test_close_deletes_the_session(mcp_http_server: McpHttpServer) -> None:
    a = make_agent(f"{mcp_http_server.base}/mcp")
    submission_of(a, "hello")
    session, version = a.session_id, a.protocol_version
    assert session and version
    a.close()
    a.close()  # idempotent
    probe = httpx.post(
        f"{mcp_http_server.base}/mcp",
        json={"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "ask", "arguments": {}}},
        headers={
            "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": session,
            "MCP-Protocol-Version": version,
        },
        timeout=5,
    )
    assert probe.status_code == 404
    assert failure(a).kind is ErrorKind.TRANSPORT_ERROR


def test_headers_are_sent_and_never_leak(mcp_http_server: McpHttpServer) -> None:
    a = make_agent(f"{mcp_http_server.base}/auth/mcp", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        assert submission_of(a, "hello")["echo"] == "hello"
        assert TOKEN not in repr(a) and "Authorization" in repr(a)
    finally:
        a.close()
    leaky = make_agent(f"{mcp_http_server.base}/fault/echoauth", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        err = failure(leaky)
        assert err.kind is ErrorKind.TRANSPORT_ERROR and "HTTP 403" in err.detail
        assert TOKEN not in str(err) and "***" in err.detail
    finally:
        leaky.close()


def test_session_reinitialised_after_server_restart() -> None:
    srv = McpHttpServer()
    srv.start()
    a = make_agent(f"{srv.base}/mcp")
    try:
        first = submission_of(a, "before")
        old_session = a.session_id
        srv.restart()  # same port, every session forgotten: the server answers 404
        second = submission_of(a, "after")
        assert second["echo"] == "after" and second["pid"] != first["pid"]
        assert a.session_id and a.session_id != old_session
    finally:
        a.close()
        srv.stop()


# -- transport_error ---------------------------------------------------------------------------


def test_is_error_is_transport_error(agent: McpHttpAgent) -> None:
    err = failure(agent, "toolerror")
    assert err.kind is ErrorKind.TRANSPORT_ERROR and "the tool exploded" in err.detail
    err = failure(agent, "empty")
    assert err.kind is ErrorKind.TRANSPORT_ERROR and "no structuredContent" in err.detail
    assert submission_of(agent, "still fine")["echo"] == "still fine"


def test_unknown_tool_is_transport_error(mcp_http_server: McpHttpServer) -> None:
    a = make_agent(f"{mcp_http_server.base}/mcp", tool="nope")
    try:
        err = failure(a)
        assert err.kind is ErrorKind.TRANSPORT_ERROR and "nope" in err.detail
    finally:
        a.close()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/fault/500", "HTTP 500"),
        ("/fault/call500/mcp", "HTTP 500"),
        ("/fault/badjson", "unparseable JSON"),
        ("/fault/callbadjson/mcp", "unparseable JSON"),
        ("/fault/version", "'1999-01-01'"),
        ("/auth/mcp", "HTTP 401"),
        ("/no/such/path", "HTTP 404"),
    ],
)
def test_http_and_protocol_failures_are_transport_error(
    mcp_http_server: McpHttpServer, path: str, expected: str
) -> None:
    a = make_agent(mcp_http_server.base + path)
    try:
        err = failure(a)
        assert err.kind is ErrorKind.TRANSPORT_ERROR
        assert expected in err.detail
    finally:
        a.close()


def test_500_body_is_quoted_truncated(mcp_http_server: McpHttpServer) -> None:
    a = make_agent(f"{mcp_http_server.base}/fault/call500/mcp")
    try:
        err = failure(a)
        assert "tool backend unavailable" in err.detail
    finally:
        a.close()


def test_connection_refused_is_transport_error() -> None:
    import socket

    with socket.socket() as s:  # a port that is certainly closed: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        a = make_agent(f"http://user:pw@127.0.0.1:{port}/mcp?token=abc")
        try:
            err = failure(a)
        finally:
            a.close()
    assert err.kind is ErrorKind.TRANSPORT_ERROR
    assert "cannot connect" in err.detail and "agent_plugins.agent.remote.endpoint" in err.hint
    assert "pw" not in err.detail and "token=abc" not in err.detail


# -- deadlines -----------------------------------------------------------------------------------


def test_slow_tool_is_deadline_exceeded_and_session_survives(agent: McpHttpAgent) -> None:
    assert submission_of(agent, "warm")["echo"] == "warm"
    err = failure(agent, "slow:30", seconds=0.7)
    assert err.kind is ErrorKind.DEADLINE_EXCEEDED
    assert submission_of(agent, "next")["echo"] == "next"


def test_cancelled_call_reports_deadline_exceeded(agent: McpHttpAgent) -> None:
    submission_of(agent, "warm")
    timer = threading.Timer(0.2, agent.cancel, args=("2222222222222222",))
    timer.start()
    with pytest.raises(AgentError) as info:
        agent.ask(ask_request("slow:1", "2222222222222222"), deadline=deadline(30))
    timer.join()
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert submission_of(agent, "next", "2222222222222222")["echo"] == "next"  # the mark was cleared


# -- reliability -----------------------------------------------------------------------------------


def test_200_sequential_and_32_concurrent_calls_then_no_leaks(mcp_http_server: McpHttpServer) -> None:
    before = Resources.now()
    a = make_agent(f"{mcp_http_server.base}/mcp")
    try:
        for i in range(200):
            assert submission_of(a, f"seq {i}", f"{i:016x}")["echo"] == f"seq {i}"
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda i: submission_of(a, f"par {i}", f"{i:016x}"), range(32)))
        assert all(r["echo"] == f"par {int(r['call_id'], 16)}" for r in results)
        assert len({r["call_id"] for r in results}) == 32
    finally:
        a.close()
    assert_no_leaks(before)


def test_concurrent_first_calls_share_one_handshake(mcp_http_server: McpHttpServer) -> None:
    a = make_agent(f"{mcp_http_server.base}/mcp")
    try:
        sessions: set[str | None] = set()

        def call(i: int) -> None:
            submission_of(a, f"first {i}", f"{i:016x}")
            sessions.add(a.session_id)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(call, range(8)))
        assert len(sessions) == 1 and None not in sessions
    finally:
        a.close()


def test_server_killed_mid_call_costs_one_error_then_recovers() -> None:
    srv = McpHttpServer()
    srv.start()
    before = Resources.now()
    a = make_agent(f"{srv.base}/mcp")
    try:
        submission_of(a, "warm")
        killer = threading.Timer(0.3, srv.kill)
        killer.start()
        outcomes: list[str] = []
        try:
            submission_of(a, "slow:2")
            outcomes.append("ok")
        except AgentError as exc:
            outcomes.append(exc.kind.value)
        killer.join()
        srv.start()  # back on the same port, sessions forgotten
        for i in range(3):
            submission_of(a, f"after {i}")
            outcomes.append("ok")
        assert outcomes == ["transport_error", "ok", "ok", "ok"]
    finally:
        a.close()
        srv.stop()
    assert_no_leaks(before)


# -- pure client logic (httpx.MockTransport) ------------------------------------------------------


def _sse_transport(body: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        message = json.loads(request.content)
        if "id" not in message:
            return httpx.Response(202)
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "m", "version": "0"}}
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": message["id"], "result": result})
        assert request.headers["mcp-protocol-version"] == "2025-06-18"
        assert request.headers["accept"] == "application/json, text/event-stream"
        text = body.replace("$ID", str(message["id"]))
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def test_sse_skips_notifications_comments_and_other_ids_and_joins_data_lines() -> None:
    body = (
        ": keep-alive\n\n"
        'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
        'data: {"jsonrpc":"2.0","id":999,"result":{}}\n\n'
        "event: other\ndata: not json but not a message event\n\n"
        'id: 7\ndata: {"jsonrpc":"2.0","id":$ID,\ndata: "result":{"structuredContent":{"ok":true},"content":[]}}\n\n'
    )
    a = make_agent("http://mcp.invalid/mcp", transport=_sse_transport(body))
    try:
        response = a.ask(ask_request("hi"), deadline=deadline())
        assert json.loads(response.submission or "") == {"ok": True}
        assert a.protocol_version == "2025-06-18"
    finally:
        a.close()


def test_sse_stream_ending_without_response_is_transport_error() -> None:
    body = 'data: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\n\n'
    a = make_agent("http://mcp.invalid/mcp", transport=_sse_transport(body))
    try:
        err = failure(a)
        assert err.kind is ErrorKind.TRANSPORT_ERROR and "ended without a response" in err.detail
    finally:
        a.close()


def test_unexpected_content_type_is_transport_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>login</html>", headers={"content-type": "text/html"})

    a = make_agent("http://mcp.invalid/mcp", transport=httpx.MockTransport(handler))
    try:
        err = failure(a)
        assert err.kind is ErrorKind.TRANSPORT_ERROR and "text/html" in err.detail
    finally:
        a.close()


def test_safe_url_drops_credentials_query_and_fragment() -> None:
    assert safe_url("https://u:p@host.example:8443/mcp?key=1#x") == "https://host.example:8443/mcp"
