"""The trace's data model: one ``Event`` per line after the ``session.header``.

Wire form (trace-format §1, §3) is byte for byte what the reference engine's Go writer
(``store.JSONLSink``, ``encoding/json``) writes, so a trace written here and rewritten by
it is identical (see :func:`dumps` for the encoding):

- fields always in the reference writer's order, payload last::

      turn, seq, ts, kind, state_path, parent_turn, call_id, episode_id, match_idx, payload

- optional fields omitted when absent, and — as Go's ``omitempty`` does — when empty:
  ``state_path``/``call_id``/``episode_id`` ``""``, ``parent_turn``/``match_idx`` ``0``
  (a ``match_idx`` absent beside an ``episode_id`` reads back as 0);
- payload key order preserved as given;
- timestamps RFC3339Nano in UTC with ``Z``, trailing fractional zeros trimmed as Go's
  ``time.RFC3339Nano`` does (``…09:00:00.12Z``, ``…09:00:00Z``); the reader accepts any
  1–9 digit fraction, so traces from earlier localllm versions (always 9 digits) still read.

The header line is ``{"kind":"session.header","schema_version":1,"written_at":"<ts>"}``.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

__all__ = [
    "EVENT_FIELDS",
    "HEADER_KIND",
    "SCHEMA_VERSION",
    "Event",
    "canonical_ts",
    "dumps",
    "format_ts",
    "go_escape",
    "go_float",
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
    "parent_turn",
    "call_id",
    "episode_id",
    "match_idx",
    "payload",
)
"""Wire order of an event line's fields (the reference writer's ``traceEvent``)."""

#: fields Go's writer omits when empty ("" or 0), beside those omitted when ``None``
OMIT_EMPTY = ("state_path", "parent_turn", "call_id", "episode_id", "match_idx")

_TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z")
_NS_PER_S = 1_000_000_000


def format_ts(ns: int | None = None) -> str:
    """``ns`` nanoseconds since the epoch (default: now) as UTC RFC3339Nano, as Go writes it.

    Trailing zeros of the fraction are trimmed, and the dot with them when the fraction
    is zero: ``…09:00:00.123456789Z``, ``…09:00:00.12Z``, ``…09:00:00Z``.
    """
    if ns is None:
        ns = time.time_ns()
    secs, frac = divmod(ns, _NS_PER_S)
    stamp = _whole_seconds(secs)
    if frac:
        return f"{stamp}.{frac:09d}".rstrip("0") + "Z"
    return stamp + "Z"


@functools.lru_cache(maxsize=4)
def _whole_seconds(secs: int) -> str:
    """``secs`` since the epoch as ``YYYY-MM-DDTHH:MM:SS`` (UTC); a writer stamps many events a second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))


def canonical_ts(value: str) -> str:
    """An RFC3339 UTC stamp as Go's writer re-marshals it: fraction trailing zeros trimmed
    (``…00.120Z`` → ``…00.12Z``, ``…00.000Z`` → ``…00Z``)."""
    if "." not in value:
        return value
    head, frac = value[:-1].split(".", 1)
    frac = frac.rstrip("0")
    return f"{head}.{frac}Z" if frac else head + "Z"


def is_rfc3339_utc(value: object) -> bool:
    """True when ``value`` is an RFC3339 UTC timestamp with an explicit ``Z``, and a real
    instant (month 13, February 30 or hour 24 are refused, as Go's ``time.Parse`` refuses them)."""
    if not isinstance(value, str) or _TS_RE.fullmatch(value) is None:
        return False
    # Go's year 0 (a leap year, as 2000 is), which Python's datetime cannot hold
    stamp = "2000" + value[4:19] if value.startswith("0000") else value[:19]
    try:
        datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return False
    return True


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})
# A float literal whose Python ``repr`` differs from Go's text: integral (``1.0``, ``-0.0``,
# ``123.0``) or in exponent form (``1e-07``, ``2.5e+16``). Any other ``repr`` (``0.91``) is
# already Go's: both write the shortest round-tripping digits, and Python keeps the plain
# form for 1e-4 <= |x| < 1e16, inside Go's 1e-6 <= |x| < 1e21. A number ends at ",", "]",
# "}" or the end of the text; a string that looks alike (``"v1.0,"``) only costs the exact pass.
_GO_DIFFERS = re.compile(r"\d(?:\.0(?:[,\]}]|$)|(?:\.\d+)?e[-+]\d)")
_STRING_OR_FLOAT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+))')


#: ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`` without
#: building an encoder on every call
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _may_hold_float(text: str) -> bool:
    """False when ``text`` surely holds no float literal that Go would write differently."""
    if ".0" not in text and "e-" not in text and "e+" not in text:
        return False
    return _GO_DIFFERS.search(text) is not None


def dumps(obj: Any) -> str:
    """The trace's JSON encoding: byte for byte what Go's ``encoding/json`` writes.

    The one place the trace's encoding is decided. Compact (no spaces), UTF-8 text
    (not ``\\u``-escaped), key order kept, no NaN/Infinity, and Go's differences from
    Python's ``json.dumps``:

    - ``<``, ``>``, ``&``, U+2028, U+2029 are escaped (``\\u003c``, ``\\u003e``,
      ``\\u0026``, ``\\u2028``, ``\\u2029``) — they can only occur inside strings, so
      one ``str.translate`` of the output does it;
    - floats are written as Go does (``strconv`` shortest digits, ``'f'`` form for
      1e-6 <= |x| < 1e21, ``'e'`` otherwise with ``e-07`` cleaned to ``e-7``): ``1.0`` →
      ``1``, ``1e-07`` → ``1e-7``, ``1e+16`` → ``10000000000000000``. Only lines that
      may hold a float (a cheap ``str.find`` test) take that (regex) pass.

    Control characters are escaped alike by both (``\\n``, ``\\t``, ``\\b``, ``\\f``,
    ``\\u001b``, as Go >= 1.22 does).
    """
    text = _encode(obj)
    if "<" in text or ">" in text or "&" in text or "\u2028" in text or "\u2029" in text:
        text = text.translate(_GO_ESCAPES)
    if _may_hold_float(text):
        text = _STRING_OR_FLOAT.sub(_go_float_match, text)
    return text


def go_escape(text: str) -> str:
    """``text`` (JSON) with Go's extra escapes applied (``<``, ``>``, ``&``, U+2028, U+2029)."""
    if "<" in text or ">" in text or "&" in text or "\u2028" in text or "\u2029" in text:
        return text.translate(_GO_ESCAPES)
    return text


def _go_float_match(match: re.Match[str]) -> str:
    literal = match.group(1)
    return match.group(0) if literal is None else go_float(literal)


def go_float(literal: str) -> str:
    """A float literal as Python's ``repr`` writes it, rewritten as Go's ``encoding/json`` does."""
    value = float(literal)
    if value == 0:
        return "-0" if literal.startswith("-") else "0"
    text = repr(value)
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        # repr already uses the exponent form here; Go trims one leading exponent zero
        return re.sub(r"e-0(\d)$", r"e-\1", text)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


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
    raw_line: bytes | None = field(default=None, init=False, repr=False, compare=False)
    """The line this event was read from (set by the reader; ``dataclasses.replace`` drops it).

    The reference writer keeps a read payload's bytes (a ``json.RawMessage``): re-emitting
    the event writes them again as Go compacts them, never re-encoded (``1.0`` stays ``1.0``)."""

    @property
    def off_path(self) -> bool:
        """True for off-path events (they carry ``parent_turn``)."""
        return self.parent_turn is not None

    def to_json(self) -> dict[str, Any]:
        """The wire object, fields in :data:`EVENT_FIELDS` order, absent optionals omitted."""
        # spelled out (every event written passes here): EVENT_FIELDS order; OMIT_EMPTY's "" and 0 are falsy
        out: dict[str, Any] = {}
        if self.turn is not None:
            out["turn"] = self.turn
        if self.seq is not None:
            out["seq"] = self.seq
        if self.ts is not None:
            out["ts"] = self.ts
        if self.kind is not None:
            out["kind"] = self.kind
        if self.state_path:
            out["state_path"] = self.state_path
        if self.parent_turn:
            out["parent_turn"] = self.parent_turn
        if self.call_id:
            out["call_id"] = self.call_id
        if self.episode_id:
            out["episode_id"] = self.episode_id
        if self.match_idx:
            out["match_idx"] = self.match_idx
        if self.payload is not None:
            out["payload"] = self.payload
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
            # Go omits a zero match_idx: beside an episode_id, absent means 0
            match_idx=obj.get("match_idx", 0 if obj.get("episode_id") is not None else None),
        )
