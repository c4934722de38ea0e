"""The latest results of the grammar package's costly steps, kept by the schema's text.

A service client sends the same ``response_format`` and tools with every request; checking,
compiling and relaxing a large schema takes seconds. :class:`Kept` keeps the latest results
within a count and a size in characters (a hostile client sending ever new large schemas
holds at most that much), thread-safe: the service prepares requests on worker threads, and
a client's first requests often come several at once with one new schema: it is compiled
once while they wait, not once per request side by side.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    """At most ``count`` results and ``chars`` characters of them in all (an entry's size is
    its ``size``: its key's text and what it holds); an entry larger than that alone is not
    kept. A thread asking for a result another thread is making waits for that one (and gets
    its exception if it fails; nothing is kept then). A ``make`` may ask another Kept, one
    that never asks back (relaxing compiles, compiling checks schemas: never the reverse)."""

    def __init__(self, count: int, chars: int) -> None:
        self.count, self.chars = count, chars
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        #: key → (the thread making it, its result to be)
        self._making: dict[Hashable, tuple[int, Future[V]]] = {}

    def get(self, key: Hashable, make: Callable[[], V], size: Callable[[V], int]) -> V:
        me = threading.get_ident()
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][0]
            maker, result = self._making.get(key, (None, None))
            if result is None:
                result = Future()
                self._making[key] = (me, result)
        if maker == me:  # make() asks for its own key: waiting would be waiting for itself
            return make()
        if maker is not None:
            return result.result()
        try:
            value = make()
        except BaseException as exc:
            with self._lock:
                del self._making[key]
            result.set_exception(exc)
            raise
        chars = size(value)
        with self._lock:
            del self._making[key]
            if chars <= self.chars:  # no other thread kept it: they waited for this one
                self._entries[key] = (value, chars)
                self._held += chars
            while len(self._entries) > self.count or self._held > self.chars:
                self._held -= self._entries.popitem(last=False)[1][1]
        result.set_result(value)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        """The characters the kept entries count for."""
        return self._held

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0
