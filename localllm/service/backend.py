"""The one thing the service needs from a managed llama-server, and how it is built.

:class:`Backend` is deliberately narrow — ``ensure_ready()`` (fetch → verify → spawn →
health, or respawn) returning the base URL, ``stop()``, ``pid``, ``base_url``, ``rss()`` —
so the pool never depends on how a server is resolved or spawned.
:class:`~localllm.managed.server.ManagedServer` is one; :func:`managed_server` builds it
for a catalog entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from localllm.managed.server import ManagedServer
    from localllm.service.catalog import ModelSpec

__all__ = ["Backend", "BackendFactory", "managed_server"]


class Backend(Protocol):
    """A managed llama-server for one model."""

    @property
    def pid(self) -> int | None: ...

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` while ready, else None."""
        ...

    def ensure_ready(self) -> str:
        """Fetch, verify, spawn and wait for health if needed (respawn a dead one); the base URL."""
        ...

    def stop(self, grace: float = 2.0) -> int | None: ...

    def rss(self) -> int | None:
        """Resident memory of the server process in bytes (None when not running)."""
        ...

    @property
    def grammar_enforced(self) -> bool | None:
        """Whether the server passed the grammar canary at its last start (None: unknown)."""
        ...


#: builds the backend of a model; the second argument is the key the server must demand
BackendFactory = Callable[["ModelSpec", str], Backend]


def managed_server(spec: ModelSpec, api_key: str) -> ManagedServer:
    """The ManagedServer of a catalog entry (nothing fetched or spawned yet)."""
    from localllm.managed.server import ManagedServer

    # answers name the served id (llama-server would say the GGUF's absolute path)
    alias = () if {"-a", "--alias"} & {a.partition("=")[0] for a in spec.args} else ("--alias", spec.id)
    return ManagedServer(
        spec.server_bin,
        spec.source,
        role=spec.role,
        base_dir=spec.base_dir,
        args=(*spec.args, *alias),
        parallel=spec.parallel,
        ctx_per_slot=spec.ctx_per_slot,
        threads=spec.threads,
        health_timeout=spec.health_timeout,
        name=spec.id,
        api_key=api_key,
    )
