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


def test_threads_asking_for_the_same_result_while_it_is_made_wait_for_it() -> None:
    # a client sends its schema with every request, several at once on its first use: the
    # schema is compiled once, not once per request side by side (six 5 s compiles of one
    # schema took 52 s together, the GIL shared between them)
    kept: Kept[list[int]] = Kept(8, 100)
    inside, release = threading.Event(), threading.Event()
    made: list[int] = []
    got: list[list[int]] = []

    def make() -> list[int]:
        made.append(1)
        inside.set()
        release.wait(5)
        return [1, 2]

    first = threading.Thread(target=lambda: got.append(kept.get("k", make, len)))
    first.start()
    assert inside.wait(5)
    others = [threading.Thread(target=lambda: got.append(kept.get("k", make, len))) for _ in range(3)]
    for t in others:
        t.start()
    release.set()
    for t in (first, *others):
        t.join(5)
    assert made == [1] and len(got) == 4 and all(g is got[0] for g in got) and (len(kept), kept.held) == (1, 2)


def test_a_failed_make_fails_its_waiters_and_keeps_nothing() -> None:
    kept: Kept[str] = Kept(8, 100)
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def make() -> str:
        inside.set()
        release.wait(5)
        raise RecursionError("too deep")

    def get() -> None:
        try:
            kept.get("k", make, len)
        except RecursionError as exc:
            errors.append(exc)

    first = threading.Thread(target=get)
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=get)
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert len(errors) == 2 and len(kept) == 0
    assert kept.get("k", lambda: "made again", len) == "made again"


def test_a_make_asking_for_its_own_key_makes_it_again_instead_of_waiting_for_itself() -> None:
    kept: Kept[str] = Kept(8, 100)
    depth: list[int] = []

    def make() -> str:
        depth.append(1)
        return "inner" if len(depth) > 1 else kept.get("k", make, len) + "+outer"

    assert kept.get("k", make, len) == "inner+outer" and len(depth) == 2
