"""What an OpenAI-compatible upstream's error reply said: its status and message, compactly.

Servers and gateways wrap errors differently (``{"error": {"message", "type", "code"}}``,
``{"error": "…"}``, FastAPI's ``{"detail": …}``, ``{"message": …}``, plain text); the one
reader here finds the message and says whether the reply means "the key is wrong". That
is decided by the status (401, 403) and, for gateways that answer a bad key with another
status, by the structured fields of the bodies in :data:`AUTH_BODIES`, never by searching
the prose.

A leaf module: it imports nothing from localllm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["AUTH_BODIES", "REDIRECT_HINT", "UpstreamError", "read_error", "redirected"]

#: (status, field of the error object, value) of replies that mean a rejected key though the
#: status is not 401/403. LiteLLM's proxy without a database answers a key that is not its
#: master key with ``400 {"error": {"message": "No connected db.", "type": "no_db_connection"}}``.
AUTH_BODIES: tuple[tuple[int, str, str], ...] = (
    (400, "type", "no_db_connection"),
    (400, "message", "No connected db."),
)
#: (status, field, prefix) of replies that mean the model's output broke the constraint the
#: server was enforcing: llama-server answers ``500 {"error": {"message": "The model produced
#: output that does not match the expected peg-native format"}}`` (the "peg-native" part
#: varies with the format). Such an answer is ``schema_invalid``, so the fallback engages.
CONSTRAINT_BODIES: tuple[tuple[int, str, str], ...] = (
    (500, "message", "The model produced output that does not match the expected"),
)
_LIMIT = 300


@dataclass(frozen=True)
class UpstreamError:
    status: int
    #: the upstream's own message (type/code beside it when present), at most ~300 characters
    message: str
    auth: bool
    #: the server refused the model's own output under the constraint (not a transport failure)
    constraint_broken: bool = False

    def describe(self, where: str) -> str:
        return f"HTTP {self.status} from {where}: {self.message}"

    def auth_hint(self, api_key_env: str | None) -> str:
        if api_key_env:
            return f"check api_key_env {api_key_env}: the server refused the key it holds"
        return "the server wants a key: set api_key_env: NAME to the variable that holds it"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LIMIT else text[: _LIMIT - 3] + "..."


def _error_object(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    inner = data.get("error")
    if isinstance(inner, dict):
        return inner
    return data


def _message(obj: dict[str, Any] | None, text: str) -> str:
    if obj is None:
        return _short(text) or "(empty body)"
    for name in ("message", "error", "detail", "msg"):
        value = obj.get(name)
        if isinstance(value, str) and value.strip():
            message = value
            break
        if value not in (None, "", [], {}):
            message = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            break
    else:
        return _short(text) or "(empty body)"
    extra = [
        f"{name} {obj[name]}"
        for name in ("type", "code")
        if isinstance(obj.get(name), (str, int)) and str(obj[name]) not in message
    ]
    return _short(message + (f" ({', '.join(extra)})" if extra else ""))


REDIRECT_HINT = "set endpoint: to the URL it redirects to"


def redirected(status: int, location: str | None, where: str) -> str | None:
    """What a 3xx reply means here, or None: redirects are never followed (the bearer key
    would go with them, to wherever the endpoint points), so one is a failure that says where."""
    if not 300 <= status < 400:
        return None
    to = f"redirects to {_short(location)}" if location else "redirects (no Location)"
    return f"HTTP {status} from {where} {to}: redirects are not followed (the key would go with them)"


def read_error(status: int, text: str) -> UpstreamError:
    """The upstream's error reply, read: its message and whether it refuses the key."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than json decodes
        data = None
    obj = _error_object(data)
    auth = status in (401, 403) or (
        obj is not None and any(status == code and obj.get(name) == value for code, name, value in AUTH_BODIES)
    )
    broken = obj is not None and any(
        status == code and str(obj.get(name, "")).startswith(prefix) for code, name, prefix in CONSTRAINT_BODIES
    )
    return UpstreamError(status, _message(obj, text), auth, broken)
