"""Durable file writes: a temp file beside the target, fsync, rename, fsync the directory;
and the one bounded read of a file a user names.

The one way localllm replaces a file. A reader sees the old file or the new one, never
half of either, and after a power cut the rename is either on disk or not at all:

* the temp file lives in the destination's directory (a rename across file systems is a
  copy, not atomic) under a hidden name ``.<name>.<pid>.<random><suffix>``, or in a
  ``tmp_dir`` the caller keeps inside that directory (where temps of many files gather, to
  be swept without listing the files themselves);
* its bytes are fsynced *before* the rename (otherwise the rename can reach the disk before
  the data and a crash leaves an empty file under the final name);
* the directory is fsynced *after* the rename, which is what makes the rename itself
  durable;
* the temp file is removed on every path that does not end in the rename.

A user-named input (a config, a prompt, a schema, cases, a trace) is read with
:func:`read_capped`: a device is refused (``/dev/zero`` never ends, and reading it took the
machine's memory before the OOM killer came), and so is anything past the input's limit, a
regular file by its size before a byte is read; a file a config or a trace names must be
a regular file (a named pipe there is refused at once, not waited on).

A leaf module: it imports nothing from localllm and raises only ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "DATA_LIMIT",
    "TEXT_LIMIT",
    "NotRegular",
    "Unreadable",
    "adjacent_tmp",
    "atomic_write",
    "create_durably",
    "fsync_dir",
    "inside",
    "open_append",
    "open_regular",
    "read_capped",
    "replace_durably",
    "tmp_name",
]

#: what a hand-written input may hold (a prompt, a schema, evidence, a pins file)
TEXT_LIMIT = 16 << 20
#: what a data input may hold (eval cases, a cassette)
DATA_LIMIT = 256 << 20


class Unreadable(OSError):
    """A file :func:`read_capped` refuses: a device, or larger than the limit. ``str()`` is the reason."""


def read_capped(path: Path, limit: int | None, *, regular: bool = False) -> bytes:
    """The bytes of ``path``: at most ``limit`` of them (None: no limit), never a device's.

    A pipe (``<(…)``) is read like a file, up to the limit. ``regular=True`` (a file a config
    or a trace names) refuses anything but a regular file, a named pipe included, without
    waiting for a writer (it is opened ``O_NONBLOCK``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular else 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):  # os.open takes a directory; fdopen's error would name the fd
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            raise Unreadable(f"{path} is a device, not a file")
        if regular and not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{path} is not a regular file")
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        if limit is None:
            return fh.read()
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
        data = fh.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise Unreadable(f"{path} is larger than {_mib(limit)}" + (f" ({_mib(size)})" if size > limit else ""))
        return data


class NotRegular(OSError):
    """A path :func:`open_append` refuses: a symlink, a FIFO, a device or a directory."""


def open_append(path: Path, mode: int = 0o644) -> int:
    """A descriptor appending to the regular file ``path`` (created with ``mode`` if absent);
    :class:`NotRegular` for anything else there (see :func:`open_regular`)."""
    return open_regular(path, os.O_WRONLY | os.O_APPEND, mode)


def open_regular(path: Path, access: int, mode: int = 0o644) -> int:
    """A descriptor of the regular file ``path`` opened with ``access`` (``os.O_RDWR``,
    ``os.O_WRONLY | os.O_APPEND``…), created with ``mode`` if absent.

    Never through a symlink (a write would reach the link's target) and never waiting on a
    FIFO (an open for writing blocks until a reader comes): :class:`NotRegular` instead.
    """
    flags = access | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise NotRegular(exc.errno, "not a regular file", str(path)) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return fd


def inside(base: Path, rel: str) -> Path | None:
    """``rel`` resolved under ``base`` (symlinks followed), or ``None`` when it is absolute,
    escapes ``base``, loops, or cannot be a path (a NUL)."""
    root = base.resolve()
    try:
        full = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop (Python 3.11)
        return None
    if Path(rel).is_absolute() or not full.is_relative_to(root):
        return None
    return full


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def tmp_name(dest: Path, suffix: str = ".tmp", tmp_dir: Path | None = None) -> Path:
    """A unique hidden name beside ``dest`` (or in ``tmp_dir``): ``.<name>.<pid>.<random><suffix>``."""
    return (dest.parent if tmp_dir is None else tmp_dir) / f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}"


def _make_tmp_dir(tmp_dir: Path) -> None:
    """Create ``tmp_dir`` (and its parents); a file or a symlink there is ``NotADirectoryError``:
    a temp file is never written through a link to somewhere else."""
    try:
        tmp_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # a file where the directory goes
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(tmp_dir)) from exc
    if tmp_dir.is_symlink():
        raise NotADirectoryError(errno.ENOTDIR, "a symlink, not a directory", str(tmp_dir))


def fsync_dir(path: Path) -> None:
    """Make the renames in directory ``path`` durable (no-op where a directory cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories; the rename is all we can do
    finally:
        os.close(fd)


@contextlib.contextmanager
def adjacent_tmp(dest: Path, *, suffix: str = ".tmp", tmp_dir: Path | None = None) -> Iterator[BinaryIO]:
    """An open, new binary temp file beside ``dest`` (or in ``tmp_dir``, created if absent:
    a directory on the same file system); it is gone when the block ends.

    Hand it to :func:`replace_durably` inside the block to make it ``dest``; on every other
    way out (an exception, a return, a failed check) the temp file is closed and removed.
    """
    if tmp_dir is not None:
        _make_tmp_dir(tmp_dir)
    path = tmp_name(dest, suffix, tmp_dir)
    fh = path.open("x+b")  # O_EXCL: never write into someone else's file
    try:
        yield fh
    finally:
        # On a full disk (ENOSPC, EFBIG) close() fails again flushing what the block's write
        # left in the buffer; the descriptor is closed all the same, and the temp must go.
        with contextlib.suppress(OSError):
            fh.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def replace_durably(tmp: BinaryIO | Path, dest: Path, *, sync_dir: bool = True) -> None:
    """fsync ``tmp``, rename it over ``dest``, fsync the directory.

    ``tmp`` is an open file from :func:`adjacent_tmp` (flushed, fsynced and closed here) or
    the path of a finished file beside ``dest``. ``sync_dir=False`` leaves the directory
    fsync to the caller's next replace in the same directory (one directory fsync makes
    every earlier rename there durable).
    """
    if isinstance(tmp, Path):
        path = tmp
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        path = Path(os.fsdecode(tmp.name))
        tmp.flush()
        os.fsync(tmp.fileno())
        tmp.close()
    os.replace(path, dest)
    if sync_dir:
        fsync_dir(dest.parent)


def create_durably(dest: Path, data: bytes, *, sync_dir: bool = True, tmp_dir: Path | None = None) -> None:
    """Create ``dest`` holding ``data``, durably and whole, never replacing a file:
    ``FileExistsError`` when ``dest`` exists (also when another process created it first).

    The temp file is hard-linked to ``dest`` (``link`` fails on an existing name, where a
    rename replaces it), then removed."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # a file where the directory goes: not "dest exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(exc.filename)) from exc
    with adjacent_tmp(dest, tmp_dir=tmp_dir) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        os.link(fh.name, dest)
    if sync_dir:
        fsync_dir(dest.parent)


def atomic_write(dest: Path, data: bytes | str, *, sync_dir: bool = True, tmp_dir: Path | None = None) -> None:
    """Replace ``dest`` with ``data`` (``str`` is written as UTF-8) durably; parents are created.
    ``tmp_dir``: where the temp file is written (see :func:`adjacent_tmp`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    dest.parent.mkdir(parents=True, exist_ok=True)
    with adjacent_tmp(dest, tmp_dir=tmp_dir) as fh:
        fh.write(raw)
        replace_durably(fh, dest, sync_dir=sync_dir)
