"""Benchmark: our single-pass fetch-and-verify against ``curl -o`` then ``sha256sum``.

    python tests/bench/bench_fetch.py [--smoke] [--mib 512] [--rounds 3] [--json OUT]

A loopback server (``tests/unit/fakes/http_server.py``, its own process, sendfile) serves
one random file. Each round runs, in alternating order, (a) ``fetch_artifact`` in a fresh
Python process (interpreter start-up included: that is what ``localllm fetch`` costs) —
stream, hash while streaming, fsync, rename — and (b) ``curl -sS -o`` followed by
``sha256sum`` (two passes over the bytes, no fsync). Wall time is measured around each
process; peak RSS is the child's own ``VmHWM`` (since exec), sampled every 5 ms. The table shows medians
and the ratio; JSON goes to ``tests/bench/results/fetch.json`` unless ``--json`` says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._provenance import provenance, results_path  # noqa: E402

SERVER = REPO / "tests" / "unit" / "fakes" / "http_server.py"
FILE = "blob.bin"

FETCH = """
import sys
from pathlib import Path
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact
url, sha, dest = sys.argv[1:4]
art = Artifact(name="bench blob", file=Path(dest).name, sha256=sha, url=url)
fetch_artifact(art, Path(dest), lock_path=Path(dest + ".lock"), progress=False, log=lambda m: None)
"""


def _peak_rss(pid: int) -> int | None:
    """VmHWM: the peak RSS of the program *since exec* (a fork's inherited pages excluded)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one child process."""
    import psutil

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        peak = 0
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            # Poll every 5 ms; VmHWM is monotonic so a late sample still sees the peak.
            hwm = _peak_rss(proc.pid)
            if hwm is None:
                try:
                    hwm = ps.memory_info().rss
                except psutil.Error:
                    hwm = 0
            peak = max(peak, hwm)
            time.sleep(0.005)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {err.read().decode()}")
        return wall, peak, out.read().decode()


def _make_blob(path: Path, mib: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(mib):
            block = os.urandom(1 << 20)
            digest.update(block)
            fh.write(block)
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="CI: 4 MiB, 2 rounds (results to a temp file)")
    parser.add_argument("--json", type=Path, default=None, help="default: tests/bench/results/fetch.json")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.rounds = 4, 2
    out = args.json or results_path("fetch", smoke=args.smoke)
    curl = shutil.which("curl")
    sha256sum = shutil.which("sha256sum")
    if not curl or not sha256sum:
        raise SystemExit("needs curl and sha256sum on PATH")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_PROXY": "127.0.0.1"}
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(var, None)

    with tempfile.TemporaryDirectory(prefix="bench-fetch-", dir=REPO / "tests" / "bench") as tmp:
        work = Path(tmp)
        serve = work / "serve"
        serve.mkdir()
        sha = _make_blob(serve / FILE, args.mib)
        server = subprocess.Popen([sys.executable, str(SERVER), "--dir", str(serve)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline().split()[1])
            url = f"http://127.0.0.1:{port}/{FILE}"
            rounds: list[dict[str, Any]] = []
            for i in range(args.rounds):
                ours_dest = work / f"ours-{i}" / FILE
                ours_dest.parent.mkdir()
                curl_dest = work / f"curl-{i}.bin"

                def ours(ours_dest: Path = ours_dest) -> dict[str, Any]:
                    wall, rss, _ = _run([sys.executable, "-c", FETCH, url, sha, str(ours_dest)], env)
                    return {"ours_s": wall, "ours_rss": rss}

                def pair(curl_dest: Path = curl_dest) -> dict[str, Any]:
                    w1, r1, _ = _run([curl, "-sS", "--noproxy", "*", "-o", str(curl_dest), url])
                    w2, r2, out = _run([sha256sum, str(curl_dest)])
                    assert out.split()[0] == sha, "curl copy does not hash to the blob"
                    return {"curl_s": w1, "sha256sum_s": w2, "pair_s": w1 + w2, "curl_rss": r1, "sha256sum_rss": r2}

                row: dict[str, Any] = {}
                for step in (ours, pair) if i % 2 == 0 else (pair, ours):
                    row.update(step())
                assert ours_dest.stat().st_size == args.mib << 20
                ours_dest.unlink()
                curl_dest.unlink()
                row["ratio"] = row["ours_s"] / row["pair_s"]
                rounds.append(row)
        finally:
            server.terminate()
            server.wait(timeout=10)

    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    mib = args.mib
    result = {
        **provenance(smoke=args.smoke),
        "benchmark": "fetch",
        "size_mib": mib,
        "rounds": args.rounds,
        "host": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "system": platform.system(),
        },
        "median": {
            "ours_s": round(med["ours_s"], 3),
            "curl_s": round(med["curl_s"], 3),
            "sha256sum_s": round(med["sha256sum_s"], 3),
            "curl_plus_sha256sum_s": round(med["pair_s"], 3),
            "ratio_ours_over_pair": round(med["ratio"], 3),
            "ratio_of_medians": round(med["ours_s"] / med["pair_s"], 3),
            "ours_mib_per_s": round(mib / med["ours_s"], 1),
            "pair_mib_per_s": round(mib / med["pair_s"], 1),
            "ours_peak_rss_mib": round(med["ours_rss"] / (1 << 20), 1),
            "curl_peak_rss_mib": round(med["curl_rss"] / (1 << 20), 1),
            "sha256sum_peak_rss_mib": round(med["sha256sum_rss"] / (1 << 20), 1),
        },
        "runs": rounds,
    }
    m = result["median"]
    print(f"fetch {mib} MiB from loopback, median of {args.rounds} rounds")
    print(f"{'':28}{'wall s':>9}{'MiB/s':>9}{'peak RSS MiB':>14}")
    print(f"{'localllm fetch+verify':28}{m['ours_s']:>9.2f}{m['ours_mib_per_s']:>9.1f}{m['ours_peak_rss_mib']:>14.1f}")
    print(f"{'curl -o':28}{m['curl_s']:>9.2f}{'':>9}{m['curl_peak_rss_mib']:>14.1f}")
    print(f"{'sha256sum':28}{m['sha256sum_s']:>9.2f}{'':>9}{m['sha256sum_peak_rss_mib']:>14.1f}")
    print(f"{'curl + sha256sum':28}{m['curl_plus_sha256sum_s']:>9.2f}{m['pair_mib_per_s']:>9.1f}")
    print(
        f"ratio ours / (curl + sha256sum): {m['ratio_of_medians']:.2f} of the medians above, "
        f"{m['ratio_ours_over_pair']:.2f} median of the per-round ratios  (< 1 means we are faster)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
