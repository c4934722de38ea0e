"""The service's HTTP front: OpenAI-compatible routes, checks, auth, the proxy hop, metrics, the log line.

Routes (every one needs ``Authorization: Bearer <token>`` unless the service runs with
``--no-auth``; ``GET /health`` answers without it, but only with the token does it name
the instance)::

    GET  /health                   {"status": "ok", "instance": …}
    GET  /v1/models                every servable model: id, role, cached, loaded
    GET  /v1/models/{id}           one of them (404 model_not_found)
    POST /v1/chat/completions      checked, capped, structured output compiled, tool calls (see chat.py)
    POST /v1/completions           OpenAI's legacy text completions on a chat model: the chat route's
                                   checks and caps, max_tokens 16 by default, what llama-server
                                   would ignore refused (see completion.py)
    POST /v1/embeddings            routed by "model"; input and dimensions checked, inputs passed through untouched
    POST /tokenize, /detokenize    llama-server's own, routed by an extra "model" field; content, tokens checked
    GET  /metrics                  Prometheus text counters
    GET  /localllm/ps              the loaded models (``localllm ps``)
    GET  /localllm/slots/{id}      llama-server's ``/slots`` of a loaded model (which slots generate)
    POST /localllm/stop            {"model": ID} unloads one model, {"all": true} stops the service

Before anything else every request passes the Host/Origin/Content-Type checks of
:mod:`localllm.service.guard`. The app is plain ASGI, served by uvicorn (``front.py``).
A client that leaves mid-request cancels its upstream request, which closes the
connection to llama-server and so stops its generation (streaming or not); that is one log
line, status 499. Request bodies are never logged: one line per request says method,
path, model, status, tokens and ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from localllm.errors import LocalLLMError
from localllm.managed import vocab
from localllm.managed.server import GRAMMAR_HEADER
from localllm.service import chat, completion, messages, pieces, responses
from localllm.service.dialects import Dialect, Where
from localllm.service.guard import Guard
from localllm.service.pool import ModelPool, PoolBusy, UnknownServedModel
from localllm.wire import nesting

if TYPE_CHECKING:
    from localllm.managed.upstream import Target
    from localllm.service.catalog import ModelSpec
    from localllm.service.upstream import Upstream

__all__ = ["FrontLimits", "Metrics", "ServiceApp"]

log = logging.getLogger("localllm.service")

#: routed paths → the llama-server path they are forwarded to
_PROXIED = {
    "/v1/chat/completions": "/v1/chat/completions",
    "/chat/completions": "/v1/chat/completions",
    # never llama-server's own /completions: that is its native format, not OpenAI's
    "/v1/completions": "/v1/completions",
    "/completions": "/v1/completions",
    "/v1/embeddings": "/v1/embeddings",
    "/embeddings": "/v1/embeddings",
    "/tokenize": "/tokenize",
    "/detokenize": "/detokenize",
}
#: the routes a request is counted under in /metrics; any other path counts as ``other``
_ROUTES = frozenset(
    {
        "/health",
        "/v1/models",
        "/metrics",
        "/localllm/ps",
        "/localllm/stop",
        *_PROXIED,
        *responses.ROUTES,
        *messages.ROUTES,
    }
)
#: the routes that take a POST
_POSTED = frozenset({*_PROXIED, *responses.ROUTES, *messages.ROUTES, "/localllm/stop"})
_ROUTE_PREFIXES = ("/v1/models/", "/localllm/slots/")
#: a CORS preflight's answer to an allowed Origin
_PREFLIGHT = {
    "access-control-allow-methods": "GET, HEAD, POST",
    "access-control-max-age": "600",
}
#: the request headers a preflight is always answered as allowing
_ALLOWED_HEADERS = ("authorization", "content-type")
#: a header name (RFC 9110 token); a preflight asks for at most this many
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]{1,64}")
_MAX_ASKED = 64
_EXPOSED = "x-localllm-structured, x-localllm-validated, retry-after"
_SHOWN = 200  # characters of a request path a log line shows
#: the model role each OpenAI route serves (a chat model has no embeddings, and the reverse)
_ROLE_OF = {"/v1/chat/completions": "chat", "/v1/completions": "chat", "/v1/embeddings": "embedding"}
#: the routes whose bodies are prepared (checked, capped) by a module of their own
_GENERATING = ("/v1/chat/completions", "/v1/completions")
_T = TypeVar("_T")
_TAIL = 16 * 1024  # bytes of a stream kept to read its final usage
_READ = 900.0  # the most a non-streamed upstream answer may take
_SLOTS_WAIT = 10.0  # the most GET /localllm/slots/{id} waits for llama-server
STRUCTURED_HEADER = "X-Localllm-Structured"
VALIDATED_HEADER = "X-Localllm-Validated"

#: a body larger than this is read (and prepared) off the event loop: 1 MiB of token ids,
#: the costliest JSON to read, takes the service ~0.1 s; 16 MiB took 8.5 s of every client's time
_OFF_LOOP_BYTES = 1 << 20


def _parse(raw: bytes, max_depth: int) -> tuple[Any, bool]:
    """A request body's JSON (:func:`chat.loads`; ValueError) and whether it nests past ``max_depth``."""
    try:
        data = chat.loads(raw)
    except RecursionError:
        return None, True
    return data, nesting(data, max_depth) > max_depth


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


#: ``--max-connections`` unless given (fewer when the open-files hard limit cannot hold it)
DEFAULT_CONNECTIONS = 2048


@dataclass(frozen=True)
class FrontLimits:
    """The front's bounds (``localllm serve`` flags)."""

    max_body: int = 16 * 1024 * 1024
    max_depth: int = 256  # JSON nesting of a request body
    max_queue: int = 256  # proxied requests in flight; beyond: 503 + Retry-After
    retry_after: int = 1
    max_connections: int = DEFAULT_CONNECTIONS
    header_timeout: float = 10.0  # a request's line and headers must arrive within this
    body_timeout: float = 60.0  # and its body within this
    idle_timeout: float = 15.0  # a keep-alive connection idle this long is closed
    backlog: int = 1024
    chat: chat.ChatLimits = field(default_factory=chat.ChatLimits)


class Metrics:
    """Counters keyed by (name, labels); rendered in the Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0)

    def render(self, gauges: Mapping[str, float] | None = None) -> str:
        with self._lock:
            items = sorted(self._counters.items())
        lines: list[str] = []
        seen: set[str] = set()
        for (name, labels), value in items:
            if name not in seen:
                lines.append(f"# TYPE {name} counter")
                seen.add(name)
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")
        for name, value in sorted((gauges or {}).items()):
            lines += [f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value escaped as the Prometheus text format requires (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _route(path: str) -> str:
    """The route ``path`` is counted under: a known one (ids as ``{id}``), else ``other``.

    Never the path itself: a client could otherwise add a series per distinct path (paths
    are unbounded and come before authentication), and /metrics would grow without end.
    """
    if path in _ROUTES:
        return path
    for prefix in _ROUTE_PREFIXES:
        if path.startswith(prefix):
            return prefix + "{id}"
    return "other"


def _shown(path: str) -> str:
    """``path`` as a log line shows it: percent-encoded (no space, quote or newline) and bounded."""
    text = urllib.parse.quote(path, safe="/!$&'()*+,;=:@-._~")
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _allow_headers(asked: str | None) -> str:
    """The request headers a preflight from an allowed Origin may use: the ones it asks for.

    Clients add headers of their own (the ``openai`` JS SDK sends eight ``X-Stainless-*``,
    ``OpenAI-Organization`` when set): a browser refuses the request unless every one is
    allowed. The Origin is the operator's to trust; the token is still checked. Names are
    kept only as HTTP tokens, and at most 64 of them.
    """
    names = list(_ALLOWED_HEADERS)
    for given in (asked or "").lower().split(",")[:_MAX_ASKED]:
        name = given.strip()
        if _HEADER_NAME.fullmatch(name) and name not in names:
            names.append(name)
    return ", ".join(names)


def _error(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _usage(data: Any) -> tuple[Any, Any]:
    """(prompt, completion) tokens from an answer's ``usage`` (or llama-server's ``timings``)."""
    if not isinstance(data, dict):
        return None, None
    usage = data.get("usage")
    if isinstance(usage, dict):
        return usage.get("prompt_tokens"), usage.get("completion_tokens")
    timings = data.get("timings")
    if isinstance(timings, dict):
        return timings.get("prompt_n"), timings.get("predicted_n")
    return None, None


def _stream_usage(tail: bytes) -> tuple[Any, Any]:
    for raw in reversed(tail.split(b"\n")):
        line = raw.strip()
        if line.startswith(b"data:") and (b'"usage"' in line or b'"timings"' in line):
            try:
                return _usage(json.loads(line[5:]))
            except ValueError:
                continue
    return None, None


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


class _Reply(Exception):
    """Answer at once with this status and JSON payload."""

    def __init__(self, status: int, payload: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.payload = payload
        self.headers = dict(headers or {})


@dataclass
class _Request:
    scope: Scope
    receive: Receive
    send: Send
    started: float
    headers: dict[str, str]
    started_response: bool = False
    completed: bool = False
    status: int = 0
    #: CORS headers every response to an allowed Origin carries
    cors: dict[str, str] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    async def start(self, status: int, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        raw = [(b"content-type", content_type.encode())]
        raw += [(k.lower().encode(), v.encode()) for k, v in {**self.cors, **(headers or {})}.items()]
        self.started_response = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": raw})

    async def respond(
        self,
        status: int,
        payload: Any,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        await self.start(status, content_type, {**(headers or {}), "content-length": str(len(body))})
        await self.end(body)

    async def end(self, body: bytes = b"") -> None:
        self.completed = True
        await self.send({"type": "http.response.body", "body": body})

    async def answer(self, prepared: chat.Prepared, reply: dict[str, Any], headers: dict[str, str]) -> None:
        """A chat answer generated whole: the body, or (``stream``) its server-sent events."""
        if not prepared.stream:
            await self.respond(200, reply, headers=headers)
            return
        await self.start(200, "text/event-stream", {**headers, "cache-control": "no-cache"})
        for event in chat.sse_events(prepared, reply):
            await self.send({"type": "http.response.body", "body": event, "more_body": True})
        await self.end()

    def rewriter(self, prepared: chat.Prepared) -> _Rewrite | None:
        """What llama-server's stream is rewritten by on its way to this client (None: relayed as it is)."""
        return completion.CompletionStream(prepared) if prepared.completion else None


#: the routes that speak another API than chat, and the module that reads each as chat
_DIALECTS: dict[str, Dialect] = {
    **dict.fromkeys(responses.ROUTES, responses),
    **dict.fromkeys(messages.ROUTES, messages),
}


@dataclass
class _Translated(_Request):
    """A request to a route that speaks another API (OpenAI's Responses, Anthropic's
    Messages), served by the chat route: its chat answer is sent in that API's shape (or as
    its stream's events), every error naming the fields the client sent, in its shape."""

    #: the module that reads and writes this API (:mod:`~localllm.service.responses`, …)
    dialect: Dialect = responses
    #: the client's body, once read as chat; where each chat message came from
    asked: dict[str, Any] = field(default_factory=dict)
    where: list[list[str]] = field(default_factory=list)

    async def respond(
        self,
        status: int,
        payload: Any,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Any error in this API's shape (llama-server's own too), naming what the client sent."""
        if status >= 400 and isinstance(payload, bytes):
            with contextlib.suppress(ValueError):
                payload = json.loads(payload)
        if status >= 400 and isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            payload = self.dialect.error(payload, self.where, status)
        await super().respond(status, payload, content_type, headers)

    async def answer(self, prepared: chat.Prepared, reply: dict[str, Any], headers: dict[str, str]) -> None:
        if not prepared.stream:
            await self.respond(200, self.dialect.answer(self.asked, reply), headers=headers)
            return
        await self.start(200, "text/event-stream", {**headers, "cache-control": "no-cache"})
        await self.end(self.dialect.stream(self.asked).finish(reply))

    def rewriter(self, prepared: chat.Prepared) -> _Rewrite | None:  # every stream of it: its API's events
        return self.dialect.stream(self.asked)


@dataclass
class ServiceApp:
    """The ASGI application: what the routes need — the pool, the secrets, how to list and stop."""

    pool: ModelPool
    instance: str
    token: str | None
    upstream_key: str
    models: Callable[[], list[dict[str, Any]]]
    request_shutdown: Callable[[], None]
    info: Callable[[], dict[str, Any]]
    metrics: Metrics = field(default_factory=Metrics)
    load_wait: float = 300.0
    guard: Guard | None = None
    limits: FrontLimits = field(default_factory=FrontLimits)
    #: model id → stop strings added to its chat requests (the pins')
    stops: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    _client: Upstream | None = None
    #: its own connections, for reads that must not wait behind generations (/slots)
    _control: Upstream | None = None
    #: the pool's other blocking calls (listing, unloading, respawning)
    _executor: ThreadPoolExecutor = field(init=False)
    _leases: ThreadPoolExecutor = field(init=False)
    _releases: ThreadPoolExecutor = field(init=False)
    _preparing: ThreadPoolExecutor = field(init=False)
    _inflight: int = 0
    _acquiring: int = 0  # pool.acquire calls running (a client that left still has its own)
    _compiling: int = 0  # bodies read and prepares run on their threads (a client that left still has its own)
    #: upstream base URL → how many connections to keep open to it (its slots + 1)
    _hosts: dict[str, int] = field(default_factory=dict)
    #: model id → its vocabulary size, asked of its llama-server once (the GGUF of an id is
    #: fixed while the service runs): what a logit_bias token id is checked against. None:
    #: its server answered without one (not a llama-server), so ids are passed on unchecked
    _n_vocab: dict[str, int | None] = field(default_factory=dict)
    #: model id → its vocabulary's special tokens and its context per slot (its llama-server's
    #: GET /props: model_path, n_ctx), read once: what a request's texts are counted against
    #: before llama-server tokenizes them (pieces.py). None: not a llama-server's GGUF
    _vocabs: dict[str, tuple[vocab.Vocab, int] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # An acquire blocks its thread while it waits for room or a load (up to load_wait).
        # So acquires get a thread each (at most max_queue run: see _proxy), and neither a
        # release — what a waiting acquire may be waiting for — nor a listing ever queues
        # behind them.
        self._leases = ThreadPoolExecutor(self.limits.max_queue, thread_name_prefix="localllm-lease")
        self._releases = ThreadPoolExecutor(2, thread_name_prefix="localllm-release")
        self._executor = ThreadPoolExecutor(16, thread_name_prefix="localllm-pool")
        # Preparing a request may compile its schemas (seconds for a new large one): a thread
        # each too (at most max_queue are in flight), so none queues behind another's compile
        self._preparing = ThreadPoolExecutor(self.limits.max_queue, thread_name_prefix="localllm-prepare")

    # ------------------------------------------------------------------ plumbing

    def client(self) -> Upstream:
        if self._client is None:
            from localllm.service.upstream import Upstream

            self._client = Upstream()
        return self._client

    def control(self) -> Upstream:
        if self._control is None:
            from localllm.service.upstream import Upstream

            self._control = Upstream()
        return self._control

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._control is not None:
            await self._control.aclose()
            self._control = None

    def close(self) -> None:
        for executor in (self._leases, self._executor, self._releases, self._preparing):
            executor.shutdown(wait=False, cancel_futures=True)

    def authorized(self, header: str | None, api_key: str | None) -> bool:
        if self.token is None:
            return True
        # the scheme is case-insensitive (RFC 9110 11.1): "bearer …" is the same credential
        given = header[7:].strip() if header and header[:7].lower() == "bearer " else (api_key or "")
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _log(self, req: _Request, model: str | None, status: int, tokens: tuple[Any, Any] = (None, None)) -> None:
        ms = (time.monotonic() - req.started) * 1000
        prompt, completion = tokens
        log.info(
            "%s %s model=%s status=%d prompt_tokens=%s completion_tokens=%s ms=%.0f",
            req.method,
            _shown(req.path),
            model or "-",
            status,
            "-" if prompt is None else prompt,
            "-" if completion is None else completion,
            ms,
        )
        metrics = self.metrics
        metrics.add("localllm_requests_total", path=_route(req.path), status=str(status))
        if model:
            metrics.add("localllm_model_requests_total", model=model, status=str(status))
            if isinstance(prompt, int):
                metrics.add("localllm_prompt_tokens_total", prompt, model=model)
            if isinstance(completion, int):
                metrics.add("localllm_completion_tokens_total", completion, model=model)
            metrics.add("localllm_request_ms_total", ms, model=model)

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _off_loop(self, work: Callable[[], _T]) -> asyncio.Future[_T]:
        """``work`` (a request's own CPU time: its body read, its schemas compiled) on a thread
        of the preparing pool, which has one for each request the queue admits, so none waits
        for a thread. It counts in the queue until it ends, even when its client has left and
        nothing awaits it (its result, a compiled schema, is kept)."""
        future = asyncio.get_running_loop().run_in_executor(self._preparing, work)
        self._compiling += 1

        def ended(_: asyncio.Future[Any]) -> None:
            self._compiling -= 1

        future.add_done_callback(ended)
        return future

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            name = key.decode("latin-1")
            if name not in headers:  # the first of a repeated header counts
                headers[name] = value.decode("latin-1")
        dialect = _DIALECTS.get(str(scope["path"]))
        req: _Request = (
            _Translated(scope, receive, send, time.monotonic(), headers, dialect=dialect)
            if dialect is not None
            else _Request(scope, receive, send, time.monotonic(), headers)
        )
        model: str | None = None
        try:
            model = await self._handle(req)
        except _Reply as reply:
            if not req.started_response:
                await req.respond(reply.status, reply.payload, headers=reply.headers)
            self._log(req, model, reply.status)
        except _Abort:
            log.warning(
                "%s %s model=%s: the upstream stream broke; the client's stream is cut",
                req.method,
                _shown(req.path),
                model,
            )
            self.metrics.add("localllm_requests_total", path=_route(req.path), status="502")
        except ClientGone:
            log.info("%s %s status=499 client left after %.0f ms", req.method, _shown(req.path), _ms(req))
            self.metrics.add("localllm_requests_total", path=_route(req.path), status="499")
        except Exception as exc:  # never a traceback in the log: one line, and a 500 if still possible
            log.error("%s %s failed: %s: %s", req.method, _shown(req.path), type(exc).__name__, exc)
            if not req.started_response:
                with contextlib.suppress(Exception):
                    await req.respond(500, _error(f"internal error: {type(exc).__name__}", "server_error"))
            self.metrics.add("localllm_requests_total", path=_route(req.path), status="500")

    async def _handle(self, req: _Request) -> str | None:
        guard = self.guard
        if guard is not None:
            refused = guard.check(
                req.method, req.headers.get("host"), req.headers.get("origin"), req.headers.get("content-type")
            )
            if refused is not None:
                raise _Reply(refused.status, _error(refused.message, "invalid_request_error", refused.code))
            origin = req.headers.get("origin")
            if origin is not None and origin.isascii() and origin.isprintable():  # passed the guard: allowed
                req.cors = {
                    "access-control-allow-origin": origin,
                    "access-control-expose-headers": _EXPOSED,
                    "vary": "Origin",
                }
                if req.method == "OPTIONS":
                    # a browser's preflight never carries Authorization: answered before the token check
                    allowed = _allow_headers(req.headers.get("access-control-request-headers"))
                    await req.respond(204, b"", "text/plain", {**_PREFLIGHT, "access-control-allow-headers": allowed})
                    self._log(req, None, 204)
                    return None
        authorized = self.authorized(req.headers.get("authorization"), req.headers.get("x-api-key"))
        path = req.path
        reading = req.method in ("GET", "HEAD")  # HEAD: the same answer, its body left unsent
        if reading and path == "/health":
            payload: dict[str, Any] = {"status": "ok"}
            if authorized:
                payload["instance"] = self.instance
            await req.respond(200, payload)
            return None  # health polls are not logged
        if not authorized:
            raise _Reply(
                401,
                _error("missing or wrong bearer token", "authentication_error", "invalid_api_key"),
                {"www-authenticate": 'Bearer realm="localllm"'},
            )
        if reading:
            await self._get(req, path)
            self._log(req, None, req.status)
            return None
        if req.method != "POST":
            raise _Reply(
                405,
                _error(f"{req.method} is not allowed here", "invalid_request_error", "method_not_allowed"),
                {"allow": "POST" if path in _POSTED else "GET, HEAD"},
            )
        data, raw = await self._json_body(req)
        if path == "/localllm/stop":
            return await self._stop(req, data)
        if path in _PROXIED:
            return await self._proxy(req, _PROXIED[path], data, raw)
        if isinstance(req, _Translated):
            return await self._translated(req, data, raw)
        raise _Reply(404, _error(f"no route {path}", "invalid_request_error", "not_found"))

    async def _translated(self, req: _Translated, data: dict[str, Any], raw: bytes) -> str | None:
        """``POST /v1/responses`` or ``/v1/messages`` as the chat request it means."""

        def translate() -> tuple[dict[str, Any], Where, bytes]:
            body, where = req.dialect.to_chat(data)
            return body, where, json.dumps(body).encode()

        try:
            # off the event loop for a large body, as a chat body is read: 16 MiB of tool_use
            # input numbers took 0.5 s to turn into chat
            body, req.where, sent = await self._off_loop(translate) if len(raw) > _OFF_LOOP_BYTES else translate()
        except chat.BadRequest as exc:
            raise _Reply(400, exc.to_json()) from None
        req.asked = data
        return await self._proxy(req, "/v1/chat/completions", body, sent)

    async def _get(self, req: _Request, path: str) -> None:
        if path == "/v1/models":
            await req.respond(200, {"object": "list", "data": await self._blocking(self.models)})
        elif path.startswith("/v1/models/"):
            wanted = path[len("/v1/models/") :]
            rows = await self._blocking(self.models)
            row = next((r for r in rows if r["id"] == wanted), None)
            if row is None:
                await req.respond(
                    404, _error(f"model {wanted!r} is not served here", "invalid_request_error", "model_not_found")
                )
            else:
                await req.respond(200, row)
        elif path == "/metrics":
            gauges = {
                "localllm_models_loaded": float(len(await self._blocking(self.pool.loaded))),
                "localllm_requests_in_flight": float(self._inflight),
            }
            await req.respond(200, self.metrics.render(gauges).encode(), "text/plain; version=0.0.4")
        elif path == "/localllm/ps":
            loaded = await self._blocking(self.pool.loaded)
            await req.respond(200, {"service": self.info(), "models": [m.to_json() for m in loaded]})
        elif path.startswith("/localllm/slots/"):
            await self._slots(req, path[len("/localllm/slots/") :])
        else:
            await req.respond(404, _error(f"no route {path}", "invalid_request_error", "not_found"))

    async def _slots(self, req: _Request, model: str) -> None:
        """llama-server's own ``/slots`` of a loaded model (which slots are generating)."""
        loaded = await self._blocking(self.pool.loaded)
        row = next((m for m in loaded if m.id == model and m.port), None)
        if row is None:
            await req.respond(404, _error(f"{model!r} is not loaded", "invalid_request_error", "model_not_loaded"))
            return
        url = f"http://127.0.0.1:{row.port}/slots"

        async def read() -> tuple[int, dict[str, str], bytes]:
            # not the generations' pool: its connections (slots + 1) may all be generating
            reply = await self.control().request("GET", url, b"", self._upstream_headers(), limit=1)
            try:
                return reply.status, reply.headers, await reply.read()
            finally:
                reply.close()

        try:
            status, headers, content = await asyncio.wait_for(read(), _SLOTS_WAIT)
        except TimeoutError:
            await req.respond(
                504,
                _error(
                    f"the llama-server of {model!r} did not answer /slots within {_SLOTS_WAIT:g} s",
                    "server_error",
                    "upstream_timeout",
                ),
            )
            return
        except OSError as exc:
            await req.respond(
                502, _error(f"the llama-server of {model!r} failed: {exc}", "server_error", "upstream_error")
            )
            return
        await req.respond(status, content, headers.get("content-type", "application/json"))

    async def _json_body(self, req: _Request) -> tuple[dict[str, Any], bytes]:
        limits = self.limits
        declared = req.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limits.max_body):
            raise _Reply(413, _error(f"request body must be at most {limits.max_body} bytes", "invalid_request_error"))
        try:
            raw = await asyncio.wait_for(self._read_body(req), limits.body_timeout)
        except TimeoutError:
            raise _Reply(
                408,
                _error(f"the request body did not arrive within {limits.body_timeout:g} s", "invalid_request_error"),
            ) from None
        # a UTF-8 byte-order mark: JSON readers may ignore it, and llama-server cannot read it
        raw = raw.removeprefix(b"\xef\xbb\xbf")
        parse = functools.partial(_parse, raw or b"{}", limits.max_depth)
        try:
            # a large body off the event loop: reading 16 MiB of numbers is seconds of Python
            data, too_deep = await self._off_loop(parse) if len(raw) > _OFF_LOOP_BYTES else parse()
        except ValueError as exc:
            raise _Reply(400, _error(f"the body is not valid JSON: {exc}", "invalid_request_error")) from None
        if too_deep:
            raise _Reply(
                400,
                _error(f"the body nests deeper than {limits.max_depth} levels", "invalid_request_error", "too_deep"),
            )
        if not isinstance(data, dict):
            raise _Reply(400, _error("the body must be a JSON object", "invalid_request_error"))
        return data, raw

    async def _read_body(self, req: _Request) -> bytes:
        limit = self.limits.max_body
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await req.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Reply(413, _error(f"request body must be at most {limit} bytes", "invalid_request_error"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _stop(self, req: _Request, data: dict[str, Any]) -> str | None:
        if data.get("all") is True:
            await req.respond(200, {"stopping": True})
            self._log(req, None, 200)
            self.request_shutdown()
            return None
        model = data.get("model")
        if not isinstance(model, str):
            raise _Reply(400, _error('give {"model": ID} or {"all": true}', "invalid_request_error"))
        unloaded = await self._blocking(self.pool.unload, model)
        await req.respond(200, {"model": model, "unloaded": unloaded})
        served = model if model in self.pool.catalog else None  # a metrics label only for a served id
        self._log(req, served, 200)
        return served

    # ------------------------------------------------------------------ proxy

    async def _proxy(self, req: _Request, path: str, data: dict[str, Any], raw: bytes) -> str | None:
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise _Reply(
                400, _error('"model" is required (see GET /v1/models)', "invalid_request_error", param="model")
            )
        spec = self.pool.catalog.get(model)
        if spec is not None and path in _ROLE_OF and spec.role != _ROLE_OF[path]:
            route = next(p for p, role in _ROLE_OF.items() if role == spec.role)
            raise _Reply(
                400,
                _error(
                    f"model {model!r} is {'an' if spec.role == 'embedding' else 'a'} {spec.role} model: "
                    f"send it to POST {route} "
                    "(GET /v1/models gives each model's role)",
                    "invalid_request_error",
                    "model_role_mismatch",
                    param="model",
                ),
            )
        busy = max(self._inflight, self._acquiring, self._compiling)
        if busy >= self.limits.max_queue:
            raise _Reply(
                503,
                _error(
                    f"the service has {busy} requests in flight (its queue holds {self.limits.max_queue}); retry",
                    "server_error",
                    "queue_full",
                ),
                {"retry-after": str(self.limits.retry_after)},
            )
        self._inflight += 1  # from here: a request being prepared is in flight too
        try:
            prepared, keep_alive, data, raw = await self._prepared(req, path, data, raw, model, spec)
            work = self._leased(req, model, path, raw, prepared, keep_alive, data)
            status, tokens = await self._watched(req, work)
        finally:
            self._inflight -= 1
        self._log(req, model, status, tokens)
        return model

    async def _prepared(  # noqa: PLR0917
        self, req: _Request, path: str, data: dict[str, Any], raw: bytes, model: str, spec: ModelSpec | None
    ) -> tuple[chat.Prepared | None, float | None, dict[str, Any], bytes]:
        """The request as sent upstream: (prepared, keep_alive, data, raw)."""
        prepared: chat.Prepared | None = None
        keep_alive: float | None = None
        try:
            chat.check_text(data, raw)
            if path in _GENERATING:
                prepare = functools.partial(
                    chat.prepare if path == "/v1/chat/completions" else completion.prepare,
                    data,
                    model,
                    limits=self.limits.chat,
                    stop=self.stops.get(model, ()),
                    parallel=spec.parallel if spec is not None else None,
                )
                if len(raw) > _OFF_LOOP_BYTES or any(data.get(k) is not None for k in (*chat.SCHEMA_KEYS, "grammar")):
                    # checking and compiling a new schema takes CPU time (seconds for a large
                    # one), and so does reading a large body: a thread of its own, off the event
                    # loop, which serves every other client meanwhile; a schema sent before is
                    # kept compiled, so its request never waits behind another client's compile
                    prepared = await self._watched(req, asyncio.shield(self._off_loop(prepare)))
                else:
                    prepared = prepare()
                keep_alive = prepared.keep_alive
                raw = json.dumps(prepared.body).encode()
            else:
                # null is the default (chat.prepare does the same): llama-server reads some as type errors, 500s
                sent = {k: v for k, v in data.items() if v is not None and k != "keep_alive"}
                if "keep_alive" in data:
                    keep_alive = chat.parse_keep_alive(data["keep_alive"])
                if path == "/v1/embeddings":
                    chat.check_embeddings(sent)
                elif path in ("/tokenize", "/detokenize"):
                    chat.check_tokens(path, sent)
                if sent != data:  # re-encoded only when something was left out
                    data, raw = sent, json.dumps(sent).encode()
        except chat.BadRequest as exc:
            raise _Reply(400, exc.to_json()) from None
        return prepared, keep_alive, data, raw

    async def _watched(self, req: _Request, work: Awaitable[_T]) -> _T:
        """Run ``work`` while watching for the client leaving; if it leaves, cancel ``work``."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(req.receive())
        try:
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            message = watch.result()
            if message.get("type") == "http.disconnect" and not req.completed:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise ClientGone()
            return await task  # an unexpected extra message: keep going
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()

    async def _leased(  # noqa: PLR0917
        self,
        req: _Request,
        model: str,
        path: str,
        raw: bytes,
        prepared: chat.Prepared | None,
        keep_alive: float | None,
        data: dict[str, Any],
    ) -> tuple[int, tuple[Any, Any]]:
        loop = asyncio.get_running_loop()
        acquiring = loop.run_in_executor(self._leases, self.pool.acquire, model, self.load_wait)
        self._acquiring += 1

        def acquired(_: asyncio.Future[Any]) -> None:
            self._acquiring -= 1

        acquiring.add_done_callback(acquired)
        try:
            held = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            # the client left while the model loaded: give the lease back once it is granted
            def give_back(fut: asyncio.Future[Any]) -> None:
                if not fut.cancelled() and fut.exception() is None:
                    self._releases.submit(self.pool.release, fut.result())

            acquiring.add_done_callback(give_back)
            raise
        except UnknownServedModel as exc:
            raise _Reply(404, _error(f"{exc} ({exc.hint})", "invalid_request_error", "model_not_found")) from None
        except PoolBusy as exc:
            raise _Reply(
                503, _error(f"{exc} ({exc.hint})", "server_error", "model_busy"), {"retry-after": "5"}
            ) from None
        except LocalLLMError as exc:  # fetch, verify or spawn failed: the model cannot load
            hint = f" ({exc.hint})" if getattr(exc, "hint", "") else ""
            raise _Reply(
                503, _error(f"cannot load {model!r}: {exc}{hint}", "server_error", "model_load_failed")
            ) from None
        try:
            lease = held.lease
            if keep_alive is not None:
                self.pool.keep(model, keep_alive)
            extra = {GRAMMAR_HEADER: json.dumps(lease.grammar_enforced)} if path in _GENERATING else {}
            if prepared is not None and (ids := chat.token_ids(prepared)):
                refused = chat.token_refusal(ids, await self._vocab_size(model, lease.target))
                if refused is not None:
                    raise _Reply(400, refused.to_json())
            sent = prepared.body if prepared is not None else data  # the tool prompt is the service's
            refused = await self._text_refusal(model, lease.target, path, sent, len(raw))
            if refused is not None:
                raise _Reply(400, refused.to_json())
            target: Target | None = lease.target
            for attempt in (1, 2):
                assert target is not None
                try:
                    self._hosts[target.root] = held.entry.spec.parallel + 1  # connections its HTTP threads can serve
                    return await self._dispatch(req, target.url(path), raw, prepared, dict(extra), data)
                except OSError as exc:
                    if req.started_response:
                        raise
                    if attempt == 1:
                        # the upstream's one failure rule (managed.upstream): a broken connection
                        # (a crash, an OOM kill) is retried once on a respawned server, while
                        # nothing has reached the client yet
                        with contextlib.suppress(LocalLLMError):
                            target = await self._blocking(held.entry.backend.recover, target, exc)
                            if target is not None:
                                continue
                    raise _Reply(
                        502,
                        _error(
                            f"the llama-server of {model!r} failed: {type(exc).__name__}: {exc}",
                            "server_error",
                            "upstream_error",
                        ),
                    ) from None
            raise AssertionError("unreachable")
        finally:
            # not awaited: a cancelled request must still give its model back. Its own threads:
            # queued behind acquires, it would wait for the acquires waiting for it (load_wait)
            self._releases.submit(self.pool.release, held, time.monotonic())

    async def _dispatch(  # noqa: PLR0917
        self,
        req: _Request,
        url: str,
        raw: bytes,
        prepared: chat.Prepared | None,
        extra: dict[str, str],
        data: dict[str, Any],
    ) -> tuple[int, tuple[Any, Any]]:
        if prepared is None:
            return await self._relay(req, url, raw, extra, data)
        extra[STRUCTURED_HEADER] = prepared.structured
        if prepared.stream and not prepared.buffered:
            extra[VALIDATED_HEADER] = "false"
            return await self._relay_stream(req, url, raw, extra, req.rewriter(prepared))
        return await self._chat(req, url, raw, prepared, extra)

    def _limit(self, url: str) -> int:
        base = url[: url.find("/", len("http://"))] if url.count("/") > 2 else url
        return self._hosts.get(base, 2)

    def _upstream_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.upstream_key}",
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }

    async def _post(self, url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        reply = await asyncio.wait_for(
            self.client().request("POST", url, raw, self._upstream_headers(), limit=self._limit(url)), _READ
        )
        try:
            return reply.status, reply.headers, await asyncio.wait_for(reply.read(), _READ)
        finally:
            reply.close()  # cancelled (the client left): the connection closes, the generation stops

    async def _relay(
        self, req: _Request, url: str, raw: bytes, extra: Mapping[str, str], data: dict[str, Any]
    ) -> tuple[int, tuple[Any, Any]]:
        """Pass llama-server's answer on, but for what it gets wrong: vectors of another size
        than ``dimensions`` asked for (it ignores the field), and a 500 for an unknown token id."""
        status, headers, content = await self._post(url, raw)
        tokens: tuple[Any, Any] = (None, None)
        refused: chat.BadRequest | None = None
        if status == 200:
            with contextlib.suppress(ValueError):
                answer = json.loads(content)
                tokens = _usage(answer)
                if url.endswith("/v1/embeddings") and data.get("dimensions") is not None:
                    refused = chat.dimensions_refusal(data["dimensions"], answer)
        elif status == 500 and url.endswith(("/detokenize", "/tokenize")):
            route, field = ("/detokenize", "tokens") if url.endswith("/detokenize") else ("/tokenize", "content")
            given = data[field] if isinstance(data[field], list) else []
            models = await self._upstream_json(url.removesuffix(route) + "/v1/models")
            refused = chat.vocab_refusal(given, models, field)
        if refused is not None:
            await req.respond(400, refused.to_json(), headers=extra)
            return 400, tokens
        await req.respond(status, content, headers.get("content-type", "application/json"), extra)
        return status, tokens

    async def _vocab_size(self, model: str, target: Target) -> int | None:
        """How many tokens ``model``'s vocabulary has (llama-server's ``GET /v1/models``
        ``meta.n_vocab``), asked once per model; None when its server does not say (asked
        again next time only when there was no answer at all)."""
        if model not in self._n_vocab:
            answer = await self._upstream_json(target.url("/v1/models"))
            if answer is None:
                return None
            self._n_vocab[model] = chat.vocab_size(answer)
        return self._n_vocab[model]

    async def _text_refusal(
        self, model: str, target: Target, path: str, data: dict[str, Any], size: int
    ) -> chat.BadRequest | None:
        """The 400 for texts past what ``model`` can read (:func:`pieces.refusal`), counted with
        its vocabulary and context per slot, read once (None: its server does not say); on a
        worker thread for a body past 64 KiB (16 MiB without a special token: 0.15 s). A body
        within :data:`vocab.QUICK_BYTES` is not counted."""
        if size <= vocab.QUICK_BYTES:
            return None
        if model not in self._vocabs:
            props = await self._upstream_json(target.url("/props"))
            if props is None:
                return None
            self._vocabs[model] = await self._blocking(vocab.from_props, props)
        known = self._vocabs[model]
        if known is None:
            return None
        if size <= 64 << 10:  # a few µs: cheaper than the hop to a thread
            return pieces.refusal(known[0], path, data, known[1])
        refused: chat.BadRequest | None = await self._blocking(pieces.refusal, known[0], path, data, known[1])
        return refused

    async def _upstream_json(self, url: str) -> Any:
        """``GET url`` of a llama-server, parsed; None when it cannot be had."""
        try:
            reply = await asyncio.wait_for(
                self.client().request("GET", url, b"", self._upstream_headers(), limit=self._limit(url)), _READ
            )
            try:
                return json.loads(await asyncio.wait_for(reply.read(), _READ))
            finally:
                reply.close()
        except (OSError, TimeoutError, ValueError):
            return None

    async def _chat(
        self, req: _Request, url: str, raw: bytes, prepared: chat.Prepared, extra: dict[str, str]
    ) -> tuple[int, tuple[Any, Any]]:
        status, headers, content = await self._post(url, raw)
        try:
            answer = json.loads(content)
        except ValueError:
            answer = None
        if status != 200 or not isinstance(answer, dict):
            refused = chat.converter_failure(prepared, status, answer) or chat.ended_failure(prepared, status, answer)
            if refused is not None:
                await req.respond(400, refused.to_json(), headers=extra)
                return 400, (None, None)
            await req.respond(status, content, headers.get("content-type", "application/json"), extra)
            return status, (None, None)
        tokens = _usage(answer)
        if prepared.completion:
            extra[VALIDATED_HEADER] = "false"
            await req.respond(200, completion.finish(prepared, answer), headers=extra)
            return 200, tokens
        try:
            answer, validated = chat.finish(prepared, answer)
        except chat.Invalid as exc:
            extra[VALIDATED_HEADER] = "false"
            # the model's answer, not a passing fault: the openai SDKs (Python, JS) would
            # otherwise send the same request twice more, as for any 5xx
            extra["x-should-retry"] = "false"
            await req.respond(
                502,
                _error(
                    f"the model's answer broke a strict guarantee: {exc}",
                    "server_error",
                    "structured_output_invalid",
                ),
                headers=extra,
            )
            return 502, tokens
        extra[VALIDATED_HEADER] = "true" if validated else "false"
        await req.answer(prepared, answer, extra)  # a translated route writes it in its own API's shape
        return 200, tokens

    async def _relay_stream(
        self,
        req: _Request,
        url: str,
        raw: bytes,
        extra: Mapping[str, str],
        rewrite: _Rewrite | None = None,
    ) -> tuple[int, tuple[Any, Any]]:
        """Relay llama-server's stream chunk by chunk (``rewrite``: a /v1/completions stream's
        events as OpenAI's clients read them, :class:`~localllm.service.completion.CompletionStream`;
        a translated route's, :class:`~localllm.service.dialects.ChatStream`)."""
        tail = b""
        reply = await self.client().request("POST", url, raw, self._upstream_headers(), limit=self._limit(url))
        if reply.status != 200:
            try:  # an error before the stream began, in llama-server's JSON: answered as an error
                content = await asyncio.wait_for(reply.read(), _READ)
            finally:
                reply.close()
            await req.respond(reply.status, content, reply.headers.get("content-type", "application/json"), extra)
            return reply.status, (None, None)
        try:
            await req.start(
                reply.status,
                reply.headers.get("content-type", "text/event-stream"),
                {**extra, "cache-control": "no-cache"},
            )
            try:
                async for given in reply.chunks():
                    tail = (tail + given)[-_TAIL:]  # llama-server's own events: their usage
                    chunk = rewrite.feed(given) if rewrite is not None else given
                    if not chunk:
                        continue
                    await req.send({"type": "http.response.body", "body": chunk, "more_body": True})
                rest = rewrite.flush() if rewrite is not None else b""
                if rest:
                    await req.send({"type": "http.response.body", "body": rest, "more_body": True})
            except OSError:
                # the server died mid-answer and the status line is already out: end the
                # connection without the last chunk, so the client sees a broken stream
                raise _Abort() from None
            await req.end()
            return reply.status, _stream_usage(tail)
        finally:
            reply.close()  # a client that left: the upstream connection closes, the generation stops


class _Rewrite(Protocol):
    """A stream rewriter: llama-server's stream in, what the client reads out."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class _Abort(Exception):
    """Drop the client connection without ending the response (a broken upstream stream)."""


def _ms(req: _Request) -> float:
    return (time.monotonic() - req.started) * 1000
