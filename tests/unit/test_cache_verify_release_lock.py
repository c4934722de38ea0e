"""``cache verify --refetch`` of a release changed since install re-installs it under the lock
its installer holds, replacing it in one rename: while another process holds that lock the
release is left in place (it was moved aside first, so a server start found none)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localllm._lock import hold
from localllm.managed import cache_layout, ensure_server
from localllm.managed.cache import read_marker, release_manifest
from localllm.managed.inventory import Entry, verify_cache
from tests.unit.fakes.http_server import ArchiveServer
from tests.unit.fakes.release_archives import make_tar, release_members
from tests.unit.test_fetch_managed import _pins


def _changed(release: Path) -> bool:
    """Whether the release's files differ from its marker's manifest."""
    marker = read_marker(release) or {}
    files, links = release_manifest(release)
    return (files, links) != (marker.get("files"), marker.get("links"))


def _change_a_file(release: Path) -> dict[str, Any]:
    """Append to the first file the release's marker lists; the marker."""
    marker = read_marker(release)
    assert marker is not None
    with (release / sorted(marker["files"])[0]).open("ab") as fh:
        fh.write(b"changed")
    return marker


def test_a_changed_release_is_reinstalled_under_its_install_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_tar(tmp_path / "rel.tar.gz", release_members("llama-b9999")).read_bytes()
    pins = _pins(archive)
    with ArchiveServer({"llama-b9999-bin-test.tar.gz": archive}) as srv:
        release = ensure_server(mirror=srv.base_url, pins=pins).release_dir
        _change_a_file(release)
        layout = cache_layout()
        lock = layout.lock_path("release", release.name)
        result: list[object] = []

        def run() -> None:
            try:
                result.extend(verify_cache(layout, pins, refetch=True, mirrors=[srv.base_url], log=lambda _m: None))
            except BaseException as exc:  # handed to the test thread
                result.append(exc)

        said = ""
        thread = threading.Thread(target=run)
        with hold(lock, timeout=5, gave_up=lambda _w: AssertionError("the lock was free")):
            thread.start()
            deadline = time.monotonic() + 30
            while str(lock) not in said and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
                said += capsys.readouterr().err
            # the installer is waiting for the lock; the release is where it was, as it was
            waiting_in_place = thread.is_alive() and release.is_dir() and _changed(release)
        thread.join(timeout=60)
        fetched = len(srv.requests)
    entries = {e.kind: e for e in result if isinstance(e, Entry)}
    assert (waiting_in_place, thread.is_alive(), len(result)) == (True, False, 2)
    assert (entries["release"].status, entries["download"].status) == ("refetched", "ok")
    assert not _changed(release) and fetched == 1  # from the cached archive, not downloaded again


def test_a_failed_reinstall_leaves_the_release_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_tar(tmp_path / "rel.tar.gz", release_members("llama-b9999")).read_bytes()
    pins = _pins(archive)
    with ArchiveServer({"llama-b9999-bin-test.tar.gz": archive}) as srv:
        release = ensure_server(mirror=srv.base_url, pins=pins).release_dir
    marker = _change_a_file(release)
    layout = cache_layout()
    for download in layout.downloads_dir.rglob("*.tar.gz"):
        download.unlink()  # nothing to install it from, offline
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    [entry] = [e for e in verify_cache(layout, pins, refetch=True, mirrors=[], log=lambda _m: None)]
    assert (entry.kind, entry.status) == ("release", "corrupt")
    assert release.is_dir() and _changed(release) and read_marker(release) == marker
