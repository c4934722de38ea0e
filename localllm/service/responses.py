"""OpenAI's Responses API (``POST /v1/responses``) served by the chat route, its guarantees kept.

A Responses request is read as the chat request it means (:func:`to_chat`), prepared, compiled,
sent and validated exactly as ``POST /v1/chat/completions`` is (:mod:`localllm.service.chat`),
and the chat answer is written back as a Response (:func:`answer`) or, when ``stream`` is
true, as the Responses stream's events (:class:`Stream`). So ``text.format`` (a JSON Schema)
and function ``tools`` are compiled into the grammar and every answer validated, as on the
chat route, with the same ``X-Localllm-Structured`` / ``X-Localllm-Validated`` headers.

What maps to what:

* ``instructions`` → a system message first; ``input`` (a string, or items) → messages:
  a ``message`` item (or ``{"role": …, "content": …}``) with ``input_text`` / ``output_text``
  / ``refusal`` parts, ``function_call`` items → one assistant turn's ``tool_calls``,
  ``function_call_output`` → a ``tool`` message; a ``reasoning`` item is left out (a chat
  template renders no earlier thinking).
* ``text.format`` → ``response_format`` (``json_schema``'s ``strict`` defaults to false);
  function ``tools`` (flat: ``name``, ``parameters``, ``strict`` — true unless false, the
  Responses API's default) → chat tools; ``tool_choice`` (``none``, ``auto``, ``required``,
  ``{"type": "function", "name": …}``, ``{"type": "allowed_tools", …}``) and
  ``parallel_tool_calls`` alike; ``max_output_tokens`` → ``max_tokens``; ``top_logprobs``
  (or ``include: ["message.output_text.logprobs"]``) → ``logprobs``.
* Refused (400 naming the parameter), never silently dropped: what needs state this service
  does not keep (``previous_response_id``, ``conversation``, ``background``, a stored
  ``prompt``, an ``item_reference``, an image or file by id), OpenAI's hosted tools
  (``web_search``, ``file_search``, …), parts the served models cannot read (images, files,
  audio), and any field not named here. Nothing is stored: ``store`` is accepted and read
  as false, and ``GET /v1/responses/{id}`` has no route.

A stream of text is rewritten event by event from llama-server's chat stream
(:class:`Stream`): each reasoning and text delta as it comes. With ``text.format`` or tools
the answer is generated whole and validated first, as the chat route streams structured
output, then sent as the same events (``response.created`` … ``response.output_text.delta``
… ``response.completed``), each text and each call's arguments in one delta.
"""

from __future__ import annotations

import re
import time
from typing import Any

from localllm.service.chat import MAX_MESSAGES, BadRequest
from localllm.service.dialects import ChatStream, Renames, Where, item_id, rename, sse

__all__ = ["ROUTES", "Stream", "answer", "error", "stream", "to_chat"]

#: the paths served here (the openai SDK's base URL ends in /v1; some clients leave it out)
ROUTES: tuple[str, ...] = ("/v1/responses", "/responses")

_LOGPROBS = "message.output_text.logprobs"
#: fields read, and those accepted without effect: no billing, no store, no cache key, no
#: reasoning effort (a served model thinks or not by its template), no truncation (a prompt
#: past the context is refused, never cut)
_READ = frozenset(
    {
        "model",
        "input",
        "instructions",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_logprobs",
        "include",
        "stream",
        "keep_alive",
    }
)
_IGNORED = frozenset(
    {
        "store",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "service_tier",
        "reasoning",
        "truncation",
        "stream_options",
    }
)
#: fields that need what this service does not keep, and what to send instead
_STATEFUL = {
    "previous_response_id": "this service stores no responses: send the whole conversation in input",
    "conversation": "this service stores no conversations: send the whole conversation in input",
    "prompt": "this service stores no prompts: send the text in instructions and input",
    "background": "this service answers while the request waits: leave background out",
    "max_tool_calls": "a response here holds the calls of one turn: leave max_tool_calls out",
    "context_management": "this service keeps no context between requests: leave context_management out",
}
_ROLES = ("user", "system", "developer", "assistant")
#: the content parts a served model reads, and the field holding each one's text
_TEXT_FIELDS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


def _problem(message: str, param: str, code: str = "invalid_request_error") -> BadRequest:
    return BadRequest(message, param, code)


def _text_parts(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A message item's content as chat content: a string, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _problem(f"{param} must be a string or an array of content parts", param)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        field = _TEXT_FIELDS.get(kind) if isinstance(kind, str) else None  # a list is no key
        if field is None:
            what = f"an {kind!r} part" if isinstance(kind, str) else "not a typed part"
            raise _problem(
                f'{at} is {what}: the served models read text only (send {{"type": "input_text", "text": …}})',
                at,
                "unsupported_content",
            )
        assert isinstance(part, dict)
        if not isinstance(part.get(field), str):
            raise _problem(f"{at}.{field} must be a string", f"{at}.{field}")
        parts.append({"type": "text", "text": part[field]})
    return parts


def _messages(data: dict[str, Any], where: Where) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages; ``where[k]`` names message k's sources
    (an assistant turn made of function_call items: one per call)."""
    out: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _problem("instructions must be a string", "instructions")
        out.append({"role": "system", "content": instructions})
        where.append(["instructions"])
    given = data.get("input")
    if given is None:
        raise _problem("input is required: a string or an array of input items", "input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
        where.append(["input"])
        return out
    if not isinstance(given, list) or (not given and not out):
        raise _problem("input must be a string or a non-empty array of input items", "input")
    if len(given) > MAX_MESSAGES:
        raise _problem(f"input holds {len(given)} items; at most {MAX_MESSAGES} in one request", "input")
    calls = False  # out[-1] is an assistant turn made of function_call items
    for i, item in enumerate(given):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise _problem(f"{at} must be an object", at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _problem(f"{at}.role must be one of {', '.join(_ROLES)}, got {role!r:.40}", f"{at}.role")
            out.append({"role": role, "content": _text_parts(item.get("content"), f"{at}.content")})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _problem(f"{at}.{key} must be a string", f"{at}.{key}")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if calls:  # one turn's calls, one assistant message
                out[-1]["tool_calls"].append(call)
                where[-1].append(at)
                continue
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            where.append([at])
            calls = True
            continue
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _problem(f"{at}.call_id must be a string", f"{at}.call_id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": _text_parts(item.get("output"), f"{at}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # the model's earlier thinking: no template renders it (a turn's calls go on)
        else:
            why = (
                "this service stores no items: send the item itself"
                if kind == "item_reference"
                else "this service reads message, function_call, function_call_output and reasoning items"
            )
            raise _problem(f"{at}.type {kind!r:.40} is not served here: {why}", f"{at}.type", "unsupported_parameter")
        where.append([at])
        calls = False
    return out


def _tools(given: Any) -> list[dict[str, Any]]:
    if not isinstance(given, list):
        raise _problem("tools must be an array of function tools", "tools")
    tools = []
    for i, tool in enumerate(given):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _problem(
                f"tools[{i}].type {kind!r:.40} is not served here: OpenAI's hosted tools run on OpenAI's servers; "
                'this service offers function tools ({"type": "function", "name": …, "parameters": {…}})',
                f"tools[{i}].type",
                "unsupported_parameter",
            )
        assert isinstance(tool, dict)
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        fn["strict"] = tool.get("strict") is not False  # the Responses API's default
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(the chat ``tool_choice``, the tools it may pick from)."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice, tools
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        assert isinstance(choice, dict)
        if not isinstance(choice.get("name"), str):
            raise _problem("tool_choice.name must be a string", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    if kind == "allowed_tools":
        allowed = choice.get("tools")
        mode = choice.get("mode")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise _problem(
                'tool_choice allowed_tools needs {"mode": "auto" | "required", '
                '"tools": [{"type": "function", "name": …}]}',
                "tool_choice",
            )
        names = {t.get("name") for t in allowed if isinstance(t, dict) and t.get("type") == "function"}
        if len(names) != len(allowed):
            raise _problem("tool_choice.tools may name function tools only", "tool_choice.tools")
        kept = [t for t in tools if t["function"].get("name") in names]
        if len(kept) != len(names):
            raise _problem("tool_choice.tools names a tool that is not in tools", "tool_choice.tools")
        return mode, kept
    raise _problem(
        'tool_choice must be none, auto, required, {"type": "function", "name": …} or allowed_tools', "tool_choice"
    )


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (None: plain text)."""
    if not isinstance(text, dict):
        raise _problem('text must be an object such as {"format": {"type": "text"}}', "text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise _problem(f"text.{unknown[0]} is not a field of text", f"text.{unknown[0]}", "unsupported_parameter")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _problem("text.format must be an object with a type", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _problem(
            f"text.format.type must be text, json_object or json_schema, got {kind!r:.40}", "text.format.type"
        )
    spec = {k: fmt[k] for k in ("name", "description", "schema") if k in fmt}
    spec["strict"] = fmt.get("strict") is True
    return {"type": "json_schema", "json_schema": spec}


def to_chat(data: dict[str, Any]) -> tuple[dict[str, Any], Where]:
    """The chat body a Responses body means, and where each of its messages came from (for
    :func:`error`); :class:`BadRequest` for what cannot be served."""
    for key, value in data.items():
        if key in _STATEFUL and value not in (None, False):
            raise _problem(f"{key} is not served here: {_STATEFUL[key]}", key, "unsupported_parameter")
        if key not in _READ and key not in _IGNORED and key not in _STATEFUL:
            raise _problem(f"{key} is not a Responses API field served here", key, "unsupported_parameter")
    if data.get("stream") not in (None, True, False):
        raise _problem("stream must be true or false", "stream")
    where: Where = []
    body: dict[str, Any] = {"model": data.get("model"), "messages": _messages(data, where)}
    if data.get("stream") is True:  # text streams as it comes; structured output and tools whole
        body.update(stream=True, stream_options={"include_usage": True})
    for key in ("temperature", "top_p", "keep_alive", "parallel_tool_calls"):
        if data.get(key) is not None:
            body[key] = data[key]
    if data.get("max_output_tokens") is not None:
        body["max_tokens"] = data["max_output_tokens"]
    if data.get("text") is not None and (fmt := _format(data["text"])) is not None:
        body["response_format"] = fmt
    if data.get("tools"):  # [] is no tools, as in OpenAI's API
        tools = _tools(data["tools"])
        choice, tools = _tool_choice(data.get("tool_choice"), tools)
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
    elif data.get("tool_choice") not in (None, "none", "auto"):
        raise _problem("tool_choice needs tools", "tool_choice")
    include = data.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise _problem("include must be an array of strings", "include")
    if data.get("top_logprobs") is not None or _LOGPROBS in (include or ()):
        body["logprobs"] = True
        body["top_logprobs"] = data.get("top_logprobs") or 0
    return body, where


#: a chat request's parameter paths and the Responses fields they came from
_RENAMES: Renames = (
    (re.compile(r"response_format\.json_schema\b"), "text.format"),
    (re.compile(r"response_format\b"), "text.format"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"(tools\[\d+\])\.function\b"), lambda m: m.group(1)),
)


def error(payload: dict[str, Any], where: Where, status: int) -> dict[str, Any]:
    """A chat route's error naming what the client sent: ``messages[2]`` → ``input[1]``,
    ``response_format.json_schema.schema`` → ``text.format.schema``, and so on (in OpenAI's
    shape whatever the ``status``: the signature is the Messages route's too)."""
    return rename(payload, where, _RENAMES)


def _output(choice: dict[str, Any]) -> list[dict[str, Any]]:
    message = choice.get("message") or {}
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    items: list[dict[str, Any]] = []
    thought = message.get("reasoning_content")
    if isinstance(thought, str) and thought:
        items.append(
            {
                "type": "reasoning",
                "id": item_id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": thought}],
                "status": status,
            }
        )
    content = message.get("content")
    if isinstance(content, str) and (content or not message.get("tool_calls")):
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": logprobs}
        items.append(
            {
                "type": "message",
                "id": item_id("msg"),
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": item_id("fc"),
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments"),
                "status": "completed",
            }
        )
    return items


def answer(data: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """The Response for a Responses body ``data`` whose chat answer is ``reply``."""
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    cut = choice.get("finish_reason") == "length"
    usage = reply.get("usage") or {}
    given_in = usage.get("prompt_tokens") or 0
    given_out = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    text: dict[str, Any] = data["text"] if isinstance(data.get("text"), dict) else {}
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": reply.get("created") or int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "model": reply.get("model") or data.get("model"),
        "output": _output(choice),
        "parallel_tool_calls": data.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": data.get("reasoning"),
        "store": False,
        "temperature": data.get("temperature"),
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "tool_choice": data.get("tool_choice") or "auto",
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p"),
        "truncation": "disabled",
        "usage": {
            "input_tokens": given_in,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": given_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": given_in + given_out,
        },
        "metadata": data.get("metadata") or {},
    }


class Stream(ChatStream):
    """The Responses stream's events: the text (and reasoning) as the chat stream's deltas
    arrive, each item closed and the rest of the answer (function calls) sent whole at the end
    (:meth:`finish`, also all that an answer generated whole is sent as)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data, answer(data, {}))
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # the items opened so far (the last may be open)

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **fields})

    def started(self) -> bytes:
        started = {**self.shell, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
        return self._event("response.created", response=started) + self._event("response.in_progress", response=started)

    def _open(self, kind: str) -> bytes:
        """Open an item of ``kind`` (``message`` or ``reasoning``), closing the one before."""
        out = self._begin()
        if self.items and self.items[-1]["type"] == "reasoning":
            thought = "".join(self.thought)
            reasoning = {
                **self.items[-1],
                "content": [{"type": "reasoning_text", "text": thought}],
                "status": "completed",
            }
            out += self._close(len(self.items) - 1, reasoning)
        index = len(self.items)
        if kind == "message":
            item = {
                "type": "message",
                "id": item_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (
            out
            + self._event("response.output_item.added", output_index=index, item=item)
            + self._event("response.content_part.added", **at, part=part)
        )

    def thinking(self, text: str) -> bytes:
        out = b"" if self.items and self.items[-1]["type"] == "reasoning" else self._open("reasoning")
        at = {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}
        return out + self._event("response.reasoning_text.delta", **at, delta=text)

    def delta(self, text: str, logprobs: list[Any]) -> bytes:
        out = b"" if self.items and self.items[-1]["type"] == "message" else self._open("message")
        at = {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}
        return out + self._event("response.output_text.delta", **at, delta=text, logprobs=logprobs)

    def _close(self, index: int, item: dict[str, Any]) -> bytes:
        """The events that end the open item ``index``, now whole as ``item``."""
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            out += self._event("response.output_text.done", **at, text=part["text"], logprobs=part["logprobs"])
            out += self._event("response.content_part.done", **at, part=part)
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out += self._event("response.reasoning_text.done", **at, text=part["text"])
            out += self._event("response.content_part.done", **at, part=part)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _whole(self, index: int, item: dict[str, Any]) -> bytes:
        """An item sent whole: opened, its content in one delta, closed."""
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            return (
                self._event("response.output_item.added", output_index=index, item=added)
                + self._event("response.function_call_arguments.delta", **at, delta=item["arguments"])
                + self._event(
                    "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
                )
                + self._event("response.output_item.done", output_index=index, item=item)
            )
        kind = "output_text" if item["type"] == "message" else "reasoning_text"
        part = item["content"][0]
        empty = {**part, "text": ""} if kind == "reasoning_text" else {**part, "text": "", "logprobs": []}
        added = {**item, "status": "in_progress", "content": []}
        out = self._event("response.output_item.added", output_index=index, item=added)
        out += self._event("response.content_part.added", **at, content_index=0, part=empty)
        if kind == "output_text":
            out += self._event(
                "response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=part["logprobs"]
            )
        else:
            out += self._event("response.reasoning_text.delta", **at, content_index=0, delta=part["text"])
        return out + self._close(index, item)

    def failed(self, error: dict[str, Any]) -> bytes:
        message = str(error.get("message") or "the model's server failed")
        return self._begin() + self._event("error", code="upstream_error", message=message, param=None)

    def finish(self, reply: dict[str, Any]) -> bytes:
        done = {**answer(self.data, reply), "id": self.shell["id"], "created_at": self.shell["created_at"]}
        streamed = len(self.items)
        for item, opened in zip(done["output"], self.items, strict=False):
            item["id"] = opened["id"]
        out = self._begin()
        for index, item in enumerate(done["output"]):
            if index < streamed - 1:
                continue  # closed when the next began
            out += self._close(index, item) if index == streamed - 1 else self._whole(index, item)
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=done)


def stream(data: dict[str, Any]) -> Stream:
    """The Responses stream for the request ``data``."""
    return Stream(data)
