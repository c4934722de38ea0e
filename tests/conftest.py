"""Shared fixtures: every test runs hermetic (HOME, XDG and LOCALLLM_* in tmp_path)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


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
