"""Lock keys: one directory, one naming rule, no key that leaves the locks directory; and
``hold``, the one way a lock is taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm._lock import KINDS, hold, lock_path, store_lock_path


def test_plain_names_map_to_kind_name_lock(tmp_path: Path) -> None:
    assert lock_path(tmp_path, "model", "qwen2.5-1.5b-0123456789abcdef") == (
        tmp_path / "locks" / "model-qwen2.5-1.5b-0123456789abcdef.lock"
    )


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "..", ".hidden", "x" * 500, "sp ace", "\ud800"])
def test_unsafe_names_stay_inside_the_locks_directory(tmp_path: Path, name: str) -> None:
    path = lock_path(tmp_path, "model", name)
    assert path.parent == tmp_path / "locks"
    assert "/" not in path.name and ".." not in path.name
    assert len(path.name) < 255


def test_distinct_unsafe_names_get_distinct_locks(tmp_path: Path) -> None:
    assert lock_path(tmp_path, "model", "a/b") != lock_path(tmp_path, "model", "a_b")
    assert lock_path(tmp_path, "model", "a/b") != lock_path(tmp_path, "model", "a?b")


def test_kinds_are_closed(tmp_path: Path) -> None:
    assert {"release", "download", "model", "source-build", "sdist"} == KINDS
    with pytest.raises(ValueError):
        lock_path(tmp_path, "nonsense", "x")


# ---------------------------------------------------------------- hold: the one lock helper


class _Held(Exception):
    def __init__(self, waited: float) -> None:
        self.waited = waited


class _Stopped(Exception):
    pass


@pytest.fixture
def taken(tmp_path: Path) -> Iterator[Path]:
    """A lock file another holder has (its own descriptor: flock excludes it like a process)."""
    import filelock

    path = tmp_path / "locks" / "x.lock"
    path.parent.mkdir()
    other = filelock.FileLock(str(path))
    other.acquire()
    try:
        yield path
    finally:
        other.release()


def test_hold_takes_a_free_lock_without_a_wait_notice(tmp_path: Path) -> None:
    notices: list[str] = []
    path = tmp_path / "new" / "dir" / "x.lock"
    with hold(path, timeout=5, waiting=lambda: notices.append("w"), gave_up=_Held):
        assert path.is_file()
    assert notices == []
    with hold(path, timeout=0, gave_up=_Held):  # released: free again
        pass
    assert path.is_file()  # left in place: a waiter waits on the file the next holder takes


def test_hold_says_once_that_it_waits_then_raises_the_callers_error(taken: Path) -> None:
    notices: list[str] = []
    with pytest.raises(_Held) as info, hold(taken, timeout=0.3, waiting=lambda: notices.append("w"), gave_up=_Held):
        pytest.fail("the lock was taken")
    assert notices == ["w"]
    assert info.value.waited >= 0.3


def test_hold_stops_waiting_when_cancelled(taken: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with (
        pytest.raises(_Stopped),
        hold(taken, timeout=3600, gave_up=_Held, cancel=cancel, cancelled=_Stopped, tick=0.05),
    ):
        pytest.fail("the lock was taken")


def test_hold_maps_an_unusable_lock_directory_with_the_callers_function(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with (
        pytest.raises(_Stopped),
        hold(tmp_path / "file" / "x.lock", timeout=0, gave_up=_Held, unusable=lambda e: _Stopped()),
    ):
        pytest.fail("no lock can be made there")
    with pytest.raises(OSError), hold(tmp_path / "file" / "x.lock", timeout=0, gave_up=_Held):
        pytest.fail("no lock can be made there")


def test_a_store_and_cache_rm_name_one_lock_file(tmp_path: Path) -> None:
    db = tmp_path / "embed" / "m-0123.sqlite"
    assert store_lock_path(db) == tmp_path / "embed" / "m-0123.sqlite.lock"
