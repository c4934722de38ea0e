"""``tests/bench/run_all.py --smoke`` (``make bench-smoke``, part of ``make test``) fails on a rotten bench.

The harness runs in a copy of the repository's layout (its own ``tests/bench`` with the real
``run_all.py``, ``_provenance.py`` and ``bench_trace.py``, and this tree's ``localllm``), so
benches can be broken on purpose without touching the real ones.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tests" / "bench"

GOOD = """
import argparse, json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.bench._provenance import provenance, results_path
parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true")
args = parser.parse_args()
print("good bench, smoke" if args.smoke else "good bench, full")
out = results_path("good", smoke=args.smoke)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({**provenance(smoke=args.smoke), "figure": 1}))
"""

#: how a bench may get its results wrong while exiting 0; each one fails the smoke run
WRITES = """
import argparse, json, os, sys, tempfile
from pathlib import Path
root = Path(__file__).resolve().parents[2]
parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true")
parser.parse_args()
smoke_dir = Path(os.environ.get("LOCALLLM_BENCH_SMOKE_DIR") or tempfile.mkdtemp())
{body}
"""
NO_RESULTS = WRITES.format(body="print('measured, wrote nothing')")
NO_COMMIT = WRITES.format(body="(smoke_dir / 'x.json').write_text(json.dumps({'figure': 1}))")
NOT_JSON = WRITES.format(body="(smoke_dir / 'x.json').write_text('{\\'commit')")
INTO_PUBLISHED = WRITES.format(
    body="(smoke_dir / 'x.json').write_text(json.dumps({'commit': 'abc'}))\n"
    "(root / 'tests' / 'bench' / 'results').mkdir(exist_ok=True)\n"
    "(root / 'tests' / 'bench' / 'results' / 'x.json').write_text('{}')"
)

NO_SMOKE = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--quick", action="store_true")
parser.parse_args()
"""

HANGS = """
import argparse, time
parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true")
parser.parse_args()
time.sleep(60)
"""


def _layout(root: Path, benches: dict[str, str]) -> Path:
    """A repository copy at ``root``: the real harness, this tree's ``localllm``, and ``benches``."""
    bench = root / "tests" / "bench"
    bench.mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text("")
    (root / "localllm").symlink_to(REPO / "localllm")
    for name in ("run_all.py", "_provenance.py"):
        (bench / name).write_text((BENCH / name).read_text())
    for name, text in benches.items():
        (bench / name).write_text(text)
    return bench


def _run_all(bench: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(bench / "run_all.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=bench,
        env=env,
        check=False,
    )


def _smoke(
    tmp_path: Path, benches: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``run_all.py --smoke`` over ``benches`` in a repository copy at ``tmp_path``."""
    return _run_all(_layout(tmp_path, benches), "--smoke", *args, timeout=timeout)


def _summary(stdout: str) -> dict[str, str]:
    """``{script: "ok" | "FAIL"}`` from the summary table."""
    table = stdout.split("=== summary ===", 1)[1]
    return {m.group(2): m.group(1) for m in re.finditer(r"^\s+(ok|FAIL)\s+(\S+)", table, re.MULTILINE)}


def _trace_bench() -> str:
    return (BENCH / "bench_trace.py").read_text()


def test_every_bench_declares_smoke() -> None:
    """New benches are found by name; each must have the smoke mode make test runs."""
    scripts = sorted(BENCH.glob("bench_*.py"))
    assert len(scripts) >= 5
    missing = [p.name for p in scripts if not re.search(r"""add_argument\(\s*["']--smoke["']""", p.read_text())]
    assert missing == []


@pytest.mark.slow
def test_smoke_passes_on_working_benches(tmp_path: Path) -> None:
    result = _smoke(tmp_path, {"bench_good.py": GOOD, "bench_trace.py": _trace_bench()})
    assert result.returncode == 0, result.stdout + result.stderr
    assert _summary(result.stdout) == {"bench_good.py": "ok", "bench_trace.py": "ok"}
    assert "good bench, smoke" in result.stdout
    assert "TraceWriter.append" in result.stdout  # the real bench ran its table
    assert not (tmp_path / "tests" / "bench" / "results").exists()  # smoke never writes the published figures


@pytest.mark.slow
def test_a_rotten_bench_fails_the_smoke_run(tmp_path: Path) -> None:
    # The bench_local_llm rot, reproduced on a real bench: the code's API moved on under it
    # (an attribute that is gone, a tuple of a different length).
    source = _trace_bench()
    rotten_attr = source.replace("w.append(", "w.append_line(", 1)
    rotten_unpack = source.replace(
        "fd, dfd = fh.fileno(), dh.fileno()", "fd, dfd = fh.fileno(), dh.fileno(), w.path", 1
    )
    assert source not in (rotten_attr, rotten_unpack)
    result = _smoke(
        tmp_path,
        {
            "bench_good.py": GOOD,
            "bench_rotten_attr.py": rotten_attr,
            "bench_rotten_unpack.py": rotten_unpack,
            "bench_without_smoke.py": NO_SMOKE,
        },
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert _summary(result.stdout) == {
        "bench_good.py": "ok",
        "bench_rotten_attr.py": "FAIL",
        "bench_rotten_unpack.py": "FAIL",
        "bench_without_smoke.py": "FAIL",
    }
    assert "AttributeError" in result.stderr and "ValueError" in result.stderr


@pytest.mark.slow
def test_a_bench_must_publish_its_figures_with_their_commit_and_only_in_the_smoke_dir(tmp_path: Path) -> None:
    result = _smoke(
        tmp_path,
        {
            "bench_good.py": GOOD,
            "bench_no_results.py": NO_RESULTS,
            "bench_no_commit.py": NO_COMMIT,
            "bench_not_json.py": NOT_JSON,
            "bench_into_published.py": INTO_PUBLISHED,
        },
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert _summary(result.stdout) == {
        "bench_good.py": "ok",
        "bench_into_published.py": "FAIL",
        "bench_no_commit.py": "FAIL",
        "bench_no_results.py": "FAIL",
        "bench_not_json.py": "FAIL",
    }
    problems = dict(re.findall(r"^\s+FAIL\s+(\S+)\s+[\d.]+ s\s+\((.*)\)$", result.stdout, re.MULTILINE))
    assert "wrote no JSON" in problems["bench_no_results.py"]
    assert "names no commit" in problems["bench_no_commit.py"]
    assert "is not JSON" in problems["bench_not_json.py"]
    assert "wrote to" in problems["bench_into_published.py"]
    leftovers = [
        p for name in problems for p in Path(tempfile.gettempdir()).glob(name.removesuffix(".py") + "-smoke-*")
    ]
    assert leftovers == []  # each script's smoke directory is removed


def test_smoke_results_go_to_the_directory_run_all_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.bench import _provenance

    monkeypatch.setenv(_provenance.SMOKE_DIR_ENV, str(tmp_path))
    assert _provenance.results_path("x", smoke=True) == tmp_path / "x.json"
    assert _provenance.results_path("x") == _provenance.RESULTS / "x.json"
    monkeypatch.delenv(_provenance.SMOKE_DIR_ENV)
    assert _provenance.results_path("x", smoke=True).parent.name == "localllm-bench-smoke"


@pytest.mark.slow
def test_a_hanging_bench_is_killed_and_fails(tmp_path: Path) -> None:
    result = _smoke(tmp_path, {"bench_good.py": GOOD, "bench_hangs.py": HANGS}, "--timeout", "2", timeout=60)
    assert result.returncode == 1
    assert _summary(result.stdout) == {"bench_good.py": "ok", "bench_hangs.py": "FAIL"}


def test_only_and_quick_pass_through(tmp_path: Path) -> None:
    bench = _layout(tmp_path, {"bench_good.py": GOOD, "bench_other.py": NO_SMOKE})
    result = _run_all(bench, "--only", "good")
    assert result.returncode == 0, result.stderr
    assert _summary(result.stdout) == {"bench_good.py": "ok"}
    assert "good bench, full" in result.stdout
    assert _run_all(bench, "--only", "nothing").returncode == 2


def test_provenance_reports_the_load_before_the_bench_not_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bench that records its provenance after measuring used to report the load of its own
    # llama-servers as the machine's (6.2 on an idle machine, bench_service.py).
    from tests.bench import _provenance

    before = _provenance._LOAD_AT_START
    monkeypatch.setattr(os, "getloadavg", lambda: (6.23, 4.41, 2.39))
    doc = _provenance.provenance()
    assert doc["loadavg_start"] == before
    assert doc["loadavg_end"] == [6.23, 4.41, 2.39]
