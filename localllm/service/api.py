"""The service's HTTP front: OpenAI-compatible routes, auth, the proxy hop, metrics, the log line.

Routes (every one needs ``Authorization: Bearer <token>`` unless the service runs with
``--no-auth``; ``GET /health`` answers without it, but only with the token does it name
the instance)::

    GET  /health                   {"status": "ok", "instance": …}
    GET  /v1/models                every servable model: id, role, cached, loaded
    POST /v1/chat/completions      routed by "model"; "stream": true is relayed chunk by chunk
    POST /v1/embeddings            routed by "model"; inputs are passed through untouched
    POST /tokenize, /detokenize    llama-server's own, routed by an extra "model" field
    GET  /metrics                  Prometheus text counters
    GET  /localllm/ps              the loaded models (``localllm ps``)
    POST /localllm/stop            {"model": ID} unloads one model, {"all": true} stops the service

The body is forwarded byte for byte (``response_format``, ``grammar`` and every other field
reach llama-server as sent); nothing is added to prompts or inputs. Request bodies are
never logged: one line per request says method, path, model, status, tokens and ms.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from localllm.errors import LocalLLMError
from localllm.managed.server import GRAMMAR_HEADER
from localllm.service.guard import Guard
from localllm.service.pool import ModelPool, PoolBusy, UnknownServedModel

if TYPE_CHECKING:
    import httpx

__all__ = ["Metrics", "ServiceApp", "make_server"]

log = logging.getLogger("localllm.service")

_MAX_BODY = 64 * 1024 * 1024
#: routed paths → the llama-server path they are forwarded to
_PROXIED = {
    "/v1/chat/completions": "/v1/chat/completions",
    "/chat/completions": "/v1/chat/completions",
    "/v1/embeddings": "/v1/embeddings",
    "/embeddings": "/v1/embeddings",
    "/tokenize": "/tokenize",
    "/detokenize": "/detokenize",
}
_TAIL = 16 * 1024  # bytes of a stream kept to read its final usage


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
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")
        for name, value in sorted((gauges or {}).items()):
            lines += [f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"


@dataclass
class ServiceApp:
    """What the request handlers need: the pool, the secrets, and how to list and stop."""

    pool: ModelPool
    client: httpx.Client
    instance: str
    token: str | None
    upstream_key: str
    models: Callable[[], list[dict[str, Any]]]
    request_shutdown: Callable[[], None]
    info: Callable[[], dict[str, Any]]
    metrics: Metrics = field(default_factory=Metrics)
    load_wait: float = 300.0
    guard: Guard | None = None
    _connections: set[socket.socket] = field(default_factory=set)
    _conn_lock: threading.Lock = field(default_factory=threading.Lock)

    def track(self, conn: socket.socket, *, open_: bool) -> None:
        with self._conn_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def drop_connections(self) -> None:
        """Close every client connection (keep-alive ones would otherwise outlive the service)."""
        with self._conn_lock:
            conns = list(self._connections)
            self._connections.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def authorized(self, header: str | None, api_key: str | None) -> bool:
        if self.token is None:
            return True
        given = header[7:].strip() if header and header.startswith("Bearer ") else (api_key or "")
        return hmac.compare_digest(given.encode(), self.token.encode())


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "localllm-service"
    app: ServiceApp  # set on the bound subclass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request is written by _log_request, never the raw request line

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle holds the body
        # back until the client's delayed ACK, adding ~40 ms to every answer
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.app.track(self.connection, open_=True)

    def finish(self) -> None:
        self.app.track(self.connection, open_=False)
        super().finish()

    # ------------------------------------------------------------------ plumbing

    def _send(
        self,
        status: int,
        payload: Any,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY:
            self.close_connection = True
            self._send(413, _error(f"request body must be 0-{_MAX_BODY} bytes", "invalid_request_error"))
            return None
        return self.rfile.read(length) if length else b""

    def _log_request(
        self, model: str | None, status: int, started: float, tokens: tuple[Any, Any] = (None, None)
    ) -> None:
        ms = (time.monotonic() - started) * 1000
        prompt, completion = tokens
        log.info(
            "%s %s model=%s status=%d prompt_tokens=%s completion_tokens=%s ms=%.0f",
            self.command,
            self.path.split("?", 1)[0],
            model or "-",
            status,
            "-" if prompt is None else prompt,
            "-" if completion is None else completion,
            ms,
        )
        metrics = self.app.metrics
        metrics.add("localllm_requests_total", path=self.path.split("?", 1)[0], status=str(status))
        if model:
            metrics.add("localllm_model_requests_total", model=model, status=str(status))
            if isinstance(prompt, int):
                metrics.add("localllm_prompt_tokens_total", prompt, model=model)
            if isinstance(completion, int):
                metrics.add("localllm_completion_tokens_total", completion, model=model)
            metrics.add("localllm_request_ms_total", ms, model=model)

    def _authorized(self) -> bool:
        return self.app.authorized(self.headers.get("Authorization"), self.headers.get("X-Api-Key"))

    # ------------------------------------------------------------------ routes

    def _guarded(self, started: float) -> bool:
        """Host, Origin and Content-Type checks (every mode); False when refused (answered)."""
        guard = self.app.guard
        if guard is None:
            return True
        refused = guard.check(
            self.command, self.headers.get("Host"), self.headers.get("Origin"), self.headers.get("Content-Type")
        )
        if refused is None:
            return True
        self.close_connection = True  # the unread body must not be parsed as the next request
        self._send(refused.status, _error(refused.message, "invalid_request_error", refused.code))
        self._log_request(None, refused.status, started)
        return False

    def do_GET(self) -> None:
        started = time.monotonic()
        path = self.path.split("?", 1)[0]
        if not self._guarded(started):
            return
        authorized = self._authorized()
        if path == "/health":
            payload: dict[str, Any] = {"status": "ok"}
            if authorized:
                payload["instance"] = self.app.instance
            self._send(200, payload)
            return  # health polls are not logged
        if not authorized:
            self._unauthorized(started)
            return
        if path == "/v1/models":
            self._send(200, {"object": "list", "data": self.app.models()})
        elif path == "/metrics":
            gauges = {"localllm_models_loaded": float(len(self.app.pool.loaded()))}
            self._send(200, self.app.metrics.render(gauges).encode(), "text/plain; version=0.0.4")
        elif path == "/localllm/ps":
            self._send(200, {"service": self.app.info(), "models": [m.to_json() for m in self.app.pool.loaded()]})
        else:
            self._send(404, _error(f"no route {path}", "invalid_request_error", "not_found"))
        self._log_request(None, 200 if path in ("/v1/models", "/metrics", "/localllm/ps") else 404, started)

    def do_POST(self) -> None:
        started = time.monotonic()
        path = self.path.split("?", 1)[0]
        if not self._guarded(started):
            return
        if not self._authorized():
            self._unauthorized(started)
            return
        body = self._body()
        if body is None:
            self._log_request(None, 413, started)
            return
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self._send(400, _error("the body must be a JSON object", "invalid_request_error"))
            self._log_request(None, 400, started)
            return
        if path == "/localllm/stop":
            self._stop(data, started)
        elif path in _PROXIED:
            self._proxy(_PROXIED[path], body, data, started)
        else:
            self._send(404, _error(f"no route {path}", "invalid_request_error", "not_found"))
            self._log_request(None, 404, started)

    def _unauthorized(self, started: float) -> None:
        self.close_connection = True  # the unread body must not be parsed as the next request
        self.send_response(401)
        self.send_header("Connection", "close")
        body = json.dumps(_error("missing or wrong bearer token", "authentication_error", "invalid_api_key")).encode()
        self.send_header("WWW-Authenticate", 'Bearer realm="localllm"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self._log_request(None, 401, started)

    def _stop(self, data: dict[str, Any], started: float) -> None:
        if data.get("all") is True:
            self._send(200, {"stopping": True})
            self._log_request(None, 200, started)
            self.app.request_shutdown()
            return
        model = data.get("model")
        if not isinstance(model, str):
            self._send(400, _error('give {"model": ID} or {"all": true}', "invalid_request_error"))
            self._log_request(None, 400, started)
            return
        unloaded = self.app.pool.unload(model)
        self._send(200, {"model": model, "unloaded": unloaded})
        self._log_request(model, 200, started)

    # ------------------------------------------------------------------ proxy

    def _proxy(self, path: str, body: bytes, data: dict[str, Any], started: float) -> None:
        import httpx

        model = data.get("model")
        if not isinstance(model, str) or not model:
            self._send(400, _error('"model" is required (see GET /v1/models)', "invalid_request_error"))
            self._log_request(None, 400, started)
            return
        chat = path == "/v1/chat/completions"
        stream = chat and data.get("stream") is True
        status, tokens = 502, (None, None)
        try:
            with self.app.pool.lease(model, wait=self.app.load_wait) as lease:
                url = lease.url + path
                # what the model's server did with the grammar canary, for attached agents' meta
                canary = {GRAMMAR_HEADER: json.dumps(lease.grammar_enforced)} if chat else {}
                if stream:
                    status, tokens = self._relay_stream(url, body, canary)
                else:
                    status, tokens = self._relay(url, body, canary)
        except UnknownServedModel as exc:
            status = 404
            self._send(404, _error(f"{exc} ({exc.hint})", "invalid_request_error", "model_not_found"))
        except PoolBusy as exc:
            status = 503
            self._send(503, _error(f"{exc} ({exc.hint})", "server_error", "model_busy"))
        except LocalLLMError as exc:  # fetch, verify or spawn failed: the model cannot load
            status = 503
            hint = f" ({exc.hint})" if getattr(exc, "hint", "") else ""
            self._send(503, _error(f"cannot load {model!r}: {exc}{hint}", "server_error", "model_load_failed"))
        except httpx.HTTPError as exc:
            status = 502
            self._send(
                502,
                _error(
                    f"the llama-server of {model!r} failed: {type(exc).__name__}: {exc}",
                    "server_error",
                    "upstream_error",
                ),
            )
        except (BrokenPipeError, ConnectionResetError):
            status = 499  # the client went away mid-answer
            self.close_connection = True
        self._log_request(model, status, started, tokens)

    def _upstream_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.app.upstream_key}",
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }

    def _relay(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, tuple[Any, Any]]:
        reply = self.app.client.post(url, content=body, headers=self._upstream_headers())
        content = reply.content
        tokens: tuple[Any, Any] = (None, None)
        if reply.status_code == 200:
            with contextlib.suppress(ValueError):
                tokens = _usage(json.loads(content))
        self._send(reply.status_code, content, reply.headers.get("content-type", "application/json"), headers)
        return reply.status_code, tokens

    def _relay_stream(self, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, tuple[Any, Any]]:
        import httpx

        tail = b""
        with self.app.client.stream("POST", url, content=body, headers=self._upstream_headers()) as reply:
            self.send_response(reply.status_code)
            self.send_header("Content-Type", reply.headers.get("content-type", "text/event-stream"))
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            try:
                for chunk in reply.iter_raw():
                    if not chunk:
                        continue
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    tail = (tail + chunk)[-_TAIL:]
            except httpx.HTTPError:
                # the server died mid-answer and the status line is already out: end the
                # connection without the last chunk, so the client sees a broken stream
                self.close_connection = True
                return 502, _stream_usage(tail)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return reply.status_code, _stream_usage(tail)


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def make_server(app: ServiceApp, host: str, port: int) -> ThreadingHTTPServer:
    """A bound (not yet serving) HTTP server for ``app``."""
    handler = type("ServiceHandler", (_Handler,), {"app": app})
    server = (_Server6 if ":" in host else ThreadingHTTPServer)((host, port), handler)
    server.daemon_threads = True
    return server
