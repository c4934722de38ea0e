"""Where cross-process locks live: one file per resource, named in one function.

``<root>/locks/<kind>-<name>.lock``. ``kind`` says what is locked (one of :data:`KINDS`)
and ``name`` which one. A name that is not a plain file name (a model id from a user's
pins file, say) is made one — unsafe characters replaced, its sha256 appended so that two
names never share a lock — so no lock key can become a path outside the locks directory.

An embedding store's lock is ``<db>.lock`` beside its database (:func:`store_lock_path`):
the store and ``cache rm`` take the same file.

:func:`hold` is the one way localllm takes such a lock: a first try without waiting, then
(when another process has it) one notice through ``waiting`` and a bounded wait against a
monotonic deadline, checked every ``tick`` for a cancel. What a failure means is the
caller's: it passes the error to raise on timeout, on cancel and when the lock file cannot
be made, so each names its own file and what to do.

A leaf module: it imports nothing from localllm (``filelock`` only when a lock is taken).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading

    import filelock

__all__ = ["KINDS", "LOCKS_DIR", "hold", "lock_path", "store_lock_path"]

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


def store_lock_path(db: Path) -> Path:
    """The lock of the embedding store whose database is ``db``: ``<db>.lock`` beside it."""
    return db.with_name(db.name + ".lock")


@contextlib.contextmanager
def hold(
    path: Path,
    *,
    timeout: float,
    gave_up: Callable[[float], BaseException],
    waiting: Callable[[], object] | None = None,
    unusable: Callable[[OSError], BaseException] | None = None,
    cancel: threading.Event | None = None,
    cancelled: Callable[[], BaseException] | None = None,
    tick: float = 0.25,
) -> Iterator[None]:
    """Hold the cross-process lock file ``path`` (its directory is created) for the block.

    ``waiting()`` is called once when another process has it; ``timeout`` seconds later
    ``gave_up(seconds waited)`` is raised. ``unusable(exc)`` is raised for an ``OSError``
    making the directory or taking the lock (without it, the ``OSError`` itself). With
    ``cancel``, the wait looks at it every ``tick`` seconds and raises ``cancelled()`` once
    it is set. The lock file stays in place on release: a process waiting on it must wait
    on the same file the next holder takes.
    """
    import filelock

    lock = filelock.FileLock(str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        outcome, waited = _acquire(lock, timeout, waiting, cancel, tick)
    except OSError as exc:
        if unusable is None:
            raise
        raise unusable(exc) from exc
    # raised here, outside the try: an error type that is also an OSError is not "unusable"
    if outcome == "cancelled" and cancelled is not None:
        raise cancelled()
    if outcome != "held":
        raise gave_up(waited)
    try:
        yield
    finally:
        lock.release()


def _acquire(
    lock: filelock.BaseFileLock,
    timeout: float,
    waiting: Callable[[], object] | None,
    cancel: threading.Event | None,
    tick: float,
) -> tuple[str, float]:
    """``("held" | "timeout" | "cancelled", seconds waited)``."""
    import filelock

    try:
        lock.acquire(timeout=0)
        return "held", 0.0
    except filelock.Timeout:
        if waiting is not None:
            waiting()
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if cancel is not None and cancel.is_set():
            return "cancelled", time.monotonic() - started
        remaining = deadline - time.monotonic()
        try:
            lock.acquire(timeout=max(0.0, min(remaining, tick) if cancel is not None else remaining))
            return "held", time.monotonic() - started
        except filelock.Timeout:
            if remaining <= 0:
                return "timeout", time.monotonic() - started
