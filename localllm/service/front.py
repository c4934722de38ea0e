"""The HTTP server under the service's ASGI app: uvicorn (h11), with the bounds it lacks added.

Why uvicorn: measured against the stdlib ``http.server`` it replaces (README, "The HTTP
front"), one event loop holds thousands of idle connections for a few KiB each instead of
a thread each, parses chunked request bodies, and lets a handler notice a client leaving
(``http.disconnect``) — what cancelling an abandoned generation needs.

What is added here, in a protocol subclass:

* a **header timeout**: a connection must deliver a complete request line and headers
  within ``header_timeout`` s of connecting, or of its previous answer (uvicorn only times
  out idle keep-alive connections, so a client trickling header bytes was held forever);
* a **connection cap**: beyond ``max_connections`` a new connection gets a 503 with
  ``Retry-After`` and is closed;
* our own listening socket with a real **backlog**, bound before the thread starts so a
  busy port is an error at start-up, not in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.service.api import FrontLimits, ServiceApp

__all__ = ["Front"]

log = logging.getLogger("localllm.service")

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def _protocol_class(limits: FrontLimits) -> type[Any]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = (
        b'{"error": {"message": "too many connections", "type": "server_error", "param": null, '
        b'"code": "too_many_connections"}}'
    )
    busy = _BUSY % (limits.retry_after, len(body), body)

    class BoundedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _seen: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(busy)
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(limits.header_timeout, self._header_expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_expired(self) -> None:
            self._header_timer = None
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self.transport.close()  # no complete request in time (slowloris, half-open)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen and not cycle.response_complete:
                self._seen = cycle  # a request arrived: its handler owns the time now
                self._disarm()
            elif cycle is None or cycle.response_complete:
                self._arm()  # bytes of a next request: they must complete in time

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm()  # idle now: uvicorn's keep-alive timeout applies

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11


#: open files the service keeps beside its client connections (its upstreams, logs, models)
FD_RESERVE = 256


def _raise_fd_limit(wanted: int) -> None:
    """Lift the soft open-files limit towards ``wanted`` (the hard limit is the ceiling)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking TCP socket bound to ``host:port`` and listening (OSError when it cannot bind).

    Made before anything slow (fetching llama-server): a busy port is said at once, and a
    client connecting meanwhile waits in the backlog until the front serves it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio sets TCP_NODELAY on accepted sockets only when it is
    # IPPROTO_TCP (headers and body leave in two writes; Nagle would hold the body ~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Front:
    """uvicorn serving ``app`` on ``sock``, a socket from :func:`listen` (the front owns it from here)."""

    def __init__(self, app: ServiceApp, sock: socket.socket) -> None:
        self.app = app
        _raise_fd_limit(app.limits.max_connections + FD_RESERVE)
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def start(self) -> None:
        import uvicorn

        limits = self.app.limits
        config = uvicorn.Config(
            self.app,
            http=_protocol_class(limits),
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_keep_alive=max(1, round(limits.idle_timeout)),
            timeout_graceful_shutdown=2,
            backlog=limits.backlog,
            h11_max_incomplete_event_size=64 * 1024,  # request line + headers
            proxy_headers=False,  # no X-Forwarded-* rewriting: the client is who connected
            server_header=False,
            date_header=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="localllm-service-http", daemon=True)
        self._thread.start()
        self._started.wait(10.0)

    def _run(self) -> None:
        async def serve() -> None:
            self._started.set()
            try:
                await self._server.serve(sockets=[self.sock])
            finally:
                await self.app.aclose()

        try:
            asyncio.run(serve())
        except Exception as exc:  # the loop died: say so in one line
            log.error("the HTTP front stopped: %s: %s", type(exc).__name__, exc)
        finally:
            self._started.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close connections (in-flight requests get ~2 s), join the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()
