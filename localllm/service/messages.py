"""Anthropic's Messages API (``POST /v1/messages``) served by the chat route, its guarantees kept.

A Messages request is read as the chat request it means (:func:`to_chat`), prepared, compiled,
sent and validated exactly as ``POST /v1/chat/completions`` is, and the chat answer written
back as a Message (:func:`answer`) or, when ``stream`` is true, as the Messages stream's
events (:class:`Stream`); every error is in Anthropic's shape (:func:`error`). So
``output_config.format`` (a JSON Schema, what the ``anthropic`` SDK's ``messages.parse``
sends) and ``tools`` are compiled into the grammar and every answer validated, with the chat
route's ``X-Localllm-Structured`` / ``X-Localllm-Validated`` headers. The ``anthropic``
SDK's ``x-api-key`` header carries the service's token.

What maps to what:

* ``system`` (a string or text blocks) → a system message first; ``messages`` → chat
  messages: ``text`` blocks, an assistant's ``tool_use`` blocks → its ``tool_calls``
  (``input`` as the arguments), a user's ``tool_result`` blocks → ``tool`` messages (before
  the user's own text; ``is_error`` marks the result as an error); ``thinking`` and
  ``redacted_thinking`` blocks are left out (no chat template renders earlier thinking).
* ``output_config.format`` (``json_schema``) → a strict ``response_format``; ``tools``
  (``name``, ``description``, ``input_schema``, ``strict``) → chat function tools;
  ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` → ``auto`` / ``required`` / the named
  function / ``none``, ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``;
  ``stop_sequences`` → ``stop``; ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` as they are.
* Refused (400 naming the field), never silently dropped: images, documents and search
  results (the served models read text only), Anthropic's server tools (``web_search_…``,
  ``bash_…``, …), ``mcp_servers``, ``container``, ``context_management``, and any field not
  named here. ``metadata``, ``service_tier``, ``cache_control``, ``thinking``, ``speed``,
  ``inference_geo`` and ``output_config.effort`` are accepted without effect.

A stream of text is rewritten event by event from llama-server's chat stream
(:class:`Stream`): each thinking and text delta as it comes. With ``output_config.format``
or tools the answer is generated whole and validated first, as the chat route streams
structured output, then sent as the same events: ``message_start``, each block's
``content_block_start`` / one delta / ``content_block_stop``, ``message_delta`` (the stop
reason, the output tokens), ``message_stop``. The stop reason is ``end_turn``,
``max_tokens`` or ``tool_use``: llama-server does not say which stop string ended an answer,
so ``stop_sequence`` is never named.
"""

from __future__ import annotations

import json
import re
from typing import Any

from localllm.service.chat import MAX_MESSAGES, BadRequest
from localllm.service.dialects import ChatStream, Renames, Where, item_id, rename, sse

__all__ = ["ROUTES", "Stream", "answer", "error", "stream", "to_chat"]

ROUTES: tuple[str, ...] = ("/v1/messages",)

_READ = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "output_config",
        "keep_alive",
    }
)
_IGNORED = frozenset({"metadata", "service_tier", "cache_control", "thinking", "speed", "inference_geo"})
#: Anthropic's error type for each status this service answers with
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _problem(message: str, param: str, code: str = "invalid_request_error") -> BadRequest:
    return BadRequest(message, param, code)


def _text(block: dict[str, Any], at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _problem(f"{at}.text must be a string", f"{at}.text")
    return str(block["text"])


def _unreadable(kind: Any, at: str) -> BadRequest:
    what = f"a {kind!r:.40} block" if isinstance(kind, str) else "not a typed block"
    return _problem(
        f'{at} is {what}: the served models read text only (send {{"type": "text", "text": …}})',
        at,
        "unsupported_content",
    )


def _result(block: dict[str, Any], at: str) -> dict[str, Any]:
    """A ``tool_result`` block as a chat ``tool`` message."""
    if not isinstance(block.get("tool_use_id"), str):
        raise _problem(f"{at}.tool_use_id must be a string", f"{at}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise _unreadable(kind, f"{at}.content[{j}]")
            texts.append(_text(part, f"{at}.content[{j}]"))
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise _problem(f"{at}.content must be a string or an array of text blocks", f"{at}.content")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _turn(message: Any, at: str, out: list[dict[str, Any]], where: Where) -> None:
    """One Messages turn as chat messages, appended to ``out``."""
    if not isinstance(message, dict):
        raise _problem(f"{at} must be an object", at)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise _problem(f"{at}.role must be user or assistant, got {role!r:.40}", f"{at}.role")
    content = message.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        where.append([at])
        return
    if not isinstance(content, list):
        raise _problem(f"{at}.content must be a string or an array of content blocks", f"{at}.content")
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    sources: list[str] = []
    for b, block in enumerate(content):
        here = f"{at}.content[{b}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append({"type": "text", "text": _text(block, here)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # the model's earlier thinking: no template renders it
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _problem(f"{here} needs a string id and name", here)
            if not isinstance(block.get("input"), dict):
                raise _problem(f"{here}.input must be an object", f"{here}.input")
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
            sources.append(here)
        elif kind == "tool_result" and role == "user":
            out.append(_result(block, here))
            where.append([here])
        elif kind in ("image", "document", "search_result"):
            raise _unreadable(kind, here)
        else:
            raise _problem(
                f"{here}.type {kind!r:.40} is not served here in a {role} turn",
                f"{here}.type",
                "unsupported_parameter",
            )
    if calls:
        out.append({"role": "assistant", "content": texts or None, "tool_calls": calls})
        where.append(sources)
    elif texts or not content:
        out.append({"role": role, "content": texts})
        where.append([at])


def _system(given: Any) -> str:
    if isinstance(given, str):
        return given
    if not isinstance(given, list):
        raise _problem("system must be a string or an array of text blocks", "system")
    texts = []
    for i, block in enumerate(given):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise _unreadable(kind, f"system[{i}]")
        assert isinstance(block, dict)
        texts.append(_text(block, f"system[{i}]"))
    return "\n\n".join(texts)


def _tools(given: Any) -> list[dict[str, Any]]:
    if not isinstance(given, list):
        raise _problem("tools must be an array of tools", "tools")
    tools = []
    for i, tool in enumerate(given):
        if not isinstance(tool, dict):
            raise _problem(f"tools[{i}] must be an object", f"tools[{i}]")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _problem(
                f"tools[{i}].type {kind!r:.40} is not served here: Anthropic's server tools run on Anthropic's "
                'servers; this service offers client tools ({"name": …, "input_schema": {…}})',
                f"tools[{i}].type",
                "unsupported_parameter",
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            # a tool_use block's input is an object: the arguments of any other schema had no place
            raise _problem(
                f'tools[{i}].input_schema is required: an object schema ({{"type": "object", …}})',
                f"tools[{i}].input_schema",
            )
        fn = {"name": tool.get("name"), "parameters": schema, "strict": tool.get("strict") is True}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """(the chat ``tool_choice``, whether parallel calls are allowed)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _problem('tool_choice must be {"type": "auto" | "any" | "tool" | "none"}', "tool_choice")
    assert isinstance(choice, dict)
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _problem("tool_choice.name must be a string", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def _format(config: Any) -> dict[str, Any] | None:
    """``output_config.format`` as a chat ``response_format`` (strict: Anthropic's guarantee)."""
    if not isinstance(config, dict):
        raise _problem("output_config must be an object", "output_config")
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        raise _problem(
            f"output_config.{unknown[0]} is not served here", f"output_config.{unknown[0]}", "unsupported_parameter"
        )
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise _problem('output_config.format must be {"type": "json_schema", "schema": {…}}', "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def to_chat(data: dict[str, Any]) -> tuple[dict[str, Any], Where]:
    """The chat body a Messages body means, and where each of its messages came from (for
    :func:`error`); :class:`BadRequest` for what cannot be served."""
    for key in data:
        if key not in _READ and key not in _IGNORED:
            raise _problem(f"{key} is not a Messages API field served here", key, "unsupported_parameter")
    if data.get("stream") not in (None, True, False):
        raise _problem("stream must be true or false", "stream")
    if not isinstance(data.get("max_tokens"), int) or isinstance(data["max_tokens"], bool) or data["max_tokens"] < 1:
        raise _problem("max_tokens is required: an integer of at least 1", "max_tokens")
    given = data.get("messages")
    if not isinstance(given, list) or not given:
        raise _problem("messages must be a non-empty array", "messages")
    if len(given) > MAX_MESSAGES:
        raise _problem(f"messages holds {len(given)} messages; at most {MAX_MESSAGES} in one request", "messages")
    out: list[dict[str, Any]] = []
    where: Where = []
    if data.get("system") is not None:
        out.append({"role": "system", "content": _system(data["system"])})
        where.append(["system"])
    for i, message in enumerate(given):
        _turn(message, f"messages[{i}]", out, where)
    body: dict[str, Any] = {"model": data.get("model"), "messages": out}
    if data.get("stream") is True:  # text streams as it comes; structured output and tools whole
        body.update(stream=True, stream_options={"include_usage": True})
    for key in ("max_tokens", "temperature", "top_p", "top_k", "keep_alive"):
        if data.get(key) is not None:
            body[key] = data[key]
    stops = data.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            raise _problem("stop_sequences must be an array of strings", "stop_sequences")
        body["stop"] = stops
    if data.get("output_config") is not None and (fmt := _format(data["output_config"])) is not None:
        body["response_format"] = fmt
    if data.get("tools"):
        body["tools"] = _tools(data["tools"])
        if data.get("tool_choice") is not None:
            body["tool_choice"], body["parallel_tool_calls"] = _tool_choice(data["tool_choice"])
    elif data.get("tool_choice") is not None and _tool_choice(data["tool_choice"])[0] not in ("auto", "none"):
        raise _problem("tool_choice needs tools", "tool_choice")
    return body, where


#: a chat request's parameter paths and the Messages fields they came from
_RENAMES: Renames = (
    (re.compile(r"response_format\.json_schema\b"), "output_config.format"),
    (re.compile(r"response_format\b"), "output_config.format"),
    (re.compile(r"(tools\[\d+\])\.function\.parameters\b"), lambda m: m.group(1) + ".input_schema"),
    (re.compile(r"(tools\[\d+\])\.function\b"), lambda m: m.group(1)),
)


def error(payload: dict[str, Any], where: Where, status: int) -> dict[str, Any]:
    """An error in Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``),
    naming what the client sent; the chat route's ``param`` and ``code`` kept beside."""
    body = rename(payload, where, _RENAMES).get("error")
    if not isinstance(body, dict):
        return payload
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    shaped: dict[str, Any] = {"type": kind, "message": str(body.get("message", ""))}
    for key in ("param", "code"):
        if body.get(key) is not None:
            shaped[key] = body[key]
    return {"type": "error", "error": shaped}


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    thought = message.get("reasoning_content")
    if isinstance(thought, str) and thought:
        blocks.append({"type": "thinking", "thinking": thought, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and (text or not message.get("tool_calls")):
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            given = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            given = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or item_id("toolu")),
                "name": fn.get("name"),
                "input": given if isinstance(given, dict) else {},
            }
        )
    return blocks


def answer(data: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """The Message for a Messages body ``data`` whose chat answer is ``reply``."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    reason = choice.get("finish_reason")
    usage = reply.get("usage") or {}
    return {
        "id": item_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": reply.get("model") or data.get("model"),
        "content": _content(choice.get("message") or {}),
        "stop_reason": {"length": "max_tokens", "tool_calls": "tool_use"}.get(str(reason), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


class Stream(ChatStream):
    """The Messages stream's events: the text (and thinking) as the chat stream's deltas
    arrive, each block closed and the rest of the answer (tool calls) sent whole at the end
    (:meth:`finish`, also all that an answer generated whole is sent as)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data, answer(data, {}))
        self.blocks = 0  # blocks opened so far
        self.open: str | None = None  # the type of the block still open

    def started(self) -> bytes:
        usage = {**self.shell["usage"], "input_tokens": 0, "output_tokens": 0}
        started = {**self.shell, "content": [], "stop_reason": None, "usage": usage}
        return sse({"type": "message_start", "message": started})

    def _stop(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return sse({"type": "content_block_stop", "index": self.blocks - 1})

    def _block(self, block: dict[str, Any], delta: dict[str, Any]) -> bytes:
        """Open ``block`` (its content empty) unless a block of its type is open; then ``delta``."""
        out = self._begin()
        if self.open != block["type"]:
            out += self._stop()
            out += sse({"type": "content_block_start", "index": self.blocks, "content_block": block})
            self.blocks += 1
            self.open = block["type"]
        return out + sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def thinking(self, text: str) -> bytes:
        block = {"type": "thinking", "thinking": "", "signature": ""}
        return self._block(block, {"type": "thinking_delta", "thinking": text})

    def delta(self, text: str, logprobs: list[Any]) -> bytes:  # Anthropic's API has no logprobs
        return self._block({"type": "text", "text": ""}, {"type": "text_delta", "text": text})

    def failed(self, error: dict[str, Any]) -> bytes:
        message = str(error.get("message") or "the model's server failed")
        return self._begin() + sse({"type": "error", "error": {"type": "api_error", "message": message}})

    def finish(self, reply: dict[str, Any]) -> bytes:
        done = {**answer(self.data, reply), "id": self.shell["id"]}
        out = self._begin() + self._stop()
        for block in done["content"][self.blocks :]:  # what was not streamed: sent whole
            if block["type"] == "text":
                start, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
            elif block["type"] == "tool_use":
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            else:
                start = {**block, "thinking": ""}
                delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            out += self._block(start, delta) + self._stop()
        usage = {"input_tokens": done["usage"]["input_tokens"], "output_tokens": done["usage"]["output_tokens"]}
        out += sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": done["stop_reason"], "stop_sequence": None},
                "usage": usage,
            }
        )
        return out + sse({"type": "message_stop"})


def stream(data: dict[str, Any]) -> Stream:
    """The Messages stream for the request ``data``."""
    return Stream(data)
