"""``trace_stats``: counts per kind, agent calls, fallbacks and duration percentiles."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from localllm.trace.event import Event

__all__ = ["percentile", "trace_stats"]

_CALL_END = ("agent.call.complete", "agent.call.error")


def trace_stats(events: Sequence[Event]) -> dict[str, Any]:
    """Counts per kind; agent calls ok/error/fallbacks and duration percentiles, overall and per agent.

    A call is one ``agent.call.complete`` (ok) or ``agent.call.error`` event. It counts as a
    fallback when its payload has ``substitution`` or its ``meta`` has ``fallback_of`` or
    ``substitution``; ``late`` when it ended after its turn (its end carries ``parent_turn``).
    ``turns`` counts each event in the turn it belongs to (``parent_turn`` when set).
    Percentiles use the nearest-rank method over ``duration_ms``.
    """
    kinds = Counter(ev.kind for ev in events)
    overall = _CallTally()
    agents: dict[str, _CallTally] = {}
    for ev in events:
        if ev.kind not in _CALL_END:
            continue
        agent = ev.payload.get("agent")
        name = agent if isinstance(agent, str) and agent else "(unnamed)"
        for tally in (overall, agents.setdefault(name, _CallTally())):
            tally.add(ev)
    return {
        "events": len(events),
        # a late or off-path event counts in the turn it belongs to (parent_turn)
        "turns": len({ev.parent_turn if ev.parent_turn is not None else ev.turn for ev in events}),
        "kinds": dict(sorted(kinds.items())),
        "calls": overall.summary(),
        "agents": {name: agents[name].summary() for name in sorted(agents)},
    }


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (``pct`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


class _CallTally:
    def __init__(self) -> None:
        self.ok = 0
        self.error = 0
        self.fallbacks = 0
        self.late = 0
        self.durations: list[float] = []

    def add(self, ev: Event) -> None:
        if ev.kind == "agent.call.complete":
            self.ok += 1
        else:
            self.error += 1
        if ev.parent_turn is not None:
            self.late += 1
        meta = ev.payload.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        if "substitution" in ev.payload or "fallback_of" in meta or "substitution" in meta:
            self.fallbacks += 1
        duration = ev.payload.get("duration_ms")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool) and math.isfinite(duration):
            self.durations.append(duration)

    def summary(self) -> dict[str, Any]:
        return {
            "total": self.ok + self.error,
            "ok": self.ok,
            "error": self.error,
            "fallbacks": self.fallbacks,
            "late": self.late,
            "p50_ms": percentile(self.durations, 50),
            "p95_ms": percentile(self.durations, 95),
        }
