"""Streams that never end a line, or never end: bounded in time, memory, threads and fds
(issue 11 item 16): MCP over HTTP (SSE) and the claude CLI's stdout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localllm.agents import mcp_http
from localllm.agents.claude_cli import ClaudeCliAgent
from localllm.agents.mcp_http import McpHttpAgent
from localllm.config import ClaudeCliDecl, McpHttpDecl
from localllm.errors import AgentError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime
from tests.unit.agents_fixtures.helpers import Resources, ask_request, assert_no_leaks, deadline

MiB = 1 << 20

# A loopback MCP server that answers the handshake and then, for tools/call, opens an SSE
# stream and trickles one byte every 20 ms without ever ending the line (argv[1] "trickle"),
# or sends nothing more at all ("stall").
_TRICKLE_SERVER = textwrap.dedent("""
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        def log_message(self, *a): pass
        def do_POST(self):
            msg = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if "id" not in msg:
                self.send_response(202); self.end_headers(); return
            if msg["method"] == "initialize":
                body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "serverInfo": {"name": "trickle", "version": "0"}}}).encode()
                self.send_response(200); self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body))); self.end_headers()
                self.wfile.write(body); return
            self.send_response(200); self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: "); self.wfile.flush()
            try:
                while True:
                    if sys.argv[1] == "trickle":
                        self.wfile.write(b"x"); self.wfile.flush()
                    time.sleep(0.02)
            except OSError:
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
""")


@pytest.fixture(params=["trickle", "stall"])
def trickle_server(request: pytest.FixtureRequest) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", _TRICKLE_SERVER, request.param], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _config(tmp_path: Path, endpoint: str, timeout: float) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text(f"agent_plugins:\n  agent.mcp: {{plugin: mcp_http, endpoint: '{endpoint}', timeout: {timeout}}}\n")
    return path


def test_sse_trickle_without_newline_ends_at_the_deadline_and_leaks_nothing(
    tmp_path: Path, trickle_server: str
) -> None:
    config = load_config(_config(tmp_path, trickle_server, 1.0))
    before = Resources.now()
    rt = Runtime(config)
    started = time.monotonic()
    with pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.mcp", prompt="hi")
    assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3.0
    try:
        assert_no_leaks(before, settle=3.0)  # the reader thread and its socket ended with the call
    finally:
        rt.close()
    assert_no_leaks(before, settle=3.0)


def test_runtime_close_ends_a_trickling_call_long_before_its_deadline(tmp_path: Path, trickle_server: str) -> None:
    config = load_config(_config(tmp_path, trickle_server, 60.0))
    before = Resources.now()
    rt = Runtime(config)
    outcome: list[AgentError] = []

    def call() -> None:
        try:
            rt.call("ask", agent="agent.mcp", prompt="hi")
        except AgentError as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    started = time.monotonic()
    rt.close()
    caller.join(5.0)
    assert not caller.is_alive()
    assert time.monotonic() - started < 5.0
    assert [e.kind for e in outcome] == [ErrorKind.TRANSPORT_ERROR]
    assert_no_leaks(before, settle=3.0)


def _sse_agent(stream: Iterator[bytes]) -> McpHttpAgent:
    def handler(request: httpx.Request) -> httpx.Response:
        message = json.loads(request.content)
        if "id" not in message:
            return httpx.Response(202)
        if message["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "m", "version": "0"}}
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": message["id"], "result": result})
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    decl = McpHttpDecl(alias="agent.remote", plugin="mcp_http", endpoint="http://mcp.invalid/mcp", tool="ask")
    return McpHttpAgent(decl, transport=httpx.MockTransport(handler))


class _Pulled:
    """An endless stream of 1 MiB chunks that counts how many were read."""

    def __init__(self, head: bytes, chunk: bytes) -> None:
        self.head, self.chunk, self.count = head, chunk, 0

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        while self.count < 200:  # 200 MiB if nobody stops reading
            self.count += 1
            yield self.chunk


@pytest.mark.parametrize("shape", ["one-line", "many-data-lines"])
def test_sse_line_and_event_are_capped_while_reading(shape: str) -> None:
    chunk = b"x" * MiB if shape == "one-line" else (b"x" * (MiB // 4 - 7) + b"\ndata: ") * 4
    stream = _Pulled(b"data: ", chunk)
    agent = _sse_agent(iter(stream))
    tracemalloc.start()
    try:
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=deadline(30))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        agent.close()
    assert stream.count <= mcp_http._MAX_BODY // MiB + 1  # stopped one chunk past the cap
    assert peak < mcp_http._MAX_BODY + 16 * MiB
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    assert str(mcp_http._MAX_BODY) in info.value.detail


def test_sse_split_crlf_and_cr_line_ends_still_frame_events() -> None:
    payload = json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"structuredContent": {"ok": 1}, "content": []}})
    raw = f": hi\r\n\r\ndata: {payload}\r".encode()
    pieces = [raw[:3], raw[3:5], raw[5:-1], raw[-1:], b"\n\r"]  # CRLF split across chunks, then CR only
    agent = _sse_agent(iter(pieces))
    try:
        response = agent.ask(ask_request("hi"), deadline=deadline(10))
        assert json.loads(response.submission or "") == {"ok": 1}
    finally:
        agent.close()


_FLOOD = textwrap.dedent("""
    import sys
    sys.stdin.read()
    block = b"x" * (1 << 20)
    for _ in range(200):
        sys.stdout.buffer.write(block)
    sys.stdout.buffer.write(b'\\n{"type":"result","subtype":"success","is_error":false,"result":"{}"}\\n')
""")


def test_claude_stdout_flood_is_cut_at_the_cap(tmp_path: Path) -> None:
    script = tmp_path / "claude"
    script.write_text(f"#!{sys.executable}\n{_FLOOD}")
    script.chmod(0o755)
    agent = ClaudeCliAgent(ClaudeCliDecl(alias="agent.claude", plugin="builtin.claude_cli", claude_bin=str(script)))
    before = Resources.now()
    tracemalloc.start()
    try:
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=deadline(60))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        agent.close()
    assert peak < 64 * MiB + 16 * MiB  # never the 200 MiB (nor its decoded copies)
    assert info.value.kind is ErrorKind.PLUGIN_CRASH
    assert "67108864" in info.value.detail
    assert_no_leaks(before, settle=3.0)
