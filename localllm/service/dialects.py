"""What the routes that speak another API than chat share (``/v1/responses``, ``/v1/messages``).

Each reads its request as the chat request it means (its module's ``to_chat``), which the
chat route then prepares, compiles, sends and validates; each records where every chat
message came from (:data:`Where`), so that a chat error names what the client sent
(:func:`rename`), and writes the chat answer back in its own shape.
"""

from __future__ import annotations

import json
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ChatStream", "Dialect", "Renames", "Where", "item_id", "rename", "sse"]

#: for each chat message, where it came from in the client's request; for an assistant turn
#: of tool calls, one entry per call (the message's own source is the first)
Where = list[list[str]]
#: chat parameter paths (patterns) and what to write instead
Renames = tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...]


class Dialect(Protocol):
    """What a module serving another API provides (:mod:`~localllm.service.responses`,
    :mod:`~localllm.service.messages`)."""

    ROUTES: tuple[str, ...]

    def to_chat(self, data: dict[str, Any]) -> tuple[dict[str, Any], Where]:
        """The chat body ``data`` means, and where its messages came from (BadRequest: 400)."""

    def answer(self, data: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``data`` in this API's shape, from the chat answer ``reply``."""

    def stream(self, data: dict[str, Any]) -> ChatStream:
        """This API's stream for the request ``data`` (live, or given the whole answer)."""

    def error(self, payload: dict[str, Any], where: Where, status: int) -> dict[str, Any]:
        """A chat route's error (OpenAI's shape) in this API's shape, naming what was sent."""


_MESSAGE = re.compile(r"\bmessages\[(\d+)\]((?:\.tool_calls\[\d+\])?)")
_CALL = re.compile(r"\.tool_calls\[(\d+)\]")


def rename(error: dict[str, Any], where: Where, renames: Renames) -> dict[str, Any]:
    """A chat route's error (OpenAI's shape) naming what the client sent: ``messages[2]`` →
    its source in ``where``, then each of ``renames``; in place, also returned."""
    body = error.get("error")
    if not isinstance(body, dict):
        return error

    def source(m: re.Match[str]) -> str:
        k = int(m.group(1))
        if k >= len(where):
            return m.group(0)
        call = _CALL.fullmatch(m.group(2))
        j = int(call.group(1)) if call else 0
        return where[k][j] if j < len(where[k]) else where[k][0]

    for key in ("message", "param"):
        value = body.get(key)
        if isinstance(value, str):
            value = _MESSAGE.sub(source, value)
            for pattern, replacement in renames:
                value = pattern.sub(replacement, value)
            body[key] = value
    return error


def item_id(prefix: str) -> str:
    """A fresh id such as ``resp_…`` or ``msg_…``."""
    return f"{prefix}_{secrets.token_hex(12)}"


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event named by its ``type``."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


class ChatStream(ABC):
    """A chat completions stream (llama-server's ``data: …`` lines) read as it arrives and
    written in another API's events: each reasoning and text delta as it comes
    (:meth:`thinking`, :meth:`delta`), then the whole answer (:meth:`finish`, also what an
    answer generated whole is sent as). ``feed``/``flush`` as the service's stream rewriters."""

    def __init__(self, data: dict[str, Any], shell: dict[str, Any]) -> None:
        self.data = data  # the client's request
        self.shell = shell  # its answer before any word: the id, the time, the request's settings
        self.begun = False
        self.pending = b""
        self.text: list[str] = []
        self.thought: list[str] = []
        self.reason: Any = None
        self.usage: Any = None
        self.logprobs: list[Any] = []  # each token's, when the request asked for them
        self.ended = False

    def feed(self, chunk: bytes) -> bytes:
        """The events for the complete lines that have arrived; the rest kept for later."""
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        return b"".join(self._line(line) for line in data[:cut].splitlines())

    def flush(self) -> bytes:
        """What is left, and the end when the stream had none (no ``[DONE]``)."""
        rest, self.pending = self.pending, b""
        out = self._line(rest) if rest.strip() else b""
        return out + (b"" if self.ended else self._end())

    def _line(self, line: bytes) -> bytes:
        line = line.strip()
        if self.ended or not line.startswith(b"data:"):
            return b""
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return self._end()
        try:
            event = json.loads(payload)
        except ValueError:
            return b""
        if not isinstance(event, dict):
            return b""
        if isinstance(event.get("error"), dict):  # llama-server's error after the stream began
            self.ended = True
            return self.failed(event["error"])
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        out = b""
        for choice in event.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(thought := delta.get("reasoning_content"), str) and thought:
                self.thought.append(thought)
                out += self.thinking(thought)
            given = choice.get("logprobs")
            tokens = given.get("content") if isinstance(given, dict) else None
            tokens = tokens if isinstance(tokens, list) else []
            self.logprobs += tokens
            if isinstance(text := delta.get("content"), str) and text:
                self.text.append(text)
                out += self.delta(text, tokens)
            if choice.get("finish_reason") is not None:
                self.reason = choice["finish_reason"]
        return out

    def _end(self) -> bytes:
        self.ended = True
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.thought:
            message["reasoning_content"] = "".join(self.thought)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.reason}
        if self.logprobs:
            choice["logprobs"] = {"content": self.logprobs}
        return self.finish({"choices": [choice], "usage": self.usage})

    def _begin(self) -> bytes:
        """The events that open the stream, once (before its first delta, error or end)."""
        if self.begun:
            return b""
        self.begun = True
        return self.started()

    @abstractmethod
    def started(self) -> bytes:
        """The events that open this API's stream."""

    @abstractmethod
    def thinking(self, text: str) -> bytes:
        """The events for a piece of the model's reasoning."""

    @abstractmethod
    def delta(self, text: str, logprobs: list[Any]) -> bytes:
        """The events for a piece of the answer's text (and its tokens' logprobs, when asked for)."""

    @abstractmethod
    def failed(self, error: dict[str, Any]) -> bytes:
        """The events for llama-server's error after the stream began."""

    @abstractmethod
    def finish(self, reply: dict[str, Any]) -> bytes:
        """The events that end the stream, given the whole chat answer ``reply``."""
