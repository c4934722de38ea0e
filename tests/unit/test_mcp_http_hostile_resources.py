"""Attack: hostile MCP servers over real loopback sockets must cost no fd and no thread
after ``close()`` (issue 25c), and a redirect to another origin is never followed.

Each server speaks just enough MCP (initialize with a session id, so the client opens its
standalone GET stream) and then misbehaves: a GET that never sends headers, a POST that
never answers, malformed SSE, a cross-origin 307, an endless line. Fds and threads are
counted before the first server and after the last agent is closed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from localllm.agents.mcp_http import McpHttpAgent
from localllm.config import McpHttpDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import ask_request

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "hostile", "version": "0"}}


def _response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _json(obj: object, **headers: str) -> bytes:
    return _response(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **headers})


Handler = Callable[[socket.socket, str, dict[str, object] | None, threading.Event], None]


class Hostile:
    """A loopback HTTP server: initialize is answered, everything else goes to ``behave``."""

    def __init__(self, behave: Handler, *, port: int = 0) -> None:
        self.behave = behave
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._start(self._serve)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"hostile-{self.port}")
        self._threads.append(thread)
        thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            self._start(self._one, conn)

    def _one(self, conn: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            verb = lines[0].split()[0]
            length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0)
            while len(rest) < length:
                rest += conn.recv(65536)
            body = json.loads(rest) if rest else None
            self.hits += 1
            if verb == "POST" and isinstance(body, dict) and body.get("method") == "initialize":
                conn.sendall(_json({"jsonrpc": "2.0", "id": body["id"], "result": INIT}, **{"Mcp-Session-Id": "s1"}))
            elif verb == "POST" and isinstance(body, dict) and "id" not in body:
                conn.sendall(_response(202))
            elif verb == "DELETE":
                conn.sendall(_response(200))
            else:
                self.behave(conn, verb, body, self._stop)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for thread in self._threads:
            thread.join(5)


def _hang(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
    stop.wait(30)  # accepts, reads, never sends a header


def _get_hangs_post_answers(
    conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event
) -> None:
    if verb == "GET":
        stop.wait(30)
        return
    assert body is not None
    result = {"structuredContent": {"ok": True}, "content": []}
    conn.sendall(_json({"jsonrpc": "2.0", "id": body["id"], "result": result}))


def _malformed_sse(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        b"data: {not json\n\nretry: x\nid: \x00\ndata: [1,2\n\n"
    )


def _endless_line(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: ")
    chunk = b"x" * 65536
    end = time.monotonic() + 30
    while time.monotonic() < end and not stop.is_set():
        conn.sendall(chunk)


@pytest.fixture
def other() -> Iterator[Hostile]:
    server = Hostile(_get_hangs_post_answers)
    yield server
    server.close()


def _agent(url: str) -> McpHttpAgent:
    return McpHttpAgent(McpHttpDecl(alias="agent.remote", plugin="mcp_http", endpoint=url))


def test_hostile_servers_leak_no_fd_and_no_thread(other: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.agents import mcp_http

    monkeypatch.setattr(mcp_http, "_MAX_BODY", 4 * 1024 * 1024)  # the endless line hits the cap quickly

    def redirect(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
        conn.sendall(_response(307, headers={"Location": other.url}))

    # warm up imports and pools outside the count
    warm = Hostile(_get_hangs_post_answers)
    agent = _agent(warm.url)
    agent.ask(ask_request("hi"), deadline=time.monotonic() + 10)
    agent.close()
    warm.close()
    time.sleep(0.2)

    before = _client_side(set())
    outcomes = []
    servers: list[Hostile] = []
    for behave, seconds in (
        (_hang, 1.5),
        (_get_hangs_post_answers, 10),
        (_malformed_sse, 5),
        (redirect, 5),
        (_endless_line, 20),
    ):
        server = Hostile(behave)
        servers.append(server)
        agent = _agent(server.url)
        try:
            agent.ask(ask_request("hi"), deadline=time.monotonic() + seconds)
            outcomes.append("ok")
        except AgentError as exc:
            outcomes.append(exc.kind.value)
        finally:
            agent.close()
    try:
        assert outcomes == ["deadline_exceeded", "ok", "transport_error", "transport_error", "transport_error"]
        assert other.hits == 0  # the cross-origin 307 was not followed
        # the servers still hold their ends open (a hostile server would): the client let go of its own
        ports = {s.port for s in (*servers, other)}
        end = time.monotonic() + 3
        while _client_side(ports) != before and time.monotonic() < end:
            time.sleep(0.05)
        assert _client_side(ports) == before
    finally:
        for server in servers:
            server.close()


def _client_side(ports: set[int]) -> tuple[int, list[str]]:
    """The client's sockets to the hostile servers, and the threads that are not a server's."""
    import psutil

    conns = [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port in ports]
    threads = sorted(t.name for t in threading.enumerate() if not t.name.startswith("hostile-"))
    return len(conns), threads


def test_a_cross_origin_redirect_is_refused_naming_it(other: Hostile) -> None:
    def redirect(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
        conn.sendall(_response(307, headers={"Location": other.url.replace("127.0.0.1", "localhost")}))

    server = Hostile(redirect)
    agent = _agent(server.url)
    try:
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=time.monotonic() + 5)
    finally:
        agent.close()
        server.close()
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "another origin" in info.value.detail
    assert other.hits == 0


def test_a_server_that_binds_a_moment_later_is_reached_within_the_deadline() -> None:
    """§6 mcp_http: the client is opened for the session; a server started beside the
    config that binds ~0.8 s later is reached by a bounded connect retry, not refused."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # the port is free: connecting now is refused
    box: dict[str, Hostile] = {}

    def late() -> None:
        time.sleep(0.8)
        server = Hostile(_get_hangs_post_answers, port=port)
        box["server"] = server

    starter = threading.Thread(target=late)
    starter.start()
    agent = _agent(f"http://127.0.0.1:{port}/mcp")
    try:
        response = agent.ask(ask_request("hi"), deadline=time.monotonic() + 10)
        assert json.loads(response.submission or "") == {"ok": True}
    finally:
        agent.close()
        starter.join()
        box["server"].close()


def test_a_server_that_never_binds_fails_within_the_bounded_retry() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    agent = _agent(f"http://127.0.0.1:{port}/mcp")
    started = time.monotonic()
    try:
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=time.monotonic() + 1.0)
    finally:
        agent.close()
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "cannot connect" in info.value.detail
    assert time.monotonic() - started < 5  # bounded by the deadline, not the retry span


def _three_second_call(behave: Handler) -> tuple[ErrorKind, float]:
    """The error kind of a call with a 3 s deadline against ``behave``, and how long it took."""
    server = Hostile(behave)
    agent = _agent(server.url)
    try:
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=started + 3)
        return info.value.kind, time.monotonic() - started
    finally:
        agent.close()
        server.close()


def test_a_body_byte_just_inside_the_read_timeout_does_not_extend_the_deadline() -> None:
    """httpx's read timeout starts afresh with each read: one byte at 2.9 s then silence
    ended a 3 s call at ~5.9 s. The socket is shut at the deadline now."""

    def trickle(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        if not stop.wait(2.9):
            conn.sendall(b"{")
            stop.wait(30)

    kind, elapsed = _three_second_call(trickle)
    assert kind is ErrorKind.DEADLINE_EXCEEDED
    assert elapsed < 4.5


def test_response_headers_dripped_do_not_extend_the_deadline() -> None:
    """A header line every 0.4 s never trips httpx's read timeout: a 3 s call ran on for
    minutes. The socket the request opened is shut at the deadline now."""

    def drip(conn: socket.socket, verb: str, body: dict[str, object] | None, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for i in range(200):
            if stop.wait(0.4):
                return
            with contextlib.suppress(OSError):
                conn.sendall(f"X-Drip-{i}: x\r\n".encode())

    kind, elapsed = _three_second_call(drip)
    assert kind is ErrorKind.DEADLINE_EXCEEDED
    assert elapsed < 4.5
