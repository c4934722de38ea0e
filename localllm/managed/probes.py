"""What a llama-server build can do, probed once per build and remembered in the user cache.

A managed start used to ask every time: ``--help`` for the optional flags (~20 ms) and the
grammar canary, a constrained request to the fresh server (~0.1–0.2 s on gemma-3-270m).
Both answers belong to the build, not to the process, so they are kept per build:

- a build is the sha256 of its executable and of the llama/ggml shared libraries beside it
  (:func:`build_id`), so a rebuilt or replaced server — or a changed library — is probed
  again; a file is re-hashed only when its size, mtime, ctime or inode changed (the memo
  ``<cache>/probes/files.json``);
- its answers live in ``<cache>/probes/<build>.json``: ``flags`` (the optional flags its
  ``--help`` lists) and ``grammar_enforced`` (the canary's verdict; an inconclusive canary
  is not remembered, so the next start asks again).

Everything here is best effort: an unreadable or unwritable cache means probing as before,
never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from localllm import settings
from localllm._fs import atomic_write

__all__ = ["build_id", "forget", "recall", "remember"]

#: shared libraries of a build that sit beside its executable (RUNPATH $ORIGIN)
_LIB_PREFIXES = ("libllama", "libggml", "libmtmd")
_MEMO = "files.json"


def _dir() -> Path:
    return settings.cache_dir() / "probes"


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n", sync_dir=False)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _members(binary: Path) -> list[Path]:
    """The executable and the build's shared libraries in its directory (real files only)."""
    found = [binary]
    with contextlib.suppress(OSError):
        for entry in os.scandir(binary.parent):
            if entry.name.startswith(_LIB_PREFIXES) and ".so" in entry.name and not entry.is_symlink():
                found.append(Path(entry.path))
    return found


def build_id(binary: Path) -> str | None:
    """The sha256 identifying ``binary``'s build (see the module doc); None if unreadable."""
    binary = Path(os.path.abspath(binary))
    memo_path = _dir() / _MEMO
    memo = _read_json(memo_path)
    changed = False
    parts: list[str] = []
    for member in sorted(_members(binary)):
        try:
            key = _stat_key(member.stat())
            known = memo.get(str(member))
            if isinstance(known, dict) and known.get("stat") == key and isinstance(known.get("sha256"), str):
                sha = known["sha256"]
            else:
                sha = _sha256(member)
                memo[str(member)] = {"stat": key, "sha256": sha}
                changed = True
        except OSError:
            if member == binary:
                return None
            continue
        parts.append(f"{member.name} {sha}\n")
    if changed:
        _write_json(memo_path, memo)
    return hashlib.sha256("".join(parts).encode("utf-8")).hexdigest()


def recall(build: str | None) -> dict[str, Any]:
    """What is known about ``build`` (empty when nothing is, or ``build`` is None)."""
    if build is None:
        return {}
    return _read_json(_dir() / f"{build}.json")


def remember(build: str | None, **facts: Any) -> None:
    """Add ``facts`` (JSON values) to what is known about ``build``."""
    if build is None:
        return
    path = _dir() / f"{build}.json"
    known = _read_json(path)
    if all(known.get(name) == value for name, value in facts.items()):
        return
    _write_json(path, {**known, **facts})


def forget(build: str | None) -> None:
    """Drop what is known about ``build`` (the next start probes again)."""
    if build is not None:
        with contextlib.suppress(OSError):
            (_dir() / f"{build}.json").unlink()
