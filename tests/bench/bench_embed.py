"""Embedding benchmark, measured side by side in one run.

1. Throughput (docs/s) against one real embedding sidecar (llama-server + all-MiniLM-L6-v2):
   LocalEmbedder vs a raw batched ``POST /v1/embeddings`` of the same batches (target ≥ 0.95×)
   vs one request per text. Runs are interleaved so machine noise hits all three alike.
2. Index top-10 latency over 100k × 384 unit vectors: Index.search vs a full numpy argsort of
   the same scores (and faiss-cpu ``IndexFlatIP`` when installed).

Prints a table and writes ``tests/bench/results/embed.json``. Not a test: no asserts on speed.
Server: ``LOCALLLM_TEST_SERVER_BIN`` (default: the source build in the user cache).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.embed.index import Index  # noqa: E402
from localllm.embed.local import LocalEmbedder, embedding_server_args  # noqa: E402
from localllm.embed.registry import lookup  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402

DEFAULT_BIN = Path.home() / ".cache/localllm/build/llama-cpp-python-0.3.36/cmake-build/bin/llama-server"
GGUF = REPO.parent / "shared" / "models" / "all-minilm-l6-v2-f16.gguf"
REFERENCE = REPO.parent / "shared" / "models" / "all-minilm-l6-v2.reference.json"
BATCH = 64
PARALLEL = 2


def _texts(copies: int) -> list[str]:
    items = json.loads(REFERENCE.read_text())["items"]
    # distinct texts (no accidental cache hits), realistic sentence lengths
    return [f"{item['text']} ({copy})" for copy in range(copies) for item in items]


def _raw_batched(client: httpx.Client, url: str, texts: list[str]) -> np.ndarray:
    rows: list[Any] = []
    for start in range(0, len(texts), BATCH):
        resp = client.post(f"{url}/v1/embeddings", json={"input": texts[start : start + BATCH]})
        resp.raise_for_status()
        data = sorted(resp.json()["data"], key=lambda d: d["index"])
        rows.extend(d["embedding"] for d in data)
    return np.asarray(rows, dtype=np.float32)


def _one_by_one(client: httpx.Client, url: str, texts: list[str]) -> np.ndarray:
    rows = []
    for text in texts:
        resp = client.post(f"{url}/v1/embeddings", json={"input": text})
        resp.raise_for_status()
        rows.append(resp.json()["data"][0]["embedding"])
    return np.asarray(rows, dtype=np.float32)


def bench_throughput(server_bin: Path, *, copies: int, rounds: int, threads: int | None) -> dict[str, Any]:
    from localllm.managed.server import ManagedServer

    info = lookup("all-minilm-l6-v2")
    texts = _texts(copies)
    times: dict[str, list[float]] = {"localembedder": [], "raw_batched": [], "one_per_text": []}
    with ManagedServer(
        server_bin,
        GGUF,
        args=embedding_server_args(info, PARALLEL),
        parallel=PARALLEL,
        ctx_per_slot=info.context,
        threads=threads,
        name="embed-bench",
        health_timeout=120,
    ) as sidecar:
        url = sidecar.ensure_ready()
        client = httpx.Client(timeout=httpx.Timeout(120.0, connect=5.0), trust_env=False)
        emb = LocalEmbedder(url, "all-minilm-l6-v2", batch_size=BATCH)
        emb.embed(texts[:8], "document")  # warm up the server and the connection
        _raw_batched(client, url, texts[:8])
        check = 1.0
        for r in range(rounds):
            # alternate who goes first, so neither side always gets the warmer server
            order = ("localembedder", "raw_batched") if r % 2 == 0 else ("raw_batched", "localembedder")
            outputs: dict[str, np.ndarray] = {}
            for name in order:
                t = time.perf_counter()
                if name == "localembedder":
                    outputs[name] = emb.embed(texts, "document")
                else:
                    outputs[name] = _raw_batched(client, url, texts)
                times[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            _one_by_one(client, url, texts[:120])  # a sample: it is the slow path
            times["one_per_text"].append((time.perf_counter() - t) * len(texts) / 120)
            check = min(check, float((outputs["localembedder"] * outputs["raw_batched"]).sum(axis=1).min()))
        emb.close()
        client.close()
    docs_s = {k: len(texts) / statistics.median(v) for k, v in times.items()}
    return {
        "docs": len(texts),
        "batch": BATCH,
        "parallel": PARALLEL,
        "rounds": rounds,
        "threads": threads,
        "docs_per_s": docs_s,
        "ratio_localembedder_vs_raw": docs_s["localembedder"] / docs_s["raw_batched"],
        "ratio_localembedder_vs_one_per_text": docs_s["localembedder"] / docs_s["one_per_text"],
        "min_cosine_localembedder_vs_raw": check,
    }


def bench_index(n: int = 100_000, d: int = 384, queries: int = 50) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    m = rng.standard_normal((n, d), dtype=np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    qs = rng.standard_normal((queries, d), dtype=np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    index = Index.from_matrix([str(i) for i in range(n)], m)
    index.search(qs[0], top_k=10)
    ours, full = [], []
    agree = 0
    for q in qs:
        t = time.perf_counter()
        hits = index.search(q, top_k=10, min_score=-1.0)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        order = np.argsort(-(m @ q), kind="stable")[:10]
        full.append(time.perf_counter() - t)
        agree += [h.position for h in hits] == order.tolist()
    out: dict[str, Any] = {
        "n": n,
        "dims": d,
        "queries": queries,
        "index_top10_ms": statistics.median(ours) * 1e3,
        "numpy_argsort_top10_ms": statistics.median(full) * 1e3,
        "same_results": f"{agree}/{queries}",
        "matrix_mb": m.nbytes / 1e6,
        "index_matrix_shares_memory": bool(np.shares_memory(index.matrix(), m)),
    }
    try:
        import faiss  # type: ignore[import-not-found]
    except ImportError:
        out["faiss"] = "not installed"
    else:
        fi = faiss.IndexFlatIP(d)
        fi.add(m)
        ft = []
        for q in qs:
            t = time.perf_counter()
            fi.search(q.reshape(1, -1), 10)
            ft.append(time.perf_counter() - t)
        out["faiss_flatip_top10_ms"] = statistics.median(ft) * 1e3
    out["speedup_vs_argsort"] = out["numpy_argsort_top10_ms"] / out["index_top10_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer documents and rounds, a 20k index")
    parser.add_argument("--smoke", action="store_true", help="CI: one copy of the texts, 1 round, a 2k index")
    parser.add_argument("--threads", type=int, default=None, help="llama-server -t (default: its own choice)")
    opts = parser.parse_args(argv)
    server_bin = Path(os.environ.get("LOCALLLM_TEST_SERVER_BIN") or DEFAULT_BIN)
    if not server_bin.is_file():
        sys.stderr.write(f"bench_embed: no llama-server at {server_bin}; set LOCALLLM_TEST_SERVER_BIN\n")
        return 1
    thr = bench_throughput(
        server_bin,
        copies=1 if opts.quick or opts.smoke else 4,
        rounds=1 if opts.quick or opts.smoke else 3,
        threads=opts.threads,
    )
    idx = bench_index(2_000 if opts.smoke else 20_000 if opts.quick else 100_000)
    d = thr["docs_per_s"]
    rows = [
        ("LocalEmbedder (batch 64)", f"{d['localembedder']:.1f} docs/s", "1.00×"),
        (
            "raw batched POST (batch 64)",
            f"{d['raw_batched']:.1f} docs/s",
            f"ours {thr['ratio_localembedder_vs_raw']:.3f}× (target ≥ 0.95×)",
        ),
        (
            "one request per text",
            f"{d['one_per_text']:.1f} docs/s",
            f"ours {thr['ratio_localembedder_vs_one_per_text']:.2f}×",
        ),
        (f"Index.search top-10, {idx['n']}×{idx['dims']}", f"{idx['index_top10_ms']:.2f} ms", "1.00×"),
        (
            "numpy full argsort top-10",
            f"{idx['numpy_argsort_top10_ms']:.2f} ms",
            f"ours {idx['speedup_vs_argsort']:.2f}× faster; same results {idx['same_results']}",
        ),
        (
            "faiss-cpu IndexFlatIP top-10",
            f"{idx['faiss_flatip_top10_ms']:.2f} ms" if "faiss_flatip_top10_ms" in idx else idx["faiss"],
            "",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':>16}  comparison")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>16}  {note}")
    out = results_path("embed", smoke=opts.smoke, quick=opts.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(smoke=opts.smoke), "platform": platform.platform(), "throughput": thr, "index": idx}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
