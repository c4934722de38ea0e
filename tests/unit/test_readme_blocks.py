"""Every fenced README block carries a marker, and every ``<!-- run -->`` block runs as written.

The marker convention is in ``tests/readme_blocks.py``; blocks that need the real
llama-server (``<!-- run: e2e -->``) run in ``tests/e2e/test_readme_e2e.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.readme_blocks import REPO, RUNNABLE, Block, blocks, console_commands, run_block, workdir

BLOCKS = blocks()
UNIT = [b for b in BLOCKS if b.runnable and b.suite == "unit"]


def test_every_block_is_marked() -> None:
    unmarked = [f"README.md:{b.line} ({b.lang or 'plain'})" for b in BLOCKS if b.marker is None]
    assert unmarked == [], "mark each with <!-- run -->, <!-- run: e2e --> or <!-- norun: REASON -->"


def test_run_markers_sit_on_runnable_languages() -> None:
    wrong = [f"README.md:{b.line} ({b.lang or 'plain'})" for b in BLOCKS if b.runnable and b.lang not in RUNNABLE]
    assert wrong == []


def test_counts_are_what_the_readme_states() -> None:
    runnable = [b for b in BLOCKS if b.runnable]
    skipped = [b for b in BLOCKS if b.marker == "norun"]
    assert len(runnable) + len(skipped) == len(BLOCKS)
    assert all(b.reason for b in skipped)
    # every python and console block runs unless it says why not
    code = [b for b in BLOCKS if b.lang in RUNNABLE]
    assert {b.line for b in code if not b.runnable} == {b.line for b in skipped if b.lang in RUNNABLE}


def _string_args(tree: ast.AST, func: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == func and node.args and isinstance(node.args[0], ast.Constant):
                found.append(str(node.args[0].value))
    return found


def test_python_blocks_load_shipped_configs_and_schemas() -> None:
    """A config or schema a Python block names is a file in the clone (relative to its root)."""
    missing = []
    for block in (b for b in BLOCKS if b.lang == "python"):
        tree = ast.parse(block.text)
        for config in _string_args(tree, "load_config"):
            path = REPO / config
            if not path.is_file():
                missing.append(f"README.md:{block.line}: load_config({config!r})")
                continue
            for node in ast.walk(tree):
                named = isinstance(node, ast.keyword) and node.arg == "schema" and isinstance(node.value, ast.Constant)
                if named and not (path.parent / str(node.value.value)).is_file():  # type: ignore[attr-defined]
                    missing.append(f"README.md:{block.line}: schema={node.value.value!r}")  # type: ignore[attr-defined]
    assert missing == []


def test_console_commands_name_shipped_files() -> None:
    """A path under examples/ in a run block's command exists in the clone."""
    missing = []
    for block in (b for b in BLOCKS if b.runnable and b.lang == "console"):
        for command in console_commands(block.text):
            for path in re.findall(r"examples/[\w./-]+", command):
                if not (REPO / path).exists():
                    missing.append(f"README.md:{block.line}: {path}")
    assert missing == []


def test_console_parsing_joins_continuations() -> None:
    text = "$ curl -s http://x \\\n    -d '{}'\nout line\n$ echo hi   # note\n"
    assert console_commands(text) == ["curl -s http://x \\\n    -d '{}'", "echo hi   # note"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workdir(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("block", UNIT, ids=[b.id for b in UNIT])
def test_unit_block_runs_as_written(block: Block, root: Path) -> None:
    for outcome in run_block(block, root, timeout=120):
        assert outcome.code == block.exit_code, f"README.md:{block.line}: `{outcome.command}`\n{outcome.output}"
        assert "Traceback" not in outcome.output, outcome.output


def test_a_failing_console_command_fails_its_block(tmp_path: Path) -> None:
    root = workdir(tmp_path / "w")
    block = Block(1, "console", "$ cd examples\n$ test -d quickstart\n$ false\n$ true\n", "run", "unit", "", 0)
    [outcome] = run_block(block, root, timeout=30)
    assert outcome.code == 1 and "false" in outcome.output  # stopped at `false`; `cd` carried over
    ok = Block(1, "console", "$ cd examples\n$ test -d quickstart\n", "run", "unit", "", 0)
    assert run_block(ok, root, timeout=30)[0].code == 0
