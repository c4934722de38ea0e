"""Recorded calls out of a trace: the input to reports, ``trace cases`` and ``trace cassette``.

A call is the group ``agent.call.start`` … ``agent.call.complete | agent.call.error`` with one
call_id. Responses and prompts kept in sidecar files are read back (paths are taken only
inside the trace's directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.errors import TraceError
from localllm.eval.cases import dump_case
from localllm.trace.event import Event

__all__ = ["RecordedCall", "cases_from_calls", "cassette_from_calls", "recorded_calls"]

_END = ("agent.call.complete", "agent.call.error")


@dataclass(frozen=True)
class RecordedCall:
    """One call as the trace holds it."""

    call_id: str
    turn: int
    state_path: str | None
    verb: str | None
    agent: str | None
    args: dict[str, Any]
    schema_path: str | None
    ok: bool
    response: Any
    meta: dict[str, Any]
    #: the error kind of a failed call
    kind: str | None
    error: str | None
    duration_ms: float | None
    fallback: bool
    #: who answered: the fallback's alias after a substitution, else ``agent``
    answered_by: str | None
    episode_id: str | None
    match_idx: int | None
    sub_events: tuple[Event, ...] = ()


def _inside(base: Path, rel: Any) -> Path | None:
    if not isinstance(rel, str):
        return None
    path = (base / rel).resolve()
    return path if path.is_relative_to(base.resolve()) else None


def _response(base: Path, payload: dict[str, Any]) -> Any:
    if "response" in payload:
        return payload["response"]
    path = _inside(base, payload.get("response_file"))
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TraceError(
            f"{path}: cannot read the response sidecar: {exc}", hint="run `localllm trace verify` on the trace"
        ) from exc


def recorded_calls(path: Path) -> list[RecordedCall]:
    """Every complete call of the trace at ``path``, in the order their groups were written."""
    from localllm.trace.reader import read_trace

    try:
        trace = read_trace(path, lenient=True)  # traces from earlier versions interleave turns
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}", hint="pass a trace file") from exc
    base = path.parent
    starts: dict[str, Event] = {}
    subs: dict[str, list[Event]] = {}
    calls: list[RecordedCall] = []
    for ev in trace.events:
        if ev.call_id is None:
            continue
        if ev.kind == "agent.call.start":
            starts[ev.call_id] = ev
            subs[ev.call_id] = []
        elif ev.kind in _END and ev.call_id in starts:
            start = starts.pop(ev.call_id)
            given = start.payload.get("input")
            given = given if isinstance(given, dict) else {}
            args = given.get("args")
            meta = ev.payload.get("meta")
            duration = ev.payload.get("duration_ms")
            ok = ev.kind == "agent.call.complete"
            calls.append(
                RecordedCall(
                    call_id=ev.call_id,
                    turn=start.turn,
                    state_path=start.state_path,
                    verb=start.payload.get("verb"),
                    agent=start.payload.get("agent"),
                    args=dict(args) if isinstance(args, dict) else {},
                    schema_path=given.get("schema_path") if isinstance(given.get("schema_path"), str) else None,
                    ok=ok,
                    response=_response(base, ev.payload) if ok else None,
                    meta=dict(meta) if isinstance(meta, dict) else {},
                    kind=None if ok else str(ev.payload.get("kind")),
                    error=None if ok else str(ev.payload.get("error")),
                    duration_ms=float(duration)
                    if isinstance(duration, (int, float)) and not isinstance(duration, bool)
                    else None,
                    fallback="substitution" in ev.payload,
                    answered_by=_answered_by(ev.payload, start.payload.get("agent")),
                    episode_id=start.episode_id,
                    match_idx=start.match_idx,
                    sub_events=tuple(subs.pop(ev.call_id, [])),
                )
            )
        elif ev.call_id in subs:
            subs[ev.call_id].append(ev)
    return calls


def _answered_by(end: dict[str, Any], agent: Any) -> str | None:
    substitution = end.get("substitution")
    if isinstance(substitution, dict) and isinstance(substitution.get("fallback_plugin"), str):
        return str(substitution["fallback_plugin"])
    return agent if isinstance(agent, str) else None


def _schema_properties(schema_path: str | None) -> dict[str, Any]:
    if schema_path is None:
        return {}
    try:
        schema = json.loads(Path(schema_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _field_matcher(value: Any, prop: Any) -> Any:
    """A recorded answer's field as a matcher: equal for enums, numbers and booleans; any
    valid free text (a summary will not repeat word for word)."""
    prop = prop if isinstance(prop, dict) else {}
    if "enum" in prop or "const" in prop or not isinstance(value, str):
        return value
    return {"any_valid": True}


def cases_from_calls(calls: list[RecordedCall], gate: str, *, exact: bool = False) -> list[str]:
    """JSONL lines of unlabelled cases from the gate's successful calls (one per distinct args)."""
    lines: list[str] = []
    seen: set[str] = set()
    for call in calls:
        if call.state_path != gate or not call.ok:
            continue
        key = json.dumps(call.args, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        if exact or not isinstance(call.response, dict):
            expect: Any = {"exact": call.response}
        else:
            props = _schema_properties(call.schema_path)
            expect = {name: _field_matcher(value, props.get(name)) for name, value in call.response.items()}
        lines.append(dump_case(f"{gate}-{call.call_id}", call.args, expect, labelled=False))
    return lines


def cassette_from_calls(
    calls: list[RecordedCall], *, agent: str | None = None, replay_any: bool = False, match_handler: bool = False
) -> dict[str, Any]:
    """A ``host_cassette`` document replaying the calls (of ``agent`` only, when given).

    Each episode matches the call's schema name and args (and its handler with
    ``match_handler``, else it also answers a local model's fallback). The episode id is
    the recorded ``episode_id`` when the call was itself replayed, so replaying a replayed
    run gives the very same call_ids; a live call's episode is named by its call_id.
    A recorded error replays as that error.
    """
    episodes: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for call in calls:
        if agent is not None and agent != call.answered_by:
            continue
        match: dict[str, Any] = {}
        if match_handler and call.agent:
            match["handler"] = call.agent
        if call.schema_path is not None:
            match["schema_name"] = Path(call.schema_path).stem
        match.update(call.args)
        body: dict[str, Any] = {"verb": call.verb} if call.verb else {}
        if call.ok:
            body["response"] = json.dumps(call.response, ensure_ascii=False)
        else:
            body["error"] = {"kind": call.kind, "detail": _detail(call.error or "", call.kind, call.agent)}
        meta = {
            k: v
            for k, v in call.meta.items()
            if k not in ("transport", "episode_id", "match_idx", "fallback_of", "selected_by")
        }
        if meta:
            body["meta"] = meta
        if call.sub_events:
            body["sub_events"] = [{"kind": ev.kind, "payload": ev.payload} for ev in call.sub_events]
        episode_id = call.episode_id or call.call_id
        if episode_id in seen:  # the same episode replayed again: one episode, replayed for ever
            seen[episode_id]["replay"] = "any"
            continue
        episode: dict[str, Any] = {"id": episode_id, "match": match, "agent": body}
        if replay_any:
            episode["replay"] = "any"
        seen[episode_id] = episode
        episodes.append(episode)
    if not episodes:
        raise TraceError(
            "the trace holds no agent calls to replay" + (f" of {agent}" if agent else ""),
            hint="record a run with --trace first (or drop --agent)",
        )
    return {"kind": "host_cassette", "episodes": episodes}


def _detail(message: str, kind: str | None, alias: str | None) -> str:
    """A recorded error message without the ``agent: <kind>: <alias>: `` that replay adds again."""
    for prefix in (f"agent: {kind}: {alias}: ", f"agent: {kind}: "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message
