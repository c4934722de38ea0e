"""Schema -> grammar compilers side by side on a seeded JSONSchemaBench sample.

Per engine and subset: exact-compile rate (compiled without error), the sample's invalid
instances the grammar admits (must be 0 for localllm), the valid instances it admits
(compact JSON, the instance's own key order), and compile time p50/p95. Engines:

- localllm: ``compile_schema`` (instances checked with the GBNF walker, localllm.grammar.walk);
- llama.cpp's converter: ``json_schema_to_gbnf`` of the pinned llama-cpp-python 0.3.36 tree in
  the user cache (the Python port of ``json-schema-to-grammar.cpp``), instances checked with
  the same walker;
- LLGuidance (``llguidance.JsonCompiler``) and outlines-core (``build_regex_from_schema``,
  instances checked with Python ``re``): compile only / regex, when installed (test-only
  extra ``bench-grammar``);
- XGrammar 0.2.9 (``Grammar.from_json_schema`` with its defaults, instances checked by its own
  ``GrammarMatcher`` over a byte-level vocabulary): in a subprocess of its own venv
  (``make bench-peers``: it needs torch and transformers, which the project venv does not
  carry), see ``_xgrammar_peer.py``; skipped with the command to make the venv when it is missing
  (``LOCALLLM_XGRAMMAR_VENV`` points at another venv holding xgrammar 0.2.9).

Compile time is the engine's own call (GBNF is parsed by the walker outside it). Then
localllm's own compile time on the project's corpora (``grammar/realworld`` and
``grammar/corpus``, 562 schemas, best of 3 each): p50 and p95. Last, the relaxed grammar
(``localllm.grammar.relax``) on the schemas the compiler refuses: how many relax, how many of
their shipped valid instances the relaxed schema keeps (must be all), how many relaxed
grammars walk invalid (must be none) — on the sample, or with ``--relax-coverage MIRROR`` on
every schema of ``maskbench/data`` (localllm only, no timing). And the service's preparation
of a request carrying one of the 10 schemas slowest to compile: first, sent again, and again compiled
again (how it was before the compile was kept); and the slowest sent new by 6 clients at once,
against one request alone (1.0x when they wait for one compile; each compiling it: 8.5x).
The sample (``tests/bench/data/jsonschemabench_sample.jsonl``) is built by ``--make-sample
MIRROR``: from ``maskbench/data`` of guidance-ai/jsonschemabench (schemas with their shipped
valid/invalid tests), per subset the first N by sha256(seed + name), excluding schemas in
grammar/realworld. Writes ``tests/bench/results/grammar.json`` (``--smoke``: a temporary file).
Not a test: no asserts. Hold ``flock /tmp/bench.lock`` for timing runs.

    python tests/bench/bench_grammar.py [--smoke] [--json OUT]
    python tests/bench/bench_grammar.py --make-sample /path/to/jsonschemabench/repo [--per-subset 12]
    python tests/bench/bench_grammar.py --relax-coverage /path/to/jsonschemabench/repo
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.grammar.compile import compile_schema  # noqa: E402
from localllm.grammar.relax import relax  # noqa: E402
from localllm.grammar.walk import Grammar, GrammarSyntaxError  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.unit.grammar_harness import corpus, invalid_walks, realworld, validator  # noqa: E402

SAMPLE = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl"
REALWORLD = REPO / "grammar" / "realworld" / "schemas.jsonl"
LLAMA_GRAMMAR = (
    Path.home() / ".cache/localllm/build/llama-cpp-python-0.3.36/llama_cpp_python-0.3.36/llama_cpp/llama_grammar.py"
)
SOURCE = "https://github.com/guidance-ai/jsonschemabench maskbench/data at commit {commit}"
LICENSE = (
    "no LICENSE file in the repository; schemas curated from public sources (json-schema-corpus, "
    "GlaiveAI, Kubernetes, JSON Schema Store, Snowplow, Washington Post, BFCL, json-mode-eval): their terms apply"
)
ADVERSARIAL = ("Handwritten", "Synthesized")
XGRAMMAR_VERSION = "0.2.9"
XGRAMMAR_VENV = Path(
    os.environ.get("LOCALLLM_XGRAMMAR_VENV", Path.home() / f".cache/localllm-e2e/venvs/xgrammar-{XGRAMMAR_VERSION}")
)
XGRAMMAR_PEER = Path(__file__).parent / "_xgrammar_peer.py"


def subset_of(name: str) -> str:
    stem = name.rsplit("/", 1)[-1].removesuffix(".json")
    if "---" in stem:
        return stem.split("---")[0]
    return re.sub(r"_\d+$", "", stem)


def _mirror_files(mirror: Path) -> tuple[str, list[str]]:
    """The mirror's commit and its ``maskbench/data`` files."""
    commit = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    names = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "--name-only", "HEAD", "maskbench/data/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return commit, names


def _mirror_entry(mirror: Path, name: str) -> dict[str, Any] | None:
    """The file as a sample entry; None when the mirror lacks its bytes (a snapshot may leave
    its largest files out)."""
    git = subprocess.run(
        ["git", "-C", str(mirror), "show", f"HEAD:{name}"], capture_output=True, text=True, check=False
    )
    if git.returncode:
        return None
    doc = json.loads(git.stdout)
    subset = subset_of(name)
    stem = name.rsplit("/", 1)[-1].removesuffix(".json")
    return {"id": f"jsb/{subset}/{stem}", "subset": subset, "schema": doc["schema"], "tests": doc.get("tests", [])}


def make_sample(mirror: Path, per_subset: int, seed: int) -> None:
    taken = {json.loads(line)["id"].split("/", 2)[-1] for line in REALWORLD.read_text().splitlines()}
    commit, names = _mirror_files(mirror)
    by_subset: dict[str, list[str]] = defaultdict(list)
    for name in names:
        stem = name.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.split("---")[-1] in taken:
            continue
        by_subset[subset_of(name)].append(name)
    SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for subset in sorted(by_subset):
        ranked = sorted(by_subset[subset], key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest())
        kept = 0
        for name in ranked:
            if kept >= per_subset:
                break
            text = subprocess.run(
                ["git", "-C", str(mirror), "show", f"HEAD:{name}"], capture_output=True, text=True, check=True
            ).stdout
            if len(text) > 20_000:
                continue
            doc = json.loads(text)
            entry = {
                "id": f"jsb/{subset}/{name.rsplit('/', 1)[-1].removesuffix('.json')}",
                "subset": subset,
                "source": SOURCE.format(commit=commit[:8]) + f" {name}",
                "license": LICENSE,
                "schema": doc["schema"],
                "tests": doc.get("tests", []),
            }
            lines.append(json.dumps(entry, ensure_ascii=False))
            kept += 1
    SAMPLE.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} schemas to {SAMPLE}")


# ---------------------------------------------------------------------------- engines


def _llama_converter() -> Any:
    if not LLAMA_GRAMMAR.exists():
        return None
    spec = importlib.util.spec_from_file_location("llama_grammar_port", LLAMA_GRAMMAR)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return None
    return module.json_schema_to_gbnf


def engines() -> dict[str, Any]:
    out: dict[str, Any] = {}

    def localllm(schema: Any) -> Any:
        compiled = compile_schema(schema)
        if compiled.grammar is None:
            raise ValueError(compiled.refusals[0].construct)
        return compiled.grammar

    out["localllm"] = localllm
    convert = _llama_converter()
    if convert is not None:
        out["llama.cpp"] = lambda schema: convert(json.dumps(schema))
    try:
        import llguidance

        compiler = llguidance.JsonCompiler()
        out["llguidance"] = lambda schema: (compiler.compile(json.dumps(schema)), None)[1]
    except ImportError:
        pass
    try:
        from outlines_core.json_schema import build_regex_from_schema

        def outlines(schema: Any) -> Any:
            return re.compile(build_regex_from_schema(json.dumps(schema)))

        out["outlines-core"] = outlines
    except ImportError:
        pass
    return out


def compact(value: Any) -> str:
    """An instance as every engine is asked about it: compact JSON, its own key order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def admits(matcher: Any, value: Any) -> bool | None:
    text = compact(value)
    if isinstance(matcher, Grammar):
        try:
            return matcher.matches(text)
        except (RecursionError, GrammarSyntaxError):
            return None
    if isinstance(matcher, re.Pattern):
        return matcher.fullmatch(text) is not None
    return None


def _rows() -> dict[str, dict[str, Any]]:
    return defaultdict(
        lambda: {
            "schemas": 0,
            "compiled": 0,
            "valid": 0,
            "valid_admitted": 0,
            "invalid": 0,
            "invalid_admitted": 0,
            "times": [],
            "refusals": defaultdict(int),
        }
    )


def xgrammar_python() -> Path | None:
    python = XGRAMMAR_VENV / "bin" / "python"
    return python if (XGRAMMAR_VENV / ".installed").exists() and python.exists() else None


def run_xgrammar(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """XGrammar's rows, from ``_xgrammar_peer.py`` in its venv; None (and how to make it) without."""
    python = xgrammar_python()
    if python is None:
        print(
            f"xgrammar: skipped, no venv at {XGRAMMAR_VENV} (make it with `make bench-peers`)",
            file=sys.stderr,
        )
        return None
    jobs = "".join(
        json.dumps({"schema": e["schema"], "texts": [compact(t["data"]) for t in e["tests"]]}) + "\n" for e in entries
    )
    done = subprocess.run(
        [str(python), str(XGRAMMAR_PEER)], input=jobs, capture_output=True, text=True, check=False, timeout=1800
    )
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(entries) + 1:
        raise RuntimeError(f"xgrammar peer failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    version = json.loads(lines[0])["version"]
    if version != XGRAMMAR_VERSION:
        raise RuntimeError(f"xgrammar venv has {version}, the bench pins {XGRAMMAR_VERSION}: run `make bench-peers`")
    per = _rows()
    for entry, line in zip(entries, lines[1:], strict=True):
        result = json.loads(line)
        row = per[entry["subset"]]
        row["schemas"] += 1
        row["times"].append(result["seconds"])
        if not result["ok"]:
            row["refusals"][result["error"]] += 1
            continue
        row["compiled"] += 1
        for test, ok in zip(entry["tests"], result["admitted"], strict=True):
            if ok is None:
                continue
            key = "valid" if test["valid"] else "invalid"
            row[key] += 1
            row[f"{key}_admitted"] += int(ok)
    return per


def run(entries: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name, engine in engines().items():
        per = _rows()
        for entry in entries:
            row = per[entry["subset"]]
            row["schemas"] += 1
            start = time.perf_counter()
            try:
                matcher = engine(entry["schema"])
            except Exception as exc:
                row["times"].append(time.perf_counter() - start)
                row["refusals"][str(exc)[:40] if name == "localllm" else type(exc).__name__] += 1
                continue
            row["times"].append(time.perf_counter() - start)
            if isinstance(matcher, str):  # GBNF text: read by the walker, outside the timing
                try:
                    matcher = Grammar.parse(matcher)
                except (GrammarSyntaxError, RecursionError) as exc:
                    row["refusals"][type(exc).__name__] += 1
                    continue
            row["compiled"] += 1
            for test in entry["tests"]:
                ok = admits(matcher, test["data"])
                if ok is None:
                    continue
                key = "valid" if test["valid"] else "invalid"
                row[key] += 1
                row[f"{key}_admitted"] += int(ok)
        table[name] = per
    xgrammar = run_xgrammar(entries)
    if xgrammar is not None:
        table[f"xgrammar {XGRAMMAR_VERSION}"] = xgrammar
    return table


def report(table: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    print("| engine | subset | exact-compile | invalid admitted | valid admitted | compile p50 / p95 ms |")
    print("|---|---|---|---|---|---|")
    for name, per in table.items():
        groups = {
            "real-world": [s for s in per if s not in ADVERSARIAL],
            "adversarial": [s for s in per if s in ADVERSARIAL],
        }
        for subset in [*sorted(per), *groups]:
            rows = [per[s] for s in groups[subset]] if subset in groups else [per[subset]]
            if not rows:
                continue
            total = {
                k: sum(r[k] for r in rows)
                for k in ("schemas", "compiled", "valid", "valid_admitted", "invalid", "invalid_admitted")
            }
            times = sorted(t for r in rows for t in r["times"])
            p50 = 1000 * statistics.median(times) if times else 0.0
            p95 = 1000 * times[min(len(times) - 1, int(0.95 * len(times)))] if times else 0.0
            rate = total["compiled"] / total["schemas"] if total["schemas"] else 0.0
            label = f"**{subset}**" if subset in groups else subset
            print(
                f"| {name} | {label} | {total['compiled']}/{total['schemas']} ({100 * rate:.1f}%) | "
                f"{total['invalid_admitted']}/{total['invalid']} | {total['valid_admitted']}/{total['valid']} | "
                f"{p50:.2f} / {p95:.2f} |"
            )
            summary.setdefault(name, {})[subset] = {**total, "p50_ms": p50, "p95_ms": p95}
        refusals: dict[str, int] = defaultdict(int)
        for r in per.values():
            for k, v in r["refusals"].items():
                refusals[k] += v
        summary.setdefault(name, {})["refusals"] = dict(sorted(refusals.items(), key=lambda kv: -kv[1]))
    return summary


def relax_coverage(entries: list[dict[str, Any]], walks: int = 5) -> dict[str, Any]:
    """Per subset: schemas, compiled exactly, admitting no value, refused, relaxed; of the
    relaxed ones' shipped valid instances (valid under the schema), how many the relaxed
    schema keeps (``kept`` must equal ``instances``); relaxed grammars that walked an invalid
    value (must be 0) or were too deep for the walker."""
    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for entry in entries:
        row, schema = per[entry["subset"]], entry["schema"]
        row["schemas"] += 1
        compiled = compile_schema(schema)
        if compiled.exact or compiled.unsatisfiable:
            row["exact" if compiled.exact else "unsatisfiable"] += 1
            continue
        row["refused"] += 1
        relaxed = relax(schema, seconds=60.0)  # the bench measures what relaxes, not how fast
        if relaxed is None:
            continue
        row["relaxed"] += 1
        check, wider = validator(schema), validator(relaxed.schema)
        for test in entry["tests"]:
            if test["valid"] and check.is_valid(test["data"]):
                row["instances"] += 1
                row["kept"] += int(wider.is_valid(test["data"]))
        try:
            row["invalid_walks"] += int(bool(invalid_walks(relaxed.schema, relaxed.compiled, walks)))
        except RecursionError:
            row["too_deep_to_walk"] += 1
    total: dict[str, int] = defaultdict(int)
    print("| subset | schemas | exact | no value | refused | relaxed | valid instances kept | invalid walks |")
    print("|---|---|---|---|---|---|---|---|")
    for subset, row in [*sorted(per.items()), ("**all**", total)]:
        if subset != "**all**":
            for k, v in row.items():
                total[k] += v
        print(
            f"| {subset} | {row['schemas']} | {row['exact']} | {row['unsatisfiable']} | {row['refused']} | "
            f"{row['relaxed']} | {row['kept']}/{row['instances']} | {row['invalid_walks']} |"
        )
    if total["too_deep_to_walk"]:
        print(f"({total['too_deep_to_walk']} relaxed grammars too deep for the walker: not walked)")
    return {"subsets": {k: dict(v) for k, v in per.items()}, "all": dict(total)}


def corpus_compile_times(limit: int | None, reps: int) -> dict[str, Any]:
    """localllm's compile time on the project's corpora: ``grammar/realworld`` (schemas nobody
    here wrote) and ``grammar/corpus`` (one entry per construct), best of ``reps`` per schema."""
    schemas = [schema for _, schema in [*realworld(), *corpus()]][:limit]
    times: list[float] = []
    compiled = 0
    for schema in schemas:
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            result = compile_schema(schema)
            best = min(best, time.perf_counter() - start)
        compiled += result.grammar is not None
        times.append(best)
    times.sort()
    return {
        "schemas": len(schemas),
        "compiled": compiled,
        "reps": reps,
        "p50_ms": round(1000 * statistics.median(times), 3),
        "p95_ms": round(1000 * times[min(len(times) - 1, int(0.95 * len(times)))], 3),
    }


def service_prepare(entries: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The service's preparation of a chat request whose ``response_format`` (strict: false)
    is one of the ``n`` schemas here slowest to compile (the sample's and the realworld
    corpus's), the way clients send it: the first request, the same request again (the
    compile kept), and again with the kept compiles cleared first (the relaxed grammar still
    kept: how a request sent again was prepared before ``compile_shared``). Per schema: the
    three times and what structured the answer (compiled, relaxed, converter). And the
    slowest of them sent by 6 clients at once, new (a client's first requests, side by side):
    the time until all 6 are prepared, against one request alone (``first_s`` of that row)."""
    from concurrent.futures import ThreadPoolExecutor

    from localllm.grammar import compile as compile_module
    from localllm.grammar import relax as relax_module
    from localllm.service import chat

    candidates = [e["schema"] for e in entries] + [schema for _, schema in realworld()]
    took: list[tuple[float, int]] = []
    for i, schema in enumerate(candidates):
        start = time.perf_counter()
        compile_schema(schema, open_objects=chat.OPEN_OBJECTS)
        took.append((time.perf_counter() - start, i))
    schemas = [candidates[i] for _, i in sorted(took, reverse=True)[:n] if isinstance(candidates[i], dict)]

    def prepared(schema: dict[str, Any]) -> tuple[float, str]:
        rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
        start = time.perf_counter()
        try:
            how = chat.prepare(body, "m").structured
        except chat.BadRequest as exc:
            how = f"400 {exc.param}"
        return time.perf_counter() - start, how

    rows: list[dict[str, Any]] = []
    for schema in schemas:
        compile_module._COMPILED.clear()
        relax_module._RELAXED.clear()
        first, how = prepared(schema)
        again = min(prepared(schema)[0] for _ in range(3))
        recompiled = []
        for _ in range(3):
            compile_module._COMPILED.clear()
            recompiled.append(prepared(schema)[0])
        rows.append({"bytes": len(json.dumps(schema)), "structured": how, "first_s": first, "again_s": again})
        rows[-1]["again_recompiled_s"] = min(recompiled)
    compile_module._COMPILED.clear()
    relax_module._RELAXED.clear()
    with ThreadPoolExecutor(6) as pool:
        start = time.perf_counter()
        list(pool.map(lambda _: prepared(schemas[0]), range(6)))
        six_at_once = time.perf_counter() - start
    compile_module._COMPILED.clear()
    return {
        "schemas": len(rows),
        "six_at_once_s": round(six_at_once, 3),
        "six_at_once_x_one": round(six_at_once / rows[0]["first_s"], 2),
        "first_s": round(sum(r["first_s"] for r in rows), 3),
        "again_s": round(sum(r["again_s"] for r in rows), 4),
        "again_recompiled_s": round(sum(r["again_recompiled_s"] for r in rows), 3),
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two schemas per subset: a quick check that it runs")
    parser.add_argument("--json", type=Path, help="write the summary here (default: tests/bench/results/grammar.json)")
    parser.add_argument(
        "--make-sample", type=Path, metavar="MIRROR", help="build the sample from a jsonschemabench checkout"
    )
    parser.add_argument(
        "--relax-coverage",
        type=Path,
        metavar="MIRROR",
        help="the relaxed grammar on every schema of a jsonschemabench checkout (localllm only)",
    )
    parser.add_argument("--per-subset", type=int, default=12)
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()
    if args.make_sample:
        make_sample(args.make_sample, args.per_subset, args.seed)
        return 0
    if args.relax_coverage:
        commit, names = _mirror_files(args.relax_coverage)
        found = [_mirror_entry(args.relax_coverage, name) for name in names]
        entries = [entry for entry in found if entry is not None]
        print(f"{len(entries)} of the {len(names)} schemas at {commit[:8]} (the others absent from the mirror)")
        coverage = relax_coverage(entries)
        out = args.json or results_path("relax_coverage", smoke=False)
        out.parent.mkdir(parents=True, exist_ok=True)
        source = SOURCE.format(commit=commit[:8])
        doc = {**provenance(smoke=False), "source": source, "absent": len(names) - len(entries), **coverage}
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")
        return 0
    entries = sample = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    if args.smoke:
        seen: dict[str, int] = defaultdict(int)
        kept = []
        for entry in entries:
            seen[entry["subset"]] += 1
            if seen[entry["subset"]] <= 2:
                kept.append(entry)
        entries = kept
    summary = report(run(entries))
    for name, data in summary.items():
        print(f"{name} refusals: {data['refusals']}")
    corpus = corpus_compile_times(20 if args.smoke else None, 1 if args.smoke else 3)
    print(
        f"localllm compile time on the corpora ({corpus['compiled']}/{corpus['schemas']} compiled, best of "
        f"{corpus['reps']}): p50 {corpus['p50_ms']:.2f} ms, p95 {corpus['p95_ms']:.2f} ms"
    )
    coverage = relax_coverage(sample)  # the whole sample in a smoke run too: few of its first schemas are refused
    served = service_prepare(sample, 2 if args.smoke else 10)
    print(
        f"the service preparing a request with one of the {served['schemas']} schemas slowest to compile (summed): "
        f"first {served['first_s']:.2f} s, sent again {1000 * served['again_s']:.1f} ms "
        f"(compiled again: {served['again_recompiled_s']:.2f} s); the slowest sent new by 6 clients at once: "
        f"{served['six_at_once_s']:.2f} s, {served['six_at_once_x_one']:.2f}x one alone"
    )
    out = args.json or results_path("grammar", smoke=args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(smoke=args.smoke), "engines": summary, "corpus_compile": corpus, "relax": coverage}
    doc["service_prepare"] = served
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
