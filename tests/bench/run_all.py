"""Run every ``tests/bench/bench_*.py`` in turn (``make bench``).

    python tests/bench/run_all.py [--quick] [--only NAME ...]

Each script runs in its own interpreter (the one running this file) with the repository as
working directory; its table goes straight to the terminal. ``--quick`` is passed to the
scripts that accept it (their source declares a ``--quick`` option) and dropped for the rest.
Exits non-zero when any script fails, after running them all.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def scripts(only: list[str]) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if only:
        wanted = {name.removeprefix("bench_").removesuffix(".py") for name in only}
        found = [p for p in found if p.stem.removeprefix("bench_") in wanted]
    return found


def accepts_quick(script: Path) -> bool:
    """Whether the script declares ``--quick`` (checked in its source: no need to run it)."""
    return '"--quick"' in script.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to the scripts that accept it")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="e.g. local_llm trace")
    args = parser.parse_args(argv)
    todo = scripts(args.only)
    if not todo:
        print(f"run_all: no bench_*.py scripts matched in {HERE}", file=sys.stderr)
        return 2
    outcome: list[tuple[str, int, float]] = []
    for script in todo:
        cmd = [sys.executable, str(script)]
        if args.quick and accepts_quick(script):
            cmd.append("--quick")
        print(f"\n=== {script.name}{' --quick' if '--quick' in cmd else ''} ===", flush=True)
        started = time.monotonic()
        try:
            code = subprocess.run(cmd, cwd=REPO, check=False).returncode
        except KeyboardInterrupt:
            print(f"run_all: interrupted during {script.name}", file=sys.stderr)
            return 130
        outcome.append((script.name, code, time.monotonic() - started))
    print("\n=== summary ===")
    for name, code, seconds in outcome:
        print(
            f"  {'ok  ' if code == 0 else 'FAIL'}  {name:<24} {seconds:7.1f} s" + (f"  (exit {code})" if code else "")
        )
    failed = [name for name, code, _ in outcome if code != 0]
    if failed:
        print(f"run_all: {len(failed)} of {len(outcome)} benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
