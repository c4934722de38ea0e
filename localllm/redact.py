"""Secret redaction: every resolved secret value becomes ``***`` wherever text could surface.

What is a secret (:meth:`localllm.config.Config.secret_values`): a value a ``${VAR}``
reference resolved to in ``env:``/``headers:`` (and the whole interpolated value), the
current value of every ``api_key_env`` variable, and credentials in a plugin's mcp.json
URL. A plain value written in the config (``DEBUG: "1"``, ``PLUGIN_ALIAS: agent.plug``) is
configuration, never masked.

How: an occurrence of a secret (or of its JSON-escaped form) is replaced by ``***``; every
other character is kept. Values shorter than :data:`MIN_SECRET` are never masked (they
cannot be credentials); values shorter than :data:`SAFE_LENGTH` are masked only as a whole
token, never inside another word (a 4-letter key must not turn "invalid" into "in***").

The Runtime builds one :class:`Redactor` and applies it at the two places text leaves a
call: the error it raises and the trace payloads (and sidecar files) it records.
Structural fields (kind, call_id, turn, seq, ts) are never rewritten: a secret that would
land in one fails the call instead (:meth:`Redactor.find`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "MAX_DEPTH", "MIN_SECRET", "SAFE_LENGTH", "TOO_DEEP", "Redactor", "mask_option_values"]

MASK = "***"
#: shorter values are not secrets: replacing "1" or "on" would shred unrelated text
MIN_SECRET = 4
#: shorter secrets are masked only where they stand alone, never inside another word
SAFE_LENGTH = 8
#: how deep :meth:`Redactor.value` looks; what lies deeper is replaced by TOO_DEEP
MAX_DEPTH = 200
TOO_DEEP = "<nested too deeply to redact>"
_WORD = r"[0-9A-Za-z_]"


def mask_option_values(argv: Iterable[str], options: Iterable[str]) -> list[str]:
    """``argv`` with the value of each of ``options`` replaced by ``***`` (``--opt V`` and ``--opt=V``)."""
    hidden = frozenset(options)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        option, eq, _ = arg.partition("=")
        if option in hidden and eq:
            out.append(f"{option}={MASK}")
        else:
            out.append(arg)
            hide_next = option in hidden
    return out


class Redactor:
    """Replaces each secret (and its JSON-escaped form) with ``***`` in text and JSON values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not isinstance(secret, str) or len(secret) < MIN_SECRET:
                continue
            for form in {secret, unicodedata.normalize("NFC", secret)}:  # the trace stores NFC text
                forms.add(form)
                # a server that echoes the key inside a JSON string escapes it
                forms.add(json.dumps(form, ensure_ascii=False)[1:-1])
                forms.add(json.dumps(form)[1:-1])
        # longest first, so a secret containing another is replaced whole
        self._secrets = sorted(forms, key=lambda s: (-len(s), s))
        parts = [
            re.escape(s) if len(s) >= SAFE_LENGTH else f"(?<!{_WORD}){re.escape(s)}(?!{_WORD})" for s in self._secrets
        ]
        self._pattern = re.compile("|".join(parts)) if parts else None

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"<Redactor {len(self._secrets)} value(s)>"

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)

    def find(self, text: str) -> bool:
        """Whether ``text`` holds a secret (one that ``__call__`` would mask)."""
        return self._pattern is not None and self._pattern.search(text) is not None

    def value(self, value: Any, _depth: int = 0) -> Any:
        """``value`` with every string inside it (keys too) redacted; other values as they are.

        Anything nested deeper than ``MAX_DEPTH`` (a reference cycle too) becomes
        :data:`TOO_DEEP`: it cannot be checked for secrets, so it is not passed on."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, (Mapping, list, tuple)) and _depth >= MAX_DEPTH:
            return TOO_DEEP
        if isinstance(value, Mapping):
            return {self(k) if isinstance(k, str) else k: self.value(v, _depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, _depth + 1) for v in value]
        return value
