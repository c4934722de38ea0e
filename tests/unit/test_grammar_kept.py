"""Kept: the latest results of the grammar package's costly steps, within a count and a size."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from localllm.grammar.kept import Kept


def _getter(kept: Kept[str], made: list[Any], value: Callable[[Any], str]) -> Callable[[Any], str]:
    """``kept.get`` of a key, its value ``value(key)``, each key made noted in ``made``."""

    def get(key: Any) -> str:
        def make() -> str:
            made.append(key)
            return value(key)

        return kept.get(key, make, len)

    return get


def test_a_kept_result_is_made_once_and_the_oldest_goes_past_the_count() -> None:
    made: list[str] = []
    kept: Kept[str] = Kept(3, 1_000)
    get = _getter(kept, made, str.upper)

    assert [get(k) for k in "abcab"] == ["A", "B", "C", "A", "B"] and made == ["a", "b", "c"]
    get("d")  # four: the least recently used (c) goes
    assert (get("a"), get("c")) == ("A", "C") and made == ["a", "b", "c", "d", "c"]
    assert len(kept) == 3 and kept.held == 3


def test_kept_results_stay_within_their_characters() -> None:
    made: list[int] = []
    kept: Kept[str] = Kept(64, 10)
    get = _getter(kept, made, lambda n: "x" * n)

    get(4), get(4), get(5)
    assert made == [4, 5] and (len(kept), kept.held) == (2, 9)
    get(3)  # 12 characters: the oldest (4) goes
    assert (len(kept), kept.held) == (2, 8)
    assert get(11) == "x" * 11 and get(11) == "x" * 11 and made == [4, 5, 3, 11, 11]  # larger than all: not kept
    assert (len(kept), kept.held) == (2, 8)
    kept.clear()
    assert (len(kept), kept.held) == (0, 0)


def test_threads_making_the_same_result_keep_it_once() -> None:
    kept: Kept[list[int]] = Kept(8, 100)
    both = threading.Barrier(2)
    got: list[list[int]] = []

    def make() -> list[int]:
        both.wait(5)  # both threads are inside make before either keeps its result
        return [1, 2]

    threads = [threading.Thread(target=lambda: got.append(kept.get("k", make, len))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[1, 2], [1, 2]] and (len(kept), kept.held) == (1, 2)
