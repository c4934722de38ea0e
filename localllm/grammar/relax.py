"""A grammar for what a schema allows once the keywords the compiler refuses are dropped.

:func:`relax` takes a schema the compiler refuses, drops the refused keyword from the schema
object the refusal names and compiles again, until what is left (the *relaxed* schema)
compiles exactly or a refusal cannot be dropped safely. Its grammar is exact for the relaxed
schema, which admits every value the schema admits: dropping a keyword only widens the object
holding it, and that object widens the whole schema when every keyword on the way down to it
passes a wider subschema on as a wider schema (``properties``, ``items``, ``allOf``,
``anyOf``, ``then`` …). So every answer the schema admits stays open to the model (but for the
compiler's documented narrowings), and validation, which checks the full schema, decides the
dropped keywords. Without this a single ``uniqueItems`` over strings left a whole answer
unconstrained.

Nothing is relaxed (:func:`relax` returns None) when the compiler finds that no value meets
the schema, or the relaxed one (which admits more): there is no answer to constrain. Nor when
a refusal's path is not a schema object of the document (it names one of the compiler's
rewrites: merged ``allOf`` components, ``if``/``then`` as branches …); when the way down
passes ``not``, ``if``, ``contains``, ``unevaluated*`` or a ``oneOf`` whose branches do not
state types no two share (a wider subschema there can reject more: a wider branch can match
beside another); when the keyword
widens nothing by going (``properties``, ``patternProperties``, ``items``/``prefixItems``
exempt names and positions from ``additionalProperties``/``additionalItems``;
``minContains`` defaults to 1; ``$id`` moves refs) or is a ref (refused when it does not
resolve here, which the validator cannot check either); when the document has ``unevaluated*``
anywhere (which keys count as evaluated depends on the keywords dropped); when, once the
keyword is gone, a ``$ref`` is left under a keyword of that first list (it could reach the
object from there); or past MAX_DROPS keywords or SECONDS of compiling.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localllm.grammar import keywords
from localllm.grammar.compile import CompiledGrammar, Refusal, compile_schema
from localllm.grammar.paths import parse_path

__all__ = ["Relaxed", "relax"]

#: keywords whose result may shrink when their subschema grows
NOT_MONOTONE = frozenset({"not", "oneOf", "if", "contains", "unevaluatedProperties", "unevaluatedItems", "disallow"})
_REFS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
#: keywords whose removal may narrow the schema or moves what refs resolve to, and refs (the
#: compiler refuses those that do not resolve here: the validator cannot check them either)
NOT_DROPPED = frozenset({"properties", "patternProperties", "items", "prefixItems", "minContains", "$id", "id"} | _REFS)
#: at most this many keywords are dropped (each takes a compile: winget's manifest needs 10, 3.4 s)
MAX_DROPS = 16
#: and the compiles take at most this long in all: a compile may take a second or two on its
#: budgets, and a service request's schema should not cost 16 of them
SECONDS = 5.0

_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"})
_LISTED = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items", "extends"})
_SINGLE = frozenset(
    {"additionalProperties", "items", "additionalItems", "propertyNames", "not", "if", "then", "else", "contains"}
    | {"unevaluatedProperties", "unevaluatedItems", "extends"}
)


@dataclass(frozen=True)
class Relaxed:
    """The schema without the dropped keywords, its exact grammar, and the refusals dropped."""

    schema: Any
    compiled: CompiledGrammar
    dropped: tuple[Refusal, ...]


def relax(schema: Any, *, space: bool = False, open_objects: bool = True, seconds: float = SECONDS) -> Relaxed | None:
    """The relaxed schema and its grammar, or None when a refusal cannot be dropped safely,
    past MAX_DROPS keywords or ``seconds`` of compiling (or when ``schema`` compiles exactly:
    nothing to relax). The last 64 answers are kept (a service request compiles its schema
    each time); the result is shared: do not change it."""
    if not isinstance(schema, dict):
        return None
    try:
        text = json.dumps(schema, allow_nan=False)  # key order kept: it is the declared order
    except (TypeError, ValueError, RecursionError):
        return None
    return _relaxed(text, space, open_objects, seconds)


@functools.lru_cache(maxsize=64)
def _relaxed(text: str, space: bool, open_objects: bool, seconds: float) -> Relaxed | None:
    doc = json.loads(text)
    deadline = time.monotonic() + seconds
    compiled = compile_schema(doc, space=space, open_objects=open_objects)
    if compiled.exact or _has(doc, {"unevaluatedProperties", "unevaluatedItems"}):
        return None
    dropped: list[Refusal] = []
    for _ in range(MAX_DROPS):
        # a relaxed schema no value meets: the schema itself admits none (nothing to answer)
        if compiled.unsatisfiable or not compiled.refusals or time.monotonic() > deadline:
            return None
        if not _drop(doc, compiled.refusals[0]):
            return None
        dropped.append(compiled.refusals[0])
        compiled = compile_schema(doc, space=space, open_objects=open_objects)
        if compiled.exact:
            return Relaxed(doc, compiled, tuple(dropped))
    return None


def _drop(doc: dict[str, Any], refusal: Refusal) -> bool:
    """Drop ``refusal.construct`` from the schema object its path names (or, for a refusal
    pointing into one of a keyword's subschemas, from the object holding that keyword),
    when that only widens ``doc``."""
    try:
        tokens = parse_path(refusal.path)
    except ValueError:
        return False
    trail = _walk(doc, tokens)
    if trail is None:
        return False
    key = refusal.construct
    node, way = trail[-1][0], trail[:-1]
    if key not in node and way and way[-1][1] == key:  # "$.oneOf[1]": the branch, not the keyword's holder
        node, way = way[-1][0], way[:-1]
    if key not in node or key in NOT_DROPPED or key not in keywords.ASSERTING:
        return False
    if any(k in NOT_MONOTONE and k != "oneOf" for _, k in way):
        return False
    for k in (key, "then", "else") if key == "if" else (key,):
        node.pop(k, None)
    # (the caller drops the document when this is False) a oneOf on the way stays "exactly
    # one" only while its branches keep types no two share; a ref under a keyword that is
    # not monotone could reach the object from there
    if any(k == "oneOf" and not _types_disjoint(holder["oneOf"]) for holder, k in way):
        return False
    return not any(_has(obj[k], _REFS) for obj in _objects(doc) for k in NOT_MONOTONE & obj.keys())


def _types_disjoint(branches: list[Any]) -> bool:
    """Does each branch state a ``type`` (and no ``$ref``, which may override it) that no
    other branch shares (``integer`` is a ``number``)?"""
    seen: set[str] = set()
    for branch in branches:
        if not isinstance(branch, dict) or "$ref" in branch:
            return False
        stated = branch.get("type")
        types = {stated} if isinstance(stated, str) else set(stated) if isinstance(stated, list) else None
        if not types or not all(isinstance(t, str) for t in types):
            return False
        if "number" in types:
            types.add("integer")
        if types & seen:
            return False
        seen |= types
    return True


def _walk(doc: dict[str, Any], tokens: list[str | int]) -> list[tuple[dict[str, Any], str | None]] | None:
    """The schema objects along ``tokens``, each with the keyword taken from it (the last
    with None); None when the path leaves the document's schema objects."""
    trail: list[tuple[dict[str, Any], str | None]] = []
    node: Any = doc
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if isinstance(key, int) and isinstance(node, dict):
            # the compiler names a branch of a node's anyOf or oneOf "[i]", without the keyword
            lists = [k for k in ("anyOf", "oneOf") if isinstance(node.get(k), list)]
            if len(lists) != 1 or not 0 <= key < len(node[lists[0]]):
                return None
            trail.append((node, lists[0]))
            node, i = node[lists[0]][key], i + 1
            continue
        if not isinstance(node, dict) or not isinstance(key, str) or key not in node:
            return None
        value = node[key]
        trail.append((node, key))
        if key in _NAMED and i + 1 < len(tokens) and isinstance(value, dict):
            node, i = value.get(str(tokens[i + 1])), i + 2
        elif key in _LISTED and isinstance(value, list) and i + 1 < len(tokens):
            index = tokens[i + 1]
            if not isinstance(index, int) or not 0 <= index < len(value):
                return None
            node, i = value[index], i + 2
        elif key in _SINGLE and not isinstance(value, list):
            node, i = value, i + 1
        else:
            return None
    if not isinstance(node, dict):
        return None
    trail.append((node, None))
    return trail


def _has(doc: Any, names: set[str] | frozenset[str]) -> bool:
    """Does any object in ``doc`` hold one of ``names`` as a key?"""
    return any(names & obj.keys() for obj in _objects(doc))


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
