"""Per-answer confidence from the answer's own token probabilities.

A *choice field* is a value the schema limits to a few alternatives: an ``enum``, a
``boolean``, or an ``integer`` with both bounds and at most :data:`MAX_INTEGER_CHOICES`
values, each optionally ``null``; a union (``anyOf``/``oneOf``) whose every branch is one
is a choice over all their values, and ``allOf`` keeps the values every choice branch
admits (pydantic's ``Optional[Enum]`` and ``allOf: [{$ref}]``). For each choice field of an answer, its confidence is
the model's probability of the value it chose **among the schema's alternatives**, read
from the per-token probabilities llama-server returns beside the answer
(``logprobs: true``, ``top_logprobs: K``) — no extra request, no extra token.

llama-server reports each token's probability *before* the sampler chain (before the
grammar mask and temperature), so the raw numbers leak mass to tokens the grammar forbids.
They are renormalised here, per generated token inside the value, over the candidate
tokens that keep *some* alternative possible (the grammar's allowed set, as far as the
top-K list shows it)::

    step_i = mass(candidates consistent with the chosen value) / mass(candidates consistent with any alternative)
    field  = Π step_i   over the tokens that overlap the value's bytes (and, for ``1`` of
                        1..12, the token after it, which says whether ``10``–``12`` went on)

which is the probability of the chosen value under grammar-constrained sampling at
temperature 1, whatever the temperature used. A candidate consistent with two
alternatives (a shared prefix like ``"b`` for ``"billing"``/``"bug"``) counts for the
chosen one, and candidates beyond the top K are unseen: both make the number an upper
bound, tight when alternatives diverge in their first token (the usual case).

The answer's confidence combines its choice fields by **product** (the probability that
every choice is right, taking them as independent); free-text fields (strings without
``enum``, unbounded numbers, arrays' lengths) are not measured — a fluent summary is not
evidence of a right one. Per-field values are kept in ``meta.confidence_fields``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localllm.wire import finite_float

#: the confidence method names written to ``meta.confidence_method``
METHOD = "logprobs"
UNAVAILABLE = "unavailable"  # the server returned no usable token probabilities
NOT_APPLICABLE = "no_choice_fields"  # the schema has no enum/boolean/small-integer field
UNMATCHED = "unmatched"  # the tokens did not line up with the answer (a stop word cut, a fence)

#: an integer field with more values than this is free text for confidence purposes
MAX_INTEGER_CHOICES = 32
#: how many alternatives per token llama-server is asked for (OpenAI's own maximum)
TOP_LOGPROBS = 20

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Token:
    """One generated token: its bytes, log-probability and the top candidates at its position."""

    data: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class Confidence:
    """An answer's confidence: the combined value, per field, and the method that measured it."""

    value: float | None
    method: str
    fields: dict[str, float]

    def as_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "confidence": None if self.value is None else round(self.value, 6),
            "confidence_method": self.method,
        }
        if self.fields:
            meta["confidence_fields"] = {k: round(v, 6) for k, v in self.fields.items()}
        return meta


# ---------------------------------------------------------------------- schema side


def _resolve(node: Any, root: Mapping[str, Any]) -> Any:
    """Follow local ``#/…`` ``$ref`` chains (bounded); anything else is returned as is."""
    for _ in range(32):
        if not isinstance(node, dict) or not isinstance(node.get("$ref"), str):
            return node
        ref: str = node["$ref"]
        if not ref.startswith("#/"):
            return None
        target: Any = root
        for raw in ref[2:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        node = target
    return None


def _dump(value: Any) -> str:
    # exactly how the compiled grammar renders an enum literal
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


#: the combinators a choice field may hide behind (pydantic writes ``Optional[Queue]`` as
#: ``anyOf: [{$ref: Queue}, {type: null}]`` and an enum with a description as ``allOf: [{$ref}]``)
_UNIONS = ("anyOf", "oneOf")


#: how deep a choice is looked for behind combinators and ``$ref``s
_MAX_DEPTH = 32

_Values = tuple[str, ...] | None


def _values(
    node: Any, root: Mapping[str, Any], memo: dict[int, _Values] | None = None, active: set[int] | None = None
) -> _Values:
    """Every JSON text ``node`` admits when they are few and known, else ``None``.

    Each schema node is worked out once per call (``memo``), and a node met again on its own
    path (``anyOf: [{$ref: "#/$defs/A"}, …]`` inside ``A``) is no finite choice: without
    both, ``A: {anyOf: [A, A, null]}`` took 2**32 steps."""
    memo = {} if memo is None else memo
    active = set() if active is None else active
    node = _resolve(node, root)
    if not isinstance(node, dict):
        return None
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active or len(active) > _MAX_DEPTH:
        return None
    active.add(key)
    try:
        found = _node_values(node, root, memo, active)
    finally:
        active.discard(key)
    memo[key] = found
    return found


def _node_values(node: dict[str, Any], root: Mapping[str, Any], memo: dict[int, _Values], active: set[int]) -> _Values:
    if isinstance(node.get("enum"), list):
        try:
            return tuple(dict.fromkeys(_dump(v) for v in node["enum"]))
        except (TypeError, ValueError):
            return None
    if "const" in node:
        try:
            return (_dump(node["const"]),)
        except (TypeError, ValueError):
            return None
    for word in _UNIONS:  # a value of any branch: the union, when every branch is a choice
        branches = node.get(word)
        if isinstance(branches, list) and branches:
            found = [_values(b, root, memo, active) for b in branches]
            if any(f is None for f in found):
                return None
            return tuple(dict.fromkeys(t for f in found if f is not None for t in f))
    branches = node.get("allOf")
    if isinstance(branches, list) and branches:  # a value of every branch: within each choice branch
        sets = [f for f in (_values(b, root, memo, active) for b in branches) if f is not None]
        if sets:
            return tuple(t for t in sets[0] if all(t in other for other in sets[1:]))
    types = node.get("type")
    kinds = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    null = ("null",) if "null" in kinds else ()
    if kinds == {"null"}:
        return null
    if kinds and kinds <= {"boolean", "null"}:
        return ("true", "false", *null)
    if kinds and kinds <= {"integer", "null"}:
        low: float | None = finite_float(node.get("minimum"))
        high: float | None = finite_float(node.get("maximum"))
        if (exclusive := finite_float(node.get("exclusiveMinimum"))) is not None:
            low = math.floor(exclusive) + 1
        if (exclusive := finite_float(node.get("exclusiveMaximum"))) is not None:
            high = math.ceil(exclusive) - 1
        if low is None or high is None:
            return None
        lo, hi = math.ceil(low), math.floor(high)
        if 0 < hi - lo + 1 <= MAX_INTEGER_CHOICES:
            return (*(str(i) for i in range(lo, hi + 1)), *null)
    return None


def alternatives(node: Any, root: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The JSON texts a choice field may take, or ``None`` when ``node`` is not a choice field.

    A union (``anyOf``/``oneOf``) of choices is one choice over all their values: an optional
    enum (``anyOf: [{enum}, {type: null}]``) is a choice among the labels and ``null``."""
    texts = _values(node, root)
    return texts if texts is not None and len(texts) > 1 else None


def _branches(node: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    return [(w, node[w]) for w in ("allOf", *_UNIONS) if isinstance(node.get(w), list) and node[w]]


def _child(
    node: Any,
    key: str | int,
    root: Mapping[str, Any],
    memo: dict[int, Any] | None = None,
    active: set[int] | None = None,
) -> Any:
    """The schema of ``node``'s member ``key`` (a property name or an array index), or ``None``
    (each node looked into once, none again on its own path: see :func:`_values`)."""
    memo = {} if memo is None else memo
    active = set() if active is None else active
    node = _resolve(node, root)
    if not isinstance(node, dict) or id(node) in active or len(active) > _MAX_DEPTH:
        return None
    if id(node) not in memo:
        active.add(id(node))
        try:
            memo[id(node)] = _node_child(node, key, root, memo, active)
        finally:
            active.discard(id(node))
    return memo[id(node)]


def _node_child(
    node: dict[str, Any], key: str | int, root: Mapping[str, Any], memo: dict[int, Any], active: set[int]
) -> Any:
    if isinstance(key, str):
        props = node.get("properties")
        if isinstance(props, dict) and key in props:
            return props[key]
        if isinstance(node.get("additionalProperties"), dict):
            return node["additionalProperties"]
    else:
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and key < len(prefix):
            return prefix[key]
        if isinstance(node.get("items"), dict):
            return node["items"]
    for word, branches in _branches(node):  # an object or array behind a combinator
        found: list[Any] = []
        for branch in branches:
            child = _child(branch, key, root, memo, active)
            if child is not None and not any(child is f for f in found):  # A: {anyOf: [B, B]}: B's once
                found.append(child)
        if found:
            return found[0] if len(found) == 1 else {("allOf" if word == "allOf" else "anyOf"): found}
    return None


def subschema(schema: Mapping[str, Any], path: Path) -> Any:
    """The schema node that governs the value at ``path`` (``None`` when it cannot be told)."""
    node: Any = schema
    for key in path:
        node = _child(node, key, schema)
        if node is None:
            return None
    return node


def has_choice_fields(schema: Mapping[str, Any]) -> bool:
    """Whether any value under ``schema`` is a choice field (so asking for logprobs can pay off)."""
    seen: set[int] = set()

    def walk(node: Any, depth: int) -> bool:
        node = _resolve(node, schema)
        if not isinstance(node, dict) or id(node) in seen or depth > 32:
            return False
        seen.add(id(node))
        if alternatives(node, schema) is not None:
            return True
        children: list[Any] = []
        if isinstance(node.get("properties"), dict):
            children += list(node["properties"].values())
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                children.append(node[key])
        if isinstance(node.get("prefixItems"), list):
            children += node["prefixItems"]
        for _, branches in _branches(node):
            children += branches
        return any(walk(c, depth + 1) for c in children)

    return walk(schema, 0)


# ---------------------------------------------------------------------- answer side


def scalars(text: str) -> list[tuple[Path, int, int]]:
    """Every scalar value of the JSON ``text`` as (path, start, end) character offsets.

    Raises ``ValueError`` when ``text`` is not one JSON value (surrounding whitespace allowed).
    """
    decoder = json.JSONDecoder()
    out: list[tuple[Path, int, int]] = []

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def value(i: int, path: Path, depth: int) -> int:
        if depth > 64:
            raise ValueError("too deep")
        i = skip(i)
        if i >= len(text):
            raise ValueError("truncated")
        if text[i] == "{":
            i = skip(i + 1)
            if i < len(text) and text[i] == "}":
                return i + 1
            while True:
                key, i = decoder.raw_decode(text, skip(i))
                if not isinstance(key, str):
                    raise ValueError("object key is not a string")
                i = skip(i)
                if i >= len(text) or text[i] != ":":
                    raise ValueError("expected ':'")
                i = skip(value(i + 1, (*path, key), depth + 1))
                if i < len(text) and text[i] == ",":
                    i += 1
                    continue
                if i < len(text) and text[i] == "}":
                    return i + 1
                raise ValueError("expected ',' or '}'")
        if text[i] == "[":
            i = skip(i + 1)
            if i < len(text) and text[i] == "]":
                return i + 1
            n = 0
            while True:
                i = skip(value(i, (*path, n), depth + 1))
                n += 1
                if i < len(text) and text[i] == ",":
                    i += 1
                    continue
                if i < len(text) and text[i] == "]":
                    return i + 1
                raise ValueError("expected ',' or ']'")
        _, end = decoder.raw_decode(text, i)
        out.append((path, i, end))
        return end

    end = skip(value(0, (), 0))
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return out


def field_label(path: Path) -> str:
    parts: list[str] = []
    for key in path:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            parts.append(("." if parts else "") + key)
    return "".join(parts) or "$"


_NUMBER_TAIL = frozenset(b"0123456789.eE+-")


def _consistent(candidate: bytes, before: bytes, full: bytes, numeric: bool) -> bool:
    """Whether ``before + candidate`` can still lead to ``full`` (an answer prefix ending in one alternative)."""
    x = before + candidate
    if len(x) <= len(full):
        return full.startswith(x)
    if not x.startswith(full):
        return False
    # the token runs past the value: a number must end there (``3`` is not ``35``)
    return not (numeric and x[len(full)] in _NUMBER_TAIL)


def field_confidence(
    tokens: Sequence[Token], starts: Sequence[int], out: bytes, span: tuple[int, int], alts: Sequence[bytes]
) -> float | None:
    """The chosen value's probability among ``alts`` (see the module docstring), or ``None``."""
    vs, ve = span
    chosen = out[vs:ve]
    if chosen not in alts:
        return None
    head = out[:vs]
    fulls = [(head + a, a[-1:].isdigit()) for a in alts]
    mine = head + chosen
    mine_numeric = chosen[-1:].isdigit()
    # a number that another alternative extends (``1`` of 1..12) is decided by the token after it
    extended = any(len(a) > len(chosen) and a.startswith(chosen) for a in alts)
    conf = 1.0
    for token, start in zip(tokens, starts, strict=True):
        end = start + len(token.data)
        if end <= vs or start > ve or (start == ve and not extended):
            continue
        before = out[:start]
        if not _consistent(token.data, before, mine, mine_numeric):
            return None
        p_token = math.exp(token.logprob)
        keep, total = p_token, p_token
        for cand, logprob in token.top:
            if cand == token.data:
                continue
            p = math.exp(logprob)
            if _consistent(cand, before, mine, mine_numeric):
                keep += p
                total += p
            elif any(_consistent(cand, before, full, numeric) for full, numeric in fulls):
                total += p
        if total <= 0.0:
            return None
        conf *= keep / total
    return min(max(conf, 0.0), 1.0)


def parse_logprobs(data: Any) -> list[Token] | None:
    """The OpenAI ``choices[0].logprobs.content`` list (llama-server, vLLM, OpenAI) as tokens."""
    try:
        content = data["choices"][0]["logprobs"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, list) or not content:
        return None

    def raw(entry: Any) -> bytes | None:
        if not isinstance(entry, dict):
            return None
        data = entry.get("bytes")
        if isinstance(data, list) and all(isinstance(b, int) and 0 <= b < 256 for b in data):
            return bytes(data)
        token = entry.get("token")
        return token.encode("utf-8") if isinstance(token, str) else None

    def logprob(entry: dict[str, Any]) -> float | None:
        """A log probability: at most 0 (a server's 1000 is not one: math.exp overflowed on it)."""
        value = entry.get("logprob")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = finite_float(value)
            if number is None:
                return -math.inf
            return number if number <= 0.0 else None
        return None

    tokens: list[Token] = []
    for entry in content:
        text = raw(entry)
        if text is None:
            return None
        lp = logprob(entry)
        if lp is None:
            return None
        top: list[tuple[bytes, float]] = []
        candidates = entry.get("top_logprobs")
        for cand in candidates if isinstance(candidates, list) else ():
            ctext = raw(cand)
            clp = logprob(cand) if isinstance(cand, dict) else None
            if ctext is not None and clp is not None:
                top.append((ctext, clp))
        tokens.append(Token(text, lp, tuple(top)))
    return tokens


def measure(schema: Mapping[str, Any] | None, content: str, tokens: Sequence[Token] | None) -> Confidence:
    """The answer's confidence from its tokens (``tokens=None``: the server sent none)."""
    if schema is None or not has_choice_fields(schema):
        return Confidence(None, NOT_APPLICABLE, {})
    if tokens is None:
        return Confidence(None, UNAVAILABLE, {})
    out = b"".join(t.data for t in tokens)
    try:
        text = out.decode("utf-8")
        spans = list(scalars(text))
    except (UnicodeDecodeError, ValueError):
        return Confidence(None, UNMATCHED, {})
    if text.strip() != content.strip():
        return Confidence(None, UNMATCHED, {})
    starts: list[int] = []
    pos = 0
    for token in tokens:
        starts.append(pos)
        pos += len(token.data)
    fields: dict[str, float] = {}
    for path, cs, ce in spans:
        alts = alternatives(subschema(schema, path), schema)
        if alts is None:
            continue
        vs, ve = len(text[:cs].encode("utf-8")), len(text[:ce].encode("utf-8"))
        value = field_confidence(tokens, starts, out, (vs, ve), [a.encode("utf-8") for a in alts])
        if value is None:
            return Confidence(None, UNMATCHED, {})
        fields[field_label(path)] = value
    if not fields:  # the answer holds no choice value (an empty array, an absent optional field)
        return Confidence(None, NOT_APPLICABLE, {})
    return Confidence(math.prod(fields.values()), METHOD, fields)


SCORE = "score"  # every alternative scored by a request that forces it (see score_alternatives)

#: ``(answer prefix, alternative) → that alternative's tokens`` (``None``: the server gave none)
Scorer = Callable[[str, str], "Sequence[Token] | None"]


def score_alternatives(schema: Mapping[str, Any] | None, content: str, scorer: Scorer) -> Confidence:
    """The answer's confidence by scoring every alternative of every choice field.

    For a field whose value starts at character ``c``, ``scorer(content[:c], alt)`` runs one
    request that continues the answer prefix (an assistant prefill, served from the prompt
    cache) under a grammar admitting only ``alt``; the log-probabilities of the tokens that
    spell ``alt`` are summed. The field's confidence is the chosen value's share,
    ``exp(lp_chosen) / Σ exp(lp_alt)``: the whole value's probability, not its first token's,
    at one short request per alternative.
    """
    if schema is None or not has_choice_fields(schema):
        return Confidence(None, NOT_APPLICABLE, {})
    try:
        spans = scalars(content)
    except ValueError:
        return Confidence(None, UNMATCHED, {})
    fields: dict[str, float] = {}
    for path, cs, ce in spans:
        alts = alternatives(subschema(schema, path), schema)
        chosen = content[cs:ce]
        if alts is None:
            continue
        if chosen not in alts:
            return Confidence(None, UNMATCHED, {})
        logps: dict[str, float] = {}
        for alt in alts:
            tokens = scorer(content[:cs], alt)
            if tokens is None:
                return Confidence(None, UNAVAILABLE, {})
            if not b"".join(t.data for t in tokens).startswith(alt.encode("utf-8")):
                # the server did not force the alternative (it ignores ``grammar``: vLLM,
                # OpenAI): these are some other text's probabilities, not the alternative's
                return Confidence(None, UNMATCHED, {})
            end, pos, total = len(alt.encode("utf-8")), 0, 0.0
            for token in tokens:
                start, pos = pos, pos + len(token.data)
                if start < end:  # the alternative's own tokens, not an end-of-turn after them
                    total += token.logprob
            logps[alt] = total
        top = max(logps.values())
        if math.isinf(top):
            return Confidence(None, UNMATCHED, {})
        fields[field_label(path)] = math.exp(logps[chosen] - top) / sum(math.exp(v - top) for v in logps.values())
    if not fields:
        return Confidence(None, NOT_APPLICABLE, {})
    return Confidence(math.prod(fields.values()), SCORE, fields)
