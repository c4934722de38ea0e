"""A loopback HTTP server for download tests: files by name, Range, and failure modes.

Use in-process (``with ArchiveServer(files) as srv: srv.url("name")``) or as a process
(``python http_server.py --dir DIR [--port 0]`` prints ``PORT <n>`` and serves DIR).

Behaviour, per GET ``/<name>`` (or ``/<prefix>/<name>``; only the last segment counts):
- ``Range: bytes=A-`` / ``A-B`` → 206 with Content-Range (416 past the end), unless
  ``ignore_range``: then always 200 with the whole file;
- ``cut_after=N``: the first ``cuts`` responses send their headers (full Content-Length),
  N body bytes, then close the connection mid-body;
- ``fail_first=K``: the first K requests get 503;
- ``delay``: seconds to sleep between 64 KiB chunks (to make concurrent fetches overlap);
- ``misbehave``: ``"redirect-loop"`` (302 to itself), ``"overlong"`` (Content-Length 1000x
  the file), ``"endless"`` (no Content-Length, the file's bytes repeated forever),
  ``"trickle"`` (one byte every ``delay`` s), ``"silent"`` (headers, then nothing);
- ``redirect_to``: every GET is a 302 to ``<redirect_to>/<name>?sig=…`` (a signed-URL-like query);
- every request is recorded in ``requests`` (name, Range header, status) for assertions.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlparse

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Request:
    name: str
    range: str | None
    status: int
    if_range: str | None = None


def etag_of(data: bytes) -> str:
    """The strong ETag the server sends for a file's bytes (and honours in If-Range)."""
    import hashlib

    return '"' + hashlib.sha256(data).hexdigest()[:16] + '"'


class ArchiveServer:
    """Serve ``files`` (name → bytes) and/or files of ``directory`` on 127.0.0.1."""

    def __init__(
        self,
        files: Mapping[str, bytes] | None = None,
        *,
        directory: Path | None = None,
        cut_after: int | None = None,
        cuts: int = 1,
        ignore_range: bool = False,
        fail_first: int = 0,
        delay: float = 0.0,
        misbehave: str | None = None,
        redirect_to: str | None = None,
        port: int = 0,
    ) -> None:
        self.files = dict(files or {})
        self.directory = directory
        self.cut_after = cut_after
        self.cuts_left = cuts if cut_after is not None else 0
        self.ignore_range = ignore_range
        self.fail_first = fail_first
        self.delay = delay
        self.misbehave = misbehave
        self.redirect_to = redirect_to
        self.sent = 0  # body bytes written, over all requests
        self.stopping = threading.Event()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        state = self

        class Handler(_Handler):
            archive = state

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def gets(self, name: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.name == name]

    def start(self) -> ArchiveServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ArchiveServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ request handling
    def _size_and_reader(self, name: str) -> tuple[int, Path | bytes] | None:
        if name in self.files:
            data = self.files[name]
            return len(data), data
        if self.directory is not None and name and "/" not in name and name not in (".", ".."):
            path = self.directory / name
            if path.is_file():
                return path.stat().st_size, path
        return None

    def handle(self, h: _Handler, *, head: bool) -> None:
        name = unquote(urlparse(h.path).path).rsplit("/", 1)[-1]
        rng = h.headers.get("Range")
        if self.redirect_to is not None:
            with self._lock:
                self.requests.append(Request(name, rng, 302, h.headers.get("If-Range")))
            h.send_response(302)
            h.send_header("Location", f"{self.redirect_to}/{name}?sig=SECRET")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        with self._lock:
            index = len(self.requests)
            found = self._size_and_reader(name)
            status = 200
            if index < self.fail_first:
                status = 503
            elif found is None:
                status = 404
            cut = None
            start, end = 0, (found[0] - 1 if found else -1)
            if status == 200 and found is not None:
                size = found[0]
                m = _RANGE.match(rng or "")
                if_range = h.headers.get("If-Range")
                if if_range is not None and if_range != self._etag(found[1]):
                    m = None  # the file changed since the client's bytes: the whole file, 200
                if m and not self.ignore_range:
                    start = int(m.group(1))
                    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                    status = 206 if start < size else 416
                if self.cuts_left > 0 and not head and status in (200, 206):
                    self.cuts_left -= 1
                    cut = self.cut_after
            self.requests.append(Request(name, rng, status, h.headers.get("If-Range")))
        if self.misbehave is not None and found is not None and status == 200:
            self._misbehave(h, found[1] if isinstance(found[1], bytes) else found[1].read_bytes())
            return
        if status in (404, 503):
            h.send_response(status)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        assert found is not None
        size, source = found
        if status == 416:
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{size}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        length = end - start + 1
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(length))
        if not self.ignore_range:
            h.send_header("Accept-Ranges", "bytes")
            h.send_header("ETag", self._etag(source))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if head:
            return
        to_send = length if cut is None else min(cut, length)
        try:
            self._send_body(h, source, start, to_send)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
            return
        if cut is not None:
            h.wfile.flush()
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _etag(source: Path | bytes) -> str:
        return etag_of(source if isinstance(source, bytes) else source.read_bytes())

    def _misbehave(self, h: _Handler, data: bytes) -> None:
        mode = self.misbehave
        if mode == "redirect-loop":
            h.send_response(302)
            h.send_header("Location", h.path)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        if mode == "overlong":
            h.send_header("Content-Length", str(len(data) * 1000))
        elif mode in ("trickle", "silent"):
            h.send_header("Content-Length", str(len(data)))
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        h.wfile.flush()
        try:
            if mode in {"endless", "overlong"}:
                while not self.stopping.is_set():
                    h.wfile.write(data)
                    self.sent += len(data)
            elif mode == "trickle":
                for i in range(len(data)):
                    if self.stopping.wait(self.delay):
                        return
                    h.wfile.write(data[i : i + 1])
                    h.wfile.flush()
                    self.sent += 1
            elif mode == "silent":
                self.stopping.wait(60)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True

    def _send_body(self, h: _Handler, source: Path | bytes, start: int, count: int) -> None:
        if isinstance(source, bytes):
            pos = start
            while pos < start + count:
                n = min(_CHUNK, start + count - pos)
                h.wfile.write(source[pos : pos + n])
                pos += n
                if self.delay:
                    h.wfile.flush()
                    time.sleep(self.delay)
            return
        h.wfile.flush()
        with source.open("rb") as fh:
            if self.delay:
                fh.seek(start)
                left = count
                while left:
                    block = fh.read(min(_CHUNK, left))
                    h.wfile.write(block)
                    left -= len(block)
                    time.sleep(self.delay)
            else:
                h.connection.sendfile(fh, start, count)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    archive: ArchiveServer

    def do_GET(self) -> None:
        self.archive.handle(self, head=False)

    def do_HEAD(self) -> None:
        self.archive.handle(self, head=True)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = ArchiveServer(directory=args.dir, port=args.port)
    sys.stdout.write(f"PORT {server.port}\n")
    sys.stdout.flush()
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
