"""``mcp_http``: an MCP server over streamable HTTP whose ``tool`` answers agent calls.

A small synchronous MCP client on httpx, not the ``mcp`` SDK's client: the SDK client is
asyncio/anyio-only, so a synchronous runtime would need an event loop thread per agent
and would cancel through anyio scopes, while the protocol we need is four messages. A
plain ``httpx.Client`` gives finite per-phase timeouts bounded by the call's monotonic
deadline, thread-safe concurrent calls on one session, and no runtime dependency on the
SDK (it is a dev dependency: the tests run against a real SDK server).

Protocol (MCP streamable HTTP, 2025-03-26 to 2025-11-25): every message is a POST to
``endpoint`` with ``Accept: application/json, text/event-stream``; the answer is either
one JSON body or an SSE stream in which we wait for the response whose ``id`` is ours
(notifications and server requests in the stream are skipped). Once per agent instance:
``initialize`` offering the newest version we speak (the server's answer must be in our
supported list, else ``transport_error``), then ``notifications/initialized``; the
``Mcp-Session-Id`` the server assigns and ``MCP-Protocol-Version`` are sent on every later
request. Each call is one ``tools/call`` (result rules in :mod:`localllm.agents._mcp`).
If the server answers 404 for our session it has forgotten it (a restart): we
re-initialise once and resend the call — a 404 means it never ran. ``close()`` sends a
best-effort ``DELETE`` for the session.

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx

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
#: DELETE of the session on close
_CLOSE_TIMEOUT = 2.0
#: largest JSON body or SSE event we accept
_MAX_BODY = 64 * 1024 * 1024
_ACCEPT = "application/json, text/event-stream"
_EOL = re.compile(rb"\r\n|\r|\n")


def safe_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (where tokens hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class _SessionExpired(Exception):
    """Internal: the server answered 404 for our ``Mcp-Session-Id``."""


@dataclass(frozen=True, eq=False)
class _Session:
    """One initialised MCP session; replaced whole (compared by identity), so a call never
    sees a half-updated one."""

    #: ``None`` when the server is stateless and assigned no id
    session_id: str | None
    protocol_version: str


class McpHttpAgent(Agent):
    """An ``mcp_http`` agent plugin; see the module docstring for the protocol."""

    plugin: ClassVar[str] = "mcp_http"

    def __init__(self, decl: McpHttpDecl, *, transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(decl.alias)
        self.decl = decl
        self._url = safe_url(decl.endpoint)
        self._redact = Redactor(list(decl.headers.values()))
        self._client = httpx.Client(transport=transport, follow_redirects=False)
        self._ids = itertools.count(1)
        self._session_lock = threading.Lock()
        self._session: _Session | None = None
        self._cancelled: set[str] = set()
        self._closed = False
        self._inflight: set[httpx.Response] = set()
        self._inflight_lock = threading.Lock()

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
            raise AgentError(ErrorKind.TRANSPORT_ERROR, "agent is closed", alias=self.alias)
        call_id = request.call_id
        try:
            message = self._tools_call(request, deadline, call_id)
        finally:
            self._cancelled.discard(call_id)
        result = _mcp.result_of(message, label=self.alias, what=f"tools/call {self.decl.tool!r}")
        return _mcp.answer_from_tool_result(result, label=self.alias, tool=self.decl.tool)

    def _tools_call(self, request: AskRequest, deadline: float, call_id: str) -> dict[str, Any]:
        session = self._session or self._new_session(None, deadline, call_id)
        message = _mcp.tools_call_request(next(self._ids), self.decl.tool, request)
        try:
            reply = self._post(message, session, deadline, call_id)
        except _SessionExpired:
            # The server forgot the session (a restart); a 404 means the call never ran.
            logger.info("%s: MCP session expired on the server; re-initialising", self.alias)
            session = self._new_session(session, deadline, call_id)
            try:
                reply = self._post(message, session, deadline, call_id)
            except _SessionExpired:
                raise AgentError(
                    ErrorKind.TRANSPORT_ERROR,
                    f"{self._url} answered 404 for a freshly initialised session", alias=self.alias,
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
            result = _mcp.result_of(reply, label=self.alias, what="initialize")
            version = _mcp.negotiated_version(result, supported=_mcp.HTTP_VERSIONS, label=self.alias)
            session = _Session(assigned[0] if assigned else None, version)
            self._post(_mcp.initialized_notification(), session, deadline, call_id)
        except _SessionExpired as exc:
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR, f"{self._url} answered 404 during the MCP handshake", alias=self.alias
            ) from exc
        logger.debug("%s: MCP session initialised (protocol %s)", self.alias, version)
        return session

    # -- HTTP ------------------------------------------------------------------------

    def _headers(self, session: _Session | None) -> dict[str, str]:
        headers = dict(self.decl.headers)
        headers["Accept"] = _ACCEPT
        headers["Content-Type"] = "application/json"
        if session is not None:
            if session.session_id is not None:
                headers["Mcp-Session-Id"] = session.session_id
            headers["MCP-Protocol-Version"] = session.protocol_version
        return headers

    def _timeout(self, deadline: float, call_id: str) -> httpx.Timeout:
        remaining = self.remaining(deadline)
        if remaining <= 0 or call_id in self._cancelled:
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request", alias=self.alias)
        return httpx.Timeout(remaining, connect=min(remaining, _CONNECT_TIMEOUT))

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
        method = str(message.get("method"))
        body = json.dumps(message, ensure_ascii=False).encode("utf-8")

        def failed(reason: str, exc: BaseException) -> AgentError:
            if isinstance(exc, httpx.TimeoutException) and (
                self.remaining(deadline) <= 0 or call_id in self._cancelled
            ):
                return self._deadline_error(method)
            cause = f"{reason} ({type(exc).__name__}: {self._redact(str(exc))})"
            if isinstance(exc, httpx.ConnectError):
                return AgentError(
                    ErrorKind.TRANSPORT_ERROR,
                    f"{self.alias}: cannot connect to {self._url}: {cause} "
                    f"(is the MCP server running? check agent_plugins.{self.alias}.endpoint)",
                )
            return AgentError(ErrorKind.TRANSPORT_ERROR, f"{self.alias}: {method}: {cause} talking to {self._url}")

        try:
            with self._client.stream(
                "POST", self.decl.endpoint, content=body, headers=self._headers(session),
                timeout=self._timeout(deadline, call_id),
            ) as response, self._reading(response):
                if response.status_code == 404 and session is not None and session.session_id is not None:
                    raise _SessionExpired
                if response.status_code >= 300:
                    text = self._read_text(response, deadline, call_id)
                    raise AgentError(
                        ErrorKind.TRANSPORT_ERROR,
                        f"{method}: HTTP {response.status_code} from {self._url}: "
                        f"{truncate_detail(self._redact(text))}", alias=self.alias,
                    )
                if session_header is not None:
                    session_header.append(response.headers.get("mcp-session-id"))
                if "id" not in message:
                    return None  # a notification: 202 Accepted, no body to wait for
                return self._read_response(response, message["id"], method, deadline, call_id)
        except Exception:
            with map_httpx_errors(failed):  # httpx's exceptions become AgentErrors; others pass
                raise

    def _check_time(self, deadline: float, call_id: str, method: str) -> None:
        if self._closed:
            raise AgentError(ErrorKind.TRANSPORT_ERROR, f"{method}: agent was closed mid-call", alias=self.alias)
        if time.monotonic() >= deadline or call_id in self._cancelled:
            raise self._deadline_error(method)

    def _deadline_error(self, method: str) -> AgentError:
        return AgentError(
            ErrorKind.DEADLINE_EXCEEDED, f"{method}: no answer from {self._url} before the deadline", alias=self.alias
        )

    def _read_text(self, response: httpx.Response, deadline: float, call_id: str) -> str:
        data = bytearray()
        for chunk in response.iter_bytes():
            data.extend(chunk)
            self._check_time(deadline, call_id, "read")
            if len(data) > _MAX_BODY:
                raise self._too_large("the body")
        return data.decode("utf-8", errors="replace")

    def _read_response(
        self, response: httpx.Response, req_id: int, method: str, deadline: float, call_id: str
    ) -> dict[str, Any]:
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "application/json":
            text = self._read_text(response, deadline, call_id)
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise AgentError(
                    ErrorKind.TRANSPORT_ERROR,
                    f"{method}: unparseable JSON from {self._url}: {truncate_detail(self._redact(text))}",
                    alias=self.alias,
                ) from exc
            messages = value if isinstance(value, list) else [value]
            for candidate in messages:
                if isinstance(candidate, dict) and _mcp.is_response(candidate) and candidate.get("id") == req_id:
                    return candidate
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"{method}: no response with id {req_id} in the body: "
                f"{truncate_detail(self._redact(text))}", alias=self.alias,
            )
        if ctype == "text/event-stream":
            for data in self._sse_data(response, deadline, call_id, method):
                try:
                    candidate = json.loads(data)
                except ValueError as exc:
                    raise AgentError(
                        ErrorKind.TRANSPORT_ERROR,
                        f"{method}: unparseable SSE event from {self._url}: "
                        f"{truncate_detail(self._redact(data))}", alias=self.alias,
                    ) from exc
                if not isinstance(candidate, dict):
                    continue
                if _mcp.is_response(candidate) and candidate.get("id") == req_id:
                    return candidate
                logger.debug("%s: skipping SSE message %s", self.alias, candidate.get("method", "response"))
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"{method}: SSE stream from {self._url} ended without a response", alias=self.alias,
            )
        raise AgentError(
            ErrorKind.TRANSPORT_ERROR,
            f"{method}: unexpected content-type {ctype or '(none)'!r} from {self._url} "
            f"(HTTP {response.status_code})", alias=self.alias,
        )

    def _too_large(self, what: str) -> AgentError:
        return AgentError(ErrorKind.TRANSPORT_ERROR, f"{what} from {self._url} is larger than {_MAX_BODY} bytes",
                          alias=self.alias)

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
        if pending:  # the last line, or a CR that turned out to end one
            yield pending.removesuffix(b"\r").decode("utf-8", errors="replace")

    def _sse_data(self, response: httpx.Response, deadline: float, call_id: str, method: str) -> Iterator[str]:
        """The ``data`` of each ``message`` event (SSE framing per the WHATWG spec)."""
        data: list[str] = []
        size = 0
        event = ""
        for line in self._sse_lines(response, deadline, call_id, method):
            self._check_time(deadline, call_id, method)
            if not line:
                if data and event in ("", "message"):
                    yield "\n".join(data)
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
        self._wake_readers()
        session, self._session = self._session, None
        if session is not None and session.session_id is not None:
            headers = self._headers(session)
            try:
                self._client.delete(self.decl.endpoint, headers=headers, timeout=_CLOSE_TIMEOUT)
            except httpx.HTTPError as exc:
                # The server may be gone already; the session dies with it.
                logger.debug("%s: DELETE of the MCP session failed: %s", self.alias, type(exc).__name__)
        self._client.close()
