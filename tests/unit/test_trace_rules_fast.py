"""``rules.check_value``'s fast walk must judge exactly as the exact walk (``rules._check``).

Every value here goes through both: the same copy back (types included), or the same
rejection naming the same field path. The fast walk only exists for speed (trace appends).
"""

from __future__ import annotations

import math
import random
import unicodedata
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import pytest

from localllm.errors import TraceWriteRejected
from localllm.trace import rules


class Text(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


def _cycle() -> dict[str, Any]:
    d: dict[str, Any] = {"a": 1}
    d["self"] = d
    return d


def _list_cycle() -> list[Any]:
    items: list[Any] = [1]
    items.append({"back": items})
    return items


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


CASES: list[tuple[str, Any]] = [
    ("plain", {"a": 1, "b": "x", "c": [1, 2.5, None, True, False], "d": {"e": {"f": "g"}}}),
    ("empty", {}),
    ("tuple becomes list", {"t": (1, "a", (2, 3))}),
    ("top-level tuple", (1, 2)),
    ("top-level scalar", "text"),
    ("unicode NFC", {"name": "café", "jp": "日本語", "emoji": "🙂"}),
    ("NUL value", {"a": "x\x00y"}),
    ("NUL key", {"a\x00": 1}),
    ("CRLF value", {"a": "one\r\ntwo"}),
    ("CRLF key", {"x\r\ny": 1}),
    ("CR then LF across two strings", {"a": "ends with CR\r", "b": "\nstarts with LF"}),
    ("CR then LF across key and value", {"k\r": "\nv"}),
    ("lone CR", {"a": "x\ry"}),
    ("not NFC value", {"a": "cafe\u0301"}),
    ("not NFC key", {"cafe\u0301": 1}),
    ("not NFC in a list", {"a": ["ok", "e\u0301"]}),
    ("NFC only per string", {"a": "e", "b": "\u0301"}),
    ("combining mark after an escape", {"a": "\n\u0303"}),
    ("lone surrogate", {"a": "x\ud800"}),
    ("lone surrogate key", {"\udfff": 1}),
    ("int64 max", {"a": 2**63 - 1, "b": 2**64 - 1, "c": -(2**63)}),
    ("int too big", {"a": 2**64}),
    ("int too small", {"a": -(2**63) - 1}),
    ("int too big in a list", {"a": [1, 2**70]}),
    ("NaN", {"a": float("nan")}),
    ("Infinity", {"a": [float("inf")]}),
    ("-Infinity", {"a": float("-inf")}),
    ("float -0.0", {"a": -0.0, "b": 1e308}),
    ("bool is not int", {"a": True, "b": [False]}),
    ("int key", {1: "a"}),
    ("bool key", {True: "a"}),
    ("None key", {None: "a"}),
    ("set value", {"a": {1, 2}}),
    ("bytes value", {"a": b"x"}),
    ("object value", {"a": object()}),
    ("str subclass", {"a": Text("x"), Text("k"): 1}),
    ("int subclass", {"a": Count(3), "b": [Count(4)]}),
    ("float subclass", {"a": Ratio(0.5)}),
    ("OrderedDict", {"a": OrderedDict([("z", 1), ("y", 2)])}),
    ("mapping proxy", {"a": MappingProxyType({"q": 1})}),
    ("cycle", _cycle()),
    ("list cycle", {"a": _list_cycle()}),
    ("depth at the limit", _nested(rules.MAX_DEPTH)),
    ("depth over the limit", _nested(rules.MAX_DEPTH + 1)),
    ("shared (not a cycle)", {"a": (shared := {"x": 1}), "b": shared}),
    ("odd key path", {"a.b": {"c d": "x\x00"}}),
    ("list index path", {"a": [1, {"b": [0, "x\r\n"]}]}),
]


def _judge(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(value)
    except TraceWriteRejected as exc:
        return "rejected", str(exc)


def _exact(value: Any) -> Any:
    return rules._check(value, "payload", 0, set())


def _typed(value: Any) -> Any:
    """A structure's shape with every node's exact type (so a kept subclass is visible)."""
    if isinstance(value, dict):
        return (type(value), [(type(k), k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return (list, [_typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return (type(value), "nan")
    return (type(value), value)


@pytest.mark.parametrize(("name", "value"), CASES, ids=[c[0] for c in CASES])
def test_fast_walk_judges_as_the_exact_walk(name: str, value: Any) -> None:
    fast = _judge(lambda v: rules.check_value(v, "payload"), value)
    exact = _judge(_exact, value)
    assert fast[0] == exact[0], name
    if fast[0] == "ok":
        assert _typed(fast[1]) == _typed(exact[1])
    else:
        assert fast[1] == exact[1]


def test_copy_is_private() -> None:
    inner = {"b": [1, 2]}
    payload = {"a": inner}
    copy = rules.check_value(payload, "payload")
    assert copy == payload
    assert copy is not payload and copy["a"] is not inner and copy["a"]["b"] is not inner["b"]
    inner["b"].append(3)
    assert copy["a"]["b"] == [1, 2]


ALPHABET = [
    "a",
    "Z",
    "_",
    " ",
    "\r",
    "\n",
    "\x00",
    "\x01",
    "é",
    "e",
    "\u0301",
    "\u0327",
    "日",
    "\ud800",
    "🙂",
    "\\",
    '"',
]


def _random_value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(10 if depth < 4 else 6)
    if pick == 0:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(4)))
    if pick == 1:
        return rng.choice([0, -1, 2**63 - 1, 2**64 - 1, 2**64, -(2**63) - 1, 7])
    if pick == 2:
        return rng.choice([0.5, -0.0, float("nan"), float("inf"), 1e300])
    if pick == 3:
        return rng.choice([None, True, False])
    if pick == 4:
        return rng.choice([Text("t"), Count(1), b"b"])
    if pick == 5:
        return "plain"
    if pick in (6, 7):
        return {
            rng.choice(["k", "é", "e\u0301", "a\x00", "x\r\n", "n"]) + str(i): _random_value(rng, depth + 1)
            for i in range(rng.randrange(4))
        }
    if pick == 8:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(3)))


def test_random_payloads_judged_alike() -> None:
    rng = random.Random(20261201)
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(3000):
        value = {"p": _random_value(rng, 0)}
        fast = _judge(lambda v: rules.check_value(v, "payload"), value)
        exact = _judge(_exact, value)
        assert fast[0] == exact[0], value
        if fast[0] == "ok":
            assert _typed(fast[1]) == _typed(exact[1]), value
        else:
            assert fast[1] == exact[1], value
        outcomes[fast[0]] += 1
    # both branches were exercised, many times
    assert outcomes["ok"] > 300 and outcomes["rejected"] > 300, outcomes


def test_nfc_of_the_joined_strings_is_per_string() -> None:
    # every pair of the alphabet's marks and letters, split between two strings or not
    marks = ["e", "\u0301", "\u0327", "A", "\u030a", "\u1100", "\u1161", "n", "\u0303", "=", "\u0338"]
    for a in marks:
        for b in marks:
            together = {"v": a + b}
            apart = {"v": a, "w": b}
            for value in (together, apart):
                want = all(unicodedata.is_normalized("NFC", s) for s in value.values())
                assert (_judge(lambda v: rules.check_value(v, "payload"), value)[0] == "ok") is want, value
