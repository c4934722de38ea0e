"""Benchmark: GNU OpenMP's spin count for managed llama-servers, solo against contended, in one run.

    python tests/bench/bench_spincount.py [--counts 100,500,1000,default] [--tokens 60]

For every ``GOMP_SPINCOUNT`` value: two real llama-servers (gemma-3-270m, ``--parallel 1``)
start with it; the decode speed of one server alone (ms per token, the second of two
requests) and then of both decoding at once (the chat + embeddings or two-process case on a
small machine). Too short a spin makes every barrier sleep (solo decode slows); too long a
spin makes two servers burn each other's cores (contended decode collapses). Prints one row
per value and writes ``tests/bench/results/spincount.json``. Not a test: no asserts on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_local_llm import free_port, prepare  # noqa: E402


def _start(binary: str, model: Path, spin: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin != "default":
        env["GOMP_SPINCOUNT"] = spin
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--parallel", "1", "-c", "1024"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"llama-server on port {port} did not become healthy")


def _ms_per_token(url: str, tokens: int) -> float:
    body = {"prompt": "Write a long story about a cat.", "n_predict": tokens, "temperature": 0, "cache_prompt": False}
    reply = httpx.post(url + "/completion", json=body, timeout=600, trust_env=False).json()
    return float(reply["timings"]["predicted_per_token_ms"])


def measure(binary: str, model: Path, spin: str, tokens: int) -> dict[str, Any]:
    servers = [_start(binary, model, spin) for _ in range(2)]
    try:
        urls = [url for _, url in servers]
        _ms_per_token(urls[0], tokens)  # warm-up
        solo = _ms_per_token(urls[0], tokens)
        both: list[float] = []
        threads = [threading.Thread(target=lambda u=u: both.append(_ms_per_token(u, tokens))) for u in urls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    return {"spincount": spin, "solo_ms_per_token": solo, "contended_ms_per_token": max(both)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="100,300,500,1000,10000,default", help="comma-separated values")
    parser.add_argument("--tokens", type=int, default=60, help="tokens decoded per request")
    parser.add_argument("--smoke", action="store_true", help="CI: one value (500), 8 tokens (results to a temp file)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.counts, args.tokens = "500", 8
    _, install, model = prepare()  # the cached build and gemma-3-270m (nothing downloaded)
    rows = [measure(str(install.binary), model, spin, args.tokens) for spin in args.counts.split(",")]
    print(f"{'GOMP_SPINCOUNT':>14}  {'solo ms/token':>13}  {'2 servers ms/token':>18}")
    for row in rows:
        print(f"{row['spincount']:>14}  {row['solo_ms_per_token']:>13.1f}  {row['contended_ms_per_token']:>18.1f}")
    out = results_path("spincount", smoke=args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**provenance(smoke=args.smoke), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
