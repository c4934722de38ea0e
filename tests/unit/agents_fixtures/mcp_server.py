"""Reference MCP server (official ``mcp`` SDK, MCPServer) with an ``ask`` tool.

    python mcp_server.py stdio
    python mcp_server.py http [PORT]     (0 or absent: any free port)

Over HTTP the server binds 127.0.0.1 itself and prints ``listening <port>`` on stdout
once the socket is bound (no listen-then-close race).

The ``ask`` tool takes the AskRequest as arguments; the prompt picks the behaviour:

    echo (anything else)  structuredContent {"echo", "call_id", "pid"} (+ the same as text)
    envelope              text only: a JSON AskResponse {"submission": {...}, "meta": {...}}
    bare                  text only: a bare JSON submission {"answer": 42}
    rawtext               text only: "not json at all"
    toolerror             isError with the message "the tool exploded"
    empty                 no content at all
    slow:<seconds>        sleep, then echo
    crash                 exit the whole server process (stdio: a plugin crash)
    env:<NAME>            structuredContent {"value": os.environ.get(NAME), "cwd": os.getcwd()}
    stderr:<kib>          write <kib> KiB to stderr, then echo (stdio)

Over HTTP the SDK app is wrapped by a small ASGI router:

    /mcp                  the SDK's streamable HTTP endpoint (stateful, SSE responses)
    /json/mcp             the same SDK server in JSON-response mode
    /auth/mcp             /mcp behind "Authorization: Bearer s3cret-token" (401 otherwise)
    /health               200 "ok" (the test fixture's readiness probe)
    /fault/500            every request: HTTP 500 with a body
    /fault/badjson        every request: 200 application/json that is not JSON
    /fault/version        initialize answers protocolVersion "1999-01-01"
    /fault/echoauth       403 whose body quotes the Authorization header back
    /fault/call500/mcp    the SDK server, but tools/call answers HTTP 500
    /fault/callbadjson/mcp  the SDK server, but tools/call answers unparseable JSON
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

TOKEN = "s3cret-token"


def build_server() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("localllm-test", log_level="WARNING")

    @server.tool(name="ask", description="Answer an AskRequest")
    async def ask(prompt: str, call_id: str = "", verb: str = "ask") -> CallToolResult:
        echo = {"echo": prompt, "call_id": call_id, "pid": os.getpid()}
        if prompt == "envelope":
            body = {"submission": {"answer": "from-envelope"}, "meta": {"model": "fixture"}}
            return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))])
        if prompt == "bare":
            return CallToolResult(content=[TextContent(type="text", text=json.dumps({"answer": 42}))])
        if prompt == "rawtext":
            return CallToolResult(content=[TextContent(type="text", text="not json at all")])
        if prompt == "toolerror":
            return CallToolResult(content=[TextContent(type="text", text="the tool exploded")], is_error=True)
        if prompt == "empty":
            return CallToolResult(content=[])
        if prompt == "crash":
            sys.stderr.write("mcp fixture: crashing on purpose\n")
            sys.stderr.flush()
            os._exit(4)
        if prompt.startswith("slow:"):
            await anyio.sleep(float(prompt.split(":", 1)[1]))
        if prompt.startswith("stderr:"):
            for _ in range(int(prompt.split(":", 1)[1])):
                sys.stderr.write("chatter " * 127 + "\n")
            sys.stderr.flush()
        if prompt.startswith("env:"):
            echo = {"value": os.environ.get(prompt.split(":", 1)[1]), "cwd": os.getcwd()}
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(echo))],
            structured_content=echo,
        )

    return server


def http_app(port: int) -> Any:
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    sse_server = build_server()
    json_server = build_server()
    sse_app = sse_server.streamable_http_app(host="127.0.0.1")
    json_app = json_server.streamable_http_app(host="127.0.0.1", json_response=True)

    async def read_body(receive: Any) -> bytes:
        body = b""
        while True:
            message = await receive()
            body += bytes(message.get("body", b""))
            if not message.get("more_body"):
                return body

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            # Run both SDK lifespans (their session managers) under one server.
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(sse_server.session_manager.run())
                await stack.enter_async_context(json_server.session_manager.run())
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
        path = scope["path"]
        response: Response
        if path == "/health":
            response = PlainTextResponse("ok")
        elif path == "/fault/500":
            response = PlainTextResponse("internal error: database on fire", status_code=500)
        elif path == "/fault/badjson":
            response = Response(b'{"jsonrpc": "2.0", "id": 1, "res', media_type="application/json")
        elif path == "/fault/echoauth":
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            response = PlainTextResponse(f"rejected credentials {auth}", status_code=403)
        elif path == "/fault/version":
            req = json.loads(await read_body(receive))
            if req.get("method") == "initialize":
                response = JSONResponse(
                    {
                        "jsonrpc": "2.0",
                        "id": req["id"],
                        "result": {
                            "protocolVersion": "1999-01-01",
                            "capabilities": {},
                            "serverInfo": {"name": "old", "version": "0"},
                        },
                    }
                )
            else:
                response = Response(status_code=202)
        elif path in ("/fault/call500/mcp", "/fault/callbadjson/mcp"):
            body = await read_body(receive)
            method = json.loads(body).get("method") if body else None
            if method == "tools/call" and path == "/fault/call500/mcp":
                response = PlainTextResponse("tool backend unavailable", status_code=500)
            elif method == "tools/call":
                response = Response(b"<html>proxy error</html>{", media_type="application/json")
            else:
                replayed = False

                async def replay() -> dict[str, Any]:
                    # The body we consumed, once; then the real channel (disconnects).
                    nonlocal replayed
                    if replayed:
                        message: dict[str, Any] = await receive()
                        return message
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}

                await sse_app(dict(scope, path="/mcp", raw_path=b"/mcp"), replay, send)
                return
        elif path == "/auth/mcp":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                response = PlainTextResponse("missing or bad bearer token", status_code=401)
            else:
                await sse_app(dict(scope, path="/mcp", raw_path=b"/mcp"), receive, send)
                return
        elif path == "/json/mcp":
            await json_app(dict(scope, path="/mcp", raw_path=b"/mcp"), receive, send)
            return
        else:
            await sse_app(scope, receive, send)
            return
        await response(scope, receive, send)

    return app


def main() -> int:
    mode = sys.argv[1]
    if mode == "stdio":
        build_server().run("stdio")
        return 0
    import socket

    import uvicorn

    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    print(f"listening {port}", flush=True)
    config = uvicorn.Config(http_app(port), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
