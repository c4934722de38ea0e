"""An MCP server built with the official Python SDK, for localllm's interop tests.

Runs under the current ``mcp`` (``MCPServer``, the dev extra) and under ``mcp`` ≤ 1.9
(``FastMCP``, a separate venv: ``make e2e-interop``). Nothing here is localllm's code.

    python py_server.py stdio
    python py_server.py http PORT       (binds 127.0.0.1; prints "listening PORT")

Over HTTP the SDK's own streamable HTTP app (stateful; with an in-memory event store on
SDKs that take one, so responses carry priming events and ids) is served as the SDK
mounts it — FastMCP ≤ 1.9 at ``/mcp/``, answering ``/mcp`` with a 307 — plus
``/redirect/mcp``: a 307 to ``/mcp`` (same origin).

The tool ``ask`` takes the AskRequest as arguments; the prompt picks the behaviour:

    text        text content only: a JSON submission {"answer": "text"}
    toolerror   isError with "the tool exploded"
    ping        pings the client (``send_ping``: the SDK sends it on the GET stream)
                during the call, then answers {"pinged": true}
    elicit      ``ctx.elicit`` (SDK ≥ 1.10); answers {"action": <the client's action>}
    (anything)  structuredContent {"echo", "call_id"} plus the same as text
"""

import json
import socket
import sys
from typing import Any

try:  # mcp ≥ 2
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as Server
    from mcp_types import CallToolResult, TextContent

    NEW = True
except ImportError:  # mcp ≤ 1.x
    from mcp.server.fastmcp import Context  # type: ignore[no-redef, attr-defined]
    from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef, attr-defined]
    from mcp.types import CallToolResult, TextContent  # type: ignore[no-redef]

    NEW = False

from pydantic import BaseModel


class Name(BaseModel):
    name: str


def _text(value: Any) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(value))])


def build() -> Any:
    server = Server("localllm-py-test")

    @server.tool(name="ask", description="Answer an AskRequest")
    async def ask(ctx: Context, prompt: str, call_id: str = "") -> Any:  # type: ignore[type-arg]
        # FastMCP ≤ 1.9 has no structured output and serialises a returned CallToolResult
        # as text: there a value is returned (it becomes a text item) and an error raised.
        if prompt == "toolerror":
            if not NEW:
                raise ValueError("the tool exploded")
            return CallToolResult(content=[TextContent(type="text", text="the tool exploded")], is_error=True)
        if prompt == "text":
            answer: dict[str, Any] = {"answer": "text"}
        elif prompt == "ping":
            await ctx.session.send_ping()
            answer = {"pinged": True}
        elif prompt == "elicit":
            answer = {"action": (await ctx.elicit("Your name?", Name)).action}
        else:
            echo = {"echo": prompt, "call_id": call_id}
            if NEW:
                return CallToolResult(
                    content=[TextContent(type="text", text=json.dumps(echo))], structured_content=echo
                )
            return echo
        return _text(answer) if NEW else answer

    return server


class Events:
    """The SDK's EventStore interface, in memory (mcp ≥ 2 only)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = f"{stream_id}_{len(self.events)}"
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        from mcp.server.streamable_http import EventMessage

        ids = [event[0] for event in self.events]
        if last_event_id not in ids:
            return None
        stream_id = self.events[ids.index(last_event_id)][1]
        for event_id, sid, message in self.events[ids.index(last_event_id) + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def http_app() -> Any:
    from starlette.responses import RedirectResponse

    server = build()
    sdk_app = (
        server.streamable_http_app(host="127.0.0.1", event_store=Events()) if NEW else server.streamable_http_app()
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/redirect/mcp":
            await RedirectResponse("/mcp", status_code=307)(scope, receive, send)
            return
        await sdk_app(scope, receive, send)

    return app


def main() -> int:
    if sys.argv[1] == "stdio":
        build().run("stdio")
        return 0
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[2])))
    print(f"listening {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(http_app(), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
