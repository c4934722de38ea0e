"""Secret redaction: every known secret value becomes ``***`` wherever text could surface.

The Runtime builds one :class:`Redactor` from its config's secret values (resolved
``env:``/``headers:`` values and the keys named by ``api_key_env``) and applies it at the
two places text leaves a call: the error it raises and the trace payloads (and sidecar
files) it records. Transports need not redact per call site.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "Redactor"]

MASK = "***"
#: shorter values are not redacted: replacing "1" or "on" would shred unrelated text
_MIN_SECRET = 4


class Redactor:
    """Replaces each secret (and its JSON-escaped form) with ``***`` in text and JSON values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not isinstance(secret, str) or len(secret) < _MIN_SECRET:
                continue
            forms.add(secret)
            # a server that echoes the key inside a JSON string escapes it
            forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
            forms.add(json.dumps(secret)[1:-1])
        # longest first, so a secret containing another is replaced whole
        self._secrets = sorted(forms, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __repr__(self) -> str:
        return f"<Redactor {len(self._secrets)} value(s)>"

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def value(self, value: Any) -> Any:
        """``value`` with every string inside it (keys too) redacted; other values as they are."""
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value
