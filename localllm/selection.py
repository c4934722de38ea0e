"""Evidence for a gate's ``selection:``: fingerprints, reading an eval report, staleness, the choice.

An eval report (``localllm eval``, :mod:`localllm.eval`) records, besides its numbers, what
it measured: the gate (verb, prompt, args, schema as written), the schema it validated
against, and per agent its declaration, model and llama-server build. This module computes
those fingerprints, so the writer (eval) and the readers (``check`` and the runtime) agree
on one definition::

    fingerprint(config, gate) → {"gate_sha256", "schema_sha256", "agents": {alias: {...}}}
    read_evidence(path)       → the report, checked to be one (EvidenceError otherwise)
    staleness(config, gate, report) → what changed since, per gate and per agent
    choose(config, gate, path)      → Choice(alias, selected_by) for ``policy: cheapest-passing``
    cascade(config, gate)           → Cascade(tiers, record) for ``min_precision:``

Staleness is not an error: a stale report still loads, ``check`` says what changed, and at
run time stale evidence does not pass (the gate falls back). Secrets in declarations
(``env``/``headers`` values) enter no fingerprint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import settings
from localllm._fs import TEXT_LIMIT, read_capped
from localllm.config import AgentDecl, Config, Gate, LocalLLMDecl
from localllm.errors import FetchError, LocalLLMError, SchemaError
from localllm.wire import finite_float

if TYPE_CHECKING:
    from localllm.calibrate import Threshold

__all__ = [
    "DEFAULT_MIN_ACCURACY",
    "REPORT_KIND",
    "REPORT_VERSION",
    "Cascade",
    "Choice",
    "EvidenceError",
    "Tier",
    "agent_fingerprint",
    "canonical_sha256",
    "cascade",
    "choose",
    "fingerprint",
    "gate_problems",
    "read_evidence",
    "staleness",
]

REPORT_KIND = "localllm_eval_report"
#: the examples tier's name in reports and traces (``localllm.embed.examples.TIER``)
TIER = "examples"
REPORT_VERSION = 1
#: how localllm measures what evidence calibrates: an answer's confidence and an input's
#: similarity to the examples. Bumped when either changes, so thresholds measured the old
#: way go stale (2: choices behind anyOf/oneOf/allOf measured, leave-one-out over
#: normalised texts, tokens that do not spell the forced alternative unmatched)
MEASURES = 2
#: ``policy: cheapest-passing`` without ``min_accuracy:`` asks for this
DEFAULT_MIN_ACCURACY = 0.9
#: declaration fields whose values are secrets: only their names are fingerprinted
_SECRET_FIELDS = ("env", "headers")


class EvidenceError(LocalLLMError, ValueError):
    """An ``evidence:`` file that is not a usable eval report (``path``, ``reason``)."""

    def __init__(self, path: Path, reason: str, *, hint: str = "") -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"{path}: {reason}",
            hint=hint or "write it with `localllm eval GATE -c CONFIG` (evals/reports/<gate>/latest.json)",
        )


def eval_command(gate: str, config_file: Path | str, evidence: Path) -> str:
    """The ``localllm eval`` line that writes ``evidence``: its reports go under the *current*
    directory unless ``--out`` says where, so ``--out`` is added when they would land elsewhere."""
    command = f"localllm eval {gate} -c {config_file}"
    if evidence.name != "latest.json" or evidence.parent.name != gate:
        return command  # a hand-named report: eval writes <out>/<gate>/latest.json only
    out = evidence.parent.parent
    here = Path.cwd() / "evals" / "reports"
    return command if out.resolve() == here.resolve() else f"{command} --out {out}"


def canonical_sha256(value: Any) -> str:
    """sha256 of ``value`` as canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_sha256(path: Path) -> str | None:
    """sha256 of a file (memoised per process by path, size and mtime), ``None`` if unreadable."""
    from localllm.managed.discovery import file_sha256

    try:
        return file_sha256(path)
    except OSError:
        return None


def _decl_data(decl: AgentDecl) -> dict[str, Any]:
    """The declaration's fields that differ from their defaults (a key added to a plugin type
    later, at its default, leaves every recorded fingerprint valid)."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(decl):
        value = getattr(decl, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            continue
        if f.name in _SECRET_FIELDS and isinstance(value, Mapping):
            value = sorted(str(k) for k in value)
        data[f.name] = value
    return data


def _weights_sha256(model: str, base_dir: Path) -> str | None:
    """The pin's sha256 for a model id, the file's for a ``*.gguf`` (``None``: unknown)."""
    from localllm.managed.upstream import model_sha256

    with contextlib.suppress(LocalLLMError, OSError):
        return model_sha256(model, base_dir)
    return None


def _model(decl: AgentDecl, base_dir: Path) -> dict[str, Any]:
    """``{"model", "model_sha256"}``: the pin's sha256 for a model id, the file's for a ``*.gguf``."""
    model = getattr(decl, "model", None)
    found: dict[str, Any] = {"model": model, "model_sha256": None}
    if not isinstance(decl, LocalLLMDecl) or not model or decl.endpoint is not None:
        return found
    found["model_sha256"] = _weights_sha256(model, base_dir)
    return found


def _server_build(decl: AgentDecl, base_dir: Path) -> dict[str, Any] | None:
    """The llama-server a local agent runs: the pinned release, and the binary's sha256 when
    one is named (``server_bin:`` or ``LOCALLLM_SERVER_BIN``); an endpoint's URL."""
    if not isinstance(decl, LocalLLMDecl):
        return None
    if decl.endpoint is not None:
        return {"endpoint": decl.endpoint}
    from localllm.managed.pins import load_pins

    build: dict[str, Any] = {}
    try:
        build["release"] = load_pins().release
    except FetchError:
        build["release"] = None
    named = decl.server_bin or settings.server_bin()
    if named:
        path = Path(named).expanduser()
        path = path if path.is_absolute() else base_dir / path
        build["binary_sha256"] = _file_sha256(path)
    return build


def agent_fingerprint(config: Config, alias: str) -> dict[str, Any]:
    """What an agent's evidence depends on: its declaration, model and server build."""
    decl = config.agents.get(alias)
    if decl is None:
        return {"declared": False}
    return {
        "declared": True,
        "plugin": decl.plugin,
        "decl_sha256": canonical_sha256(_decl_data(decl)),
        **_model(decl, config.base_dir),
        "server_build": _server_build(decl, config.base_dir),
    }


def _schema_sha256(gate: Gate) -> str | None:
    if gate.schema_path is None:
        return None
    from localllm.schema import read_schema_file

    try:
        return canonical_sha256(read_schema_file(gate.schema_path))
    except SchemaError:
        return None


def _examples_sha256(config: Config, gate: Gate) -> str | None:
    """What the examples tier's answers depend on: the examples file, its settings and embedder."""
    examples = gate.examples
    if examples is None:
        return None
    embedder = config.embedders.get(examples.embedder or "")
    data: dict[str, Any] = {
        "cases_sha256": _file_sha256(examples.cases) if examples.cases is not None else None,
        "input": examples.input,
        "k": examples.k,
        "shots": examples.shots,
        "fields": list(examples.fields),
        "answer": examples.answer,
        "embedder": _decl_data_any(embedder) if embedder is not None else None,
    }
    if embedder is not None and embedder.model and embedder.endpoint is None:
        # the vectors are the weights': a GGUF replaced at the same path, or a pin moved to
        # other weights under the same id, changes every similarity, vote and the bar
        data["embedder_model_sha256"] = _weights_sha256(embedder.model, config.base_dir)
    return canonical_sha256(data)


def _decl_data_any(decl: Any) -> dict[str, Any]:
    return {
        f.name: getattr(decl, f.name)
        for f in dataclasses.fields(decl)
        if f.name not in _SECRET_FIELDS and f.name != "api_key_env"
    }


def _gate_sha256(gate: Gate) -> str:
    return canonical_sha256(
        {"verb": gate.verb, "prompt": gate.prompt, "args": gate.args, "schema": gate.schema, "timeout": gate.timeout}
    )


def fingerprint(config: Config, gate: Gate, aliases: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The fingerprint an eval report of ``gate`` over ``aliases`` records."""
    found: dict[str, Any] = {
        "measures": MEASURES,
        "gate_sha256": _gate_sha256(gate),
        "schema_sha256": _schema_sha256(gate),
        "agents": {alias: agent_fingerprint(config, alias) for alias in aliases if alias != TIER},
    }
    examples = _examples_sha256(config, gate)
    if examples is not None:  # absent without examples: older reports stay valid
        found["examples_sha256"] = examples
    return found


def read_evidence(path: Path) -> dict[str, Any]:
    """The eval report at ``path``; EvidenceError when it is missing, not JSON or not a report."""
    try:
        text = read_capped(path, TEXT_LIMIT).decode("utf-8")
    except FileNotFoundError as exc:
        raise EvidenceError(path, "not found") from exc
    except (OSError, UnicodeError) as exc:
        raise EvidenceError(path, f"cannot read: {exc}") from exc
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(path, f"is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != REPORT_KIND:
        raise EvidenceError(path, f"is not an eval report (kind is not {REPORT_KIND!r})")
    if doc.get("version") != REPORT_VERSION:
        raise EvidenceError(
            path,
            f"report version {doc.get('version')!r} is not {REPORT_VERSION}",
            hint="re-run `localllm eval` with this localllm",
        )
    agents = doc.get("agents")
    if (
        not isinstance(doc.get("gate"), str)
        or not isinstance(doc.get("fingerprint"), dict)
        or not isinstance(agents, dict)
        or not all(isinstance(a, dict) for a in agents.values())
    ):
        raise EvidenceError(path, "is missing gate, fingerprint or agents")
    recorded = doc["fingerprint"].get("agents", {})
    if not isinstance(recorded, dict) or not all(isinstance(a, dict) for a in recorded.values()):
        raise EvidenceError(path, "fingerprint.agents is not a mapping of agent fingerprints")
    return doc


def gate_problems(gate: Gate, path: Path) -> list[str]:
    """Why ``path`` cannot be ``gate``'s evidence at all (load-time problems; staleness is not
    one, nor is a file `localllm eval` has not written yet)."""
    if not path.exists():
        return []
    try:
        doc = read_evidence(path)
    except EvidenceError as exc:
        return [exc.reason]
    if doc["gate"] != gate.name:
        return [f"is the eval report of gate {doc['gate']!r}, not {gate.name!r}"]
    return []


def staleness(config: Config, gate: Gate, report: Mapping[str, Any]) -> dict[str, list[str]]:
    """What changed since ``report`` was measured: ``""`` → gate-wide reasons, alias → that agent's."""
    recorded = report.get("fingerprint") or {}
    aliases = [a for a in (recorded.get("agents") or {}) if isinstance(a, str)]
    now = fingerprint(config, gate, aliases)
    reasons: dict[str, list[str]] = {"": []}
    if recorded.get("measures") != now["measures"]:
        reasons[""].append(
            f"localllm measures confidence and similarity differently since (measures "
            f"{recorded.get('measures')} → {now['measures']})"
        )
    if recorded.get("schema_sha256") != now["schema_sha256"]:
        reasons[""].append("the schema changed")
    if recorded.get("gate_sha256") != now["gate_sha256"]:
        reasons[""].append("the gate (verb, prompt or args) changed")
    if recorded.get("examples_sha256") != now.get("examples_sha256"):
        reasons[""].append("the examples (file, settings or embedder) changed")
    for alias in aliases:
        then, current = recorded["agents"][alias], now["agents"][alias]
        then = then if isinstance(then, dict) else {}
        mine: list[str] = []
        if not current["declared"]:
            mine.append("no longer declared")
        else:
            if then.get("decl_sha256") != current["decl_sha256"]:
                mine.append("its declaration changed")
            if (then.get("model"), then.get("model_sha256")) != (current["model"], current["model_sha256"]):
                mine.append("the model changed")
            if then.get("server_build") != current["server_build"]:
                mine.append("the llama-server build changed")
        reasons[alias] = mine
    return reasons


@dataclass(frozen=True)
class Choice:
    """The agent a gate's selection picked, and why (recorded as ``meta.selected_by``)."""

    alias: str
    selected_by: dict[str, Any] = field(default_factory=dict)


def choose(config: Config, gate: Gate) -> Choice | None:
    """``policy: cheapest-passing``: the cheapest agent whose evidence passes (local before
    claude, then by mean cost, then p50 latency), else ``fallback_profile`` (else the gate's
    own agent). ``None`` when the gate has no selection policy."""
    selection = gate.selection
    if selection is None or selection.policy != "cheapest-passing":
        return None
    min_accuracy = selection.min_accuracy if selection.min_accuracy is not None else DEFAULT_MIN_ACCURACY
    max_fallback = selection.max_fallback_rate
    record: dict[str, Any] = {
        "policy": selection.policy,
        "evidence": str(selection.evidence) if selection.evidence else None,
        "min_accuracy": min_accuracy,
        "max_fallback_rate": max_fallback,
    }
    fallback = selection.fallback_profile if selection.fallback_profile in config.agents else gate.agent

    def fall_back(reason: str) -> Choice:
        return Choice(fallback, {**record, "agent": fallback, "passed": False, "reason": reason})

    if selection.evidence is None:
        return fall_back("no evidence: file")
    try:
        report = read_evidence(selection.evidence)
    except EvidenceError as exc:
        return fall_back(f"evidence unusable: {exc.reason}")
    if report["gate"] != gate.name:
        return fall_back(f"evidence is for gate {report['gate']!r}")
    stale = staleness(config, gate, report)
    if stale[""]:
        return fall_back("evidence is stale: " + "; ".join(stale[""]))
    ranked: list[tuple[tuple[int, float, float, str], str, dict[str, Any]]] = []
    refused: dict[str, str] = {}
    for alias, row in report["agents"].items():
        accuracy, fallback_rate = finite_float(row.get("accuracy")), finite_float(row.get("fallback_rate"))
        if stale.get(alias):
            refused[alias] = "stale: " + "; ".join(stale[alias])
        elif accuracy is None or accuracy < min_accuracy:
            refused[alias] = f"accuracy {accuracy} < {min_accuracy}"
        elif max_fallback is not None and (fallback_rate is None or fallback_rate > max_fallback):
            refused[alias] = f"fallback rate {fallback_rate} > {max_fallback}"
        else:
            cost = finite_float(_map(row.get("cost_usd")).get("mean")) or 0.0
            p50 = finite_float(_map(row.get("latency_ms")).get("p50")) or 0.0
            ranked.append(((0 if row.get("local") else 1, cost, p50, alias), alias, row))
    if not ranked:
        return Choice(
            fallback,
            {**record, "agent": fallback, "passed": False, "refused": refused, "reason": "no agent's evidence passes"},
        )
    _, alias, row = min(ranked)
    return Choice(
        alias,
        {
            **record,
            "agent": alias,
            "passed": True,
            "accuracy": row.get("accuracy"),
            "fallback_rate": row.get("fallback_rate"),
            "refused": refused,
            "reason": "cheapest agent whose evidence passes",
        },
    )


@dataclass(frozen=True)
class Tier:
    """One rung of a ``min_precision`` cascade: who answers, and the threshold its confidence
    must clear (``None``: always accepted — the last rung)."""

    alias: str
    threshold: Threshold | None


@dataclass(frozen=True)
class Cascade:
    """The rungs a call climbs (cheapest first) and why (recorded as ``meta.selected_by``)."""

    tiers: tuple[Tier, ...]
    record: dict[str, Any] = field(default_factory=dict)


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a hand-edited report's odd field)."""
    return value if isinstance(value, Mapping) else {}


def _calibration(report: Mapping[str, Any], alias: str) -> tuple[list[float], list[bool]] | None:
    """The calibration split of a tier's (confidence, correct) pairs from the report."""
    tiers = _map(_map(report.get("calibration")).get("tiers"))
    data = _map(_map(tiers.get(alias)).get("calibration"))
    scores, correct = data.get("scores"), data.get("correct")
    if not isinstance(scores, list) or not isinstance(correct, list) or len(scores) != len(correct):
        return None
    if not all(finite_float(v) is not None and 0.0 <= float(v) <= 1.0 for v in scores):
        return None
    if not all(isinstance(c, bool) for c in correct):
        return None
    return [float(v) for v in scores], list(correct)


def cascade(config: Config, gate: Gate) -> Cascade | None:
    """``selection: {min_precision: P}``: examples → the gate's local model → its fallback.

    A local rung's threshold is the lowest confidence whose accepted answers, on the
    evidence's calibration split, have a precision whose one-sided 95% Clopper–Pearson lower
    bound reaches ``P`` (:func:`localllm.calibrate.choose_threshold`). A rung is left out
    when it has no usable evidence (no report, stale, no scored answers): not calibrated
    means escalate. The last rung (the fallback, default agent.claude) always answers.
    ``None`` when the gate has no ``min_precision``.
    """
    from localllm.calibrate import choose_threshold

    selection = gate.selection
    if selection is None or selection.min_precision is None:
        return None
    target = selection.min_precision
    strong = config.fallback_for(gate.agent, gate.name)
    local_agent = gate.agent if strong is not None else None
    if strong is None:  # the gate's agent is not a local model (or has fallback: none): it is the last rung
        strong = gate.agent
    candidates: list[str] = []
    if gate.examples is not None and gate.examples.answer:
        candidates.append(TIER)
    if local_agent is not None:
        candidates.append(local_agent)
    record: dict[str, Any] = {
        "policy": "min_precision",
        "min_precision": target,
        "evidence": str(selection.evidence) if selection.evidence else None,
        "strong": strong,
    }
    disabled: dict[str, str] = {}
    thresholds: dict[str, Any] = {}
    report: dict[str, Any] | None = None
    reason = ""
    if selection.evidence is None:
        reason = "no evidence: file (not calibrated: every call escalates)"
    else:
        try:
            report = read_evidence(selection.evidence)
        except EvidenceError as exc:
            reason = f"evidence unusable: {exc.reason}"
        else:
            if report["gate"] != gate.name:
                reason = f"evidence is for gate {report['gate']!r}"
            else:
                stale = staleness(config, gate, report)
                if stale[""]:
                    reason = "evidence is stale: " + "; ".join(stale[""])
                else:
                    disabled.update({a: "stale: " + "; ".join(r) for a, r in stale.items() if a and r})
    tiers: list[Tier] = []
    for alias in candidates:
        if reason:
            disabled[alias] = reason
            continue
        if alias in disabled:
            continue
        assert report is not None
        pairs = _calibration(report, alias)
        if pairs is None or not pairs[0]:
            disabled[alias] = "no calibrated confidence in the evidence"
            continue
        chosen = choose_threshold(pairs[0], pairs[1], target)
        thresholds[alias] = chosen.to_dict()
        if chosen.accepts_nothing:
            disabled[alias] = f"no threshold reaches precision {target} with 95% confidence on {chosen.n} answers"
            continue
        tiers.append(Tier(alias, chosen))
    tiers.append(Tier(strong, None))
    record.update(tiers=[t.alias for t in tiers], thresholds=thresholds, disabled=disabled)
    return Cascade(tuple(tiers), record)
