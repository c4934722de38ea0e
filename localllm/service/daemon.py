"""``localllm serve``: one long-lived process that owns the managed models of a cache.

Start-up, in order: take ``<cache>/run/service.lock`` (a second service for the same cache
refuses and names the first); resolve the llama-server build (fetching it if the cache has
none) and hash it; bind the HTTP front; write the token (0600) and then the discovery
file. Shutdown (SIGTERM, SIGINT, ``localllm stop --all`` or :meth:`Service.close`) runs the
same steps backwards: stop listening, stop every llama-server, remove the discovery file
and the token, release the lock. A SIGKILLed service leaves no server behind: each one
has a watchdog that stops it when its parent dies; the stale discovery file is ignored by
readers (dead pid) and replaced by the next service.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import signal
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from localllm._http import is_loopback
from localllm.errors import ServiceError, ServiceRunning
from localllm.managed import discovery
from localllm.service.backend import BackendFactory, managed_upstream
from localllm.service.catalog import CHAT_PARALLEL, ModelSpec, build_catalog, is_cached
from localllm.service.units import parse_duration, parse_size

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.managed.pins import Pins
    from localllm.service.api import FrontLimits, ServiceApp
    from localllm.service.front import Front
    from localllm.service.pool import ModelPool

__all__ = ["DEFAULT_PORT", "ServeOptions", "Service", "is_loopback", "parse_duration", "parse_size"]

DEFAULT_PORT = 8911


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``localllm serve`` takes; ``token=None`` with ``no_auth=False`` makes one."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    keep_alive: float = 300.0
    max_models: int | None = None
    memory_budget: int | None = None
    token: str | None = None
    no_auth: bool = False
    chat_parallel: int = CHAT_PARALLEL
    load_wait: float = 300.0
    #: web origins (``http://host:port``) allowed to call the service from a browser
    allow_origins: tuple[str, ...] = ()
    #: extra Host names accepted besides the bound loopback name/address
    allow_hosts: tuple[str, ...] = ()
    #: the HTTP front's bounds and the chat caps (None: the defaults of FrontLimits)
    limits: FrontLimits | None = None


class Service:
    """A running service; :meth:`start` it, then :meth:`wait` (signals) or :meth:`close` it."""

    def __init__(
        self,
        options: ServeOptions | None = None,
        *,
        config: Config | None = None,
        cache_root: Path | None = None,
        pins: Pins | None = None,
        factory: BackendFactory = managed_upstream,
    ) -> None:
        from localllm import settings

        self.options = options or ServeOptions()
        if self.options.no_auth and not is_loopback(self.options.host):
            raise ServiceError(
                f"refusing to serve {self.options.host} without a token",
                hint="drop --no-auth (a token is made for you) or bind 127.0.0.1",
            )
        self.config = config
        self.cache_root = Path(cache_root) if cache_root is not None else settings.cache_dir()
        self.run_dir = discovery.run_dir(self.cache_root)
        self._pins = pins
        self._factory = factory
        self.instance = secrets.token_hex(8)
        self.token: str | None = None if self.options.no_auth else (self.options.token or secrets.token_urlsafe(32))
        self._upstream_key = secrets.token_urlsafe(24)
        self._lock_fd: int | None = None
        self._sock: socket.socket | None = None
        self._server: Front | None = None
        self._stop_event = threading.Event()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self.pool: ModelPool | None = None
        self.app: ServiceApp | None = None
        self.catalog: dict[str, ModelSpec] = {}
        self.build_sha256 = ""
        self.build_path = ""
        self._model_shas: dict[str, dict[str, str]] = {}
        self._token_written = False
        self.started = ""

    # ------------------------------------------------------------------ start

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.port

    @property
    def url(self) -> str:
        return discovery.http_url(self.options.host, self.port)

    @property
    def token_path(self) -> Path:
        return self.run_dir / discovery.TOKEN_FILE

    def start(self) -> Service:
        """Lock the cache, listen, resolve the build, publish the discovery file, serve in a thread."""
        self._take_lock()
        try:
            self._listen()  # before _prepare: a busy port is said before llama-server is fetched
            self._prepare()
            self._bind()
            self._publish()
        except BaseException:
            self.close()
            raise
        assert self._server is not None
        self._server.start()
        return self

    def _take_lock(self) -> None:
        lock = self.run_dir / discovery.LOCK_FILE
        try:
            self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.run_dir, 0o700)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # a directory at the lock: "a bug in localllm" (IsADirectoryError)
            raise discovery.unusable(lock if self.run_dir.is_dir() else self.run_dir, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            found = discovery.read_discovery(self.cache_root)
            raise ServiceRunning(
                cache=str(self.cache_root), pid=found.pid if found else None, port=found.port if found else None
            ) from None
        self._lock_fd = fd

    def _prepare(self) -> None:
        from localllm.managed import ensure_server
        from localllm.managed.pins import load_pins

        pins = self._pins or load_pins()
        self._pins = pins
        self.catalog = build_catalog(pins, self.config, chat_parallel=self.options.chat_parallel)
        binary = ensure_server().binary
        self.build_path = os.path.realpath(binary)
        self.build_sha256 = discovery.file_sha256(binary)
        for model_id, spec in self.catalog.items():
            # what attachers compare: a model whose files cannot be read now is still served
            # (its load reports why) but is not offered for attach
            try:
                build = (
                    self.build_sha256
                    if not spec.server_bin
                    else discovery.file_sha256(Path(spec.server_bin).expanduser())
                )
                path = spec.gguf_path()
                sha = spec.sha256 or (discovery.file_sha256(path) if path is not None else None)
            except OSError:
                continue
            if sha is not None:
                self._model_shas[model_id] = {"sha256": sha, "role": spec.role, "build_sha256": build}

        from localllm.service.pool import ModelPool

        self.pool = ModelPool(
            self.catalog,
            self._factory,
            api_key=self._upstream_key,
            keep_alive=self.options.keep_alive,
            max_models=self.options.max_models,
            memory_budget=self.options.memory_budget,
            estimate=self._estimate,
            on_event=self._on_event,
        )

    def _estimate(self, spec: ModelSpec) -> int:
        if spec.size:
            return spec.size
        path = spec.gguf_path()
        try:
            return path.stat().st_size if path is not None else 0
        except OSError:
            return 0

    def _on_event(self, kind: str, model: str) -> None:
        from localllm.service.api import log

        log.info("%s model=%s", kind, model)
        if self.app is not None:
            self.app.metrics.add("localllm_model_events_total", event=kind, model=model)

    def _listen(self) -> None:
        from localllm.service.api import FrontLimits
        from localllm.service.front import listen

        backlog = (self.options.limits or FrontLimits()).backlog
        try:
            self._sock = listen(self.options.host, self.options.port, backlog)
        except OSError as exc:
            taken = exc.errno in (errno.EADDRINUSE, errno.EACCES)  # EACCES: a port below 1024
            raise ServiceError(
                f"cannot listen on {self.options.host}:{self.options.port}: {exc.strerror or exc}",
                hint="choose another --port (0 picks a free one) or stop whatever holds it"
                if taken
                else "--host must be an address of this machine: 127.0.0.1 (the default), ::1, or 0.0.0.0 for all",
            ) from exc

    def _bind(self) -> None:
        from localllm.service.api import FrontLimits, ServiceApp
        from localllm.service.front import Front
        from localllm.service.guard import Guard

        assert self.pool is not None and self._sock is not None
        self.app = ServiceApp(
            pool=self.pool,
            instance=self.instance,
            token=self.token,
            upstream_key=self._upstream_key,
            models=self._models_json,
            request_shutdown=self.request_stop,
            info=self.info,
            load_wait=self.options.load_wait,
            limits=self.options.limits or FrontLimits(),
            stops={model_id: spec.stop for model_id, spec in self.catalog.items() if spec.stop},
        )
        self._server = Front(self.app, self._sock)
        self._sock = None  # the front's now: its stop() closes it
        self.app.guard = Guard.build(self.options.host, self.port, self.options.allow_origins, self.options.allow_hosts)

    def _publish(self) -> None:
        token_file: str | None = None
        if self.token is not None:
            _write_run_file(self.token_path, self.token + "\n")
            self._token_written = True
            token_file = str(self.token_path)
        self.started = datetime.now(UTC).isoformat(timespec="seconds")
        found = discovery.Discovery(
            pid=os.getpid(),
            host=self.options.host,
            port=self.port,
            instance=self.instance,
            token_file=token_file,
            build_sha256=self.build_sha256,
            build_path=self.build_path,
            models=self._model_shas,
            started=self.started,
        )
        try:
            discovery.write_discovery(self.cache_root, found)
        except OSError as exc:  # a directory at service.json: "a bug in localllm" (IsADirectoryError)
            raise discovery.unusable(self.run_dir / discovery.DISCOVERY_FILE, exc) from exc
        if self.pool is not None:
            self.pool.start_reaper()

    # ------------------------------------------------------------------ data

    def _models_json(self) -> list[dict[str, Any]]:
        from localllm.managed.cache import cache_layout

        assert self.pool is not None and self._pins is not None
        layout = cache_layout(self.cache_root)
        rows = []
        for model_id, spec in self.catalog.items():
            rows.append(
                {
                    "id": model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "localllm",
                    "role": spec.role,
                    "cached": is_cached(spec, self._pins, layout),
                    "loaded": self.pool.is_loaded(model_id),
                    "sha256": self._model_shas.get(model_id, {}).get("sha256"),
                }
            )
        return rows

    def info(self) -> dict[str, Any]:
        opts = self.options
        return {
            "pid": os.getpid(),
            "url": self.url,
            "instance": self.instance,
            "started": self.started,
            "keep_alive_s": opts.keep_alive,
            "max_models": opts.max_models,
            "memory_budget": opts.memory_budget,
            "build": {"sha256": self.build_sha256, "path": self.build_path},
            "cache": str(self.cache_root),
        }

    # ------------------------------------------------------------------ run / stop

    def request_stop(self) -> None:
        """Ask :meth:`wait` to shut down (from a signal handler or a request thread)."""
        self._stop_event.set()

    def wait(self) -> None:
        """Serve until SIGTERM/SIGINT or a stop request, then shut down cleanly (main thread only)."""
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: self._stop_event.set())
        try:
            while not self._stop_event.wait(0.5):
                pass
        finally:
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def close(self) -> None:
        """Stop listening, stop every llama-server, remove the discovery file and token; idempotent."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._stop_event.set()
        if self._server is not None:
            self._server.stop()
        if self._sock is not None:  # bound, but the front never took it
            self._sock.close()
            self._sock = None
        if self.pool is not None:
            self.pool.close()
        if self.app is not None:
            self.app.close()
        if self._lock_fd is not None:
            discovery.remove_discovery(self.cache_root, self.instance)
            if self._token_written:  # never whatever else sits at the token's path
                self.token_path.unlink(missing_ok=True)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        from localllm.service.api import log

        log.info("service stopped")

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _write_run_file(path: Path, text: str) -> None:
    try:
        discovery.write_private(path, text)
    except OSError as exc:
        raise discovery.unusable(path, exc) from exc
