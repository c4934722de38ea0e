"""What the routes that speak another API than chat share (``/v1/responses``, ``/v1/messages``).

Each reads its request as the chat request it means (its module's ``to_chat``), which the
chat route then prepares, compiles, sends and validates; each records where every chat
message came from (:data:`Where`), so that a chat error names what the client sent
(:func:`rename`), and writes the chat answer back in its own shape.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Dialect", "Renames", "Where", "item_id", "rename"]

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

    def events(self, done: dict[str, Any]) -> list[bytes]:
        """A finished answer as this API's stream of server-sent events."""

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
