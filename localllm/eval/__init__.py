"""``localllm eval``: measure each candidate agent on a gate's cases, write the evidence.

    result = evaluate(config, "triage", agents=["agent.local", "agent.claude"],
                      cassettes={"agent.claude": Path("claude.cassette.yaml")})
    result.report["agents"]["agent.local"]["accuracy"]

Writes ``<out>/<gate>/<stamp>.json`` (+ ``latest.json``, the same as HTML) and the eval's
trace ``<stamp>.trace.jsonl`` beside them; ``selection:`` reads ``latest.json`` as evidence
(:mod:`localllm.selection`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.errors import CallError
from localllm.eval.cases import Case, Expect, Matcher, distinct_cases, load_cases
from localllm.eval.decision import DEFAULT_HOLDOUT, DEFAULT_SEED

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.runtime import Runtime

__all__ = [
    "MAX_REPEAT",
    "MAX_WORKERS",
    "Case",
    "EvalResult",
    "Expect",
    "Matcher",
    "default_cases_path",
    "default_out_dir",
    "evaluate",
    "load_cases",
]

#: ``--repeat`` at most: each (case, repeat) is a job held in memory, and the report keeps every
#: call (before, ``--repeat 99999999999`` grew the process by 300 MB/s before one call was made)
MAX_REPEAT = 100
#: ``--workers`` at most: a thread each (before, 100,000 on a large cases file: as many threads)
MAX_WORKERS = 256


@dataclass(frozen=True)
class EvalResult:
    """The report document and where it (and the eval's trace) were written."""

    report: dict[str, Any]
    paths: dict[str, Path]
    trace: Path


def default_cases_path(config: Config, gate: str) -> Path:
    return config.base_dir / "evals" / gate / "cases.jsonl"


def default_out_dir(config: Config) -> Path:
    return config.base_dir / "evals" / "reports"


def evaluate(
    config: Config,
    gate: str,
    *,
    agents: Sequence[str] | None = None,
    cases_path: Path | None = None,
    repeat: int = 1,
    out_dir: Path | None = None,
    cassettes: Mapping[str, Path] | None = None,
    prepare: Callable[[Runtime], None] | None = None,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    cases: Sequence[Case] | None = None,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = DEFAULT_SEED,
) -> EvalResult:
    """Run the gate's cases against ``agents`` (default: the gate's examples tier, when it
    has one, then its own agent) and write the report. ``holdout``/``seed``: the share of
    cases held out from threshold calibration, and the seed of that split. A case repeating
    an earlier one (:func:`~localllm.eval.cases.distinct_cases`) is not asked again: the
    report's ``duplicate_cases`` counts them, ``duplicate_lines`` names their lines. The
    report's ``examples`` does the same for the gate's examples file (a repeated example is
    one example, one vote: :func:`~localllm.eval.cases.distinct_examples`)."""
    # imported here, not with the package: load_config reads a gate's examples through
    # localllm.eval.cases, and every `localllm run` would pay for the report and the runner
    from localllm.eval.report import build_report, write_report
    from localllm.eval.run import check_cases, run_cases
    from localllm.trace.writer import TraceWriter

    found = config.gates.get(gate)
    if found is None:
        known = ", ".join(config.gates) or "none"
        raise CallError(
            f'no gate named "{gate}" (gates: {known})',
            key="gate",
            value=gate,
            hint=f"declare it under gates: in {config.path}",
        )
    from localllm.selection import TIER

    if isinstance(agents, str):  # its characters as aliases: 'agent "a" is not declared'
        raise TypeError(f"agents is a list of aliases, not one string: pass [{agents!r}]")
    tier = found.examples is not None and found.examples.answer
    aliases = list(agents or ([TIER] if tier else []) + [found.agent])
    for alias in aliases:
        if alias == TIER and tier:
            continue
        if alias not in config.agents:
            raise CallError(
                f'agent "{alias}" is not declared (declared: {", ".join(sorted(config.agents))})',
                key="agents",
                value=alias,
                hint=f"declare it under agent_plugins: in {config.path}",
            )
    if not 0.0 < holdout < 1.0:
        raise CallError(f"holdout must be between 0 and 1, got {holdout}", key="holdout", value=str(holdout))
    if not 1 <= repeat <= MAX_REPEAT:
        raise CallError(f"repeat must be 1 to {MAX_REPEAT}, got {repeat}", key="repeat", value=str(repeat))
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise CallError(f"workers must be 1 to {MAX_WORKERS}, got {workers}", key="workers", value=str(workers))
    if cases_path is None:
        # a gate with examples and no cases file of its own is measured on its examples (leave-one-out)
        cases_path = default_cases_path(config, gate)
        if not cases_path.exists() and found.examples is not None and found.examples.cases is not None:
            cases_path = found.examples.cases
    # a repeated case is asked once: its answer again would count as a second, independent answer
    loaded, duplicates = distinct_cases(cases if cases is not None else load_cases(cases_path))
    check_cases(config, gate, loaded, cases_path)
    examples = None
    if found.examples is not None and found.examples.cases is not None and found.examples.input:
        from localllm.embed.examples import load_examples

        kept, repeated = load_examples(found.examples.cases, found.examples.input)
        examples = (len(kept), [e.line for e in repeated])
    now = datetime.now(UTC)
    stamp = now.strftime("%Y%m%dT%H%M%S%fZ")
    target = (out_dir or default_out_dir(config)) / gate
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from localllm.selection import EvidenceError

        raise EvidenceError(
            target, f"cannot create the reports directory: {exc.strerror or exc}", hint="pass a writable --out DIR"
        ) from exc
    trace_path = target / f"{stamp}.trace.jsonl"
    with TraceWriter.open(trace_path) as writer:
        runs = run_cases(
            config,
            gate,
            loaded,
            aliases,
            trace=writer,
            repeat=repeat,
            cassettes=cassettes,
            prepare=prepare,
            workers=workers,
            progress=progress,
        )
    report = build_report(
        config,
        found,
        loaded,
        runs,
        trace_path=trace_path,
        cases_path=cases_path,
        repeat=repeat,
        created=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        holdout=holdout,
        seed=seed,
        duplicates=duplicates,
        examples=examples,
    )
    return EvalResult(report, write_report(report, target, stamp), trace_path)
