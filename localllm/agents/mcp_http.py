"""``mcp_http``: an MCP server over streamable HTTP whose ``tool`` answers agent calls.

A small synchronous MCP client on httpx, not the ``mcp`` SDK's client: the SDK client is
asyncio/anyio-only, so a synchronous runtime would need an event loop thread per agent
and would cancel through anyio scopes, while the protocol we need is four messages. A
plain ``httpx.Client`` gives finite per-phase timeouts bounded by the call's monotonic
deadline, thread-safe concurrent calls on one session, and no runtime dependency on the
SDK (it is a dev dependency: the tests run against a real SDK server).

Protocol (MCP streamable HTTP, 2025-03-26 to 2025-11-25): every message is a POST to
``endpoint`` with ``Accept: application/json, text/event-stream``; the answer is either
one JSON body or an SSE stream in which we wait for the response whose ``id`` is ours.
Once per agent instance: ``initialize`` offering the newest version we speak (the
server's answer must be in our supported list, else ``transport_error``), then
``notifications/initialized``; the ``Mcp-Session-Id`` the server assigns and
``MCP-Protocol-Version`` are sent on every later request, and win over configured
``headers`` of the same name (as do ``Accept`` and ``Content-Type``; case-insensitive).
Each call is one ``tools/call`` (result rules in :mod:`localllm.agents._mcp`).

SSE (WHATWG framing): events without data (the priming event of 2025-11-25
resumability) are skipped; ``id`` and ``retry`` are remembered. A stream that ends before
our response, after the server gave an event id, is resumed: wait ``retry`` (1 s if none
was given), ``GET`` with ``Last-Event-ID``, keep reading — within the call's deadline, at
most :data:`_MAX_RESUMES` times without a new event. Server→client requests, on the POST
stream, a resumed stream or the standalone ``GET`` stream a background thread keeps open
per session, are answered with a POST: ``ping`` → ``{}``, ``elicitation/create`` →
decline (or the form's defaults with ``elicitation: defaults``), others → "method not
found" (:func:`localllm.agents._mcp.reply_to_server_request`). A response that arrives
on another of the agent's streams (some servers answer on whichever is open) is handed to
the call waiting for it, whose own stream is woken.

Sessions: a 404, or a 400, for our ``Mcp-Session-Id`` means the server forgot it (a
restart; servers disagree on the status): we re-initialise once and resend the call — the
request was refused, so it never ran. ``close()`` sends a best-effort ``DELETE``.
Redirects: 307/308 to the same origin (scheme, host, port) are followed, at most
:data:`_MAX_REDIRECTS`, body and headers kept; any other redirect is an error naming the
target (headers carry secrets, and 301–303 would turn the POST into a GET).

Errors: ``isError``, JSON-RPC errors, HTTP statuses, connection/TLS failures, bodies that
do not parse, and protocol violations are ``transport_error`` (bodies quoted truncated);
a passed deadline is ``deadline_exceeded``. ``headers`` values are secrets: they are sent,
never logged, and replaced by ``***`` in any error text; ``repr`` shows header names only.

Cancellation: every read is bounded by the call's deadline, so a call ends by itself at
the deadline; ``cancel`` marks the call so that it stops at the next event and reports
``deadline_exceeded``. Closing a socket under a thread blocked on it is not something
httpx supports, so ``cancel`` does not try.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from localllm import _http
from localllm._http import map_httpx_errors
from localllm.agents import _mcp
from localllm.agents.base import Agent
from localllm.config import McpHttpDecl
from localllm.errors import AgentError, ErrorKind, truncate_detail
from localllm.redact import Redactor
from localllm.wire import AskRequest, AskResponse

logger = logging.getLogger(__name__)

#: cap on the connect phase (a dead host should not eat a 300 s deadline)
_CONNECT_TIMEOUT = 10.0
#: DELETE of the session on close; a POST answering a server request from the listener
_CLOSE_TIMEOUT = 2.0
_ANSWER_TIMEOUT = 10.0
#: largest JSON body or SSE event we accept
_MAX_BODY = 64 * 1024 * 1024
#: how much of an error response's body is read (for its quote in the error)
_ERROR_HEAD = 64 * 1024
_ACCEPT = "application/json, text/event-stream"
_SSE = "text/event-stream"
_EOL = re.compile(rb"\r\n|\r|\n")
#: headers the client owns: a configured header of the same name (any case) is dropped
_PROTOCOL_HEADERS = frozenset({"accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"})
_MAX_REDIRECTS = 3
#: reconnect delay when the server sent no ``retry``; resumes in a row without a new event
_DEFAULT_RETRY = 1.0
_MAX_RESUMES = 5
#: a server's ``retry`` is capped at this many seconds (a wait is interrupted by close())
_MAX_RETRY = 3600.0
#: the standalone GET stream: consecutive failures before the listener gives up
_LISTEN_FAILURES = 3
#: how long the handshake waits for the GET stream to open; how long one may stay silent
_LISTEN_WAIT = 2.0
_LISTEN_SPAN = 86400.0
#: the standalone stream's connect and response headers must come within this (less than
#: close()'s wait for the listener), so a server that never answers the GET costs no thread
_LISTEN_HEADERS = 1.5
#: a refused connection is retried (nothing was sent) for this long, within the call's
#: deadline: a server started beside the config binds a moment after it loads
_CONNECT_RETRY = 3.0
_LISTENER = "(listener)"


def safe_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (where tokens hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port or default


def _retry_seconds(digits: str) -> float:
    """An SSE ``retry`` field (milliseconds, ASCII digits) in seconds, at most
    :data:`_MAX_RETRY`: 5000 digits made ``int()`` raise, and 1e11 s overflowed a wait."""
    digits = digits.lstrip("0")
    if len(digits) > 9:
        return _MAX_RETRY
    return min(int(digits or "0") / 1000, _MAX_RETRY)


class _SessionExpired(Exception):
    """Internal: the server answered 404 or 400 for our ``Mcp-Session-Id``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(status)
        self.status = status
        self.text = text


@dataclass(frozen=True, eq=False)
class _Session:
    """One initialised MCP session; replaced whole (compared by identity), so a call never
    sees a half-updated one."""

    #: ``None`` when the server is stateless and assigned no id
    session_id: str | None
    protocol_version: str


@dataclass
class _Resume:
    """What one logical SSE stream told us for resuming it: last event id, retry delay."""

    last_event_id: str | None = None
    retry: float = _DEFAULT_RETRY


class McpHttpAgent(Agent):
    """An ``mcp_http`` agent plugin; see the module docstring for the protocol."""

    plugin: ClassVar[str] = "mcp_http"

    def __init__(
        self,
        decl: McpHttpDecl,
        *,
        transport: httpx.BaseTransport | None = None,
        secrets: Sequence[str] | None = None,
    ) -> None:
        super().__init__(decl.alias)
        self.decl = decl
        self._url = safe_url(decl.endpoint)
        self._redact = Redactor(list(decl.headers.values()) if secrets is None else secrets)
        # no kept-alive connections: each request opens its own, so its socket is known (the
        # trace hook sees the connect) and a deadline can cut a server dripping its headers
        self._client = httpx.Client(
            transport=transport, follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._ids = itertools.count(1)
        self._session_lock = threading.Lock()
        self._session: _Session | None = None
        self._cancelled: set[str] = set()
        self._closed = False
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._inflight: set[httpx.Response] = set()
        self._inflight_lock = threading.Lock()
        #: request id → its response once it arrived on another stream (``None``: awaited)
        self._pending: dict[int, dict[str, Any] | None] = {}
        #: request id → the SSE stream its call is reading now (woken when it arrives elsewhere)
        self._reading_for: dict[int, httpx.Response] = {}

    def __repr__(self) -> str:
        return f"<McpHttpAgent {self.alias} endpoint={self._url!r} header_keys={sorted(self.decl.headers)}>"

    @property
    def session_id(self) -> str | None:
        """The server-assigned ``Mcp-Session-Id`` (``None`` before the first call)."""
        session = self._session
        return session.session_id if session is not None else None

    @property
    def protocol_version(self) -> str | None:
        """The negotiated MCP protocol version (``None`` before the first call)."""
        session = self._session
        return session.protocol_version if session is not None else None

    # -- the call --------------------------------------------------------------------

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        if self._closed:
            raise self._error("agent is closed")
        call_id = request.call_id
        try:
            message = self._tools_call(request, deadline, call_id)
        finally:
            self._cancelled.discard(call_id)
        result = _mcp.result_of(message, alias=self.alias, what=f"tools/call {self.decl.tool!r}")
        return _mcp.answer_from_tool_result(result, alias=self.alias, tool=self.decl.tool)

    def _tools_call(self, request: AskRequest, deadline: float, call_id: str) -> dict[str, Any]:
        session = self._session or self._new_session(None, deadline, call_id)
        message = _mcp.tools_call_request(next(self._ids), self.decl.tool, request)
        try:
            reply = self._post(message, session, deadline, call_id)
        except _SessionExpired as first:
            # The server forgot the session (a restart); the request was refused, never ran.
            logger.info("%s: MCP session unknown to the server (HTTP %d); re-initialising", self.alias, first.status)
            session = self._new_session(session, deadline, call_id)
            try:
                reply = self._post(message, session, deadline, call_id)
            except _SessionExpired as again:
                raise self._error(
                    f"tools/call: HTTP {again.status} from {self._url} for a freshly initialised session: "
                    f"{truncate_detail(self._redact(again.text))}"
                ) from None
        assert reply is not None
        return reply

    # -- session ---------------------------------------------------------------------

    def _new_session(self, stale: _Session | None, deadline: float, call_id: str) -> _Session:
        """Initialise a session unless another thread already replaced ``stale``."""
        # Waiting for another thread's handshake is bounded by our own deadline too.
        if not self._session_lock.acquire(timeout=self.remaining(deadline)):
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED, "deadline passed waiting for the MCP handshake", alias=self.alias
            )
        try:
            current = self._session
            if current is not None and current is not stale:
                return current  # concurrent calls saw the same 404: one handshake serves all
            session = self._initialize(deadline, call_id)
            self._session = session
            if session.session_id is not None and not self._closed:
                # Wait (briefly) until the GET stream is open or refused: a server sends the
                # requests it does not tie to a call there, and drops them when none is open.
                opened = threading.Event()
                self._listener = threading.Thread(
                    target=self._listen, args=(session, opened), daemon=True, name=f"mcp-listen-{self.alias}"
                )
                self._listener.start()
                opened.wait(min(self.remaining(deadline), _LISTEN_WAIT))
            return session
        finally:
            self._session_lock.release()

    def _initialize(self, deadline: float, call_id: str) -> _Session:
        """``initialize`` + ``notifications/initialized``; the new session."""
        message = _mcp.initialize_request(next(self._ids))
        try:
            assigned: list[str | None] = []
            reply = self._post(message, None, deadline, call_id, session_header=assigned)
            assert reply is not None
            result = _mcp.result_of(reply, alias=self.alias, what="initialize")
            version = _mcp.negotiated_version(result, supported=_mcp.HTTP_VERSIONS, alias=self.alias)
            session = _Session(assigned[0] if assigned else None, version)
            self._post(_mcp.initialized_notification(), session, deadline, call_id)
        except _SessionExpired as exc:
            raise self._error(
                f"HTTP {exc.status} from {self._url} during the MCP handshake: "
                f"{truncate_detail(self._redact(exc.text))}"
            ) from None
        logger.debug("%s: MCP session initialised (protocol %s)", self.alias, version)
        return session

    def _listen(self, session: _Session, opened: threading.Event) -> None:
        """The standalone GET stream of ``session``: answer the server's requests sent
        there (the Python SDK sends ``ping`` this way), resume it when it ends, stop when
        the server does not offer one (405 or any other refusal), after repeated failures,
        or when the session is replaced or the agent closed."""
        resume = _Resume()
        failures = 0
        while not self._closed and self._session is session:
            try:
                with self._open(
                    "GET",
                    self._headers(session, accept=_SSE, last_event_id=resume.last_event_id),
                    time.monotonic() + _LISTEN_SPAN,
                    _LISTENER,
                    idle=True,
                ) as stream:
                    opened.set()
                    if stream.status_code != 200 or self._content_type(stream) != _SSE:
                        logger.debug("%s: no standalone SSE stream (HTTP %d)", self.alias, stream.status_code)
                        return
                    failures = 0
                    self._scan_sse(
                        stream,
                        None,
                        "GET",
                        session=session,
                        resume=resume,
                        deadline=time.monotonic() + _LISTEN_SPAN,
                        call_id=_LISTENER,
                    )
            except Exception as exc:  # a background thread must never die loudly
                opened.set()
                failures += 1
                logger.debug("%s: standalone SSE stream failed: %s", self.alias, type(exc).__name__)
                if failures >= _LISTEN_FAILURES:
                    return
            if self._stop.wait(resume.retry):
                return

    # -- HTTP ------------------------------------------------------------------------

    def _headers(
        self, session: _Session | None, *, accept: str = _ACCEPT, last_event_id: str | None = None
    ) -> dict[str, str]:
        """Configured headers, then ours: a configured one that names a protocol header
        in any case is dropped, so exactly one of each is sent and it is the client's."""
        headers = {name: value for name, value in self.decl.headers.items() if name.lower() not in _PROTOCOL_HEADERS}
        headers["Accept"] = accept
        if accept == _ACCEPT:
            headers["Content-Type"] = "application/json"
        if session is not None:
            if session.session_id is not None:
                headers["Mcp-Session-Id"] = session.session_id
            headers["MCP-Protocol-Version"] = session.protocol_version
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        return headers

    def _timeout(self, deadline: float, call_id: str, *, idle: bool = False) -> httpx.Timeout:
        remaining = self.remaining(deadline)
        if remaining <= 0 or call_id in self._cancelled:
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request", alias=self.alias)
        connect = min(remaining, _CONNECT_TIMEOUT)
        if idle:  # connect and headers bounded; then silent for hours (_open lifts read, close() wakes it)
            return httpx.Timeout(_LISTEN_HEADERS)
        return httpx.Timeout(remaining, connect=connect)

    @contextlib.contextmanager
    def _open(
        self,
        verb: str,
        headers: dict[str, str],
        deadline: float,
        call_id: str,
        *,
        content: bytes | None = None,
        idle: bool = False,
    ) -> Iterator[httpx.Response]:
        """Send one request, following same-origin 307/308 redirects; the final response,
        streamed and tracked for :meth:`close`."""
        url = httpx.URL(self.decl.endpoint)
        origin = _origin(url)
        for hop in itertools.count():
            request = self._client.build_request(
                verb, url, content=content, headers=headers, timeout=self._timeout(deadline, call_id, idle=idle)
            )
            response = self._send_by(request, deadline, idle=idle)
            watchdog = None
            if idle:  # headers came in time; the body may be silent until close() wakes it
                timeouts = request.extensions.get("timeout")
                if isinstance(timeouts, dict):
                    timeouts["read"] = None
            else:
                # httpx's read timeout applies to each read afresh: a body that trickles a
                # byte just inside it would outlive the deadline. At the deadline the
                # socket is shut, which ends the read that is blocked.
                watchdog = threading.Timer(self.remaining(deadline), self._shutdown, (response,))
                watchdog.daemon = True
                watchdog.start()
            try:
                location = response.headers.get("location")
                if response.status_code in (307, 308) and location:
                    target = url.join(location)
                    if _origin(target) != origin:
                        raise self._error(
                            f"{verb}: HTTP {response.status_code} redirect from {self._url} to another origin "
                            f"({safe_url(str(target))}) not followed",
                            hint=f"set agent_plugins.{self.alias}.endpoint to the URL you trust",
                        )
                    if hop >= _MAX_REDIRECTS:
                        raise self._error(f"{verb}: more than {_MAX_REDIRECTS} redirects from {self._url}")
                    url = target
                    continue
                with self._reading(response):
                    yield response
                return
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                response.close()

    def _send_by(self, request: httpx.Request, deadline: float, *, idle: bool) -> httpx.Response:
        """:meth:`_send`, its response headers due by ``deadline`` in all: httpx's read timeout
        restarts with each byte, so a server dripping a header line every half second held a
        3 s call for minutes. The standalone stream (``idle``) has its own bound."""
        if idle:
            return self._send(request, deadline, idle=idle)
        cut = _http.HeaderDeadline(max(self.remaining(deadline), 0.001))
        request.extensions["trace"] = cut.trace
        with cut:
            try:
                return self._send(request, deadline, idle=idle)
            except httpx.HTTPError:
                if cut.fired:
                    raise AgentError(
                        ErrorKind.DEADLINE_EXCEEDED, "no response headers before the deadline", alias=self.alias
                    ) from None
                raise

    def _send(self, request: httpx.Request, deadline: float, *, idle: bool) -> httpx.Response:
        """``send`` with a bounded retry of a refused connection (the request never left):
        backoff 50 ms doubling to 500 ms, for at most :data:`_CONNECT_RETRY` s and never
        past the deadline. Other failures, and the standalone stream's, are not retried."""
        give_up = min(deadline, time.monotonic() + _CONNECT_RETRY)
        pause = 0.05
        while True:
            try:
                return self._client.send(request, stream=True)
            except httpx.ConnectError:
                if idle or self._closed or time.monotonic() + pause >= give_up:
                    raise
                logger.debug("%s: %s refused the connection; retrying in %.2fs", self.alias, self._url, pause)
                if self._stop.wait(pause):
                    raise
                pause = min(pause * 2, 0.5)

    def _post(
        self,
        message: dict[str, Any],
        session: _Session | None,
        deadline: float,
        call_id: str,
        *,
        session_header: list[str | None] | None = None,
    ) -> dict[str, Any] | None:
        """POST one message; the matching response, or ``None`` for a notification.

        The one place httpx exceptions become AgentErrors. ``session_header`` receives the
        ``Mcp-Session-Id`` the server assigns (the handshake).
        """
        method = str(message.get("method", "response"))
        body = json.dumps(message, ensure_ascii=False).encode("utf-8")

        def failed(reason: str, exc: BaseException) -> AgentError:
            # Past the deadline any failure is the deadline's: the watchdog shuts the socket.
            cancelled = isinstance(exc, httpx.TimeoutException) and call_id in self._cancelled
            if self.remaining(deadline) <= 0 or cancelled:
                return self._deadline_error(method)
            cause = f"{reason} ({type(exc).__name__}: {self._redact(str(exc))})"
            if isinstance(exc, httpx.ConnectError):
                return self._error(
                    f"cannot connect to {self._url}: {cause}",
                    hint=f"is the MCP server running? check agent_plugins.{self.alias}.endpoint",
                )
            return self._error(f"{method}: {cause} talking to {self._url}")

        req_id = message.get("id") if "method" in message else None
        if isinstance(req_id, int):  # pending from the moment it is sent: the server may
            with self._inflight_lock:  # answer on the standalone stream before this one's headers
                self._pending[req_id] = None
        try:
            with self._open("POST", self._headers(session), deadline, call_id, content=body) as response:
                status = response.status_code
                if status in (400, 404) and session is not None and session.session_id is not None:
                    raise _SessionExpired(status, self._read_head(response, deadline, call_id))
                if status >= 300:
                    text = self._read_head(response, deadline, call_id)
                    where = response.headers.get("location")
                    moved = (
                        f" (redirect to {safe_url(where)} not followed: only same-origin 307/308 are)"
                        if where and 300 <= status < 400
                        else ""
                    )
                    raise self._error(
                        f"{method}: HTTP {status} from {self._url}{moved}: {truncate_detail(self._redact(text))}"
                    )
                if session_header is not None:
                    session_header.append(response.headers.get("mcp-session-id"))
                if "id" not in message or "method" not in message:
                    return None  # a notification or our answer: 202 Accepted, no body to wait for
                return self._read_response(
                    response, message["id"], method, session=session, deadline=deadline, call_id=call_id
                )
        except Exception:
            with map_httpx_errors(failed):  # httpx's exceptions become AgentErrors; others pass
                raise
        finally:
            if isinstance(req_id, int):
                with self._inflight_lock:
                    self._pending.pop(req_id, None)

    def _answer(self, message: dict[str, Any], session: _Session | None, deadline: float, call_id: str) -> None:
        """Answer a server→client request (POSTed, as every client message is)."""
        reply = _mcp.reply_to_server_request(message, elicitation=self.decl.elicitation)
        if reply is None:
            logger.debug("%s: server notification %s", self.alias, message.get("method"))
            return
        logger.debug("%s: answering server request %s", self.alias, message.get("method"))
        if call_id == _LISTENER:
            deadline = time.monotonic() + _ANSWER_TIMEOUT
        try:
            self._post(reply, session, deadline, call_id)
        except _SessionExpired as exc:
            logger.debug("%s: answer to %s refused (HTTP %d)", self.alias, message.get("method"), exc.status)

    def _check_time(self, deadline: float, call_id: str, method: str) -> None:
        if self._closed:
            raise self._error(f"{method}: agent was closed mid-call")
        if time.monotonic() >= deadline or call_id in self._cancelled:
            raise self._deadline_error(method)

    def _deadline_error(self, method: str) -> AgentError:
        return AgentError(
            ErrorKind.DEADLINE_EXCEEDED, f"{method}: no answer from {self._url} before the deadline", alias=self.alias
        )

    def _read_head(self, response: httpx.Response, deadline: float, call_id: str) -> str:
        """The first :data:`_ERROR_HEAD` bytes of an error response's body, for its quote: a
        500 with a body past :data:`_MAX_BODY` was reported as "larger than", not as a 500."""
        data = bytearray()
        for chunk in response.iter_bytes():
            data.extend(chunk)
            self._check_time(deadline, call_id, "read")
            if len(data) >= _ERROR_HEAD:
                break
        else:
            self._check_time(deadline, call_id, "read")  # ended by the watchdog: cut short
        return data[:_ERROR_HEAD].decode("utf-8", errors="replace")

    def _read_text(self, response: httpx.Response, deadline: float, call_id: str) -> str:
        data = bytearray()
        for chunk in response.iter_bytes():
            data.extend(chunk)
            self._check_time(deadline, call_id, "read")
            if len(data) > _MAX_BODY:
                raise self._too_large("the body")
        self._check_time(deadline, call_id, "read")  # ended by the watchdog: cut short
        return data.decode("utf-8", errors="replace")

    @staticmethod
    def _content_type(response: httpx.Response) -> str:
        return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()

    def _read_response(
        self,
        response: httpx.Response,
        req_id: int,
        method: str,
        *,
        session: _Session | None,
        deadline: float,
        call_id: str,
    ) -> dict[str, Any]:
        ctype = self._content_type(response)
        if ctype == "application/json":
            text = self._read_text(response, deadline, call_id)
            try:
                value = json.loads(text)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json decodes
                raise self._error(
                    f"{method}: unparseable JSON from {self._url}: {truncate_detail(self._redact(text))}"
                ) from exc
            messages = value if isinstance(value, list) else [value]
            for candidate in messages:
                if isinstance(candidate, dict) and _mcp.is_response(candidate) and candidate.get("id") == req_id:
                    return candidate
            raise self._error(
                f"{method}: no response with id {req_id} in the body: {truncate_detail(self._redact(text))}"
            )
        if ctype == _SSE:
            resume = _Resume()
            found = self._scan_sse(
                response, req_id, method, session=session, resume=resume, deadline=deadline, call_id=call_id
            )
            if found is None:
                found = self._resume(req_id, method, session=session, resume=resume, deadline=deadline, call_id=call_id)
            return found  # (pending since _post sent it)
        raise self._error(
            f"{method}: unexpected content-type {ctype or '(none)'!r} from {self._url} (HTTP {response.status_code})"
        )

    def _resume(
        self, req_id: int, method: str, *, session: _Session | None, resume: _Resume, deadline: float, call_id: str
    ) -> dict[str, Any]:
        """Reconnect a stream that ended before our response (GET + ``Last-Event-ID``)."""
        resumes = 0
        while True:
            seen = resume.last_event_id
            if seen is None or session is None:
                raise self._error(f"{method}: SSE stream from {self._url} ended without a response")
            resumes += 1
            if resumes > _MAX_RESUMES:
                raise self._error(
                    f"{method}: SSE stream from {self._url} resumed {_MAX_RESUMES} times without a new event"
                )
            if self.remaining(deadline) <= resume.retry:
                raise self._deadline_error(method)
            self._stop.wait(resume.retry)  # set by close(): the check below reports it
            self._check_time(deadline, call_id, method)
            if (found := self._arrived(req_id)) is not None:
                return found
            headers = self._headers(session, accept=_SSE, last_event_id=seen)
            with self._open("GET", headers, deadline, call_id) as stream:
                if stream.status_code != 200 or self._content_type(stream) != _SSE:
                    text = self._read_head(stream, deadline, call_id)
                    raise self._error(
                        f"{method}: resuming the SSE stream from {self._url} failed: HTTP {stream.status_code}: "
                        f"{truncate_detail(self._redact(text))}"
                    )
                found = self._scan_sse(
                    stream, req_id, method, session=session, resume=resume, deadline=deadline, call_id=call_id
                )
            if found is not None:
                return found
            if resume.last_event_id != seen:
                resumes = 0  # progress: the stream moved on

    def _scan_sse(
        self,
        response: httpx.Response,
        req_id: int | None,
        method: str,
        *,
        session: _Session | None,
        resume: _Resume,
        deadline: float,
        call_id: str,
    ) -> dict[str, Any] | None:
        """Read one SSE stream: our response, or ``None`` when the stream ends first.
        Server requests met on the way are answered, notifications skipped. A response
        for another call waiting in this agent is handed over to it (a server may answer
        on whichever stream is open), and that call's stream woken."""
        if req_id is None:
            return self._scan_events(
                response, None, method, session=session, resume=resume, deadline=deadline, call_id=call_id
            )
        with self._inflight_lock:
            self._reading_for[req_id] = response
        try:
            return self._scan_events(
                response, req_id, method, session=session, resume=resume, deadline=deadline, call_id=call_id
            )
        except Exception:
            if (found := self._arrived(req_id)) is not None:
                return found  # woken: our response came on another stream
            raise
        finally:
            with self._inflight_lock:
                self._reading_for.pop(req_id, None)

    def _arrived(self, req_id: int) -> dict[str, Any] | None:
        with self._inflight_lock:
            return self._pending.get(req_id)

    def _hand_over(self, message: dict[str, Any]) -> bool:
        """Give a response for another waiting call to it; whether one was waiting."""
        with self._inflight_lock:
            req_id = message.get("id")
            if not isinstance(req_id, int) or req_id not in self._pending:
                return False
            self._pending[req_id] = message
            stream = self._reading_for.get(req_id)
        if stream is not None:
            self._shutdown(stream)
        return True

    def _scan_events(
        self,
        response: httpx.Response,
        req_id: int | None,
        method: str,
        *,
        session: _Session | None,
        resume: _Resume,
        deadline: float,
        call_id: str,
    ) -> dict[str, Any] | None:
        if req_id is not None and (found := self._arrived(req_id)) is not None:
            return found
        for data in self._sse_data(response, deadline, call_id, method, resume):
            try:
                candidate = json.loads(data)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json decodes
                raise self._error(
                    f"{method}: unparseable SSE event from {self._url}: {truncate_detail(self._redact(data))}"
                ) from exc
            if not isinstance(candidate, dict):
                continue
            if _mcp.is_response(candidate):
                if req_id is not None and candidate.get("id") == req_id:
                    return candidate
                if self._hand_over(candidate):
                    continue
                logger.debug("%s: skipping SSE response for id %r", self.alias, candidate.get("id"))
                continue
            self._answer(candidate, session, deadline, call_id)
        return None

    def _error(self, detail: str, *, hint: str = "") -> AgentError:
        """A ``transport_error`` of this agent."""
        return AgentError(ErrorKind.TRANSPORT_ERROR, detail, hint=hint, alias=self.alias)

    def _too_large(self, what: str) -> AgentError:
        return self._error(f"{what} from {self._url} is larger than {_MAX_BODY} bytes")

    def _sse_lines(self, response: httpx.Response, deadline: float, call_id: str, method: str) -> Iterator[str]:
        """The stream's lines (ended by CRLF, LF or CR), checked against the deadline and
        the size cap after every chunk: a stream that trickles bytes and never ends a line
        stops at the deadline, and no more than the cap plus one chunk is ever buffered."""
        pending = bytearray()
        scan = 0  # bytes of ``pending`` already searched for a line end
        for chunk in response.iter_bytes():
            self._check_time(deadline, call_id, method)
            pending += chunk
            start = 0
            while (match := _EOL.search(pending, scan)) is not None:
                if match.end() == len(pending) and match.group() == b"\r":
                    scan = match.start()  # maybe the first half of a CRLF: wait for more
                    break
                yield pending[start : match.start()].decode("utf-8", errors="replace")
                start = scan = match.end()
            else:
                scan = len(pending)
            del pending[:start]
            scan -= start
            if len(pending) > _MAX_BODY:
                raise self._too_large("an SSE line")
        self._check_time(deadline, call_id, method)  # ended by the watchdog: cut short
        if pending:  # the last line, or a CR that turned out to end one
            yield pending.removesuffix(b"\r").decode("utf-8", errors="replace")

    def _sse_data(
        self, response: httpx.Response, deadline: float, call_id: str, method: str, resume: _Resume
    ) -> Iterator[str]:
        """The ``data`` of each ``message`` event that has data (SSE framing per the WHATWG
        spec); ``id`` and ``retry`` fields are recorded in ``resume``."""
        data: list[str] = []
        size = 0
        event = ""
        for line in self._sse_lines(response, deadline, call_id, method):
            self._check_time(deadline, call_id, method)
            if not line:
                joined = "\n".join(data)
                if joined.strip() and event in ("", "message"):
                    yield joined  # an event without data (a priming event) is not a message
                data, size, event = [], 0, ""
                continue
            if line.startswith(":"):
                continue  # comment / keep-alive
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                size += len(value) + 1
                if size > _MAX_BODY:
                    raise self._too_large("an SSE event")
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id" and "\0" not in value:
                resume.last_event_id = value or None
            elif field == "retry" and value.isascii() and value.isdigit():
                resume.retry = _retry_seconds(value)

    @contextlib.contextmanager
    def _reading(self, response: httpx.Response) -> Iterator[None]:
        """Track ``response`` while a thread reads it, so :meth:`close` can wake that thread."""
        with self._inflight_lock:
            self._inflight.add(response)
        try:
            yield
        finally:
            with self._inflight_lock:
                self._inflight.discard(response)

    def _wake_readers(self) -> None:
        """Shut down (never close: the fd stays the reader's) the sockets being read, so a
        thread blocked on a stalled stream returns now instead of at its deadline."""
        with self._inflight_lock:
            responses = list(self._inflight)
        for response in responses:
            self._shutdown(response)

    @staticmethod
    def _shutdown(response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- lifecycle -------------------------------------------------------------------

    def cancel(self, call_id: str) -> None:
        """Mark ``call_id`` cancelled: it stops at its next event with ``deadline_exceeded``."""
        self._cancelled.add(call_id)

    def close(self) -> None:
        """DELETE the session (best effort) and close the HTTP client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake_readers()
        session, self._session = self._session, None
        if session is not None and session.session_id is not None:
            headers = self._headers(session, accept=_SSE)
            try:
                with self._open("DELETE", headers, time.monotonic() + _CLOSE_TIMEOUT, ""):
                    pass
            except (AgentError, httpx.HTTPError) as exc:
                # The server may be gone already; the session dies with it.
                logger.debug("%s: DELETE of the MCP session failed: %s", self.alias, type(exc).__name__)
        listener = self._listener
        if listener is not None and listener is not threading.current_thread():
            listener.join(_CLOSE_TIMEOUT)
        self._client.close()
