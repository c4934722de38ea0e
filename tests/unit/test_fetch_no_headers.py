"""Attack: a download source that accepts the connection and never sends response headers
(issue 25e): it is a read timeout waiting for the response, said so, within the connect
timeout — not a "stalled 0 B/s" body."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from localllm.errors import DownloadFailed
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact

DATA = b"x" * 1000


def _loopback(handle: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A model URL on a loopback socket whose every connection ``handle`` serves, on a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=handle, args=(conn, stop), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/model.gguf"
    stop.set()
    sock.close()
    for conn in conns:
        conn.close()


@pytest.fixture
def mute() -> Iterator[str]:
    """Accepts, never answers."""
    yield from _loopback(lambda conn, stop: None)


@pytest.mark.parametrize("cancel", [False, True])
def test_no_response_headers_is_a_read_timeout_within_the_connect_timeout(
    tmp_path: Path, mute: str, cancel: bool
) -> None:
    art = Artifact(name="m", file="model.gguf", sha256=hashlib.sha256(DATA).hexdigest(), url=mute, size=len(DATA))
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(DownloadFailed) as info:
        fetch_artifact(
            art,
            tmp_path / "model.gguf",
            lock_path=tmp_path / "x.lock",
            log=lines.append,
            progress=False,
            timeout=httpx.Timeout(connect=1.0, read=60.0, write=5.0, pool=5.0),
            stall_window=10.0,
            backoff=0.01,
            cancel=threading.Event() if cancel else None,
        )
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "no response headers" in message and "read timeout" in message
    assert "stalled" not in message and "B/s" not in message
    assert elapsed < 3.0  # the connect timeout (1 s), not the stall window (10 s)


def test_the_first_fetch_discloses_before_it_fails(tmp_path: Path) -> None:
    """§9: the first fetch logs ``downloading <artifact> …`` before anything can fail, so a
    first managed use whose source is unreachable still says what it tried to download."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/model.gguf"
        art = Artifact(name="model m", file="model.gguf", sha256=hashlib.sha256(DATA).hexdigest(), url=url, size=1000)
        lines: list[str] = []
        with pytest.raises(DownloadFailed):
            fetch_artifact(
                art,
                tmp_path / "model.gguf",
                lock_path=tmp_path / "x.lock",
                log=lines.append,
                progress=False,
                retries=0,
                backoff=0.01,
            )
    assert lines and lines[0].startswith("downloading model m (1000 B) from " + url)


@pytest.fixture
def drip() -> Iterator[str]:
    """Answers a status line, then one header byte every 0.2 s, forever."""

    def one(conn: socket.socket, stop: threading.Event) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while not stop.wait(0.2):
                conn.sendall(b"a")
        except OSError:
            return

    yield from _loopback(one)


@pytest.mark.timeout(30)
def test_headers_dripped_a_byte_at_a_time_hit_the_header_deadline(tmp_path: Path, drip: str) -> None:
    art = Artifact(name="m", file="model.gguf", sha256=hashlib.sha256(DATA).hexdigest(), url=drip, size=len(DATA))
    started = time.monotonic()
    with pytest.raises(DownloadFailed) as info:  # ran forever before: every byte restarted the read timeout
        fetch_artifact(
            art,
            tmp_path / "model.gguf",
            lock_path=tmp_path / "x.lock",
            log=lambda _: None,
            progress=False,
            timeout=httpx.Timeout(connect=1.0, read=60.0, write=5.0, pool=5.0),
            stall_window=10.0,
            retries=0,
            backoff=0.01,
        )
    assert "no response headers" in str(info.value)
    assert time.monotonic() - started < 5.0
