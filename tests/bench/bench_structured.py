"""Benchmark: localllm's compiled grammar vs llama.cpp's own converter, side by side.

    python tests/bench/bench_structured.py [--quick] [--tickets N] [--repeats N] [--prompts P,..] [--json OUT]

The demo's triage gate (``examples/demo``) on the real llama-server + gemma-3-270m, two
arms that differ only in ``grammar:`` — ``true`` (localllm's exact, compact GBNF sent as
the request's ``grammar``) and ``server`` (``response_format: json_schema``, which
llama.cpp converts itself and which lets the model put whitespace between tokens). Each
arm has its own sidecar; both are up for the whole run and every ticket goes to both, in
alternating order. Fallback is off (``fallback: none``), so a cut answer is counted, not
replaced. Two prompts (``--prompts``): ``fewshot``, the demo's own (nine compact examples,
no schema statement), and ``zeroshot``, the same instructions without the examples and
with the schema statement (``schema_in_prompt: true``) — the prompt most users write, where
nothing shows the model a compact answer. Measured per arm and prompt over the tickets of
``examples/demo/evals/triage/cases.jsonl``:

- completion tokens per decide (mean), decide latency (p50/p95 wall, through the Runtime);
- answers cut by ``max_tokens`` (``finish_reason: length``) and answers that failed validation;
- prompt tokens re-evaluated on warm calls with a new ticket (the server's ``timings.prompt_n``
  over ``usage.prompt_tokens``; the rest came from its prompt cache);
- identical submissions over ``--repeats`` runs of one ticket, three ways: back to back;
  interleaved with other tickets (the slot's cache holds a different ticket each time); and
  while another decide runs in the sidecar's other slot (batched with it). On the few-shot
  prompt a third sidecar runs the compiled arm with ``reproducible: true`` the same way.

Prints one table and writes ``tests/bench/results/structured.json`` (``--quick``:
``structured.quick.json``). Not a test: no asserts on speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import dataclasses  # noqa: E402
import threading  # noqa: E402

from localllm import Runtime  # noqa: E402
from localllm.config import Config  # noqa: E402
from localllm.errors import AgentError  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_local_llm import GATE, loadavg, other_servers, pct, prepare, with_agent  # noqa: E402

CASES = REPO / "examples" / "demo" / "evals" / "triage" / "cases.jsonl"
ARMS = {"compiled": True, "server": "server"}


def tickets(n: int) -> list[str]:
    rows = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row["args"]["ticket"] for row in rows][:n]


def decide(runtime: Runtime, ticket: str) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = runtime.run_gate(GATE, {"ticket": ticket})
    except AgentError as exc:
        meta = exc.meta or {}
        return {
            "ok": False,
            "kind": exc.kind.value,
            "wall": time.perf_counter() - started,
            "finish_reason": meta.get("finish_reason"),
            "completion_tokens": meta.get("completion_tokens"),
            "submission": None,
            "meta": meta,
        }
    return {
        "ok": True,
        "wall": time.perf_counter() - started,
        "submission": result.submission,
        "finish_reason": result.meta.get("finish_reason"),
        "completion_tokens": result.meta.get("completion_tokens"),
        "meta": result.meta,
    }


def zeroshot(config: Config) -> Config:
    """The demo gate without its examples, with the schema statement: instructions + ticket."""
    gate = config.gates[GATE]
    instructions = gate.prompt.split("\n\nTicket:", 1)[0]
    prompt = instructions + "\n\nTicket: {{ args.ticket }}"
    return dataclasses.replace(config, gates={**config.gates, GATE: dataclasses.replace(gate, prompt=prompt)})


def same(rows: list[dict[str, Any]]) -> int:
    """How many of ``rows`` gave the most common submission."""
    answers = [json.dumps(r["submission"], sort_keys=True) for r in rows if r["ok"]]
    return max((answers.count(a) for a in set(answers)), default=0)


def reproducibility(runtime: Runtime, texts: list[str], repeats: int) -> dict[str, int]:
    """Identical submissions for ``texts[0]``: interleaved with other tickets, and batched."""
    interleaved = []
    for i in range(repeats):
        decide(runtime, texts[1 + i % (len(texts) - 1)])
        interleaved.append(decide(runtime, texts[0]))
    batched = []
    for i in range(repeats):
        other = threading.Thread(target=decide, args=(runtime, texts[1 + i % (len(texts) - 1)]))
        other.start()
        batched.append(decide(runtime, texts[0]))
        other.join()
    return {"identical_interleaved": same(interleaved), "identical_batched": same(batched)}


def summarise(rows: list[dict[str, Any]], repeats: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [r["completion_tokens"] for r in rows if isinstance(r["completion_tokens"], int)]
    walls = [r["wall"] for r in rows]
    warm = [r["meta"] for r in rows[1:] if isinstance(r["meta"].get("timings"), dict)]
    reeval = [
        m["timings"]["prompt_n"] / m["prompt_tokens"]
        for m in warm
        if m.get("prompt_tokens") and isinstance(m["timings"].get("prompt_n"), int)
    ]
    grammar = sorted({str(r["meta"].get("grammar_source")) for r in rows})
    return {
        "decides": len(rows),
        "grammar": grammar,
        "completion_tokens_mean": statistics.fmean(tokens) if tokens else None,
        "completion_tokens_max": max(tokens, default=None),
        "latency_ms_p50": pct(walls, 50) * 1000,
        "latency_ms_p95": pct(walls, 95) * 1000,
        "cut_by_max_tokens": sum(r["finish_reason"] == "length" for r in rows),
        "invalid": sum(not r["ok"] for r in rows),
        "prompt_reevaluated_share": statistics.fmean(reeval) if reeval else None,
        "identical_submissions": same(repeats),
        "repeats": len(repeats),
    }


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


KEYS = (
    "completion_tokens_mean",
    "latency_ms_p50",
    "latency_ms_p95",
    "cut_by_max_tokens",
    "invalid",
    "prompt_reevaluated_share",
    "identical_submissions",
)


def run_prompt(config: Config, texts: list[str], repeats: int, reproducible: bool = False) -> dict[str, Any]:
    """Both arms on one prompt, side by side; reproducibility measured on the compiled arm.

    ``reproducible``: a third sidecar, the compiled arm with ``reproducible: true``.
    """
    arms = dict(ARMS, **({"reproducible": True} if reproducible else {}))
    runtimes = {
        arm: Runtime(with_agent(config, grammar=mode, fallback="none", reproducible=arm == "reproducible"))
        for arm, mode in arms.items()
    }
    rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    again: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    try:
        for runtime in runtimes.values():  # start both sidecars, and warm each once
            decide(runtime, texts[0])
        for i, ticket in enumerate(texts):
            order = list(arms) if i % 2 == 0 else list(reversed(arms))
            for arm in order:
                rows[arm].append(decide(runtimes[arm], ticket))
        for i in range(repeats):
            for arm in list(arms) if i % 2 == 0 else list(reversed(arms)):
                again[arm].append(decide(runtimes[arm], texts[0]))
        extra = {arm: reproducibility(runtimes[arm], texts, repeats) for arm in arms if arm != "server"}
    finally:
        for runtime in runtimes.values():
            runtime.close()
    result: dict[str, Any] = {arm: summarise(rows[arm], again[arm]) for arm in arms}
    for arm, found in extra.items():
        result[arm].update(found)
    c, s = result["compiled"], result["server"]

    def ratio(key: str) -> float | None:
        a, b = c[key], s[key]
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    result["ratios"] = {"completion_tokens": ratio("completion_tokens_mean"), "latency_p50": ratio("latency_ms_p50")}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 tickets, 3 repeats")
    parser.add_argument("--smoke", action="store_true", help="CI: 2 tickets, 2 repeats (results to a temp file)")
    parser.add_argument("--tickets", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--prompts", default="fewshot,zeroshot", help="comma-separated: fewshot, zeroshot")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    n, repeats = (2, 2) if args.smoke else (4, 3) if args.quick else (args.tickets, args.repeats)
    out = args.json or results_path("structured", smoke=args.smoke, quick=args.quick)
    config, install, model = prepare()
    texts = tickets(n)
    variants = {"fewshot": config, "zeroshot": with_agent(zeroshot(config), schema_in_prompt=True)}
    runs = {
        name: run_prompt(variants[name], texts, repeats, reproducible=name == "fewshot")
        for name in args.prompts.split(",")
    }
    result: dict[str, Any] = {**provenance(smoke=args.smoke), **runs}
    result["machine"] = {
        "loadavg": loadavg(),
        "other_llama_servers": other_servers(),
        "server": str(install.binary),
        "model": str(model),
    }
    for name in args.prompts.split(","):
        c, s = result[name]["compiled"], result[name]["server"]
        print(f"\n{name} prompt: {'measure':32} {'compiled':>12} {'server':>12}")
        for key in KEYS:
            print(f"{' ' * len(name)}         {key:32} {_fmt(c[key]):>12} {_fmt(s[key]):>12}")
        for arm in ("compiled", "reproducible"):
            if arm in result[name]:
                r = result[name][arm]
                print(
                    f"identical ({arm}): back to back {r['identical_submissions']}, "
                    f"interleaved {r['identical_interleaved']}, batched {r['identical_batched']}; "
                    f"p50 {r['latency_ms_p50']:.0f} ms, prompt re-evaluated {_fmt(r['prompt_reevaluated_share'])}"
                )
        print(f"ratios compiled/server: {result[name]['ratios']}  (repeats: {repeats}, tickets: {n})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
