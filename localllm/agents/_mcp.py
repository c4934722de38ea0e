"""The MCP client protocol shared by ``mcp_http`` and ``mcp_stdio`` (transport-free).

What a localllm agent call is in MCP terms: ``initialize`` (we offer :data:`LATEST` and
accept any version the server answers from the transport's supported list), the
``notifications/initialized`` notification, then one ``tools/call`` per agent call with
``name`` = the declared tool and ``arguments`` = the AskRequest JSON.

How a tool result becomes an AskResponse (:func:`answer_from_tool_result`):

1. ``isError: true`` → ``transport_error`` quoting the tool's text.
2. ``structuredContent`` when present, else the first ``text`` content item parsed as JSON.
3. That value is an *AskResponse envelope* when it is an object that has a ``submission``
   key and no keys besides ``submission``, ``meta`` and ``sub_events``; anything else is
   the *bare submission*. A plain MCP tool (``return {"answer": 42}``) and a tool that
   returns a whole AskResponse both work. The one ambiguous case — a submission whose
   schema is exactly ``{"submission": …}`` — is read as an envelope; wrap it in one.
4. A text item that is not JSON is passed through as the raw submission text, so the
   runtime reports it as ``schema_invalid`` with the parse error (contract §5) instead of
   the transport hiding it. No structured content and no text item → ``transport_error``.
"""

from __future__ import annotations

import json
from typing import Any

from localllm._version import __version__
from localllm.errors import AgentError, ErrorKind, truncate_detail
from localllm.wire import AskRequest, AskResponse

#: newest first; streamable HTTP exists since 2025-03-26
HTTP_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
#: stdio has been the same since the first revision
STDIO_VERSIONS = (*HTTP_VERSIONS, "2024-11-05")
LATEST = HTTP_VERSIONS[0]

_ENVELOPE_KEYS = frozenset({"submission", "meta", "sub_events"})
# JSON-RPC "method not found", for server→client requests we do not serve
_METHOD_NOT_FOUND = -32601


def request(req_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method}


def initialize_request(req_id: int) -> dict[str, Any]:
    """``initialize`` offering :data:`LATEST`. The one capability we declare is
    ``elicitation`` (form): a server may ask, and gets a clean decline rather than an error
    (see :func:`reply_to_server_request`)."""
    return request(
        req_id,
        "initialize",
        {
            "protocolVersion": LATEST,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "localllm", "version": __version__},
        },
    )


def initialized_notification() -> dict[str, Any]:
    return notification("notifications/initialized")


def tools_call_request(req_id: int, tool: str, ask: AskRequest) -> dict[str, Any]:
    return request(req_id, "tools/call", {"name": tool, "arguments": ask.to_json()})


def is_response(message: dict[str, Any]) -> bool:
    """A response (``result`` or ``error``) rather than a request or notification."""
    return "method" not in message and ("result" in message or "error" in message)


def reply_to_server_request(message: dict[str, Any], *, elicitation: str = "decline") -> dict[str, Any] | None:
    """Our answer to a server→client message (``None`` for a notification).

    ``ping`` → ``{}`` (MUST be answered). ``elicitation/create`` → ``{"action": "decline"}``;
    with ``elicitation="defaults"`` a form whose every required field has a ``default`` is
    accepted with the defaults (the form submitted as pre-filled, SEP-1034), any other
    request declined. Anything else (sampling, roots, ...) → JSON-RPC "method not found":
    we declare no such capability.
    """
    if "method" not in message or "id" not in message:
        return None
    method = message["method"]
    if method == "ping":
        return {"jsonrpc": "2.0", "id": message["id"], "result": {}}
    if method == "elicitation/create":
        params = message.get("params")
        content = _form_defaults(params) if elicitation == "defaults" and isinstance(params, dict) else None
        result: dict[str, Any] = {"action": "decline"} if content is None else {"action": "accept", "content": content}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}
    return {
        "jsonrpc": "2.0",
        "id": message["id"],
        "error": {"code": _METHOD_NOT_FOUND, "message": f"localllm does not serve {method}"},
    }


def _form_defaults(params: dict[str, Any]) -> dict[str, Any] | None:
    """The defaults of a form elicitation, or ``None`` if a required field has none."""
    if params.get("mode", "form") != "form":
        return None
    schema = params.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return None
    content = {
        name: spec["default"] for name, spec in properties.items() if isinstance(spec, dict) and "default" in spec
    }
    required = schema.get("required") if isinstance(schema, dict) else None
    if isinstance(required, list) and any(name not in content for name in required):
        return None
    return content


def jsonrpc_error_text(error: Any) -> str:
    """A JSON-RPC error object as one line: ``JSON-RPC error <code>: <message>``."""
    if isinstance(error, dict):
        return f"JSON-RPC error {error.get('code')!r}: {error.get('message')!s}"
    return f"JSON-RPC error {error!r}"


def result_of(message: dict[str, Any], *, alias: str, what: str) -> Any:
    """The ``result`` of a response, or ``transport_error`` for a JSON-RPC error object."""
    if message.get("jsonrpc") != "2.0":
        raise AgentError(ErrorKind.TRANSPORT_ERROR, f"{what}: response is not JSON-RPC 2.0", alias=alias)
    if "error" in message:
        text = jsonrpc_error_text(message["error"])
        raise AgentError(ErrorKind.TRANSPORT_ERROR, f"{what} failed: {truncate_detail(text)}", alias=alias)
    return message.get("result")


def negotiated_version(result: Any, *, supported: tuple[str, ...], alias: str) -> str:
    """The protocol version the server chose; ``transport_error`` if we do not speak it."""
    if not isinstance(result, dict):
        raise AgentError(ErrorKind.TRANSPORT_ERROR, "initialize result is not an object", alias=alias)
    version = result.get("protocolVersion")
    if version not in supported:
        raise AgentError(
            ErrorKind.TRANSPORT_ERROR,
            f"MCP server speaks protocol version {version!r}; localllm supports "
            f"{', '.join(supported)} (upgrade the server or its SDK)",
            alias=alias,
        )
    return str(version)


def _first_text(content: Any) -> str | None:
    if not isinstance(content, list):
        return None
    for item in content:
        if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
            return str(item["text"])
    return None


def _from_value(value: Any, raw: str | None) -> AskResponse:
    if isinstance(value, dict) and "submission" in value and set(value) <= _ENVELOPE_KEYS:
        return AskResponse.from_json(value)
    return AskResponse(submission=raw if raw is not None else json.dumps(value, ensure_ascii=False))


def answer_from_tool_result(result: Any, *, alias: str, tool: str) -> AskResponse:
    """Turn a ``tools/call`` result into an AskResponse (rules in the module docstring)."""
    if not isinstance(result, dict):
        raise AgentError(ErrorKind.TRANSPORT_ERROR, "tools/call result is not an object", alias=alias)
    text = _first_text(result.get("content"))
    if result.get("isError") is True:
        message = text if text is not None else "(no message)"
        raise AgentError(ErrorKind.TRANSPORT_ERROR, f"tool {tool!r} failed: {truncate_detail(message)}", alias=alias)
    structured = result.get("structuredContent")
    if structured is not None:
        return _from_value(structured, None)
    if text is None:
        raise AgentError(
            ErrorKind.TRANSPORT_ERROR, f"tool {tool!r} returned no structuredContent and no text content", alias=alias
        )
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json decodes
        return AskResponse(submission=text)
    return _from_value(value, text)
