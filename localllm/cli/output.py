"""What every command shares: exit codes, ``UsageError``, stdout/stderr helpers, ``K=V`` parsing.

Data goes to stdout, messages to stderr. Only the standard library and
:mod:`localllm.errors` are imported here, so the command table stays cheap.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from localllm.errors import LocalLLMError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

PREFIX = "localllm: "


class UsageError(LocalLLMError):
    """Bad command-line usage (exit 2); ``usage`` is the parser's usage line, when known."""

    def __init__(self, message: str, *, hint: str = "", usage: str = "") -> None:
        super().__init__(message)
        if hint:
            self.hint = hint
        self.usage = usage


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def out(line: str) -> None:
    """One line of data on stdout."""
    sys.stdout.write(line + "\n")


def err(message: str) -> None:
    """One message on stderr."""
    sys.stderr.write(message + "\n")


def warn(message: str) -> None:
    """A one-line ``localllm: warning: …`` on stderr."""
    err(f"{PREFIX}warning: {message}")


def parse_kv(pairs: Sequence[str] | None, *, flag: str = "--arg") -> dict[str, str]:
    """``K=V`` arguments → dict (``--arg``, ``--world``); the last value of a repeated key wins."""
    values: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {pair!r} is not K=V", hint=f"write {flag} NAME=VALUE")
        values[key] = value
    return values
