"""Runtime: the agent registry, dispatch, validation, fallback, deadlines and trace events.

One call::

    resolve alias → render prompt → AskRequest (deterministic call_id)
      → Agent.ask in a worker thread, cut at the hard deadline (deadline_exceeded)
      → sub-event checks → validate the submission against the schema
      → schema_invalid from a local model → agent.claude exactly once (same call_id)
      → trace: agent.call.start, sub-events, agent.call.complete | agent.call.error

call_id is ``sha256("agent-call:" + app_id + ":" + key)[:16 hex]`` with key
``turn:state_path:seq`` for live calls — ``state_path`` is the gate name (or the verb for a
direct call) and ``seq`` counts the calls made with that (turn, state_path) by this
Runtime — and ``episode_id:match_idx`` for cassette-backed calls.

Concurrency: ``call`` is thread-safe. Each call runs its agent in its own worker thread;
a call's trace events are written as one contiguous group.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from localllm.agents.base import Agent
from localllm.config import DEFAULT_TIMEOUT, VERBS, AgentDecl, Config, InprocessDecl
from localllm.errors import AgentError, ConfigError, ConfigProblem, ErrorKind
from localllm.schema import SchemaSet
from localllm.trace.callid import cassette_call_key, derive_call_id, live_call_key
from localllm.wire import AskRequest, AskResponse, CallResult

if TYPE_CHECKING:
    from localllm.trace import TraceWriter

FALLBACK_ALIAS = "agent.claude"
#: how long a cancelled worker may take to wind down after the hard deadline
_CANCEL_GRACE = 0.5
_TEMPLATE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TEMPLATE_REF = re.compile(r"^(args|world)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


def render_prompt(template: str, args: Mapping[str, Any], world: Mapping[str, Any], *, source: str = "prompt") -> str:
    """Render ``{{ args.NAME }}`` / ``{{ world.NAME }}``; a missing value is a ConfigError."""
    problems: list[ConfigProblem] = []

    def lookup(match: re.Match[str]) -> str:
        expr = match.group(1)
        ref = _TEMPLATE_REF.match(expr)
        if ref is None:
            problems.append(ConfigProblem(source, "prompt", f"unsupported template {{{{ {expr} }}}}",
                                          "use {{ args.NAME }} or {{ world.NAME }}"))
            return match.group(0)
        scope, path = ref.groups()
        node: Any = args if scope == "args" else world
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                flag = "--arg" if scope == "args" else "world"
                problems.append(ConfigProblem(source, "prompt", f"{{{{ {expr} }}}} has no value",
                                              f"pass {flag} {path.split('.')[0]}=…"))
                return match.group(0)
            node = node[part]
        return node if isinstance(node, str) else json.dumps(node, ensure_ascii=False)

    text = _TEMPLATE.sub(lookup, template)
    if problems:
        raise ConfigError(problems)
    return text


def _scrub(value: Any) -> Any:
    """Plugin-supplied data made writable inline in the trace (CRLF, NUL, non-NFC, NaN).

    The trace refuses such values outright; for audit fields (meta, args, error text,
    sub-event payloads) a faithful-but-normalised copy is better than losing the call's
    events. Byte-exact prompts and responses go to sidecar files instead.
    """
    from localllm.trace.rules import clean_text

    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {clean_text(str(k)): _scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean_text(str(value))


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


@dataclass
class _Leg:
    """One agent's attempt at a call."""

    alias: str
    response: AskResponse | None
    error: AgentError | None
    value: Any = None


@dataclass(frozen=True)
class _Outcome:
    """Everything the trace records about one finished call."""

    request: AskRequest
    alias: str
    leg: _Leg
    original: _Leg | None
    meta: dict[str, Any]
    substitution: dict[str, Any] | None
    duration_ms: int
    call_id: str
    schema_path: Path | None
    args: dict[str, Any]


class Runtime:
    """Dispatches agent calls for one config; a context manager (``close`` stops sidecars)."""

    def __init__(self, config: Config, *, trace: str | Path | TraceWriter | None = None,
                 session_id: str | None = None, turn: int = 1) -> None:
        self.config = config
        self.session_id = session_id or uuid.uuid4().hex
        self.turn = turn
        self.schemas = SchemaSet(config.base_dir)
        self._lock = threading.Lock()
        self._trace_lock = threading.Lock()
        self._agents: dict[str, Agent] = {}
        self._overrides: dict[str, Agent] = {}
        self._seq: dict[tuple[int, str], int] = {}
        self._closed = False
        self._owns_trace = False
        self.trace: TraceWriter | None = None
        if isinstance(trace, (str, Path)):
            from localllm.trace import TraceWriter

            self.trace = TraceWriter.open(Path(trace))
            self._owns_trace = True
        else:
            self.trace = trace

    # ------------------------------------------------------------------ registry

    def register_inprocess(self, alias: str, fn: Callable[[AskRequest], AskResponse | Any], *,
                           local_model: bool = False) -> None:
        """Bind a Python callable to an alias declared ``plugin: builtin.inprocess``.

        ``fn`` returns an AskResponse, or any JSON value (wrapped as the submission).
        ``local_model=True`` makes its schema_invalid answers fall back to agent.claude.
        """
        decl = self.config.agents.get(alias)
        if not isinstance(decl, InprocessDecl):
            raise ConfigError([ConfigProblem(str(self.config.path), f"agent_plugins.{alias}",
                                             "is not declared with plugin: builtin.inprocess",
                                             f"declare {alias}: {{plugin: builtin.inprocess}}")])
        from localllm.agents.inprocess import InprocessAgent

        self.register_agent(alias, InprocessAgent(alias, fn, local_model=local_model))

    def register_agent(self, alias: str, agent: Agent) -> None:
        """Route ``alias`` to ``agent`` (e.g. a cassette), replacing any declaration."""
        with self._lock:
            old = self._agents.pop(alias, None)
            self._overrides[alias] = agent
        if old is not None:
            old.close()

    def agent(self, alias: str) -> Agent:
        """The agent for ``alias``, constructed on first use (nothing is spawned here)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Runtime is closed")
            found = self._overrides.get(alias) or self._agents.get(alias)
            if found is not None:
                return found
            decl = self.config.agents.get(alias)
            if decl is None:
                declared = ", ".join(sorted(self.config.agents))
                raise ConfigError([ConfigProblem(str(self.config.path), "agent",
                                                 f'agent "{alias}" is not declared (declared: {declared})',
                                                 "declare it under agent_plugins:")])
            from localllm.agents import build_agent

            built = build_agent(decl, base_dir=self.config.base_dir)
            self._agents[alias] = built
            return built

    def _timeout(self, alias: str, explicit: float | None) -> float:
        if explicit is not None:
            return explicit
        decl: AgentDecl | None = self.config.agents.get(alias)
        return decl.timeout if decl is not None else DEFAULT_TIMEOUT

    # ------------------------------------------------------------------ calls

    def call(self, verb: str, *, agent: str, prompt: str, schema: Mapping[str, Any] | str | Path | None = None,
             args: Mapping[str, Any] | None = None, world: Mapping[str, Any] | None = None,
             timeout: float | None = None, state_path: str | None = None) -> CallResult:
        """Ask ``agent`` a verb and return the validated submission, or raise AgentError.

        ``schema`` is a schema object or a path relative to the config file. ``prompt`` may
        use ``{{ args.NAME }}`` / ``{{ world.NAME }}``. ``timeout`` is the hard cap in
        seconds (default: the agent's ``timeout``).
        """
        if verb not in VERBS:
            raise ConfigError([ConfigProblem("call", "verb", f'unknown verb "{verb}"',
                                             f"use one of {', '.join(VERBS)}")])
        args = dict(args or {})
        world = dict(world or {})
        schema_doc, schema_path = self._schema(schema)
        rendered = render_prompt(prompt, args, world)
        target = self.agent(agent)
        state = state_path or verb
        with self._lock:
            seq = self._seq.get((self.turn, state), 0)
            self._seq[(self.turn, state)] = seq + 1
        call_id = derive_call_id(self.config.app_id, live_call_key(self.turn, state, seq))
        hard = self._timeout(agent, timeout)
        schema_name = None
        if schema_path is not None:
            schema_name = schema_path.stem
        elif schema_doc is not None:
            schema_name = str(schema_doc.get("title") or "inline")
        request = AskRequest(
            session_id=self.session_id, turn=self.turn, state_path=state, verb=verb, prompt=rendered,
            call_id=call_id, deadline=_rfc3339(datetime.now(timezone.utc) + timedelta(seconds=hard)),
            schema=schema_doc, world=world,
            with_={"handler": agent, "schema_name": schema_name, "args": args,
                   "schema": str(schema_path) if schema_path else None},
        )
        started = time.monotonic()
        leg = self._attempt(target, agent, request, schema=schema_doc, schema_path=schema_path, timeout=hard)
        original: _Leg | None = None
        if (leg.error is not None and leg.error.kind is ErrorKind.SCHEMA_INVALID and target.is_local_model
                and agent != FALLBACK_ALIAS and FALLBACK_ALIAS in self.config.agents):
            original = leg
            fallback = self.agent(FALLBACK_ALIAS)
            leg = self._attempt(fallback, FALLBACK_ALIAS, request, schema=schema_doc, schema_path=schema_path,
                                timeout=self._timeout(FALLBACK_ALIAS, timeout))
        duration_ms = int((time.monotonic() - started) * 1000)
        # a replayed error (cassette) carries meta too: its episode decides the call_id
        meta = dict((leg.response.meta if leg.response else getattr(leg.error, "meta", None)) or {})
        substitution = None
        if original is not None:
            substitution = {"reason": "schema_invalid", "original_plugin": agent, "fallback_plugin": FALLBACK_ALIAS}
            meta["fallback_of"] = agent
        call_id = self._cassette_call_id(meta) or call_id
        if self.trace is not None:
            self._record(_Outcome(request, agent, leg, original, meta, substitution, duration_ms, call_id,
                                  schema_path, args))
        if leg.error is not None:
            raise leg.error
        return CallResult(submission=leg.value, meta=meta, call_id=call_id, agent=leg.alias)

    def run_gate(self, name: str, args: Mapping[str, Any] | None = None,
                 world: Mapping[str, Any] | None = None) -> CallResult:
        """Run the named gate. Gate ``args`` are rendered against the call's args/world,
        then call args the gate does not define are added."""
        gate = self.config.gates.get(name)
        if gate is None:
            known = ", ".join(self.config.gates) or "none"
            raise ConfigError([ConfigProblem(str(self.config.path), "gates",
                                             f'no gate named "{name}" (gates: {known})')])
        given = dict(args or {})
        world = dict(world or {})
        merged: dict[str, Any] = {}
        for key, value in gate.args.items():
            merged[key] = render_prompt(value, given, world, source=f"gates.{name}.with.args.{key}") \
                if isinstance(value, str) else value
        for key, value in given.items():
            merged.setdefault(key, value)
        schema = self.config.schema_for(gate, lambda text: render_prompt(text, merged, world, source=f"gates.{name}"))
        return self.call(gate.verb, agent=gate.agent, prompt=gate.prompt, schema=schema, args=merged,
                         world=world, timeout=gate.timeout, state_path=name)

    # ------------------------------------------------------------------ internals

    def _schema(self, schema: Mapping[str, Any] | str | Path | None) -> tuple[dict[str, Any] | None, Path | None]:
        if schema is None:
            return None, None
        if isinstance(schema, Mapping):
            return dict(schema), None
        path = Path(schema)
        full = path if path.is_absolute() else (self.config.base_dir / path)
        return self.schemas.load(full), full.resolve()

    def _attempt(self, agent: Agent, alias: str, request: AskRequest, *, schema: dict[str, Any] | None,
                 schema_path: Path | None, timeout: float) -> _Leg:
        deadline = time.monotonic() + timeout

        def prime() -> None:
            # compile the validator (first use imports jsonschema) while the agent works
            if schema is not None:
                self.schemas.validator(schema, base=schema_path)

        try:
            response = self._ask(agent, alias, request, deadline=deadline, timeout=timeout, prime=prime)
        except AgentError as exc:
            return _Leg(alias, None, exc)
        leg = _Leg(alias, response, None)
        try:
            self._check_sub_events(alias, request.call_id, response)
            if schema is not None:
                leg.value = self.schemas.validate(response.submission, schema, base=schema_path)
            else:
                leg.value = _parse_loose(response.submission)
        except AgentError as exc:
            leg.error = exc
        return leg

    def _ask(self, agent: Agent, alias: str, request: AskRequest, *, deadline: float, timeout: float,
             prime: Callable[[], None]) -> AskResponse:
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["response"] = agent.ask(request, deadline=deadline)
            except BaseException as exc:  # re-raised in the calling thread below
                box["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=work, name=f"localllm-{alias}-{request.call_id}", daemon=True)
        worker.start()
        prime()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            agent.cancel(request.call_id)
            worker.join(_CANCEL_GRACE)
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED,
                             f"{alias} did not answer within {timeout:g}s; the late answer is discarded")
        worker.join()
        if "error" in box:
            raise box["error"]
        response: AskResponse = box["response"]
        return response

    @staticmethod
    def _check_sub_events(alias: str, call_id: str, response: AskResponse) -> None:
        prefix = alias + "."
        for i, event in enumerate(response.sub_events):
            kind = event.get("kind")
            if not isinstance(kind, str) or not kind.startswith(prefix):
                raise AgentError(ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION,
                                 f"sub_events[{i}].kind {kind!r} is outside the plugin namespace {prefix!r}")
            if event.get("call_id") != call_id:
                raise AgentError(ErrorKind.SUB_EVENT_CALL_ID_MISMATCH,
                                 f"sub_events[{i}].call_id {event.get('call_id')!r} != parent call_id {call_id!r}")

    def _cassette_call_id(self, meta: Mapping[str, Any]) -> str | None:
        if meta.get("transport") == "cassette" and "episode_id" in meta and "match_idx" in meta:
            key = cassette_call_key(str(meta["episode_id"]), int(meta["match_idx"]))
            return derive_call_id(self.config.app_id, key)
        return None

    def _record(self, out: _Outcome) -> None:
        from localllm.trace import needs_sidecar, write_prompt, write_response, write_transcript

        assert self.trace is not None
        request, alias, leg, original, meta = out.request, out.alias, out.leg, out.original, out.meta
        substitution, duration_ms, call_id, schema_path, args = (
            out.substitution, out.duration_ms, out.call_id, out.schema_path, out.args)
        trace = self.trace
        trace_dir = trace.dir
        start: dict[str, Any] = {"verb": request.verb, "agent": alias}
        if meta.get("model"):
            start["model"] = _scrub(meta["model"])
        if needs_sidecar(request.prompt):
            start["prompt_file"] = write_prompt(trace_dir, call_id, request.prompt)
        else:
            start["prompt"] = request.prompt
        start["input"] = _scrub({"schema_path": str(schema_path) if schema_path else None, "args": dict(args)})
        ids: dict[str, Any] = {"call_id": call_id}
        if meta.get("transport") == "cassette":
            ids["episode_id"] = meta.get("episode_id")
            ids["match_idx"] = meta.get("match_idx")
        end: dict[str, Any] = {"verb": request.verb, "agent": alias}
        if meta.get("model"):
            end["model"] = _scrub(meta["model"])
        end["duration_ms"] = duration_ms
        refs: dict[str, Any] = {}
        if leg.response is not None and leg.response.transcript is not None:
            refs["transcript_ref"] = write_transcript(trace_dir, call_id, leg.response.transcript)
        if original is not None and original.response is not None and original.response.transcript is not None:
            refs["original_transcript_ref"] = write_transcript(trace_dir, call_id, original.response.transcript,
                                                               suffix="-original")
        turn, state = request.turn, request.state_path
        with self._trace_lock:
            trace.append("agent.call.start", start, turn=turn, state_path=state, **ids)
            if leg.error is None:
                assert leg.response is not None
                for event in leg.response.sub_events:
                    trace.append(_scrub(str(event["kind"])), _scrub(dict(event.get("payload") or {})), turn=turn,
                                 state_path=state, call_id=call_id)
                if needs_sidecar(leg.value):
                    end["response_file"] = write_response(trace_dir, call_id, leg.value)
                else:
                    end["response"] = leg.value
                if meta:
                    end["meta"] = _scrub(meta)
                if substitution is not None:
                    end["substitution"] = substitution
                end.update(refs)
                trace.append("agent.call.complete", end, turn=turn, state_path=state, call_id=call_id)
            else:
                end["error"] = _scrub(str(leg.error))
                end["kind"] = leg.error.kind.value
                if original is not None and original.error is not None:
                    end["original_error"] = _scrub(str(original.error))
                if substitution is not None:
                    end["substitution"] = substitution
                end.update(refs)
                trace.append("agent.call.error", end, turn=turn, state_path=state, call_id=call_id)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close every agent (stopping sidecars and child processes) and the trace."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            agents = list(self._agents.values()) + list(self._overrides.values())
            self._agents.clear()
            self._overrides.clear()
        for agent in agents:
            agent.close()
        if self.trace is not None and self._owns_trace:
            self.trace.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _parse_loose(submission: str | None) -> Any:
    """No schema: bind the parsed JSON when it parses, else the raw text."""
    if submission is None:
        return None
    try:
        return json.loads(submission)
    except ValueError:
        return submission
