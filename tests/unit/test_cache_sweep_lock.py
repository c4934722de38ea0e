"""The empty-directory sweep that ends ``cache rm`` and ``cache prune`` never takes what a
fetch in flight holds: its directory (made under its lock, empty until the download's first
file lands), the model's directory above it, or the ``.verified`` stamp it writes last.

The interleavings are forced, not raced for: a real :func:`fetch_artifact` paused under
its lock right after making its directory (a thread), a real ``localllm fetch model``
process paused mid-body (:class:`Fetcher`), a sweep run from inside the fetch's ``mkdir``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm.managed import fetch, verify
from localllm.managed.cache import CacheLayout, cache_layout
from localllm.managed.fetch import fetch_artifact
from localllm.managed.inventory import prune_cache, remove_entries
from localllm.managed.pins import Artifact, load_pins
from tests.unit.test_cache_rm_model_lock import DATA, FILE, SHA, Fetcher, PausingServer

ARTIFACT = Artifact(name="tiny", file=FILE, sha256=SHA)


def _mirror(tmp_path: Path) -> str:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / FILE).write_bytes(DATA)
    return str(mirror)


def _other_model(layout: CacheLayout) -> Path:
    """Another cached model (stale to the pins), for ``cache rm`` to remove."""
    other = layout.models_dir / "other" / ("a" * 16) / "other.gguf"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"GGUF another model")
    return other


class PausedFetch:
    """:func:`fetch_artifact` of ``tiny`` in a thread, stopped under its lock with its
    directory made and still empty (where it picks its first source)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.layout = cache_layout()
        self.dest = self.layout.models_dir / "tiny" / SHA[:16] / FILE
        self.inside = threading.Event()
        self.go = threading.Event()
        self.result: list[object] = []
        sources = fetch._from_sources

        def paused(*args: Any, **kwargs: Any) -> Path:
            self.inside.set()
            self.go.wait(30)
            return sources(*args, **kwargs)

        monkeypatch.setattr(fetch, "_from_sources", paused)
        mirror = _mirror(tmp_path)

        def run() -> None:
            try:
                lock = self.layout.model_lock_path("tiny", SHA[:16])
                self.result.append(fetch_artifact(ARTIFACT, self.dest, lock_path=lock, mirrors=[mirror], log=_quiet))
            except BaseException as exc:  # handed to the test thread
                self.result.append(exc)

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.inside.wait(30), self.result

    def finish(self) -> object:
        self.go.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        [outcome] = self.result
        return outcome


def _quiet(_message: str) -> None:
    pass


@pytest.fixture
def paused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PausedFetch]:
    running = PausedFetch(tmp_path, monkeypatch)
    try:
        yield running
    finally:
        running.go.set()
        running.thread.join(timeout=60)


def _prune(layout: CacheLayout) -> None:
    prune_cache(layout, load_pins(), dry_run=False)


def _rm_other(layout: CacheLayout) -> None:
    remove_entries(layout, load_pins(), "other")


@pytest.mark.parametrize("sweep", [_prune, _rm_other], ids=["prune", "rm-other-model"])
def test_the_empty_directory_of_a_fetch_in_flight_survives_the_sweep(
    paused: PausedFetch, sweep: Callable[[CacheLayout], None]
) -> None:
    layout = paused.layout
    other = _other_model(layout)
    abandoned = layout.models_dir / "old" / ("b" * 16)  # empty, nobody's: swept
    abandoned.mkdir(parents=True)
    key_dir = paused.dest.parent
    assert key_dir.is_dir() and not any(key_dir.iterdir())  # the fetch's window: made, still empty
    sweep(layout)
    assert key_dir.is_dir()
    assert not abandoned.exists() and not abandoned.parent.exists()
    if sweep is _rm_other:
        assert not other.exists() and not (layout.models_dir / "other").exists()
    assert paused.finish() == paused.dest
    assert paused.dest.read_bytes() == DATA and verify.stamp_matches(paused.dest, SHA)


def test_a_fetch_makes_its_directory_again_when_a_sweep_removes_the_model_directory_midway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # models/<id>/ is shared by every key of the model, so no one fetch's lock covers it: a
    # sweep may remove it between the fetch making it and making models/<id>/<key>/ in it
    layout = cache_layout()
    dest = layout.models_dir / "tiny" / SHA[:16] / FILE
    mkdir = os.mkdir
    swept: list[bool] = []

    def sweeping(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        mkdir(path, mode, **kwargs)
        if Path(path) == dest.parent.parent and not swept:
            _prune(layout)
            swept.append(not dest.parent.parent.exists())

    monkeypatch.setattr(os, "mkdir", sweeping)
    got = fetch_artifact(
        ARTIFACT,
        dest,
        lock_path=layout.model_lock_path("tiny", SHA[:16]),
        mirrors=[_mirror(tmp_path)],
        log=_quiet,
    )
    assert swept == [True]  # the sweep did land in the gap
    assert got == dest and dest.read_bytes() == DATA and verify.stamp_matches(dest, SHA)


def test_the_stamp_a_fetch_in_flight_writes_is_not_unlinked_by_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model file was deleted by hand, its stamp left behind; a fetch downloads it again
    layout = cache_layout()
    dest = layout.models_dir / "tiny" / SHA[:16] / FILE
    dest.parent.mkdir(parents=True)
    verify.stamp_path(dest).write_text('{"sha256": "an old copy\'s"}\n')
    server = PausingServer()
    fetcher = Fetcher(tmp_path, server)
    try:
        # the sweep finds the stamp's file missing; the fetch then lands the file and writes
        # its fresh stamp; only then does the sweep act on what it found
        exists = Path.exists
        landed: list[Path] = []

        def racing(self: Path) -> bool:
            there = exists(self)
            if self == dest and not there and not landed:
                landed.append(fetcher.finish())
            return there

        monkeypatch.setattr(Path, "exists", racing)
        _prune(layout)
        monkeypatch.undo()
        if not landed:  # the sweep left the fetch's directory alone: let the fetch end now
            landed.append(fetcher.finish())
    finally:
        fetcher.kill()
        server.close()
    assert landed == [dest] and dest.read_bytes() == DATA
    assert verify.stamp_matches(dest, SHA)
    # with no fetch in flight, a stamp whose file is gone is swept, and its directories
    dest.unlink()
    _prune(layout)
    assert not verify.stamp_path(dest).exists() and not (layout.models_dir / "tiny").exists()
