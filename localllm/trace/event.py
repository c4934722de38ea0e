"""The trace's data model: one ``Event`` per line after the ``session.header``.

Wire form (trace-format §1, §3): compact JSON (no spaces), UTF-8 (``ensure_ascii=False``),
fields always in this order, optional fields omitted when absent (``None``)::

    turn, seq, ts, kind, state_path, payload, parent_turn, call_id, episode_id, match_idx

Payload key order is preserved as given. The header line is
``{"kind":"session.header","schema_version":1,"written_at":"<ts>"}``.
Timestamps are RFC3339Nano in UTC with a ``Z`` suffix and nine fractional digits when
written (``2026-01-15T09:00:00.123456789Z``); the reader also accepts Go's trimmed form
(``2026-06-09T12:00:00Z``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVENT_FIELDS",
    "HEADER_KIND",
    "SCHEMA_VERSION",
    "Event",
    "dumps",
    "format_ts",
    "header_line",
    "is_rfc3339_utc",
]

HEADER_KIND = "session.header"
SCHEMA_VERSION = 1
"""The highest ``schema_version`` this reader understands, and the one the writer writes."""

EVENT_FIELDS = (
    "turn",
    "seq",
    "ts",
    "kind",
    "state_path",
    "payload",
    "parent_turn",
    "call_id",
    "episode_id",
    "match_idx",
)
"""Wire order of an event line's fields."""

_TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z")
_NS_PER_S = 1_000_000_000


def format_ts(ns: int | None = None) -> str:
    """``ns`` nanoseconds since the epoch (default: now) as UTC RFC3339Nano with 9 digits."""
    if ns is None:
        ns = time.time_ns()
    secs, frac = divmod(ns, _NS_PER_S)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


def is_rfc3339_utc(value: object) -> bool:
    """True when ``value`` is an RFC3339 UTC timestamp with an explicit ``Z``."""
    return isinstance(value, str) and _TS_RE.fullmatch(value) is not None


def dumps(obj: Any) -> str:
    """The trace's JSON encoding: compact, UTF-8, key order kept, no NaN/Infinity."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def header_line(written_at: str | None = None) -> bytes:
    """The ``session.header`` line (without the trailing newline)."""
    obj = {"kind": HEADER_KIND, "schema_version": SCHEMA_VERSION, "written_at": written_at or format_ts()}
    return dumps(obj).encode("utf-8")


@dataclass(frozen=True)
class Event:
    """One trace event (``store.Event``). ``seq`` is assigned by the writer, never the caller."""

    turn: int
    seq: int
    ts: str
    kind: str
    payload: dict[str, Any]
    state_path: str | None = None
    parent_turn: int | None = None
    call_id: str | None = None
    episode_id: str | None = None
    match_idx: int | None = None

    @property
    def off_path(self) -> bool:
        """True for off-path events (they carry ``parent_turn``)."""
        return self.parent_turn is not None

    def to_json(self) -> dict[str, Any]:
        """The wire object, fields in :data:`EVENT_FIELDS` order, absent optionals omitted."""
        out: dict[str, Any] = {}
        for name in EVENT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def to_line(self) -> bytes:
        """The event's line as written (UTF-8, without the trailing newline)."""
        return dumps(self.to_json()).encode("utf-8")

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        """Build from an already-validated wire object (see ``localllm.trace.reader``).

        Fields outside the schema are not kept here; the reader keeps the raw line.
        """
        return cls(
            turn=obj["turn"],
            seq=obj["seq"],
            ts=obj["ts"],
            kind=obj["kind"],
            payload=obj["payload"],
            state_path=obj.get("state_path"),
            parent_turn=obj.get("parent_turn"),
            call_id=obj.get("call_id"),
            episode_id=obj.get("episode_id"),
            match_idx=obj.get("match_idx"),
        )
