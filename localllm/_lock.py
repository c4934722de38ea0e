"""Where cross-process locks live: one file per resource, named in one function.

``<root>/locks/<kind>-<name>.lock``. ``kind`` says what is locked (one of :data:`KINDS`)
and ``name`` which one. A name that is not a plain file name (a model id from a user's
pins file, say) is made one — unsafe characters replaced, its sha256 appended so that two
names never share a lock — so no lock key can become a path outside the locks directory.

A leaf module: it imports nothing from localllm.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

__all__ = ["KINDS", "LOCKS_DIR", "lock_path"]

LOCKS_DIR = "locks"
#: what can be locked: a release directory, a downloaded archive, a model file, the
#: source build, its sdist
KINDS = frozenset({"release", "download", "model", "source-build", "sdist"})

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,119}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def lock_path(root: Path, kind: str, name: str) -> Path:
    """The lock file of ``kind`` ``name`` under the cache ``root``."""
    if kind not in KINDS:
        raise ValueError(f"unknown lock kind {kind!r}; expected one of {sorted(KINDS)}")
    if not _NAME.fullmatch(name) or ".." in name:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = f"{_UNSAFE.sub('_', name)[:64].replace('..', '_')}-{digest}"
    return root / LOCKS_DIR / f"{kind}-{name}.lock"
