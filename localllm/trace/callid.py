"""Deterministic agent call ids (trace-format §5).

``call_id = hex(sha256("agent-call:" + app_id + ":" + key)[:8 bytes])``, where ``key`` is
``turn:state_path:seq`` for a live call and ``episode_id:match_idx`` for a cassette call.
"""

from __future__ import annotations

import hashlib

__all__ = ["cassette_call_key", "derive_call_id", "live_call_key"]


def derive_call_id(app_id: str, key: str) -> str:
    """The 16-hex-digit call_id of ``key`` within ``app_id``."""
    digest = hashlib.sha256(f"agent-call:{app_id}:{key}".encode()).digest()
    return digest[:8].hex()


def live_call_key(turn: int, state_path: str, seq: int) -> str:
    """Key of a live call: ``turn:state_path:seq``."""
    return f"{turn}:{state_path}:{seq}"


def cassette_call_key(episode_id: str, match_idx: int) -> str:
    """Key of a cassette-backed call: ``episode_id:match_idx``."""
    return f"{episode_id}:{match_idx}"
