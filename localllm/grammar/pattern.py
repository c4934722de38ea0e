"""``re.search(pattern, text)`` for JSON Schema ``pattern``s, in time linear in ``text``.

Python's ``re`` backtracks: ``^(a+)+$`` against ``"a" * 30 + "b"`` runs for minutes,
``^\\d*\\d*\\d*$`` is cubic, and ``a*b`` is quadratic in a search. ``re`` holds the GIL
while it runs, so no deadline fires and a whole process (a service's event loop too)
freezes on one answer a model chose. Answer validation therefore matches patterns here:

* the pattern is parsed by ``re``'s own parser, so the language is exactly ``re``'s
  (escapes, classes, ``\\d``/``\\w``/``\\s`` as Unicode, inline and scoped flags);
* each one-character item (a literal, a class, ``.``) is tested by a one-item ``re``
  pattern compiled with the item's flags, so character semantics are ``re``'s too;
* the structure (sequences, alternatives, repeats, groups) becomes a Thompson NFA that is
  run as a set of states, one step per character (cached as a lazy DFA), so the time is
  O(len(text) × NFA size) whatever the pattern: there is no backtracking to explode;
* anchors and ``\\b``/``\\B`` are checked as ``re`` checks them (``$`` also before a final
  newline; ``\\b`` never matches in an empty text); lookaheads and lookbehinds run as
  anchored sub-searches, memoised per position (at worst quadratic, never exponential).

Linear in the text is still text × pattern: one search may take :data:`WORK_BASE` +
:data:`WORK_PER_CHAR` × len(text) NFA steps (cache hits are free), then raises
:class:`PatternTooCostly` — callers fail the answer rather than run for minutes.

What has no linear-time equivalent — backreferences, conditionals ``(?(1)…)``, atomic groups
and possessive repeats (Python-only syntax) — and patterns whose counted repeats expand past
:data:`MAX_STATES` raise :class:`PatternUnsupported`; :func:`unsupported_reason` says which,
so schema checks refuse them up front (``localllm.grammar.compile.schema_problem``).
A pattern ``re`` cannot parse raises ``re.error``, as ``re.search`` does.

:func:`search_group` gives ``re.search(pattern, text).group(n)`` in linear time too (a Pike
VM: the NFA's threads in ``re``'s order of preference, each carrying the group's bounds).
It refuses, beside the above, a group inside a lookaround and any repeat whose body can
match the empty string: ``re`` ends such a repeat after a round that read nothing, and the
group that leaves depends on its backtracking order (``(a*)*`` on ``aa``: ``re`` gives ``""``,
a leftmost-first automaton ``"aa"``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typeshed types re's parser and compiler only under their old names
    import sre_compile as _compiler
    import sre_constants as _constants
    import sre_parse as _parser
else:
    from re import _compiler, _constants, _parser

__all__ = [
    "MAX_STATES",
    "WORK_BASE",
    "WORK_PER_CHAR",
    "PatternTooCostly",
    "PatternUnsupported",
    "search",
    "search_group",
    "unsupported_reason",
]

MAX_STATES = 20_000  # NFA states a pattern may expand to (each counted repeat is unrolled)
_CACHE_LIMIT = 500_000  # NFA states held in one pattern's lazy-DFA cache before it is flushed
#: NFA steps one search may take (cache hits are free): a base plus a share per character. A
#: 20,000-state repeat searched without an anchor costs its size per character until the
#: cache holds its states; beyond this the check fails (:class:`PatternTooCostly`) instead
#: of running for minutes
WORK_BASE, WORK_PER_CHAR = 1_000_000, 50
_CHAR_OPS = frozenset({_constants.LITERAL, _constants.NOT_LITERAL, _constants.ANY, _constants.IN})
_REPEATS = frozenset({_constants.MAX_REPEAT, _constants.MIN_REPEAT})  # lazy or greedy: the same language
_UNSUPPORTED = {
    _constants.GROUPREF: "a backreference",
    _constants.GROUPREF_EXISTS: "a conditional group (?(…)…)",
}
for _name, _what in (("ATOMIC_GROUP", "an atomic group (?>…)"), ("POSSESSIVE_REPEAT", "a possessive repeat")):
    if hasattr(_constants, _name):
        _UNSUPPORTED[getattr(_constants, _name)] = _what
_MULTILINE = _constants.SRE_FLAG_MULTILINE
_ASCII = _constants.SRE_FLAG_ASCII

# one state of the NFA: what it does, and where it goes (a _SPLIT's exits in re's order of
# preference); built for a group (search_group), _SAVE records the position as the group's
# start (test 0) or end (test 1)
_CHAR, _SPLIT, _AT, _LOOK, _MATCH, _SAVE = range(6)


class PatternUnsupported(ValueError):
    """The pattern has a construct that cannot be matched in linear time (the reason says which)."""


class PatternTooCostly(ValueError):
    """Checking this text against this pattern would take more than its share of NFA steps."""


class _Nfa:
    """Thompson NFA states in parallel lists; state 0 is the start. ``budget`` (one counter
    shared with the lookarounds' NFAs) caps the states of the whole pattern."""

    def __init__(self, budget: list[int]) -> None:
        self.kind: list[int] = []
        self.out: list[list[int]] = []
        self.test: list[Any] = []  # _CHAR: one-character matcher; _AT: assertion; _LOOK: (nfa, negate)
        self.accept = -1
        self.budget = budget

    def add(self, kind: int, out: list[int], test: Any = None) -> int:
        if self.budget[0] <= 0:
            raise PatternUnsupported(f"its repeats expand to more than {MAX_STATES:,} states")
        self.budget[0] -= 1
        self.kind.append(kind)
        self.out.append(out)
        self.test.append(test)
        return len(self.kind) - 1


class _Builder:
    """``re``'s parse tree → NFA states, built back to front (each item knows what follows it)."""

    def __init__(
        self, nfa: _Nfa, chars: dict[tuple[Any, str, int], Callable[[str], Any]], capture: int | None = None
    ) -> None:
        self.nfa = nfa
        self.looks = False
        self.chars = chars  # one compiled matcher per distinct item and flags (repeats unroll copies)
        self.capture = capture  # the group whose bounds _SAVE states record, if any
        self.saved = False

    def sequence(self, items: Any, flags: int, follow: int) -> int:
        for op, av in reversed(list(items)):
            follow = self.item(op, av, flags, follow)
        return follow

    def item(self, op: Any, av: Any, flags: int, follow: int) -> int:
        nfa = self.nfa
        if op in _CHAR_OPS:
            key = (op, repr(av), flags)
            if key not in self.chars:
                self.chars[key] = _one_char(op, av, flags)
            return nfa.add(_CHAR, [follow], self.chars[key])
        if op is _constants.SUBPATTERN:
            group, add, remove, body = av
            flags = (flags | add) & ~remove
            if group is not None and group == self.capture:
                self.saved = True
                end = nfa.add(_SAVE, [follow], 1)
                return nfa.add(_SAVE, [self.sequence(body, flags, end)], 0)
            return self.sequence(body, flags, follow)
        if op is _constants.BRANCH:
            return nfa.add(_SPLIT, [self.sequence(b, flags, follow) for b in av[1]])
        if op in _REPEATS:
            lo, hi, body = av
            lazy = op is _constants.MIN_REPEAT  # another round is re's second choice, not its first
            if self.capture is not None and hi > 1 and body.getwidth()[0] == 0:
                # re ends such a repeat after a round that read nothing, and which group
                # bounds that leaves depends on its backtracking order: no linear equivalent
                raise PatternUnsupported("a repeat whose body can match the empty string holds its group")
            if hi == _constants.MAXREPEAT:
                loop = nfa.add(_SPLIT, [])
                again = self.sequence(body, flags, loop)
                nfa.out[loop] = [follow, again] if lazy else [again, follow]
                tail = loop
            else:
                tail = follow
                for _ in range(hi - lo):  # (x(x(x)?)?)?
                    again = self.sequence(body, flags, tail)
                    tail = nfa.add(_SPLIT, [follow, again] if lazy else [again, follow])
            for _ in range(lo):
                tail = self.sequence(body, flags, tail)
            return tail
        if op is _constants.AT:
            return nfa.add(_AT, [follow], _assertion(av, flags))
        if op in (_constants.ASSERT, _constants.ASSERT_NOT):
            direction, body = av
            sub = _build(body, flags, nfa.budget, self.chars)
            self.looks = True
            width = body.getwidth()[0] if direction < 0 else 0
            return nfa.add(_LOOK, [follow], (sub, op is _constants.ASSERT_NOT, width))
        raise PatternUnsupported(f"it uses {_UNSUPPORTED.get(op, op)}")


def _build(
    tree: Any,
    flags: int,
    budget: list[int],
    chars: dict[tuple[Any, str, int], Callable[[str], Any]],
    capture: int | None = None,
) -> _Matcher:
    nfa = _Nfa(budget)
    start = nfa.add(_SPLIT, [])
    builder = _Builder(nfa, chars, capture)
    nfa.accept = nfa.add(_MATCH, [])
    nfa.out[start] = [builder.sequence(tree, flags, nfa.accept)]
    if capture is not None and not builder.saved:
        raise PatternUnsupported(f"its group {capture} is inside a lookaround")
    return _Matcher(nfa, cacheable=not builder.looks)


def _one_char(op: Any, av: Any, flags: int) -> Callable[[str], Any]:
    """A matcher for one character, compiled by ``re`` itself from this one parse item."""
    state = _parser.State()
    state.flags = flags
    return _compiler.compile(_parser.SubPattern(state, [(op, av)]), flags).fullmatch


def _word(flags: int) -> Callable[[str], Any]:
    return re.compile(r"\w", flags & _ASCII).fullmatch


def _assertion(code: Any, flags: int) -> tuple[str, Any]:
    """An anchor as (name, word matcher or None), after ``re``'s own flag rules."""
    at = _constants
    if code is at.AT_BEGINNING:
        return ("bol" if flags & _MULTILINE else "bos", None)
    if code is at.AT_BEGINNING_STRING:
        return ("bos", None)
    if code is at.AT_END:
        return ("eol" if flags & _MULTILINE else "eoz", None)
    if code is at.AT_END_STRING:
        return ("eos", None)
    if code is at.AT_BOUNDARY:
        return ("b", _word(flags))
    if code is at.AT_NON_BOUNDARY:
        return ("B", _word(flags))
    raise PatternUnsupported(f"it uses the anchor {code}")


def _holds(assertion: tuple[str, Any], text: str, i: int) -> bool:
    name, word = assertion
    n = len(text)
    if name == "bos":
        return i == 0
    if name == "bol":
        return i == 0 or text[i - 1] == "\n"
    if name == "eos":
        return i == n
    if name == "eoz":
        return i == n or (i == n - 1 and text[i] == "\n")
    if name == "eol":
        return i == n or text[i] == "\n"
    if n == 0:  # \b and \B both fail in an empty text, as in re
        return False
    before = i > 0 and word(text[i - 1]) is not None
    after = i < n and word(text[i]) is not None
    return (before != after) == (name == "b")


class _Matcher:
    """Runs one NFA over a text: a set of states per position, cached as a lazy DFA.

    A DFA state is the frozenset of character-reading (and accepting) NFA states; the cache
    maps (states, anchor context) to its closure and (closure, character) to the next states,
    the restart of an unanchored search included. Lookarounds depend on the whole text, so an
    NFA with one is run uncached."""

    def __init__(self, nfa: _Nfa, *, cacheable: bool) -> None:
        self.nfa = nfa
        self.cacheable = cacheable
        self.asserts = sorted({t for k, t in zip(nfa.kind, nfa.test, strict=True) if k == _AT}, key=repr)
        # with only start/end anchors, every position but the first and the last two has one context
        self.middle = (
            None if any(a[0] in ("bol", "eol", "b", "B") for a in self.asserts) else (False,) * len(self.asserts)
        )
        self.closures: dict[tuple[frozenset[int], tuple[bool, ...]], frozenset[int]] = {}
        self.steps: tuple[dict[tuple[frozenset[int], str], frozenset[int]], ...] = ({}, {})  # [anchored]
        self.held = 0  # NFA states in the cached sets

    def remember(self, cache: dict[Any, frozenset[int]], key: Any, result: frozenset[int]) -> None:
        if self.held + len(result) > _CACHE_LIMIT:
            self.closures.clear()
            for steps in self.steps:
                steps.clear()
            self.held = 0
        cache[key] = result
        self.held += len(result)

    def context(self, text: str, i: int) -> tuple[bool, ...]:
        if self.middle is not None and 0 < i < len(text) - 1:
            return self.middle
        return tuple([_holds(a, text, i) for a in self.asserts])

    def closure(
        self,
        states: frozenset[int],
        context: tuple[bool, ...],
        text: str,
        i: int,
        *,
        looks: dict[tuple[int, int], bool],
        work: list[int],
    ) -> frozenset[int]:
        """The character-reading and accepting states reachable from ``states`` at position ``i``."""
        nfa = self.nfa
        holds = dict(zip(self.asserts, context, strict=True))
        seen: set[int] = set()
        found: set[int] = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            kind = nfa.kind[s]
            if kind in (_CHAR, _MATCH):
                found.add(s)
            elif (
                kind in (_SPLIT, _SAVE)
                or (kind == _AT and holds[nfa.test[s]])
                or (kind == _LOOK and self.look(s, text, i, looks, work))
            ):
                stack.extend(nfa.out[s])
        _spend(work, len(seen), text)
        result = frozenset(found)
        if self.cacheable:
            self.remember(self.closures, (states, context), result)
        return result

    def look(self, s: int, text: str, i: int, looks: dict[tuple[int, int], bool], work: list[int]) -> bool:
        key = (s, i)
        if key not in looks:
            sub, negate, width = self.nfa.test[s]
            start = i - width
            found = start >= 0 and sub.run(text, start, anchored=True, work=work)
            looks[key] = found != negate
        return looks[key]

    def step(self, closed: frozenset[int], c: str, anchored: bool, text: str, work: list[int]) -> frozenset[int]:
        _spend(work, len(closed), text)
        nfa = self.nfa
        result = frozenset(nfa.out[s][0] for s in closed if nfa.kind[s] == _CHAR and nfa.test[s](c) is not None)
        if not anchored:
            result |= _START
        if self.cacheable:
            self.remember(self.steps[anchored], (closed, c), result)
        return result

    def run(self, text: str, begin: int = 0, *, anchored: bool = False, work: list[int] | None = None) -> bool:
        """Does a match start at ``begin`` (anchored) or anywhere from ``begin`` on? ``work``
        is the steps left (shared with lookarounds' sub-searches)."""
        work = work if work is not None else [WORK_BASE + WORK_PER_CHAR * len(text)]
        accept = self.nfa.accept
        looks: dict[tuple[int, int], bool] = {}
        closures = self.closures if self.cacheable else {}
        steps = self.steps[anchored] if self.cacheable else {}
        states = _START
        n = len(text)
        for i in range(begin, n + 1):
            context = self.context(text, i) if self.asserts else ()
            closed = closures.get((states, context))
            if closed is None:
                closed = self.closure(states, context, text, i, looks=looks, work=work)
            if accept in closed:
                return True
            if i == n:
                break
            c = text[i]
            cached = steps.get((closed, c))
            states = cached if cached is not None else self.step(closed, c, anchored, text, work)
            if not states:
                return False
        return False

    def capture(self, text: str, work: list[int]) -> tuple[int, int] | None:
        """The bounds of the captured group in the match ``re.search`` finds ((-1, -1) when the
        group takes no part in it), or None when nothing matches.

        A Pike VM: the threads at a position are kept in ``re``'s order of preference, each
        with its group bounds; a state reached by a preferred thread is not entered again, so
        the work per character is bounded by the NFA's size. The first thread to accept
        drops every less preferred one; a new thread starts at each position, least
        preferred, until something has matched (the leftmost match wins)."""
        nfa = self.nfa
        looks: dict[tuple[int, int], bool] = {}

        def enter(state: int, bounds: tuple[int, int], i: int) -> None:
            # the reading and accepting states reached from state at i, in order of preference
            stack = [(state, bounds)]
            while stack:
                s, at = stack.pop()
                if s in seen:
                    continue
                seen.add(s)
                kind = nfa.kind[s]
                if kind in (_CHAR, _MATCH):
                    threads.append((s, at))
                elif kind == _SPLIT:
                    stack.extend((o, at) for o in reversed(nfa.out[s]))
                elif kind == _SAVE:
                    stack.append((nfa.out[s][0], (i, -1) if nfa.test[s] == 0 else (at[0], i)))
                elif (kind == _AT and _holds(nfa.test[s], text, i)) or (
                    kind == _LOOK and self.look(s, text, i, looks, work)
                ):
                    stack.append((nfa.out[s][0], at))

        pending: list[tuple[int, tuple[int, int]]] = []
        found: tuple[int, int] | None = None
        n = len(text)
        for i in range(n + 1):
            threads: list[tuple[int, tuple[int, int]]] = []
            seen: set[int] = set()
            for state, bounds in pending:
                enter(state, bounds, i)
            if found is None:
                enter(0, (-1, -1), i)
            _spend(work, len(seen), text)
            pending = []
            for state, bounds in threads:
                if nfa.kind[state] == _MATCH:
                    found = bounds
                    break
                if i < n and nfa.test[state](text[i]) is not None:
                    pending.append((nfa.out[state][0], bounds))
            if not pending and (found is not None or i == n):
                break
        return found


_START = frozenset({0})


def _spend(work: list[int], steps: int, text: str) -> None:
    work[0] -= steps
    if work[0] < 0:
        raise PatternTooCostly(
            f"checking {len(text):,} characters against it takes more than "
            f"{WORK_BASE + WORK_PER_CHAR * len(text):,} NFA steps"
        )


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> _Matcher:
    tree = _parser.parse(pattern, 0)  # re.error for what re cannot parse, as re.search raises
    try:
        return _build(tree, tree.state.flags, [MAX_STATES], {})
    except RecursionError:
        raise PatternUnsupported("it nests groups too deeply") from None


def search(pattern: str, text: str, *, fallback: bool = False) -> bool:
    """``re.search(pattern, text) is not None``, in O(len(text) × pattern size) time.

    Raises ``re.error`` when ``re`` cannot parse ``pattern`` and :class:`PatternUnsupported`
    for a construct with no linear-time match (see :func:`unsupported_reason`) — unless
    ``fallback``, for callers whose schemas were checked already: then ``re`` decides those."""
    try:
        return _compiled(pattern).run(text)
    except PatternUnsupported:
        if not fallback:
            raise
        return re.search(pattern, text) is not None


@functools.lru_cache(maxsize=64)
def _capturing(pattern: str, number: int) -> _Matcher:
    tree = _parser.parse(pattern, 0)
    if not 0 < number < tree.state.groups:
        raise IndexError("no such group")
    try:
        return _build(tree, tree.state.flags, [MAX_STATES], {}, capture=number)
    except RecursionError:
        raise PatternUnsupported("it nests groups too deeply") from None


def search_group(pattern: str, text: str, number: int = 1, *, fallback: bool = False) -> str | None:
    """``re.search(pattern, text)``'s ``group(number)`` (None when nothing matches or the group
    takes no part in the match), in O(len(text) × pattern size) time: the leftmost match,
    and in it the choices ``re`` prefers (greedy or lazy repeats, alternatives in order).

    Raises what :func:`search` raises, :class:`PatternUnsupported` also for a group inside a
    lookaround, and ``IndexError`` for a group the pattern does not have (as ``re`` does).
    With ``fallback``, ``re`` extracts what has no linear answer, but only from a text
    :func:`search` found to match: never the near miss where backtracking explodes."""
    try:
        matcher = _capturing(pattern, number)
    except PatternUnsupported:
        if not fallback:
            raise
        found = re.search(pattern, text) if search(pattern, text, fallback=True) else None
        return found.group(number) if found is not None else None
    bounds = matcher.capture(text, [WORK_BASE + WORK_PER_CHAR * len(text)])
    if bounds is None or bounds[1] < 0:
        return None
    return text[bounds[0] : bounds[1]]


def unsupported_reason(pattern: str) -> str | None:
    """Why :func:`search` cannot match ``pattern`` in linear time, or None (also None when
    ``re`` cannot parse it: that is ``re.error``'s to report)."""
    try:
        _compiled(pattern)
    except PatternUnsupported as exc:
        return str(exc)
    except (re.error, RecursionError, OverflowError):
        return None
    return None
