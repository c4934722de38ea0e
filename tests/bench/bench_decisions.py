"""Benchmark: how many decisions stay local, at what precision — the examples tier and the cascade.

    python tests/bench/bench_decisions.py                 # the demo gate (4-fold CV; 100-ticket pool) and CLINC150
    python tests/bench/bench_decisions.py --llm --sets clinc   # one of demo-cv, demo-pool, clinc
    python tests/bench/bench_decisions.py --cases CASES.jsonl --examples EXAMPLES.jsonl \\
        --input-arg text --field intent --target-precision 0.95 --json
    python tests/bench/bench_decisions.py --cases CASES.jsonl --input-arg ticket --field queue --cv 4
    python tests/bench/bench_decisions.py --smoke         # seconds: a word-hash embedder, no LLM
    python tests/bench/bench_decisions.py --llm           # + gemma-3-270m fixed and dynamic few-shot

Both files are in the eval cases format (``args.<input>`` the text, ``expect.<field>`` the
label). Thresholds are calibrated on the examples only (leave-one-out k-NN over the pool:
each example answered by the others), then applied to the cases:

- tier ``examples``: cosine k-NN (k=5) over the embedder's vectors of the pool, confidence
  = vote margin × nearest same-label similarity (``localllm.embed.examples.vote``);
- tiers ``llm_fixed`` / ``llm_dynamic``: gemma-3-270m through the Runtime (grammar-constrained
  decide, schema ``{<field>: enum of the labels}``), the prompt listing one example per label
  (fixed) or the 4 nearest examples (dynamic few-shot, ``{{ examples }}``); only with the real
  llama-server (``--llm``), and their confidence is ``meta.confidence`` when the agent reports
  one (none: never accepted, every such call escalates);
- the strong tier answers from the labels (a label oracle: accuracy 1.0, the all-strong bar).

The out-of-scope rule (as the runtime applies it): each input's novelty score (nearest
in-scope example's similarity − nearest out-of-scope example's, ``ExampleSet.novelty``)
against the bar the pool calibrates (``ExampleSet.novelty_bar``: the highest score of the
out-of-scope examples, leave-one-out; without ``--out-of-scope`` examples, each example
against the other labels' examples). An input at or below the bar skips the local tiers;
the thresholds are chosen on the in-scope examples only. Each set is also summarised
without the rule, from the same answers (``targets_without_rule``).

For each target precision (0.9, 0.95, and ``--target-precision``): the threshold chosen on
the examples (one-sided 95% Clopper–Pearson, ``localllm.calibrate.choose_threshold``), the
measured local share and local precision on the cases, the cascade's accuracy, the
threshold's precision on the examples vs on the cases (does it hold?) and, with
out-of-scope cases, how many escalate and how many bind a wrong label.

Real runs use all-MiniLM-L6-v2 (``/work/shared/models/all-minilm-l6-v2-f16.gguf``) through a
managed llama-server embedding sidecar; ``--smoke`` uses a deterministic word-hash
embedder on a few cases so that it runs anywhere in seconds (its numbers mean nothing).
Writes ``tests/bench/results/decisions[.SETS][.llm].json`` (``--quick``: ``….quick.json``;
``--smoke``: a temporary file, see ``_provenance.results_path``).
Hold ``flock /tmp/bench.lock`` while measuring.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.calibrate import (  # noqa: E402
    NoveltyBar,
    choose_threshold,
    coverage_precision,
    expected_calibration_error,
    risk_coverage,
    split,
)
from localllm.embed.embedder import EmbedderIdentity  # noqa: E402
from localllm.embed.examples import Example, ExampleSet, render_shots, vote  # noqa: E402
from localllm.eval.decision import Outcome, ascii_curve, simulate_cascade  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DATA = REPO / "tests" / "bench" / "data"
MINILM = Path("/work/shared/models/all-minilm-l6-v2-f16.gguf")
DEMO_CASES = REPO / "examples" / "demo" / "evals" / "triage" / "cases.jsonl"
DEMO_POOL = DATA / "demo_queue_examples.jsonl"  # 100 labelled tickets written for the demo's queues
K = 5
SHOTS = 4
TARGETS = (0.9, 0.95)
SETS = ("demo-cv", "demo-pool", "clinc")  # the default runs, in order


class WordHashEmbedder:
    """Smoke only: each word hashed to one of 256 dims (a bag of words), L2-normalised."""

    dims = 256

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity("bench-word-hash", self.dims, "bag", "", "")

    def embed(self, texts: Sequence[str], role: str) -> Any:
        import numpy as np

        rows = np.zeros((len(texts), self.dims), dtype=np.float32)
        for i, text in enumerate(texts):
            for raw in text.lower().split():
                word = raw.strip(".,!?'\"")
                rows[i, int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dims] += 1.0
            rows[i, 0] += 0.01
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def load(path: Path, input_arg: str, field: str) -> list[Example]:
    from localllm.eval.cases import load_cases

    found = []
    for case in load_cases(path):
        labels = case.expect.labels()
        if isinstance(case.args.get(input_arg), str) and field in labels:
            found.append(Example(case.id, case.args[input_arg], {field: labels[field]}))
    return found


def knn_tier(pool: ExampleSet, cases: Sequence[Example], field: str, *, leave_one_out: bool) -> dict[str, Outcome]:
    pool.leave_one_out = leave_one_out
    out: dict[str, Outcome] = {}
    for case in cases:
        started = time.perf_counter()
        got = vote(pool.neighbours(case.text, K), [field])
        ms = (time.perf_counter() - started) * 1000
        out[case.id] = Outcome(got.answer.get(field) == case.labels[field], got.confidence, ms)
    pool.leave_one_out = False
    return out


def llm_tier(
    runtime: Any, pool: ExampleSet, cases: Sequence[Example], field: str, labels: list[str], *, dynamic: bool
) -> dict[str, Outcome]:
    """gemma-3-270m through the Runtime, fixed or dynamic few-shot; confidence from its meta."""
    from localllm.errors import AgentError
    from localllm.eval.decision import confidence_of

    fixed = []
    for label in labels:
        first = next(e for e in pool.examples if e.labels[field] == label)
        fixed.append(first)
    schema = {"type": "object", "properties": {field: {"enum": labels}}, "required": [field]}
    head = f"Classify the text as one of: {', '.join(labels)}.\n\n"
    out: dict[str, Outcome] = {}
    for case in cases:
        if dynamic:
            pool.leave_one_out = True
            shots = render_shots(pool.neighbours(case.text, SHOTS), "text", [field])
            pool.leave_one_out = False
        else:
            from localllm.embed.examples import Neighbour

            shots = render_shots([Neighbour(e, 1.0) for e in reversed(fixed)], "text", [field])
        prompt = head + shots + "\n\nText: {{ args.text }}\n"
        started = time.perf_counter()
        try:
            result = runtime.call("decide", agent="agent.local", prompt=prompt, schema=schema, args={"text": case.text})
            answer, confidence = (result.submission or {}).get(field), confidence_of(result.meta)
        except AgentError:
            answer, confidence = None, None
        ms = (time.perf_counter() - started) * 1000
        out[case.id] = Outcome(answer == case.labels[field], confidence, ms)
    return out


def _pairs(outcomes: dict[str, Outcome]) -> tuple[list[float], list[bool]]:
    scored = [o for o in outcomes.values() if o.confidence is not None]
    return [float(o.confidence or 0.0) for o in scored], [o.correct for o in scored]


class Scope:
    """The out-of-scope rule on one fold: the bar from the pool, each input's novelty score."""

    def __init__(self, bar: NoveltyBar, cases: dict[str, float], pool: dict[str, float]) -> None:
        self.bar, self.cases, self.pool = bar, cases, pool

    def gate(self, outcomes: dict[str, dict[str, Outcome]], *, on_pool: bool) -> dict[str, dict[str, Outcome]]:
        """The local tiers' outcomes of in-scope inputs only (an out-of-scope one skips them)."""
        scores = self.pool if on_pool else self.cases
        return {
            tier: (
                rows
                if tier == "strong"
                else {i: o for i, o in rows.items() if self.bar.admits(scores.get(i, float("-inf")))}
            )
            for tier, rows in outcomes.items()
        }


def scope_of(
    pool: ExampleSet, pool_examples: Sequence[Example], cases: Sequence[Example], field: str, out_of_scope: str | None
) -> Scope:
    oos = out_of_scope if any(e.labels[field] == out_of_scope for e in pool_examples) else None
    bar = pool.novelty_bar([field], oos)
    on_cases = {c.id: pool.novelty(c.text, [field], oos) for c in cases}
    pool.leave_one_out = True
    on_pool = {e.id: pool.novelty(e.text, [field], oos) for e in pool_examples}
    pool.leave_one_out = False
    return Scope(bar, on_cases, on_pool)


def evaluate_fold(  # noqa: PLR0917 - a bench helper, called in two places
    pool_examples: Sequence[Example],
    cases: Sequence[Example],
    field: str,
    embedder: Any,
    targets: Sequence[float],
    runtime: Any | None,
    store_root: Path,
    out_of_scope: str | None = None,
) -> tuple[dict[str, dict[str, Outcome]], dict[str, dict[str, Outcome]], Scope]:
    """(tier → case → outcome on the cases, tier → example → outcome on the pool, leave-one-out,
    the out-of-scope rule)."""
    pool = ExampleSet(pool_examples, embedder, store_root=store_root)
    pool.matrix()  # embed the pool before any clock runs
    scope = scope_of(pool, pool_examples, cases, field, out_of_scope)
    on_cases = {"examples": knn_tier(pool, cases, field, leave_one_out=False)}
    on_pool = {"examples": knn_tier(pool, pool_examples, field, leave_one_out=True)}
    if runtime is not None:
        labels = sorted({e.labels[field] for e in pool_examples})
        on_cases["llm_fixed"] = llm_tier(runtime, pool, cases, field, labels, dynamic=False)
        on_cases["llm_dynamic"] = llm_tier(runtime, pool, cases, field, labels, dynamic=True)
        if any(o.confidence is not None for o in on_cases["llm_dynamic"].values()):
            on_pool["llm_dynamic"] = llm_tier(runtime, pool, pool_examples, field, labels, dynamic=True)
    on_cases["strong"] = {c.id: Outcome(True, None, 0.0) for c in cases}  # the label oracle
    return on_cases, on_pool, scope


def summarise(  # noqa: PLR0917 - a bench helper
    on_cases: dict[str, dict[str, Outcome]],
    on_pool: dict[str, dict[str, Outcome]],
    cases: Sequence[Example],
    field: str,
    targets: Sequence[float],
    scope: Scope | None = None,
    out_of_scope: str | None = None,
) -> dict[str, Any]:
    """Per tier its accuracy and curve (every case); per target the thresholds (chosen on the
    pool) and the cascade. With ``scope`` the local tiers see in-scope inputs only: their
    thresholds are chosen on the in-scope examples and an out-of-scope case goes straight
    to the strong tier."""
    ids = [c.id for c in cases]
    tiers: dict[str, Any] = {}
    for name, outcomes in on_cases.items():
        ms = [o.ms for o in outcomes.values()]
        scores, correct = _pairs(outcomes)
        tiers[name] = {
            "accuracy": round(sum(o.correct for o in outcomes.values()) / len(outcomes), 4),
            "p50_ms": round(statistics.median(ms), 3) if ms else None,
            "scored": len(scores),
            "ece": round(expected_calibration_error(scores, correct), 4) if scores else None,
            "curve": [
                [round(p.threshold, 4), round(p.coverage, 4), round(p.precision, 4)]
                for p in risk_coverage(scores, correct)
            ],
        }
    local_order = [t for t in ("examples", "llm_dynamic") if t in on_cases]
    if scope is not None:
        on_cases, on_pool = scope.gate(on_cases, on_pool=False), scope.gate(on_pool, on_pool=True)
    by_target: dict[str, Any] = {}
    for target in targets:
        thresholds: dict[str, float] = {}
        detail: dict[str, Any] = {}
        for tier in local_order:
            scores, correct = _pairs(on_pool.get(tier, {}))
            chosen = choose_threshold(scores, correct, target)
            thresholds[tier] = chosen.value
            case_scores, case_correct = _pairs(on_cases[tier])
            _, precision, accepted = coverage_precision(case_scores, case_correct, chosen.value)
            detail[tier] = {
                "threshold": chosen.to_dict(),
                "precision_gap": round(precision - chosen.precision, 4)
                if accepted and not chosen.accepts_nothing
                else None,
                "on_cases": {
                    "coverage": round(accepted / len(ids), 4),
                    "precision": round(precision, 4) if accepted else None,
                },
            }
        sim = simulate_cascade([*local_order, "strong"], thresholds, on_cases, ids)
        oos = [c.id for c in cases if c.labels[field] == out_of_scope]
        if oos:
            oos_sim = simulate_cascade([*local_order, "strong"], thresholds, on_cases, oos)
            share, precision = oos_sim["local_share"] or 0.0, oos_sim["local_precision"] or 0.0
            sim["oos_escalated"] = round(1 - share, 4)
            # escalated, or answered locally with the out-of-scope label: not a wrong label bound
            sim["oos_not_wrong"] = round(1 - share * (1 - precision), 4)
            sim["oos_cases"] = len(oos)
        if scope is not None:
            inside = [c.id for c in cases if c.labels[field] != out_of_scope]
            stopped = sum(not scope.bar.admits(scope.cases[i]) for i in inside)
            sim["novelty_bar"] = scope.bar.to_dict()
            sim["in_scope_stopped_by_bar"] = round(stopped / len(inside), 4) if inside else None
        sim["tiers"] = detail
        by_target[f"{target:g}"] = sim
    return {"cases": len(ids), "tiers": tiers, "targets": by_target}


def make_runtime(workdir: Path) -> Any:
    """A Runtime with agent.local = gemma-3-270m (managed, grammar), or raise when it cannot start."""
    from localllm import Runtime, load_config
    from localllm.managed import ensure_model, ensure_server

    ensure_server()
    ensure_model("gemma-3-270m")
    (workdir / "bench.yaml").write_text(
        "app_id: bench-decisions\nagent_plugins:\n  agent.local:\n    plugin: builtin.local_llm\n"
        "    model: gemma-3-270m\n    grammar: true\n    max_tokens: 24\n    ctx_size: 1024\n    fallback: none\n"
    )
    return Runtime(load_config(workdir / "bench.yaml"))


def make_embedder(smoke: bool) -> tuple[Any, str]:
    if smoke:
        return WordHashEmbedder(), "word-hash (smoke)"
    from localllm.config import EmbedderDecl
    from localllm.embed.local import embedder_from_decl

    return embedder_from_decl(EmbedderDecl(name="minilm", model=str(MINILM))), "all-MiniLM-L6-v2 (f16 GGUF)"


def run_dataset(  # noqa: PLR0917 - a bench helper
    name: str,
    cases_path: Path,
    examples_path: Path | None,
    input_arg: str,
    field: str,
    targets: Sequence[float],
    embedder: Any,
    runtime: Any | None,
    *,
    cv: int,
    limit: int | None,
    store_root: Path,
    out_of_scope: str | None = None,
    novelty: bool = True,
) -> dict[str, Any]:
    """The data set's figures; ``targets`` with the out-of-scope rule (``novelty``) and,
    for comparison, ``targets_without_rule`` (both from the same answers)."""
    cases = load(cases_path, input_arg, field)
    if examples_path is not None:
        pool = load(examples_path, input_arg, field)
        if limit:
            cases = split(cases, 1 - min(1.0, limit / len(cases)), 7, key=lambda e: e.labels[field])[0][:limit]
        on_cases, on_pool, scope = evaluate_fold(
            pool, cases, field, embedder, targets, runtime, store_root, out_of_scope
        )
        result = summarise(on_cases, on_pool, cases, field, targets, scope if novelty else None, out_of_scope)
        plain = summarise(on_cases, on_pool, cases, field, targets, None, out_of_scope)
        result.update(
            name=name,
            examples=len(pool),
            mode="held-out cases, thresholds from the examples",
            out_of_scope_rule=novelty,
            targets_without_rule=plain["targets"],
        )
        return result
    # cross-validation: each fold's cases answered from the other folds' examples
    order = sorted(cases, key=lambda e: hashlib.sha256(e.id.encode()).hexdigest())
    folds = [order[i::cv] for i in range(cv)]
    merged_cases: dict[str, dict[str, Outcome]] = {}
    fold_results = []
    for i, fold in enumerate(folds):
        pool = [e for j, f in enumerate(folds) if j != i for e in f]
        on_cases, on_pool, scope = evaluate_fold(
            pool, fold, field, embedder, targets, runtime, store_root, out_of_scope
        )
        fold_results.append(
            summarise(on_cases, on_pool, fold, field, targets, scope if novelty else None, out_of_scope)
        )
        for tier, outcomes in on_cases.items():
            merged_cases.setdefault(tier, {}).update(outcomes)
    result = summarise(merged_cases, {}, cases, field, targets)  # tier accuracy over every fold
    for key in result["targets"]:  # the cascade: thresholds per fold, counts pooled
        folds_at = [r["targets"][key] for r in fold_results]
        local = sum((f["local_share"] or 0) * r["cases"] for f, r in zip(folds_at, fold_results, strict=True))
        right_local = sum(
            (f["local_precision"] or 0) * (f["local_share"] or 0) * r["cases"]
            for f, r in zip(folds_at, fold_results, strict=True)
        )
        right = sum((f["cascade_accuracy"] or 0) * r["cases"] for f, r in zip(folds_at, fold_results, strict=True))
        result["targets"][key] = {
            "local_share": round(local / len(cases), 4),
            "local_precision": round(right_local / local, 4) if local else None,
            "cascade_accuracy": round(right / len(cases), 4),
            "thresholds_per_fold": [f["thresholds"] for f in folds_at],
            "novelty_bar_per_fold": [f.get("novelty_bar") for f in folds_at],
            "in_scope_stopped_by_bar": round(
                sum(
                    (f.get("in_scope_stopped_by_bar") or 0) * r["cases"]
                    for f, r in zip(folds_at, fold_results, strict=True)
                )
                / len(cases),
                4,
            ),
        }
    result.update(
        name=name,
        examples=f"{cv}-fold CV over the cases",
        mode=f"{cv}-fold cross-validation",
        out_of_scope_rule=novelty,
    )
    return result


def headline(result: dict[str, Any], target: float) -> dict[str, Any]:
    at = result["targets"][f"{target:g}"]
    return {
        "local_share": at["local_share"],
        "local_precision": at["local_precision"],
        "cascade_accuracy": at["cascade_accuracy"],
        **{k: at[k] for k in ("oos_escalated", "oos_not_wrong", "in_scope_stopped_by_bar") if k in at},
        "tiers": {k: {"accuracy": v["accuracy"], "p50_ms": v["p50_ms"]} for k, v in result["tiers"].items()},
    }


def show(result: dict[str, Any], targets: Sequence[float]) -> None:
    print(f"\n== {result['name']}: {result['cases']} cases, {result['mode']}")
    print(f"{'tier':<12} {'accuracy':>8} {'p50 ms':>8} {'ECE':>6}")
    for name, row in result["tiers"].items():
        ece = "-" if row["ece"] is None else f"{row['ece']:.3f}"
        p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.1f}"
        print(f"{name:<12} {row['accuracy']:>8.3f} {p50:>8} {ece:>6}")
    tables = [("out-of-scope rule on" if result.get("out_of_scope_rule") else "out-of-scope rule off", "targets")]
    if "targets_without_rule" in result and result.get("out_of_scope_rule"):
        tables.append(("out-of-scope rule off (same answers)", "targets_without_rule"))
    for title, which in tables:
        print(title)
        print(
            f"{'target':<8} {'local share':>11} {'local prec':>10} {'cascade acc':>11} {'OOS escalated':>13} "
            f"{'OOS not wrong':>13} {'in-scope stopped':>16} {'threshold':>9} {'prec gap':>8}"
        )
        for target in targets:
            at = result[which][f"{target:g}"]
            prec = "-" if at["local_precision"] is None else f"{at['local_precision']:.3f}"
            oos, ok, stopped = at.get("oos_escalated"), at.get("oos_not_wrong"), at.get("in_scope_stopped_by_bar")
            knn = (at.get("tiers") or {}).get("examples") or {}
            value = (knn.get("threshold") or {}).get("value")
            gap = knn.get("precision_gap")
            print(
                f"{target:<8g} {at['local_share']:>11.3f} {prec:>10} {at['cascade_accuracy']:>11.3f} "
                f"{'-' if oos is None else f'{oos:.3f}':>13} {'-' if ok is None else f'{ok:.3f}':>13} "
                f"{'-' if stopped is None else f'{stopped:.3f}':>16} "
                f"{'-' if value is None else f'{value:.3f}':>9} {'-' if gap is None else f'{gap:+.3f}':>8}"
            )
        bar = (result[which][f"{targets[0]:g}"].get("novelty_bar") or {}).get("value")
        if bar is not None:
            print(f"novelty bar (from the examples): {bar:.3f}")
    curve = result["tiers"]["examples"]["curve"]
    if curve:
        print("examples tier: precision vs coverage on the cases")
        for line in ascii_curve(curve, width=40, height=8):
            print("  " + line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=Path)
    parser.add_argument("--examples", type=Path)
    parser.add_argument("--input-arg", default="text")
    parser.add_argument("--field", default="intent")
    parser.add_argument("--target-precision", type=float, default=0.95)
    parser.add_argument("--cv", type=int, default=4, help="folds when --examples is not given")
    parser.add_argument("--llm", action="store_true", help="also run gemma-3-270m (fixed and dynamic few-shot)")
    parser.add_argument("--limit", type=int, help="at most N cases (stratified)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the headline figures)")
    parser.add_argument("--smoke", action="store_true", help="seconds: word-hash embedder, a few cases, no LLM")
    parser.add_argument("--quick", action="store_true", help="the real embedder on at most 40 cases, no LLM")
    parser.add_argument(
        "--out-of-scope",
        default="oos",
        metavar="LABEL",
        help="the label of out-of-scope examples (default oos; unused when no example has it)",
    )
    parser.add_argument("--sets", help=f"comma-separated subset of the default data sets: {','.join(SETS)}")
    parser.add_argument("--no-out-of-scope-rule", action="store_true", help="headline figures without the novelty bar")
    args = parser.parse_args(argv)
    targets = sorted({*TARGETS, args.target_precision})
    embedder, embedder_name = make_embedder(args.smoke)
    limit = args.limit if args.limit is not None else (30 if args.smoke else 40 if args.quick else None)
    args.llm = args.llm and not args.quick
    runtime = None
    with tempfile.TemporaryDirectory(prefix="bench-decisions-") as tmp:
        if args.llm and not args.smoke:
            runtime = make_runtime(Path(tmp))
        try:
            runs: list[tuple[str, Path, Path | None, str, str]] = (
                [("given", args.cases, args.examples, args.input_arg, args.field)]
                if args.cases
                else [
                    ("demo triage (queue), 4-fold CV", DEMO_CASES, None, "ticket", "queue"),
                    ("demo triage (queue), 100-ticket pool", DEMO_CASES, DEMO_POOL, "ticket", "queue"),
                    (
                        "CLINC150 sample (intent)",
                        DATA / "clinc150_cases.jsonl",
                        DATA / "clinc150_examples.jsonl",
                        "text",
                        "intent",
                    ),
                ]
            )
            if not args.cases and args.sets:
                wanted = set(args.sets.split(","))
                unknown = wanted - set(SETS)
                if unknown:
                    parser.error(f"--sets: unknown {', '.join(sorted(unknown))} (known: {', '.join(SETS)})")
                runs = [r for r, key in zip(runs, SETS, strict=True) if key in wanted]
            results = [
                run_dataset(
                    name,
                    c,
                    e,
                    i,
                    f,
                    targets,
                    embedder,
                    runtime,
                    cv=args.cv,
                    limit=limit,
                    store_root=Path(tmp) / "store",
                    out_of_scope=args.out_of_scope,
                    novelty=not args.no_out_of_scope_rule,
                )
                for name, c, e, i, f in runs
            ]
        finally:
            if runtime is not None:
                runtime.close()
            close: Callable[[], None] | None = getattr(embedder, "close", None)
            if close is not None:
                close()
    if args.json:
        print(
            json.dumps(
                {
                    **headline(results[0], args.target_precision),
                    "target_precision": args.target_precision,
                    "embedder": embedder_name,
                }
            )
        )
    else:
        print(f"embedder: {embedder_name}; LLM tiers: {'gemma-3-270m' if runtime else 'not run'}")
        for result in results:
            show(result, targets)
    if not args.cases:
        suffix = "" if not args.sets or set(args.sets.split(",")) == set(SETS) else "." + args.sets.replace(",", "+")
        out = results_path(
            f"decisions{suffix}{'.llm' if runtime is not None else ''}", smoke=args.smoke, quick=args.quick
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {**provenance(smoke=args.smoke), "embedder": embedder_name, "results": results}
        out.write_text(json.dumps(doc, indent=2) + "\n")
        if not args.json:
            print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
