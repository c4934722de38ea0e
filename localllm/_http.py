"""The one translation of httpx exceptions: a short reason per class, most specific first.

Every HTTP client in localllm wraps its requests in :func:`map_httpx_errors`, passing a
``make(reason, exc)`` that builds its own subsystem's error (an ``AgentError``, an
``EmbedServerError``, a ``DownloadFailed``); the mapper raises it ``from`` the httpx
exception. A unit test enumerates every exception class httpx exports and proves each
has its own entry in :data:`REASONS` (none falls through to a parent's).

A leaf module: it imports nothing from localllm; httpx is imported on first use.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import ssl

    import httpx

__all__ = [
    "CONNECTION_REFUSED",
    "NAME_NOT_RESOLVED",
    "HeaderDeadline",
    "client",
    "is_loopback",
    "is_permanent",
    "map_httpx_errors",
    "reason_for",
    "reasons",
    "tls_context",
    "token_issue",
]

E = TypeVar("E", bound=BaseException)

#: refinements of ``httpx.ConnectError``, read from the OS error it was raised from
CONNECTION_REFUSED = "connection refused"
NAME_NOT_RESOLVED = "host name not resolved"


@functools.cache
def reasons() -> tuple[tuple[type[BaseException], str], ...]:
    """(httpx exception class, reason), most specific first: the first ``isinstance`` wins."""
    import httpx

    return (
        (httpx.ConnectTimeout, "timed out connecting"),
        (httpx.ReadTimeout, "timed out reading"),
        (httpx.WriteTimeout, "timed out writing"),
        (httpx.PoolTimeout, "timed out waiting for a free connection"),
        (httpx.TimeoutException, "timed out"),
        (httpx.ConnectError, "cannot connect"),
        (httpx.ReadError, "connection lost while reading"),
        (httpx.WriteError, "connection lost while writing"),
        (httpx.CloseError, "error closing the connection"),
        (httpx.NetworkError, "network error"),
        (httpx.RemoteProtocolError, "remote protocol error"),
        (httpx.LocalProtocolError, "local protocol error"),
        (httpx.ProtocolError, "protocol error"),
        (httpx.ProxyError, "proxy error"),
        (httpx.UnsupportedProtocol, "unsupported URL scheme"),
        (httpx.TransportError, "transport error"),
        (httpx.DecodingError, "cannot decode the response body"),
        (httpx.TooManyRedirects, "too many redirects"),
        (httpx.RequestError, "request failed"),
        (httpx.HTTPStatusError, "error status"),
        (httpx.HTTPError, "HTTP error"),
        (httpx.InvalidURL, "invalid URL"),
        (httpx.CookieConflict, "conflicting cookies"),
        (httpx.RequestNotRead, "request body not read"),
        (httpx.ResponseNotRead, "response body not read"),
        (httpx.StreamClosed, "stream already closed"),
        (httpx.StreamConsumed, "stream already consumed"),
        (httpx.StreamError, "stream error"),
    )


def client(**options: Any) -> httpx.Client:
    """An httpx client as localllm's own are made: deaf to the environment's proxy and TLS
    variables (``trust_env=False``: loopback servers must never be reached through a proxy),
    on the process's one TLS context (:func:`tls_context`). ``options`` go to ``httpx.Client``."""
    import httpx

    return httpx.Client(trust_env=False, verify=tls_context(), **options)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS settings of :func:`client`'s clients, built once per process and shared.

    What httpx builds for every new client unless given one (certifi's CA bundle, loaded:
    ~25 ms). A context may be shared between clients and threads; without it, the agent's
    client, made once the server answers /health, paid that on the way to the first answer.
    """
    import httpx

    return httpx.create_ssl_context(verify=True, trust_env=False)


@functools.cache
def _classes() -> tuple[type[BaseException], ...]:
    return tuple(cls for cls, _ in reasons())


def _os_error(exc: BaseException) -> OSError | None:
    """The OS error an httpx exception was raised from (httpx → httpcore → OSError)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def reason_for(exc: BaseException) -> str:
    """A short reason for an httpx exception (``"timed out reading"``, ``"too many redirects"``)."""
    import httpx

    if isinstance(exc, httpx.ConnectError):
        cause = _os_error(exc)
        if isinstance(cause, socket.gaierror):
            return NAME_NOT_RESOLVED
        if isinstance(cause, ConnectionRefusedError) or (cause is not None and cause.errno == errno.ECONNREFUSED):
            return CONNECTION_REFUSED
    for cls, reason in reasons():
        if isinstance(exc, cls):
            return reason
    return type(exc).__name__


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying the same request cannot help (bad URL, unknown host, redirect loop)."""
    import httpx

    if isinstance(
        exc,
        (
            httpx.InvalidURL,
            httpx.UnsupportedProtocol,
            httpx.TooManyRedirects,
            httpx.LocalProtocolError,
            httpx.CookieConflict,
            httpx.StreamError,
        ),
    ):
        return True
    return isinstance(exc, httpx.ConnectError) and reason_for(exc) == NAME_NOT_RESOLVED


@contextmanager
def map_httpx_errors(make: Callable[[str, BaseException], E]) -> Iterator[None]:
    """Turn any httpx exception raised in the block into ``make(reason, exc)``, chained."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _classes()):
            raise
        raise make(reason_for(exc), exc) from exc


def token_issue(token: str) -> str:
    """Why ``token`` cannot go out as ``Authorization: Bearer <token>``; ``""`` when it can.

    The reason never quotes the token (it is a secret). A key pasted with its newline or a
    typographic dash otherwise fails inside httpx as "Illegal header value" or an ascii
    codec error, naming neither the variable nor the fix.
    """
    if token != token.strip():
        return "starts or ends with whitespace (a newline copied with the key?)"
    if not token.isascii() or not token.isprintable() or any(ch.isspace() for ch in token):
        return "holds a space, a control character or a non-ASCII character (a bearer token cannot)"
    return ""


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address (where a server may run without a token)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HeaderDeadline:
    """Cut the connection when the response headers take longer than ``seconds`` in all.

    The read timeout restarts with every byte, so a server dripping a header byte a second
    never trips it; this timer shuts the socket down (found through httpcore's trace hook,
    passed as the request's ``trace`` extension) and the read fails at once. The socket is
    seen only when the request opens its connection: the client must not reuse kept-alive
    connections (``httpx.Limits(max_keepalive_connections=0)``).
    """

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._done = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            get = getattr(info.get("return_value"), "get_extra_info", None)
            sock = get("socket") if get is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self._sock = sock
                    late = self.fired
                if late:
                    self._cut()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
        self._cut()

    def _cut(self) -> None:
        with self._lock:
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def headers_in(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()

    def __enter__(self) -> HeaderDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.headers_in()
