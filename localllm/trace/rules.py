"""Write-time line constraints (trace-format §6), checked before a single byte is written.

Every string (object keys and values, at any depth) must be valid UTF-8 text, free of NUL,
free of CRLF and NFC-normalised; numbers must be finite and integers fit in 64 bits; only
JSON types are accepted. A violation raises ``TraceWriteRejected`` naming the field path
(``payload.meta.usage[0].x``) and the fix; the file is left unmodified.

A lone ``\\r`` is allowed: the spec rejects CRLF, and JSON escapes a bare CR so it can
never end a line.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from localllm.errors import TraceWriteRejected

__all__ = ["INT_LIMIT", "INT_MIN", "MAX_DEPTH", "check_string", "check_value", "clean_text", "field_path", "reject"]

MAX_DEPTH = 100
"""Deepest nesting of arrays/objects accepted in an event (also keeps the reader's parser safe)."""

INT_MIN = -(2**63)
INT_LIMIT = 2**64  # exclusive: signed int64 or unsigned uint64
_CRS_LF = re.compile(r"\r+\n")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def reject(path: str, problem: str) -> TraceWriteRejected:
    """The exception for a broken rule at ``path``."""
    return TraceWriteRejected(f"trace event rejected: {path}: {problem}")


def field_path(parent: str, key: str | int) -> str:
    """``payload`` + ``a`` → ``payload.a``; odd keys are quoted: ``payload["a.b"]``; ``[3]`` for items."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key)}]"  # ASCII-escaped, so control characters stay visible


def check_string(value: str, path: str) -> None:
    """Raise ``TraceWriteRejected`` unless ``value`` may be written to a trace line."""
    if "\x00" in value:
        raise reject(path, "string contains a NUL byte (base64-encode binary data or move it to a sidecar file)")
    if "\r\n" in value:
        raise reject(path, "string contains CRLF; trace text uses LF only (normalise line endings)")
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise reject(path, "string contains a lone surrogate and is not valid UTF-8") from None
    if not unicodedata.is_normalized("NFC", value):
        raise reject(path, 'string is not NFC-normalised (apply unicodedata.normalize("NFC", ...) first)')


def clean_text(value: str) -> str:
    """``value`` made writable inline: CRLF → LF, NUL and lone surrogates → U+FFFD, NFC.

    For free text the caller does not need byte-exact (error messages, stderr tails);
    anything that must stay verbatim belongs in a sidecar file instead.
    """
    text = _CRS_LF.sub("\n", value).replace("\x00", "\ufffd")
    if not text.isascii():
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        text = unicodedata.normalize("NFC", text)
    return text


def check_value(value: Any, path: str) -> Any:
    """Validate ``value`` as trace JSON and return a private copy (tuples become lists).

    Every event's payload passes here, so the common case takes a fast walk (exact built-in
    types, field paths never formatted, every string checked at once); anything it does not
    accept outright — a broken rule, a subclass, a ``Mapping`` that is not a ``dict`` — is
    walked again by the exact checker, which names the field path or accepts it.
    """
    try:
        strings: list[str] = []
        copy = _fast(value, 0, strings)
        if _strings_clean(strings):
            return copy
    except _Unusual:
        pass
    except RecursionError:
        pass  # the exact walk below reports it, with the path
    try:
        return _check(value, path, 0, set())
    except RecursionError:  # only when the caller's own stack is already nearly exhausted
        raise reject(path, "nested too deeply to check") from None


class _Unusual(Exception):
    """The fast walk met something only the exact walk may judge (never leaves this module)."""


def _strings_clean(strings: list[str]) -> bool:
    """Whether every string of ``strings`` passes :func:`check_string` (one pass over them all).

    Joined by U+0001, a starter that composes with nothing, so no CRLF spans two strings and
    the whole is NFC exactly when each string is.
    """
    joined = "\x01".join(strings)
    if "\x00" in joined or "\r\n" in joined:
        return False
    if joined.isascii():
        return True
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return unicodedata.is_normalized("NFC", joined)


def _fast(value: Any, depth: int, strings: list[str]) -> Any:
    """The copy :func:`_check` would return, for plain JSON made of built-in types only.

    Raises ``_Unusual`` at anything else (a broken rule included); strings are collected in
    ``strings`` for :func:`_strings_clean`. A reference cycle hits the depth limit.
    """
    kind = type(value)
    if kind is str:
        strings.append(value)
        return value
    if value is None or kind is bool:
        return value
    if kind is int:
        if INT_MIN <= value < INT_LIMIT:
            return value
        raise _Unusual
    if kind is float:
        if value - value == 0.0:  # NaN and ±Infinity give NaN
            return value
        raise _Unusual
    if depth >= MAX_DEPTH:
        raise _Unusual
    depth += 1
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unusual
            strings.append(key)
            sub = type(item)
            if sub is str:
                strings.append(item)
                out[key] = item
            elif sub is int and INT_MIN <= item < INT_LIMIT:
                out[key] = item
            else:
                out[key] = _fast(item, depth, strings)
        return out
    if kind is list or kind is tuple:
        return [_fast(item, depth, strings) for item in value]
    raise _Unusual


def _check(value: Any, path: str, depth: int, active: set[int]) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        check_string(value, path)
        return str(value)
    if isinstance(value, int):
        if not INT_MIN <= value < INT_LIMIT:
            raise reject(path, f"integer {value} does not fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise reject(path, "NaN is not valid JSON")
        if math.isinf(value):
            raise reject(path, "Infinity is not valid JSON")
        return float(value)
    if isinstance(value, (Mapping, list, tuple)):
        if depth >= MAX_DEPTH:
            raise reject(path, f"nested deeper than {MAX_DEPTH} levels")
        if id(value) in active:
            raise reject(path, "contains a reference cycle")
        active.add(id(value))
        try:
            if isinstance(value, Mapping):
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise reject(path, f"object key {key!r} is not a string")
                    sub = field_path(path, key)
                    check_string(key, sub + " (key)")
                    out[key] = _check(item, sub, depth + 1, active)
                return out
            return [_check(item, field_path(path, i), depth + 1, active) for i, item in enumerate(value)]
        finally:
            active.discard(id(value))
    raise reject(
        path, f"value of type {type(value).__name__} is not a JSON type (use dict, list, str, int, float, bool or None)"
    )
