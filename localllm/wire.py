"""Wire types of the agent plugin contract (§3): AskRequest, AskResponse, CallResult.

``AskResponse.submission`` is the agent's answer as raw JSON *text* (the contract's
"JSON bytes"): the runtime parses and validates it, so a malformed answer is reported
as ``schema_invalid`` rather than lost inside a transport.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from localllm.errors import AgentError, ErrorKind

__all__ = [
    "LONE_SURROGATE",
    "VERBS",
    "AgentError",
    "AskRequest",
    "AskResponse",
    "CallResult",
    "ErrorKind",
    "Transcript",
    "bad_sub_event_payload",
    "finite_float",
    "loads_json",
    "no_constant",
    "text_problem",
]

VERBS = ("ask", "decide", "extract", "task", "converse")


def nesting(value: Any, limit: int) -> int:
    """How deep a JSON value nests (a scalar: 1), without recursion; stops counting past
    ``limit`` (a 10,000-deep input costs no more than a ``limit``-deep one)."""
    # level by level, keeping only containers: a scalar's depth is its container's + 1, so an
    # array of 8 million numbers costs one pass over it, not a stack entry each (3.4 s)
    if not isinstance(value, (dict, list)):
        return 1
    level: list[Any] = [value]
    depth = 1
    while any(level):  # an empty container is falsy: nothing below it
        depth += 1
        if depth > limit:
            return depth
        below: list[Any] = []
        for node in level:
            below += [v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, (dict, list))]
        if not below:
            break
        level = below
    return depth


def finite_float(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number a float holds: not a bool, not inf or
    nan, and an int within the float range (``10**400`` parses from JSON text, and
    ``math.isfinite``/``float`` raise ``OverflowError`` on it). ``None`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def no_constant(name: str) -> Any:
    """``json.loads(text, parse_constant=no_constant)`` refuses NaN and Infinity by name."""
    raise ValueError(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``/``Infinity``/``-Infinity`` (Python accepts them;
    JSON, the trace and every other reader do not), and nesting deeper than Python's decoder
    goes as a ``ValueError`` like any other malformed text, not a ``RecursionError``."""
    try:
        return json.loads(text, parse_constant=no_constant)
    except RecursionError:
        raise ValueError("nested too deeply for the JSON decoder") from None


#: a lone surrogate: what Python makes of bytes that are not UTF-8 (no UTF-8 text holds one)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be sent as UTF-8, or None: a lone surrogate, which is what Python
    makes of bytes that are not UTF-8 (a command line or a file in another encoding)."""
    found = LONE_SURROGATE.search(text)
    if found is None:
        return None
    return f"holds a lone surrogate U+{ord(found.group()):04X} at character {found.start()}, which is no UTF-8 text"


@dataclass(frozen=True)
class AskRequest:
    """What the runtime sends to a plugin."""

    session_id: str
    turn: int
    state_path: str
    verb: str
    prompt: str
    call_id: str
    deadline: str
    schema: dict[str, Any] | None = None
    with_: dict[str, Any] | None = None
    world: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turn": self.turn,
            "state_path": self.state_path,
            "verb": self.verb,
            "prompt": self.prompt,
            "schema": self.schema,
            "with": self.with_,
            "world": self.world,
            "deadline": self.deadline,
            "call_id": self.call_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AskRequest:
        return cls(
            session_id=str(data["session_id"]),
            turn=int(data["turn"]),
            state_path=str(data["state_path"]),
            verb=str(data["verb"]),
            prompt=str(data["prompt"]),
            call_id=str(data["call_id"]),
            deadline=str(data["deadline"]),
            schema=data.get("schema"),
            with_=data.get("with"),
            world=dict(data.get("world") or {}),
        )


@dataclass(frozen=True)
class Transcript:
    """A backend-native event stream for the transcript sidecar.

    ``lines`` are byte-verbatim JSON lines (no trailing newline); ``offsets_ms`` holds the
    capture-time offset of each line, for the ``.timings`` file.
    """

    format: str
    lines: list[str]
    offsets_ms: list[int]


@dataclass(frozen=True)
class AskResponse:
    """What a plugin returns.

    ``episode_id`` / ``match_idx`` are set by a replaying transport (a cassette): the call's
    id then derives from ``episode_id:match_idx`` instead of the live key (trace-format §5).
    """

    submission: str | None
    meta: dict[str, Any] | None = None
    sub_events: list[dict[str, Any]] = field(default_factory=list)
    transcript: Transcript | None = None
    episode_id: str | None = None
    match_idx: int | None = None

    @classmethod
    def of(cls, value: Any, meta: dict[str, Any] | None = None) -> AskResponse:
        """Build a response from a Python value (serialised as JSON text)."""
        return cls(submission=json.dumps(value, ensure_ascii=False), meta=meta)

    def to_json(self) -> dict[str, Any]:
        """The JSON-RPC/MCP form: ``submission`` as a JSON value when it parses."""
        submission: Any = None
        if self.submission is not None:
            try:
                submission = json.loads(self.submission)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than json decodes
                submission = self.submission
        return {"submission": submission, "meta": self.meta, "sub_events": self.sub_events}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AskResponse:
        """Inverse of :meth:`to_json`; a string submission is kept as raw text."""
        raw = data.get("submission")
        if raw is None:
            text = None
        elif isinstance(raw, str):
            text = raw
        else:
            text = json.dumps(raw, ensure_ascii=False)
        meta = data.get("meta")
        subs = data.get("sub_events") or []
        if meta is not None and not isinstance(meta, dict):
            raise AgentError(ErrorKind.TRANSPORT_ERROR, "AskResponse.meta is not an object")
        if not isinstance(subs, list) or not all(isinstance(e, dict) for e in subs):
            raise AgentError(ErrorKind.TRANSPORT_ERROR, "AskResponse.sub_events is not a list of objects")
        wrong = bad_sub_event_payload(subs)
        if wrong is not None:
            raise AgentError(ErrorKind.TRANSPORT_ERROR, f"AskResponse.sub_events[{wrong}].payload is not an object")
        return cls(submission=text, meta=meta, sub_events=list(subs))


@dataclass(frozen=True)
class CallResult:
    """The validated outcome of one agent call."""

    submission: Any
    meta: dict[str, Any]
    call_id: str
    ok: bool = True
    exit_code: int = 0
    #: the alias that produced the answer (``agent.claude`` after a fallback)
    agent: str = ""

    @property
    def submitted(self) -> Any:
        """Alias of ``submission`` (contract §2 bind source)."""
        return self.submission


def bad_sub_event_payload(sub_events: list[dict[str, Any]]) -> int | None:
    """The index of the first sub-event whose ``payload`` is neither absent, ``null`` nor a
    JSON object (a trace event's payload is an object), else ``None``."""
    for i, event in enumerate(sub_events):
        payload = event.get("payload")
        if payload is not None and not isinstance(payload, dict):
            return i
    return None
