"""The one upstream seam: which server answers, one URL rule, one failure and retry rule.

A managed chat agent, a managed embedder and every model of a ``localllm serve`` hold one
:class:`Upstream`. It resolves a *route* and hands out a :class:`Target` (the server's
root URL, the model id and token to send, the route):

* ``endpoint`` — an ``endpoint:`` declaration: someone else's OpenAI-compatible server,
  never fetched, spawned, killed or retried;
* ``service`` — a running ``localllm serve`` of the same cache that serves the same
  llama-server build and model (compared by sha256, found through its discovery file), used
  as the ``service:`` policy says (``auto`` | ``required`` | ``never``);
* ``sidecar`` — the upstream's own :class:`~localllm.managed.server.ManagedServer`, built
  once from its :class:`~localllm.managed.spec.ServerSpec`, fetched and started on first use.

**Resolution** (:meth:`Upstream.prepare`, also an agent's ``prepare()`` step): a managed
upstream looks for a service until it has spawned a server of its own, and keeps its own
server once it has one. A service's own models use policy ``never`` (a service never
attaches to itself), so they take the same path as an agent's sidecar.

**One URL rule** (:func:`server_root`): a declared URL loses a trailing ``/`` and a
trailing ``/v1``; OpenAI paths are ``root + "/v1/…"``, llama-server's own ``root + "/tokenize"``.

**One failure rule** (:meth:`Upstream.recover`, applied by :meth:`Upstream.call` and by the
service's relay): a *broken connection* — refused, reset or closed before the answer was
whole; not a timeout (that is the caller's deadline), never an HTTP error status (that is an
answer) — on a route localllm can re-resolve is retried **exactly once** on a fresh
resolution: a sidecar is given a moment to exit and respawned, a failed service is
forgotten and looked for again (under ``auto`` the upstream's own sidecar answers if it is
gone). An endpoint is never retried. A caller retries only while nothing of the answer has
reached its own caller (a stream already relayed is cut, never replayed).

Thread-safe: resolutions are serialised (one attach lookup, one spawn); :meth:`close` and
:meth:`stop` never wait for a resolution, so they cancel a first-use download instead of
waiting for it.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from localllm.errors import LocalLLMError, ServiceUnavailable, SidecarError

if TYPE_CHECKING:
    from localllm.managed import discovery
    from localllm.managed.server import ManagedServer
    from localllm.managed.spec import ServerSpec

__all__ = [
    "POLICIES",
    "Route",
    "Target",
    "Upstream",
    "attach",
    "broken_connection",
    "cache_root_of",
    "openai_base",
    "server_root",
]

R = TypeVar("R")

#: ``service:`` values of a managed agent or embedder
POLICIES = ("auto", "required", "never")


class Route(str, enum.Enum):
    ENDPOINT = "endpoint"
    SERVICE = "service"
    SIDECAR = "sidecar"


def server_root(url: str) -> str:
    """The one URL rule: ``http://h:p``, ``http://h:p/``, ``http://h:p/v1/`` → ``http://h:p``."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def openai_base(url: str) -> str:
    """The OpenAI base URL (``…/v1``) of a declared URL, by :func:`server_root`."""
    return server_root(url) + "/v1"


def broken_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is a broken connection (retried once): refused, reset or cut mid-answer.

    httpx's connect, read, write and protocol errors, or an ``OSError`` (the service's own
    client); never a timeout, never anything else.
    """
    if isinstance(exc, TimeoutError):
        return False
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return False
    if isinstance(exc, (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)):
        return True
    return isinstance(exc, OSError)


@dataclass(frozen=True, repr=False)
class Target:
    """Where one request goes: a snapshot of the route that :meth:`Upstream.prepare` resolved."""

    route: Route
    #: ``http://host:port`` (no ``/v1``)
    root: str
    #: the model id to send (a service's id for the model); None: the caller's own
    model: str | None = None
    #: the service's token (never shown in a repr)
    token: str | None = None
    #: the sidecar's or the service's pid (None for an endpoint)
    pid: int | None = None

    def url(self, path: str) -> str:
        """``root + path`` (``path`` starts with ``/``: ``/v1/embeddings``, ``/tokenize``)."""
        return self.root + path

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``root/v1``."""
        return self.root + "/v1"

    def headers(self) -> dict[str, str]:
        """The service's bearer token, if any (an endpoint's key is its declaration's business)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __repr__(self) -> str:
        return f"Target(route={self.route.value}, root={self.root!r}, model={self.model!r}, pid={self.pid})"


class _Resolver:
    """A URL callable as a server: asked once, and again after a failure (``LocalEmbedder(base_url=callable)``)."""

    pid: int | None = None
    base_url: str | None = None
    grammar_enforced: bool | None = None

    def __init__(self, resolve: Callable[[], str]) -> None:
        self._resolve = resolve

    def ensure_ready(self) -> str:
        if self.base_url is None:
            self.base_url = self._resolve()
        return self.base_url

    def settle(self, timeout: float = 1.0) -> bool:
        self.base_url = None  # after a failure: asked again
        return True

    def stop(self, grace: float = 2.0) -> int | None:
        return None

    def rss(self) -> int | None:
        return None


class Upstream:
    """One route to a server for a chat agent, an embedder or a service model; see the module docstring.

    Exactly one of ``spec`` (managed: a service per ``policy``, else its own server built from
    the spec), ``endpoint`` (a URL) or ``server`` (a given ManagedServer, or a callable returning
    a URL, re-asked after a failure). ``api_key``: the key the upstream's own server demands
    (a service's upstream key); ``served_alias``: its answers name ``spec.id``.
    """

    def __init__(
        self,
        spec: ServerSpec | None = None,
        *,
        endpoint: str | None = None,
        server: ManagedServer | Callable[[], str] | None = None,
        policy: str = "auto",
        api_key: str | None = None,
        served_alias: bool = False,
        cache_root: Path | None = None,
    ) -> None:
        if sum(x is not None for x in (spec, endpoint, server)) != 1:
            raise ValueError("an Upstream needs exactly one of spec, endpoint or server")
        if policy not in POLICIES:
            raise ValueError(f"service policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.spec = spec
        self.endpoint = endpoint
        #: a service is looked for only for a spec (its model and build are what is compared)
        self.policy = policy if spec is not None else "never"
        self._api_key = api_key
        self._served_alias = served_alias
        self._cache_root = cache_root
        self._server: Any = None
        if server is not None:
            self._server = server if hasattr(server, "ensure_ready") else _Resolver(server)
        self._fixed = Target(Route.ENDPOINT, server_root(endpoint)) if endpoint is not None else None
        # _lock guards _server's creation, _attached and _closed (held only briefly);
        # _resolving serialises resolutions and is never taken by close() or stop()
        self._lock = threading.Lock()
        self._resolving = threading.Lock()
        self._attached: Target | None = None
        self._closed = False

    # ------------------------------------------------------------------ state

    @property
    def managed(self) -> bool:
        return self.endpoint is None

    @property
    def name(self) -> str:
        return self.spec.id if self.spec is not None else (self.endpoint or "upstream")

    @property
    def server(self) -> ManagedServer:
        """The upstream's own server (built from the spec on first access; building does no I/O).

        Raises ``ValueError`` for flags that clash with the managed ones, ``SidecarError``
        once closed.
        """
        with self._lock:
            if self._server is None:
                if self._closed:
                    raise SidecarError(f"server {self.name!r}: closed")
                if self.spec is None:
                    raise SidecarError(f"{self.name}: an endpoint has no server of its own")
                self._server = self.spec.server(api_key=self._api_key, served_alias=self._served_alias)
            server: ManagedServer = self._server
            return server

    @property
    def own_server(self) -> ManagedServer | None:
        """The upstream's own server if it was built, else None (never builds it)."""
        server: ManagedServer | None = self._server
        return server

    @property
    def attached(self) -> Target | None:
        """The service currently used, if any."""
        with self._lock:
            return self._attached

    def current(self) -> Target | None:
        """The route resolved now, without resolving (None: nothing resolved yet)."""
        if self._fixed is not None:
            return self._fixed
        attached = self.attached
        if attached is not None:
            return attached
        server = self._server
        url = server.base_url if server is not None else None
        return Target(Route.SIDECAR, server_root(url), pid=server.pid) if url else None

    # ------------------------------------------------------------------ resolve

    def prepare(self) -> Target:
        """Resolve the route now and return it: attach to a service, or fetch, spawn and
        health-check the own server (respawning a dead one). Cheap once resolved.

        Raises what the resolution raises: ``ServiceUnavailable`` (``service: required`` and
        none), ``FetchError``, ``SidecarError`` (spawn, health, closed), ``ValueError`` (flags).
        """
        if self._fixed is not None:
            return self._fixed
        with self._resolving:
            with self._lock:
                if self._closed:
                    raise SidecarError(f"server {self.name!r}: closed")
                attached = self._attached
            if attached is not None:
                return attached
            if self.policy != "never" and not self._spawned():
                found = self._attach()
                if found is not None:
                    with self._lock:
                        if self._closed:
                            raise SidecarError(f"server {self.name!r}: closed")
                        self._attached = found
                    return found
            server = self.server
            url = server.ensure_ready()
            return Target(Route.SIDECAR, server_root(url), pid=server.pid)

    def _spawned(self) -> bool:
        server = self._server
        return server is not None and server.pid is not None

    def _attach(self) -> Target | None:
        spec = self.spec
        assert spec is not None
        found = attach(
            spec.source,
            policy=self.policy,
            role=spec.role,
            server_bin=spec.server_bin,
            base_dir=spec.base_dir,
            cache_root=self._cache_root,
        )
        if found is None:
            return None
        return Target(Route.SERVICE, server_root(found.url), model=found.model, token=found.token, pid=found.pid)

    def recover(self, target: Target, exc: BaseException) -> Target | None:
        """The one failure rule: after ``exc`` on ``target``, the fresh target to retry on once,
        or None when the failure is final (re-raise it). May raise what :meth:`prepare` raises.
        """
        if not broken_connection(exc) or target.route is Route.ENDPOINT:
            return None
        if target.route is Route.SERVICE:
            with self._lock:
                if self._attached == target:
                    self._attached = None  # looked for again; its successor, or the own server
        else:
            server = self._server
            if server is not None:
                server.settle()  # a killed server closes its sockets before its exit is seen
        with self._lock:
            if self._closed:
                return None
        return self.prepare()

    def call(self, send: Callable[[Target], R], *, reset: Callable[[], None] | None = None) -> tuple[R, Target]:
        """``send(target)`` on the resolved route, retried once by the failure rule.

        ``reset`` runs before the retry (drop pooled connections to the server that failed).
        Returns the answer and the target that gave it; the retry's failure propagates.
        """
        target = self.prepare()
        try:
            return send(target), target
        except Exception as exc:
            fresh = self.recover(target, exc)
            if fresh is None:
                raise
        if reset is not None:
            reset()
        return send(fresh), fresh

    # ------------------------------------------------------------------ the service's Backend

    @property
    def pid(self) -> int | None:
        server = self._server
        return server.pid if server is not None else None

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` of the own server while ready, else None."""
        server = self._server
        url: str | None = server.base_url if server is not None else None
        return url

    @property
    def grammar_enforced(self) -> bool | None:
        server = self._server
        verdict: bool | None = server.grammar_enforced if server is not None else None
        return verdict

    def rss(self) -> int | None:
        server = self._server
        size: int | None = server.rss() if server is not None else None
        return size

    def stop(self, grace: float = 2.0) -> int | None:
        """Stop the own server (a first-use download is cancelled); the upstream stays usable."""
        server = self._server
        code: int | None = server.stop(grace) if server is not None else None
        return code

    def close(self) -> None:
        """Stop the own server and refuse every later resolution. Idempotent."""
        with self._lock:
            self._closed = True
            self._attached = None
        self.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"Upstream(name={self.name!r}, route={(self.current() or Target(Route.SIDECAR, '')).route.value})"


# ---------------------------------------------------------------------- attach


def cache_root_of(cache_root: Path | None) -> Path:
    """``cache_root``, or the configured cache directory."""
    from localllm import settings

    return Path(cache_root) if cache_root is not None else settings.cache_dir()


def attach(
    model: str,
    *,
    policy: str = "auto",
    role: str = "chat",
    server_bin: str | None = None,
    base_dir: Path | None = None,
    cache_root: Path | None = None,
) -> discovery.Attachment | None:
    """The running service to use for ``model`` (a pinned id or a GGUF path) as ``role``, or None.

    Cheap when no service runs (one failed file read). The server build is compared by
    the sha256 of the llama-server binary this process would run, the model by its sha256
    (the pin's, or the file's).
    """
    from localllm.managed import discovery

    if policy == "never":
        return None
    root = cache_root_of(cache_root)
    found = None if discovery.read_discovery(root) is None else _match(model, role, server_bin, base_dir, root)
    if found is None and policy == "required":
        raise ServiceUnavailable(
            f"service: required, but no localllm service for cache {root} serves {model!r} on this server build",
            hint="start one with `localllm serve` (same LOCALLLM_CACHE_DIR), or set service: auto",
        )
    return found


def _match(
    model: str, role: str, server_bin: str | None, base_dir: Path | None, root: Path
) -> discovery.Attachment | None:
    from localllm.managed import discovery
    from localllm.managed.acquire import resolve_server_binary

    try:
        build = discovery.file_sha256(resolve_server_binary(server_bin))
        model_sha = model_sha256(model, base_dir)
    except (LocalLLMError, OSError):
        return None  # this process could not run the model itself either; its own path reports why
    return discovery.discover(root, build, model_sha, role)


def model_sha256(model: str, base_dir: Path | None) -> str:
    """The sha256 of a model's weights: the pin's for a model id, the file's (memoised by
    path, size and mtime) for a ``*.gguf`` path relative to ``base_dir``. Raises ``OSError``
    or :class:`~localllm.errors.LocalLLMError` when neither is known."""
    from localllm.managed import discovery

    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return discovery.file_sha256(path)
    from localllm.managed.pins import load_pins

    return load_pins().model(model).artifact.require_sha256()
