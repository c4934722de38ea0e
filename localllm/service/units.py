"""Durations and sizes as ``localllm serve`` and its requests write them (a leaf module)."""

from __future__ import annotations

import re

__all__ = ["parse_duration", "parse_size"]

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|G|GB|MiB|M|MB)?\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """``5m``, ``30s``, ``1.5h``, ``250ms``, ``0`` (unload at once), ``-1`` (never) → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 0 or -1)")
    value = float(match.group(1))
    unit = match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]


def parse_size(text: str) -> int:
    """A memory size; a bare number is GiB: ``6``, ``6GiB``, ``512MiB`` → bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a memory size: {text!r} (use e.g. 6, 6GiB or 512MiB)")
    unit = (match.group(2) or "GiB").lower()
    scale = 1 << 20 if unit.startswith("m") else 1 << 30
    return int(float(match.group(1)) * scale)
