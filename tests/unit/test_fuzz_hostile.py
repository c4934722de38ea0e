"""5,000 hostile trace files and 5,000 hostile plugin directories, each run in a child
process under a 2 GiB address-space limit: zero undocumented exceptions, zero unencodable
strings, no trial slower than five seconds (generators in ``fuzz_hostile.py``). About 4 s
(traces) and 14 s (plugins) on an idle 2-core machine; the time limits leave room for a
loaded one."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TRIALS = 5000
MEMORY_LIMIT = 2 << 30

pytestmark = pytest.mark.slow


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _fuzz(target: str, seed: int, work: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.fuzz_hostile", target, str(TRIALS), str(seed), str(work)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return summary


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["trace", "plugins"])
@pytest.mark.slow
def test_hostile_inputs_raise_nothing_undocumented(tmp_path: Path, target: str) -> None:
    summary = _fuzz(target, 20261201, tmp_path)
    assert summary["trials"] == TRIALS
    assert summary["failures"] == 0, "\n\n".join(summary["examples"])  # type: ignore[arg-type]
    assert float(summary["slowest_s"]) < 5.0  # type: ignore[arg-type]
    outcomes: dict[str, int] = summary["outcomes"]  # type: ignore[assignment]
    accepted = outcomes.get("read", 0) + outcomes.get("loaded", 0)
    assert TRIALS // 10 < accepted < TRIALS  # the generators reach both the accepting and the refusing paths
