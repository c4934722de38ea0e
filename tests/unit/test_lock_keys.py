"""Lock keys: one directory, one naming rule, no key that leaves the locks directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm._lock import KINDS, lock_path


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
