"""Recorded calls out of a trace: the input to reports, ``trace cases`` and ``trace cassette``.

A call is the group ``agent.call.start`` … ``agent.call.complete | agent.call.error`` with one
call_id. Responses and prompts kept in sidecar files are read back (paths are taken only
inside the trace's directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from localllm._fs import DATA_LIMIT, TEXT_LIMIT, inside, read_capped
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
    #: the answering agent's transcript, ``{format, events, timings}`` as a cassette holds it
    transcript: dict[str, Any] | None = None


def _inside(base: Path, rel: Any, what: str, call_id: str) -> Path | None:
    """The sidecar ``rel`` names (None when it names none); a TraceError when it lies outside
    ``base`` (also through a symlink) or its links loop."""
    if rel is None:
        return None
    path = inside(base, rel) if isinstance(rel, str) else None
    if path is None:  # absolute, escaping (a symlink too), looping, or no path at all
        raise TraceError(f"call {call_id}: the {what} {rel!r} is not a file inside {base}", hint=_VERIFY)
    return path


_VERIFY = "run `localllm trace verify` on the trace"


def _response(base: Path, payload: dict[str, Any], call_id: str) -> Any:
    if "response" in payload:
        return submission_of(payload["response"])
    path = _inside(base, payload.get("response_file"), "response_file", call_id)
    if path is None:
        return None
    try:
        return submission_of(json.loads(read_capped(path, DATA_LIMIT, regular=True).decode("utf-8")))
    except (OSError, ValueError, RecursionError) as exc:
        raise TraceError(f"{path}: cannot read the response sidecar: {exc}", hint=_VERIFY) from exc


def _transcript(base: Path, ref: Any, call_id: str) -> dict[str, Any] | None:
    """A transcript sidecar as a cassette's ``{format, events, timings}`` (lines verbatim);
    ``None`` when absent or unreadable (the cassette then replays without one)."""
    if not isinstance(ref, dict) or not isinstance(ref.get("format"), str):
        return None
    path = _inside(base, ref.get("path"), "transcript_ref.path", call_id)
    if path is None:
        return None
    try:
        # lines end at "\n" only: str.splitlines() also breaks at a raw U+2028 / U+0085, which a
        # transport's JSON line may hold (llama-server's and node's encoders leave them raw)
        events = read_capped(path, DATA_LIMIT, regular=True).decode("utf-8").split("\n")
        if events and events[-1] == "":
            events.pop()
        timings_text = read_capped(path.with_suffix(".timings"), DATA_LIMIT, regular=True).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    timings: list[int] = []
    for line in timings_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            timings.append(int(parts[1]))
    out: dict[str, Any] = {"format": ref["format"], "events": events}
    if len(timings) == len(events):
        out["timings"] = timings
    return out


def submission_of(response: Any) -> Any:
    """The submission of a recorded ``response``: ``{"submission", "meta"?}`` (the reference's
    shape, written since localllm follows it), or the bare submission of earlier traces."""
    if isinstance(response, dict) and "submission" in response and set(response) <= {"submission", "meta"}:
        return response["submission"]
    return response


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
                    # relative to the config's directory (absolute in traces of earlier versions)
                    schema_path=given.get("schema_path") if isinstance(given.get("schema_path"), str) else None,
                    ok=ok,
                    response=_response(base, ev.payload, ev.call_id) if ok else None,
                    meta=dict(meta) if isinstance(meta, dict) else {},
                    kind=None if ok else str(ev.payload.get("kind")),
                    error=None if ok else str(ev.payload.get("error")),
                    duration_ms=float(duration)
                    if isinstance(duration, (int, float)) and not isinstance(duration, bool)
                    else None,
                    fallback="substitution" in ev.payload,
                    answered_by=_answered_by(ev.payload, start.payload.get("agent")),
                    episode_id=start.episode_id,
                    transcript=_transcript(base, ev.payload.get("transcript_ref"), ev.call_id),
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


def _schema_properties(schema_path: str | None, search: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The recorded schema's properties; a relative path (as recorded since traces carry no
    host paths) is looked for under each of ``search`` in turn, then the current directory."""
    if schema_path is None:
        return {}
    candidates = [Path(schema_path)] if Path(schema_path).is_absolute() else [d / schema_path for d in search]
    candidates.append(Path(schema_path))
    schema: Any = None
    for candidate in candidates:
        try:
            schema = json.loads(read_capped(candidate, TEXT_LIMIT, regular=True).decode("utf-8"))
            break
        except (OSError, ValueError, RecursionError):
            continue
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _field_matcher(value: Any, prop: Any) -> Any:
    """A recorded answer's field as a matcher: equal for enums, numbers and booleans; any
    valid free text (a summary will not repeat word for word)."""
    prop = prop if isinstance(prop, dict) else {}
    if "enum" in prop or "const" in prop or not isinstance(value, str):
        return value
    return {"any_valid": True}


def cases_from_calls(
    calls: list[RecordedCall], gate: str, *, exact: bool = False, search: tuple[Path, ...] = ()
) -> list[str]:
    """JSONL lines of unlabelled cases from the gate's successful calls (one per distinct args).

    ``search``: directories a recorded (relative) schema path is resolved against — the
    config's directory first, then the trace's."""
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
            props = _schema_properties(call.schema_path, search)
            expect = {name: _field_matcher(value, props.get(name)) for name, value in call.response.items()}
        lines.append(dump_case(f"{gate}-{call.call_id}", call.args, expect, labelled=False))
    return lines


_MATCH_FACTS = frozenset({"verb", "handler", "phase", "schema_name"})


def cassette_from_calls(
    calls: list[RecordedCall],
    *,
    agent: str | None = None,
    replay_any: bool = False,
    match_handler: bool = False,
    app_id: str | None = None,
) -> dict[str, Any]:
    """A ``host_cassette`` document replaying the calls (of ``agent`` only, when given),
    in the reference engine's format (Kitsoki replays it too).

    Each episode matches the call's verb, schema file name and args (and its handler with
    ``match_handler``, else it also answers a local model's fallback); an argument named
    ``verb``, ``handler``, ``phase`` or ``schema_name`` is left out (those keys match the
    request's own verb, handler, phase and schema). The episode id is
    the recorded ``episode_id`` when the call was itself replayed, so replaying a replayed
    run gives the very same call_ids; a live call's episode is named by its call_id.
    The ``agent:`` block carries the recorded metadata the reference records (``agent``,
    ``model``, ``duration_ms``, ``prompt_tokens``, ``response_tokens``, ``cost_usd``) and
    ``response`` as JSON text, and the answer's transcript as ``{format, events, timings}``
    (its sidecar lines verbatim); a recorded error replays as that error (``error`` its
    detail, ``error_kind`` its kind — the reference reads the detail as a plugin_crash).
    localllm's own extras (``meta``, ``sub_events``) are keys the reference ignores.
    """
    episodes: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    keys: list[str] = []
    for call in calls:
        if agent is not None and agent != call.answered_by:
            continue
        match: dict[str, Any] = {}
        if match_handler and call.agent:
            match["handler"] = call.agent
        if call.verb:
            match["verb"] = call.verb
        if call.schema_path is not None:
            match["schema_name"] = PurePosixPath(call.schema_path).name  # as the reference compares it
        # an argument named like a match key (verb, handler, phase, schema_name) cannot be
        # matched on: the key means the request's own fact there, never the argument
        match.update({k: v for k, v in call.args.items() if k not in _MATCH_FACTS})
        keys += [k for k in match if k not in keys]
        body: dict[str, Any] = {"verb": call.verb} if call.verb else {}
        body.update(_recorded(call))
        if call.ok:
            body["response"] = _response_text(call.response)
        else:
            body["error"] = _detail(call.error or "", call.kind, call.agent)
            body["error_kind"] = call.kind
        meta = {
            k: v
            for k, v in call.meta.items()
            if k not in ("transport", "episode_id", "match_idx", "call_id", "fallback_of", "selected_by")
        }
        if meta:
            body["meta"] = meta
        if call.sub_events:
            body["sub_events"] = [{"kind": ev.kind, "payload": ev.payload} for ev in call.sub_events]
        if call.transcript is not None:
            body["transcript"] = call.transcript
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
    doc: dict[str, Any] = {"kind": "host_cassette"}
    if app_id is not None:
        doc["app_id"] = app_id
    doc["match_on"] = keys
    doc["record_mode"] = "none"
    doc["episodes"] = episodes
    return doc


def _recorded(call: RecordedCall) -> dict[str, Any]:
    """The reference's recorded metadata of one call (its cassette EpisodeAgent fields)."""
    out: dict[str, Any] = {}
    if call.answered_by:
        out["agent"] = call.answered_by
    if isinstance(call.meta.get("model"), str):
        out["model"] = call.meta["model"]
    if call.duration_ms:
        out["duration_ms"] = int(call.duration_ms)
    raw_usage = call.meta.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    for key, names in (
        ("prompt_tokens", ("prompt_tokens", "input_tokens")),
        ("response_tokens", ("completion_tokens", "output_tokens")),
    ):
        for name in names:
            value = call.meta.get(name, usage.get(name))
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = value
                break
    cost = call.meta.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost > 0:
        out["cost_usd"] = cost
    return out


def _response_text(value: Any) -> str:
    """A submission as the reference's ``agent.response`` string: JSON text for an object or
    array; the text itself for a string (the reference replays it as a JSON string)."""
    if isinstance(value, str) and value[:1] not in ("{", "[", ""):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def trace_app_id(path: Path) -> str | None:
    """The app_id a trace names (its ``session.story`` event's), or ``None``."""
    from localllm.trace.reader import read_trace

    try:
        trace = read_trace(path, allow_torn=True, lenient=True)
    except (OSError, TraceError):
        return None
    for ev in trace.events:
        if ev.kind == "session.story" and isinstance(ev.payload.get("app_id"), str):
            return str(ev.payload["app_id"])
    return None


def _detail(message: str, kind: str | None, alias: str | None) -> str:
    """A recorded error message without the ``agent: <kind>: <alias>: `` that replay adds again."""
    for prefix in (f"agent: {kind}: {alias}: ", f"agent: {kind}: "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message
