"""Benchmark: builtin.local_llm against the real llama-server + gemma-3-270m, side by side.

    python tests/bench/bench_local_llm.py [--quick] [--n N] [--json OUT]

All on the demo's triage gate (``examples/demo``: prompt, schema, grammar-constrained decide,
temperature 0, the same ticket every time):

(a) warm decide latency: ``Runtime.run_gate`` (with a trace, as the demo runs it, and without)
    vs a raw POST of the byte-identical body (checked) to the same sidecar over a persistent
    keep-alive ``httpx.Client``; the arms alternate every iteration (rotating order) after
    warm-ups. Overhead = p50(Runtime) / p50(raw) - 1. A second table repeats the three arms
    against an instant canned-answer HTTP stub, which isolates localllm's client-side cost
    from the model's run-to-run noise.
(b) 4 concurrent decides (threads, 4 different tickets) through the Runtime at ``--parallel 4``
    vs ``--parallel 1``: two sidecars, one after the other; median wall time per round.
(c) cold start, warm cache: a fresh Python process (localllm imported, nothing else) times
    ``Runtime(config)`` → first ``run_gate`` answer (cache check, sidecar spawn, /health, first
    decide), split at ``base_url()``; against the server's own time: the same argv spawned here
    with a fixed port, /health polled every 10 ms, plus a raw first decide. Rounds alternate
    which goes first. The server's start-up varies ±100 ms run to run, so a second figure
    subtracts what the server itself reports (its log clock at "listening on", its decide
    timings) from each wall time and compares what is left.
(d) tokens per decide (completion_tokens mean/min/max) and tokens/s (server decode rate and
    end to end), from (a).

Prints one table and writes ``tests/bench/results/local_llm.json`` (``--quick``: ``local_llm.quick.json``,
so a smoke run never overwrites the published figures). Not a test: no asserts on
speed. Uses the real user cache (the model is found through ``~/.cache/localllm-e2e/mirror``
like ``examples/demo/run_demo.py``; nothing is downloaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm import Runtime, load_config  # noqa: E402
from localllm.config import Config, LocalLLMDecl  # noqa: E402
from localllm.runtime import render_prompt  # noqa: E402
from localllm.wire import AskRequest  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DEMO = REPO / "examples" / "demo"
CONFIG = DEMO / "config.yaml"
MIRROR = Path.home() / ".cache" / "localllm-e2e" / "mirror"
RESULTS = Path(__file__).parent / "results" / "local_llm.json"
ALIAS = "agent.local"
GATE = "triage"
MODEL = "gemma-3-270m"
TICKET = "I was charged twice for my subscription this month, please refund one payment."
TICKETS = (
    TICKET,
    "The export button crashes the app every time I click it on Windows 11.",
    "It would be great if the dashboard could show weekly totals as well as monthly ones.",
    "How do I change the email address on my account?",
)
HEALTH_POLL = 0.010
#: llama.cpp log prefix: minutes.seconds.millis.micros since the server process started
_LOG_TS = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
CONCURRENT = 4
_TAIL = 1000


# ---------------------------------------------------------------------------- helpers


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "all_ms": [round(x, 2) for x in ms],
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def other_servers() -> int:
    """llama-server processes not started by this bench: they compete for the same cores."""
    import psutil

    mine = {child.pid for child in psutil.Process().children(recursive=True)}
    count = 0
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.info["pid"] not in mine and (proc.info["name"] or "").startswith("llama-server"):
            count += 1
    return count


def listening_ms(log: str) -> float | None:
    """When the server logged "listening on", by its own clock (ms since it started)."""
    for line in log.splitlines():
        if "listening on" in line:
            match = _LOG_TS.match(line.strip())
            if match:
                mins, secs, millis, micros = (int(g) for g in match.groups())
                return (mins * 60 + secs) * 1000 + millis + micros / 1000
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def with_agent(config: Config, **changes: Any) -> Config:
    decl = config.agents[ALIAS]
    assert isinstance(decl, LocalLLMDecl), decl
    return dataclasses.replace(config, agents={**config.agents, ALIAS: dataclasses.replace(decl, **changes)})


def prepare() -> tuple[Config, Any, Path]:
    """Warm cache check (nothing is downloaded): the demo config, the server, the model."""
    from localllm.managed import ensure_model, ensure_server

    if MIRROR.is_dir() and "LOCALLLM_MIRROR" not in os.environ:
        os.environ["LOCALLLM_MIRROR"] = str(MIRROR)
    install = ensure_server()
    model = ensure_model(MODEL)
    return load_config(CONFIG), install, model


def gate_body(runtime: Runtime, args: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """What the agent POSTs for the triage gate with ``args`` (``build_body``): the body,
    ``meta.grammar_source`` and the gate's schema."""
    gate = runtime.config.gates[GATE]
    agent = runtime.agent(ALIAS)
    assert gate.schema_path is not None
    schema = runtime.schemas.load(gate.schema_path)
    prompt = render_prompt(
        gate.prompt, {k: render_prompt(v, args, {}) if isinstance(v, str) else v for k, v in gate.args.items()}, {}
    )
    req = AskRequest(
        session_id="bench",
        turn=1,
        state_path=GATE,
        verb=gate.verb,
        prompt=prompt,
        call_id="0" * 16,
        deadline="2099-01-01T00:00:00.000000000Z",
        schema=schema,
    )
    body, source, _, _ = agent.build_body(req)  # type: ignore[attr-defined]
    return body, source, schema


def request_bytes(runtime: Runtime, ticket: str) -> bytes:
    """The exact bytes the agent POSTs for the triage gate (``build_body`` + httpx's encoder)."""
    body = gate_body(runtime, {"ticket": ticket})[0]
    # managed: the compiled grammar; endpoint (the stub arm): §9's response_format json_schema
    assert "grammar" in body or "response_format" in body, "the demo gate should be constrained"
    return httpx.Request("POST", "http://127.0.0.1/v1/chat/completions", json=body).content


def wait_raw_healthy(client: httpx.Client, proc: subprocess.Popen[bytes], base: str, t0: float, poll: float) -> None:
    """Poll a raw llama-server's ``/health`` until 200 (exits the bench if it dies or takes 300 s)."""
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"bench: raw llama-server exited with {proc.returncode}: {proc.args!r}")
        try:
            if client.get(base + "/health", timeout=httpx.Timeout(1.0)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.perf_counter() - t0 > 300:
            raise SystemExit("bench: raw llama-server not healthy in 300 s")
        time.sleep(poll)


def stop_raw(proc: subprocess.Popen[bytes]) -> None:
    """Stop a raw llama-server: SIGTERM, 5 s grace, SIGKILL."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


RAW_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def raw_decide(client: httpx.Client, url: str, payload: bytes) -> dict[str, Any]:
    """What a bare client does: POST, parse the reply, parse the answer."""
    reply = client.post(url, content=payload, headers=RAW_HEADERS, timeout=httpx.Timeout(300.0, connect=5.0))
    reply.raise_for_status()
    data: dict[str, Any] = reply.json()
    json.loads(data["choices"][0]["message"]["content"])
    return data


def interleave(arms: dict[str, Callable[[], dict[str, Any]]], n: int, warmup: int) -> dict[str, list[dict[str, Any]]]:
    """Run every arm ``warmup`` times (untimed), then ``n`` times each, rotating the order."""
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name]()
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i in range(n):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            start = time.perf_counter()
            info = arms[name]()
            info["s"] = time.perf_counter() - start
            records[name].append(info)
    return records


def runtime_arm(runtime: Runtime, ticket: str) -> Callable[[], dict[str, Any]]:
    def call() -> dict[str, Any]:
        result = runtime.run_gate(GATE, {"ticket": ticket})
        assert result.agent == ALIAS, result.agent
        return {"meta": result.meta}

    return call


def raw_arm(client: httpx.Client, url: str, payload: bytes) -> Callable[[], dict[str, Any]]:
    def call() -> dict[str, Any]:
        data = raw_decide(client, url, payload)
        usage = data.get("usage") or {}
        return {
            "meta": {
                "completion_tokens": usage.get("completion_tokens"),
                "prompt_tokens": usage.get("prompt_tokens"),
                "timings": data.get("timings"),
            }
        }

    return call


def summarize_arms(records: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = records[baseline]
    base_p50 = pct([r["s"] for r in base], 50)
    base_p95 = pct([r["s"] for r in base], 95)
    for name, recs in sorted(records.items(), key=lambda item: item[0] != baseline):
        secs = [r["s"] for r in recs]
        entry = stats_ms(secs)
        beyond = [r["s"] - _server_s(r["meta"]) for r in recs if (r["meta"].get("timings") or {}).get("predicted_ms")]
        if beyond:
            # wall time minus the server's own prompt+decode time: immune to the model's jitter
            entry["beyond_server_p50_ms"] = pct(beyond, 50) * 1000
        if name != baseline:
            paired = [(a["s"] - b["s"]) * 1000 for a, b in zip(recs, base, strict=True)]
            entry["overhead_p50_pct"] = (pct(secs, 50) / base_p50 - 1) * 100
            entry["overhead_p95_pct"] = (pct(secs, 95) / base_p95 - 1) * 100
            entry["paired_delta_median_ms"] = statistics.median(paired)
            entry["paired_delta_mean_ms"] = statistics.fmean(paired)
            if beyond and "beyond_server_p50_ms" in out.get(baseline, {}):
                entry["overhead_net_of_server_ms"] = (
                    entry["beyond_server_p50_ms"] - out[baseline]["beyond_server_p50_ms"]
                )
        out[name] = entry
    return out


# ---------------------------------------------------------------------------- (a) + (d)


def bench_warm(config: Config, n: int, warmup: int, tmp: Path) -> tuple[dict[str, Any], bytes]:
    with Runtime(config, trace=tmp / "warm-trace.jsonl") as traced, Runtime(config) as bare:
        agent = traced.agent(ALIAS)
        bare.register_agent(ALIAS, agent)  # one sidecar behind both runtimes and the raw client
        url = agent.base_url() + "/chat/completions"  # type: ignore[attr-defined]
        payload = request_bytes(traced, TICKET)
        sent: list[bytes] = []

        def capture(request: httpx.Request) -> None:
            sent.append(request.read())

        client_of_agent: httpx.Client = agent._http()  # type: ignore[attr-defined]
        client_of_agent.event_hooks["request"].append(capture)
        traced.run_gate(GATE, {"ticket": TICKET})
        client_of_agent.event_hooks["request"].remove(capture)
        if sent != [payload]:
            raise SystemExit("bench: the raw body differs from what the agent sent; the comparison would be unfair")
        with httpx.Client(trust_env=False) as client:
            records = interleave(
                {
                    "runtime_traced": runtime_arm(traced, TICKET),
                    "runtime_untraced": runtime_arm(bare, TICKET),
                    "raw_httpx": raw_arm(client, url, payload),
                },
                n,
                warmup,
            )
        argv = agent._server.argv()  # type: ignore[attr-defined]
    result = summarize_arms(records, "raw_httpx")
    result["body_bytes"] = len(payload)
    result["body_identical"] = True
    result["sidecar_argv"] = argv
    result["server_ms"] = stats_ms([_server_s(r["meta"]) for r in records["raw_httpx"]])
    return {"latency": result, "tokens": tokens(records)}, payload


def _server_s(meta: dict[str, Any]) -> float:
    t = meta.get("timings") or {}
    return float(t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0)) / 1000


def tokens(records: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    recs = [r for arm in records.values() for r in arm]
    completion = [int(r["meta"]["completion_tokens"]) for r in recs]
    prompt = [int(r["meta"]["prompt_tokens"]) for r in recs]
    decode = [float(r["meta"]["timings"]["predicted_per_second"]) for r in recs if r["meta"].get("timings")]
    e2e = [int(r["meta"]["completion_tokens"]) / r["s"] for r in recs]
    cached = [int(r["meta"]["timings"].get("cache_n", 0)) for r in recs if r["meta"].get("timings")]
    return {
        "decides": len(recs),
        "completion_tokens": {"mean": statistics.fmean(completion), "min": min(completion), "max": max(completion)},
        "prompt_tokens": {"mean": statistics.fmean(prompt), "min": min(prompt), "max": max(prompt)},
        "prompt_tokens_cached_mean": statistics.fmean(cached) if cached else None,
        "decode_tokens_per_s_server": {"median": statistics.median(decode), "min": min(decode), "max": max(decode)}
        if decode
        else None,
        "tokens_per_s_end_to_end": {"median": statistics.median(e2e), "min": min(e2e), "max": max(e2e)},
    }


# ---------------------------------------------------------------------------- client-side cost (stub)


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answer = b""

    def setup(self) -> None:
        super().setup()
        # One segment per reply and no Nagle: otherwise the reply's second write waits for
        # the client's delayed ACK (40 ms on Linux) and swamps what is being measured.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(self.answer)}\r\n\r\n"
        ).encode()
        self.wfile.write(head + self.answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def bench_stub(config: Config, n: int, tmp: Path) -> dict[str, Any]:
    """The same three arms against an instant server answering a real-shaped reply."""
    answer = {
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "content": '{"queue":"billing","priority":1,"summary":"Customer was charged twice; wants a refund."}',
                },
            }
        ],
        "usage": {"prompt_tokens": 165, "completion_tokens": 40, "total_tokens": 205},
    }
    handler = type("Handler", (_StubHandler,), {"answer": json.dumps(answer).encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    stub_config = with_agent(config, endpoint=endpoint)
    try:
        with (
            Runtime(stub_config, trace=tmp / "stub-trace.jsonl") as traced,
            Runtime(stub_config) as bare,
            httpx.Client(trust_env=False) as client,
        ):
            payload = request_bytes(bare, TICKET)
            records = interleave(
                {
                    "runtime_traced": runtime_arm(traced, TICKET),
                    "runtime_untraced": runtime_arm(bare, TICKET),
                    "raw_httpx": raw_arm(client, endpoint + "/v1/chat/completions", payload),
                },
                n,
                warmup=5,
            )
    finally:
        server.shutdown()
        server.server_close()
    return summarize_arms(records, "raw_httpx")


# ---------------------------------------------------------------------------- (b)


def bench_concurrency(config: Config, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for parallel in (4, 1):  # one sidecar at a time: 2 cores
        walls: list[float] = []
        completion: list[int] = []
        with Runtime(with_agent(config, parallel=parallel)) as runtime:
            runtime.agent(ALIAS).base_url()  # type: ignore[attr-defined]  # start it; not timed
            for r in range(rounds + 1):  # round 0 warms every slot
                results: list[Any] = [None] * CONCURRENT
                barrier = threading.Barrier(CONCURRENT + 1)

                def work(i: int, results: list[Any] = results, barrier: threading.Barrier = barrier) -> None:
                    barrier.wait()
                    results[i] = runtime.run_gate(GATE, {"ticket": TICKETS[i]})

                threads = [threading.Thread(target=work, args=(i,)) for i in range(CONCURRENT)]
                for t in threads:
                    t.start()
                barrier.wait()
                start = time.perf_counter()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - start
                if any(res is None for res in results):
                    raise SystemExit(f"bench: a concurrent decide failed at --parallel {parallel}")
                if r:
                    walls.append(wall)
                    completion.append(sum(int(res.meta["completion_tokens"]) for res in results))
            argv = runtime.agent(ALIAS)._server.argv()  # type: ignore[attr-defined]
        out[f"parallel_{parallel}"] = {
            "wall_ms": [round(w * 1000, 1) for w in walls],
            "median_wall_ms": statistics.median(walls) * 1000,
            "completion_tokens_per_round": completion,
            "aggregate_tokens_per_s": statistics.median(c / w for c, w in zip(completion, walls, strict=True)),
            "argv": argv,
        }
    out["rounds"] = rounds
    out["speedup_p1_over_p4"] = out["parallel_1"]["median_wall_ms"] / out["parallel_4"]["median_wall_ms"]
    return out


# ---------------------------------------------------------------------------- (c)


#: The cold-start child: a fresh interpreter that has imported nothing of localllm (nor httpx,
#: jsonschema, …) before the clock starts, so first-call imports count as they would for a user.
COLD_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
from localllm import Runtime, load_config
t_import = time.perf_counter()
config = load_config(sys.argv[1])
t_config = time.perf_counter()
with Runtime(config, trace=sys.argv[2] + "/cold-trace.jsonl") as runtime:
    t0 = time.perf_counter()
    agent = runtime.agent(sys.argv[3])
    agent.base_url()  # what the first ask does first: cache check, spawn, /health
    t1 = time.perf_counter()
    log = agent._server.stderr_tail(int(sys.argv[6]))
    result = runtime.run_gate(sys.argv[4], {"ticket": sys.argv[5]})
    t2 = time.perf_counter()
    argv = agent._server.argv()
print(json.dumps({
    "import_ms": (t_import - t_start) * 1000, "load_config_ms": (t_config - t_import) * 1000,
    "ready_ms": (t1 - t0) * 1000, "first_decide_ms": (t2 - t1) * 1000, "first_call_ms": (t2 - t0) * 1000,
    "meta": result.meta, "log": log, "argv": argv,
}))
"""


def run_cold_child(tmp: Path) -> dict[str, Any]:
    """Time ``Runtime(config)`` → first answer in a fresh interpreter (split at ``base_url()``)."""
    cmd = [sys.executable, "-c", COLD_CHILD, str(CONFIG), str(tmp), ALIAS, GATE, TICKET, str(_TAIL)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=tmp)
    if proc.returncode != 0:
        raise SystemExit(f"bench: cold-start child failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    meta, log = data.pop("meta"), data.pop("log")
    data["server_listening_ms"] = listening_ms(log)
    data["first_decide_server_ms"] = _server_s(meta) * 1000
    data["completion_tokens"] = meta.get("completion_tokens")
    return data


def raw_cold(argv: list[str], env: dict[str, str], payload: bytes, tmp: Path) -> dict[str, Any]:
    """The server's own time: spawn, /health 200 (polled every 10 ms), then one raw decide."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    base = f"http://127.0.0.1:{port}"
    log_path = tmp / "raw-server.log"
    with httpx.Client(trust_env=False) as client, log_path.open("wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True
        )
        try:
            wait_raw_healthy(client, proc, base, t0, HEALTH_POLL)
            t1 = time.perf_counter()
            data = raw_decide(client, base + "/v1/chat/completions", payload)
            t2 = time.perf_counter()
        finally:
            stop_raw(proc)
    return {
        "ready_ms": (t1 - t0) * 1000,
        "first_decide_ms": (t2 - t1) * 1000,
        "total_ms": (t2 - t0) * 1000,
        "server_listening_ms": listening_ms(log_path.read_text(encoding="utf-8", errors="replace")),
        "first_decide_server_ms": _server_s({"timings": data.get("timings")}) * 1000,
        "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
    }


def bench_cold(install: Any, payload: bytes, rounds: int, tmp: Path) -> dict[str, Any]:
    from localllm.managed import server_env

    env = {k: v for k, v in server_env(install.release_dir).items() if not k.startswith("LLAMA_")}
    ours: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    argv: list[str] | None = None
    for r in range(rounds):
        for which in ("ours", "raw") if r % 2 == 0 else ("raw", "ours"):
            if which == "ours":
                ours.append(run_cold_child(tmp))
                argv = argv or ours[-1]["argv"]
            else:
                if argv is None:  # the raw side needs the argv the sidecar uses
                    ours.append(run_cold_child(tmp))
                    argv = ours[-1]["argv"]
                raw.append(raw_cold(argv, env, payload, tmp))

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(row[key]) for row in rows)

    ours_first, raw_total = med(ours, "first_call_ms"), med(raw, "total_ms")
    for row in ours + raw:
        # Wall time not spent by the server itself: before/after its clock (spawn, detection of
        # readiness) and around the first decide (client work, first-call imports, trace).
        row["beyond_server_ms"] = (
            row["ready_ms"]
            - (row["server_listening_ms"] or 0.0)
            + row["first_decide_ms"]
            - row["first_decide_server_ms"]
        )
    return {
        "rounds": rounds,
        "localllm": {
            k: med(ours, k)
            for k in (
                "first_call_ms",
                "ready_ms",
                "first_decide_ms",
                "import_ms",
                "load_config_ms",
                "server_listening_ms",
                "first_decide_server_ms",
            )
        },
        "server_own": {
            k: med(raw, k)
            for k in ("total_ms", "ready_ms", "first_decide_ms", "server_listening_ms", "first_decide_server_ms")
        },
        "overhead_ms": ours_first - raw_total,
        "overhead_ready_ms": med(ours, "ready_ms") - med(raw, "ready_ms"),
        "overhead_first_decide_ms": med(ours, "first_decide_ms") - med(raw, "first_decide_ms"),
        "beyond_server_ms": {"localllm": med(ours, "beyond_server_ms"), "raw": med(raw, "beyond_server_ms")},
        "overhead_net_of_server_noise_ms": med(ours, "beyond_server_ms") - med(raw, "beyond_server_ms"),
        "runs_localllm": [{k: v for k, v in row.items() if k != "argv"} for row in ours],
        "runs_server_own": raw,
        "argv": argv,
    }


# ---------------------------------------------------------------------------- report


def table(res: dict[str, Any]) -> str:
    a, stub, b, c, d = res["a_warm"], res["a_stub"], res["b_concurrency"], res["c_cold"], res["d_tokens"]
    rows = [
        f"local_llm bench — {MODEL}, demo triage gate, grammar decide, temperature 0 "
        f"(load avg before {res['loadavg_before']}, after {res['loadavg_after']}; other llama-servers running "
        f"before/after: {res['other_llama_servers_before']}/{res['other_llama_servers_after']})",
        "",
    ]
    rows.append(
        f"(a) warm decide, N={a['raw_httpx']['n']} per arm, interleaved   p50 ms    p95 ms   "
        "p50 ovh   paired Δ median   beyond server p50 (Δ)"
    )
    for name in ("raw_httpx", "runtime_traced", "runtime_untraced"):
        e = a[name]
        extra = (
            f"{'':24}"
            if name == "raw_httpx"
            else (f"{e['overhead_p50_pct']:+7.2f} %   {e['paired_delta_median_ms']:+8.1f} ms     ")
        )
        net = f"{e['beyond_server_p50_ms']:7.1f} ms" + (
            f" ({e['overhead_net_of_server_ms']:+.1f})" if "overhead_net_of_server_ms" in e else ""
        )
        rows.append(f"    {name:<44}{e['p50_ms']:9.1f} {e['p95_ms']:9.1f}   {extra}{net}")
    rows.append(
        f"    (server-reported prompt+decode time: p50 {a['server_ms']['p50_ms']:.1f} ms; "
        f"body {a['body_bytes']} bytes, byte-identical)"
    )
    rows.append(
        f"    client-side cost vs an instant stub, N={stub['raw_httpx']['n']}:  raw "
        f"{stub['raw_httpx']['p50_ms']:.2f} ms p50; runtime traced {stub['runtime_traced']['p50_ms']:.2f} "
        f"(Δ {stub['runtime_traced']['paired_delta_median_ms']:+.2f}); untraced "
        f"{stub['runtime_untraced']['p50_ms']:.2f} (Δ {stub['runtime_untraced']['paired_delta_median_ms']:+.2f})"
    )
    p4, p1 = b["parallel_4"], b["parallel_1"]
    rows += [
        "",
        f"(b) {CONCURRENT} concurrent decides, {b['rounds']} rounds      median wall ms   agg tok/s",
        f"    --parallel 4                                 {p4['median_wall_ms']:9.1f}   "
        f"{p4['aggregate_tokens_per_s']:8.1f}",
        f"    --parallel 1                                 {p1['median_wall_ms']:9.1f}   "
        f"{p1['aggregate_tokens_per_s']:8.1f}",
        f"    wall-time ratio p1/p4                        {b['speedup_p1_over_p4']:9.2f}x",
    ]
    lo, so = c["localllm"], c["server_own"]
    rows += [
        "",
        f"(c) cold start, warm cache, {c['rounds']} rounds (medians)   ready ms   1st decide ms   total ms",
        f"    localllm fresh Runtime → first answer        {lo['ready_ms']:8.1f}   {lo['first_decide_ms']:13.1f}"
        f"   {lo['first_call_ms']:8.1f}",
        f"    server's own (spawn→/health 200) + raw POST  {so['ready_ms']:8.1f}   {so['first_decide_ms']:13.1f}"
        f"   {so['total_ms']:8.1f}",
        f"    localllm overhead                            {c['overhead_ready_ms']:+8.1f}   "
        f"{c['overhead_first_decide_ms']:+13.1f}   {c['overhead_ms']:+8.1f}",
        f"    net of the server's own run-to-run noise (wall − server's log clock to 'listening' − server "
        f"decide time): localllm {c['beyond_server_ms']['localllm']:.1f} ms, raw "
        f"{c['beyond_server_ms']['raw']:.1f} ms → overhead {c['overhead_net_of_server_noise_ms']:+.1f} ms",
        f"    (not in the figures: import localllm {lo['import_ms']:.0f} ms, load_config {lo['load_config_ms']:.0f} ms)",
    ]
    ct, dec, e2e = d["completion_tokens"], d["decode_tokens_per_s_server"], d["tokens_per_s_end_to_end"]
    rows += [
        "",
        f"(d) tokens per decide over {d['decides']} decides: completion mean {ct['mean']:.1f} "
        f"(min {ct['min']}, max {ct['max']}); prompt {d['prompt_tokens']['mean']:.0f} "
        f"({d['prompt_tokens_cached_mean']:.0f} cached)",
        f"    decode tok/s (server) median {dec['median']:.1f} (min {dec['min']:.1f}, max {dec['max']:.1f}); "
        f"end to end median {e2e['median']:.1f}",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N, one round each")
    parser.add_argument("--smoke", action="store_true", help="CI: every part at its smallest (results to a temp file)")
    parser.add_argument("--n", type=int, default=None, help="timed decides per arm in (a) (default 20; quick 3)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"output (default {RESULTS.relative_to(REPO)}; --quick: local_llm.quick.json)",
    )
    args = parser.parse_args(argv)
    small = args.quick or args.smoke
    n = args.n or (2 if args.smoke else 3 if args.quick else 20)
    warmup = 1 if small else 2
    b_rounds = 1 if small else 3
    c_rounds = 1 if small else 5
    stub_n = 20 if args.smoke else 30 if args.quick else 300

    out = args.json or results_path("local_llm", smoke=args.smoke, quick=args.quick)
    started = time.perf_counter()
    config, install, model = prepare()
    res: dict[str, Any] = {
        **provenance(smoke=args.smoke),
        "model": MODEL,
        "model_path": str(model),
        "server": str(install.binary),
        "server_release": install.release,
        "quick": args.quick,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg(),
        "other_llama_servers_before": other_servers(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-local-llm-") as tmp_name:
        tmp = Path(tmp_name)
        print("(a)+(d) warm decides …", file=sys.stderr, flush=True)
        warm, payload = bench_warm(config, n, warmup, tmp)
        res["a_warm"], res["d_tokens"] = warm["latency"], warm["tokens"]
        print("(a) client-side cost against a stub …", file=sys.stderr, flush=True)
        res["a_stub"] = bench_stub(config, stub_n, tmp)
        print("(b) concurrency …", file=sys.stderr, flush=True)
        res["b_concurrency"] = bench_concurrency(config, b_rounds)
        print("(c) cold start …", file=sys.stderr, flush=True)
        res["c_cold"] = bench_cold(install, payload, c_rounds, tmp)
    res["loadavg_after"] = loadavg()
    res["other_llama_servers_after"] = other_servers()
    res["bench_seconds"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    print(table(res))
    print(f"\nwrote {out} ({res['bench_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
