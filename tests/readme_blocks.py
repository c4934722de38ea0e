"""The README's fenced blocks, each with the marker that says whether and where it runs.

Every fenced block in README.md is preceded (on the line right above its opening fence)
by one HTML comment:

* ``<!-- run -->`` — run by ``tests/unit/test_readme_blocks.py`` (no real server needed);
* ``<!-- run: e2e -->`` — run by ``tests/e2e/test_readme_e2e.py`` against the real
  llama-server and the real models;
* ``<!-- norun: REASON -->`` — not run; the reason is required (output samples, synopses,
  file formats, fragments, drawings).

A run marker may add ``exit=N`` (the exit code every command of the block is expected to
end with; default 0), e.g. ``<!-- run: exit=1 -->``. Runnable languages: ``python``
(run as a script), ``console`` (each ``$ `` line is a command; ``\\`` continues it; other
lines are the output shown) and ``sh`` / ``bash`` (the whole block is a script). Blocks
run in README order, in one working directory per suite that holds a copy of
``examples/`` — as if from the clone's root — with ``localllm`` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RUNNABLE = ("python", "console", "sh", "bash")
_FENCE = re.compile(r"^(`{3,})([\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(run|norun)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language, its text and its marker."""

    line: int
    lang: str
    text: str
    marker: str | None  # "run" | "norun" | None (unmarked)
    suite: str  # "unit" | "e2e" | "" (norun)
    reason: str
    exit_code: int

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}"

    @property
    def runnable(self) -> bool:
        return self.marker == "run"


class MarkerError(ValueError):
    """A marker that cannot be read (names the line)."""


def _parse_marker(line: str, where: int) -> tuple[str | None, str, str, int]:
    """(marker, suite, reason, exit code) of the line above a fence."""
    found = _MARKER.match(line.strip())
    if found is None:
        return None, "", "", 0
    kind, rest = found.group(1), (found.group(2) or "").strip()
    if kind == "norun":
        if not rest:
            raise MarkerError(f"README.md:{where}: <!-- norun: REASON --> needs a reason")
        return "norun", "", rest, 0
    suite, code = "unit", 0
    for word in filter(None, (w.strip() for w in rest.split(","))):
        if word == "e2e":
            suite = "e2e"
        elif word.startswith("exit="):
            code = int(word.removeprefix("exit="))
        else:
            raise MarkerError(f"README.md:{where}: unknown run option {word!r} (e2e, exit=N)")
    return "run", suite, "", code


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of ``path`` in order, with its marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        above = lines[i - 1] if i > 0 else ""
        marker, suite, reason, code = _parse_marker(above, i)
        found.append(Block(i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n", marker, suite, reason, code))
        i = end + 1
    return found


def console_commands(text: str) -> list[str]:
    """The ``$ `` commands of a console block (``\\`` continuation lines joined)."""
    commands: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if current is not None:
            current.append(line)
            if not line.rstrip().endswith("\\"):
                commands.append("\n".join(current))
                current = None
            continue
        if line.startswith("$ "):
            body = line[2:]
            if body.rstrip().endswith("\\"):
                current = [body]
            else:
                commands.append(body)
    if current is not None:
        commands.append("\n".join(current))
    return commands


def workdir(root: Path) -> Path:
    """A directory laid out like the clone's root (a copy of ``examples/``), ``localllm`` on PATH."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "examples", root / "examples", dirs_exist_ok=True)
    bindir = root / ".bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "localllm"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m localllm "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    pyshim = bindir / "python"
    pyshim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
    pyshim.chmod(0o755)
    return root


def environment(root: Path, overrides: dict[str, str | None] | None = None) -> dict[str, str]:
    """The current environment with ``localllm`` (this tree) first on PATH and PYTHONPATH;
    ``overrides`` set (or, with ``None``, remove) variables."""
    env = dict(os.environ)
    for name, value in (overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PATH"] = f"{root / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("LOCALLLM_DEBUG", None)
    return env


@dataclass(frozen=True)
class Outcome:
    command: str
    code: int
    output: str


def run_block(
    block: Block, root: Path, *, timeout: float = 600.0, overrides: dict[str, str | None] | None = None
) -> list[Outcome]:
    """Run one block in ``root``; one outcome per command (one for a script)."""
    env = environment(root, overrides)
    if block.lang == "python":
        script = root / f".readme-{block.id}.py"
        script.write_text(block.text, encoding="utf-8")
        argvs: list[tuple[str, list[str]]] = [(f"python ({block.id})", [sys.executable, str(script)])]
    elif block.lang == "console":
        # one shell for the block (a `cd` carries over, as in a terminal); each command must
        # end with the expected code, else the block stops there with that command's code
        lines = []
        for cmd in console_commands(block.text):
            lines.append(cmd)
            lines.append(
                f'rc=$?; if [ "$rc" -ne {block.exit_code} ]; then echo "README block stopped: exit $rc from:" >&2; '
                f"cat >&2 <<'README_CMD'\n{cmd}\nREADME_CMD\nexit $(( rc == 0 ? 99 : rc )); fi"
            )
        lines.append(f"exit {block.exit_code}")
        argvs = [(block.text, ["bash", "-c", "\n".join(lines)])]
    elif block.lang in ("sh", "bash"):
        argvs = [(block.text, ["bash", "-e", "-c", block.text])]
    else:
        raise MarkerError(f"README.md:{block.line}: a {block.lang or 'plain'} block cannot run (mark it norun)")
    results = []
    for shown, argv in argvs:
        proc = subprocess.run(
            argv,
            check=False,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        results.append(Outcome(shown, proc.returncode, proc.stdout + proc.stderr))
    return results
