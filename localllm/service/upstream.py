"""A small keep-alive HTTP/1.1 client on asyncio streams, for the hop to the service's own llama-servers.

Why not httpx's AsyncClient: the hop is loopback to a server we started, HTTP/1.1 with
``Content-Length`` or chunked answers, and its cost is the service's per-request overhead;
httpx's async stack (httpcore, anyio) costs more than the rest of the request together
(bench_service.py (c)). What this client does, and nothing more:

* at most ``limit`` open connections per server, idle ones included: llama-server serves
  each keep-alive connection on one of its few HTTP threads (``max(parallel + 2, cores - 1)``),
  so a pool larger than that leaves requests queued behind idle connections until the
  server's 5 s keep-alive timeout (measured: p99 5.6 s with 32 clients); beyond the limit a
  request waits here for a connection;
* one pooled connection per request, reused while the server keeps it alive (a reused
  connection the server closed meanwhile is retried once on a fresh one, before any byte of
  the answer is read);
* answers with ``Content-Length``, ``Transfer-Encoding: chunked`` or read-to-close;
* a request that is cancelled (the client left) or fails closes its connection — which is
  how llama-server learns to stop that generation — and never returns it to the pool.

Errors are :class:`UpstreamError` (an ``OSError``: connection refused, reset, a malformed
answer) or ``asyncio.TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["Answer", "Upstream", "UpstreamError"]

_MAX_HEAD = 64 * 1024


class UpstreamError(OSError):
    """The upstream connection failed or answered something that is not HTTP/1.1."""


@dataclass
class Answer:
    """An upstream answer whose body is read with :meth:`read` or :meth:`chunks` (once)."""

    status: int
    headers: dict[str, str]
    _conn: _Conn
    _owner: Upstream
    _done: bool = field(default=False)

    async def read(self) -> bytes:
        parts = [part async for part in self.chunks()]
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives (chunked encoding removed)."""
        reader = self._conn.reader
        ok = False
        try:
            length = self.headers.get("content-length")
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif length is not None:
                remaining = int(length)
                while remaining > 0:
                    data = await reader.read(min(remaining, 65536))
                    if not data:
                        raise UpstreamError("the upstream closed the connection mid-answer")
                    remaining -= len(data)
                    yield data
            else:
                self._conn.reusable = False
                while data := await reader.read(65536):
                    yield data
            ok = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise UpstreamError(f"malformed or cut upstream answer: {exc}") from None
        finally:
            self._done = True
            self._owner._finish(self._conn, ok=ok and self.headers.get("connection", "").lower() != "close")

    def close(self) -> None:
        """Give up on an unread answer (its connection is closed, not reused)."""
        if not self._done:
            self._done = True
            self._owner._finish(self._conn, ok=False)


@dataclass
class _Conn:
    key: tuple[str, int]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False
    reusable: bool = True
    closed: bool = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Upstream:
    """Pooled connections per ``host:port``; use from one event loop."""

    def __init__(self, *, connect_timeout: float = 5.0) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        self._connect_timeout = connect_timeout

    async def request(
        self, method: str, url: str, body: bytes = b"", headers: Mapping[str, str] | None = None, *, limit: int = 4
    ) -> Answer:
        """Send the request and read the answer's head; read the body from the :class:`Answer`."""
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for attempt in (1, 2):
            conn = await self._connection(host, port, fresh=attempt == 2, limit=max(1, limit))
            try:
                conn.writer.write(raw)
                await conn.writer.drain()
                status, answer_headers = await self._head(conn)
            except BaseException as exc:
                conn.closed = True
                self._drop(conn)
                self._wake(conn.key)
                retry = attempt == 1 and conn.reused and isinstance(exc, (OSError, asyncio.IncompleteReadError))
                if retry:
                    continue  # the server closed an idle connection meanwhile: once more, fresh
                if isinstance(exc, asyncio.IncompleteReadError):
                    raise UpstreamError("the upstream closed the connection before answering") from None
                raise
            return Answer(status, answer_headers, conn, self)
        raise AssertionError("unreachable")

    async def _connection(self, host: str, port: int, *, fresh: bool, limit: int) -> _Conn:
        key = (host, port)
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if not fresh and not conn.writer.is_closing() and not conn.reader.at_eof():
                    conn.reused = True
                    return conn
                self._drop(conn)
            if self._open.get(key, 0) < limit:
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters.get(key, []):
                    self._waiters[key].remove(waiter)
        self._open[key] = self._open.get(key, 0) + 1
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_MAX_HEAD), self._connect_timeout
            )
        except BaseException as exc:
            self._open[key] -= 1
            self._wake(key)
            if isinstance(exc, asyncio.TimeoutError):
                raise UpstreamError(f"timed out connecting to {host}:{port}") from None
            raise
        return _Conn(key, reader, writer)

    def _wake(self, key: tuple[str, int]) -> None:
        for waiter in self._waiters.get(key, []):
            if not waiter.done():
                waiter.set_result(None)
                return

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        self._open[conn.key] = max(0, self._open.get(conn.key, 0) - 1)

    async def _head(self, conn: _Conn) -> tuple[int, dict[str, str]]:
        try:
            block = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise UpstreamError("the upstream's answer head is too large") from None
        lines = block.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise UpstreamError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if status_line[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            conn.reusable = False
        return int(status_line[1]), headers

    def _finish(self, conn: _Conn, *, ok: bool) -> None:
        if conn.closed:
            return
        if not (ok and conn.reusable) or conn.writer.is_closing():
            conn.closed = True
            self._drop(conn)
        else:
            conn.reused = False
            self._idle.setdefault(conn.key, []).append(conn)
        self._wake(conn.key)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
