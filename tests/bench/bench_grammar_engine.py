"""Grammar cost inside the real llama.cpp engine: localllm's compiled grammar vs llama.cpp's converter.

For every schema both compile (grammar/realworld and the JSONSchemaBench sample of
``tests/bench/data``), the same answers are fed through ``llama_grammar_accept`` of the pinned
libllama (the shim of the truth test, ``tests/e2e/grammar_engine``) under each grammar, and the
time per accepted code point is taken (best of ``--rounds`` passes, median over the answers).
The answers are engine walks of either grammar that both grammars admit, so both engines do the
same work. The cost the server pays per sampled token grows with this (every candidate token
is matched against the same pushdown stacks), so the ratio is the per-token grammar overhead of
one grammar against the other.

- localllm: ``compile_schema`` (defaults: objects open where allowed, no free whitespace);
- llama.cpp: ``json_schema_to_gbnf`` of the pinned llama-cpp-python 0.3.36 tree in the user
  cache (the Python port of ``json-schema-to-grammar.cpp``, what ``json_schema`` requests get).

Not a test: no asserts. Hold ``flock /tmp/bench.lock`` for timing runs.

    python tests/bench/bench_grammar_engine.py [--smoke] [--rounds N] [--json OUT]
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

from localllm.grammar.compile import compile_schema  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_grammar import LLAMA_GRAMMAR, REALWORLD, SAMPLE, _llama_converter  # noqa: E402
from tests.e2e.grammar_engine import Engine, EngineError, engine  # noqa: E402

ANSWERS = 6  # per schema
# The Python port nests a group per character of a maxLength; llama.cpp's grammar parser
# recurses per group and overflows the C stack on deep ones (a crash, not an error): skipped.
MAX_NESTING = 400


def nesting(grammar: str) -> int:
    depth = deepest = 0
    quoted = escaped = False
    for ch in grammar:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif not quoted and ch == ")":
            depth -= 1
    return deepest


def converter() -> Any:
    """llama.cpp's converter (``json_schema_to_gbnf``) from the pinned llama-cpp-python tree."""
    convert = _llama_converter()
    if convert is None:
        raise SystemExit(f"{LLAMA_GRAMMAR} is missing: run `make fetch-llama-server`")
    return convert


def schemas() -> list[tuple[str, Any]]:
    out = []
    for path in (REALWORLD, SAMPLE):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            out.append((entry["id"], entry["schema"]))
    return out


def measure(llama: Engine, ours: str, theirs: str, rounds: int, seed: int) -> tuple[float, float, int] | None:
    """(ns per code point: ours, theirs; answers timed), or None when no answer fits both."""
    try:
        with llama.grammar(ours) as a, llama.grammar(theirs) as b:
            pool = a.walk(ANSWERS, seed=seed).samples + b.walk(ANSWERS, seed=seed).samples
            answers = [t for t in dict.fromkeys(pool) if t and a.accepts(t) and b.accepts(t)][:ANSWERS]
            if not answers:
                return None
            mine = [a.time_accept(t, rounds) for t in answers]
            other = [b.time_accept(t, rounds) for t in answers]
    except EngineError:
        return None
    return statistics.median(mine), statistics.median(other), len(answers)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="ten schemas, one round: a quick check that it runs")
    parser.add_argument("--rounds", type=int, default=20, help="passes over each answer (default 20)")
    parser.add_argument("--json", type=Path, help="write the summary here (default: tests/bench/results/)")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    convert = converter()
    llama = engine()
    entries = schemas()[:: max(1, len(schemas()) // 10)] if args.smoke else schemas()
    rows: list[dict[str, Any]] = []
    skipped = {"localllm refuses": 0, "converter fails": 0, "converter grammar too deep": 0, "no common answer": 0}
    started = time.perf_counter()
    for i, (sid, schema) in enumerate(entries):
        ours = compile_schema(schema).grammar
        if ours is None:
            skipped["localllm refuses"] += 1
            continue
        try:
            theirs = convert(json.dumps(schema))
        except Exception:
            skipped["converter fails"] += 1
            continue
        if nesting(theirs) > MAX_NESTING:
            skipped["converter grammar too deep"] += 1
            continue
        got = measure(llama, ours, theirs, rounds, seed=i)
        if got is None:
            skipped["no common answer"] += 1
            continue
        rows.append({"id": sid, "localllm_ns": got[0], "llama_cpp_ns": got[1], "answers": got[2]})
    ratios = [r["localllm_ns"] / r["llama_cpp_ns"] for r in rows if r["llama_cpp_ns"] > 0]
    summary: dict[str, Any] = {
        **provenance(smoke=args.smoke),
        "rounds": rounds,
        "schemas_timed": len(rows),
        "skipped": skipped,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if rows:
        summary |= {
            "localllm_ns_per_cp_p50": statistics.median(r["localllm_ns"] for r in rows),
            "llama_cpp_ns_per_cp_p50": statistics.median(r["llama_cpp_ns"] for r in rows),
            "ratio_p50": statistics.median(ratios),
            "ratio_p90": quantile(ratios, 0.9),
            "ratio_max": max(ratios),
            "localllm_slower_than_1_5x": sum(r > 1.5 for r in ratios),
            "slowest": sorted(rows, key=lambda r: -r["localllm_ns"] / max(r["llama_cpp_ns"], 1e-9))[:5],
        }
        print("| grammar | ns per accepted code point, p50 over schemas |")
        print("|---|---|")
        print(f"| localllm (compile_schema) | {summary['localllm_ns_per_cp_p50']:.0f} |")
        print(f"| llama.cpp converter | {summary['llama_cpp_ns_per_cp_p50']:.0f} |")
        print(
            f"localllm / converter per schema: p50 {summary['ratio_p50']:.2f}, p90 {summary['ratio_p90']:.2f}, "
            f"max {summary['ratio_max']:.2f} ({summary['localllm_slower_than_1_5x']} of {len(rows)} above 1.5x)"
        )
    print(f"{len(rows)} schemas timed, skipped: {skipped}")
    out = args.json or results_path("grammar_engine", smoke=args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
