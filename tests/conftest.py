"""Shared fixtures: every test runs hermetic (HOME, XDG and LOCALLLM_* in tmp_path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    """Every test's ``tmp_path`` has a space in it (``/tmp/localllm tests-…/``), as a user's
    config or cache directory may (``~/My Configs``, macOS's ``Application Support``): a
    path that reaches a shell, a file URI or pip unquoted fails a test. The controller picks
    the directory; xdist's workers get a subdirectory each. Removed when the run passes."""
    if config.option.basetemp or hasattr(config, "workerinput"):
        return
    config.option.basetemp = tempfile.mkdtemp(prefix="localllm tests-")
    config.stash[_SPACED_BASETEMP] = config.option.basetemp


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    made = session.config.stash.get(_SPACED_BASETEMP, None)
    if made and exitstatus == 0:
        shutil.rmtree(made, ignore_errors=True)


_SPACED_BASETEMP = pytest.StashKey[str]()


@pytest.fixture(autouse=True)
def isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point HOME, XDG dirs and every LOCALLLM_* variable at the test's tmp_path."""
    home = tmp_path / "home"
    home.mkdir()
    for name in list(os.environ):
        # LOCALLLM_TEST_* locate the real server and models for e2e tests; keep them.
        if name.startswith("LOCALLLM_") and not name.startswith("LOCALLLM_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(tmp_path / "cache"))
    # Proxies would route loopback traffic away from the test servers.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield


def pid_gone(pid: int, within: float = 0.0) -> bool:
    """True once ``pid`` no longer runs, polling up to ``within`` seconds (a zombie counts as gone)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def in_child(code: str, timeout: float = 60) -> Any:
    """Run ``code`` in a fresh interpreter, its last stdout line as JSON; a hang fails the test.

    For what must not backtrack or hang: a stuck child is killed at ``timeout``, where a
    stuck test would hold the worker (and its GIL) until pytest-timeout ends the session."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
