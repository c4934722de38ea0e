"""Benchmark: ``localllm serve`` against per-process sidecars, side by side in one run.

    python tests/bench/bench_service.py [--quick | --smoke] [--n N] [--front-only] [--baseline DIR] [--json OUT]

Real llama-server (``LOCALLLM_TEST_SERVER_BIN`` or the cached build) and gemma-3-270m (found
through ``~/.cache/localllm-e2e/mirror``, fetched into a temporary cache, nothing downloaded),
the demo's triage gate (grammar-constrained decide, temperature 0):

(a) a fresh Python process's first decide (``Runtime(config).run_gate``), wall time from
    ``Popen`` to exit: attached to a running service vs spawning its own sidecar
    (``service: never``); the arms alternate every round. Also the attach's own
    time-to-ready (``localllm.service.attach`` inside the child, discovery + /health).
    Goals: attached ≤ 0.5× wall; attach ≤ 50 ms.
(b) 4 processes × 4 concurrent decides (threads): one shared server (``--parallel 4``, in
    the service) vs 4 per-process sidecars (``parallel: 4`` each). Wall time for all 16,
    and the summed peak RSS of the llama-server processes (sampled every 20 ms).
    Goals: ≥ 1.5× faster; ≤ 0.4× RSS.
(c) proxy overhead per request: the same small request (``POST /tokenize``, which the server
    answers in well under a millisecond, so the hop is not lost in decode noise) through the
    service vs straight to the service's own llama-server, alternating, over keep-alive
    clients. Goal: ≤ 1 ms median (it was +0.62 ms on the stdlib front).
(d) the HTTP front, side by side with the stdlib ``http.server`` front it replaced (the same
    measurements on ``--baseline DIR``, a checkout of the previous front; default: none):
    per-request overhead as in (c); p50/p99 of ``/tokenize`` under 32 concurrent keep-alive
    clients (via the service and direct); the service's RSS with 1,500 idle connections
    (half of them stalled mid-header) against its RSS before, a normal client's median
    latency while they are open, and the first answer after they all hang up.
    Goals: ≤ 50 ms extra while they are open; next answer ≤ 1 s.

``--smoke`` runs (c) and (d) with tiny counts (a check that the bench still works, not a
measurement); ``--front-only`` skips (a) and (b).

Prints one table and writes ``tests/bench/results/service.json`` (``--quick``:
``service.quick.json``; ``--front-only``: ``service_front.json``; ``--smoke``: a temporary
file). Not a test: no asserts on speed.
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
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.managed import discovery  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DEMO = REPO / "examples" / "demo"
MIRROR = Path.home() / ".cache" / "localllm-e2e" / "mirror"
MODEL = "gemma-3-270m"
TICKETS = (
    "I was charged twice for my subscription this month, please refund one payment.",
    "The export button crashes the app every time I click it on Windows 11.",
    "It would be great if the dashboard could show weekly totals as well as monthly ones.",
    "How do I change the email address on my account?",
)

#: one fresh process: first decide of the demo gate, timing the attach on the way
_FIRST_DECIDE = textwrap.dedent("""
    import json, sys, time
    t0 = time.monotonic()
    from localllm import Runtime, load_config
    from localllm.managed.upstream import attach
    config = load_config(sys.argv[1])
    decl = config.agents["agent.local"]
    a0 = time.monotonic()
    found = attach(decl.model, policy=decl.service, server_bin=decl.server_bin, base_dir=config.base_dir)
    attach_ms = (time.monotonic() - a0) * 1000
    with Runtime(config) as rt:
        result = rt.run_gate("triage", {"ticket": sys.argv[2]})
    print(json.dumps({"served_by": result.meta.get("served_by"), "attach_ms": attach_ms,
                      "found": found is not None, "in_process_s": time.monotonic() - t0}))
""")

#: one process of (b): CONCURRENT decides on threads
_CONCURRENT = textwrap.dedent("""
    import json, sys, threading
    from localllm import Runtime, load_config
    tickets = json.loads(sys.argv[2])
    with Runtime(load_config(sys.argv[1])) as rt:
        results = [None] * len(tickets)
        def one(i):
            results[i] = rt.run_gate("triage", {"ticket": tickets[i]}).meta.get("served_by")
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(tickets))]
        for t in threads: t.start()
        for t in threads: t.join()
    print(json.dumps(results))
""")


def _config(tmp: Path, name: str, *, service: str, parallel: int, max_tokens: int = 96) -> Path:
    target = tmp / name
    text = (DEMO / "config.yaml").read_text()
    text = text.replace("    parallel: 2\n", f"    parallel: {parallel}\n    service: {service}\n")
    text = text.replace("    max_tokens: 96\n", f"    max_tokens: {max_tokens}\n")
    target.write_text(text)
    for sub in ("prompts", "schemas", "evals"):  # evals: the queue gate's labelled examples
        if not (tmp / sub).exists():
            shutil.copytree(DEMO / sub, tmp / sub)
    return target


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"LOCALLLM_CACHE_DIR": str(cache), "LOCALLLM_MIRROR": str(MIRROR), "LOCALLLM_OFFLINE": "0"})
    server = os.environ.get("LOCALLLM_TEST_SERVER_BIN")
    if not server:  # the build in the real user cache (the temporary cache has none)
        from localllm.managed import ensure_server

        server = str(ensure_server().binary)
    env["LOCALLLM_SERVER_BIN"] = server
    return env


class Service:
    def __init__(self, env: dict[str, str], cache: Path, config: Path, *extra: str, code: Path = REPO) -> None:
        self.log = open(cache.parent / "serve.log", "ab")  # noqa: SIM115 - closed in stop()
        if code != REPO:  # the baseline front: that checkout's localllm first on the path
            env = {**env, "PYTHONPATH": str(code)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "localllm",
                "serve",
                "--port",
                "0",
                "--config",
                str(config),
                "--keep-alive",
                "-1",
                *extra,
            ],
            cwd=code,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = discovery.read_discovery(cache)
            if found is not None and found.pid == self.proc.pid:
                self.found = found
                self.token = discovery.read_token(found.token_file)
                return
            if self.proc.poll() is not None:
                raise SystemExit("localllm serve exited:\n" + Path(self.log.name).read_text()[-2000:])
            time.sleep(0.05)
        raise SystemExit("localllm serve did not start")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def warm(self, body: dict[str, Any]) -> None:
        httpx.post(
            self.found.url + "/v1/chat/completions", json=body, headers=self.headers(), timeout=300, trust_env=False
        ).raise_for_status()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _llama_rss(root_pids: list[int]) -> int:
    total = 0
    for pid in root_pids:
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                if proc.name().startswith("llama-server"):
                    total += proc.memory_info().rss
            except psutil.Error:
                pass
    return total


def _first_decide(env: dict[str, str], config: Path, ticket: str) -> dict[str, Any]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_DECIDE, str(config), ticket],
        cwd=REPO,
        env=env,
        capture_output=True,
        check=True,
        timeout=600,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    data["wall_s"] = time.monotonic() - started
    return data


def bench_first_decide(env: dict[str, str], attached: Path, own: Path, n: int) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {"attached": [], "sidecar": []}
    for i in range(n):
        order = [("attached", attached), ("sidecar", own)]
        if i % 2:
            order.reverse()
        for name, config in order:
            rows[name].append(_first_decide(env, config, TICKETS[i % len(TICKETS)]))
    assert all(r["served_by"] == "service" for r in rows["attached"]), rows["attached"]
    assert all(r["served_by"] == "sidecar" for r in rows["sidecar"]), rows["sidecar"]
    att = statistics.median(r["wall_s"] for r in rows["attached"])
    own_s = statistics.median(r["wall_s"] for r in rows["sidecar"])
    return {
        "attached_wall_s": att,
        "sidecar_wall_s": own_s,
        "ratio": att / own_s,
        "attach_ms_median": statistics.median(r["attach_ms"] for r in rows["attached"]),
        "n": n,
    }


def _concurrent_round(env: dict[str, str], config: Path, watch: list[int]) -> tuple[float, int]:
    peak = [0]
    done = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _llama_rss(watch + [p.pid for p in procs]))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    started = time.monotonic()
    procs.extend(
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT, str(config), json.dumps(TICKETS)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    )
    sampler.start()
    outs = [p.communicate(timeout=900) for p in procs]
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    for proc, (_, err) in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            raise SystemExit(err.decode()[-2000:])
    return wall, peak[0]


def bench_concurrent(env: dict[str, str], service: Service, shared: Path, own: Path, n: int) -> dict[str, Any]:
    walls: dict[str, list[float]] = {"service": [], "sidecars": []}
    peaks: dict[str, list[int]] = {"service": [], "sidecars": []}
    for i in range(n):
        order = [("service", shared, [service.proc.pid]), ("sidecars", own, [])]
        if i % 2:
            order.reverse()
        for name, config, watch in order:
            wall, peak = _concurrent_round(env, config, watch)
            walls[name].append(wall)
            peaks[name].append(peak)
    svc, side = statistics.median(walls["service"]), statistics.median(walls["sidecars"])
    rss_svc, rss_side = max(peaks["service"]), max(peaks["sidecars"])
    return {
        "service_wall_s": svc,
        "sidecars_wall_s": side,
        "speedup": side / svc,
        "service_peak_rss": rss_svc,
        "sidecars_peak_rss": rss_side,
        "rss_ratio": rss_svc / rss_side if rss_side else None,
        "n": n,
    }


def bench_proxy(service: Service, n: int) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=120, headers=service.headers()) as http:
        ps = http.get(service.found.url + "/localllm/ps").json()["models"]
        (row,) = [m for m in ps if m["id"] == MODEL]
    # the direct arm talks to the very llama-server the service proxies to, with the key the
    # service gave it (readable from that process's environment by the same user)
    direct_url = f"http://127.0.0.1:{row['port']}"
    # /tokenize costs the server well under a millisecond, so the hop is not lost in decode noise
    body = {"model": MODEL, "content": "Route this ticket to billing or support."}
    via: list[float] = []
    direct: list[float] = []
    with httpx.Client(trust_env=False, timeout=120) as http:
        key = _upstream_key(service)
        for i in range(n + 3):
            arms = [
                ("via", service.found.url, service.headers()),
                ("direct", direct_url, {"Authorization": f"Bearer {key}"}),
            ]
            if i % 2:
                arms.reverse()
            for name, url, headers in arms:
                t0 = time.perf_counter()
                http.post(url + "/tokenize", json=body, headers=headers).raise_for_status()
                ms = (time.perf_counter() - t0) * 1000
                if i >= 3:  # warm-ups dropped
                    (via if name == "via" else direct).append(ms)
    return {
        "via_ms_median": statistics.median(via),
        "direct_ms_median": statistics.median(direct),
        "overhead_ms": statistics.median(via) - statistics.median(direct),
        "n": n,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _concurrent_arm(
    url: str, headers: dict[str, str], body: dict[str, Any], clients: int, per_client: int
) -> dict[str, Any]:
    times: list[float] = []
    failures = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def one() -> None:
        mine: list[float] = []
        with httpx.Client(trust_env=False, timeout=120, headers=headers) as http:
            barrier.wait()
            for _ in range(per_client):
                t0 = time.perf_counter()
                try:
                    http.post(url + "/tokenize", json=body).raise_for_status()
                    mine.append((time.perf_counter() - t0) * 1000)
                except httpx.HTTPError:
                    with lock:
                        failures[0] += 1
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "p50_ms": _pct(times, 0.5) if times else None,
        "p99_ms": _pct(times, 0.99) if times else None,
        "failures": failures[0],
    }


def bench_concurrency(service: Service, clients: int, per_client: int) -> dict[str, Any]:
    """p50/p99 of /tokenize with ``clients`` concurrent keep-alive clients: via the service, then direct."""
    with httpx.Client(trust_env=False, timeout=120, headers=service.headers()) as http:
        (row,) = [m for m in http.get(service.found.url + "/localllm/ps").json()["models"] if m["id"] == MODEL]
    key = _upstream_key(service)
    body = {"model": MODEL, "content": "Route this ticket to billing or support."}
    result: dict[str, Any] = {"clients": clients, "per_client": per_client}
    arms = (
        ("via", service.found.url, service.headers()),
        ("direct", f"http://127.0.0.1:{row['port']}", {"Authorization": f"Bearer {key}"}),
    )
    for name, url, headers in arms:
        result[name] = _concurrent_arm(url, headers, body, clients, per_client)
    return result


def bench_idle_connections(service: Service, count: int, probes: int) -> dict[str, Any]:
    """The service's RSS and a normal client's latency with ``count`` idle connections open."""
    proc = psutil.Process(service.proc.pid)
    body = {"model": MODEL, "content": "hi"}

    def probe(http: httpx.Client) -> float:
        times = []
        for _ in range(probes):
            t0 = time.perf_counter()
            http.post(service.found.url + "/tokenize", json=body).raise_for_status()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    import socket

    with httpx.Client(trust_env=False, timeout=120, headers=service.headers()) as http:
        before_ms = probe(http)
    time.sleep(0.5)
    rss_before = proc.memory_info().rss
    socks = []
    try:
        for i in range(count):
            s = socket.create_connection(("127.0.0.1", service.found.port), timeout=10)
            if i % 2:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len")
            socks.append(s)
        time.sleep(1.0)
        rss_open = proc.memory_info().rss
        threads = proc.num_threads()
        with httpx.Client(trust_env=False, timeout=120, headers=service.headers()) as http:
            during_ms = probe(http)
    finally:
        for s in socks:
            s.close()
    time.sleep(0.2)
    with httpx.Client(trust_env=False, timeout=120, headers=service.headers()) as http:
        t0 = time.perf_counter()
        http.post(service.found.url + "/tokenize", json=body).raise_for_status()
        after_ms = (time.perf_counter() - t0) * 1000
    return {
        "connections": count,
        "rss_before": rss_before,
        "rss_open": rss_open,
        "kib_per_connection": (rss_open - rss_before) / 1024 / count,
        "threads_open": threads,
        "latency_before_ms": before_ms,
        "latency_during_ms": during_ms,
        "extra_ms": during_ms - before_ms,
        "next_answer_after_hangup_ms": after_ms,
    }


def bench_front(env: dict[str, str], cache: Path, config: Path, code: Path, *, smoke: bool, n: int) -> dict[str, Any]:
    """(c) and (d) on the front of ``code`` (this checkout or a baseline)."""
    service = Service(env, cache, config, code=code)
    try:
        service.warm({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        return {
            "proxy": bench_proxy(service, 20 if smoke else 200 * n),
            "concurrency": bench_concurrency(service, 4 if smoke else 32, 5 if smoke else 50),
            "idle": bench_idle_connections(service, 100 if smoke else 1500, 5 if smoke else 50),
        }
    finally:
        service.stop()


def _upstream_key(service: Service) -> str:
    """The key the service gave its llama-servers (read from the server's environment: same user)."""
    for proc in psutil.Process(service.proc.pid).children(recursive=True):
        try:
            if proc.name().startswith("llama-server"):
                return proc.environ()["LLAMA_API_KEY"]
        except (psutil.Error, KeyError):
            continue
    raise SystemExit("no llama-server under the service")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of (a) and (b), 50 requests in (c)")
    parser.add_argument("--n", type=int, default=None, help="rounds of (a) and (b); (c) uses 200×N requests")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="(c) and (d) with tiny counts: does the bench still run")
    parser.add_argument("--front-only", action="store_true", help="only (c) and (d), the HTTP front")
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a checkout whose front (d) is measured side by side"
    )
    args = parser.parse_args(argv)
    if args.smoke or args.front_only:
        return _front_main(args)
    n = args.n or (1 if args.quick else 5)
    out = args.json or results_path("service", quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmpdir:
        tmp = Path(tmpdir)
        cache = tmp / "cache"
        env = _env(cache)
        shared = _config(tmp, "shared.yaml", service="required", parallel=4)
        own = _config(tmp, "own.yaml", service="never", parallel=4)
        service = Service(env, cache, shared)
        try:
            service.warm({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            first = bench_first_decide(env, shared, own, n)
            concurrent = bench_concurrent(env, service, shared, own, n)
            proxy = bench_proxy(service, 50 if args.quick else 200 * n)
        finally:
            service.stop()
    result = {**provenance(), "first_decide": first, "concurrent": concurrent, "proxy": proxy}
    rows = [
        (
            "(a) first decide, fresh process: attached / own sidecar",
            f"{first['attached_wall_s']:.2f} s / {first['sidecar_wall_s']:.2f} s",
            f"{first['ratio']:.2f}x",
            "<= 0.5x",
        ),
        ("(a) attach time-to-ready (median)", f"{first['attach_ms_median']:.1f} ms", "", "<= 50 ms"),
        (
            "(b) 4 proc x 4 decides, wall: service / 4 sidecars",
            f"{concurrent['service_wall_s']:.2f} s / {concurrent['sidecars_wall_s']:.2f} s",
            f"{concurrent['speedup']:.2f}x faster",
            ">= 1.5x",
        ),
        (
            "(b) summed peak llama-server RSS: service / 4 sidecars",
            f"{concurrent['service_peak_rss'] / 2**20:.0f} / {concurrent['sidecars_peak_rss'] / 2**20:.0f} MiB",
            f"{concurrent['rss_ratio']:.2f}x" if concurrent["rss_ratio"] else "-",
            "<= 0.4x",
        ),
        (
            "(c) one request: via service / direct (median)",
            f"{proxy['via_ms_median']:.1f} / {proxy['direct_ms_median']:.1f} ms",
            f"+{proxy['overhead_ms']:.2f} ms",
            "<= 1 ms",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value, ratio, goal in rows:
        print(f"{label.ljust(width)}  {value:>24}  {ratio:>14}  goal {goal}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def _front_main(args: argparse.Namespace) -> int:
    n = args.n or 1
    out = args.json or results_path("service_front", smoke=args.smoke)
    result: dict[str, Any] = provenance(smoke=args.smoke)
    arms = [("new", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="bench-service-front-") as tmpdir:
        tmp = Path(tmpdir)
        cache = tmp / "cache"
        env = _env(cache)
        config = _config(tmp, "shared.yaml", service="required", parallel=4)
        for name, code in arms:
            result[name] = bench_front(env, cache, config, code, smoke=args.smoke, n=n)
    for name, _ in arms:
        r = result[name]
        c, i = r["concurrency"], r["idle"]
        print(f"[{name}]")
        print(
            f"  (c) via / direct median        {r['proxy']['via_ms_median']:.2f} / {r['proxy']['direct_ms_median']:.2f} ms"
            f"  overhead +{r['proxy']['overhead_ms']:.2f} ms   goal <= 1 ms"
        )
        print(
            f"  (d) {c['clients']} clients p50 / p99       via {c['via']['p50_ms']:.1f} / {c['via']['p99_ms']:.1f} ms"
            f"  direct {c['direct']['p50_ms']:.1f} / {c['direct']['p99_ms']:.1f} ms"
            f"  failures {c['via']['failures']}/{c['direct']['failures']}"
        )
        print(
            f"  (d) {i['connections']} idle conns: RSS {i['rss_before'] / 2**20:.0f} -> {i['rss_open'] / 2**20:.0f} MiB"
            f" ({i['kib_per_connection']:.1f} KiB each, {i['threads_open']} threads);"
            f" latency {i['latency_before_ms']:.2f} -> {i['latency_during_ms']:.2f} ms (+{i['extra_ms']:.2f}, goal <= 50);"
            f" after hang-up {i['next_answer_after_hangup_ms']:.1f} ms (goal <= 1000)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
