"""Runtime: the agent registry, dispatch, validation, fallback, deadlines and trace events.

One call::

    resolve alias → render prompt → AskRequest (deterministic call_id)
      → Agent.ask in a worker thread, cut at the hard deadline (deadline_exceeded)
      → sub-event checks → validate the submission against the schema
      → schema_invalid from a local model → its fallback exactly once (same call_id):
        ``Config.fallback_for(alias, gate)`` — the gate's or agent's ``fallback:``, default
        agent.claude, ``none`` for no fallback
      → the trace recorder is told each step and writes agent.call.start, sub-events,
        agent.call.complete | agent.call.error (localllm.trace.recorder)

``AskRequest.with`` is the gate's ``with:`` block as written (prompt, schema path as
given, …) with ``args`` the call's arguments (the gate's, rendered, plus the caller's);
for a direct call it is ``{prompt, schema (when a path), args}``; never a host path.

call_id is ``sha256("agent-call:" + app_id + ":" + key)[:16 hex]`` with key
``turn:state_path:seq`` for live calls — ``state_path`` is the gate name (or the verb for a
direct call) and ``seq`` counts the calls made with that (turn, state_path) by this
Runtime — and ``episode_id:match_idx`` for cassette-backed calls.

A Runtime opened on an existing trace continues its session: the turn after the last
one recorded (so live call_ids never repeat) and each replayed episode's match counter.

Errors: ``_attempt`` is the last boundary. Whatever an agent raises leaves ``call`` as an
AgentError naming the alias (foreign exceptions chained as the cause), with every secret
the config knows redacted; a failed fallback's error carries the local leg's as
``original``. Misuse of the call itself (unknown verb, alias, gate, a missing template
value) is a CallError.

Concurrency: ``call`` is thread-safe. Each call runs its agent in its own worker thread;
a call's trace events are written as one contiguous group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from localllm.agents.base import Agent
from localllm.calibrate import score_of
from localllm.config import DEFAULT_TIMEOUT, MAX_TIMEOUT, VERBS, AgentDecl, Config, InprocessDecl
from localllm.errors import AgentError, CallError, ErrorKind, LocalLLMError, SchemaError, TraceWriteRejected
from localllm.redact import Redactor
from localllm.schema import SchemaSet, json_problem, unreadable
from localllm.trace.callid import cassette_call_key, derive_call_id, live_call_key
from localllm.wire import (
    AskRequest,
    AskResponse,
    CallResult,
    Transcript,
    bad_sub_event_payload,
    loads_json,
    text_problem,
)

if TYPE_CHECKING:
    from localllm.embed.embedder import Embedder
    from localllm.embed.examples import ExampleSet
    from localllm.selection import Cascade, Choice, Tier
    from localllm.trace.recorder import TraceRecorder
    from localllm.trace.writer import TraceWriter

log = logging.getLogger(__name__)

#: how long a cancelled worker may take to wind down after the hard deadline
_CANCEL_GRACE = 0.5
_TEMPLATE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TEMPLATE_REF = re.compile(r"^(args|world)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


def render_prompt(
    template: str,
    args: Mapping[str, Any],
    world: Mapping[str, Any],
    *,
    source: str = "prompt",
    extra: Mapping[str, str] | None = None,
) -> str:
    """Render ``{{ args.NAME }}`` / ``{{ world.NAME }}`` (and ``{{ NAME }}`` for each
    ``extra`` name, e.g. a gate's ``{{ examples }}``); a missing value is a CallError
    (key ``args.NAME``)."""
    problems: list[tuple[str, str, str]] = []

    def lookup(match: re.Match[str]) -> str:
        expr = match.group(1)
        if extra is not None and expr in extra:
            return extra[expr]
        ref = _TEMPLATE_REF.match(expr)
        if ref is None:
            problems.append(
                (source, f"unsupported template {{{{ {expr} }}}}", "use {{ args.NAME }} or {{ world.NAME }}")
            )
            return match.group(0)
        scope, path = ref.groups()
        node: Any = args if scope == "args" else world
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                name = path.split(".")[0]
                flag = "--arg" if scope == "args" else "world"
                problems.append((f"{scope}.{name}", f"{{{{ {expr} }}}} has no value", f"pass {flag} {name}=…"))
                return match.group(0)
            node = node[part]
        if isinstance(node, str):
            return node
        try:
            return json.dumps(node, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            problems.append(
                (
                    f"{scope}.{path}",
                    f"{{{{ {expr} }}}} is not a JSON value ({type(node).__name__})",
                    "pass strings, numbers, booleans, lists or mappings",
                )
            )
            return match.group(0)

    text = _TEMPLATE.sub(lookup, template)
    if problems:
        key, _, hint = problems[0]
        raise CallError(f"{source}: " + "; ".join(message for _, message, _ in problems), key=key, hint=hint)
    return text


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def config_secrets(config: Config) -> list[str]:
    """Every secret value the config knows (:meth:`Config.secret_values`): what ``${VAR}``
    resolved to in ``env``/``headers`` and the keys named by ``api_key_env`` (read now).
    A plain value written in the config is not a secret (never masked)."""
    return list(config.secret_values())


@dataclass
class _Leg:
    """One agent's attempt at a call."""

    alias: str
    response: AskResponse | None
    error: AgentError | None
    value: Any = None


class _Record(Protocol):
    """What the runtime tells the trace about one call (``localllm.trace.recorder.CallRecord``)."""

    def leg_finished(self, alias: str, response: AskResponse | None, error: AgentError | None, value: Any) -> None: ...

    def fallback(self, *, reason: str, original_plugin: str, fallback_plugin: str) -> None: ...

    def finished(self, *, call_id: str, duration_ms: int, meta: Mapping[str, Any]) -> None: ...


class _Unrecorded:
    """The record of a call made without a trace: every notification is dropped."""

    def leg_finished(self, alias: str, response: AskResponse | None, error: AgentError | None, value: Any) -> None:
        return None

    def fallback(self, *, reason: str, original_plugin: str, fallback_plugin: str) -> None:
        return None

    def finished(self, *, call_id: str, duration_ms: int, meta: Mapping[str, Any]) -> None:
        return None


_UNRECORDED = _Unrecorded()


class Runtime:
    """Dispatches agent calls for one config; a context manager (``close`` stops sidecars).

    ``trace`` is a path (opened, or continued when it exists: the next turn, seq and
    cassette match counters carry on) or an open TraceWriter. ``trace_wait`` is how long to
    wait for another process's lock on the trace file. ``turn`` defaults to 1 for a new
    trace and to one past the last recorded turn for a continued one.
    """

    def __init__(
        self,
        config: Config,
        *,
        trace: str | Path | TraceWriter | None = None,
        session_id: str | None = None,
        turn: int | None = None,
        trace_wait: float = 0.0,
        examples_leave_one_out: bool = False,
    ) -> None:
        if not isinstance(config, Config):  # before: AttributeError 'str' object has no attribute 'base_dir'
            raise TypeError(
                f"Runtime takes a Config, got {type(config).__name__}: Runtime(localllm.load_config('localllm.yaml'))"
            )
        self.config = config
        #: eval: an example whose text is the question's is not used (not answered from its own label)
        self.examples_leave_one_out = examples_leave_one_out
        self._embedders: dict[str, Embedder] = {}
        self._built_embedders: list[Embedder] = []
        self._example_sets: dict[str, ExampleSet] = {}
        self._cascades: dict[str, Cascade | None] = {}
        self.session_id = session_id or uuid.uuid4().hex
        self.schemas = SchemaSet(config.base_dir)
        self.redact = Redactor(config_secrets(config))
        self._lock = threading.Lock()
        self._agents: dict[str, Agent] = {}
        self._overrides: dict[str, Agent] = {}
        #: structured-output styles negotiated per endpoint URL (agents/structured.py), built on first use
        self._styles: Any = None
        self._seq: dict[tuple[int, str], int] = {}
        self._choices: dict[str, Choice | None] = {}
        self._closed = False
        self._owns_trace = False
        self.trace: TraceWriter | None = None
        self._recorder: TraceRecorder | None = None
        if trace is not None:
            from localllm.trace.recorder import TraceRecorder
            from localllm.trace.writer import TraceWriter

            if isinstance(trace, (str, Path)):
                self.trace = TraceWriter.open(Path(trace), wait=trace_wait)
                self._owns_trace = True
            elif isinstance(trace, TraceWriter):
                self.trace = trace
            else:
                raise TypeError(f"trace must be a path or a TraceWriter, got {type(trace).__name__}")
            self._recorder = TraceRecorder(self.trace, redact=self.redact, base_dir=config.base_dir)
        self.turn = turn if turn is not None else (self._recorder.next_turn() if self._recorder else 1)

    def _episode_plays(self) -> dict[str, int]:
        """episode_id → matches the trace already holds (a replaying agent counts on from there)."""
        return self._recorder.episode_plays() if self._recorder is not None else {}

    # ------------------------------------------------------------------ registry

    def register_inprocess(
        self, alias: str, fn: Callable[[AskRequest], AskResponse | Any], *, local_model: bool = False
    ) -> None:
        """Bind a Python callable to an alias declared ``plugin: builtin.inprocess``.

        ``fn`` returns an AskResponse, or any JSON value (wrapped as the submission).
        ``local_model=True`` makes its schema_invalid answers fall back to agent.claude.
        """
        if not callable(fn):  # before: accepted, and every call a plugin_crash
            raise TypeError(f"register_inprocess({alias!r}, fn): fn must be callable, got {type(fn).__name__}")
        decl = self.config.agents.get(alias)
        if not isinstance(decl, InprocessDecl):
            raise CallError(
                f"{self.config.path}: agent_plugins.{alias} is not declared with plugin: builtin.inprocess",
                key=f"agent_plugins.{alias}",
                value=alias,
                hint=f"declare {alias}: {{plugin: builtin.inprocess}}",
            )
        from localllm.agents.inprocess import InprocessAgent

        self.register_agent(alias, InprocessAgent(alias, fn, local_model=local_model))

    def register_agent(self, alias: str, agent: Agent) -> None:
        """Route ``alias`` to ``agent`` (e.g. a cassette), replacing any declaration; the
        agent answers as ``alias`` (its errors name it, a cassette matches ``handler`` to it)."""
        from localllm.agents.cassette import CassetteAgent

        if not isinstance(agent, Agent):  # before: AttributeError, or a call's bare one later
            raise TypeError(f"register_agent({alias!r}, agent): agent must be an Agent, got {type(agent).__name__}")
        if isinstance(agent, CassetteAgent):  # its call_ids derive from its app_id
            agent.check_app_id(self.config.app_id, config=str(self.config.path))
        agent.alias = alias
        agent.continue_session(self._episode_plays())
        with self._lock:
            old = self._agents.pop(alias, None)
            self._overrides[alias] = agent
        if old is not None:
            old.close()

    def adopt_agent(self, alias: str, agent: Agent) -> None:
        """Use ``agent``, built from this config's own declaration of ``alias``, as the one this
        Runtime would build (e.g. a local model started while the config was still being
        checked: ``localllm run``). Closed with the Runtime. ``CallError`` if ``agent`` was
        built from another declaration."""
        decl = self.config.agents.get(alias)
        if decl is None or getattr(agent, "decl", None) != decl:
            raise CallError(
                f'agent "{alias}" was not built from this config\'s declaration of it',
                key="agent",
                value=alias,
                hint="build it from runtime.config.agents[alias], or use register_agent to replace the declaration",
            )
        agent.continue_session(self._episode_plays())
        with self._lock:
            old = self._agents.get(alias)
            self._agents[alias] = agent
        if old is not None and old is not agent:
            old.close()

    def register_embedder(self, name: str, embedder: Embedder) -> None:
        """Use ``embedder`` for the embedders: entry ``name`` (e.g. a FakeEmbedder in tests)."""
        with self._lock:
            self._embedders[name] = embedder

    def embedder(self, name: str) -> Embedder:
        """The embedder declared as ``name``, built on first use (its sidecar starts on first embed)."""
        with self._lock:
            self._refuse_closed()  # a closed Runtime started an embedding server nobody stopped
            found = self._embedders.get(name)
            if found is not None:
                return found
            decl = self.config.embedders.get(name)
            if decl is None:
                raise CallError(f'embedder "{name}" is not declared', key="embedders", value=name)
            from localllm.embed.local import embedder_from_decl

            built = embedder_from_decl(decl, base_dir=self.config.base_dir)
            self._embedders[name] = built
            self._built_embedders.append(built)
            return built

    def examples(self, gate: str) -> ExampleSet | None:
        """The gate's labelled examples (embedded on first use), or ``None`` without ``examples:``."""
        found = self.config.gates[gate].examples
        if found is None or found.cases is None or not found.input or not found.embedder:
            return None
        with self._lock:
            if gate in self._example_sets:
                return self._example_sets[gate]
        from localllm.embed.examples import ExampleSet, load_examples

        built = ExampleSet(
            load_examples(found.cases, found.input)[0],  # a repeated example is one (one vote)
            self.embedder(found.embedder),
            leave_one_out=self.examples_leave_one_out,
        )
        with self._lock:
            return self._example_sets.setdefault(gate, built)

    def tier_agent(self, alias: str, gate: str | None) -> Agent:
        """``examples`` in a gate with ``examples:`` is its examples tier; any other alias an agent."""
        from localllm.selection import TIER

        if alias != TIER or gate is None or self.config.gates[gate].examples is None:
            return self.agent(alias)
        key = f"{TIER}:{gate}"
        with self._lock:
            found = self._agents.get(key)
        if found is not None:
            return found
        from localllm.embed.examples import ExamplesAgent

        decl = self.config.gates[gate].examples
        sets = self.examples(gate)
        if decl is None or sets is None or not decl.answer:
            raise CallError(
                f"gate {gate} has no examples tier (examples: with answer: true)",
                key=f"gates.{gate}.examples",
                value=alias,
            )
        built = ExamplesAgent(
            alias, sets, input_arg=decl.input or "", fields=decl.fields, k=decl.k, out_of_scope=decl.out_of_scope
        )
        with self._lock:
            return self._agents.setdefault(key, built)

    def agent(self, alias: str) -> Agent:
        """The agent for ``alias``, constructed on first use (nothing is spawned here)."""
        with self._lock:
            self._refuse_closed()
            found = self._overrides.get(alias) or self._agents.get(alias)
            if found is not None:
                return found
            decl = self.config.agents.get(alias)
            if decl is None:
                declared = ", ".join(sorted(self.config.agents))
                raise CallError(
                    f'agent "{alias}" is not declared (declared: {declared})',
                    key="agent",
                    value=alias,
                    hint=f"declare it under agent_plugins: in {self.config.path}",
                )
            from localllm.agents import build_agent
            from localllm.agents.structured import Styles

            if self._styles is None:
                self._styles = Styles()
            built = build_agent(
                decl, base_dir=self.config.base_dir, styles=self._styles, secrets=config_secrets(self.config)
            )
            built.continue_session(self._episode_plays())
            self._agents[alias] = built
            return built

    def _refuse_closed(self) -> None:
        """CallError when :meth:`close` has run (nothing may start after it). Lock held."""
        if self._closed:
            raise CallError(
                "the Runtime is closed", key="runtime", hint="make calls before close() (inside `with Runtime(...)`)"
            )

    def _timeout(self, alias: str, explicit: float | None) -> float:
        if explicit is not None:
            if isinstance(explicit, bool) or not isinstance(explicit, (int, float)) or not 0 < explicit <= MAX_TIMEOUT:
                raise CallError(
                    f"timeout must be a number of seconds above 0, at most {MAX_TIMEOUT:g}, got {explicit!r}",
                    key="timeout",
                    value=explicit,
                )
            return explicit
        decl: AgentDecl | None = self.config.agents.get(alias)
        return decl.timeout if decl is not None else DEFAULT_TIMEOUT

    # ------------------------------------------------------------------ calls

    def call(
        self,
        verb: str,
        *,
        agent: str,
        prompt: str,
        schema: Mapping[str, Any] | str | Path | None = None,
        args: Mapping[str, Any] | None = None,
        world: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        state_path: str | None = None,
        selected_by: Mapping[str, Any] | None = None,
    ) -> CallResult:
        """Ask ``agent`` a verb and return the validated submission, or raise AgentError.

        ``schema`` is a schema object or a path relative to the config file. ``prompt`` may
        use ``{{ args.NAME }}`` / ``{{ world.NAME }}``. ``timeout`` is the hard cap in
        seconds (default: the agent's ``timeout``). Nothing but a LocalLLMError leaves a
        call; every error text and trace payload has the config's secrets redacted.
        """
        _check_call(prompt, schema, state_path, selected_by)
        args, world = json_mapping("args", args), json_mapping("world", world)
        given: dict[str, Any] = {"prompt": prompt, "args": args}
        if isinstance(schema, (str, Path)):
            given["schema"] = str(schema)
        return self._call(
            verb,
            agent=agent,
            prompt=prompt,
            schema=schema,
            args=args,
            world=world,
            timeout=timeout,
            state_path=state_path,
            gate=None,
            with_=given,
            selected_by=selected_by,
        )

    def _call(
        self,
        verb: str,
        *,
        agent: str,
        prompt: str,
        schema: Mapping[str, Any] | str | Path | None,
        args: Mapping[str, Any] | None,
        world: Mapping[str, Any] | None,
        timeout: float | None,
        state_path: str | None,
        gate: str | None,
        with_: dict[str, Any],
        selected_by: Mapping[str, Any] | None = None,
        extra: Mapping[str, str] | None = None,
        tiers: tuple[Tier, ...] | None = None,
    ) -> CallResult:
        """One call; ``gate`` decides the fallback (``Config.fallback_for``), ``with_`` is
        the ``with:`` block sent as ``AskRequest.with`` (as written, never a host path).
        ``tiers`` (a ``min_precision`` cascade) replaces ``agent`` and the fallback."""
        if verb not in VERBS:
            raise CallError(f'unknown verb "{verb}"', key="verb", value=verb, hint=f"use one of {', '.join(VERBS)}")
        args = dict(args or {})
        world = dict(world or {})
        schema_doc, schema_path = self._schema(schema)
        rendered = render_prompt(prompt, args, world, extra=extra)
        if tiers is not None:
            agent = tiers[0].alias
        for name, value in (("agent", agent), ("state_path", state_path or verb)):
            if self.redact.find(value):  # written as is in every event of the call: never masked
                raise CallError(
                    f"the call's {name} holds a secret value (a resolved ${{VAR}} or api_key_env); "
                    "it is a structural trace field, never masked",
                    key=name,
                    hint="an alias or state path must not equal or contain a secret",
                )
        target = self.tier_agent(agent, gate)
        hard = self._timeout(agent, timeout)
        ends = time.monotonic() + hard  # the call's hard cap covers every leg, the fallback's too
        request = self._request(
            verb,
            rendered,
            state=state_path or verb,
            hard=hard,
            # a schema file's refs to other files made local: no agent can read the config's files
            schema=self.schemas.bundled(schema_path) if schema_path is not None else schema_doc,
            world=world,
            with_={**with_, "args": args},
        )
        record: _Record = (
            _UNRECORDED
            if self._recorder is None
            else self._recorder.call_started(request, alias=agent, schema_path=schema_path, args=args)
        )
        started = time.monotonic()
        if tiers is not None:
            leg, steps = self._climb(
                tiers,
                target,
                request,
                record,
                gate=gate,
                scope=self._scope(gate, args) if len(tiers) > 1 else None,
                schema=schema_doc,
                schema_path=schema_path,
                ends=ends,
                timeout=timeout,
            )
            meta = self._meta(leg, None)
            if len(steps) > 1:
                meta["fallback_of"] = steps[0]["agent"]
            meta["cascade"] = steps
            meta["selected_by"] = dict(selected_by or {})
            call_id = self._replay_call_id(leg) or request.call_id
            record.finished(call_id=call_id, duration_ms=int((time.monotonic() - started) * 1000), meta=meta)
            if leg.error is not None:
                raise leg.error.replace(call_id=call_id)
            return CallResult(submission=leg.value, meta=meta, call_id=call_id, agent=leg.alias)
        leg = self._attempt(
            target, agent, request, schema=schema_doc, schema_path=schema_path, ends=ends, timeout=timeout
        )
        record.leg_finished(leg.alias, leg.response, leg.error, leg.value)
        fallback_of: str | None = None
        to = self.config.fallback_for(agent, gate) if target.is_local_model else None
        if leg.error is not None and leg.error.kind is ErrorKind.SCHEMA_INVALID and to is not None:
            fallback_of = agent
            record.fallback(reason="schema_invalid", original_plugin=agent, fallback_plugin=to)
            leg = self._fallback(
                to, request, leg.error, schema=schema_doc, schema_path=schema_path, ends=ends, timeout=timeout
            )
            record.leg_finished(leg.alias, leg.response, leg.error, leg.value)
        meta = self._meta(leg, fallback_of)
        if selected_by is not None:
            meta["selected_by"] = dict(selected_by)
        call_id = self._replay_call_id(leg) or request.call_id
        record.finished(call_id=call_id, duration_ms=int((time.monotonic() - started) * 1000), meta=meta)
        if leg.error is not None:
            raise leg.error.replace(call_id=call_id)
        return CallResult(submission=leg.value, meta=meta, call_id=call_id, agent=leg.alias)

    def _climb(
        self,
        tiers: tuple[Tier, ...],
        first: Agent,
        request: AskRequest,
        record: _Record,
        *,
        gate: str | None,
        schema: dict[str, Any] | None,
        schema_path: Path | None,
        ends: float,
        timeout: float | None,
        scope: Mapping[str, Any] | None = None,
    ) -> tuple[_Leg, list[dict[str, Any]]]:
        """Ask each rung in turn until one's answer is accepted: a local rung's when it is
        valid and its ``meta.confidence`` clears the rung's threshold, the last rung's always.
        Each refusal escalates exactly once, to the next rung (``substitution.reason``
        ``low_confidence``, or the failed leg's error kind). A missing confidence, or one
        outside [0, 1] (``calibrate.score_of``), is "not calibrated": it escalates. An
        input ``scope`` finds out of scope (its novelty at or below the gate's bar) skips
        every local rung: one escalation, reason ``out_of_scope``, no local model asked.
        Returns the answering leg and one step per rung asked (the skip is one step)."""
        steps: list[dict[str, Any]] = []
        leg = _Leg(tiers[0].alias, None, None)
        start = 0
        if scope is not None and not scope["in_scope"]:
            start = len(tiers) - 1
            steps.append(
                {
                    "agent": tiers[0].alias,
                    "skipped": [t.alias for t in tiers[:start]],
                    "accepted": False,
                    "reason": scope.get("reason", "out_of_scope"),
                    "novelty": scope["novelty"],
                    "novelty_bar": scope["bar"],
                }
            )
            record.fallback(
                reason=scope.get("reason", "out_of_scope"),
                original_plugin=tiers[0].alias,
                fallback_plugin=tiers[-1].alias,
            )
        for index, tier in enumerate(tiers):
            if index < start:
                continue
            agent = first if index == 0 else self.tier_agent(tier.alias, gate)
            leg = self._attempt(
                agent, tier.alias, request, schema=schema, schema_path=schema_path, ends=ends, timeout=timeout
            )
            record.leg_finished(leg.alias, leg.response, leg.error, leg.value)
            meta = self.redact.value(dict((leg.response.meta if leg.response else None) or {}))
            confidence = score_of(meta.get("confidence"))  # the rule the evidence was scored by
            step: dict[str, Any] = {
                "agent": tier.alias,
                "confidence": confidence,
                "confidence_method": meta.get("confidence_method"),
                "threshold": None if tier.threshold is None else tier.threshold.value,
            }
            last = index == len(tiers) - 1
            if leg.error is not None:
                step.update(accepted=False, reason=leg.error.kind.value)
            elif last or (tier.threshold is not None and tier.threshold.accepts(confidence)):
                step.update(accepted=True, reason="last tier" if last and index else "confident")
            else:
                step.update(accepted=False, reason="low_confidence" if confidence is not None else "no_confidence")
            if index < len(tiers) - 1:
                step["meta"] = meta
            steps.append(step)
            if step["accepted"] or last:
                break
            record.fallback(
                reason="low_confidence" if leg.error is None else leg.error.kind.value,
                original_plugin=tiers[0].alias,
                fallback_plugin=tiers[index + 1].alias,
            )
        return leg, steps

    def _scope(self, gate: str | None, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The cascade's out-of-scope rule for this input: its novelty against the bar the
        gate's examples calibrate (``None``: no examples, no text, or nothing to calibrate
        from). When the embedder fails the input's scope is unknown: like a missing
        confidence, that escalates (reason ``scope_unknown``)."""
        decl = self.config.gates[gate].examples if gate is not None else None
        if decl is None or not decl.fields or not decl.input:
            return None
        text = args.get(decl.input)
        sets = self.examples(gate) if isinstance(text, str) and gate is not None else None
        if sets is None or not isinstance(text, str):
            return None
        try:
            bar = sets.novelty_bar(decl.fields, decl.out_of_scope)
            if not bar.measured:
                return None
            score = sets.novelty(text, decl.fields, decl.out_of_scope)
        except LocalLLMError as exc:  # scope unknown: no local rung may answer (not calibrated → escalate)
            log.warning("gate %s: out-of-scope rule unavailable (%s); the call escalates", gate, exc)
            return {"novelty": None, "bar": None, "in_scope": False, "reason": "scope_unknown"}
        return {"novelty": round(score, 6), "bar": round(bar.value, 6), "in_scope": bar.admits(score)}

    def _fallback(
        self,
        alias: str,
        request: AskRequest,
        local_error: AgentError,
        *,
        schema: dict[str, Any] | None,
        schema_path: Path | None,
        ends: float,
        timeout: float | None,
    ) -> _Leg:
        """The fallback agent's leg after the local answer failed validation."""
        leg = self._attempt(
            self.agent(alias), alias, request, schema=schema, schema_path=schema_path, ends=ends, timeout=timeout
        )
        if leg.error is not None:
            # the caller learns why the local answer was refused, not only why the fallback failed
            hint = "; ".join(h for h in (leg.error.hint, local_error.hint) if h)
            leg.error = leg.error.replace(original=local_error, hint=hint)
        return leg

    def _request(
        self,
        verb: str,
        prompt: str,
        *,
        state: str,
        hard: float,
        schema: dict[str, Any] | None,
        world: dict[str, Any],
        with_: dict[str, Any],
    ) -> AskRequest:
        """The AskRequest of a live call, with the next ``turn:state_path:seq`` call_id."""
        with self._lock:
            seq = self._seq.get((self.turn, state), 0)
            self._seq[(self.turn, state)] = seq + 1
        return AskRequest(
            session_id=self.session_id,
            turn=self.turn,
            state_path=state,
            verb=verb,
            prompt=prompt,
            call_id=derive_call_id(self.config.app_id, live_call_key(self.turn, state, seq)),
            deadline=_rfc3339(datetime.now(UTC) + timedelta(seconds=hard)),
            schema=schema,
            world=world,
            with_=with_,
        )

    def _meta(self, leg: _Leg, fallback_of: str | None) -> dict[str, Any]:
        """The call's meta: the answering leg's (a replayed error carries one too), redacted."""
        raw = leg.response.meta if leg.response is not None else (leg.error.meta if leg.error else None)
        meta: dict[str, Any] = self.redact.value(dict(raw or {}))
        if fallback_of is not None:
            meta["fallback_of"] = fallback_of
        return meta

    def _replay_call_id(self, leg: _Leg) -> str | None:
        """A replayed answer (or replayed error) names its episode: that decides the call_id."""
        replay = leg.response if leg.response is not None else leg.error
        if replay is None or replay.episode_id is None or replay.match_idx is None:
            return None
        return derive_call_id(self.config.app_id, cassette_call_key(replay.episode_id, replay.match_idx))

    def run_gate(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        world: Mapping[str, Any] | None = None,
        *,
        agent: str | None = None,
    ) -> CallResult:
        """Run the named gate. Gate ``args`` are rendered against the call's args/world,
        then call args the gate does not define are added.

        ``agent`` routes the gate to another declared alias. Without it, a gate with
        ``selection: {policy: cheapest-passing}`` asks its evidence (once per Runtime, see
        :mod:`localllm.selection`) and records the choice as ``meta.selected_by``."""
        gate = self.config.gates.get(name)
        if gate is None:
            known = ", ".join(self.config.gates) or "none"
            raise CallError(
                f'no gate named "{name}" (gates: {known})',
                key="gates",
                value=name,
                hint=f"declare it under gates: in {self.config.path}",
            )
        selected_by: dict[str, Any] | None = None
        plan = self._cascade(name) if agent is None else None
        if plan is not None:
            agent, selected_by = plan.tiers[0].alias, plan.record
        elif agent is None:
            choice = self._selection(name)
            agent = choice.alias if choice is not None else gate.agent
            selected_by = choice.selected_by if choice is not None else None
        given, world = json_mapping("args", args), json_mapping("world", world)
        merged: dict[str, Any] = {}
        for key, value in gate.args.items():
            merged[key] = (
                render_prompt(value, given, world, source=f"gates.{name}.with.args.{key}")
                if isinstance(value, str)
                else value
            )
        for key, value in given.items():
            merged.setdefault(key, value)
        schema = self.config.schema_for(gate, lambda text: render_prompt(text, merged, world, source=f"gates.{name}"))
        return self._call(
            gate.verb,
            agent=agent,
            prompt=gate.prompt,
            schema=schema,
            args=merged,
            world=world,
            timeout=gate.timeout,
            state_path=name,
            gate=name,
            with_=dict(gate.with_),
            selected_by=selected_by,
            extra=self._shots(name, merged),
            tiers=plan.tiers if plan is not None else None,
        )

    def _shots(self, name: str, args: Mapping[str, Any]) -> dict[str, str] | None:
        """``{{ examples }}``: the gate's nearest examples as few-shot pairs ("" when ``shots: 0``)."""
        decl = self.config.gates[name].examples
        if decl is None or "examples" not in _TEMPLATE.findall(self.config.gates[name].prompt):
            return None
        text = args.get(decl.input or "")
        sets = self.examples(name) if decl.shots > 0 and isinstance(text, str) else None
        if sets is None or not isinstance(text, str):
            return {"examples": ""}
        from localllm.embed.examples import render_shots

        try:
            return {"examples": render_shots(sets.neighbours(text, decl.shots), decl.input or "")}
        except LocalLLMError as exc:
            # the shots help the model, they are not the call: without the embedder the call
            # goes on (a cascade's examples tier fails the same way and escalates)
            log.warning("gate %s: no few-shot examples (%s); the prompt gets none", name, exc)
            return {"examples": ""}

    def _cascade(self, name: str) -> Cascade | None:
        """The gate's ``min_precision`` rungs, decided from its evidence once per Runtime."""
        with self._lock:
            if name in self._cascades:
                return self._cascades[name]
        from localllm.selection import cascade

        plan = cascade(self.config, self.config.gates[name])
        with self._lock:
            return self._cascades.setdefault(name, plan)

    def _selection(self, name: str) -> Choice | None:
        """The gate's evidence-backed choice, decided on first use and kept for this Runtime."""
        with self._lock:
            if name in self._choices:
                return self._choices[name]
        from localllm.selection import choose

        choice = choose(self.config, self.config.gates[name])
        with self._lock:
            return self._choices.setdefault(name, choice)

    # ------------------------------------------------------------------ internals

    def _schema(self, schema: Mapping[str, Any] | str | Path | None) -> tuple[dict[str, Any] | None, Path | None]:
        if schema is None:
            return None, None
        if isinstance(schema, Mapping):
            doc = dict(schema)
            if (problem := json_problem(doc)) is not None:
                # before: a bare TypeError from json.dumps (a key 1 beside a key "a", an object())
                where, why = problem
                raise CallError(
                    f"the call's schema is not JSON data at {where}: {why}",
                    key="schema",
                    hint="a schema is JSON: objects with string keys, arrays, strings, finite numbers, booleans, null",
                )
            return doc, None
        path = Path(schema)
        full = path if path.is_absolute() else (self.config.base_dir / path)
        try:
            return self.schemas.load(full), full.resolve()
        except SchemaError:
            raise
        except (OSError, ValueError) as exc:  # a NUL or a lone surrogate in the path
            raise unreadable(full, exc) from exc

    def _attempt(
        self,
        agent: Agent,
        alias: str,
        request: AskRequest,
        *,
        schema: dict[str, Any] | None,
        schema_path: Path | None,
        ends: float,
        timeout: float | None,
    ) -> _Leg:
        """One agent's leg of a call: ask, check sub-events, validate. The last boundary:
        whatever the agent raises comes back as an AgentError naming ``alias``, redacted.

        The leg has what is left of the call's hard cap (``ends``), at most the agent's own
        timeout: a fallback or a cascade's next rung never extends the call (before, each
        got a fresh timeout: ``--timeout 3`` answered after 5.4 s)."""
        left = min(ends - time.monotonic(), self._timeout(alias, timeout))
        if left <= 0:
            error = AgentError(ErrorKind.DEADLINE_EXCEEDED, "no time left of the call's deadline", alias=alias)
            return _Leg(alias, None, self._own(error, alias))
        deadline = time.monotonic() + left

        # Compile the validator before the agent's thread starts: its first use imports
        # jsonschema, which the agent may import too (the grammar subset check), and two
        # threads importing one package at once can see it half-initialised. A schema that
        # cannot compile is reported by the validation below.
        from localllm import _jsonschema

        _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
        import jsonschema.validators  # noqa: F401  (even without a schema: the agent's thread may need it)

        if schema is not None:
            with contextlib.suppress(SchemaError):
                self.schemas.validator(schema, base=schema_path)
        try:
            response = self._ask(agent, alias, request, deadline=deadline, timeout=left)
        except AgentError as exc:
            return _Leg(alias, None, self._own(exc, alias))
        except Exception as exc:  # the last boundary: a foreign failure becomes data, its cause chained
            return _Leg(alias, None, self._own(_foreign(exc), alias))
        leg = _Leg(alias, response, None)
        try:
            self._check_sub_events(alias, request.call_id, response)
            self._check_structural(response)
            if schema is not None:
                leg.value = self.schemas.validate(response.submission, schema, base=schema_path)
            else:
                leg.value = _parse_loose(response.submission)
        except AgentError as exc:
            leg.error = self._own(_explain_cut(exc, response), alias)
        return leg

    def _own(self, exc: AgentError, alias: str) -> AgentError:
        """``exc`` naming ``alias`` (when it named no agent) with the config's secrets redacted."""
        if exc.alias is None:
            exc = exc.replace(alias=alias)
        return exc.redacted(self.redact) if self.redact else exc

    def _ask(self, agent: Agent, alias: str, request: AskRequest, *, deadline: float, timeout: float) -> AskResponse:
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
        if not done.wait(max(0.0, deadline - time.monotonic())):
            agent.cancel(request.call_id)
            worker.join(_CANCEL_GRACE)
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED,
                f"did not answer within {timeout:g}s; the late answer is discarded",
                alias=alias,
            )
        worker.join()
        if "error" in box:
            raise box["error"]
        response = box["response"]
        if not isinstance(response, AskResponse):
            raise AgentError(
                ErrorKind.PLUGIN_CRASH, f"ask() returned {type(response).__name__}, not an AskResponse", alias=alias
            )
        wrong = self._misshapen(response)
        if wrong is not None:
            raise AgentError(ErrorKind.PLUGIN_CRASH, f"ask() returned an AskResponse whose {wrong}", alias=alias)
        return response

    @staticmethod
    def _misshapen(response: AskResponse) -> str | None:
        """What is wrong with the field types of an AskResponse, or None. Only an
        in-process agent can break them (the wire transports build responses through
        ``AskResponse.from_json``); unchecked, a dict submission or a string sub-event
        left the call as a bare TypeError/AttributeError."""
        if response.submission is not None and not isinstance(response.submission, str):
            return f"submission is {type(response.submission).__name__}, not JSON text (str) or None"
        if response.meta is not None and not isinstance(response.meta, dict):
            return f"meta is {type(response.meta).__name__}, not a dict or None"
        if not isinstance(response.sub_events, list) or not all(isinstance(e, dict) for e in response.sub_events):
            return "sub_events is not a list of dicts"
        wrong = bad_sub_event_payload(response.sub_events)
        if wrong is not None:
            return f"sub_events[{wrong}].payload is not a dict or None"
        if response.transcript is not None and not isinstance(response.transcript, Transcript):
            return f"transcript is {type(response.transcript).__name__}, not a Transcript or None"
        if response.episode_id is not None and not isinstance(response.episode_id, str):
            return f"episode_id is {type(response.episode_id).__name__}, not a str or None"
        if response.match_idx is not None and (
            isinstance(response.match_idx, bool) or not isinstance(response.match_idx, int)
        ):
            return f"match_idx is {type(response.match_idx).__name__}, not an int or None"
        return None

    @staticmethod
    def _check_sub_events(alias: str, call_id: str, response: AskResponse) -> None:
        prefix = alias + "."
        for i, event in enumerate(response.sub_events):
            kind = event.get("kind")
            if not isinstance(kind, str) or not kind.startswith(prefix):
                raise AgentError(
                    ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION,
                    f"sub_events[{i}].kind {kind!r} is outside the plugin namespace {prefix!r}",
                )
            if event.get("call_id") != call_id:
                raise AgentError(
                    ErrorKind.SUB_EVENT_CALL_ID_MISMATCH,
                    f"sub_events[{i}].call_id {event.get('call_id')!r} != parent call_id {call_id!r}",
                )

    def _check_structural(self, response: AskResponse) -> None:
        """A secret in a sub-event's kind or call_id fails the call: structural fields are
        written as they are, never masked (a masked kind would break the namespace rule)."""
        for i, event in enumerate(response.sub_events):
            for name in ("kind", "call_id"):
                value = event.get(name)
                if isinstance(value, str) and self.redact.find(value):
                    raise AgentError(
                        ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION
                        if name == "kind"
                        else ErrorKind.SUB_EVENT_CALL_ID_MISMATCH,
                        f"sub_events[{i}].{name} holds a secret value (a resolved ${{VAR}} or api_key_env); "
                        f"{name} is a structural trace field, never masked, so the call fails instead",
                        hint="keep secrets out of sub-event kinds; put them nowhere the trace records",
                    )

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
            embedders = list(self._built_embedders)
            self._built_embedders.clear()
        for agent in agents:
            agent.close()
        for embedder in embedders:
            close = getattr(embedder, "close", None)
            if callable(close):
                close()
        if self.trace is not None and self._owns_trace:
            self.trace.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _check_call(prompt: object, schema: object, state_path: object, selected_by: object) -> None:
    """A CallError for :meth:`Runtime.call` arguments no agent can be asked with, before any is
    (before: a bare TypeError from the template's regex or from ``Path(5)``; a ``state_path`` the
    trace refused after the agent had answered)."""
    if not isinstance(prompt, str):
        raise CallError(
            f"prompt must be text (str), got {type(prompt).__name__}",
            key="prompt",
            hint="pass the prompt's text, e.g. Path(file).read_text()",
        )
    if (why := text_problem(prompt)) is not None:
        raise CallError(
            f"the prompt {why}", key="prompt", hint="pass UTF-8 text (decode bytes with their own encoding)"
        )
    if schema is not None and not isinstance(schema, (Mapping, str, Path)):
        raise CallError(
            f"schema must be a schema object, a path or None, got {type(schema).__name__}",
            key="schema",
            hint="pass a dict, or a path relative to the config file",
        )
    if state_path is not None:
        from localllm.trace.rules import check_string

        if not isinstance(state_path, str):
            raise CallError(f"state_path must be text (str), got {type(state_path).__name__}", key="state_path")
        try:
            check_string(state_path, "state_path")
        except TraceWriteRejected as exc:
            raise CallError(f"the call's state_path cannot be traced: {exc}", key="state_path") from None
    if selected_by is not None and not isinstance(selected_by, Mapping):
        raise CallError(f"selected_by must be a mapping, got {type(selected_by).__name__}", key="selected_by")


def json_mapping(name: str, value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A call's ``args`` or ``world`` as a dict, or a CallError: they reach every agent and the
    trace as JSON (before, a list was a bare ValueError, and a key ``1`` beside ``"1"`` became
    one key in the trace, the other answer's input lost)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CallError(
            f"the call's {name} must be a mapping of names to values, got {type(value).__name__}",
            key=name,
            hint=f'e.g. {name}={{"ticket": "The app crashes on save"}}',
        )
    doc = dict(value)
    if (problem := json_problem(doc)) is not None:
        where, why = problem
        raise CallError(
            f"the call's {name} are not JSON data at {where}: {why}",
            key=name,
            hint="give JSON: mappings with string keys, lists, UTF-8 strings, finite numbers, booleans, None",
        )
    return doc


def _foreign(exc: Exception) -> AgentError:
    """An exception that is not an AgentError, as one: I/O failures (OSError) and localllm's
    own errors (a fetch, a sidecar) are ``transport_error``, anything else ``plugin_crash``."""
    if isinstance(exc, LocalLLMError):
        error = AgentError(ErrorKind.TRANSPORT_ERROR, str(exc), hint=exc.hint)
    elif isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        error = AgentError(
            ErrorKind.TRANSPORT_ERROR,
            f"{type(exc).__name__}: {exc.strerror or exc}{where}",
            hint="check the paths named (LOCALLLM_CACHE_DIR, the config's command, cwd and model)",
        )
    else:
        error = AgentError(
            ErrorKind.PLUGIN_CRASH,
            f"raised {type(exc).__name__}: {exc}",
            hint="a bug in the agent or its transport; LOCALLLM_DEBUG=1 shows the traceback",
        )
    error.__cause__ = exc
    return error


def _explain_cut(exc: AgentError, response: AskResponse) -> AgentError:
    """A schema_invalid answer that stopped at the token limit says so, and what to change."""
    meta = response.meta or {}
    if exc.kind is not ErrorKind.SCHEMA_INVALID or meta.get("finish_reason") != "length":
        return exc
    limit = meta.get("max_tokens")
    cut = f"hit max_tokens={limit}" if limit is not None else "hit the token limit"
    return exc.replace(
        detail=f"{exc.detail} (the answer was cut: it {cut})",
        hint=f"{cut}; raise max_tokens or bound the schema's strings (maxLength, maxItems, enum)",
    )


def _parse_loose(submission: str | None) -> Any:
    """No schema: bind the parsed JSON when it parses (NaN is not JSON), else the raw text."""
    if submission is None:
        return None
    try:
        return loads_json(submission)
    except ValueError:
        return submission
