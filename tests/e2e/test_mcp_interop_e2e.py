"""localllm's MCP client against MCP implementations nobody here wrote (issue 12).

Servers (pinned in :mod:`tests.e2e.mcp_interop`, installed by ``make e2e-interop``; each
started once per session, on loopback, offline):

- the official Python SDK, current release (``mcp`` from the dev extra) and 1.9.4 (its
  FastMCP mounts streamable HTTP at ``/mcp/`` and answers ``/mcp`` with a 307, and answers
  400 for an unknown session), running ``mcp_servers/py_server.py``;
- the official TypeScript SDK, running ``mcp_servers/ts_server.mjs`` (unknown session:
  404, and a second instance answering 400 as the SDK's example app does);
- the reference server ``@modelcontextprotocol/server-everything`` (its own tools);
- the conformance suite's client scenarios, with ``tests.e2e.mcp_conformance_client``
  as the client under test.

Over streamable HTTP and stdio: initialize, tools/call, structured and text answers,
``isError``, ping during a call, a declined elicitation, restart (400/404), redirect.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localllm.agents.mcp_http import McpHttpAgent
from localllm.agents.mcp_stdio import McpStdioAgent
from localllm.config import McpHttpDecl, McpStdioDecl
from localllm.errors import AgentError, ErrorKind
from localllm.wire import AskRequest, AskResponse
from tests.e2e import mcp_interop as pins

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PY_SERVER = pins.HERE / "py_server.py"
TS_SERVER = pins.HERE / "ts_server.mjs"
EVERYTHING_JS = pins.package_dir(pins.EVERYTHING) / "dist" / "index.js"
NODE_ENV = {"MCP_SDK_DIR": str(pins.package_dir(pins.SDK))}


@pytest.fixture(scope="session", autouse=True)
def _pins_installed() -> None:
    left = pins.missing()
    assert not left, f"MCP interop pins missing: {', '.join(left)} (run: make e2e-interop)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """One third-party server process on a fixed loopback port (restartable)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: what it answers for a session it does not know (after a restart)
    unknown_session: int = 404
    #: the path answering 307 to the endpoint (same origin), if the server has one
    redirect: str | None = "/redirect/mcp"
    #: prompts of our "ask" tool; None for the everything server (its own tools)
    ours: bool = True
    elicits: bool = True
    pings: bool = True
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        argv = [part.replace("{port}", str(self.port)) for part in self.argv]
        env = {**os.environ, **self.env, "PORT": str(self.port)}
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"{self.name} exited with {self.proc.returncode}"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{self.name} never listened on {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _http_servers() -> list[Served]:
    return [
        Served("python-sdk-current", [sys.executable, str(PY_SERVER), "http", "{port}"]),
        Served(
            "python-sdk-1.9.4",
            [str(pins.old_python()), str(PY_SERVER), "http", "{port}"],
            unknown_session=400,
            redirect=None,
            elicits=False,
        ),
        Served("typescript-sdk", ["node", str(TS_SERVER), "http", "{port}", "404"], NODE_ENV),
        Served("typescript-sdk-400", ["node", str(TS_SERVER), "http", "{port}", "400"], NODE_ENV, unknown_session=400),
        Served(
            "server-everything",
            ["node", str(EVERYTHING_JS), "streamableHttp"],
            unknown_session=400,
            redirect=None,
            ours=False,
            pings=False,
        ),
    ]


HTTP_IDS = [s.name for s in _http_servers()]


@pytest.fixture(scope="session")
def http_servers() -> Iterator[dict[str, Served]]:
    servers = {s.name: s for s in _http_servers()}
    try:
        for server in servers.values():
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def request(prompt: str) -> AskRequest:
    return AskRequest(
        session_id="interop",
        turn=1,
        state_path="main",
        verb="ask",
        prompt=prompt,
        call_id="0123456789abcdef",
        deadline="2030-01-01T00:00:00Z",
    )


def http_agent(endpoint: str, tool: str = "ask", **extra: object) -> McpHttpAgent:
    decl = McpHttpDecl(alias="agent.interop", plugin="mcp_http", endpoint=endpoint, tool=tool, **extra)  # type: ignore[arg-type]
    return McpHttpAgent(decl)


def ask(agent: McpHttpAgent | McpStdioAgent, prompt: str, seconds: float = 30.0) -> AskResponse:
    return agent.ask(request(prompt), deadline=time.monotonic() + seconds)


def value(response: AskResponse) -> object:
    return json.loads(response.submission or "")


# -- streamable HTTP ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", HTTP_IDS)
def test_http_initialize_call_structured_text_and_is_error(http_servers: dict[str, Served], name: str) -> None:
    server = http_servers[name]
    if server.ours:
        agent = http_agent(server.endpoint)
        try:
            assert value(ask(agent, "hello")) == {"echo": "hello", "call_id": "0123456789abcdef"}
            assert agent.protocol_version in ("2025-11-25", "2025-06-18", "2025-03-26")
            assert value(ask(agent, "text")) == {"answer": "text"}
            with pytest.raises(AgentError) as info:
                ask(agent, "toolerror")
            assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "the tool exploded" in info.value.detail
            assert value(ask(agent, "after")) == {"echo": "after", "call_id": "0123456789abcdef"}  # session kept
        finally:
            agent.close()
        return
    text = http_agent(server.endpoint, tool="get-env")  # no arguments: a JSON text answer
    invalid = http_agent(server.endpoint, tool="get-structured-content")  # needs "location"
    try:
        env = value(ask(text, "hello"))
        assert isinstance(env, dict) and env.get("PORT") == str(server.port)
        assert text.protocol_version == "2025-11-25"
        with pytest.raises(AgentError) as info:
            ask(invalid, "hello")
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "location" in info.value.detail
    finally:
        text.close()
        invalid.close()


@pytest.mark.parametrize("name", [s.name for s in _http_servers() if s.pings])
def test_http_ping_during_a_call_is_answered(http_servers: dict[str, Served], name: str) -> None:
    agent = http_agent(http_servers[name].endpoint)
    try:
        started = time.monotonic()
        assert value(ask(agent, "ping", seconds=20)) == {"pinged": True}
        assert time.monotonic() - started < 10  # answered, not waited out
    finally:
        agent.close()


@pytest.mark.parametrize("name", [s.name for s in _http_servers() if s.elicits])
def test_http_elicitation_is_declined(http_servers: dict[str, Served], name: str) -> None:
    server = http_servers[name]
    agent = http_agent(server.endpoint, tool="ask" if server.ours else "trigger-elicitation-request")
    try:
        answer = ask(agent, "elicit", seconds=20)
        if server.ours:
            assert value(answer) == {"action": "decline"}
        else:
            assert "declined" in (answer.submission or "")
    finally:
        agent.close()


@pytest.mark.parametrize("name", HTTP_IDS)
def test_http_restart_mid_session_reinitialises(http_servers: dict[str, Served], name: str) -> None:
    server = http_servers[name]
    tool = "ask" if server.ours else "get-env"
    agent = http_agent(server.endpoint, tool=tool)
    try:
        ask(agent, "before")
        first = agent.session_id
        assert first
        server.restart()  # the new process knows no session: it answers unknown_session
        ask(agent, "after")
        assert agent.session_id and agent.session_id != first
    finally:
        agent.close()


@pytest.mark.parametrize("name", ["python-sdk-1.9.4", "python-sdk-current", "typescript-sdk"])
def test_http_same_origin_redirect_is_followed(http_servers: dict[str, Served], name: str) -> None:
    server = http_servers[name]
    # FastMCP 1.9 answers /mcp itself with a 307 to /mcp/; the others redirect /redirect/mcp.
    endpoint = server.endpoint if server.redirect is None else server.endpoint.replace("/mcp", server.redirect)
    agent = http_agent(endpoint)
    try:
        assert value(ask(agent, "hello")) == {"echo": "hello", "call_id": "0123456789abcdef"}
        assert value(ask(agent, "again")) == {"echo": "again", "call_id": "0123456789abcdef"}
    finally:
        agent.close()


def test_http_redirect_to_another_origin_is_refused(http_servers: dict[str, Served]) -> None:
    server = http_servers["typescript-sdk"]
    agent = http_agent(server.endpoint.replace("/mcp", "/away/mcp"))  # 307 to localhost: another host
    try:
        with pytest.raises(AgentError) as info:
            ask(agent, "hello")
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "another origin" in info.value.detail
    finally:
        agent.close()


def test_http_configured_protocol_headers_lose_to_the_clients(http_servers: dict[str, Served]) -> None:
    # SDK servers answer 406 when Accept lacks text/event-stream: a configured one must not win.
    for name in ("python-sdk-current", "typescript-sdk"):
        agent = http_agent(
            http_servers[name].endpoint,
            headers={"accept": "application/json", "CONTENT-TYPE": "text/plain", "X-Trace": "1"},
        )
        try:
            assert value(ask(agent, "hello")) == {"echo": "hello", "call_id": "0123456789abcdef"}
        finally:
            agent.close()


# -- stdio -----------------------------------------------------------------------------------------


STDIO = {
    "python-sdk-current": [sys.executable, str(PY_SERVER), "stdio"],
    "python-sdk-1.9.4": [str(pins.old_python()), str(PY_SERVER), "stdio"],
    "typescript-sdk": ["node", str(TS_SERVER), "stdio"],
}


def stdio_agent(argv: list[str], tool: str = "ask") -> McpStdioAgent:
    decl = McpStdioDecl(
        alias="agent.interop", plugin="mcp_stdio", command=argv[0], args=tuple(argv[1:]), env=NODE_ENV, tool=tool
    )
    return McpStdioAgent(decl)


@pytest.mark.parametrize("name", list(STDIO))
def test_stdio_call_structured_text_is_error_ping_and_elicitation(name: str) -> None:
    agent = stdio_agent(STDIO[name])
    try:
        assert value(ask(agent, "hello")) == {"echo": "hello", "call_id": "0123456789abcdef"}
        assert value(ask(agent, "text")) == {"answer": "text"}
        with pytest.raises(AgentError) as info:
            ask(agent, "toolerror")
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "the tool exploded" in info.value.detail
        assert value(ask(agent, "ping", seconds=20)) == {"pinged": True}
        if name != "python-sdk-1.9.4":  # ctx.elicit arrived in mcp 1.10
            assert value(ask(agent, "elicit", seconds=20)) == {"action": "decline"}
    finally:
        agent.close()


def test_stdio_server_everything() -> None:
    argv = ["node", str(EVERYTHING_JS), "stdio"]
    text, elicit = stdio_agent(argv, tool="get-env"), stdio_agent(argv, tool="trigger-elicitation-request")
    try:
        env = value(ask(text, "hello"))
        assert isinstance(env, dict) and "MCP_SDK_DIR" in env
        assert text.protocol_version == "2025-11-25"
        assert "declined" in (ask(elicit, "elicit", seconds=20).submission or "")
    finally:
        text.close()
        elicit.close()


# -- the conformance suite's client scenarios -------------------------------------------------------


@pytest.mark.parametrize("scenario", ["initialize", "tools_call", "sse-retry", "elicitation-sep1034-client-defaults"])
def test_conformance_client_scenario(scenario: str, tmp_path: Path) -> None:
    cli = pins.package_dir(pins.CONFORMANCE) / "dist" / "index.js"
    command = f"{sys.executable} -m tests.e2e.mcp_conformance_client"
    done = subprocess.run(
        [str(pins.node22()), str(cli), "client", "--command", command, "--scenario", scenario, "-o", str(tmp_path)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    checks = [c for f in tmp_path.rglob("checks.json") for c in json.loads(f.read_text())]
    verdicts = {c["id"]: c["status"] for c in checks if c["status"] in ("SUCCESS", "FAILURE", "WARNING")}
    assert verdicts and set(verdicts.values()) == {"SUCCESS"}, (verdicts, done.stdout[-2000:])
    assert done.returncode == 0, done.stdout[-2000:]
