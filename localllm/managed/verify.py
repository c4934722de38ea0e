"""sha256 of files, and the size+mtime stamp that makes re-verifying a cached file cheap.

A verified file ``X`` gets a sibling ``X.verified`` holding its sha256, size and
``mtime_ns``. If the stat still matches the stamp the file is trusted without re-hashing;
anything else (no stamp, touched file, other pin) means a full hash.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

from localllm._fs import atomic_write, fsync_dir, read_capped

# fsync_dir is the durable-rename helper of localllm._fs, kept here for extract.py.
__all__ = ["fsync_dir", "is_verified", "sha256_file", "stamp_matches", "stamp_path", "write_stamp"]

CHUNK = 1 << 20
STAMP_SUFFIX = ".verified"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file, read in 1 MiB blocks.

    A directory or FIFO is refused (:class:`OSError`, ``EINVAL``): opened without blocking
    and checked before the first read, so a FIFO never hangs the caller.
    """
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def write_stamp(path: Path, sha256: str) -> None:
    """Record that ``path`` (as it is now) hashes to ``sha256``."""
    st = path.stat()
    data = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    atomic_write(stamp_path(path), json.dumps(data) + "\n")


def stamp_matches(path: Path, sha256: str) -> bool:
    """True when the stamp says ``path`` is unchanged since it hashed to ``sha256``."""
    try:  # regular: a FIFO in the stamp's place is refused, not waited on
        data = json.loads(read_capped(stamp_path(path), 1 << 16, regular=True))
        st = path.stat()
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(data, dict)
        and data.get("sha256") == sha256
        and data.get("size") == st.st_size
        and data.get("mtime_ns") == st.st_mtime_ns
    )


def is_verified(path: Path, sha256: str, *, full: bool = False) -> bool:
    """Whether ``path`` exists and hashes to ``sha256`` (stamp first unless ``full``).

    A successful full hash refreshes the stamp; a failed one removes it.
    """
    if not path.is_file():
        return False
    if not full and stamp_matches(path, sha256):
        return True
    if sha256_file(path) == sha256:
        write_stamp(path, sha256)
        return True
    stamp_path(path).unlink(missing_ok=True)
    return False
