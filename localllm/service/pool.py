"""The loaded models of a service: load on demand, share, keep alive, evict.

Rules, all under one condition variable (never held across a spawn, a stop or network I/O):

* one entry per model id; the first request for a model creates it (LOADING) and starts
  the server, every later request for it waits on that load — bounded by ``wait`` — and
  never starts a second copy;
* before a load, if ``max_models`` entries exist (loading, loaded or still stopping) or the
  memory budget would be exceeded, the least recently used *idle* model is unloaded first;
  when every loaded model is busy the request waits for one to become idle (bounded);
* a model idle for ``keep_alive`` seconds is unloaded by the reaper thread
  (``keep_alive < 0``: never; ``0``: right after its last request).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localllm.errors import LocalLLMError, ServiceError
from localllm.service.backend import Backend, BackendFactory
from localllm.service.catalog import ModelSpec

if TYPE_CHECKING:
    from localllm.managed.upstream import Target

__all__ = ["Held", "Lease", "LoadedModel", "ModelPool", "PoolBusy", "UnknownServedModel"]


class UnknownServedModel(ServiceError, LookupError):
    """The request names a model this service does not serve."""


class PoolBusy(ServiceError, TimeoutError):
    """No room for the model within the wait (every loaded model stayed busy)."""


class EntryState(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"  # out of the table, its server not yet exited: still shown by ``ps``


@dataclass
class _Entry:
    spec: ModelSpec
    backend: Backend
    state: EntryState = EntryState.LOADING
    loaded: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    busy: int = 0
    served: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.monotonic)
    #: a request's ``keep_alive`` (Ollama's semantics) overrides the pool's until the next one
    keep_alive: float | None = None


@dataclass(frozen=True)
class LoadedModel:
    """One row of ``localllm ps``."""

    id: str
    role: str
    state: str
    pid: int | None
    port: int | None
    busy: int
    slots: int
    served: int
    idle_s: float
    rss: int | None
    loaded_s: float
    grammar_enforced: bool | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "role": self.role,
            "state": self.state,
            "pid": self.pid,
            "port": self.port,
            "slots_busy": self.busy,
            "slots_total": self.slots,
            "requests_served": self.served,
            "idle_s": round(self.idle_s, 3),
            "rss_bytes": self.rss,
            "loaded_s": round(self.loaded_s, 3),
            "grammar_enforced": self.grammar_enforced,
        }


@dataclass(frozen=True)
class Lease:
    """A model held for one request: its upstream target; released by the context manager."""

    model: str
    target: Target
    grammar_enforced: bool | None = None  # the server's grammar canary (chat servers)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the model's server."""
        return self.target.root


@dataclass(frozen=True)
class Held:
    """What :meth:`ModelPool.acquire` hands out and :meth:`ModelPool.release` takes back."""

    lease: Lease
    entry: _Entry


class ModelPool:
    """Loaded llama-servers keyed by model id; see the module docstring for the rules."""

    def __init__(
        self,
        catalog: Mapping[str, ModelSpec],
        factory: BackendFactory,
        *,
        api_key: str,
        keep_alive: float = 300.0,
        max_models: int | None = None,
        memory_budget: int | None = None,
        estimate: Callable[[ModelSpec], int] | None = None,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        if max_models is not None and max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models}")
        self.catalog = dict(catalog)
        self.keep_alive = keep_alive
        self.max_models = max_models
        self.memory_budget = memory_budget
        self._factory = factory
        self._api_key = api_key
        self._estimate = estimate or (lambda spec: spec.size or 0)
        self._on_event = on_event or (lambda kind, model: None)
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        # servers being stopped: they still hold their memory and a "slot", and ``ps`` shows them
        self._stopping: list[_Entry] = []
        self._closed = False
        self._reaper: threading.Thread | None = None

    # ------------------------------------------------------------------ requests

    @contextmanager
    def lease(self, model: str, *, wait: float = 300.0) -> Iterator[Lease]:
        """Hold ``model`` (loading it if needed) for the duration of one request."""
        entry, target = self._acquire(model, wait)
        try:
            yield Lease(model=model, target=target, grammar_enforced=entry.backend.grammar_enforced)
        finally:
            self._release(entry)

    def acquire(self, model: str, wait: float = 300.0) -> Held:
        """Hold ``model`` (loading it if needed) until :meth:`release` — for callers that cannot
        use :meth:`lease` (an event loop holds the model across awaits)."""
        entry, target = self._acquire(model, wait)
        return Held(Lease(model=model, target=target, grammar_enforced=entry.backend.grammar_enforced), entry)

    def release(self, held: Held, ended: float | None = None) -> None:
        """Give ``held`` back; ``ended``: when its request ended (``time.monotonic``), for a
        release run later on another thread (the least recently used model is evicted first:
        by when its requests ended, not by when their releases ran, in either order)."""
        self._release(held.entry, ended=ended)

    def keep(self, model: str, seconds: float) -> None:
        """A request's ``keep_alive``: unload ``model`` after ``seconds`` idle from now on
        (``0``: right after its requests finish; negative: never)."""
        with self._cond:
            entry = self._entries.get(model)
            if entry is not None:
                entry.keep_alive = seconds
            self._cond.notify_all()

    def _keep_alive(self, entry: _Entry) -> float:
        return self.keep_alive if entry.keep_alive is None else entry.keep_alive

    def _acquire(self, model: str, wait: float) -> tuple[_Entry, Target]:
        spec = self.catalog.get(model)
        if spec is None:
            known = ", ".join(self.catalog) or "none"
            raise UnknownServedModel(f"model {model!r} is not served here", hint=f"served models: {known}")
        deadline = time.monotonic() + wait
        loader = False
        while True:
            victim: _Entry | None = None
            with self._cond:
                if self._closed:
                    raise ServiceError("the service is shutting down")
                entry = self._entries.get(model)
                if entry is not None:
                    entry.busy += 1
                    break
                room, victim = self._room_for(spec)
                if room:
                    try:
                        backend = self._factory(spec, self._api_key)  # builds, does no I/O
                    except ValueError as exc:  # flags that clash with the server's own
                        raise ServiceError(f"model {model!r} cannot be served: {exc}") from exc
                    entry = _Entry(spec=spec, backend=backend, busy=1)
                    self._entries[model] = entry
                    loader = True
                    break
                if victim is not None:
                    self._retire(victim)
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PoolBusy(
                            f"no room to load {model!r}: every loaded model stayed busy for {wait:g} s",
                            hint="raise --max-models or --memory-budget, or retry later",
                        )
                    self._cond.wait(remaining)
            if victim is not None:
                self._stop_entry(victim, "evict")  # outside the lock; then look again
        try:
            if loader:
                return entry, self._load(entry)
            if not entry.loaded.wait(max(deadline - time.monotonic(), 0.0)):
                raise PoolBusy(f"{model!r} is still loading after {wait:g} s", hint="retry later")
            if entry.error is not None:
                raise entry.error
            return entry, entry.backend.prepare()  # cheap when alive; respawns a crashed server
        except BaseException:
            self._release(entry, served=False)
            raise

    def _load(self, entry: _Entry) -> Target:
        try:
            target = entry.backend.prepare()
        except BaseException as exc:
            failed = exc if isinstance(exc, LocalLLMError) else ServiceError(f"loading {entry.spec.id} failed: {exc}")
            entry.error = failed
            with self._cond:
                if self._entries.get(entry.spec.id) is entry:
                    del self._entries[entry.spec.id]
                self._cond.notify_all()
            entry.loaded.set()
            entry.backend.stop()
            raise
        with self._cond:
            if entry.state is EntryState.LOADING:  # not unloaded while it loaded
                entry.state = EntryState.READY
            entry.loaded_at = time.monotonic()
            self._cond.notify_all()
        entry.loaded.set()
        self._on_event("load", entry.spec.id)
        return target

    def _release(self, entry: _Entry, *, served: bool = True, ended: float | None = None) -> None:
        stop = False
        with self._cond:
            entry.busy -= 1
            if served:
                entry.served += 1
            entry.last_used = max(entry.last_used, time.monotonic() if ended is None else ended)
            if self._keep_alive(entry) == 0 and entry.busy == 0 and self._entries.get(entry.spec.id) is entry:
                self._retire(entry)
                stop = True
            self._cond.notify_all()
        if stop:
            self._stop_entry(entry, "idle")

    # ------------------------------------------------------------------ room

    def _room_for(self, spec: ModelSpec) -> tuple[bool, _Entry | None]:
        """(room to load ``spec`` now, else the least recently used idle entry to evict first)."""
        count = len(self._entries) + len(self._stopping)
        over = self.max_models is not None and count >= self.max_models
        if not over and self.memory_budget is not None and self._entries:
            # a model bigger than the whole budget still loads when nothing else is loaded
            used = sum(self._footprint(e) for e in self._entries.values())
            over = used + self._estimate(spec) > self.memory_budget
        if not over:
            return True, None
        idle = [e for e in self._entries.values() if e.busy == 0 and e.state is EntryState.READY]
        return False, (min(idle, key=lambda e: e.last_used) if idle else None)

    def _footprint(self, entry: _Entry) -> int:
        rss = entry.backend.rss() if entry.state is EntryState.READY else None
        return rss if rss else self._estimate(entry.spec)

    def _retire(self, entry: _Entry) -> None:
        """Take ``entry`` out of the table into the stopping list (under the lock); the caller
        then stops it with :meth:`_stop_entry` outside the lock."""
        del self._entries[entry.spec.id]
        entry.state = EntryState.STOPPING
        self._stopping.append(entry)

    def _stop_entry(self, entry: _Entry, reason: str) -> None:
        try:
            entry.backend.stop()
        finally:
            with self._cond:
                self._stopping.remove(entry)
                self._cond.notify_all()
            self._on_event(f"unload:{reason}", entry.spec.id)

    # ------------------------------------------------------------------ operate

    def unload(self, model: str) -> bool:
        """Stop ``model`` now (requests in flight on it fail); False when it was not loaded."""
        with self._cond:
            entry = self._entries.get(model)
            if entry is None:
                return False
            self._retire(entry)
        self._stop_entry(entry, "stop")  # a load in progress is aborted by the stop
        return True

    def loaded(self) -> list[LoadedModel]:
        now = time.monotonic()
        with self._cond:
            entries = [*self._entries.values(), *self._stopping]
        rows = []
        for e in entries:
            url = e.backend.base_url if e.state is EntryState.READY else None
            port = int(url.rsplit(":", 1)[-1]) if url else None
            rows.append(
                LoadedModel(
                    id=e.spec.id,
                    role=e.spec.role,
                    state=e.state.value,
                    pid=e.backend.pid,
                    port=port,
                    busy=e.busy,
                    slots=e.spec.parallel,
                    served=e.served,
                    idle_s=0.0 if e.busy else now - e.last_used,
                    rss=e.backend.rss(),
                    loaded_s=now - e.loaded_at,
                    grammar_enforced=e.backend.grammar_enforced,
                )
            )
        return sorted(rows, key=lambda r: r.id)

    def is_loaded(self, model: str) -> bool:
        with self._cond:
            entry = self._entries.get(model)
            return entry is not None and entry.state is EntryState.READY

    def start_reaper(self) -> None:
        """Unload idle models after their keep-alive (requests may set one per model)."""
        if self._reaper is not None:
            return
        self._reaper = threading.Thread(target=self._reap_loop, name="localllm-keepalive", daemon=True)
        self._reaper.start()

    def _reap_loop(self) -> None:
        interval = min(max(self.keep_alive / 4, 0.05), 1.0) if self.keep_alive > 0 else 1.0
        while True:
            expired: list[_Entry] = []
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                for e in list(self._entries.values()):
                    keep = self._keep_alive(e)
                    if e.state is EntryState.READY and e.busy == 0 and keep >= 0 and now - e.last_used >= keep:
                        self._retire(e)
                        expired.append(e)
            for e in expired:
                self._stop_entry(e, "idle")
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(interval)

    def close(self) -> None:
        """Stop every server (loads in progress are stopped when they finish); idempotent."""
        with self._cond:
            self._closed = True
            entries = list(self._entries.values())
            for e in entries:
                self._retire(e)
            self._cond.notify_all()
        for e in entries:
            self._stop_entry(e, "shutdown")
        if self._reaper is not None:
            self._reaper.join(5.0)
