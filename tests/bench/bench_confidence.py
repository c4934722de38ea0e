"""Benchmark: is per-answer confidence faithful, and what does it cost? (real llama-server + gemma-3-270m)

    python tests/bench/bench_confidence.py [--cases F] [--limit N] [--no-forced] [--json OUT]

On the demo's triage gate (``examples/demo``) and its 32 labelled tickets, every ticket is
answered once with ``logprobs`` (the shipped method) and once without, same body otherwise,
alternating which goes first, against one sidecar:

(a) cost: p50 latency with vs without logprobs (server-side cost of returning them), the
    reply size, and the client-side cost of :func:`localllm.agents.confidence.measure`;
(b) faithfulness of method A (token logprobs, renormalised over each field's alternatives):
    AUROC of confidence vs correctness (queue alone; the whole answer as the eval judges it),
    precision at 25/50/75/100% coverage (risk–coverage), expected calibration error;
(c) method B (``--no-forced`` skips it): each alternative of each choice field scored by a
    request that continues the answer (assistant prefill up to the value, served from the
    prompt cache) under a grammar admitting only that alternative; its token logprobs are
    summed and normalised over the alternatives (the whole value's probability, but one
    request per alternative): the same faithfulness figures, its extra time and tokens per
    answer, and how far it is from method A;
(d) what the numbers are: the share of the top-20 mass at the queue value's first token that
    goes to tokens the grammar forbids (> 0: llama-server's probabilities are pre-grammar), and
    what ``post_sampling_probs: true`` reports at temperature 0.

Writes ``tests/bench/results/confidence.json``. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm import Runtime  # noqa: E402
from localllm.agents import confidence  # noqa: E402
from localllm.agents.confidence import alternatives, measure, parse_logprobs, subschema  # noqa: E402
from localllm.calibrate import expected_calibration_error, risk_coverage  # noqa: E402
from localllm.eval.cases import Case, load_cases  # noqa: E402
from localllm.grammar.compile import gbnf_literal  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_local_llm import ALIAS, DEMO, gate_body, prepare  # noqa: E402

CASES = DEMO / "evals" / "triage" / "cases.jsonl"
RESULTS = Path(__file__).parent / "results" / "confidence.json"
HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def auroc(scores: list[float], correct: list[bool]) -> float | None:
    """P(a right answer scores above a wrong one), ties half: 0.5 is chance, 1.0 perfect ranking."""
    pos = [s for s, c in zip(scores, correct, strict=True) if c]
    neg = [s for s, c in zip(scores, correct, strict=True) if not c]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def faithfulness(scores: list[float], correct: list[bool]) -> dict[str, Any]:
    curve = risk_coverage(scores, correct)
    at: dict[str, float | None] = {}
    for share in (0.25, 0.5, 0.75, 1.0):
        # the highest threshold whose coverage reaches the share
        point = next((p for p in curve if p.coverage >= share - 1e-9), None)
        at[f"{int(share * 100)}%"] = round(point.precision, 3) if point else None
    return {
        "n": len(scores),
        "accuracy": round(sum(correct) / len(correct), 3) if correct else None,
        "auroc": None if (a := auroc(scores, correct)) is None else round(a, 3),
        "precision_at_coverage": at,
        "ece": round(expected_calibration_error(scores, correct), 3),
        "mean_confidence_right": _mean([s for s, c in zip(scores, correct, strict=True) if c]),
        "mean_confidence_wrong": _mean([s for s, c in zip(scores, correct, strict=True) if not c]),
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def body_for(runtime: Runtime, case: Case) -> tuple[dict[str, Any], dict[str, Any]]:
    body, source, schema = gate_body(runtime, case.args)
    assert source == "compiled" and body.get("logprobs"), "the demo gate should ask for logprobs"
    return body, schema


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float, int]:
    started = time.perf_counter()
    reply = client.post(url, json=body, headers=HEADERS, timeout=httpx.Timeout(300.0, connect=5.0))
    elapsed = (time.perf_counter() - started) * 1000
    reply.raise_for_status()
    return reply.json(), elapsed, len(reply.content)


def forced_scores(
    client: httpx.Client, url: str, body: dict[str, Any], schema: dict[str, Any], text: str
) -> tuple[dict[str, float], float, int]:
    """Method B: P(chosen | alternatives) per choice field by forcing each alternative.

    The answer up to the value is an assistant prefill (llama-server continues a final
    assistant message), so it is evaluated as prompt, mostly from the cache; a grammar that
    admits only the alternative generates its few tokens, whose pre-grammar logprobs are summed.
    """
    fields: dict[str, float] = {}
    spent_ms, tokens = 0.0, 0
    for path, cs, ce in confidence.scalars(text):
        alts = alternatives(subschema(schema, path), schema)
        if alts is None:
            continue
        head = text[:cs]
        logps: dict[str, float] = {}
        for alt in alts:
            b = {k: v for k, v in body.items() if k not in ("grammar", "top_logprobs")}
            b["messages"] = [*body["messages"], {"role": "assistant", "content": head}]
            b.update(grammar="root ::= " + gbnf_literal(alt), logprobs=True, top_logprobs=1, max_tokens=16)
            data, ms, _ = post(client, url, b)
            spent_ms += ms
            tokens += int((data.get("usage") or {}).get("completion_tokens") or 0)
            end = len(alt.encode())
            pos, total = 0, 0.0
            for t in parse_logprobs(data) or []:
                start, pos = pos, pos + len(t.data)
                if start < end:  # the alternative's own tokens, not the end-of-turn after them
                    total += t.logprob
            logps[alt] = total
        top = max(logps.values())
        norm = sum(math.exp(v - top) for v in logps.values())
        chosen = text[cs:ce]
        fields[confidence.field_label(path)] = math.exp(logps[chosen] - top) / norm if chosen in logps else float("nan")
    return fields, spent_ms, tokens


def forbidden_mass(data: dict[str, Any], schema: dict[str, Any], text: str) -> float | None:
    """At the queue value's first token: the top-K mass on tokens no alternative allows."""
    toks = parse_logprobs(data)
    if not toks:
        return None
    out = b"".join(t.data for t in toks)
    for path, cs, _ce in confidence.scalars(text):
        if path != ("queue",):
            continue
        alts = [a.encode() for a in alternatives(subschema(schema, path), schema) or ()]
        vs = len(text[:cs].encode())
        pos = 0
        for t in toks:
            start, pos = pos, pos + len(t.data)
            if pos > vs:
                before = out[:start]
                bad = sum(
                    math.exp(lp)
                    for cand, lp in t.top
                    if not any(confidence._consistent(cand, before, out[:vs] + a, False) for a in alts)
                )
                return bad / sum(math.exp(lp) for _, lp in t.top)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--limit", type=int, default=0, help="only the first N cases")
    parser.add_argument("--no-forced", action="store_true", help="skip method B (forced alternatives)")
    parser.add_argument("--json", type=Path, default=None, help=f"default {RESULTS}")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the first 2 tickets, both methods, results to a temp file"
    )
    args = parser.parse_args()
    if args.json is None:
        args.json = results_path("confidence", smoke=True) if args.smoke else RESULTS

    config, _install, _model = prepare()
    cases = load_cases(args.cases)
    if args.limit or args.smoke:
        cases = cases[: args.limit or 2]
    rows: list[dict[str, Any]] = []
    with Runtime(config) as runtime, httpx.Client(trust_env=False) as client:
        url = runtime.agent(ALIAS).base_url() + "/chat/completions"  # type: ignore[attr-defined]
        warm, _ = body_for(runtime, cases[0])
        post(client, url, warm)
        probe = dict(warm, post_sampling_probs=True)
        probe_data, _, _ = post(client, url, probe)
        post_probs = [e.get("prob") for e in probe_data["choices"][0]["logprobs"]["content"]]
        for i, case in enumerate(cases):
            body, schema = body_for(runtime, case)
            plain = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
            arms = [("with", body), ("without", plain)]
            if i % 2:
                arms.reverse()
            got: dict[str, tuple[dict[str, Any], float, int]] = {}
            for name, b in arms:
                got[name] = post(client, url, b)
            data, ms_with, size_with = got["with"]
            _, ms_without, size_without = got["without"]
            text = data["choices"][0]["message"]["content"]
            started = time.perf_counter()
            conf = measure(schema, text, parse_logprobs(data))
            measure_ms = (time.perf_counter() - started) * 1000
            submission = json.loads(text)
            right, per = case.expect.judge(submission)
            row: dict[str, Any] = {
                "id": case.id,
                "answer": {k: submission.get(k) for k in ("queue", "priority")},
                "correct": right,
                "queue_correct": per.get("queue", False),
                "confidence": conf.value,
                "fields": conf.fields,
                "method": conf.method,
                "ms_with": ms_with,
                "ms_without": ms_without,
                "bytes_with": size_with,
                "bytes_without": size_without,
                "measure_ms": measure_ms,
                "forbidden_mass": forbidden_mass(data, schema, text),
            }
            if not args.no_forced:
                forced, spent, tokens = forced_scores(client, url, plain, schema, text)
                row.update(forced=forced, forced_ms=spent, forced_tokens=tokens)
            rows.append(row)
            print(
                f"{case.id:24} {row['answer']} right={right!s:5} conf={conf.value} fields={conf.fields}",
                file=sys.stderr,
            )

    def fa(key: str, correct_key: str, source: str = "fields") -> dict[str, Any]:
        pairs = [(r[source].get(key), r[correct_key]) for r in rows if r[source].get(key) is not None]
        return faithfulness([p for p, _ in pairs], [c for _, c in pairs])

    measured = [r for r in rows if r["confidence"] is not None]
    report: dict[str, Any] = {
        **provenance(smoke=args.smoke),
        "cases": len(rows),
        "measured": len(measured),
        "method_a_token_logprobs": {
            "answer": faithfulness([r["confidence"] for r in measured], [r["correct"] for r in measured]),
            "queue": fa("queue", "queue_correct"),
        },
        "cost": {
            "p50_ms_with_logprobs": round(statistics.median(r["ms_with"] for r in rows), 1),
            "p50_ms_without": round(statistics.median(r["ms_without"] for r in rows), 1),
            "ratio_with_over_without": round(
                statistics.median(r["ms_with"] for r in rows) / statistics.median(r["ms_without"] for r in rows), 3
            ),
            "reply_bytes_with": round(statistics.fmean(r["bytes_with"] for r in rows)),
            "reply_bytes_without": round(statistics.fmean(r["bytes_without"] for r in rows)),
            "p50_measure_ms": round(statistics.median(r["measure_ms"] for r in rows), 3),
        },
        "probabilities": {
            "mean_forbidden_mass_at_queue_first_token": _mean(
                [r["forbidden_mass"] for r in rows if r["forbidden_mass"] is not None]
            ),
            "post_sampling_probs_at_temperature_0": sorted(set(post_probs)),
        },
        "rows": rows,
    }
    if not args.no_forced:
        both = [r for r in rows if r["forced"].get("queue") is not None and not math.isnan(r["forced"]["queue"])]
        prod = [math.prod(r["forced"].values()) for r in rows]
        report["method_b_forced_alternatives"] = {
            "answer": faithfulness(prod, [r["correct"] for r in rows]),
            "queue": fa("queue", "queue_correct", "forced"),
            "p50_extra_ms": round(statistics.median(r["forced_ms"] for r in rows), 1),
            "mean_extra_tokens": round(statistics.fmean(r["forced_tokens"] for r in rows), 1),
            "queue_mean_abs_diff_vs_a": _mean([abs(r["forced"]["queue"] - r["fields"]["queue"]) for r in both]),
        }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
