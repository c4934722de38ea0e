"""Patterns as automata over code points, intersected by the product construction.

The compiler reads a ``pattern`` into a small regex tree (``("set", ranges)``, ``("cat",
[…])``, ``("alt", […])``, ``("rep", node, lo, hi)``); two patterns on one string (an ``allOf``
of them, or a pattern beside a negated literal search) have no regex for both, but their
automata do: :func:`intersection` runs the patterns' Thompson NFAs side by side, one
determinised set of states each, with a length counter for ``minLength``/``maxLength``, and
keeps the states from which an accepting one is still reachable. A pattern may also be
negated (``not`` of a pattern): its determinised set then accepts where it does not match,
which is only as exact as the tree's reading of the pattern (the caller reads it exactly). Each resulting state reads
one character and moves deterministically, so as a grammar (one rule per state) the engine
holds a single parse stack per position.

Each tree's language is the compiler's reading of the pattern (a subset of what ``re``
matches: ``\\d`` as ASCII digits, ``$`` at the very end only), so the product admits only
strings every pattern matches. ``^`` and ``$`` inside a pattern (``(/|$)``) are moves taken
only before the first character and only after the last. A product larger than its cap raises :class:`TooLarge`
(the caller refuses the schema, naming the cap) rather than growing a grammar without bound.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["WORK", "Branch", "Dfa", "TooLarge", "complement", "intersect", "intersection", "normalize"]

#: NFA states built and visited while determinising, by default (about a second of work)
WORK = 2_000_000
#: how many times its state limit a product may grow to before it is minimised
BUILD_FACTOR = 8
#: the work one character span of one product state costs, in NFA states visited (about as
#: long: a class of many ranges cuts many spans, each read on its own)
SPAN_WORK = 3

Ranges = tuple[tuple[int, int], ...]
#: one top-level alternative of a pattern: (anchored at the start, at the end, body tree)
Branch = tuple[bool, bool, tuple[Any, ...]]
#: a product state: one closed set of NFA states per pattern, and the length read (capped)
_Key = tuple[tuple[frozenset[int], ...], int]


class TooLarge(Exception):
    """Building the automaton would pass ``limit`` (of states or of steps: the message says)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class Dfa:
    """States 0..n-1 (0 is the start); ``moves[s]`` are (code point ranges, next state) with
    disjoint ranges; every state can still reach an accepting one."""

    accepting: tuple[bool, ...]
    moves: tuple[tuple[tuple[Ranges, int], ...], ...]


class _Nfa:
    def __init__(self, limit: int) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[Ranges, int]]] = []
        #: moves without reading that hold only before the first character (``^``) or
        #: after the last (``$``): an anchor inside the pattern
        self.asserts: dict[str, list[list[int]]] = {"bol": [], "eol": []}
        self.anchored_end = False  # has a "$" move (most patterns have none)
        self.limit = limit
        #: each class's ranges within the universe, by the tree's node (a counted repeat
        #: unrolls the same node again and again; the tree lives as long as the build): one
        #: tuple for all its edges, which :func:`intersection` groups by identity
        self.clipped: dict[int, Ranges] = {}

    def state(self) -> int:
        if len(self.eps) >= self.limit:
            raise TooLarge(f"a pattern's automaton needs more than {self.limit:,} states", self.limit)
        self.eps.append([])
        self.edges.append([])
        for moves in self.asserts.values():
            moves.append([])
        return len(self.eps) - 1

    def fragment(self, node: tuple[Any, ...], start: int, universe: Ranges) -> int:
        """States for ``node`` entered at ``start``; its end state. Loops and alternatives
        start at fresh states, so ``start`` gains only outgoing moves."""
        kind = node[0]
        if kind == "set":
            end = self.state()
            ranges = self.clipped.get(id(node))
            if ranges is None:
                ranges = self.clipped[id(node)] = _clip(node[1], universe)
            if ranges:
                self.edges[start].append((ranges, end))
            return end
        if kind == "cat":
            for item in node[1]:
                start = self.fragment(item, start, universe)
            return start
        if kind == "alt":
            end = self.state()
            for branch in node[1]:
                entry = self.state()
                self.eps[start].append(entry)
                self.eps[self.fragment(branch, entry, universe)].append(end)
            return end
        if kind == "rep":
            _, body, lo, hi = node
            for _ in range(lo):
                start = self.fragment(body, start, universe)
            if hi is None:
                loop = self.state()
                self.eps[start].append(loop)
                self.eps[self.fragment(body, loop, universe)].append(loop)
                return loop
            end = self.state()
            for _ in range(hi - lo):
                self.eps[start].append(end)
                start = self.fragment(body, start, universe)
            self.eps[start].append(end)
            return end
        if kind in self.asserts:
            end = self.state()
            self.asserts[kind][start].append(end)
            self.anchored_end = self.anchored_end or kind == "eol"
            return end
        raise ValueError(f"no automaton for the regex node {kind!r}")

    def closure(self, states: set[int] | frozenset[int], work: list[int], anchor: str = "") -> frozenset[int]:
        """The states ``states`` reach without reading — also through ``anchor``'s moves
        (``"bol"`` before the first character, ``"eol"`` after the last); the states visited
        are taken from ``work`` (the steps left to the whole construction)."""
        eps, more = self.eps, self.asserts[anchor] if anchor else None
        seen = set(states)
        stack = list(states)
        while stack:
            q = stack.pop()
            for t in eps[q] if more is None else eps[q] + more[q]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        work[0] -= len(seen)
        if work[0] < 0:
            raise TooLarge(f"determinising patterns visits more than {work[1]:,} states in one schema", work[1])
        return frozenset(seen)

    def ends(self, states: frozenset[int], work: list[int]) -> frozenset[int]:
        """``states`` and, when the text ends there, what they reach through its ``$``s."""
        if not self.anchored_end or not any(self.asserts["eol"][q] for q in states):
            return states
        return self.closure(states, work, "eol")


def complement(
    ranges: Iterable[tuple[int, int]], universe: Iterable[tuple[int, int]] = ((0, 0x10FFFF),)
) -> list[tuple[int, int]]:
    """The code points of ``universe`` (all of Unicode by default) not in ``ranges``."""
    inside = normalize(ranges)
    out = []
    for ulo, uhi in universe:
        cur = ulo
        for lo, hi in inside:
            if hi < cur or lo > uhi:
                continue
            if lo > cur:
                out.append((cur, lo - 1))
            cur = max(cur, hi + 1)
        if cur <= uhi:
            out.append((cur, uhi))
    return normalize(out)


def normalize(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Code point ranges sorted, overlapping and adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def intersect(a: Iterable[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The code points in both ``a`` and ``b``, as :func:`normalize` leaves them."""
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return normalize(out)


def _clip(ranges: Sequence[tuple[int, int]], universe: Ranges) -> Ranges:
    return tuple(intersect(ranges, universe))


def _pattern_nfa(branches: Sequence[Branch], universe: Ranges, limit: int) -> tuple[_Nfa, int]:
    """One pattern's NFA (start state 0) and its accepting state: an unanchored side reads
    any characters of ``universe`` (a search finds the match anywhere)."""
    nfa = _Nfa(limit)
    start = nfa.state()
    accept = nfa.state()
    anything = ("rep", ("set", universe), 0, None)
    for at_start, at_end, body in branches:
        s = nfa.state()
        nfa.eps[start].append(s)
        if not at_start:
            s = nfa.fragment(anything, s, universe)
        s = nfa.fragment(body, s, universe)
        if not at_end:
            s = nfa.fragment(anything, s, universe)
        nfa.eps[s].append(accept)
    return nfa, accept


def _covers(ranges: Ranges, lo: int) -> bool:
    """Is the code point ``lo`` in ``ranges`` (sorted)?"""
    i = bisect.bisect_right(ranges, (lo, 0x7FFFFFFF)) - 1
    return i >= 0 and ranges[i][0] <= lo <= ranges[i][1]


def intersection(
    patterns: Sequence[Sequence[Branch]],
    universe: Ranges,
    *,
    lo: int = 0,
    hi: int | None = None,
    limit: int,
    nfa_limit: int,
    work: list[int] | None = None,
    negated: Sequence[bool] = (),
) -> Dfa | None:
    """The strings of ``universe``'s characters that every pattern matches — every one
    ``negated`` marks, none matches — and whose length is ``lo``..``hi``, as a trimmed and
    minimal DFA; None when there is none. (A negated pattern's tree must read exactly what ``re`` finds:
    its complement is only as exact as that.) Raises :class:`TooLarge`
    past ``limit`` product states, ``nfa_limit`` states of one pattern's NFA or the NFA states
    ``work`` (steps left, their limit: shared by every intersection of one compilation, so
    it bounds their time together) allows to build and visit. ``limit`` is on the minimal
    DFA; the product is built up to :data:`BUILD_FACTOR` times as many states before it is
    minimised (``email`` within 20 characters: over 1,000 built, 154 minimal)."""
    steps = work if work is not None else [WORK, WORK]
    built = [_pattern_nfa(p, universe, nfa_limit) for p in patterns]
    steps[0] -= sum(len(nfa.eps) for nfa, _ in built)
    negate = [i < len(negated) and negated[i] for i in range(len(built))]
    bounds = {b for a, z in universe for b in (a, z + 1)}
    count_cap = hi if hi is not None else lo
    start: _Key = (tuple(nfa.closure({0}, steps, "bol") for nfa, _ in built), 0)
    index: dict[_Key, int] = {start: 0}
    keys: list[_Key] = [start]
    accepting: list[bool] = []
    moves: list[list[tuple[Ranges, int]]] = []
    done = 0
    while done < len(keys):
        sets, count = keys[done]
        done += 1
        accepting.append(
            count >= lo
            and all((acc in nfa.ends(s, steps)) != neg for (nfa, acc), s, neg in zip(built, sets, negate, strict=True))
        )
        out: list[tuple[Ranges, int]] = []
        moves.append(out)
        if hi is not None and count >= hi:
            continue
        # each pattern's moves, grouped by class: (ranges, the states they reach)
        edges = [_grouped(nfa, s) for (nfa, _), s in zip(built, sets, strict=True)]
        if any(not e and not neg for e, neg in zip(edges, negate, strict=True)):
            continue
        # a negated pattern that can no longer match allows every character: the universe's
        # bounds cut too
        cuts = sorted(bounds | {b for es in edges for ranges, _ in es for a, z in ranges for b in (a, z + 1)})
        targets: dict[_Key, list[tuple[int, int]]] = {}
        # each character span is work too (a class of many ranges cuts many; each span is
        # looked up in each class of the states' moves), and the spans that reach the same
        # states share one closure
        steps[0] -= len(cuts) * sum(max(SPAN_WORK, len(es) // 3) for es in edges)
        if steps[0] < 0:  # a closure checks too, but the spans may all reach sets already closed
            raise TooLarge(f"determinising patterns visits more than {steps[1]:,} states in one schema", steps[1])
        covering = [_covering(es, cuts) for es in edges]
        read: list[dict[tuple[int, ...], frozenset[int]]] = [{} for _ in built]  # classes → states
        closed: list[dict[frozenset[int], frozenset[int]]] = [{} for _ in built]
        for span, (a, z) in enumerate(itertools.pairwise(cuts)):
            if not _covers(universe, a):
                continue
            nexts = []
            for (nfa, _), es, cover, neg, by_class, memo in zip(
                built, edges, covering, negate, read, closed, strict=True
            ):
                classes = tuple(cover[span])
                reached = by_class.get(classes)
                if reached is None:
                    reached = by_class[classes] = frozenset(t for i in classes for t in es[i][1])
                if not reached and not neg:
                    break
                if reached not in memo:
                    memo[reached] = nfa.closure(reached, steps) if reached else frozenset()
                nexts.append(memo[reached])
            else:
                key: _Key = (tuple(nexts), min(count + 1, count_cap))
                spans = targets.setdefault(key, [])
                if spans and spans[-1][1] + 1 == a:
                    spans[-1] = (spans[-1][0], z - 1)
                else:
                    spans.append((a, z - 1))
        for key, spans in targets.items():
            if key not in index:
                if len(keys) >= limit * BUILD_FACTOR:
                    raise TooLarge(f"the intersection of the patterns needs more than {limit:,} states", limit)
                index[key] = len(keys)
                keys.append(key)
            out.append((tuple(spans), index[key]))
    trimmed = _trimmed(accepting, moves)
    if trimmed is None:
        return None
    minimal = _minimal(trimmed)
    if len(minimal.accepting) > limit:
        raise TooLarge(f"the intersection of the patterns needs more than {limit:,} states", limit)
    return minimal


def _grouped(nfa: _Nfa, states: frozenset[int]) -> list[tuple[Ranges, list[int]]]:
    """The moves out of ``states``, one entry per class (the states it reaches), in the
    order first met: a set of hundreds of states (``.{15,29}``, ``\\p{L}{9,49}``) reads a few
    classes, each looked up once per character span, not once per move (a 200-byte schema's
    product took 39 s of its one-second budget)."""
    groups: dict[int, tuple[Ranges, list[int]]] = {}
    for q in states:
        for ranges, t in nfa.edges[q]:
            group = groups.get(id(ranges))
            if group is None:
                group = groups[id(ranges)] = (ranges, [])
            group[1].append(t)
    return list(groups.values())


def _covering(groups: Sequence[tuple[Ranges, list[int]]], cuts: Sequence[int]) -> list[list[int]]:
    """For each span between two of ``cuts`` (which hold both ends of every range), the
    classes of ``groups`` that read it, in order: one pass over each class's ranges and the
    spans they cover, instead of a lookup in every class for every span."""
    where = {cut: i for i, cut in enumerate(cuts)}
    covered: list[list[int]] = [[] for _ in range(len(cuts) - 1)]
    for i, (ranges, _) in enumerate(groups):
        for lo, hi in ranges:
            for span in range(where[lo], where[hi + 1]):
                covered[span].append(i)
    return covered


def _predecessors(moves: Sequence[Sequence[tuple[Ranges, int]]]) -> list[list[int]]:
    """For each state, the states that move to it."""
    back: list[list[int]] = [[] for _ in moves]
    for s, out in enumerate(moves):
        for _, t in out:
            back[t].append(s)
    return back


def _trimmed(accepting: list[bool], moves: list[list[tuple[Ranges, int]]]) -> Dfa | None:
    """Only the states from which an accepting state can be reached (renumbered, the start
    first); None when the start cannot reach one."""
    back = _predecessors(moves)
    live = {s for s, acc in enumerate(accepting) if acc}
    stack = list(live)
    while stack:
        for s in back[stack.pop()]:
            if s not in live:
                live.add(s)
                stack.append(s)
    if 0 not in live:
        return None
    order = sorted(live)
    number = {s: i for i, s in enumerate(order)}
    return Dfa(
        accepting=tuple(accepting[s] for s in order),
        moves=tuple(tuple((r, number[t]) for r, t in moves[s] if t in live) for s in order),
    )


def _minimal(dfa: Dfa) -> Dfa:
    """``dfa`` with equivalent states merged: partition refinement from accepting/not in which
    only a state one of whose next states changed class is looked at again (its signature:
    the ranges to each class it moves to). A class that splits keeps its largest part, so a
    state changes class at most log n times and a long chain of states takes a few steps per
    link, not (as Moore's rounds over every state would) a round per link."""
    back = _predecessors(dfa.moves)
    classes = [int(a) for a in dfa.accepting]
    members: list[set[int]] = [set(), set()]
    for s, c in enumerate(classes):
        members[c].add(s)
    signature: list[tuple[Any, ...]] = [()] * len(classes)
    # invariant: a state not in dirty has its signature; those of one class share it
    dirty: dict[int, set[int]] = {c: set(m) for c, m in enumerate(members) if m}
    while dirty:
        c, looked = dirty.popitem()
        for s in looked:
            merged: dict[int, list[tuple[int, int]]] = {}
            for ranges, t in dfa.moves[s]:
                merged.setdefault(classes[t], []).extend(ranges)
            signature[s] = tuple(sorted((_joined(r), k) for k, r in merged.items()))
        groups: dict[tuple[Any, ...], set[int]] = {}
        if len(members[c]) > len(looked):
            # the states not looked at, as one group (found by what they are not)
            groups[signature[next(s for s in members[c] if s not in looked)]] = set()
        for s in looked:
            groups.setdefault(signature[s], set()).add(s)
        if len(groups) == 1:
            continue
        unlooked = len(members[c]) - len(looked)
        leading = next(iter(groups))
        sizes = {sig: len(g) + (unlooked if sig == leading else 0) for sig, g in groups.items()}
        keep = max(sizes, key=sizes.__getitem__)
        moved: list[int] = []
        for sig, looked_part in groups.items():
            if sig == keep:
                continue
            group = looked_part
            if sig == leading and unlooked:
                group = {s for s in members[c] if s not in looked or signature[s] == sig}
            members[c] -= group
            members.append(group)
            for s in group:
                classes[s] = len(members) - 1
            moved.extend(group)
        for s in moved:
            for p in back[s]:
                dirty.setdefault(classes[p], set()).add(p)
    # the start's class first, the others in order of their first state
    order: dict[int, int] = {}
    for c in [classes[0], *classes]:
        order.setdefault(c, len(order))
    first: dict[int, int] = {}
    for s, c in enumerate(classes):
        first.setdefault(order[c], s)
    moves_out = []
    for k in range(len(order)):
        merged = {}
        for ranges, t in dfa.moves[first[k]]:
            merged.setdefault(order[classes[t]], []).extend(ranges)
        moves_out.append(tuple((_joined(r), t) for t, r in merged.items()))
    return Dfa(accepting=tuple(dfa.accepting[first[k]] for k in range(len(order))), moves=tuple(moves_out))


def _joined(ranges: list[tuple[int, int]]) -> Ranges:
    return tuple(normalize(ranges))
