"""The one thing the service needs from a managed llama-server, and its implementation.

:class:`Backend` is deliberately narrow — start (fetch → verify → spawn → health, or
respawn) returning the base URL, stop, state, pid, RSS — so the pool never depends on how a
server is resolved or spawned. :class:`SidecarBackend` implements it with the managed
artifacts and :class:`~localllm.managed.sidecar.Sidecar`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from localllm.managed.sidecar import Sidecar
    from localllm.service.catalog import ModelSpec

__all__ = ["Backend", "BackendFactory", "SidecarBackend"]


class Backend(Protocol):
    """A managed llama-server for one model."""

    @property
    def pid(self) -> int | None: ...

    @property
    def state(self) -> str: ...

    @property
    def url(self) -> str | None:
        """``http://127.0.0.1:PORT`` while ready, else None."""
        ...

    def start(self) -> str:
        """Fetch, verify, spawn and wait for health if needed (respawn a dead one); the base URL."""
        ...

    def stop(self) -> None: ...

    def rss(self) -> int | None:
        """Resident memory of the server process in bytes (None when not running)."""
        ...


#: builds the backend of a model; the second argument is the key the server must demand
BackendFactory = Callable[["ModelSpec", str], Backend]


class SidecarBackend:
    """:class:`Backend` over a :class:`Sidecar`; artifacts are resolved on the first start."""

    def __init__(self, spec: ModelSpec, api_key: str) -> None:
        self.spec = spec
        self._api_key = api_key
        self._sidecar: Sidecar | None = None

    @property
    def pid(self) -> int | None:
        return self._sidecar.pid if self._sidecar is not None and self._sidecar.is_alive() else None

    @property
    def state(self) -> str:
        return self._sidecar.state.value if self._sidecar is not None else "created"

    @property
    def url(self) -> str | None:
        return self._sidecar.base_url if self._sidecar is not None else None

    def start(self) -> str:
        if self._sidecar is None:
            from localllm.managed import Sidecar, resolve_model, resolve_server_binary

            spec = self.spec
            binary = resolve_server_binary(spec.server_bin)
            model = resolve_model(spec.source, base_dir=spec.base_dir)
            self._sidecar = Sidecar(
                binary, model, args=spec.args, parallel=spec.parallel, ctx_per_slot=spec.ctx_per_slot,
                threads=spec.threads, health_timeout=spec.health_timeout, name=spec.id, api_key=self._api_key,
            )
        return self._sidecar.ensure_ready()

    def stop(self) -> None:
        if self._sidecar is not None:
            self._sidecar.stop()

    def rss(self) -> int | None:
        pid = self.pid
        if pid is None:
            return None
        import psutil

        try:
            rss: int = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return None
        return rss
