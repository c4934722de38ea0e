"""A small GBNF interpreter: parse llama.cpp grammar text, sample random answers, recognize text.

It reads the GBNF that :mod:`localllm.grammar.compile` emits (and llama.cpp's usual
syntax: rules, literals, classes, groups, ``| * + ? {m} {m,} {m,n}``, ``.``), so tests can
check a grammar without a server: every :meth:`Grammar.sample` must validate against the
schema, and invalid probes must be rejected by :meth:`Grammar.matches`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

Node = tuple[Any, ...]
#: one GBNF token (after optional white space), its kind the group's name
TOKEN = re.compile(
    r'\s*(?:(?P<def>::=)|(?P<name>[A-Za-z0-9-]+)|(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])'
    r"|(?P<rep>\{\d+(?:,\d*)?\})|(?P<op>[()|*+?.])|(?P<comment>#[^\n]*))"
)
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
# characters worth trying for negated classes: ASCII, JSON specials, multi-byte code points
_POOL = [chr(c) for c in range(0x20, 0x7F)] + list("\t\n\r\x00\x1f\x7fé中😀\u2028")
_MAX_CP = 0x10FFFF


class GrammarSyntaxError(ValueError):
    """The text is not GBNF this interpreter understands (position and reason in the message)."""


def _unescape(body: str, where: int) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        kind = body[i + 1] if i + 1 < len(body) else ""
        width = {"x": 2, "u": 4, "U": 8}.get(kind)
        if width is not None:
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise GrammarSyntaxError(f"bad \\{kind} escape at {where + i}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif kind in _ESCAPES:
            out.append(_ESCAPES[kind])
            i += 2
        else:
            raise GrammarSyntaxError(f"unknown escape \\{kind} at {where + i}")
    return out


def _class(token: str, where: int) -> Node:
    body = token[1:-1]
    negated = body.startswith("^")
    if negated:
        body = body[1:]
    # Read one (possibly escaped) character at a time, as llama.cpp does: "-" makes a range
    # only when it is literally in the text, never when it came from an escape.
    items: list[tuple[str, bool]] = []
    i = 0
    while i < len(body):
        if body[i] == "\\":
            width = {"x": 2, "u": 4, "U": 8}.get(body[i + 1] if i + 1 < len(body) else "", 0)
            end = i + 2 + width
            items.append((_unescape(body[i:end], where + i)[0], False))
            i = end
        else:
            items.append((body[i], body[i] == "-"))
            i += 1
    ranges = []
    k = 0
    while k < len(items):
        if k + 2 < len(items) and items[k + 1][1]:
            ranges.append((ord(items[k][0]), ord(items[k + 2][0])))
            k += 3
        else:
            ranges.append((ord(items[k][0]), ord(items[k][0])))
            k += 1
    return ("cls", negated, tuple(ranges))


@dataclass
class Grammar:
    """Parsed GBNF: ``rules`` maps each name to its node; ``root`` is where text starts."""

    rules: dict[str, Node]
    root: str = "root"
    _rule_heights: dict[str, int] | None = field(default=None, repr=False)
    #: per character class: the pool characters it admits (sampling cache)
    _candidates: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, text: str) -> Grammar:
        tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise GrammarSyntaxError(f"unexpected {text[pos : pos + 20]!r} at {pos}")
            kind = m.lastgroup or ""
            if kind != "comment":
                tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        rules: dict[str, Node] = {}
        i = 0
        while i < len(tokens):
            if i + 1 >= len(tokens) or tokens[i][0] != "name" or tokens[i + 1][0] != "def":
                raise GrammarSyntaxError(f"expected 'name ::=' at {tokens[i][2]}")
            name = tokens[i][1]
            end = i + 2
            while end < len(tokens) and not (
                end + 1 < len(tokens) and tokens[end][0] == "name" and tokens[end + 1][0] == "def"
            ):
                end += 1
            node, used = _parse_alt(tokens[i + 2 : end], 0)
            if used != end - i - 2:
                raise GrammarSyntaxError(f"unbalanced ) in rule {name}")
            rules[name] = node
            i = end
        for node in rules.values():
            _check_refs(node, rules)
        if "root" not in rules:
            raise GrammarSyntaxError("no root rule")
        return cls(rules)

    # ------------------------------------------------------------------ sampling

    def sample(self, rng: random.Random, *, max_depth: int = 12, max_repeat: int = 4) -> str:
        """One random string of the language (deep recursion and long runs are cut short)."""
        if self._rule_heights is None:
            self._rule_heights = self._heights()
        walk = _Walk(self, rng, max_depth, max_repeat, self._rule_heights, self._candidates)
        walk.gen(("ref", self.root), 0)
        return "".join(walk.out)

    def first(self, *, max_depth: int = 12) -> str:
        """The deterministic walk: first alternatives, fewest repeats, lowest characters."""
        if self._rule_heights is None:
            self._rule_heights = self._heights()
        walk = _Walk(self, None, max_depth, 0, self._rule_heights, self._candidates)
        walk.gen(("ref", self.root), 0)
        return "".join(walk.out)

    def _heights(self) -> dict[str, int]:
        heights = {name: 10**9 for name in self.rules}
        changed = True
        while changed:
            changed = False
            for name, node in self.rules.items():
                h = _height(node, heights)
                if h < heights[name]:
                    heights[name] = h
                    changed = True
        return heights

    # ------------------------------------------------------------------ recognizing

    def matches(self, text: str) -> bool:
        """Is ``text`` (all of it) in the language?"""
        memo: dict[tuple[int, int], frozenset[int]] = {}
        return len(text) in self._ends(("ref", self.root), text, 0, memo)

    def _ends(self, node: Node, text: str, pos: int, memo: dict[tuple[int, int], frozenset[int]]) -> frozenset[int]:
        kind = node[0]
        if kind == "lit":
            return frozenset({pos + len(node[1])}) if text.startswith(node[1], pos) else frozenset()
        if kind in ("cls", "any"):
            if pos < len(text) and (kind == "any" or _in_class(node, text[pos])):
                return frozenset({pos + 1})
            return frozenset()
        if kind == "ref":
            key = (id(self.rules[node[1]]), pos)
            if key not in memo:
                memo[key] = frozenset()  # no left recursion in what we parse; guards loops
                memo[key] = self._ends(self.rules[node[1]], text, pos, memo)
            return memo[key]
        if kind == "seq":
            current = frozenset({pos})
            for item in node[1]:
                current = frozenset(e for p in current for e in self._ends(item, text, p, memo))
                if not current:
                    break
            return current
        if kind == "alt":
            return frozenset(e for o in node[1] for e in self._ends(o, text, pos, memo))
        _, inner, lo, hi = node
        reached: set[int] = {pos} if lo == 0 else set()
        frontier = {pos}
        count = 0
        while frontier and (hi is None or count < hi):
            nxt = {e for p in frontier for e in self._ends(inner, text, p, memo)}
            count += 1
            if count < lo:
                frontier = nxt
                continue
            new = nxt - reached
            reached |= nxt
            frontier = new if hi is None else nxt
        return frozenset(reached)


@dataclass
class _Walk:
    """One random walk: the choices it makes and the text it writes."""

    grammar: Grammar
    #: None: the deterministic walk of :meth:`Grammar.first`
    rng: random.Random | None
    max_depth: int
    max_repeat: int
    heights: dict[str, int]
    candidates: dict[int, list[str]]
    out: list[str] = field(default_factory=list)

    def height(self, node: Node) -> int:
        key = -id(node)  # shares the grammar's cache; class entries use positive ids
        cached = self.candidates.get(key)
        if cached is None:
            cached = self.candidates[key] = [str(_height(node, self.heights))]
        return int(cached[0])

    def gen(self, node: Node, depth: int) -> None:
        rng, out = self.rng, self.out
        kind = node[0]
        if kind == "lit":
            out.append(node[1])
        elif kind == "cls":
            out.append(_pick(node, rng, self.candidates) if rng else _lowest(node, self.candidates))
        elif kind == "any":
            out.append(rng.choice(_POOL) if rng else "a")
        elif kind == "ref":
            self.gen(self.grammar.rules[node[1]], depth + 1)
        elif kind == "seq":
            for item in node[1]:
                self.gen(item, depth)
        elif kind == "alt":
            options = node[1]
            if depth >= self.max_depth:
                hs = [self.height(o) for o in options]
                options = [o for o, h in zip(options, hs, strict=True) if h == min(hs)]
            self.gen(rng.choice(options) if rng else options[0], depth)
        elif kind == "rep":
            _, inner, lo, hi = node
            if depth >= self.max_depth or rng is None:
                count = lo
            elif hi is not None and hi - lo <= 50 and rng.random() < 0.2:
                count = hi
            else:
                top = lo + self.max_repeat if hi is None else min(hi, lo + self.max_repeat)
                count = rng.randint(lo, top)
            for _ in range(count):
                self.gen(inner, depth)


def _parse_alt(tokens: list[tuple[str, str, int]], i: int) -> tuple[Node, int]:
    options = []
    seq: list[Node] = []
    while i < len(tokens):
        kind, value, where = tokens[i]
        if kind == "op" and value == ")":
            break
        if kind == "op" and value == "|":
            options.append(("seq", tuple(seq)))
            seq = []
            i += 1
            continue
        if kind == "op" and value == "(":
            inner, i = _parse_alt(tokens, i + 1)
            if i >= len(tokens) or tokens[i][1] != ")":
                raise GrammarSyntaxError(f"unclosed ( at {where}")
            atom: Node = inner
            i += 1
        elif kind == "lit":
            atom = ("lit", "".join(_unescape(value[1:-1], where)))
            i += 1
        elif kind == "cls":
            atom = _class(value, where)
            i += 1
        elif kind == "name":
            atom = ("ref", value)
            i += 1
        elif kind == "op" and value == ".":
            atom = ("any",)
            i += 1
        else:
            raise GrammarSyntaxError(f"unexpected {value!r} at {where}")
        while i < len(tokens) and (tokens[i][0] == "rep" or tokens[i][1] in ("*", "+", "?")):
            token = tokens[i][1]
            if token == "*":
                atom = ("rep", atom, 0, None)
            elif token == "+":
                atom = ("rep", atom, 1, None)
            elif token == "?":
                atom = ("rep", atom, 0, 1)
            else:
                lo_s, _, hi_s = token[1:-1].partition(",")
                lo = int(lo_s)
                hi = lo if "," not in token else (int(hi_s) if hi_s else None)
                atom = ("rep", atom, lo, hi)
            i += 1
        seq.append(atom)
    options.append(("seq", tuple(seq)))
    return (options[0] if len(options) == 1 else ("alt", tuple(options))), i


def _check_refs(node: Node, rules: dict[str, Node]) -> None:
    kind = node[0]
    if kind == "ref" and node[1] not in rules:
        raise GrammarSyntaxError(f"undefined rule {node[1]}")
    if kind in ("seq", "alt"):
        for n in node[1]:
            _check_refs(n, rules)
    elif kind == "rep":
        _check_refs(node[1], rules)


def _height(node: Node, heights: dict[str, int]) -> int:
    kind = node[0]
    if kind in ("lit", "cls", "any"):
        return 0
    if kind == "ref":
        return heights[node[1]] + 1
    if kind == "seq":
        return max((_height(n, heights) for n in node[1]), default=0)
    if kind == "alt":
        return min(_height(n, heights) for n in node[1])
    return 0 if node[2] == 0 else _height(node[1], heights)


def _in_class(node: Node, c: str) -> bool:
    cp = ord(c)
    hit = any(lo <= cp <= hi for lo, hi in node[2])
    return hit is not bool(node[1])


def _lowest(node: Node, cache: dict[int, list[str]]) -> str:
    if not node[1]:
        return chr(min(lo for lo, _ in node[2]))
    candidates = cache.get(id(node))
    if candidates is None:
        candidates = cache[id(node)] = [c for c in _POOL if _in_class(node, c)]
    if not candidates:
        raise GrammarSyntaxError("empty character class")
    return candidates[0]


def _pick(node: Node, rng: random.Random, cache: dict[int, list[str]]) -> str:
    negated, ranges = node[1], node[2]
    if not negated and rng.random() < 0.8:
        lo, hi = rng.choice(ranges)
        for _ in range(20):
            cp = rng.randint(lo, hi)
            if not 0xD800 <= cp <= 0xDFFF:
                return chr(cp)
    candidates = cache.get(id(node))
    if candidates is None:
        candidates = cache[id(node)] = [c for c in _POOL if _in_class(node, c)]
    if candidates and rng.random() < 0.9:
        return rng.choice(candidates)
    for _ in range(200):
        cp = rng.randint(0, _MAX_CP)
        if not 0xD800 <= cp <= 0xDFFF and _in_class(node, chr(cp)):
            return chr(cp)
    if candidates:
        return rng.choice(candidates)
    raise GrammarSyntaxError("empty character class")
