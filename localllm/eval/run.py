"""Run a gate's eval cases against candidate agents through the real Runtime.

Each agent gets its own Runtime (so its sidecar is stopped before the next agent's starts)
on one shared trace, in its own turn; its calls run in a thread pool sized to the agent's
``parallel`` slots (1 for anything that is not a local model server). A managed local
model's server is started before the clock runs for the first case (``startup_s``).

The runner keeps only which call_id answered which case; the numbers come from the trace
(:mod:`localllm.eval.report`), so the report is what the trace says.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.config import Config, LocalLLMDecl
from localllm.errors import AgentError, CallError, ConfigError, ConfigProblem
from localllm.eval.cases import Case

if TYPE_CHECKING:
    from localllm.runtime import Runtime
    from localllm.trace.writer import TraceWriter

__all__ = ["AgentRun", "CallRef", "check_cases", "run_cases"]

#: worker threads for an agent that is not a local model server (claude, a cassette, in-process)
DEFAULT_WORKERS = 1


@dataclass(frozen=True)
class CallRef:
    """One eval call: which case, which repeat, and the call_id its events carry."""

    agent: str
    case: str
    repeat: int
    call_id: str | None
    #: the kind of a failure raised before any event was written (the call has no call_id)
    unrecorded: str | None = None


@dataclass
class AgentRun:
    """What running one agent produced besides its trace events."""

    alias: str
    local: bool
    workers: int
    startup_s: float
    wall_s: float
    calls: list[CallRef] = field(default_factory=list)


def workers_for(config: Config, alias: str) -> int:
    """The agent's ``parallel`` slots when it is a local model server, else 1."""
    decl = config.agents.get(alias)
    return decl.parallel if isinstance(decl, LocalLLMDecl) else DEFAULT_WORKERS


def check_cases(config: Config, gate_name: str, cases: Sequence[Case], cases_path: Path) -> None:
    """Every case's args and world are JSON and render the gate's prompt and args (else one
    ConfigError naming each line)."""
    from localllm.runtime import json_mapping, render_prompt

    gate = config.gates[gate_name]
    problems: list[ConfigProblem] = []
    for case in cases:
        try:
            # cases made in Python (a file's NaN and lone surrogates are refused as it loads)
            json_mapping("args", case.args)
            json_mapping("world", case.world)
            for key, value in gate.args.items():
                if isinstance(value, str):
                    render_prompt(value, case.args, case.world, source=f"gates.{gate_name}.with.args.{key}")
            render_prompt(gate.prompt, {**gate.args, **case.args}, case.world, extra={"examples": ""})
        except CallError as exc:
            problems.append(ConfigProblem(str(cases_path), f"line {case.line}.{exc.key or 'args'}", str(exc), exc.hint))
    if problems:
        raise ConfigError(problems)


def run_cases(
    config: Config,
    gate_name: str,
    cases: Sequence[Case],
    agents: Sequence[str],
    *,
    trace: TraceWriter,
    repeat: int = 1,
    cassettes: Mapping[str, Path] | None = None,
    prepare: Callable[[Runtime], None] | None = None,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[AgentRun]:
    """Run every case ``repeat`` times against each agent, in order; the events go to ``trace``.

    ``cassettes`` replaces agents (alias → cassette file), in every agent's Runtime, so a
    cassette-backed ``agent.claude`` also answers local fallbacks. ``prepare`` is called
    with each fresh Runtime (register in-process agents there). ``workers`` overrides the
    pool size (1 runs the cases one by one). ``progress`` is told after each call.
    """
    from localllm.agents.cassette import CassetteAgent
    from localllm.agents.local_llm import LocalLLMAgent
    from localllm.runtime import Runtime

    runs: list[AgentRun] = []
    for alias in agents:
        with Runtime(config, trace=trace, examples_leave_one_out=True) as runtime:
            if prepare is not None:
                prepare(runtime)
            for name, path in (cassettes or {}).items():
                runtime.register_agent(name, CassetteAgent(path, alias=name))
            target = runtime.tier_agent(alias, gate_name)
            started = time.monotonic()
            if isinstance(target, LocalLLMAgent):
                # start the managed server before the clock runs; when it cannot start,
                # every case reports the transport error, with its call_id
                with contextlib.suppress(AgentError):
                    target.base_url()
            startup = time.monotonic() - started
            size = workers or workers_for(config, alias)
            run = AgentRun(alias, target.is_local_model, size, startup, 0.0)

            def one(case: Case, rep: int, runtime: Runtime = runtime, alias: str = alias) -> CallRef:
                try:
                    result = runtime.run_gate(gate_name, case.args, case.world, agent=alias)
                    ref = CallRef(alias, case.id, rep, result.call_id)
                except AgentError as exc:
                    ref = CallRef(alias, case.id, rep, exc.call_id, None if exc.call_id else exc.kind.value)
                if progress is not None:
                    progress(1)
                return ref

            jobs = [(case, rep) for rep in range(repeat) for case in cases]
            began = time.monotonic()
            with ThreadPoolExecutor(max_workers=size, thread_name_prefix="localllm-eval") as pool:
                run.calls = list(pool.map(lambda job: one(*job), jobs))
            run.wall_s = time.monotonic() - began
            runs.append(run)
    return runs
