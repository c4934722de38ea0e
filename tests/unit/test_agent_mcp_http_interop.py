"""``mcp_http`` fixes found against third-party servers (issue 12), each pinned here on
loopback: a scripted server (httpx.MockTransport) for the protocol edges, the SDK
fixture server where a real server shows the bug."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from localllm.agents import _mcp
from localllm.agents.mcp_http import McpHttpAgent
from localllm.config import McpHttpDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import McpHttpServer, Resources, ask_request, assert_no_leaks, deadline

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "scripted", "version": "0"}}


def sse(*events: str) -> httpx.Response:
    return httpx.Response(200, text="".join(events), headers={"content-type": "text/event-stream"})


def message(obj: dict[str, Any], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {json.dumps(obj)}\n\n"


def result(req_id: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "result": {"structuredContent": value, "content": []}}


@dataclass
class Scripted:
    """A streamable HTTP MCP server as a function of each request; records them all."""

    call: Callable[[Scripted, httpx.Request, dict[str, Any]], httpx.Response]
    get: Callable[[Scripted, httpx.Request], httpx.Response] = lambda s, r: httpx.Response(405)
    sessions: int = 0
    requests: list[httpx.Request] = field(default_factory=list)
    posted: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        if request.method == "GET":
            return self.get(self, request)
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        with self.lock:
            self.posted.append(body)
        if body.get("method") == "initialize":
            self.sessions += 1
            return httpx.Response(
                200,
                json={"jsonrpc": "2.0", "id": body["id"], "result": INIT},
                headers={"mcp-session-id": f"s{self.sessions}"},
            )
        if "method" not in body or "id" not in body:
            return httpx.Response(202)  # a notification, or the client's answer to our request
        return self.call(self, request, body)

    def agent(self, endpoint: str = "http://mcp.test/mcp", **extra: Any) -> McpHttpAgent:
        decl = McpHttpDecl(alias="agent.remote", plugin="mcp_http", endpoint=endpoint, **extra)
        return McpHttpAgent(decl, transport=httpx.MockTransport(self.handler))

    def answers(self) -> list[dict[str, Any]]:
        """What the client POSTed in answer to the server's requests."""
        with self.lock:
            return [m for m in self.posted if "method" not in m]


def ask(agent: McpHttpAgent, seconds: float = 10.0) -> Any:
    return json.loads(agent.ask(ask_request("hi"), deadline=deadline(seconds)).submission or "")


# -- SSE: priming events, id, retry, resuming -------------------------------------------------------


def test_priming_event_is_skipped() -> None:
    server = Scripted(lambda s, r, b: sse("id: p0\nretry: 3000\ndata: \n\n", message(result(b["id"], {"ok": 1}), "e1")))
    agent = server.agent()
    try:
        assert ask(agent) == {"ok": 1}
    finally:
        agent.close()


def test_closed_stream_is_resumed_with_get_and_last_event_id_after_retry() -> None:
    pending: list[Any] = []

    def call(s: Scripted, r: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        pending.append(body["id"])
        return sse("id: e1\nretry: 300\ndata: \n\n")  # priming, then the server closes the stream

    def get(s: Scripted, r: httpx.Request) -> httpx.Response:
        if r.headers.get("last-event-id") != "e1":
            return httpx.Response(405)  # the standalone stream: not offered
        return sse(message(result(pending[-1], {"resumed": True}), "e2"))

    server = Scripted(call, get)
    agent = server.agent()
    try:
        started = time.monotonic()
        assert ask(agent) == {"resumed": True}
        waited = time.monotonic() - started
        resumes = [r for r in server.requests if r.method == "GET" and r.headers.get("last-event-id") == "e1"]
        assert len(resumes) == 1
        assert resumes[-1].headers["mcp-session-id"] == "s1" and resumes[-1].headers["accept"] == "text/event-stream"
        assert waited >= 0.3  # the server's retry, not our default
    finally:
        agent.close()


def test_stream_closed_without_an_event_id_cannot_be_resumed() -> None:
    server = Scripted(lambda s, r, b: sse(": nothing\n\n"))
    agent = server.agent()
    try:
        with pytest.raises(AgentError) as info:
            ask(agent)
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "ended without a response" in info.value.detail
        assert not [r for r in server.requests if r.headers.get("last-event-id")]
    finally:
        agent.close()


def test_resuming_past_the_deadline_is_deadline_exceeded() -> None:
    server = Scripted(lambda s, r, b: sse("id: e1\nretry: 5000\ndata: \n\n"))
    agent = server.agent()
    try:
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            ask(agent, seconds=1.0)
        assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED and time.monotonic() - started < 1.5
    finally:
        agent.close()


def test_a_retry_of_5000_digits_is_capped_not_a_crash() -> None:
    """int() of 5000 digits raised ValueError out of ask() (plugin_crash at the runtime)."""
    server = Scripted(lambda s, r, b: sse("id: e1\nretry: " + "9" * 5000 + "\ndata: \n\n"))
    agent = server.agent()
    try:
        with pytest.raises(AgentError) as info:
            ask(agent, seconds=1.0)
        assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED  # the capped wait outlasts the deadline
    finally:
        agent.close()


def test_a_huge_retry_on_the_standalone_stream_keeps_the_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    """``retry: 99999999999999`` made the listener's wait raise OverflowError: the thread
    died with a traceback (printed at the CLI)."""
    crashed: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_type))
    served = threading.Event()

    def get(s: Scripted, r: httpx.Request) -> httpx.Response:
        served.set()
        return sse("retry: 99999999999999\n\n")

    server = Scripted(lambda s, r, b: httpx.Response(200, json=result(b["id"], {"ok": 1})), get)
    before = Resources.now()
    agent = server.agent()
    try:
        assert ask(agent) == {"ok": 1}
        assert served.wait(5)
        time.sleep(0.3)  # the stream has ended; the listener now waits the server's retry
        listeners = [t for t in threading.enumerate() if t.name.startswith("mcp-listen")]
        assert (crashed, len(listeners)) == ([], 1)
    finally:
        agent.close()
    assert_no_leaks(before)  # close() wakes the capped wait


def test_a_huge_error_body_is_read_only_for_its_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500 whose body passed the body cap was read to the cap and reported as "larger
    than", hiding the HTTP status."""
    from localllm.agents import mcp_http

    monkeypatch.setattr(mcp_http, "_MAX_BODY", 1024 * 1024)
    sent: list[int] = []

    def body() -> Iterator[bytes]:
        for _ in range(64):  # 4 MiB
            sent.append(65536)
            yield b"x" * 65536

    server = Scripted(lambda s, r, b: httpx.Response(500, content=body()))
    agent = server.agent()
    try:
        with pytest.raises(AgentError) as info:
            ask(agent)
    finally:
        agent.close()
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "HTTP 500" in info.value.detail
    assert sum(sent) <= 2 * 65536  # the head only


# -- server→client requests -------------------------------------------------------------------------


def _requests_then_result(s: Scripted, r: httpx.Request, body: dict[str, Any]) -> httpx.Response:
    return sse(
        message({"jsonrpc": "2.0", "id": "p1", "method": "ping"}),
        message(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "elicitation/create",
                "params": {
                    "message": "name?",
                    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string", "default": "Ada"}}},
                },
            }
        ),
        message({"jsonrpc": "2.0", "id": 8, "method": "sampling/createMessage", "params": {}}),
        message({"jsonrpc": "2.0", "id": 9, "method": "roots/list"}),
        message(result(body["id"], {"done": True})),
    )


def test_server_requests_on_the_post_stream_are_answered() -> None:
    server = Scripted(_requests_then_result)
    agent = server.agent()
    try:
        assert ask(agent) == {"done": True}
        answers = {a["id"]: a for a in server.answers()}
        assert answers["p1"]["result"] == {}
        assert answers[7]["result"] == {"action": "decline"}
        assert answers[8]["error"]["code"] == answers[9]["error"]["code"] == -32601
        posts = [r for r in server.requests if r.method == "POST" and b'"p1"' in r.content]
        assert posts[0].headers["mcp-session-id"] == "s1"
    finally:
        agent.close()


def test_elicitation_defaults_policy_accepts_a_form_with_defaults() -> None:
    server = Scripted(_requests_then_result)
    agent = server.agent(elicitation="defaults")
    try:
        ask(agent)
        answers = {a["id"]: a for a in server.answers()}
        assert answers[7]["result"] == {"action": "accept", "content": {"name": "Ada"}}
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {
                "requestedSchema": {
                    "type": "object",
                    "properties": {"a": {"type": "string", "default": "x"}, "b": {"type": "integer"}},
                }
            },
            {"action": "accept", "content": {"a": "x"}},
        ),  # b is optional
        (
            {"requestedSchema": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}},
            {"action": "decline"},
        ),  # a required field without a default
        ({"mode": "url", "url": "https://example.test/"}, {"action": "decline"}),
        ({}, {"action": "decline"}),
    ],
)
def test_elicitation_defaults_rules(params: dict[str, Any], expected: dict[str, Any]) -> None:
    asked = {"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "params": params}
    assert _mcp.reply_to_server_request(asked, elicitation="defaults") == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": expected,
    }
    assert _mcp.reply_to_server_request(asked)["result"] == {"action": "decline"}  # type: ignore[index]


def test_server_request_on_the_standalone_get_stream_is_answered() -> None:
    gets: list[int] = []

    def get(s: Scripted, r: httpx.Request) -> httpx.Response:
        gets.append(1)
        if len(gets) == 1:
            return sse(message({"jsonrpc": "2.0", "id": 42, "method": "ping"}, "g1"))
        return httpx.Response(405)

    server = Scripted(lambda s, r, b: httpx.Response(200, json=result(b["id"], {"ok": 1})), get)
    before = Resources.now()
    agent = server.agent()
    try:
        assert ask(agent) == {"ok": 1}
        end = time.monotonic() + 5
        while not server.answers() and time.monotonic() < end:
            time.sleep(0.02)
        assert server.answers() == [{"jsonrpc": "2.0", "id": 42, "result": {}}]
    finally:
        agent.close()
    assert_no_leaks(before)  # the listener thread ends with the agent


@pytest.mark.slow
def test_response_on_another_stream_is_handed_to_its_call() -> None:
    """The conformance suite's sse-retry server sends the pending response on whichever
    GET stream opens first."""
    pending: list[Any] = []
    ready = threading.Event()

    def call(s: Scripted, r: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        pending.append(body["id"])
        ready.set()
        return sse("id: e1\nretry: 200\ndata: \n\n")

    def get(s: Scripted, r: httpx.Request) -> httpx.Response:
        if r.headers.get("last-event-id") is None:
            ready.wait(5)
            return sse(message(result(pending[0], {"via": "standalone"}), "g1"))
        return sse("id: e9\ndata: \n\n")  # the resumed stream: priming only

    server = Scripted(call, get)
    agent = server.agent()
    try:
        assert ask(agent) == {"via": "standalone"}
    finally:
        agent.close()


# -- headers, sessions, redirects ---------------------------------------------------------------------


def test_configured_protocol_headers_lose_to_the_clients(mcp_http_server: McpHttpServer) -> None:
    # The SDK server answers 406 when Accept lacks text/event-stream.
    decl = McpHttpDecl(
        alias="agent.remote",
        plugin="mcp_http",
        endpoint=f"{mcp_http_server.base}/mcp",
        headers={
            "accept": "application/json",
            "content-TYPE": "text/plain",
            "mcp-session-id": "forged",
            "X-Extra": "kept",
        },
    )
    agent = McpHttpAgent(decl)
    try:
        assert ask(agent)["echo"] == "hi"
        assert agent.session_id != "forged"
    finally:
        agent.close()


def test_exactly_one_of_each_protocol_header_is_sent() -> None:
    server = Scripted(lambda s, r, b: httpx.Response(200, json=result(b["id"], {"ok": 1})))
    agent = server.agent(headers={"ACCEPT": "text/html", "Mcp-Protocol-Version": "1999-01-01", "X-Extra": "kept"})
    try:
        ask(agent)
        call = next(r for r in server.requests if r.method == "POST" and b"tools/call" in r.content)
        assert call.headers.get_list("accept") == ["application/json, text/event-stream"]
        assert call.headers.get_list("mcp-protocol-version") == ["2025-11-25"]
        assert call.headers.get_list("content-type") == ["application/json"]
        assert call.headers["x-extra"] == "kept"
    finally:
        agent.close()


@pytest.mark.parametrize("status", [400, 404])
def test_unknown_session_reinitialises_once(status: int) -> None:
    def call(s: Scripted, r: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        if r.headers["mcp-session-id"] != f"s{s.sessions}":
            return httpx.Response(
                status, json={"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": "No valid session ID"}}
            )
        return httpx.Response(200, json=result(body["id"], {"session": s.sessions}))

    server = Scripted(call)
    agent = server.agent()
    try:
        assert ask(agent) == {"session": 1}
        server.sessions += 1  # "restart": the server now only knows a session the client never saw
        assert ask(agent) == {"session": 3}
        assert agent.session_id == "s3"
    finally:
        agent.close()


def test_persistent_400_is_reported_after_one_reinitialise() -> None:
    server = Scripted(lambda s, r, b: httpx.Response(400, text="bad arguments"))
    agent = server.agent()
    try:
        with pytest.raises(AgentError) as info:
            ask(agent)
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "HTTP 400" in info.value.detail
        assert "bad arguments" in info.value.detail and server.sessions == 2
    finally:
        agent.close()


def _redirecting(hops: int, location: Callable[[int], str], status: int = 307) -> Scripted:
    scripted = Scripted(lambda s, r, b: httpx.Response(200, json=result(b["id"], {"path": r.url.path})))
    plain = scripted.handler

    def handler(request: httpx.Request) -> httpx.Response:
        depth = request.url.path.count("/r")
        if depth < hops:
            return httpx.Response(status, headers={"location": location(depth)})
        return plain(request)

    scripted.handler = handler  # type: ignore[method-assign]
    return scripted


@pytest.mark.parametrize("status", [307, 308])
def test_same_origin_redirects_are_followed_with_the_body(status: int) -> None:
    server = _redirecting(3, lambda d: "/r" * (d + 1) + "/mcp", status)
    agent = server.agent(headers={"Authorization": "Bearer t"})
    try:
        assert ask(agent) == {"path": "/r/r/r/mcp"}
        final = [r for r in server.requests if r.url.path == "/r/r/r/mcp" and b"tools/call" in r.content]
        assert final and final[0].headers["authorization"] == "Bearer t"
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("hops", "location", "status", "expected"),
    [
        (4, lambda d: "/r" * (d + 1) + "/mcp", 307, "more than 3 redirects"),
        (1, lambda d: "http://other.test/mcp", 307, "another origin"),
        (1, lambda d: "https://mcp.test/mcp", 308, "another origin"),  # scheme counts
        (1, lambda d: "http://mcp.test:8080/mcp", 307, "another origin"),  # port counts
        (1, lambda d: "/r/mcp", 302, "redirect to"),  # would turn the POST into a GET
    ],
)
def test_other_redirects_are_refused(hops: int, location: Callable[[int], str], status: int, expected: str) -> None:
    server = _redirecting(hops, location, status)
    agent = server.agent()
    try:
        with pytest.raises(AgentError) as info:
            ask(agent)
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and expected in info.value.detail
        assert not [r for r in server.requests if r.url.host == "other.test"]
    finally:
        agent.close()
