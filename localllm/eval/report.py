"""The eval report: every number counted from the eval's trace, then written as evidence.

Per agent (a call is one case asked once; ``repeat`` asks each case again):

- ``accuracy``: calls whose final answer (after any fallback) meets the case's ``expect``;
  a failed call is wrong. ``fields``: the same per expected field. ``first_try_accuracy``:
  correct without a fallback.
- ``schema_valid_first_try``: calls answered by the agent itself (no fallback, no error);
  ``fallback_rate``: calls that fell back; ``errors``: failed calls by kind
  (deadline_exceeded, transport_error, …).
- ``latency_ms`` p50/p95 (nearest rank over the trace's ``duration_ms``); ``tokens`` and
  ``cost_usd`` summed from each call's meta (``prompt_tokens``/``completion_tokens``, or
  claude's ``usage.input_tokens``/``output_tokens``; ``cost_usd``).
- ``reproducibility``: with ``repeat`` > 1, the share of cases whose repeats all ended the
  same (same submission, or the same error kind); ``null`` otherwise.
  ``reproducibility_labels``: the same over the fields with one expected value only (free
  text such as a summary left out).
- ``confusion``: for each enum field of the schema, expected label → answered value → count.
"""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localllm._fs import TEXT_LIMIT, read_capped
from localllm.config import Config, Gate
from localllm.errors import TraceError
from localllm.eval.cases import Case
from localllm.eval.decision import (
    DEFAULT_HOLDOUT,
    DEFAULT_SEED,
    Outcome,
    calibration_block,
    confidence_of,
    decision_block,
)
from localllm.eval.fromtrace import RecordedCall, recorded_calls
from localllm.eval.run import AgentRun, CallRef
from localllm.selection import REPORT_KIND, REPORT_VERSION, TIER, fingerprint
from localllm.trace.stats import percentile
from localllm.wire import finite_float

__all__ = ["agent_rows", "build_report", "enum_fields", "machine", "write_report"]

#: what a failed call "answered" in a confusion table
ERROR_LABEL = "<error>"
MISSING_LABEL = "<missing>"


def enum_fields(schema_path: Path | None) -> dict[str, list[Any]]:
    """Top-level enum properties of the gate's schema: name → allowed values."""
    if schema_path is None:
        return {}
    try:
        schema = json.loads(read_capped(schema_path, TEXT_LIMIT, regular=True).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    found: dict[str, list[Any]] = {}
    for name, prop in (props or {}).items():
        if isinstance(prop, dict) and isinstance(prop.get("enum"), list):
            found[str(name)] = list(prop["enum"])
    return found


def _tokens(meta: Mapping[str, Any]) -> tuple[int, int]:
    raw = meta.get("usage")
    usage: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    prompt = meta.get("prompt_tokens", usage.get("input_tokens"))
    completion = meta.get("completion_tokens", usage.get("output_tokens"))

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return count(prompt), count(completion)


def _cost(meta: Mapping[str, Any]) -> float:
    return finite_float(meta.get("cost_usd")) or 0.0


def _outcome(call: RecordedCall | None, unrecorded: str | None, fields: Sequence[str] | None = None) -> str:
    """How a call ended: its error kind, or its submission (only ``fields`` of it, when given)."""
    if call is None:
        return f"error:{unrecorded or 'unrecorded'}"
    if not call.ok:
        return f"error:{call.kind}"
    if fields is not None and isinstance(call.response, dict):
        return json.dumps({name: call.response.get(name) for name in fields}, sort_keys=True)
    return json.dumps(call.response, sort_keys=True)


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _rate(count: int, total: int) -> float | None:
    return round(count / total, 6) if total else None


def _stable(outcomes: Mapping[str, set[str]], repeat: int) -> float | None:
    """The share of cases whose repeats all ended the same; ``None`` without repeats."""
    return _rate(sum(1 for o in outcomes.values() if len(o) == 1), len(outcomes)) if repeat > 1 else None


def _answered(call: RecordedCall | None, name: str) -> str:
    """What ``call`` answered for the enum field ``name``, as a confusion-table column."""
    if call is None or not call.ok:
        return ERROR_LABEL
    if isinstance(call.response, dict) and name in call.response:
        return _label(call.response[name])
    return MISSING_LABEL


def _judge(case: Case, call: RecordedCall | None) -> tuple[bool, dict[str, bool]]:
    """(correct, field → correct); a failed call is wrong in every field."""
    if call is not None and call.ok:
        return case.expect.judge(call.response)
    return False, {name: False for name in (case.expect.fields or case.expect.labels())}


class _Tally:
    """One agent's calls added up, one call at a time (see the module docstring)."""

    def __init__(self, enums: Mapping[str, list[Any]]) -> None:
        self.correct = self.first_try = self.valid_first = self.fallbacks = 0
        self.field_hits: Counter[str] = Counter()
        self.field_total: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.durations: list[float] = []
        self.prompt_tokens = self.completion_tokens = 0
        self.cost = 0.0
        self.confusion: dict[str, dict[str, Counter[str]]] = {name: {} for name in enums}
        self.outcomes: dict[str, set[str]] = {}
        self.labelled: dict[str, set[str]] = {}

    def add(self, ref: CallRef, case: Case, call: RecordedCall | None) -> tuple[bool, dict[str, bool]]:
        """Count one call; (correct, field → correct) for its row."""
        ok, per = _judge(case, call)
        fell_back = call is not None and call.fallback
        self.correct += ok
        self.first_try += ok and not fell_back
        self.valid_first += call is not None and call.ok and not fell_back
        self.fallbacks += fell_back
        for name, hit in per.items():
            self.field_total[name] += 1
            self.field_hits[name] += hit
        self._measure(ref, call)
        self._classify(ref, case, call)
        return ok, per

    def _measure(self, ref: CallRef, call: RecordedCall | None) -> None:
        if call is None or not call.ok:
            self.errors[call.kind if call is not None and call.kind else (ref.unrecorded or "unrecorded")] += 1
        if call is None:
            return
        if call.duration_ms is not None:
            self.durations.append(call.duration_ms)
        prompt, completion = _tokens(call.meta)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cost += _cost(call.meta)

    def _classify(self, ref: CallRef, case: Case, call: RecordedCall | None) -> None:
        """The confusion tables and how each repeat of the case ended."""
        labels = case.expect.labels()
        for name, table in self.confusion.items():
            if name in labels:
                table.setdefault(_label(labels[name]), Counter())[_answered(call, name)] += 1
        self.outcomes.setdefault(ref.case, set()).add(_outcome(call, ref.unrecorded))
        self.labelled.setdefault(ref.case, set()).add(_outcome(call, ref.unrecorded, sorted(labels)))

    def metrics(self, run: AgentRun, repeat: int) -> dict[str, Any]:
        n, durations, hits = len(run.calls), self.durations, self.field_hits
        return {
            "local": run.local,
            "calls": n,
            "correct": self.correct,
            "accuracy": _rate(self.correct, n),
            "first_try_accuracy": _rate(self.first_try, n),
            "fields": {
                name: {"correct": hits[name], "total": total, "accuracy": _rate(hits[name], total)}
                for name, total in sorted(self.field_total.items())
            },
            "schema_valid_first_try": _rate(self.valid_first, n),
            "fallbacks": self.fallbacks,
            "fallback_rate": _rate(self.fallbacks, n),
            "errors": dict(sorted(self.errors.items())),
            "latency_ms": {
                "p50": percentile(durations, 50),
                "p95": percentile(durations, 95),
                "mean": round(sum(durations) / len(durations), 3) if durations else None,
            },
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
            "cost_usd": {"total": round(self.cost, 6), "mean": round(self.cost / n, 6) if n else None},
            "reproducibility": _stable(self.outcomes, repeat),
            "reproducibility_labels": _stable(self.labelled, repeat),
            "confusion": {
                name: {want: dict(sorted(got.items())) for want, got in sorted(table.items())}
                for name, table in self.confusion.items()
            },
            "per_label": {
                name: {
                    want: {"calls": sum(got.values()), "accuracy": _rate(got.get(want, 0), sum(got.values()))}
                    for want, got in sorted(table.items())
                }
                for name, table in self.confusion.items()
            },
            "workers": run.workers,
            "startup_s": round(run.startup_s, 3),
            "wall_s": round(run.wall_s, 3),
            "cases_per_s": round(n / run.wall_s, 3) if run.wall_s > 0 else None,
        }


def _row(alias: str, ref: CallRef, call: RecordedCall | None, ok: bool, per: dict[str, bool]) -> dict[str, Any]:
    return {
        "agent": alias,
        "case": ref.case,
        "repeat": ref.repeat,
        "call_id": ref.call_id,
        "correct": ok,
        "fields": per,
        "fallback": call is not None and call.fallback,
        "answered_by": call.answered_by if call is not None else None,
        "error": None if call is None or call.ok else call.kind,
        "duration_ms": call.duration_ms if call is not None else None,
        "submission": call.response if call is not None else None,
        # the agent's own confidence: after a fallback the meta is the fallback's, and the
        # agent's refused answer escalates at run time, so it is no (score, correct) pair of it
        "confidence": confidence_of(call.meta) if call is not None and call.ok and not call.fallback else None,
        "in_scope": _in_scope(call.meta) if call is not None and call.ok else None,
    }


def _in_scope(meta: Mapping[str, Any] | None) -> bool | None:
    """The examples tier's out-of-scope verdict on the case (``None``: no rule measured)."""
    found = (meta or {}).get("in_scope")
    return found if isinstance(found, bool) else None


def agent_rows(
    runs: Sequence[AgentRun],
    calls: Sequence[RecordedCall],
    cases: Sequence[Case],
    enums: Mapping[str, list[Any]],
    repeat: int,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(alias → metrics, one row per call) counted from the trace's calls."""
    by_id = {call.call_id: call for call in calls}
    case_of = {case.id: case for case in cases}
    agents: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for run in runs:
        tally = _Tally(enums)
        for ref in run.calls:
            call = by_id.get(ref.call_id) if ref.call_id else None
            if ref.call_id is not None and call is None:
                raise TraceError(
                    f"call {ref.call_id} of case {ref.case} is not in the eval trace",
                    hint="the trace was changed while the eval ran; run it again",
                )
            ok, per = tally.add(ref, case_of[ref.case], call)
            rows.append(_row(run.alias, ref, call, ok, per))
        agents[run.alias] = tally.metrics(run, repeat)
    return agents, rows


def machine() -> dict[str, Any]:
    """Where the eval ran (no host name)."""
    from localllm._version import __version__

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "localllm": __version__,
    }


def build_report(
    config: Config,
    gate: Gate,
    cases: Sequence[Case],
    runs: Sequence[AgentRun],
    *,
    trace_path: Path,
    cases_path: Path,
    repeat: int,
    created: str,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = DEFAULT_SEED,
    duplicates: Sequence[Case] = (),
    examples: tuple[int, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The report document (``kind: localllm_eval_report``) of one eval run; ``duplicates``:
    the cases left out of it as repeats of others (:func:`localllm.eval.cases.distinct_cases`);
    ``examples``: for a gate with examples, how many its file gives and the lines of the
    repeats left out of them (:func:`localllm.eval.cases.distinct_examples`)."""
    calls = recorded_calls(trace_path)
    enums = enum_fields(gate.schema_path)
    agents, rows = agent_rows(runs, calls, cases, enums, repeat)
    outcomes: dict[str, dict[str, Outcome]] = {run.alias: {} for run in runs}
    costs = {c.call_id: _cost(c.meta) for c in calls}
    # calibration rests on checked labels: an unlabelled case (`trace cases`' recorded answer,
    # often the local model's own) or one whose expect checks nothing is right by definition
    judged = {c.id for c in cases if c.labelled and c.expect.checks_anything}
    for row in rows:
        if row["repeat"] == 0 and row["case"] in judged:
            outcomes.setdefault(row["agent"], {})[row["case"]] = Outcome(
                bool(row["correct"]),
                row["confidence"],
                float(row["duration_ms"] or 0),
                costs.get(row["call_id"], 0.0),
            )
    label_of = {c.id: json.dumps(c.expect.labels(), sort_keys=True) for c in cases if c.id in judged}
    # the out-of-scope rule: the examples tier's verdict per case applies to every local tier
    in_scope = {
        row["case"]: row["in_scope"]
        for row in rows
        if row["agent"] == TIER and row["repeat"] == 0 and isinstance(row.get("in_scope"), bool)
    }
    calibration = calibration_block(outcomes, label_of, holdout=holdout, seed=seed, in_scope=in_scope or None)
    local = [run.alias for run in runs if run.local]
    strong = next((run.alias for run in runs if not run.local), None)
    decision = decision_block(calibration, outcomes, local, strong, in_scope=in_scope or None)

    def shown(path: Path) -> str:
        """Paths under the config's directory relative to it (a report can be committed)."""
        full = path.resolve()
        return (
            str(full.relative_to(config.base_dir.resolve()))
            if full.is_relative_to(config.base_dir.resolve())
            else str(full)
        )

    return {
        "kind": REPORT_KIND,
        "version": REPORT_VERSION,
        "gate": gate.name,
        "created": created,
        "config": shown(config.path),
        "cases_file": shown(cases_path),
        "cases": len(cases),
        "duplicate_cases": len(duplicates),
        "duplicate_lines": [c.line for c in duplicates],
        "unlabelled_cases": sum(1 for c in cases if not c.labelled),
        "examples": None
        if examples is None or gate.examples is None or gate.examples.cases is None
        else {
            "file": shown(gate.examples.cases),
            "examples": examples[0],
            "duplicate_examples": len(examples[1]),
            "duplicate_lines": list(examples[1]),
        },
        "calibration_cases": len(judged),
        "repeat": repeat,
        "trace": shown(trace_path),
        "fingerprint": fingerprint(config, gate, [run.alias for run in runs]),
        "machine": machine(),
        "agents": agents,
        "calibration": calibration,
        "decision": decision,
        "calls": rows,
    }


def write_report(report: Mapping[str, Any], out_dir: Path, stamp: str) -> dict[str, Path]:
    """``<stamp>.json``, ``latest.json``, the same as ``.html`` and the picture alone as
    ``latest.svg``, under ``out_dir`` (each written whole: temp file, fsync, rename)."""
    from localllm._fs import atomic_write
    from localllm.eval.html import render_html, render_svg
    from localllm.selection import EvidenceError

    data = (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    page = render_html(report).encode("utf-8")
    picture = render_svg(report).encode("utf-8")
    files = {
        "json": (out_dir / f"{stamp}.json", data),
        "latest": (out_dir / "latest.json", data),
        "html": (out_dir / f"{stamp}.html", page),
        "latest_html": (out_dir / "latest.html", page),
        "svg": (out_dir / "latest.svg", picture),
    }
    for path, content in files.values():
        try:
            atomic_write(path, content)
        except OSError as exc:
            raise EvidenceError(
                path,
                f"cannot write the report: {exc.strerror or exc}",
                hint="check that the reports directory (--out) is writable and has space",
            ) from exc
    return {key: path for key, (path, _) in files.items()}
