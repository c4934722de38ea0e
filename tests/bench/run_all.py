"""Run every ``tests/bench/bench_*.py`` in turn (``make bench``; ``make bench-smoke`` with ``--smoke``).

    python tests/bench/run_all.py [--smoke | --quick] [--only NAME ...] [--dir DIR] [--timeout S]

Each script runs in its own interpreter (the one running this file) with the repository as
working directory; its table goes straight to the terminal. Scripts are found by name, so a
new ``bench_*.py`` is picked up without touching this file.

``--smoke`` (what ``make test`` runs) passes ``--smoke`` to every script: the real code
paths at the smallest sizes, in seconds, so a benchmark that no longer matches the code
fails CI. A script also fails the smoke run when it does not declare ``--smoke`` (an
``add_argument("--smoke"`` in its source), outlives ``--timeout``, writes no JSON to the
fresh directory it is given (``$LOCALLLM_BENCH_SMOKE_DIR``, see ``_provenance.results_path``),
writes JSON there without the ``commit`` it measured (``_provenance.provenance()``), or
touches ``tests/bench/results/`` (the figures the README quotes). ``--quick`` is passed to
the scripts that accept it and dropped for the rest. Exits non-zero when any script fails,
after running them all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from tests.bench._provenance import RESULTS, SMOKE_DIR_ENV, commit  # noqa: E402

#: an ``add_argument`` call declaring the option, in the script's source
_DECLARES = r"""add_argument\(\s*["']{flag}["']"""


def scripts(directory: Path, only: list[str]) -> list[Path]:
    found = sorted(directory.glob("bench_*.py"))
    if only:
        wanted = {name.removeprefix("bench_").removesuffix(".py") for name in only}
        found = [p for p in found if p.stem.removeprefix("bench_") in wanted]
    return found


def declares(script: Path, flag: str) -> bool:
    """Whether the script declares ``flag`` (checked in its source: no need to run it)."""
    return re.search(_DECLARES.format(flag=re.escape(flag)), script.read_text(encoding="utf-8")) is not None


def published(directory: Path) -> dict[str, tuple[int, int]]:
    """``{name: (mtime_ns, size)}`` of the files in ``directory`` (none when it does not exist)."""
    if not directory.is_dir():
        return {}
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in directory.iterdir() if p.is_file()}


def smoke_results_problem(directory: Path) -> str:
    """What is wrong with the JSON a smoke run left in ``directory``; ``""`` when nothing is."""
    found = sorted(directory.glob("*.json"))
    if not found:
        return "wrote no JSON results (write them to _provenance.results_path(NAME, smoke=True))"
    for path in found:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"{path.name} is not JSON ({exc})"
        if not isinstance(doc, dict) or not isinstance(doc.get("commit"), str):
            return f"{path.name} names no commit (spread _provenance.provenance() into it)"
    return ""


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="every script with --smoke: tiny sizes, CI (make test)")
    mode.add_argument("--quick", action="store_true", help="pass --quick to the scripts that accept it")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="e.g. local_llm trace")
    parser.add_argument("--dir", type=Path, default=HERE, help="where the bench_*.py scripts are (default: here)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per script (default: none; --smoke: 600)")
    args = parser.parse_args(argv)
    todo = scripts(args.dir, args.only)
    if not todo:
        print(f"run_all: no bench_*.py scripts matched in {args.dir}", file=sys.stderr)
        return 2
    timeout = args.timeout if args.timeout is not None else (600.0 if args.smoke else None)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    print(f"run_all: {len(todo)} benchmarks at commit {commit()}{' (smoke)' if args.smoke else ''}", flush=True)
    outcome: list[tuple[str, str, float]] = []
    for script in todo:
        cmd = [sys.executable, str(script)]
        if args.smoke:
            if not declares(script, "--smoke"):
                print(f"\n=== {script.name}: no --smoke option ===", flush=True)
                outcome.append((script.name, "no --smoke option", 0.0))
                continue
            cmd.append("--smoke")
        elif args.quick and declares(script, "--quick"):
            cmd.append("--quick")
        print(f"\n=== {script.name}{''.join(' ' + a for a in cmd[2:])} ===", flush=True)
        smoke_dir = Path(tempfile.mkdtemp(prefix=f"{script.stem}-smoke-")) if args.smoke else None
        before = published(RESULTS) if smoke_dir else {}
        started = time.monotonic()
        # Its own process group: a timeout takes down whatever the script started as well.
        proc = subprocess.Popen(
            cmd, cwd=REPO, env={**env, SMOKE_DIR_ENV: str(smoke_dir)} if smoke_dir else env, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
            problem = f"exit {code}" if code else ""
        except subprocess.TimeoutExpired:
            kill_group(proc)
            problem = f"still running after {timeout:g} s (killed)"
        except KeyboardInterrupt:
            kill_group(proc)
            if smoke_dir is not None:
                shutil.rmtree(smoke_dir, ignore_errors=True)
            print(f"run_all: interrupted during {script.name}", file=sys.stderr)
            return 130
        if smoke_dir is not None:
            if not problem:
                problem = smoke_results_problem(smoke_dir)
            if not problem and published(RESULTS) != before:
                problem = f"a smoke run wrote to {RESULTS} (the published figures)"
            shutil.rmtree(smoke_dir, ignore_errors=True)
        outcome.append((script.name, problem, time.monotonic() - started))
    print("\n=== summary ===")
    for name, problem, seconds in outcome:
        print(f"  {'FAIL' if problem else 'ok  '}  {name:<24} {seconds:7.1f} s" + (f"  ({problem})" if problem else ""))
    failed = [name for name, problem, _ in outcome if problem]
    if failed:
        print(f"run_all: {len(failed)} of {len(outcome)} benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
