"""Downloads that misbehave: each bad source is left quickly and the next one is used.

Real loopback servers (``ArchiveServer(misbehave=...)``): a redirect loop, a Content-Length
beyond the pin, an endless body, a trickle, a silent server, a host name that does not
resolve, and a caller cancelling mid-download.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.errors import DownloadCancelled, DownloadFailed
from localllm.managed import fetch as fetch_mod
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact
from tests.unit.fakes.http_server import ArchiveServer

NAME = "model.gguf"
DATA = os.urandom(200_000)


def _art(url: str | None, *, size: int | None = len(DATA)) -> Artifact:
    return Artifact(name="model test", file=NAME, sha256=hashlib.sha256(DATA).hexdigest(), url=url, size=size)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def _fetch(art: Artifact, dest: Path, log: Log | None = None, **kw: Any) -> Path:
    kw.setdefault("backoff", 0.01)
    return fetch_artifact(art, dest, lock_path=dest.parent / "x.lock", log=log or Log(), progress=False, **kw)


def _parts(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "c"
    path.mkdir()
    return path


def test_a_mirror_redirecting_to_itself_fails_cleanly_and_the_url_is_used(cache: Path) -> None:
    with ArchiveServer({NAME: DATA}, misbehave="redirect-loop") as loop, ArchiveServer({NAME: DATA}) as good:
        log = Log()
        dest = _fetch(_art(good.url(NAME)), cache / NAME, log, mirrors=[loop.base_url])
        assert dest.read_bytes() == DATA
        assert len(loop.requests) == 21  # httpx's 20 redirects, followed once each, never retried
        assert any("too many redirects" in line for line in log.lines)
    with ArchiveServer({NAME: DATA}, misbehave="redirect-loop") as loop:
        with pytest.raises(DownloadFailed) as info:
            _fetch(_art(loop.url(NAME)), cache / "other.gguf")
        assert isinstance(info.value.__cause__, __import__("httpx").TooManyRedirects)
    assert _parts(cache) == []


def test_a_content_length_beyond_the_pin_is_refused_at_once(cache: Path) -> None:
    with ArchiveServer({NAME: DATA}, misbehave="overlong") as liar, ArchiveServer({NAME: DATA}) as good:
        dest = _fetch(_art(good.url(NAME)), cache / NAME, mirrors=[liar.base_url])
        assert dest.read_bytes() == DATA
        assert len(liar.requests) == 1  # refused at the headers, not retried
    with ArchiveServer({NAME: DATA}, misbehave="overlong") as liar:
        with pytest.raises(DownloadFailed, match="pinned at 200000 bytes"):
            _fetch(_art(liar.url(NAME)), cache / "x.gguf")
        assert len(liar.requests) == 1


def test_an_endless_body_stops_at_the_first_byte_past_the_pin(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    biggest = [0]
    real_write = fetch_mod._FileDownload._write

    def spy(self: fetch_mod._FileDownload, block: bytes) -> None:
        real_write(self, block)
        biggest[0] = max(biggest[0], self.offset)

    monkeypatch.setattr(fetch_mod._FileDownload, "_write", spy)
    with ArchiveServer({NAME: DATA}, misbehave="endless") as endless:
        started = time.monotonic()
        with pytest.raises(DownloadFailed, match="more than the 200000 bytes"):
            _fetch(_art(endless.url(NAME)), cache / NAME)
        assert time.monotonic() - started < 5
        assert len(endless.requests) == 1
    assert biggest[0] <= len(DATA)
    assert _parts(cache) == []


def test_a_trickle_is_abandoned_even_without_a_pinned_size(cache: Path) -> None:
    with (
        ArchiveServer({NAME: DATA}, misbehave="trickle", delay=0.05) as slow,
        pytest.raises(DownloadFailed, match="stalled"),
    ):
        _fetch(_art(slow.url(NAME), size=None), cache / NAME, min_rate=1000, stall_window=0.5)


def test_a_trickling_mirror_is_abandoned_for_the_next_source(cache: Path) -> None:
    with ArchiveServer({NAME: DATA}, misbehave="trickle", delay=0.02) as slow, ArchiveServer({NAME: DATA}) as good:
        log = Log()
        started = time.monotonic()
        dest = _fetch(_art(good.url(NAME)), cache / NAME, log, mirrors=[slow.base_url], min_rate=1000, stall_window=0.5)
        elapsed = time.monotonic() - started
        assert dest.read_bytes() == DATA
        assert elapsed < 3.0
        assert 0 < slow.sent < 200
        assert any("stalled" in line for line in log.lines)


def test_a_silent_mirror_is_abandoned_after_the_stall_window(cache: Path) -> None:
    with ArchiveServer({NAME: DATA}, misbehave="silent") as silent, ArchiveServer({NAME: DATA}) as good:
        started = time.monotonic()
        dest = _fetch(_art(good.url(NAME)), cache / NAME, mirrors=[silent.base_url], min_rate=1000, stall_window=0.5)
        assert dest.read_bytes() == DATA
        assert time.monotonic() - started < 3.0


def test_a_name_that_does_not_resolve_is_tried_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo
    lookups: list[object] = []

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "mirror.invalid":
            lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with ArchiveServer({NAME: DATA}) as good:
        log = Log()
        started = time.monotonic()
        dest = _fetch(_art(good.url(NAME)), cache / NAME, log, mirrors=["http://mirror.invalid/m"], backoff=1.0)
        assert dest.read_bytes() == DATA
        assert time.monotonic() - started < 2.0  # no 0.5+1+2+4+8 s of backoff
    assert lookups == ["mirror.invalid"]
    assert not any("retrying" in line for line in log.lines)
    assert any("host name not resolved" in line for line in log.lines)


def test_cancel_stops_a_download_promptly_and_leaves_no_partial_file(cache: Path) -> None:
    cancel = threading.Event()
    with ArchiveServer({NAME: DATA}, delay=0.3) as slow:  # ~1 s for the whole body
        timer = threading.Timer(0.2, cancel.set)
        timer.start()
        started = time.monotonic()
        with pytest.raises(DownloadCancelled):
            _fetch(_art(slow.url(NAME)), cache / NAME, cancel=cancel)
        elapsed = time.monotonic() - started
        timer.join()
    assert elapsed < 1.0
    assert _parts(cache) == [] and not (cache / NAME).exists()


def test_cancel_interrupts_a_silent_server(cache: Path) -> None:
    cancel = threading.Event()
    with ArchiveServer({NAME: DATA}, misbehave="silent") as silent:
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(DownloadCancelled):
            _fetch(_art(silent.url(NAME)), cache / NAME, cancel=cancel)
        assert time.monotonic() - started < 1.0
    assert _parts(cache) == []


def test_cancel_interrupts_the_backoff(cache: Path) -> None:
    cancel = threading.Event()
    with ArchiveServer({NAME: DATA}, fail_first=100) as failing:
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(DownloadCancelled):
            _fetch(_art(failing.url(NAME)), cache / NAME, cancel=cancel, backoff=5.0)
        assert time.monotonic() - started < 1.0


def test_cancel_interrupts_the_wait_for_another_process_lock(cache: Path) -> None:
    import filelock

    lock = filelock.FileLock(str(cache / "x.lock"))
    lock.acquire()
    try:
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        log = Log()
        with pytest.raises(DownloadCancelled, match="waiting for the lock"):
            _fetch(_art("http://127.0.0.1:9/never"), cache / NAME, log, cancel=cancel)
        assert time.monotonic() - started < 1.0
        assert any("waiting for lock" in line for line in log.lines)
    finally:
        lock.release()


def test_cli_fetch_model_through_a_redirect_loop_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from localllm import cli

    repo = Path(__file__).resolve().parents[2]
    data = json.loads((repo / "pins" / "artifacts.json").read_text())
    with ArchiveServer({NAME: DATA}, misbehave="redirect-loop") as loop:
        data["models"]["entries"]["tiny"] = {
            "role": "chat",
            "file": NAME,
            "url": None,
            "sha256": hashlib.sha256(DATA).hexdigest(),
            "size": len(DATA),
        }
        custom = tmp_path / "pins.json"
        custom.write_text(json.dumps(data))
        monkeypatch.setattr("localllm.managed.pins.default_pins_path", lambda: custom)
        code = cli.main(["fetch", "model", "tiny", "--mirror", loop.base_url])
    err = capsys.readouterr().err
    assert code == 1
    assert "too many redirects" in err and "Traceback" not in err


def test_with_a_cancel_hook_pauses_longer_than_a_tick_resume_and_finish(cache: Path) -> None:
    # Pauses of 0.4 s exceed the 0.25 s read tick: each quiet read reconnects with Range,
    # none counts as a failure, and the file completes.
    with ArchiveServer({NAME: DATA}, delay=0.4) as paused:
        dest = _fetch(_art(paused.url(NAME)), cache / NAME, cancel=threading.Event(), retries=0)
        ranges = [r.range for r in paused.gets(NAME)]
    assert dest.read_bytes() == DATA
    assert len(ranges) > 1 and ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:])


def test_a_directory_mirror_with_the_wrong_size_is_skipped_without_copying(cache: Path, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / NAME).write_bytes(DATA * 3)
    with ArchiveServer({NAME: DATA}) as good:
        log = Log()
        dest = _fetch(_art(good.url(NAME)), cache / NAME, log, mirrors=[str(mirror)])
        assert dest.read_bytes() == DATA
    assert any("pinned at 200000" in line for line in log.lines)
    assert not any(f"from {mirror}" in line for line in log.lines if line.startswith("downloading"))
