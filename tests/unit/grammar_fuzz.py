"""Seeded schema mutations for the grammar fuzz test: values from the corpora, bent out of shape."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

_ODD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    10**30,
    "",
    "x",
    "#",
    "#/nope",
    "^(",
    "[",
    "\\",
    [],
    {},
    [None],
    {"a": None},
    {"type": "kaboom"},
    {"required": "a"},
    {"$ref": "#"},
    {"$ref": "#/$defs/x"},
    float("1e308"),
    "^.*$",
    {"enum": []},
    {"anyOf": []},
    {"items": [True, False]},
    ["string", 3],
    {"minimum": None},
]
_KEYS = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "patternProperties",
    "propertyNames",
    "if",
    "then",
    "else",
    "contains",
    "dependentRequired",
    "minProperties",
    "$schema",
    "$id",
]


def _nodes(value: Any, out: list[Any]) -> None:
    if isinstance(value, (dict, list)):
        out.append(value)
        for v in value.values() if isinstance(value, dict) else value:
            _nodes(v, out)


def mutate(schema: Any, rng: random.Random, pool: list[Any]) -> Any:
    """One to four random edits: replace, delete or add a key, splice in another schema's piece."""
    doc = copy.deepcopy(schema)
    for _ in range(rng.randint(1, 4)):
        nodes: list[Any] = []
        _nodes(doc, nodes)
        if not nodes:
            return rng.choice(_ODD)
        node = rng.choice(nodes)
        choice = rng.random()
        replacement = copy.deepcopy(rng.choice(pool)) if rng.random() < 0.4 else copy.deepcopy(rng.choice(_ODD))
        if isinstance(node, dict):
            if node and choice < 0.3:
                del node[rng.choice(list(node))]
            elif node and choice < 0.65:
                node[rng.choice(list(node))] = replacement
            else:
                node[rng.choice(_KEYS)] = replacement
        elif node and choice < 0.5:
            node[rng.randrange(len(node))] = replacement
        else:
            node.append(replacement)
    return doc


def mutations(seeds: list[Any], n: int, seed: int = 13) -> Iterator[Any]:
    rng = random.Random(seed)
    pool: list[Any] = []
    for s in seeds:
        _nodes(s, pool)
    pool = [p for p in pool if isinstance(p, dict)][:5000]
    for i in range(n):
        if i % 500 == 0:
            deep: Any = {"type": "integer"}
            for _ in range(rng.randint(60, 450)):
                deep = {"type": "array", "items": deep} if rng.random() < 0.8 else {"anyOf": [deep]}
            yield deep
            continue
        yield mutate(rng.choice(seeds), rng, pool)
