"""A grammar for what a schema allows once the keywords the compiler refuses are dropped.

:func:`relax` takes a schema the compiler refuses, drops the refused keyword from the schema
objects the refusal names and compiles again, until what is left (the *relaxed* schema)
compiles exactly or a refusal cannot be dropped safely. Its grammar is exact for the relaxed
schema, which admits every value the schema admits: dropping a keyword only widens the object
holding it, and that object widens the whole schema when nothing that evaluates it rejects
more for a wider subschema. So every answer the schema admits stays open to the model (but
for the compiler's documented narrowings), and validation, which checks the full schema,
decides the dropped keywords. Without this a single ``uniqueItems`` over strings left a whole
answer unconstrained. A ``maxLength`` dropped beside a ``pattern`` leaves the pattern's
repeats capped at it, which still admits every string the two admit (:func:`_drop`).

The objects a refusal names are found as the compiler reads the path (:func:`_ends`): an
object merged with its ``allOf`` components and its ``$ref``'s target, and "[i]" as any branch
of its ``anyOf``/``oneOf`` or of the compiler's rewrites (``then``/``else``,
``dependentSchemas``). The keyword goes from every object found holding it. What is dropped
must not be evaluated, through any chain of subschemas and refs, by ``not``, ``if``,
``contains``, ``unevaluated*`` or a ``oneOf`` whose branches may overlap (a wider subschema
there can reject more: a wider branch can match beside another); a ``oneOf`` whose branches
stay apart (:meth:`_Facts.disjoint`) still picks exactly one. Where such a keyword is what
holds a refusal back (or the refusal is of what the compiler wrote for it), it is widened
itself, the outermost first (:func:`_loosen`): the overlapping ``oneOf`` read as an
``anyOf``, the ``not``/``if``/``contains`` gone.

Nothing is relaxed (:func:`relax` returns None) when the compiler finds that no value meets
the schema, or the relaxed one (which admits more): there is no answer to constrain. Nor when
no object the refusal names holds the keyword; when that does not hold once it is dropped, or
a ref on the way there cannot be followed (a remote one, or one an ``$id`` below the root
moves); when the keyword widens nothing by going (``properties``, ``patternProperties``,
``items``/``prefixItems`` exempt names and positions from
``additionalProperties``/``additionalItems``; ``minContains`` defaults to 1; ``$id`` moves
refs) or is a ref (refused when it does not resolve here, which the validator cannot check
either); when the document has ``unevaluated*`` anywhere (which keys count as evaluated
depends on the keywords dropped); or past MAX_DROPS keywords or SECONDS of compiling (CPU time).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localllm.grammar import keywords
from localllm.grammar.compile import (
    CompiledGrammar,
    Refusal,
    capped_pattern,
    compile_schema,
    compile_text,
    validator_class,
)
from localllm.grammar.kept import Kept
from localllm.grammar.paths import parse_path, resolve_pointer

__all__ = ["Relaxed", "relax"]

#: keywords whose result may shrink when their subschema grows
NOT_MONOTONE = frozenset({"not", "oneOf", "if", "contains", "unevaluatedProperties", "unevaluatedItems", "disallow"})
_REFS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
#: keywords whose removal may narrow the schema or moves what refs resolve to, and refs (the
#: compiler refuses those that do not resolve here: the validator cannot check them either)
NOT_DROPPED = frozenset({"properties", "patternProperties", "items", "prefixItems", "minContains", "$id", "id"} | _REFS)
#: at most this many keywords are dropped (each takes a compile: SARIF 2.1.0's schema needs
#: 75, 3.6 s; winget's manifest 10, 3.4 s)
MAX_DROPS = 128
#: and the compiles take at most this much CPU time of the thread relaxing, in all: a compile
#: may take a second or two on its budgets, and a service request's schema should not cost
#: many of them. CPU time, not the clock: what relaxes does not depend on how loaded the
#: machine is (other processes, other threads of the service compiling) but on the schema
SECONDS = 5.0

#: at most this many ways down a path (and objects merged into one) are followed
MAX_TRAILS = 64
_OBJECTS = frozenset({"object"})
#: the last step down a path: the object and the keyword taken from it (None at the root)
_Step = tuple[dict[str, Any], str] | None
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
    past MAX_DROPS keywords or ``seconds`` of compiling (the thread's CPU time), or when
    ``schema`` compiles exactly (nothing to relax). The latest answers are kept
    (:data:`_RELAXED`: a service client sends its schema with every request); the result is
    shared: do not change it."""
    if not isinstance(schema, dict):
        return None
    try:
        text = json.dumps(schema, allow_nan=False)  # key order kept: it is the declared order
    except (TypeError, ValueError, RecursionError):
        return None
    return _RELAXED.get(
        (text, space, open_objects, seconds),
        lambda: _relaxed(text, space, open_objects, seconds),
        # the key's text, and the relaxed schema (a document of that text) and its grammar
        lambda r: len(text) if r is None else 2 * len(text) + len(r.compiled.grammar or ""),
    )


#: :func:`relax`'s latest answers: 64, and 32 Mi characters in all
_RELAXED: Kept[Relaxed | None] = Kept(64, 32 << 20)


def _relaxed(text: str, space: bool, open_objects: bool, seconds: float) -> Relaxed | None:
    doc = json.loads(text)
    deadline = time.thread_time() + seconds
    compiled = compile_text(text, space, open_objects)  # the caller's compile of it, if it was shared
    if compiled.exact or _has(doc, {"unevaluatedProperties", "unevaluatedItems"}):
        return None
    dropped: list[Refusal] = []
    for _ in range(MAX_DROPS):
        # a relaxed schema no value meets: the schema itself admits none (nothing to answer)
        if compiled.unsatisfiable or not compiled.refusals or time.thread_time() > deadline:
            return None
        refusal = compiled.refusals[0]
        capped = _drop(doc, refusal)
        if capped is not None:
            dropped.append(refusal)
        else:
            # held back by a keyword that may reject more for a wider subschema, or refused
            # in what the compiler wrote for one: that keyword is widened (outermost first),
            # and the refusal is tried again on the next compile
            loosened = _loosen(doc, refusal)
            if loosened is None:
                return None
            dropped.append(loosened)
        compiled = compile_schema(doc, space=space, open_objects=open_objects)
        first = compiled.refusals[0] if compiled.refusals else None
        if (
            capped
            and first
            and first.construct == "pattern"
            and first.path in (refusal.path, f"{refusal.path}.pattern")
        ):
            # the capped pattern does not compile (past the compiler's repeat count or the
            # validator's linear matcher, or beside the string's other patterns, their
            # product past the compiler's states): the pattern as it was, which did
            for holder, pattern in capped:
                holder["pattern"] = pattern
            compiled = compile_schema(doc, space=space, open_objects=open_objects)
        if compiled.exact:
            return Relaxed(doc, compiled, tuple(dropped))
    return None


def _drop(doc: dict[str, Any], refusal: Refusal) -> list[tuple[dict[str, Any], str]] | None:
    """Drop ``refusal.construct`` from the schema objects its path names (or, for a refusal
    pointing into one of a keyword's subschemas, from the object holding that keyword),
    when that only widens ``doc``; else leave ``doc`` as it was and return None.

    A ``maxLength`` dropped beside a ``pattern`` (their product past the compiler's states:
    "at most 12 words" in at most 100 characters) leaves the pattern's repeats capped at it
    (:func:`capped_pattern`: what the pattern matches within the length, and no endless
    word): returned are the objects whose pattern was capped, with the pattern as it was."""
    named = _named(doc, refusal)
    holders = None if named is None else _holders(named[0], refusal.construct)
    if named is None or holders is None:
        return None
    facts = named[1]
    kept = {i: list(node.items()) for i, node in holders.items()}
    capped: list[tuple[dict[str, Any], str]] = []
    for node in holders.values():
        if refusal.construct == "maxLength" and (was := _cap_repeats(node)) is not None:
            capped.append((node, was))
        for k in (refusal.construct, "then", "else") if refusal.construct == "if" else (refusal.construct,):
            node.pop(k, None)
    # no keyword whose result may shrink when its subschema grows may reach what was
    # widened, but a oneOf whose branches still stay apart: a wider branch's insides keep it apart
    below = _below_not_monotone(doc, facts)
    if below is not None and not below & holders.keys():
        return capped
    for i, node in holders.items():  # as it was, keys in their order
        node.clear()
        node.update(kept[i])
    return None


def _cap_repeats(node: dict[str, Any]) -> str | None:
    """Cap the repeats of ``node``'s pattern at its ``maxLength``: the pattern as it was when
    that changed it, else None."""
    pattern, bound = node.get("pattern"), node.get("maxLength")
    if not isinstance(pattern, str) or not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        return None
    capped = capped_pattern(pattern, bound)
    if capped is None:
        return None
    node["pattern"] = capped
    return pattern


def _holders(ends: list[tuple[dict[str, Any], _Step]], key: str) -> dict[int, dict[str, Any]] | None:
    """Of the objects a refusal's path names (:func:`_named`), those holding ``key``, by id;
    None when there are none or the keyword is not one to drop."""
    holders: dict[int, dict[str, Any]] = {}
    for end, last in ends:
        # "$.oneOf[1]": the branch, not the keyword's holder
        node = last[0] if key not in end and last is not None and last[1] == key else end
        if key in node:
            holders[id(node)] = node
    if not holders or key in NOT_DROPPED or key not in keywords.ASSERTING:
        return None
    return holders


def _named(doc: dict[str, Any], refusal: Refusal) -> tuple[list[tuple[dict[str, Any], _Step]], _Facts] | None:
    """The objects ``refusal``'s path names (:func:`_ends`) and the document's facts; None
    when the path cannot be read."""
    try:
        tokens = parse_path(refusal.path)
    except ValueError:
        return None
    # refs are looked up only where no $id moves them: the draft's own identifier keyword (draft
    # 4's "id" is a property name or an example's field to 2019-09), in schema objects only
    key = "id" if validator_class(doc).ID_OF({"id": "x"}) else "$id"
    moved = any(isinstance(o.get(key), str) for o, _ in _positions(doc) if o is not doc)
    facts = _Facts(None if moved else doc, _knows_const(doc))
    return _ends(doc, tokens, facts.refs), facts


def _loosen(doc: dict[str, Any], refusal: Refusal) -> Refusal | None:
    """Widen the outermost keyword of NOT_MONOTONE that holds back what ``refusal`` names (one
    that no such keyword reaches in turn, so the whole document widens): a ``oneOf`` whose
    branches may overlap is read as an ``anyOf`` (every value that matches exactly one branch
    matches one), a ``not``, ``if`` (with its ``then``/``else``) or ``contains`` goes. What it
    holds back: the objects holding the refused keyword, or when none does (the compiler
    refuses what it wrote for such a keyword: alternatives it multiplied, a pattern telling
    ``oneOf`` branches apart) the objects the path names, a keyword of theirs too. The refusal
    is tried again on the next compile. Returns what was widened, as a refusal naming it;
    None when nothing can be."""
    named = _named(doc, refusal)
    if named is None:
        return None
    ends, facts = named
    targets = _holders(ends, refusal.construct) or {id(end): end for end, _ in ends}
    below = _below_not_monotone(doc, facts)
    if below is None or not targets:
        return None
    for obj, path in _positions(doc):
        if id(obj) in below:
            continue
        for key in sorted(NOT_MONOTONE & obj.keys()):
            if key == "oneOf" and facts.disjoint(obj[key]):
                continue
            if id(obj) not in targets:
                reached = _reached([obj[key]], facts)
                if reached is None:
                    return None
                if not reached & targets.keys():
                    continue
            if key == "oneOf":
                branches = obj.pop("oneOf")
                if "anyOf" in obj:
                    obj["allOf"] = [*obj.get("allOf", []), {"anyOf": branches}]
                else:
                    obj["anyOf"] = branches
                how = 'read as "anyOf"'
            else:
                for k in (key, "then", "else") if key == "if" else (key,):
                    obj.pop(k, None)
                how = "dropped"
            return Refusal(path, key, f'{path}: "{key}" {how}, for {refusal.message}')
    return None


def _positions(doc: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """The schema objects in ``doc`` (not values: an ``enum``'s, a ``properties`` map) with
    their paths, in document order."""
    stack: list[tuple[dict[str, Any], str]] = [(doc, "$")]
    while stack:
        obj, path = stack.pop()
        yield obj, path
        children: list[tuple[dict[str, Any], str]] = []
        for k, v in obj.items():
            if k in _NAMED and isinstance(v, dict):
                children += [(sub, f"{path}.{k}.{name}") for name, sub in v.items() if isinstance(sub, dict)]
            elif k in _LISTED and isinstance(v, list):
                children += [(sub, f"{path}.{k}[{i}]") for i, sub in enumerate(v) if isinstance(sub, dict)]
            elif k in _SINGLE and isinstance(v, dict):
                children.append((v, f"{path}.{k}"))
        stack.extend(reversed(children))


def _below_not_monotone(doc: dict[str, Any], facts: _Facts) -> set[int] | None:
    """The ids of the objects a keyword of NOT_MONOTONE evaluates (but a ``oneOf`` whose
    branches stay apart), its refs followed; None when a ref there cannot be followed."""
    return _reached(
        [
            obj[k]
            for obj in _objects(doc)
            for k in NOT_MONOTONE & obj.keys()
            if not (k == "oneOf" and facts.disjoint(obj[k]))
        ],
        facts,
    )


def _reached(stack: list[Any], facts: _Facts) -> set[int] | None:
    """The ids of the objects in ``stack`` and under them, refs followed; None when a ref
    there cannot be followed."""
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict) and id(item) not in seen:
            seen.add(id(item))
            for k in _REFS & item.keys():
                ref = item[k]
                if k != "$ref" or facts.refs is None or not isinstance(ref, str):
                    return None
                target = _target(ref, facts.refs)
                if target is None:
                    return None
                stack.append(target)
            stack.extend(item.values())
    return seen


@dataclass(frozen=True)
class _Stated:
    """What a ``oneOf`` branch states of itself, whatever its other keywords: the types its
    values have (None: any), and for a branch of objects only, the values each of its required
    properties may take (``const``/``enum`` of strings, the discriminator of pydantic's
    tagged unions)."""

    types: frozenset[str] | None
    tags: dict[str, frozenset[str]]


@dataclass(frozen=True)
class _Facts:
    """Reads what ``oneOf`` branches state of themselves in a document: its refs are looked up
    when ``refs`` is the document; ``const`` asserts in its dialect."""

    refs: dict[str, Any] | None
    const: bool

    def disjoint(self, branches: Any) -> bool:
        """Can no value match two of ``branches``? Two branches are apart when they state
        types no two share (``integer`` is a ``number``: "a string or a list of strings"), or
        both hold objects only and a property both require has values apart ("kind": "cat"
        or "dog").

        What a branch states stays when anything under it widens, so a ``oneOf`` of such
        branches still picks exactly one. A branch that is a local ``$ref`` states what its
        target does (its sibling keywords can only narrow it, or are ignored by drafts before
        2019-09).
        """
        if not isinstance(branches, list):
            return False
        stated = [self.stated(branch) for branch in branches]
        known = [s for s in stated if s is not None]
        return len(known) == len(stated) and all(_apart(a, b) for a, b in itertools.combinations(known, 2))

    def stated(self, branch: Any) -> _Stated | None:
        if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
            branch = None if self.refs is None else _target(branch["$ref"], self.refs)
        if not isinstance(branch, dict) or _REFS & branch.keys():
            return None
        given = branch.get("type")
        listed = [given] if isinstance(given, str) else given if isinstance(given, list) else None
        if listed is not None and not all(isinstance(t, str) for t in listed):
            return None
        types = None if listed is None else frozenset(listed) | ({"integer"} if "number" in listed else set())
        tags: dict[str, frozenset[str]] = {}
        properties, required = branch.get("properties"), branch.get("required")
        if types == _OBJECTS and isinstance(properties, dict) and isinstance(required, list):
            for name in required:
                sub = properties.get(name) if isinstance(name, str) else None
                if not isinstance(sub, dict) or _REFS & sub.keys():
                    continue
                values = [sub["const"]] if "const" in sub and self.const else sub.get("enum")
                if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
                    tags[name] = frozenset(values)
        return _Stated(types, tags)


def _apart(a: _Stated, b: _Stated) -> bool:
    if a.types is not None and b.types is not None and not a.types & b.types:
        return True
    return a.types == b.types == _OBJECTS and any(not a.tags[p] & b.tags[p] for p in a.tags.keys() & b.tags.keys())


def _target(ref: str, doc: dict[str, Any]) -> Any:
    """The schema a ``#/...`` ref names in ``doc`` (None for any other ref)."""
    found = resolve_pointer(doc, ref[1:]) if ref.startswith("#") else None
    return None if found is None else found[0]


def _knows_const(doc: dict[str, Any]) -> bool:
    """``const`` asserts from draft 6 on (before it, an unknown keyword)."""
    dialect = doc.get("$schema")
    return not (isinstance(dialect, str) and ("draft-03" in dialect or "draft-04" in dialect))


def _ends(
    doc: dict[str, Any], tokens: list[str | int], refs: dict[str, Any] | None
) -> list[tuple[dict[str, Any], _Step]]:
    """The schema objects ``tokens`` leads to, each with the last step to it. An object is
    read as the compiler reads it, merged with its ``allOf`` components and the target of its
    ``$ref`` (looked up in ``refs``, when given), and theirs in turn: the compiler names a
    merged object by the path of the object holding them. At most MAX_TRAILS objects, and as
    many steps as MAX_TRAILS squared: what is found is dropped, the rest refused again."""
    done: list[tuple[dict[str, Any], _Step]] = []
    todo: list[tuple[dict[str, Any], int, _Step]] = [(doc, 0, None)]
    budget = MAX_TRAILS * MAX_TRAILS
    while todo and len(done) < MAX_TRAILS and budget > 0:
        start, i, before = todo.pop()
        for node, last in _views(start, before, refs):
            budget -= 1
            if i == len(tokens):
                done.append((node, last))
                continue
            todo.extend(
                (child, after, last if keyword is None else (node, keyword))
                for child, after, keyword in _steps(node, tokens, i)
            )
    return done


def _views(node: dict[str, Any], last: _Step, refs: dict[str, Any] | None) -> Iterator[tuple[dict[str, Any], _Step]]:
    """``node`` and the objects the compiler merges into it, each with the last step to it."""
    seen: set[int] = set()
    todo = [(node, last)]
    while todo and len(seen) < MAX_TRAILS:
        obj, step = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj, step
        components = obj.get("allOf")
        if isinstance(components, list):
            todo.extend((c, (obj, "allOf")) for c in components if isinstance(c, dict))
        target = _target(obj["$ref"], refs) if refs is not None and isinstance(obj.get("$ref"), str) else None
        if isinstance(target, dict):
            todo.append((target, (obj, "$ref")))


def _steps(node: dict[str, Any], tokens: list[str | int], i: int) -> list[tuple[dict[str, Any], int, str | None]]:
    """The subschemas ``tokens[i:]`` starts with in ``node``, each with the index after it and
    the keyword (None: ``node`` itself). The compiler names "[i]" a branch of an
    ``anyOf``/``oneOf``, and also a branch of its own rewrites (``allOf`` components
    distributed over their ``anyOf``s, ``if``/``then``/``else``, ``dependentSchemas``,
    ``dependencies``), numbered as it wrote them and holding the node's other keywords too:
    "[i]" is read as the node or any of those subschemas (dropping a keyword from more of them
    only widens more)."""
    key = tokens[i]
    found: list[tuple[Any, int, str | None]] = []
    if isinstance(key, int):
        found.append((node, i + 1, None))
        for k in ("anyOf", "oneOf"):
            branches = node.get(k)
            found += [(b, i + 1, k) for b in branches] if isinstance(branches, list) else []
        found += [(node[k], i + 1, k) for k in ("then", "else") if k in node]
        for k in ("dependentSchemas", "dependencies"):
            named = node.get(k)
            found += [(v, i + 1, k) for v in named.values()] if isinstance(named, dict) else []
    elif key in node:
        value = node[key]
        if key in _NAMED and i + 1 < len(tokens) and isinstance(value, dict):
            found.append((value.get(str(tokens[i + 1])), i + 2, key))
        elif key in _LISTED and isinstance(value, list) and i + 1 < len(tokens):
            index = tokens[i + 1]
            if isinstance(index, int) and 0 <= index < len(value):
                found.append((value[index], i + 2, key))
        elif key in _SINGLE and not isinstance(value, list):
            found.append((value, i + 1, key))
    return [(child, after, k) for child, after, k in found if isinstance(child, dict)]


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
