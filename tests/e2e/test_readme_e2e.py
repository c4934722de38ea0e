"""The README blocks marked ``<!-- run: e2e -->`` run as written, in README order, against
the real llama-server and the real GGUFs (see ``tests/readme_blocks.py`` for the markers).

They share one working directory laid out like the clone's root and one HOME whose user
cache (``~/.cache/localllm``, as the README's paths say) holds the real server's path
and the models, fed through the e2e mirror (tests never reach a network).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme_blocks import Block, blocks, run_block, workdir

E2E = [b for b in blocks() if b.runnable and b.suite == "e2e"]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str | None]]]:
    root = workdir(tmp_path_factory.mktemp("readme-e2e"))
    home = root / ".home"
    home.mkdir()
    overrides: dict[str, str | None] = {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "LOCALLLM_CACHE_DIR": None,  # the README's ~/.cache/localllm
        "LOCALLLM_SERVER_BIN": os.environ["LOCALLLM_TEST_SERVER_BIN"],
        "LOCALLLM_MIRROR": os.environ["LOCALLLM_TEST_MIRROR"],
    }
    yield root, overrides
    stop = Block(0, "console", "$ localllm stop --all\n", "run", "e2e", "", 0)
    run_block(stop, root, timeout=60, overrides=overrides)  # the service a block started, if any


@pytest.mark.timeout(900)  # the eval block asks 64 decides of the real model
@pytest.mark.parametrize("block", E2E, ids=[b.id for b in E2E])
def test_e2e_block_runs_as_written(block: Block, place: tuple[Path, dict[str, str | None]]) -> None:
    root, overrides = place
    for outcome in run_block(block, root, timeout=900, overrides=overrides):
        assert outcome.code == block.exit_code, f"README.md:{block.line}: `{outcome.command}`\n{outcome.output}"
        assert "Traceback" not in outcome.output, outcome.output
