"""A raw MCP stdio server (no SDK) for protocol edges the SDK server never produces.

    --version V     answer initialize with protocolVersion V (default: the client's)
    --stray         answer tools/call with the wrong id
    --rpc-error     answer tools/call with a JSON-RPC error object
    --requests      tools/call sends elicitation/create, sampling/createMessage and
                    roots/list, then answers structuredContent {"replies": [each reply]}

By default tools/call first sends a log notification and a ``ping`` request, checks the
client's reply to the ping, then answers structuredContent {"ping_answered": bool}.
"""

from __future__ import annotations

import json
import sys


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    args = sys.argv[1:]
    forced = args[args.index("--version") + 1] if "--version" in args else None
    for line in sys.stdin:
        msg = json.loads(line)
        method = msg.get("method")
        if method == "initialize":
            version = forced or msg["params"]["protocolVersion"]
            send(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "result": {
                        "protocolVersion": version,
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "raw-fake", "version": "0"},
                    },
                }
            )
        elif method == "notifications/initialized":
            continue
        elif method == "tools/call":
            rid = msg["id"]
            if "--stray" in args:
                send({"jsonrpc": "2.0", "id": rid + 7, "result": {"content": []}})
                continue
            if "--rpc-error" in args:
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "Unknown tool: ask"}})
                continue
            if "--requests" in args:
                replies = []
                for n, asked in enumerate(("elicitation/create", "sampling/createMessage", "roots/list")):
                    send(
                        {
                            "jsonrpc": "2.0",
                            "id": f"srv-{n}",
                            "method": asked,
                            "params": {
                                "message": "Your name?",
                                "requestedSchema": {
                                    "type": "object",
                                    "properties": {"name": {"type": "string", "default": "x"}},
                                },
                            },
                        }
                    )
                    replies.append(json.loads(sys.stdin.readline()))
                send(
                    {"jsonrpc": "2.0", "id": rid, "result": {"content": [], "structuredContent": {"replies": replies}}}
                )
                continue
            send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
            send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
            reply = json.loads(sys.stdin.readline())
            ok = reply.get("id") == "srv-1" and reply.get("result") == {}
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "content": [{"type": "text", "text": "ignored"}],
                        "structuredContent": {"ping_answered": ok},
                    },
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
