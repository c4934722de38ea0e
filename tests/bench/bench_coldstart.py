"""Benchmark P3: ``localllm run`` with its own sidecar against a raw llama-server spawn + /health + one POST.

    python tests/bench/bench_coldstart.py [--smoke] [--rounds N] [--before REF] [--fake] [--json OUT]

The demo's triage gate (``examples/demo``: gemma-3-270m, grammar-constrained decide), warm
cache (server built, model fetched — what every run after the first finds). Arms, all
timed from this process, the order rotating every round:

- ``localllm run``: ``python -m localllm run triage -c examples/demo/config.yaml --arg
  ticket=… --json`` in a fresh interpreter (this tree on ``PYTHONPATH``, bytecode cached
  as after an install): wall time from ``Popen`` to the answer on its stdout, and to its
  exit (the sidecar stopped, the interpreter gone).
- ``before`` (``--before REF``): the same command from ``git archive REF localllm``, for a
  before/after in the same run.
- ``raw``: the sidecar's own argv (port fixed) and environment, spawned here; ``/health``
  polled every 5 ms; then one POST of the byte-identical body (captured off the wire) over
  a fresh connection; wall time from ``Popen`` to the parsed answer. Its teardown is not
  counted.

Before the rounds, one untimed in-process start records the argv, captures the body and
fills the per-build probe cache (``localllm.managed.probes``), and each arm runs once untimed
(page cache, bytecode; for ``localllm run`` also the head start's plan, ``localllm/_head_start.py``:
what every run of a command after its first finds). The figure is the ratio of medians (``≤ 1.05`` is the goal), with
the median of per-round ratios beside it. ``--fake`` runs against the unit tests' fake
llama-server (a code-path check, not a measurement). Results go to
``tests/bench/results/coldstart.json`` (``--smoke``: a temp file). Not a test: no asserts on
speed. Hold the machine-wide lock for a measurement: ``flock /tmp/bench.lock python …``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from localllm import Runtime, load_config  # noqa: E402
from localllm.config import Config  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_local_llm import (  # noqa: E402
    ALIAS,
    CONFIG,
    GATE,
    TICKET,
    free_port,
    prepare,
    stop_raw,
    wait_raw_healthy,
)

FAKE = REPO / "tests" / "unit" / "fakes" / "fake_llama_server.py"
HEALTH_POLL = 0.005
RAW_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


# ---------------------------------------------------------------------------- set-up


def fake_config(tmp: Path) -> Path:
    """The demo config pointed at the unit tests' fake llama-server and a placeholder GGUF."""
    demo = CONFIG.parent
    work = tmp / "fake-demo"
    for part in ("prompts", "schemas", "evals"):  # evals: the queue gate's examples (a load-time check)
        if (demo / part).is_dir():
            shutil.copytree(demo / part, work / part)
    server = work / "llama-server"
    server.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    server.chmod(0o755)
    (work / "model.gguf").write_bytes(b"GGUF placeholder")
    text = CONFIG.read_text(encoding="utf-8")
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("model: gemma-3-270m"):
            indent = line[: len(line) - len(line.lstrip())]
            lines += [f"{indent}model: ./model.gguf", f"{indent}server_bin: ./llama-server"]
        else:
            lines.append(line)
    (work / "config.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return work / "config.yaml"


def before_tree(ref: str, tmp: Path) -> Path:
    """``git archive REF`` of the package and the data it reads (pins, grammar, embed), under ``tmp``."""
    dest = tmp / "before"
    dest.mkdir()
    archive = subprocess.run(
        ["git", "archive", ref, "localllm", "pins", "grammar", "embed"], cwd=REPO, capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(f"bench: git archive {ref} failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def warm_up(config: Config) -> dict[str, Any]:
    """One in-process start: the sidecar's argv, env and the exact body it POSTs (untimed)."""
    from localllm.managed.server import _child_env

    with Runtime(config) as runtime:
        agent = runtime.agent(ALIAS)
        sent: list[bytes] = []

        def capture(request: httpx.Request) -> None:
            sent.append(request.read())

        client: httpx.Client = agent._http()  # type: ignore[attr-defined]
        client.event_hooks["request"].append(capture)
        result = runtime.run_gate(GATE, {"ticket": TICKET})
        client.event_hooks["request"].remove(capture)
        server = agent._server  # type: ignore[attr-defined]
        argv, binary = server.argv(), server.binary
    if len(sent) != 1:
        raise SystemExit(f"bench: the warm-up call sent {len(sent)} requests, expected one")
    return {"argv": argv, "env": _child_env(binary, None), "body": sent[0], "answer": result.submission}


# ---------------------------------------------------------------------------- arms


def run_cli(pythonpath: Path, config: Path, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """``localllm run`` in a fresh interpreter: seconds to the answer on stdout and to exit."""
    cmd = [sys.executable, "-m", "localllm", "run", GATE, "-c", str(config), "--arg", f"ticket={TICKET}", "--json"]
    child_env = {**env, "PYTHONPATH": str(pythonpath), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=child_env, cwd=cwd)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # emit_json writes the whole answer with one print
        t_answer = time.perf_counter()
        rest = proc.stdout.read()
        code = proc.wait()
        t_exit = time.perf_counter()
        if code != 0 or not first:
            err.seek(0)
            raise SystemExit(f"bench: `localllm run` failed ({code}):\n{err.read().decode(errors='replace')[-3000:]}")
    data = json.loads(first + rest)
    if not data.get("ok"):
        raise SystemExit(f"bench: `localllm run` answered not ok: {data}")
    return {"answer_s": t_answer - t0, "exit_s": t_exit - t0, "meta": data.get("meta", {})}


def run_raw(argv: list[str], env: dict[str, str], body: bytes) -> dict[str, Any]:
    """The server's own time: spawn, /health 200 (polled every 5 ms), one POST of ``body``."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            with httpx.Client(trust_env=False) as client:
                wait_raw_healthy(client, proc, base, t0, HEALTH_POLL)
                t_ready = time.perf_counter()
                reply = client.post(
                    base + "/v1/chat/completions", content=body, headers=RAW_HEADERS, timeout=httpx.Timeout(300.0)
                )
                reply.raise_for_status()
                data = reply.json()
                json.loads(data["choices"][0]["message"]["content"])
                t_answer = time.perf_counter()
        finally:
            stop_raw(proc)
    return {"answer_s": t_answer - t0, "ready_s": t_ready - t0, "usage": data.get("usage")}


# ---------------------------------------------------------------------------- report


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [row[key] for row in rows]
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--before", metavar="REF", help="also time `localllm run` from this git ref")
    parser.add_argument("--fake", action="store_true", help="the unit tests' fake llama-server (code path only)")
    parser.add_argument("--smoke", action="store_true", help="CI: 1 round, no warm-up runs (results to a temp file)")
    parser.add_argument("--json", type=Path, default=None, help="default: tests/bench/results/coldstart.json")
    args = parser.parse_args(argv)
    rounds = 1 if args.smoke else args.rounds
    out = args.json or results_path("coldstart", smoke=args.smoke or args.fake)
    res: dict[str, Any] = {**provenance(smoke=args.smoke), "rounds": rounds, "fake": args.fake, "before": args.before}

    with tempfile.TemporaryDirectory(prefix="bench-coldstart-") as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if args.fake:
            config_path = fake_config(tmp)
            env["LOCALLLM_CACHE_DIR"] = str(tmp / "cache")
            os.environ["LOCALLLM_CACHE_DIR"] = env["LOCALLLM_CACHE_DIR"]
        else:
            config_path = CONFIG
            prepare()  # the cached build and model (nothing downloaded); sets LOCALLLM_MIRROR
            env.update({k: v for k, v in os.environ.items() if k == "LOCALLLM_MIRROR"})
            from localllm import settings
            from localllm.managed import discovery

            if discovery.read_discovery(settings.cache_dir()) is not None:
                raise SystemExit("bench: a `localllm serve` runs on this cache; `localllm run` would attach to it")
        arms: dict[str, Any] = {}
        print("warm-up: one in-process start (argv, body, probe cache) …", file=sys.stderr, flush=True)
        ref = warm_up(load_config(config_path))
        res["argv"], res["body_bytes"] = ref["argv"], len(ref["body"])
        arms["localllm run"] = lambda: run_cli(REPO, config_path, env, tmp)
        if args.before:
            old = before_tree(args.before, tmp)
            arms[f"before ({args.before})"] = lambda: run_cli(old, config_path, env, tmp)
        arms["raw spawn+health+POST"] = lambda: run_raw(ref["argv"], ref["env"], ref["body"])
        names = list(arms)
        if not args.smoke:
            for name in names:  # untimed: page cache, bytecode of each tree
                print(f"warm-up: {name} …", file=sys.stderr, flush=True)
                arms[name]()
        records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            print(f"round {r + 1}/{rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
            for name in order:
                records[name].append(arms[name]())

    raw = records["raw spawn+health+POST"]
    raw_med = statistics.median(row["answer_s"] for row in raw)
    res["arms"] = {}
    for name in names:
        rows = records[name]
        entry: dict[str, Any] = {"answer": summary(rows, "answer_s"), "runs": rows}
        if "exit_s" in rows[0]:
            entry["exit"] = summary(rows, "exit_s")
            entry["ratio_answer_over_raw"] = entry["answer"]["median_s"] / raw_med
            entry["ratio_exit_over_raw"] = entry["exit"]["median_s"] / raw_med
            entry["ratio_answer_per_round_median"] = statistics.median(
                a["answer_s"] / b["answer_s"] for a, b in zip(rows, raw, strict=True)
            )
        else:
            entry["ready"] = summary(rows, "ready_s")
        res["arms"][name] = entry
    res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

    print(
        f"cold start, warm cache — {'FAKE server (code path only)' if args.fake else 'gemma-3-270m, demo gate'}; "
        f"{rounds} rounds, commit {res['commit']}; load avg {res['loadavg_start']} → {res['loadavg_end']}"
    )
    print(f"{'arm':<34}{'to answer s':>12}{'to exit s':>11}{'× raw':>8}{'× raw (exit)':>14}{'per-round ×':>13}")
    for name in names:
        e = res["arms"][name]
        exit_s = f"{e['exit']['median_s']:>11.3f}" if "exit" in e else f"{'':>11}"
        ratios = (
            f"{e['ratio_answer_over_raw']:>8.3f}{e['ratio_exit_over_raw']:>14.3f}{e['ratio_answer_per_round_median']:>13.3f}"
            if "exit" in e
            else f"{1.0:>8.3f}{'':>14}{'':>13}"
        )
        print(f"{name:<34}{e['answer']['median_s']:>12.3f}{exit_s}{ratios}")
    print(f"(raw: /health 200 after {res['arms']['raw spawn+health+POST']['ready']['median_s']:.3f} s median)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
