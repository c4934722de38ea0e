"""Per-token decode cost of a grammar: none vs localllm's vs llama.cpp's converter's, same schema.

    python tests/bench/bench_grammar_decode.py [--smoke] [--schemas N] [--reps R] [--n-predict T] [--json OUT]

The real pinned llama-server (``LOCALLLM_TEST_SERVER_BIN`` or the cached build) and gemma-3-270m
(``LOCALLLM_TEST_CHAT_GGUF`` or ``~/.cache/localllm-e2e``), found as the e2e tests find them; one
raw server, one slot. Schemas: from the JSONSchemaBench sample of ``bench_grammar.py``, real-world
subsets round-robin in the sample's order, those that both localllm (``compile_schema``) and
llama.cpp's converter (``json_schema_to_gbnf`` of the pinned llama-cpp-python tree) compile.
For each schema, the same ``POST /completion`` (the same prompt naming the schema, ``n_predict``,
temperature 0, cached prompt) with (a) no grammar, (b) localllm's grammar (the one
``builtin.local_llm`` sends by default: compact, closed objects), (c) the converter's
grammar, and two variants of (b) that tell rule shapes apart: ``localllm open``
(``compile_schema``'s default, open objects: an extension-key rule after the declared
properties) and ``localllm space`` (``compact: false``: one optional space after ``:`` and
``,``, as the converter allows). The arms rotate order every repetition after one untimed
one-token warm-up each. Read from the server's own ``timings``: ``predicted_per_token_ms`` (decode time per generated token, sampling
and grammar included) and ``predicted_n``. Per schema: the median per arm and the ratios b/a,
c/a, b/c, open/c, space/c; overall: medians across schemas. A ratio b/c above ``--flag`` is listed.
Then, untimed, per arm: how many of the generated tokens the grammar took instead of the model's
own greedy choice (``refusals``; ``--refusals-only`` runs just that). ``--engine-pass REPS``
also times llama.cpp's whole-vocabulary grammar pass at each position of the same answer under
localllm's grammar and the converter's (``_grammar_pass_peer.py``, in the llama-cpp-python
venv of ``make e2e-endpoints``): whether one refusal costs one grammar more than the other.

Results go to ``tests/bench/results/grammar_decode.json`` (``--smoke``: a temp file; one
schema, one repetition, 8 tokens). Not a test: no asserts on speed. Hold the machine-wide
lock for a measurement: ``flock /tmp/bench.lock python tests/bench/bench_grammar_decode.py``.
The server's decode time per token includes its grammar check: llama.cpp samples without the
grammar first and, when the grammar rejects that token, applies the grammar to the whole
vocabulary (262k entries for Gemma 3) and samples again, so the cost tracks how often the
model's own choice is refused as much as the grammar's size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.grammar.compile import compile_schema  # noqa: E402
from localllm.grammar.walk import Grammar  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_grammar import ADVERSARIAL, SAMPLE, _llama_converter  # noqa: E402
from tests.bench.bench_local_llm import free_port, stop_raw  # noqa: E402

# the e2e suite's own resolution of the server and the model (env override, else the cache)
from tests.e2e.conftest import _chat_gguf as chat_gguf  # noqa: E402
from tests.e2e.conftest import _server_bin as server_bin  # noqa: E402

#: (a) no grammar, (b) localllm's grammar as ``builtin.local_llm`` sends it by default (``compact:
#: true``, ``open_objects: false``), (c) llama.cpp's converter; then two variants of (b) that tell
#: which rule shape costs what: ``compile_schema``'s default (open objects: an extension-key rule
#: after the declared properties, what ``bench_grammar.py`` measures coverage with) and
#: ``compact: false`` (one optional space after ``:`` and ``,``, as the converter allows).
ARMS = ("none", "localllm", "llama.cpp", "localllm open", "localllm space")
RATIOS = (
    ("b/a", "localllm", "none"),
    ("c/a", "llama.cpp", "none"),
    ("b/c", "localllm", "llama.cpp"),
    ("open/c", "localllm open", "llama.cpp"),
    ("space/c", "localllm space", "llama.cpp"),
)
VARIANTS = {"localllm": {}, "localllm open": {"open_objects": True}, "localllm space": {"space": True}}
PROMPT = "Answer with one JSON value that is valid against this JSON Schema.\nSchema: {schema}\nJSON: "
SCHEMA_CHARS = 1500
CTX = 4096


def pick(count: int) -> list[dict[str, Any]]:
    """``count`` real-world sample schemas both compilers compile, subsets round-robin."""
    convert = _llama_converter()
    if convert is None:
        raise SystemExit("bench_grammar_decode: llama.cpp's converter is not in the user cache (make e2e-endpoints)")
    entries = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    queues: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        if entry["subset"] not in ADVERSARIAL:
            queues.setdefault(entry["subset"], []).append(entry)
    chosen: list[dict[str, Any]] = []
    while len(chosen) < count and any(queues.values()):
        for subset in sorted(queues):
            if len(chosen) >= count or not queues[subset]:
                continue
            while queues[subset]:
                entry = queues[subset].pop(0)
                grammars = {
                    arm: compile_schema(entry["schema"], **{"open_objects": False, **kw}).grammar
                    for arm, kw in VARIANTS.items()
                }
                if any(g is None for g in grammars.values()):
                    continue
                try:
                    theirs = convert(json.dumps(entry["schema"]))
                    Grammar.parse(theirs)
                except Exception:  # the converter asserts, or its GBNF does not parse: not both compile
                    continue
                chosen.append(
                    {"id": entry["id"], "schema": entry["schema"], "grammars": {**grammars, "llama.cpp": theirs}}
                )
                break
    return chosen


def start_server(binary: Path, model: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(CTX), "-np", "1"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with httpx.Client() as client:
        while True:
            if proc.poll() is not None:
                raise SystemExit(
                    f"bench_grammar_decode: llama-server exited with {proc.returncode}: {log.read_text()[-2000:]}"
                )
            try:
                if client.get(base + "/health", timeout=1.0).status_code == 200:
                    return proc, base
            except httpx.TransportError:
                pass
            if time.monotonic() - started > 300:
                stop_raw(proc)
                raise SystemExit("bench_grammar_decode: llama-server not healthy in 300 s")
            time.sleep(0.05)


def complete(client: httpx.Client, base: str, prompt: str, n_predict: int, grammar: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "seed": 0,
        "cache_prompt": True,
    }
    if grammar is not None:
        body["grammar"] = grammar
    reply = client.post(base + "/completion", json=body, timeout=600.0)
    if reply.status_code != 200:
        return {"error": f"HTTP {reply.status_code}: {reply.text[:200]}"}
    data = reply.json()
    timings = data["timings"]
    return {
        "per_token_ms": float(timings["predicted_per_token_ms"]),
        "predicted_n": int(timings["predicted_n"]),
        "content": data.get("content", ""),
    }


def measure(base: str, chosen: list[dict[str, Any]], reps: int, n_predict: int) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client() as client:
        for i, item in enumerate(chosen):
            prompt = PROMPT.format(schema=json.dumps(item["schema"], separators=(",", ":"))[:SCHEMA_CHARS])
            grammars = {"none": None, **item["grammars"]}
            runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
            errors: dict[str, str] = {}
            for arm in ARMS:  # warm-up, one token: the prompt cached, the grammar accepted by the server
                first = complete(client, base, prompt, 1, grammars[arm])
                if "error" in first:
                    errors[arm] = first["error"]
            for rep in range(reps):
                order = ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]
                for arm in order:
                    if arm in errors:
                        continue
                    result = complete(client, base, prompt, n_predict, grammars[arm])
                    if "error" in result:
                        errors[arm] = result["error"]
                    else:
                        runs[arm].append(result)
            row: dict[str, Any] = {"id": item["id"], "errors": errors}
            for arm in ARMS:
                if runs[arm]:
                    row[arm] = {
                        "per_token_ms": statistics.median(r["per_token_ms"] for r in runs[arm]),
                        "predicted_n": statistics.median(r["predicted_n"] for r in runs[arm]),
                        "all_ms": [round(r["per_token_ms"], 3) for r in runs[arm]],
                        "content": runs[arm][-1]["content"][:200],
                    }
            for key, num, den in RATIOS:
                if num in row and den in row:
                    row[key] = row[num]["per_token_ms"] / row[den]["per_token_ms"]
            rows.append(row)
            print(
                f"[{i + 1}/{len(chosen)}] {item['id']}: "
                + ", ".join(f"{a} {row[a]['per_token_ms']:.2f} ms x{row[a]['predicted_n']:g}" for a in ARMS if a in row)
                + (f" errors {errors}" if errors else ""),
                file=sys.stderr,
                flush=True,
            )
    return rows


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post(url, json=body, timeout=600.0)
    reply.raise_for_status()
    data: dict[str, Any] = reply.json()
    return data


def refusals(base: str, chosen: list[dict[str, Any]], n_predict: int) -> list[dict[str, Any]]:
    """Per schema and arm: of the tokens it generates, how many the grammar took instead of the
    model's own greedy choice (each one costs llama.cpp a grammar pass over the whole vocabulary).

    Each arm's answer is generated once (temperature 0: the timed answer) with its token ids;
    then, for every prefix of it, one token is asked for without a grammar: a refusal wherever
    that token differs from the answer's next one. The no-grammar arm is the self-check (0 by
    construction when the probe reproduces the server's own decoding). Untimed."""
    out = []
    with httpx.Client() as client:
        for item in chosen:
            prompt = PROMPT.format(schema=json.dumps(item["schema"], separators=(",", ":"))[:SCHEMA_CHARS])
            head = post(client, base + "/tokenize", {"content": prompt, "add_special": True})["tokens"]
            grammars = {"none": None, **item["grammars"]}
            row: dict[str, Any] = {"id": item["id"]}
            for arm in ARMS:
                body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "seed": 0}
                if grammars[arm] is not None:
                    body["grammar"] = grammars[arm]
                try:
                    tokens = post(client, base + "/completion", {**body, "return_tokens": True})["tokens"]
                except httpx.HTTPStatusError:
                    continue
                refused = []
                for k, token in enumerate(tokens):
                    probe = {"prompt": head + tokens[:k], "n_predict": 1, "temperature": 0, "seed": 0}
                    greedy = post(client, base + "/completion", {**probe, "return_tokens": True})["tokens"]
                    if greedy[:1] != [token]:
                        refused.append(k)
                row[arm] = {"tokens": len(tokens), "refused": len(refused), "at": refused}
            out.append(row)
            print(
                f"refusals {item['id']}: "
                + ", ".join(f"{a} {row[a]['refused']}/{row[a]['tokens']}" for a in ARMS if a in row),
                file=sys.stderr,
                flush=True,
            )
    return out


LLCP_PYTHON = Path.home() / ".cache/localllm-e2e/venvs/llama-cpp-python-0.3.36-noamx/bin/python"
PASS_PEER = Path(__file__).parent / "_grammar_pass_peer.py"


def engine_pass(model: Path, chosen: list[dict[str, Any]], rows: list[dict[str, Any]], reps: int) -> list[Any]:
    """The engine's whole-vocabulary pass, timed per position of the same answer under both
    grammars (``_grammar_pass_peer.py`` in the llama-cpp-python venv): localllm's compact answer
    under localllm's grammar and the converter's; its ``compact: false`` answer under that
    variant and the converter's. Tells whether one refusal costs one grammar more."""
    if not LLCP_PYTHON.exists():
        print(f"engine pass: skipped, no llama-cpp-python venv at {LLCP_PYTHON} (make e2e-endpoints)", file=sys.stderr)
        return []
    jobs = []
    for item, row in zip(chosen, rows, strict=True):
        theirs = item["grammars"]["llama.cpp"]
        for arm, label in (("localllm", "compact"), ("localllm space", "spaced")):
            if arm in row:
                grammars = {arm: item["grammars"][arm], "llama.cpp": theirs}
                jobs.append({"id": f"{item['id']} [{label}]", "text": row[arm]["content"], "grammars": grammars})
    done = subprocess.run(
        [str(LLCP_PYTHON), str(PASS_PEER), str(model), str(reps)],
        input="".join(json.dumps(j) + "\n" for j in jobs),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"engine pass failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    results = [json.loads(line) for line in done.stdout.splitlines()]
    for result in results:
        ours = next(k for k in result if k.startswith("localllm"))
        result["ratio"] = result[ours]["sum_ms"] / result["llama.cpp"]["sum_ms"]
        print(f"engine pass {result['id']}: {ours}/llama.cpp {result['ratio']:.2f}", file=sys.stderr, flush=True)
    return results


def summarise(rows: list[dict[str, Any]], flag: float) -> dict[str, Any]:
    complete_rows = [r for r in rows if all(a in r for a in ARMS)]
    out: dict[str, Any] = {"schemas": len(rows), "schemas_all_arms": len(complete_rows)}
    for arm in ARMS:
        values = [r[arm]["per_token_ms"] for r in complete_rows]
        tokens = [r[arm]["predicted_n"] for r in complete_rows]
        out[arm] = {
            "per_token_ms_median": statistics.median(values) if values else None,
            "predicted_n_median": statistics.median(tokens) if tokens else None,
        }
    for key, num, den in RATIOS:
        values = [r[key] for r in complete_rows]
        # the same ratio on each arm's fastest request: less of the other load on the machine
        fastest = [min(r[num]["all_ms"]) / min(r[den]["all_ms"]) for r in complete_rows]
        out[key] = {
            "median": statistics.median(values) if values else None,
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "median_of_fastest": statistics.median(fastest) if fastest else None,
        }
    out["flagged"] = [
        {
            "id": r["id"],
            "b/c": r["b/c"],
            "localllm_ms": r["localllm"]["per_token_ms"],
            "llama.cpp_ms": r["llama.cpp"]["per_token_ms"],
        }
        for r in complete_rows
        if r["b/c"] > flag
    ]
    return out


def table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [
        "| schema | "
        + " | ".join(f"{a} ms/tok (n)" for a in ARMS)
        + " | "
        + " | ".join(k for k, _, _ in RATIOS)
        + " |",
        "|---" * (1 + len(ARMS) + len(RATIOS)) + "|",
    ]
    for r in rows:
        cells = [
            f"{r[a]['per_token_ms']:.2f} ({r[a]['predicted_n']:g})"
            if a in r
            else f"error: {r['errors'].get(a, '?')[:40]}"
            for a in ARMS
        ]
        ratios = [f"{r[k]:.2f}" if k in r else "-" for k, _, _ in RATIOS]
        lines.append(f"| {r['id']} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    s = summary
    med = [f"{s[a]['per_token_ms_median']:.2f}" if s[a]["per_token_ms_median"] is not None else "-" for a in ARMS]
    ratios = [f"{s[k]['median']:.2f}" if s[k]["median"] is not None else "-" for k, _, _ in RATIOS]
    lines.append(f"| **median of {s['schemas_all_arms']}** | {' | '.join(med)} | {' | '.join(ratios)} |")
    fastest = [
        f"{s[k]['median_of_fastest']:.2f}" if s[k]["median_of_fastest"] is not None else "-" for k, _, _ in RATIOS
    ]
    lines.append(f"| median, fastest request per arm | {' | '.join('' for _ in ARMS)} | {' | '.join(fastest)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CI: one schema, one repetition, 8 tokens (temp file)")
    parser.add_argument("--schemas", type=int, default=None, help="how many schemas (default 8; smoke 1)")
    parser.add_argument("--reps", type=int, default=None, help="timed requests per arm and schema (default 2; smoke 1)")
    parser.add_argument("--n-predict", type=int, default=None, help="tokens per request (default 32; smoke 8)")
    parser.add_argument(
        "--refusals-only", action="store_true", help="only count the greedy tokens each grammar refuses (untimed)"
    )
    parser.add_argument(
        "--engine-pass",
        type=int,
        default=0,
        metavar="REPS",
        help="also time the engine's whole-vocabulary pass per answer position, best of REPS (llama-cpp-python venv)",
    )
    parser.add_argument("--flag", type=float, default=1.25, help="list schemas whose b/c is above this")
    parser.add_argument(
        "--json", type=Path, default=None, help="output (default tests/bench/results/grammar_decode.json)"
    )
    args = parser.parse_args(argv)
    count = args.schemas or (1 if args.smoke else 8)
    reps = args.reps or (1 if args.smoke else 2)
    n_predict = args.n_predict or (8 if args.smoke else 32)
    out = args.json or results_path("grammar_decode", smoke=args.smoke)
    started = time.perf_counter()
    chosen = pick(count)
    binary, model = server_bin(), chat_gguf()
    res: dict[str, Any] = {
        **provenance(smoke=args.smoke),
        "server": str(binary),
        "model": str(model),
        "reps": reps,
        "n_predict": n_predict,
        "prompt": PROMPT,
    }
    with tempfile.TemporaryDirectory(prefix="bench-grammar-decode-") as tmp:
        proc, base = start_server(binary, model, Path(tmp) / "server.log")
        try:
            rows = [] if args.refusals_only else measure(base, chosen, reps, n_predict)
            res["refusals"] = refusals(base, chosen, n_predict)
        finally:
            stop_raw(proc)
    res["rows"] = rows
    if args.engine_pass and rows:
        res["engine_pass"] = engine_pass(model, chosen, rows, args.engine_pass)
        for label in ("compact", "spaced"):
            ratios = [r["ratio"] for r in res["engine_pass"] if r["id"].endswith(f"[{label}]")]
            if ratios:
                print(f"engine pass, {label} answers: localllm/llama.cpp median {statistics.median(ratios):.2f}")
    res["summary"] = summarise(rows, args.flag)
    res["refusals_total"] = {
        arm: [
            sum(r[arm]["refused"] for r in res["refusals"] if arm in r),
            sum(r[arm]["tokens"] for r in res["refusals"] if arm in r),
        ]
        for arm in ARMS
    }
    res["bench_seconds"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    if rows:
        print(table(rows, res["summary"]))
    print(
        "\nmodel's greedy token refused by the grammar (refused / generated): "
        + ", ".join(f"{arm} {n}/{t}" for arm, (n, t) in res["refusals_total"].items())
    )
    if res["summary"]["flagged"]:
        print(f"\nb/c above {args.flag}: {json.dumps(res['summary']['flagged'])}")
    print(f"\nwrote {out} ({res['bench_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
