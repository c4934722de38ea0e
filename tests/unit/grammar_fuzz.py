"""Seeded schemas for the grammar fuzz tests: corpus values bent out of shape; random structural schemas."""

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


_PATTERNS = ["^a+$", "b", "^[a-z]{2,5}$", "x|y", "^\\d{3}-\\d{2}$", "^(ab)*c?$", "[A-Z]", "^.{3}$", "^[^a]*$", "\\s"]


def structural(seed: int) -> dict[str, Any]:
    """A random valid 2020-12 schema of 2–14 ``$defs``, each naming only earlier ones (refs,
    applicators, objects with dependencies and ``unevaluatedProperties``, arrays with
    ``contains`` and ``uniqueItems``, every kind's bounds, formats and patterns): the shapes
    whose compiling takes branches that fail, merges refs twice and keeps rules across them."""
    rng = random.Random(seed)
    n = rng.randint(2, 14)
    defs: dict[str, Any] = {}

    def number() -> dict[str, Any]:
        node: dict[str, Any] = {"type": rng.choice(["integer", "number"])}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if rng.random() < 0.3:
                node[key] = rng.choice([-10, -1, 0, 1, 2.5, 7, 100, 0.5])
        if rng.random() < 0.25:
            node["multipleOf"] = rng.choice([2, 3, 0.5, 0.25, 0.1, 5])
        return node

    def string() -> dict[str, Any]:
        node: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.4:
            node["minLength"] = rng.randint(0, 6)
        if rng.random() < 0.4:
            node["maxLength"] = rng.randint(0, 12)
        if rng.random() < 0.35:
            node["pattern"] = rng.choice(_PATTERNS)
        if rng.random() < 0.2:
            node["format"] = rng.choice(["date", "email", "uuid", "date-time", "ipv4", "time", "uri", "hostname"])
        if rng.random() < 0.1:
            node["enum"] = rng.sample(["a", "ab", "abc", "2020-01-01", "x", ""], rng.randint(1, 3))
        return node

    def leaf() -> Any:
        c = rng.random()
        if c < 0.3:
            return string()
        if c < 0.5:
            return number()
        if c < 0.6:
            return {"type": rng.choice(["boolean", "null"])}
        if c < 0.7:
            return {"enum": rng.sample(["a", "b", 1, 2.5, None, True, {"k": 1}, [1, 2], []], rng.randint(1, 4))}
        if c < 0.8:
            return {"const": rng.choice(["a", 1, None, {"a": [1]}, [], 0.5])}
        if c < 0.9:
            kinds = ["string", "integer", "null", "array", "object", "boolean"]
            return {"type": rng.sample(kinds, rng.randint(1, 3))}
        return rng.choice([True, False, {}, {"type": "object"}, {"type": "array", "maxItems": 2}])

    def ref(i: int) -> Any:
        return {"$ref": f"#/$defs/d{rng.randrange(i)}"} if i > 0 and rng.random() < 0.6 else leaf()

    def obj(i: int, kind: str) -> dict[str, Any]:
        props = {f"p{j}": ref(i) for j in rng.sample(range(6), rng.randint(1, 5))}
        node: dict[str, Any] = {"type": "object", "properties": props}
        if rng.random() < 0.6:
            node["required"] = rng.sample(list(props), rng.randint(1, len(props)))
        if rng.random() < 0.3 and kind != "unevaluated":
            node["additionalProperties"] = rng.choice([False, ref(i)])
        if rng.random() < 0.2:
            node["patternProperties"] = {rng.choice(["^x", "^p[0-2]$", "y$"]): ref(i)}
        if rng.random() < 0.2:
            node["minProperties"] = rng.randint(0, 3)
        if rng.random() < 0.2:
            node["maxProperties"] = rng.randint(0, 4)
        if rng.random() < 0.15:
            node["propertyNames"] = rng.choice([{"maxLength": 2}, {"pattern": "^p"}, {"enum": ["p0", "p1", "x"]}])
        if kind == "dependent":
            name, other = rng.choice(list(props)), f"p{rng.randrange(6)}"
            if rng.random() < 0.5:
                node["dependentRequired"] = {name: [other]}
            else:
                node["dependentSchemas"] = {name: {"properties": {other: ref(i)}, "required": [other]}}
        if kind == "unevaluated":
            return {
                "allOf": [node, {"properties": {"q": ref(i)}}],
                "unevaluatedProperties": rng.choice([False, ref(i)]),
            }
        return node

    def array(i: int, m: int) -> dict[str, Any]:
        node: dict[str, Any] = {"type": "array"}
        if rng.random() < 0.8:
            node["items"] = ref(i)
        if rng.random() < 0.4:
            node["prefixItems"] = [ref(i) for _ in range(m)]
        if rng.random() < 0.3:
            node["minItems"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            node["maxItems"] = rng.randint(0, 4)
        if rng.random() < 0.25:
            node["contains"] = ref(i)
            if rng.random() < 0.5:
                node["minContains"] = rng.randint(0, 2)
            if rng.random() < 0.4:
                node["maxContains"] = rng.randint(1, 3)
        if rng.random() < 0.25:
            node["uniqueItems"] = True
        if rng.random() < 0.15:
            node["unevaluatedItems"] = rng.choice([False, ref(i)])
        return node

    for i in range(n):
        kind = rng.choice(["object", "anyOf", "allOf", "oneOf", "not", "if", "array", "string", "number", "enum"])
        kind = rng.choice([kind, "dependent", "unevaluated", "types", "twice"]) if rng.random() < 0.3 else kind
        m = rng.randint(1, 3)
        node: Any
        if kind in ("object", "dependent", "unevaluated"):
            node = obj(i, kind)
        elif kind in ("anyOf", "allOf", "oneOf"):
            node = {kind: [ref(i) for _ in range(m + 1)]}
            if rng.random() < 0.3:
                node["type"] = rng.choice(["object", "string", "integer", "array"])
        elif kind == "not":
            node = {"not": ref(i)}
            if rng.random() < 0.5:
                node["type"] = rng.choice(["object", "string", "integer", "number"])
        elif kind == "if":
            condition = rng.choice(
                [{"properties": {"t": {"const": "a"}}, "required": ["t"]}, {"type": "string"}, {"minimum": 3}]
            )
            node = {"if": condition, "then": ref(i)}
            if rng.random() < 0.7:
                node["else"] = ref(i)
        elif kind == "array":
            node = array(i, m)
        elif kind == "twice":
            node = {"allOf": [ref(i), ref(i)]}
        elif kind == "types":
            node = {"type": rng.sample(["string", "integer", "number", "null", "array", "object"], rng.randint(2, 4))}
            node.update({k: v for k, v in string().items() if k != "type"})
            node.update({k: v for k, v in number().items() if k != "type"})
        elif kind == "number":
            node = number()
        else:
            node = string() if kind == "string" else leaf()
        defs[f"d{i}"] = node
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, "$ref": f"#/$defs/d{n - 1}"}
