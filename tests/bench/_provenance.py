"""What every benchmark records beside its figures: the commit, the machine, where results go.

``make bench`` publishes to ``tests/bench/results/NAME.json``; a ``--smoke`` run writes to a
temporary directory instead (``$LOCALLLM_BENCH_SMOKE_DIR``, which ``run_all.py --smoke`` sets to
a fresh one per script and then checks), so CI never overwrites the figures the README quotes.
The README names the commit of each figure: the top-level ``commit`` field of that JSON.
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "tests" / "bench" / "results"
#: where a ``--smoke`` run writes its JSON (``run_all.py --smoke`` sets it per script)
SMOKE_DIR_ENV = "LOCALLLM_BENCH_SMOKE_DIR"


def commit() -> str:
    """``git rev-parse --short=12 HEAD`` (``+dirty`` with uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


#: taken when a bench imports this module, before it measures: the load of everything else
_LOAD_AT_START = _loadavg()


def provenance(*, smoke: bool = False) -> dict[str, Any]:
    """The commit, interpreter, platform, cores and load averages of this run.

    ``loadavg_start`` is the machine's load when the bench started (this module's import), so
    a bench that records its provenance after measuring does not report its own load as the
    machine's; ``loadavg_end`` is the load now, its own included.
    """
    return {
        "commit": commit(),
        "smoke": smoke,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": _LOAD_AT_START,
        "loadavg_end": _loadavg(),
    }


def results_path(name: str, *, smoke: bool = False, quick: bool = False) -> Path:
    """``results/NAME.json``; ``NAME.quick.json`` for ``--quick``; a temp file for ``--smoke``."""
    if smoke:
        out = (
            Path(os.environ.get(SMOKE_DIR_ENV) or Path(tempfile.gettempdir()) / "localllm-bench-smoke") / f"{name}.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
    return RESULTS / (f"{name}.quick.json" if quick else f"{name}.json")
