"""Cassette replay: answer calls from a YAML file of recorded episodes, deterministically.

A cassette is not declarable under ``agent_plugins:``; it is registered in code
(``Runtime.register_agent(alias, CassetteAgent(path))``) or with
``localllm call … --cassette FILE``, replacing the named agent. The file::

    kind: host_cassette
    episodes:
      - id: ep-01
        match:                       # every key must equal (see "Matching")
          handler: agent.fixer
          schema_name: verdict
          repo: localllm             # any other key is a call arg
        agent:
          verb: decide               # informational (validated, not matched)
          response: '{"verdict": "approve"}'   # JSON text, or a YAML mapping/list/scalar
          # error: {kind: plugin_crash, detail: "boom"}   (instead of response)
          # meta: {...}              # recorded meta, merged under the cassette's own keys
          # sub_events: [{kind: agent.fixer.tool, payload: {...}}]
          # transcript: {format: claude-stream-json, lines: ['{"type":"result"}'], offsets_ms: [12]}
        replay: any                  # optional: replay for ever (default: once)
        delay: 0.5                   # optional: seconds to wait before answering

Matching. ``AskRequest.with_`` is the gate's ``with:`` block (``prompt``, ``schema`` as
written, ``args`` the call's arguments). Match key ``handler`` is compared with
``with_["handler"]`` (the cassette's alias when absent), ``schema_name`` with
``with_["schema_name"]``, else the stem of a static ``with_["schema"]`` path, else the
schema's ``title`` (``"inline"`` for an untitled inline schema), and every other key with
``with_["args"][key]`` (an absent arg never matches). Values are
compared as JSON; a string also equals a scalar whose JSON text it is (``"3"`` matches
``3``, ``"true"`` matches ``true``) because CLI ``--arg K=V`` values are strings.

The first episode, in file order, whose keys all match and that is unplayed (or has
``replay: any``) wins; it counts as played from the moment it is chosen, even if its
delay then overruns the deadline. ``match_idx`` is how many times that episode was
played before (0-based), so the runtime derives the call_id from ``episode_id:match_idx``
(set on the AskResponse or error, and in ``meta``). When the runtime continues a trace the
counters start from the matches it already holds (:meth:`CassetteAgent.continue_session`):
``replay: any`` numbering carries on across processes and a played ``once`` episode stays
played, so call_ids stay unique within the trace.
A miss is ``transport_error`` listing every episode. A replayed sub-event without a
``call_id`` gets the request's. An episode with no ``agent:`` but a ``response:`` is a
host (non-agent) episode of a shared host cassette: it is kept out of matching.

The reference engine's cassettes (Kitsoki's ``internal/testrunner`` format) load and
replay as they are:

- top level ``app_id`` (checked against the config's ``app_id`` when the cassette is
  registered: call_ids derive from it), ``app_version``, ``source_run``,
  ``generated_at``, ``match_on`` (documentation only, as in the reference),
  ``record_mode`` (``none`` | ``new_episodes``; localllm only replays, a miss is a miss),
  ``phase_from`` (a regex whose first group is the ``phase`` match key);
- ``!include relative/path`` as a mapping value, resolved relative to the cassette (a
  ``.json`` file inlined as compact JSON, anything else as a string; absolute paths and
  paths leaving the cassette's directory are refused);
- the recorded metadata of an ``agent:`` block (``agent``, ``model``, ``turn``,
  ``duration_ms``, ``prompt_tokens``, ``response_tokens``, ``cost_usd``,
  ``system_prompt``, ``prompt``, ``input``, ``call_id``) — replayed into ``meta`` as the
  reference does: ``model``, ``agent``, ``duration_ms``, ``usage: {input_tokens,
  output_tokens}``, ``cost_usd`` (each only when set), plus ``call_id``;
- ``error:`` as a string (a ``plugin_crash`` with that detail), and an episode-level
  ``response: {infra_error: …}`` (a ``transport_error``);
- transcripts as ``{format, events, timings}`` (an event is a JSON line kept verbatim, or
  a mapping written as Go's ``json.Marshal`` would) beside localllm's ``{format, lines,
  offsets_ms}``;
- ``delay`` as a Go duration string (``500ms``, ``1s``) or a number of seconds;
- match keys ``verb`` (the request's verb), ``phase`` (the state path's first dotted
  segment, or ``phase_from``'s group), ``schema_name`` (the schema file's base name as
  the reference compares it, ``verdict.json``, or its stem ``verdict`` as localllm
  writes it), and any other key from the call's args, then from its ``with:`` block.

In a cassette with ``app_id`` (every reference cassette has one; localllm's own written
since this format) a string ``response`` that does not start with ``{`` or ``[`` is plain
text and replays as a JSON string, as the reference's ``marshalAgentResponseString`` does;
without ``app_id`` a string is JSON text, verbatim.

Loading collects every problem into one :class:`~localllm.errors.ConfigError`, each
naming the file and the key path (``episodes[2].agent.error.kind``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from localllm._fs import DATA_LIMIT, read_capped
from localllm.agents.base import Agent
from localllm.config.source import MAX_NODES, parse_yaml
from localllm.errors import AgentError, ConfigError, ErrorKind, ProblemList, truncate_detail
from localllm.grammar.pattern import PatternTooCostly, search_group, unsupported_reason
from localllm.trace.callid import cassette_call_key, derive_call_id
from localllm.trace.rules import MAX_DEPTH
from localllm.wire import VERBS, AskRequest, AskResponse, Transcript, bad_sub_event_payload, nesting, no_constant

__all__ = [
    "CASSETTE_KIND",
    "Cassette",
    "CassetteAgent",
    "Episode",
    "ReplayedAgentError",
    "load_cassette",
    "resolve_includes",
]

CASSETTE_KIND = "host_cassette"
_TOP_KEYS = (
    "kind",
    "episodes",
    "name",
    "description",
    "version",
    # the reference engine's (Kitsoki) cassette header
    "app_id",
    "app_version",
    "source_run",
    "generated_at",
    "match_on",
    "record_mode",
    "phase_from",
)
_EPISODE_KEYS = ("id", "match", "agent", "replay", "delay", "response")
#: the reference's recorded metadata of an agent exchange (its EpisodeAgent)
_RECORDED_KEYS = (
    "agent",
    "model",
    "turn",
    "duration_ms",
    "prompt_tokens",
    "response_tokens",
    "cost_usd",
    "system_prompt",
    "prompt",
    "input",
    "call_id",
)
_AGENT_KEYS = ("verb", "response", "error", "error_kind", "meta", "sub_events", "transcript", *_RECORDED_KEYS)
_REPLAY_MODES = ("once", "any")
_RECORD_MODES = ("none", "new_episodes")
_INCLUDE = re.compile(r"^(\s*)([^:]+:\s*)!include\s+(.+?)\s*$")
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_MISS_LISTED = 20


class ReplayedAgentError(AgentError):
    """An ``agent.error`` episode replayed; ``episode_id`` and ``match_idx`` are set."""


@dataclass(frozen=True)
class Episode:
    """One recorded agent exchange."""

    id: str
    match: dict[str, Any]
    verb: str | None = None
    #: submission text (``None`` when the episode replays an error)
    response: str | None = None
    error_kind: ErrorKind | None = None
    error_detail: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    sub_events: list[dict[str, Any]] = field(default_factory=list)
    transcript: Transcript | None = None
    replay_any: bool = False
    delay: float = 0.0
    #: an episode-level ``response: {infra_error}``: replayed as a transport_error
    infra_error: str | None = None


@dataclass(frozen=True)
class Cassette:
    """A loaded cassette: its file, its agent episodes in file order, and its header."""

    path: Path
    episodes: tuple[Episode, ...]
    app_id: str | None = None
    app_version: str | None = None
    match_on: tuple[str, ...] = ()
    record_mode: str = "none"
    phase_from: re.Pattern[str] | None = None


# -- loading ------------------------------------------------------------------------------


def _unknown_hint(key: Any, known: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(str(key), known, n=1)
    prefix = f"did you mean {close[0]!r}? " if close else ""
    return f"{prefix}known keys: {', '.join(known)}"


def _json_text(value: Any) -> str | None:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None


def load_cassette(path: str | Path) -> Cassette:
    """Read and check a cassette file; raise ConfigError listing every problem."""
    path = Path(path)
    problems = ProblemList(path)
    try:
        text = read_capped(path, DATA_LIMIT).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problems.add("", f"cannot read cassette: {reason}", "pass the path of a kind: host_cassette YAML file")
        raise ConfigError(problems.items) from exc
    try:
        text = resolve_includes(text, path.parent)
    except ValueError as exc:
        problems.add(
            "",
            str(exc),
            "!include a readable file inside the cassette's directory by a relative path"
            f" (JSON at most {MAX_DEPTH} levels deep; the whole at most {DATA_LIMIT >> 20} MiB)",
        )
        raise ConfigError(problems.items) from exc
    # bounded like a config: aliases expand at most to the text's own size, and a response
    # may nest as deep as a trace value (rules.MAX_DEPTH) under its episode; PyYAML's own
    # failures on odd scalars are a ConfigError too
    data = parse_yaml(text, path, max_nodes=max(MAX_NODES, len(text)), max_depth=MAX_DEPTH + 8)
    if not isinstance(data, dict):
        problems.add("", "the top level must be a mapping", "start the file with kind: host_cassette and episodes:")
        raise ConfigError(problems.items)
    for key in data:
        if key not in _TOP_KEYS:
            problems.add(str(key), "unknown key", _unknown_hint(key, _TOP_KEYS))
    kind = data.get("kind")
    if kind is None:
        problems.add("kind", "missing", f"add kind: {CASSETTE_KIND}")
    elif kind != CASSETTE_KIND:
        problems.add("kind", f"{kind!r} is not {CASSETTE_KIND!r}", f"set kind: {CASSETTE_KIND}")
    header = _header(problems, data)
    kitsoki = header.get("app_id") is not None
    raw_episodes = data.get("episodes")
    episodes: list[Episode] = []
    if raw_episodes is None:
        problems.add("episodes", "missing", "add a list of episodes {id, match, agent}")
    elif not isinstance(raw_episodes, list) or not raw_episodes:
        problems.add("episodes", "must be a non-empty list", "add a list of episodes {id, match, agent}")
    else:
        seen: dict[str, int] = {}
        for i, raw in enumerate(raw_episodes):
            episode = _episode(problems, f"episodes[{i}]", raw, kitsoki=kitsoki)
            if episode is None:
                continue
            if episode.id in seen and not kitsoki:
                problems.add(
                    f"episodes[{i}].id",
                    f'duplicate episode id "{episode.id}" (also episodes[{seen[episode.id]}])',
                    "give every episode a unique id: call_ids derive from it",
                )
                continue
            seen[episode.id] = i
            episodes.append(episode)
        if not episodes and not problems.items:
            problems.add("episodes", "has no agent episodes", "give an episode an agent: block")
    if problems.items:
        raise ConfigError(problems.items)
    return Cassette(path=path, episodes=tuple(episodes), **header)


def _header(problems: ProblemList, data: dict[str, Any]) -> dict[str, Any]:
    """The reference's header keys, checked: Cassette kwargs."""
    out: dict[str, Any] = {}
    for key in ("app_id", "app_version"):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.add(key, "must be a string", f"e.g. {key}: my-app")
        else:
            out[key] = str(value)
    match_on = data.get("match_on")
    if match_on is not None:
        if not isinstance(match_on, list) or not all(isinstance(k, str) for k in match_on):
            problems.add(
                "match_on", "must be a list of match key names", "e.g. match_on: [handler, phase, schema_name]"
            )
        else:
            out["match_on"] = tuple(match_on)
    record_mode = data.get("record_mode")
    if record_mode is not None and record_mode != "":
        if record_mode not in _RECORD_MODES:
            problems.add(
                "record_mode",
                f'{record_mode!r} is not supported; valid values are "none" or "new_episodes"',
                "use record_mode: none (localllm replays only)",
            )
        else:
            out["record_mode"] = record_mode
    phase_from = data.get("phase_from")
    if phase_from is not None and phase_from != "":
        try:
            out["phase_from"] = re.compile(str(phase_from))
        except re.error as exc:
            problems.add("phase_from", f"is not a valid regular expression: {exc}", "give a regex with one group")
        else:
            # the reference's regexp is Go's (RE2): no construct that needs backtracking
            reason = unsupported_reason(str(phase_from))
            if reason is not None:
                problems.add("phase_from", f"cannot be matched in linear time: {reason}", "give a regex with one group")
    return out


def resolve_includes(text: str, base: Path) -> str:
    """``key: !include rel/path`` lines replaced by the file's content, as the reference does.

    A ``.json`` file is inlined as compact JSON (re-encoded as Go's ``json.Marshal`` writes
    it: keys sorted); any other file as a JSON string (valid YAML). Raises ``ValueError``
    naming the include for an absolute path, a path leaving ``base``, or an unreadable file.
    """
    if "!include" not in text:
        return text
    from localllm.trace.event import dumps as go_json

    out: list[str] = []
    size = len(text)
    root = Path(os.path.realpath(base))
    for line in text.split("\n"):
        found = _INCLUDE.match(line)
        if found is None:
            out.append(line)
            continue
        prefix, rel = found.group(1) + found.group(2), found.group(3).strip()
        if os.path.isabs(rel):
            raise ValueError(f"!include {rel!r}: absolute paths are not allowed")
        target = Path(os.path.realpath(base / rel))
        if not target.is_relative_to(root):
            raise ValueError(f"!include {rel!r}: path resolves outside the cassette directory")
        try:
            raw = read_capped(target, DATA_LIMIT, regular=True).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"!include {rel!r}: cannot read {target.name}: {exc}") from exc
        if rel.lower().endswith(".json"):
            try:  # NaN and Infinity refused by name (before: the encoder's "Out of range float values")
                value = json.loads(raw, parse_constant=no_constant)
            except RecursionError:
                raise ValueError(f"!include {rel!r}: the JSON nests too deeply") from None
            except ValueError as exc:
                raise ValueError(f"!include {rel!r}: parse JSON: {exc}") from exc
            # a response a trace can hold (trace.rules.MAX_DEPTH); checked before anything
            # walks it, so the verdict does not depend on the interpreter's recursion limit
            if nesting(value, MAX_DEPTH) > MAX_DEPTH:
                raise ValueError(f"!include {rel!r}: the JSON nests too deeply (more than {MAX_DEPTH} levels)")
            inlined = go_json(_sorted_keys(value))
        else:
            inlined = go_json(raw)
        size += len(inlined)
        if size > DATA_LIMIT:  # one file included again and again: bounded as one cassette is
            raise ValueError(f"!include {rel!r}: the cassette grows past {DATA_LIMIT >> 20} MiB with its includes")
        out.append(prefix + inlined)
    return "\n".join(out)


def _sorted_keys(value: Any) -> Any:
    """``value`` with every mapping's keys sorted (Go marshals maps that way)."""
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def _go_duration(value: Any) -> float | None:
    """A delay: a number of seconds, or a Go duration string (``500ms``, ``1m30s``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text in ("", "0"):
        return 0.0
    total, pos = 0.0, 0
    for part in _GO_DURATION.finditer(text):
        if part.start() != pos:
            return None
        total += float(part.group(1)) * _GO_UNITS[part.group(2)]
        pos = part.end()
    return total if pos == len(text) and pos > 0 else None


def _episode(problems: ProblemList, where: str, raw: Any, *, kitsoki: bool = False) -> Episode | None:
    """One checked episode, or None (problem recorded, or a host-only episode)."""
    if not isinstance(raw, dict):
        problems.add(where, "must be a mapping", "give {id, match, agent}")
        return None
    before = len(problems.items)
    for key in raw:
        if key not in _EPISODE_KEYS:
            problems.add(f"{where}.{key}", "unknown key", _unknown_hint(key, _EPISODE_KEYS))
    if "agent" not in raw and "response" in raw:
        return None  # a host (non-agent) episode of a shared host cassette
    episode_id = raw.get("id")
    if isinstance(episode_id, bool) or not isinstance(episode_id, (str, int)) or str(episode_id) == "":
        problems.add(f"{where}.id", "missing or not a string", "give the episode an id such as ep-01")
    match = raw.get("match")
    if not isinstance(match, dict):
        problems.add(
            f"{where}.match",
            "missing or not a mapping",
            "give match: {handler: agent.x, schema_name: ..., <arg>: ...}",
        )
    else:
        for key, value in match.items():
            if not isinstance(key, str):
                problems.add(f"{where}.match", f"key {key!r} is not a string")
            elif _json_text(value) is None:
                problems.add(f"{where}.match.{key}", "is not a JSON value", "quote it")
        handler = match.get("handler")
        if handler is not None and not isinstance(handler, str):
            problems.add(f"{where}.match.handler", "must be an agent alias string", "e.g. handler: agent.fixer")
    replay = raw.get("replay", "once")
    if replay not in _REPLAY_MODES:
        problems.add(
            f"{where}.replay",
            f"{replay!r} is not one of {', '.join(_REPLAY_MODES)}",
            "use replay: any to replay for ever, or omit it",
        )
    delay = _go_duration(raw.get("delay", 0))
    if delay is None:
        problems.add(
            f"{where}.delay",
            f"{raw.get('delay')!r} is not a number of seconds >= 0 or a duration",
            "e.g. delay: 0.5 or delay: 500ms",
        )
    infra_error: str | None = None
    host_response = raw.get("response")
    if isinstance(host_response, dict) and host_response.get("infra_error"):
        infra_error = str(host_response["infra_error"])
    agent = _agent_block(problems, f"{where}.agent", raw.get("agent"), kitsoki=kitsoki or infra_error is not None)
    if len(problems.items) > before or agent is None:
        return None
    assert isinstance(match, dict) and delay is not None
    return Episode(
        id=str(episode_id),
        match=dict(match),
        replay_any=replay == "any",
        delay=delay,
        infra_error=infra_error,
        **agent,
    )


def _agent_block(problems: ProblemList, where: str, raw: Any, *, kitsoki: bool = False) -> dict[str, Any] | None:
    if raw is None:
        problems.add(where, "missing", "give agent: {verb, response} or agent: {verb, error: {kind, detail}}")
        return None
    if not isinstance(raw, dict):
        problems.add(where, "must be a mapping", "give agent: {verb, response}")
        return None
    out: dict[str, Any] = {}
    for key in raw:
        if key not in _AGENT_KEYS:
            problems.add(f"{where}.{key}", "unknown key", _unknown_hint(key, _AGENT_KEYS))
    verb = raw.get("verb")
    if verb is not None and verb not in VERBS:
        problems.add(f"{where}.verb", f"unknown verb {verb!r}", f"use one of {', '.join(VERBS)}")
    out["verb"] = verb
    has_response, has_error = "response" in raw, "error" in raw
    if kitsoki and has_response and has_error and raw["error"] in ("", None):
        has_error = False  # the reference's empty error string means none
    if kitsoki and not has_response and not has_error:
        out["response"] = None  # the reference replays an empty response as no submission
    elif has_response == has_error:
        problems.add(
            where,
            "needs exactly one of response: or error:",
            "response: is the submission (JSON text or YAML); error: {kind, detail} replays a failure",
        )
    elif has_response:
        response = raw["response"]
        if response is None:
            problems.add(f"{where}.response", "is null", "give JSON text in quotes, or a YAML mapping")
        elif isinstance(response, str) and kitsoki:
            out["response"] = _reference_response(response)
        elif isinstance(response, str):
            out["response"] = response  # verbatim: invalid JSON replays as schema_invalid
        else:
            text = _json_text(response)
            if text is None:
                problems.add(
                    f"{where}.response", "is not representable as JSON", "quote dates and other YAML-only values"
                )
            out["response"] = text
    elif isinstance(raw["error"], str):
        # the reference's form: a string, replayed as a plugin_crash with that detail
        # (``error_kind``, which the reference ignores, names another kind)
        out["error_kind"], out["error_detail"] = ErrorKind.PLUGIN_CRASH, raw["error"]
        if raw.get("error_kind") is not None:
            try:
                out["error_kind"] = ErrorKind(raw["error_kind"])
            except ValueError:
                kinds = ", ".join(k.value for k in ErrorKind)
                problems.add(
                    f"{where}.error_kind", f"{raw['error_kind']!r} is not an error kind", f"use one of {kinds}"
                )
    else:
        _error_block(problems, f"{where}.error", raw["error"], out)
    meta = raw.get("meta", {})
    if not isinstance(meta, dict) or _json_text(meta) is None:
        problems.add(f"{where}.meta", "must be a JSON mapping", "e.g. meta: {model: claude-sonnet}")
    else:
        out["meta"] = {**_recorded_meta(problems, where, raw), **meta}
    sub_events = raw.get("sub_events", [])
    if (
        not isinstance(sub_events, list)
        or not all(isinstance(e, dict) for e in sub_events)
        or _json_text(sub_events) is None
    ):
        problems.add(
            f"{where}.sub_events",
            "must be a list of JSON mappings",
            "e.g. sub_events: [{kind: agent.x.tool, payload: {}}]",
        )
    elif (wrong := bad_sub_event_payload(sub_events)) is not None:
        problems.add(
            f"{where}.sub_events[{wrong}].payload",
            "must be a JSON mapping",
            "e.g. sub_events: [{kind: agent.x.tool, payload: {}}]",
        )
    else:
        out["sub_events"] = [dict(e) for e in sub_events]
    if "transcript" in raw:
        out["transcript"] = _transcript(problems, f"{where}.transcript", raw["transcript"])
    return out


def _reference_response(text: str) -> str | None:
    """The reference's ``marshalAgentResponseString``: JSON object/array text verbatim,
    any other text a JSON string; empty is no submission."""
    if text == "":
        return None
    if text[0] in "{[":
        return text
    from localllm.trace.event import dumps as go_json

    return go_json(text)


def _recorded_meta(problems: ProblemList, where: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The recorded metadata replayed into ``meta`` as the reference's cassette agent does."""
    meta: dict[str, Any] = {}
    for key in ("model", "agent"):
        value = raw.get(key)
        if value not in (None, ""):
            if not isinstance(value, str):
                problems.add(f"{where}.{key}", "must be a string", "quote it")
            else:
                meta[key] = value
    numbers: dict[str, int | float] = {}
    for key in ("turn", "duration_ms", "prompt_tokens", "response_tokens", "cost_usd"):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            problems.add(f"{where}.{key}", f"{value!r} is not a number >= 0", f"e.g. {key}: 12")
            continue
        numbers[key] = value
    if numbers.get("duration_ms", 0) > 0:
        meta["duration_ms"] = numbers["duration_ms"]
    usage = {
        name: numbers[key]
        for key, name in (("prompt_tokens", "input_tokens"), ("response_tokens", "output_tokens"))
        if numbers.get(key, 0) > 0
    }
    if usage:
        meta["usage"] = usage
    if numbers.get("cost_usd", 0) > 0:
        meta["cost_usd"] = numbers["cost_usd"]
    for key in ("system_prompt", "prompt", "call_id"):
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            problems.add(f"{where}.{key}", "must be a string", "quote it")
    return meta


def _error_block(problems: ProblemList, where: str, raw: Any, out: dict[str, Any]) -> None:
    kinds = ", ".join(k.value for k in ErrorKind)
    if not isinstance(raw, dict):
        problems.add(where, "must be a mapping {kind, detail}", f"kind is one of {kinds}")
        return
    for key in raw:
        if key not in ("kind", "detail"):
            problems.add(f"{where}.{key}", "unknown key", _unknown_hint(key, ("kind", "detail")))
    kind = raw.get("kind")
    try:
        out["error_kind"] = ErrorKind(kind)
    except ValueError:
        problems.add(f"{where}.kind", f"{kind!r} is not an error kind", f"use one of {kinds}")
    detail = raw.get("detail", "")
    if not isinstance(detail, str):
        problems.add(f"{where}.detail", "must be a string", "quote it")
    else:
        out["error_detail"] = detail


def _transcript(problems: ProblemList, where: str, raw: Any) -> Transcript | None:
    if isinstance(raw, dict) and "events" in raw and "lines" not in raw:
        return _reference_transcript(problems, where, raw)
    hint = "give transcript: {format: claude-stream-json, lines: ['{...}', ...], offsets_ms: [...]}"
    if not isinstance(raw, dict) or not isinstance(raw.get("format"), str) or not isinstance(raw.get("lines"), list):
        problems.add(where, "must be a mapping with format: and lines: (or events:)", hint)
        return None
    lines: list[str] = []
    for i, line in enumerate(raw["lines"]):
        text = line if isinstance(line, str) else None
        if isinstance(line, dict):
            dumped = _json_text(line)
            text = None if dumped is None else json.dumps(line, ensure_ascii=False, separators=(",", ":"))
        if text is None or "\n" in text or "\r" in text:
            problems.add(f"{where}.lines[{i}]", "must be one JSON line (a string) or a mapping", hint)
            continue
        lines.append(text)
    offsets = raw.get("offsets_ms", [0] * len(raw["lines"]))
    if (
        not isinstance(offsets, list)
        or len(offsets) != len(raw["lines"])
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        problems.add(f"{where}.offsets_ms", "must list one integer >= 0 per line", hint)
        return None
    return Transcript(format=raw["format"], lines=lines, offsets_ms=list(offsets))


def _reference_transcript(problems: ProblemList, where: str, raw: dict[str, Any]) -> Transcript | None:
    """The reference's ``{format, events, timings}``: a string event is its JSON line verbatim,
    a mapping is written as Go's ``json.Marshal`` would (keys sorted, compact)."""
    from localllm.trace.event import dumps as go_json

    hint = "give transcript: {format: claude-stream-json, events: ['{...}', ...], timings: [...]}"
    events = raw.get("events")
    if not isinstance(raw.get("format"), str) or not isinstance(events, list):
        problems.add(where, "must be a mapping with format: and events:", hint)
        return None
    lines: list[str] = []
    for i, event in enumerate(events):
        if isinstance(event, str):
            try:
                json.loads(event)
            except ValueError:
                problems.add(f"{where}.events[{i}]", "is not valid JSON", "give one JSON line per event")
                continue
            if "\n" in event:
                problems.add(f"{where}.events[{i}]", "spans lines", "give one JSON line per event")
                continue
            lines.append(event)
        else:
            try:
                lines.append(go_json(_sorted_keys(event)))
            except (TypeError, ValueError):
                problems.add(f"{where}.events[{i}]", "is not a JSON value", hint)
    timings = raw.get("timings")
    if timings is None:
        offsets = [0] * len(lines)
    elif (
        not isinstance(timings, list)
        or len(timings) != len(events)
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in timings)
    ):
        problems.add(f"{where}.timings", "must list one integer >= 0 per event", hint)
        return None
    else:
        offsets = list(timings)
    if len(offsets) != len(lines):
        return None
    return Transcript(format=raw["format"], lines=lines, offsets_ms=offsets)


# -- matching -----------------------------------------------------------------------------


def _same(expected: Any, actual: Any) -> bool:
    """JSON equality, with a string equal to a scalar whose JSON text it is."""
    want = json.dumps(expected, sort_keys=True, ensure_ascii=False, default=str)
    got = json.dumps(actual, sort_keys=True, ensure_ascii=False, default=str)
    if want == got:
        return True
    scalars = (str, int, float, bool, type(None))
    if isinstance(expected, str) and isinstance(actual, scalars) and not isinstance(actual, str):
        return expected == got
    if isinstance(actual, str) and isinstance(expected, scalars) and not isinstance(expected, str):
        return actual == want
    return False


class CassetteAgent(Agent):
    """Replay a cassette's episodes. Thread-safe; no external process."""

    plugin: ClassVar[str] = "cassette"

    def __init__(self, path: str | Path, *, alias: str = "agent.cassette") -> None:
        super().__init__(alias)
        self.cassette = load_cassette(path)
        self._lock = threading.Lock()
        #: episode id → matches so far (the next match_idx; shared by episodes with one id,
        #: as the reference counts them); ``_played``: positions of played episodes
        self._plays: dict[str, int] = {}
        self._played: set[int] = set()
        self._waits: dict[str, list[threading.Event]] = {}
        self._closed = False

    def _facts(self, request: AskRequest) -> dict[str, Any]:
        """What the request offers to match against (see the module docstring)."""
        given = request.with_ or {}
        facts: dict[str, Any] = {"handler": given.get("handler", self.alias), "verb": request.verb}
        facts["phase"] = self._phase(request.state_path or "")
        written = given.get("schema")
        names: list[Any] = []
        if "schema_name" in given:
            names.append(given["schema_name"])
        elif isinstance(written, str) and "{{" not in written:
            # the reference compares the base name (verdict.json); localllm writes the stem
            names += [PurePosixPath(written).stem, PurePosixPath(written).name]
        elif request.schema is not None:
            names.append(request.schema.get("title") or "inline")
        facts["schema_name"] = names[0] if names else None
        facts["schema_names"] = names or [None]
        args = given.get("args")
        facts["args"] = dict(args) if isinstance(args, Mapping) else {}
        facts["with"] = {k: v for k, v in given.items() if k != "args"}
        return facts

    def _phase(self, state_path: str) -> str:
        """The reference's ``phase``: ``phase_from``'s first group, else the first dotted segment."""
        pattern = self.cassette.phase_from
        if pattern is None:
            return state_path.split(".", 1)[0]
        if pattern.groups < 1:
            return ""
        # in linear time; fallback: re for what has none (a repeat that may match nothing, a
        # group in a lookaround; in a Cassette built in code, what load_cassette refuses)
        try:
            return search_group(pattern.pattern, state_path, fallback=True) or ""
        except PatternTooCostly:
            return ""

    @staticmethod
    def _matches(episode: Episode, facts: dict[str, Any]) -> bool:
        for key, expected in episode.match.items():
            if key == "schema_name":
                if not any(_same(expected, name) for name in facts["schema_names"]):
                    return False
                continue
            if key in ("handler", "verb", "phase"):
                actual = facts[key]
            elif key in facts["args"]:
                actual = facts["args"][key]
            elif key in facts["with"]:
                actual = facts["with"][key]
            else:
                return False
            if not _same(expected, actual):
                return False
        return True

    def check_app_id(self, app_id: str, *, config: str = "the config") -> None:
        """Refuse a cassette recorded for another app: its call_ids derive from ``app_id``."""
        recorded = self.cassette.app_id
        if recorded is not None and recorded != app_id:
            problems = ProblemList(self.cassette.path)
            problems.add(
                "app_id",
                f"cassette app_id {recorded!r} is not the config's app_id {app_id!r} ({config})",
                f"replay it with the config of app {recorded!r}, or set app_id: {app_id} in the cassette "
                "(call_ids derive from app_id, so the recorded ones change)",
            )
            raise ConfigError(problems.items)

    def _select(self, facts: dict[str, Any]) -> tuple[Episode, int]:
        with self._lock:
            if self._closed:
                raise AgentError(ErrorKind.TRANSPORT_ERROR, "is closed", alias=self.alias)
            for index, episode in enumerate(self.cassette.episodes):
                if (episode.replay_any or index not in self._played) and self._matches(episode, facts):
                    plays = self._plays.get(episode.id, 0)
                    self._plays[episode.id] = plays + 1
                    self._played.add(index)
                    return episode, plays
            listing = self._listing()
        asked = {"handler": facts["handler"], "schema_name": facts["schema_name"], **facts["args"]}
        raise AgentError(
            ErrorKind.TRANSPORT_ERROR,
            f"no unplayed episode in cassette {self.cassette.path} matches "
            f"{truncate_detail(_json_text(asked) or str(asked))}; episodes: {listing}",
            alias=self.alias,
            hint="add an episode whose match: keys equal the call's, or mark a reused one replay: any",
        )

    def _listing(self) -> str:
        parts = []
        for index, episode in enumerate(self.cassette.episodes[:_MISS_LISTED]):
            state = "replay: any" if episode.replay_any else ("played" if index in self._played else "unplayed")
            match = _json_text(episode.match) or str(episode.match)
            parts.append(f"{episode.id} {match} ({state})")
        more = len(self.cassette.episodes) - _MISS_LISTED
        if more > 0:
            parts.append(f"... {more} more")
        return "; ".join(parts)

    def continue_session(self, plays: Mapping[str, int]) -> None:
        """Count on from the matches of each episode the continued trace already holds."""
        with self._lock:
            for episode_id in {e.id for e in self.cassette.episodes}:
                self._plays[episode_id] = max(self._plays.get(episode_id, 0), int(plays.get(episode_id, 0)))
            # a played once-episode stays played: the first N of each id, N its recorded matches
            left = dict(self._plays)
            for index, episode in enumerate(self.cassette.episodes):
                if left.get(episode.id, 0) > 0:
                    self._played.add(index)
                    left[episode.id] -= 1

    def unplayed(self) -> list[str]:
        """Ids of play-once episodes not yet played (for "every episode was used" checks)."""
        with self._lock:
            return [e.id for i, e in enumerate(self.cassette.episodes) if not e.replay_any and i not in self._played]

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        # Registered before anything else, so a cancel() at any point of the call is seen.
        cancelled = threading.Event()
        with self._lock:
            self._waits.setdefault(request.call_id, []).append(cancelled)
        try:
            episode, match_idx = self._select(self._facts(request))
            meta = {**episode.meta, "transport": "cassette", "episode_id": episode.id, "match_idx": match_idx}
            if self.cassette.app_id is not None:
                # as the reference's cassette agent: the call_id this match derives
                meta["call_id"] = derive_call_id(self.cassette.app_id, cassette_call_key(episode.id, match_idx))
            if episode.delay > 0:
                self._sleep(cancelled, episode, deadline)
        finally:
            with self._lock:
                waits = self._waits.get(request.call_id, [])
                if cancelled in waits:
                    waits.remove(cancelled)
                if not waits:
                    self._waits.pop(request.call_id, None)
        if episode.infra_error is not None:
            raise ReplayedAgentError(
                ErrorKind.TRANSPORT_ERROR, episode.infra_error, meta=meta, episode_id=episode.id, match_idx=match_idx
            )
        if episode.error_kind is not None:
            raise ReplayedAgentError(
                episode.error_kind, episode.error_detail, meta=meta, episode_id=episode.id, match_idx=match_idx
            )
        sub_events = [{**event, "call_id": event.get("call_id", request.call_id)} for event in episode.sub_events]
        return AskResponse(
            submission=episode.response,
            meta=meta,
            sub_events=sub_events,
            transcript=episode.transcript,
            episode_id=episode.id,
            match_idx=match_idx,
        )

    def _sleep(self, cancelled: threading.Event, episode: Episode, deadline: float) -> None:
        """Wait the episode's delay, cut by the deadline or by :meth:`cancel`."""
        until = time.monotonic() + episode.delay
        if cancelled.wait(max(0.0, min(until, deadline) - time.monotonic())):
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED, f"episode {episode.id} cancelled", alias=self.alias)
        if until > deadline:
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED,
                f"episode {episode.id} delay {episode.delay:g}s overran the deadline",
                alias=self.alias,
            )

    def cancel(self, call_id: str) -> None:
        with self._lock:
            waits = list(self._waits.get(call_id, []))
        for event in waits:
            event.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waits = [e for group in self._waits.values() for e in group]
        for event in waits:
            event.set()
