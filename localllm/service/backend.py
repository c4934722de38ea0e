"""The one thing the service needs from a model's llama-server, and how it is built.

:class:`Backend` is deliberately narrow — ``prepare()`` (fetch → verify → spawn → health,
or respawn) returning the :class:`~localllm.managed.upstream.Target`, ``recover()`` (the
one failure rule), ``stop()``, ``pid``, ``base_url``, ``rss()`` — so the pool never depends
on how a server is resolved or spawned. An :class:`~localllm.managed.upstream.Upstream` is
one: :func:`managed_upstream` builds it for a catalog entry, the same seam a managed agent
or embedder holds (with policy ``never``: a service never attaches to itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from localllm.managed.upstream import Target, Upstream
    from localllm.service.catalog import ModelSpec

__all__ = ["Backend", "BackendFactory", "managed_upstream"]


class Backend(Protocol):
    """A managed llama-server for one model."""

    @property
    def pid(self) -> int | None: ...

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` while ready, else None."""
        ...

    def prepare(self) -> Target:
        """Fetch, verify, spawn and wait for health if needed (respawn a dead one); the target."""
        ...

    def recover(self, target: Target, exc: BaseException) -> Target | None:
        """After ``exc`` on ``target``: the fresh target to retry once on, or None (final)."""
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


def managed_upstream(spec: ModelSpec, api_key: str) -> Upstream:
    """The upstream of a catalog entry: its own server, answers naming the served id (nothing
    fetched or spawned yet; ``ValueError`` for flags that clash with the managed ones)."""
    from localllm.managed.upstream import Upstream

    upstream = Upstream(spec, policy="never", api_key=api_key, served_alias=True)
    upstream.server  # noqa: B018 - built now: a clashing flag is the load's error, before any I/O
    return upstream
