"""Durable writes: the temp file beside the target is fsynced, renamed, and never left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localllm import _fs


def _siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def d(tmp_path: Path) -> Path:
    """An empty directory (tmp_path itself holds the isolated HOME)."""
    path = tmp_path / "d"
    path.mkdir()
    return path


def test_atomic_write_creates_parents_and_replaces(d: Path) -> None:
    dest = d / "a" / "b" / "file.json"
    _fs.atomic_write(dest, "first\n")
    _fs.atomic_write(dest, b"second\n")
    assert dest.read_bytes() == b"second\n"
    assert _siblings(dest.parent) == ["file.json"]


def test_fsyncs_the_file_before_the_rename_and_the_directory_after(d: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = d / "f"
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        order.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        order.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _fs.atomic_write(dest, b"x")
    assert order == ["fsync-file", "replace", "fsync-dir"]


def test_sync_dir_false_skips_only_the_directory_fsync(d: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _fs.atomic_write(d / "f", b"x", sync_dir=False)
    assert len(calls) == 1


def test_a_failed_block_removes_the_temp_and_keeps_the_old_file(d: Path) -> None:
    dest = d / "f"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), _fs.adjacent_tmp(dest, suffix=".part") as fh:
        fh.write(b"half")
        assert Path(fh.name).parent == d
        assert Path(fh.name).name.startswith(".f.") and fh.name.endswith(".part")
        raise RuntimeError("cut")
    assert dest.read_bytes() == b"old"
    assert _siblings(d) == ["f"]


def test_a_block_that_never_replaces_leaves_nothing(d: Path) -> None:
    dest = d / "f"
    with _fs.adjacent_tmp(dest) as fh:
        fh.write(b"unverified")
    assert _siblings(d) == []


def test_a_failed_rename_removes_the_temp(d: Path) -> None:
    dest = d / "dir-in-the-way"
    (dest / "child").mkdir(parents=True)
    with pytest.raises(OSError):
        _fs.atomic_write(dest, b"x")
    assert _siblings(d) == ["dir-in-the-way"]


def test_replace_durably_takes_a_finished_path(d: Path) -> None:
    src = d / "built"
    src.write_bytes(b"done")
    _fs.replace_durably(src, d / "final")
    assert (d / "final").read_bytes() == b"done"
    assert not src.exists()


def test_temp_names_are_unique(d: Path) -> None:
    names = {_fs.tmp_name(d / "f") for _ in range(200)}
    assert len(names) == 200
