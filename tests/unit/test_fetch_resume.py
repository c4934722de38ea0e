"""Never throw a download away: Ctrl-C, a crash or a dead network keep the bytes that
arrived; the next fetch rehashes them and asks a loopback server for the rest with
``Range`` and ``If-Range``; what fails the sha256 is never kept."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.errors import ChecksumMismatch, DownloadCancelled, DownloadFailed, InsufficientSpace
from localllm.managed import fetch as fetch_mod
from localllm.managed.fetch import fetch_artifact, partial_path
from localllm.managed.pins import Artifact
from tests.unit.fakes.http_server import ArchiveServer, etag_of

REPO = Path(__file__).resolve().parents[2]
DATA = os.urandom(3 << 20)
NAME = "model.gguf"


def _artifact(url: str, data: bytes = DATA) -> Artifact:
    return Artifact(name="model", file=NAME, sha256=hashlib.sha256(data).hexdigest(), url=url, size=len(data))


def _fetch(art: Artifact, dest: Path, lines: list[str] | None = None) -> Path:
    log = lines.append if lines is not None else (lambda _: None)
    return fetch_artifact(art, dest, lock_path=dest.parent / "x.lock", log=log, backoff=0.01, progress=False)


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Ctrl-C (KeyboardInterrupt) once ``limit`` bytes are written."""
    real = fetch_mod._FileDownload._write

    def write(self: fetch_mod._FileDownload, block: bytes) -> None:
        real(self, block)
        if self.offset >= limit:
            raise KeyboardInterrupt

    monkeypatch.setattr(fetch_mod._FileDownload, "_write", write)


def test_ctrl_c_keeps_the_partial_and_the_rerun_resumes_with_range_and_if_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}) as srv:
        art = _artifact(srv.url(NAME))
        _interrupt_after(monkeypatch, 1 << 20)
        with pytest.raises(KeyboardInterrupt):
            _fetch(art, dest)
        monkeypatch.undo()
        partial = partial_path(dest, art.sha256 or "")
        kept = partial.stat().st_size
        assert kept >= 1 << 20 and not dest.exists()
        lines: list[str] = []
        assert _fetch(art, dest, lines).read_bytes() == DATA
        first, second = srv.gets(NAME)
    assert first.range is None
    assert (second.range, second.status, second.if_range) == (f"bytes={kept}-", 206, etag_of(DATA))
    assert srv.sent < len(DATA) + kept  # the kept bytes were not sent twice
    assert not partial.exists() and not partial.with_name(partial.name + ".json").exists()
    assert any(f"resuming {NAME} from byte {kept}" in line for line in lines)


def test_a_killed_process_leaves_bytes_the_next_run_resumes(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}, delay=0.05) as srv:
        art = _artifact(srv.url(NAME))
        script = (
            "import sys\nfrom pathlib import Path\nfrom localllm.managed.fetch import fetch_artifact\n"
            "from localllm.managed.pins import Artifact\n"
            f"art = Artifact(name='model', file={NAME!r}, sha256={art.sha256!r}, url={art.url!r}, size={len(DATA)})\n"
            f"fetch_artifact(art, Path({str(dest)!r}), lock_path=Path({str(tmp_path / 'y.lock')!r}), progress=False)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)})
        partial = partial_path(dest, art.sha256 or "")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < 256 << 10):
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)  # a crash: nothing runs after this
        child.wait(10)
        kept = partial.stat().st_size
        assert 0 < kept < len(DATA)
        assert _fetch(art, dest).read_bytes() == DATA
        last = srv.gets(NAME)[-1]
    assert last.range is not None and int(last.range.removeprefix("bytes=").rstrip("-")) >= kept - (64 << 10)
    assert last.status == 206


def test_a_file_changed_upstream_is_fetched_whole_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}) as srv:
        art = _artifact(srv.url(NAME))
        _interrupt_after(monkeypatch, 1 << 20)
        with pytest.raises(KeyboardInterrupt):
            _fetch(art, dest)
        monkeypatch.undo()
        srv.files[NAME] = DATA[::-1]  # the bytes behind the URL changed (and the pin with them)
        changed = _artifact(srv.url(NAME), DATA[::-1])
        assert partial_path(dest, changed.sha256 or "") != partial_path(dest, art.sha256 or "")  # pin-keyed
        _fetch(changed, dest)
        assert dest.read_bytes() == DATA[::-1]


def test_if_range_mismatch_restarts_from_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}) as srv:
        art = _artifact(srv.url(NAME))
        _interrupt_after(monkeypatch, 1 << 20)
        with pytest.raises(KeyboardInterrupt):
            _fetch(art, dest)
        monkeypatch.undo()
        meta = partial_path(dest, art.sha256 or "").with_name(partial_path(dest, art.sha256 or "").name + ".json")
        meta.write_text(json.dumps({"url": srv.url(NAME), "validator": '"stale"'}))
        assert _fetch(art, dest).read_bytes() == DATA
        last = srv.gets(NAME)[-1]
    assert (last.if_range, last.status) == ('"stale"', 200)  # the server sent the whole file


def test_kept_bytes_that_are_wrong_fail_the_hash_and_the_file_is_fetched_again_from_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}) as srv:
        art = _artifact(srv.url(NAME))
        _interrupt_after(monkeypatch, 1 << 20)
        with pytest.raises(KeyboardInterrupt):
            _fetch(art, dest)
        monkeypatch.undo()
        partial = partial_path(dest, art.sha256 or "")
        with partial.open("r+b") as fh:  # a flipped byte in what was kept
            fh.seek(100)
            fh.write(bytes([DATA[100] ^ 0xFF]))
        lines: list[str] = []
        assert _fetch(art, dest, lines).read_bytes() == DATA  # ChecksumMismatch before: once more, from byte 0
        resumed, fresh = srv.gets(NAME)[-2:]
        assert (resumed.range or "").startswith("bytes=") and fresh.range is None
        assert not partial.exists()
        assert any("from zero" in line for line in lines)


def test_a_fresh_download_that_fails_the_hash_is_not_retried(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA[::-1]}) as srv:
        with pytest.raises(ChecksumMismatch):
            _fetch(_artifact(srv.url(NAME)), dest)
        assert len(srv.gets(NAME)) == 1
    assert not dest.exists() and _leftovers(dest.parent) == []


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".lock"))


def test_a_partial_from_another_source_is_not_resumed(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    wrong = os.urandom(len(DATA))
    art = Artifact(name="model", file=NAME, sha256=hashlib.sha256(DATA).hexdigest(), url=None, size=len(DATA))
    # mirror 1 sends other bytes and drops the connection each time (no Range: no progress)
    with (
        ArchiveServer({NAME: wrong}, cut_after=100_000, cuts=100, ignore_range=True) as bad,
        ArchiveServer({NAME: DATA}) as good,
    ):
        path = fetch_artifact(
            art,
            dest,
            lock_path=dest.parent / "x.lock",
            mirrors=[bad.base_url, good.base_url],
            log=lambda _: None,
            retries=0,
            backoff=0.01,
            progress=False,
        )
        assert path.read_bytes() == DATA  # ChecksumMismatch blamed on the good mirror before
        assert [g.range for g in good.gets(NAME)] == [None]


def test_a_full_disk_keeps_no_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    real = fetch_mod._FileDownload._write

    def write(self: fetch_mod._FileDownload, block: bytes) -> None:
        if self.offset >= 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, block)

    monkeypatch.setattr(fetch_mod._FileDownload, "_write", write)
    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    with ArchiveServer({NAME: DATA}) as srv, pytest.raises(DownloadFailed):
        _fetch(_artifact(srv.url(NAME)), dest)
    assert _leftovers(dest.parent) == []  # the partial was kept (and resumed into a full disk) before


def test_an_endless_body_of_unknown_size_stops_before_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    real = shutil.disk_usage
    room = fetch_mod.SPACE_MARGIN + (4 << 20)

    def usage(path: str | os.PathLike[str]) -> object:
        # the disk holds `room` free bytes before the download; what it writes uses them up
        written = sum(p.stat().st_size for p in dest.parent.iterdir())
        return real(path)._replace(free=room - written)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    art = Artifact(name="model", file=NAME, sha256="a" * 64, url=None, size=None)
    with ArchiveServer({NAME: DATA}, misbehave="endless") as srv, pytest.raises(InsufficientSpace):
        fetch_artifact(
            art,
            dest,
            lock_path=dest.parent / "x.lock",
            mirrors=[srv.base_url],
            log=lambda _: None,
            retries=0,
            progress=False,
        )
    assert _leftovers(dest.parent) == []


def test_a_cancelled_download_keeps_nothing(tmp_path: Path) -> None:
    import threading

    dest = tmp_path / "cache" / NAME
    dest.parent.mkdir()
    cancel = threading.Event()
    with ArchiveServer({NAME: DATA}, delay=0.05) as srv:
        art = _artifact(srv.url(NAME))
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        with pytest.raises(DownloadCancelled):
            fetch_artifact(art, dest, lock_path=tmp_path / "l.lock", cancel=cancel, progress=False, log=lambda _: None)
        timer.join()
    assert sorted(p.name for p in dest.parent.iterdir()) == []
