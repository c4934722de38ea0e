"""JSON Schema ``pattern`` search, as ECMA-262 reads the pattern, in time linear in the text.

Python's ``re`` backtracks: ``^(a+)+$`` against ``"a" * 30 + "b"`` runs for minutes,
``^\\d*\\d*\\d*$`` is cubic, and ``a*b`` is quadratic in a search. ``re`` holds the GIL
while it runs, so no deadline fires and a whole process (a service's event loop too)
freezes on one answer a model chose. Answer validation therefore matches patterns here:

* ECMA-262's syntax that ``re`` lacks (``\\cX``, ``\\p{L}``, ``(?<name>…)``, ``[^]``, ...) is
  first rewritten into what ``re`` parses (:func:`python_pattern`); the pattern is then parsed
  by ``re``'s own parser (what it cannot parse raises ``re.error``), and read as ECMA-262
  reads it, JSON Schema's dialect
  (:func:`_ecma`): ``\\d``, ``\\w`` and ``\\b``'s word characters ASCII, ``\\s`` ECMA's
  white space and line terminators, ``.`` no line terminator, ``$`` the very end (``re``
  reads the classes as Unicode and ``$`` also before a final newline); Python-only syntax
  (inline flags, ``\\Z``) as ``re`` reads it;
* each one-character item (a literal, a class, ``.``) is tested by a one-item ``re``
  pattern compiled with the item's flags;
* the structure (sequences, alternatives, repeats, groups) becomes a Thompson NFA that is
  run as a set of states, one step per character (cached as a lazy DFA), so the time is
  O(len(text) × NFA size) whatever the pattern: there is no backtracking to explode;
* anchors are checked as ECMA-262 checks them; lookaheads and lookbehinds run as anchored
  sub-searches (a variable-width lookbehind's body built right to left and run over the
  reversed text), memoised per position (at worst quadratic, never exponential).

Linear in the text is still text × pattern: one search may take :data:`WORK_BASE` +
:data:`WORK_PER_CHAR` × len(text) NFA steps (a cached step costs one), then raises
:class:`PatternTooCostly` — callers fail the answer rather than run for minutes.

What has no linear-time equivalent — backreferences, conditionals ``(?(1)…)``, atomic groups
and possessive repeats (Python-only syntax), a lookaround inside a variable-width lookbehind —
and patterns whose counted repeats expand past :data:`MAX_STATES` raise
:class:`PatternUnsupported`; :func:`unsupported_reason` says which, so schema checks refuse
them up front (``localllm.grammar.compile.schema_problem``); with ``fallback``,
:func:`ecma_regex` (``re`` on the same ECMA reading) decides them. A variable-width lookbehind
(ES2018), which ``re`` cannot compile, runs its body backwards over the reversed text.
Building an NFA costs ~2.5 µs a state, so a schema's distinct patterns may expand to
:data:`MAX_SCHEMA_STATES` in all (``schema_problem`` again), and what is built (or why
nothing could be) is kept by its states (:data:`_BUILT`): a schema's patterns stay built while
its answers are checked.

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
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localllm.grammar.kept import Kept

if TYPE_CHECKING:  # typeshed types re's parser and compiler only under their old names
    import sre_compile as _compiler
    import sre_constants as _constants
    import sre_parse as _parser
else:
    from re import _compiler, _constants, _parser

__all__ = [
    "ECMA_DIGIT",
    "ECMA_LINE_TERMINATORS",
    "ECMA_SPACE",
    "ECMA_WORD",
    "MAX_PROPERTY_RANGES",
    "MAX_SCHEMA_PROPERTY_RANGES",
    "MAX_SCHEMA_STATES",
    "MAX_STATES",
    "WORK_BASE",
    "WORK_PER_CHAR",
    "PatternTooCostly",
    "PatternUnsupported",
    "check",
    "ecma_regex",
    "expanded_states",
    "property_ranges_held",
    "python_pattern",
    "search",
    "search_group",
    "unsupported_reason",
]

MAX_STATES = 20_000  # NFA states a pattern may expand to (each counted repeat is unrolled)
#: NFA states the distinct patterns of one schema may expand to in all (~2.5 µs a state to
#: build; ``localllm.grammar.compile.schema_problem`` refuses more): 200 patterns ``a{19990}…``
#: (10 KB) took 12 s to check; JSONSchemaBench's most is 16,162 (aerleon's definitions)
MAX_SCHEMA_STATES = 100_000
#: ranges of code points a pattern's ``\p{…}``/``\P{…}`` classes may hold in all: each is
#: written out for ``re`` to parse (``\p{L}`` is 648 ranges, 1,678 characters), so 3,000 of
#: them (an 18 KB answer to ``format: regex``) took 37 s to check, 1,000 in a schema's pattern 9 s
MAX_PROPERTY_RANGES = 20_000
#: ... and the distinct patterns of one schema in all (~3 ms a ``\p{L}`` to check and build:
#: 200 patterns ``^\p{L}{40}…$``, 11 KB, took 4 s to check, a 256 KiB schema of them minutes)
MAX_SCHEMA_PROPERTY_RANGES = 100_000
_CACHE_LIMIT = 500_000  # NFA states held in one pattern's lazy-DFA cache before it is flushed
#: NFA steps one search may take (a cached step costs one): a base plus a share per character. A
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
        self,
        nfa: _Nfa,
        chars: dict[tuple[Any, int, int], Callable[[str], Any]],
        capture: int | None = None,
        *,
        backwards: bool = False,
    ) -> None:
        self.nfa = nfa
        self.backwards = backwards  # read the text right to left (a variable-width lookbehind)
        self.looks = False
        # each item's matcher by the item's id and flags: a repeat unrolls the same item again
        # and again, and spelling a \p{L} class (648 ranges) to find its matcher in _CHARS took
        # 0.15 ms each time: 13 s for ``\p{L}{20001}`` (the tree, so every id, outlives the build)
        self.chars = chars
        self.capture = capture  # the group whose bounds _SAVE states record, if any
        self.saved = False

    def sequence(self, items: Any, flags: int, follow: int) -> int:
        for op, av in list(items) if self.backwards else reversed(list(items)):
            follow = self.item(op, av, flags, follow)
        return follow

    def item(self, op: Any, av: Any, flags: int, follow: int) -> int:
        nfa = self.nfa
        if op in _CHAR_OPS:
            key = (op, id(av), flags)
            if key not in self.chars:
                spelled = (op, repr(av), flags)
                self.chars[key] = _CHARS.get(spelled, lambda: _one_char(op, av, flags), lambda _: len(spelled[1]))
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
            name, word = _assertion(av, flags)
            if self.backwards:  # the start of the text is the end of the reversed one
                name = {"bos": "eos", "eos": "bos", "bol": "eol", "eol": "bol"}.get(name, name)
            return nfa.add(_AT, [follow], (name, word))
        if op in (_constants.ASSERT, _constants.ASSERT_NOT):
            if self.backwards:
                raise PatternUnsupported("it has a lookaround inside a variable-width lookbehind")
            direction, body = av
            low, high = body.getwidth()
            # a fixed-width lookbehind is a search anchored its width back; a variable-width one
            # (ES2018; re's compiler refuses it) reads the reversed text from here, right to left
            backwards = direction < 0 and low != high
            sub = _build(body, flags, nfa.budget, self.chars, backwards=backwards)
            self.looks = True
            width = None if backwards else low if direction < 0 else 0
            return nfa.add(_LOOK, [follow], (sub, op is _constants.ASSERT_NOT, width))
        raise PatternUnsupported(f"it uses {_UNSUPPORTED.get(op, op)}")


def _build(
    tree: Any,
    flags: int,
    budget: list[int],
    chars: dict[tuple[Any, int, int], Callable[[str], Any]],
    capture: int | None = None,
    *,
    backwards: bool = False,
) -> _Matcher:
    nfa = _Nfa(budget)
    start = nfa.add(_SPLIT, [])
    builder = _Builder(nfa, chars, capture, backwards=backwards)
    nfa.accept = nfa.add(_MATCH, [])
    nfa.out[start] = [builder.sequence(tree, flags, nfa.accept)]
    if capture is not None and not builder.saved:
        raise PatternUnsupported(f"its group {capture} is inside a lookaround")
    return _Matcher(nfa, cacheable=not builder.looks)


# ECMA-262's classes, as code point ranges (the grammar compiler reads patterns with them too)
ECMA_DIGIT: tuple[tuple[int, int], ...] = ((0x30, 0x39),)
ECMA_WORD: tuple[tuple[int, int], ...] = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
#: WhiteSpace (§12.2) and LineTerminator (§12.3): what \s reads
ECMA_SPACE: tuple[tuple[int, int], ...] = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680))
ECMA_SPACE += ((0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000))
ECMA_SPACE += ((0xFEFF, 0xFEFF),)
#: what . does not read
ECMA_LINE_TERMINATORS: tuple[tuple[int, int], ...] = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The code points not in ``ranges`` (sorted, disjoint); a leaf module's own, where the
    grammar compiler uses ``automaton.complement``."""
    out, low = [], 0
    for lo, hi in ranges:
        if lo > low:
            out.append((low, lo - 1))
        low = hi + 1
    return (*out, (low, 0x10FFFF)) if low <= 0x10FFFF else tuple(out)


#: General_Category values (§22.2.2.9, Unicode's PropertyValueAliases): every alias → the
#: one- or two-letter categories it stands for
_GC_ALIASES = {
    "L Letter": "Lu Ll Lt Lm Lo",
    "LC Cased_Letter": "Lu Ll Lt",
    "Lu Uppercase_Letter": "Lu",
    "Ll Lowercase_Letter": "Ll",
    "Lt Titlecase_Letter": "Lt",
    "Lm Modifier_Letter": "Lm",
    "Lo Other_Letter": "Lo",
    "M Mark Combining_Mark": "Mn Mc Me",
    "Mn Nonspacing_Mark": "Mn",
    "Mc Spacing_Mark": "Mc",
    "Me Enclosing_Mark": "Me",
    "N Number": "Nd Nl No",
    "Nd Decimal_Number digit": "Nd",
    "Nl Letter_Number": "Nl",
    "No Other_Number": "No",
    "P Punctuation punct": "Pc Pd Ps Pe Pi Pf Po",
    "Pc Connector_Punctuation": "Pc",
    "Pd Dash_Punctuation": "Pd",
    "Ps Open_Punctuation": "Ps",
    "Pe Close_Punctuation": "Pe",
    "Pi Initial_Punctuation": "Pi",
    "Pf Final_Punctuation": "Pf",
    "Po Other_Punctuation": "Po",
    "S Symbol": "Sm Sc Sk So",
    "Sm Math_Symbol": "Sm",
    "Sc Currency_Symbol": "Sc",
    "Sk Modifier_Symbol": "Sk",
    "So Other_Symbol": "So",
    "Z Separator": "Zs Zl Zp",
    "Zs Space_Separator": "Zs",
    "Zl Line_Separator": "Zl",
    "Zp Paragraph_Separator": "Zp",
    "C Other": "Cc Cf Cs Co Cn",
    "Cc Control cntrl": "Cc",
    "Cf Format": "Cf",
    "Cs Surrogate": "Cs",
    "Co Private_Use": "Co",
    "Cn Unassigned": "Cn",
}
_GENERAL_CATEGORIES = {alias: tuple(cats.split()) for names, cats in _GC_ALIASES.items() for alias in names.split()}
#: the binary properties (§22.2.2.9, table 67) answered here besides the categories
_BINARY = {"Any": "Any", "ASCII": "ASCII", "Assigned": "Assigned", "ASCII_Hex_Digit": "AHex", "AHex": "AHex"}
_SUPPORTED = "General_Category values (L, Lu, Letter, Nd, …) and Any, ASCII, Assigned, ASCII_Hex_Digit"


@functools.cache
def _category_ranges() -> dict[str, tuple[tuple[int, int], ...]]:
    """Each two-letter General_Category → its code points as ranges, by this Python's
    ``unicodedata`` (one pass over every code point, the first time a pattern asks)."""
    found: dict[str, list[tuple[int, int]]] = {}
    category, start = unicodedata.category, 0
    current = category(chr(0))
    for cp in range(1, 0x110000):
        cat = category(chr(cp))
        if cat != current:
            found.setdefault(current, []).append((start, cp - 1))
            current, start = cat, cp
    found.setdefault(current, []).append((start, 0x10FFFF))
    return {cat: tuple(ranges) for cat, ranges in found.items()}


def _merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return tuple(out)


@functools.lru_cache(maxsize=128)
def property_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """The code points ``\\p{name}`` reads (ECMA-262 with the ``u`` flag): a General_Category
    (``L``, ``Letter``, ``gc=Lu``, ``General_Category=Nd``) or one of a few binary properties.
    Raises ``re.error`` for a name this module does not answer (scripts among them)."""
    key, _, value = name.partition("=")
    if value and key in ("General_Category", "gc"):
        cats = _GENERAL_CATEGORIES.get(value)
    elif value:
        raise re.error(f"the Unicode property \\p{{{name}}} is not supported here (only {_SUPPORTED})")
    else:
        cats = _GENERAL_CATEGORIES.get(name)
    if cats is not None:
        table = _category_ranges()
        return _merged([r for cat in cats for r in table.get(cat, ())])
    binary = _BINARY.get(name)
    if binary == "Any":
        return ((0, 0x10FFFF),)
    if binary == "ASCII":
        return ((0, 0x7F),)
    if binary == "AHex":
        return ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66))
    if binary == "Assigned":
        return _complement(_category_ranges()["Cn"])
    raise re.error(f"the Unicode property \\p{{{name}}} is not supported here (only {_SUPPORTED})")


@functools.lru_cache(maxsize=256)
def _class_text(ranges: tuple[tuple[int, int], ...]) -> str:
    """Ranges as the inside of an ``re`` class: ASCII letters and digits and every printable
    code point past ASCII as themselves, the rest escaped. ``re`` reads a
    character 5 times faster than an escape (``\\p{L}``: 0.8 ms, 3.9 written all escaped)."""
    return "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in ranges)


def _class_char(cp: int) -> str:
    c = chr(cp)
    if c.isprintable() and (c.isalnum() or not c.isascii()):  # a surrogate is not printable
        return c
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def _escape_at(pattern: str, i: int) -> tuple[str, int, tuple[tuple[int, int], ...] | None]:
    """The escape at ``pattern[i]`` (a backslash): (its text as ``re`` should read it, the index
    after it, the ranges of a property class or None). ECMA-262's ``\\cX`` becomes ``\\xNN``,
    ``\\p{…}``/``\\P{…}`` their ranges and ``\\k<name>`` ``(?P=name)``; any other escape is
    kept as written."""
    c = pattern[i + 1] if i + 1 < len(pattern) else ""
    if c == "c":
        letter = pattern[i + 2] if i + 2 < len(pattern) else ""
        if not ("a" <= letter <= "z" or "A" <= letter <= "Z"):
            raise re.error("\\c must be followed by a letter (ECMA-262's control escape)", pattern, i)
        return f"\\x{ord(letter) % 32:02x}", i + 3, None
    if c in ("p", "P"):
        end = pattern.find("}", i + 3)
        if not pattern.startswith("{", i + 2) or end < 0:
            raise re.error(f"\\{c} must be followed by {{property}} (ECMA-262's property escape)", pattern, i)
        ranges = property_ranges(pattern[i + 3 : end])
        return "", end + 1, ranges if c == "p" else _complement(ranges)
    if c == "k" and pattern.startswith("<", i + 2) and (end := pattern.find(">", i + 3)) > 0:
        return f"(?P={pattern[i + 3 : end]})", end + 1, None
    return pattern[i : i + 2], i + 2, None


#: what :func:`python_pattern` rewrites starts with one of these; a pattern without any is kept
_ECMA_ONLY = ("\\c", "\\p", "\\P", "\\k<", "(?<", "[]", "[^]")
#: what re reads in a class as a literal but warns of (see :func:`_rewrite_class`), and a
#: pattern that may hold it: a second "[" after a "[", or a doubled operator
_SET_SYNTAX = frozenset("[-&~|")
_SET_WARNED = re.compile(r"\[.*(?:\[|--|&&|~~|\|\|)", re.DOTALL)
#: a property escape (``\p{L}``, ``\P{Lu}``: group 1 the letter, 2 the name), or an escaped
#: backslash (no group 1), read first so ``\\p{L}`` is no property
_PROPERTY_ESCAPE = re.compile(r"\\\\|\\([pP])\{([^}]*)\}")


def property_ranges_held(pattern: str) -> int:
    """How many ranges of code points ``pattern``'s ``\\p{…}``/``\\P{…}`` classes are written
    out as, in all (each costs ``re``'s parser ~3 µs in each pattern it is written in)."""
    if "\\p" not in pattern and "\\P" not in pattern:
        return 0
    return sum(_ranges_held(m[2]) for m in _PROPERTY_ESCAPE.finditer(pattern) if m[1])


def _ranges_held(name: str) -> int:
    """How many ranges ``\\p{name}`` is written out as; 0 for a name that is no property (its
    escape is reported where it is read)."""
    try:
        return len(property_ranges(name))
    except re.error:
        return 0


@functools.lru_cache(maxsize=512)
def python_pattern(pattern: str) -> str:
    """``pattern`` with ECMA-262's syntax that Python's ``re`` lacks or reads otherwise
    rewritten into what ``re`` parses as ECMA-262 means it: ``\\cX`` (a control character),
    ``\\p{…}``/``\\P{…}`` (Unicode properties: :func:`property_ranges`) as classes, a named
    group ``(?<name>…)`` and its backreference ``\\k<name>`` as ``re`` writes them, the empty
    class ``[]`` (nothing) and ``[^]`` (any character); in a class, a ``[`` and the ``-``,
    ``&``, ``~`` and ``|`` not making a range escaped (``re`` warns of them as nested sets
    and set operations; ECMA-262 reads each as itself). Every other part is kept as written
    (``re`` reads it as :func:`search` says). Raises ``re.error`` for a malformed escape, an
    unknown property, or a property class as a range's end (``[\\p{L}-z]``, an error in
    ECMA-262 too)."""
    if not any(syntax in pattern for syntax in _ECMA_ONLY) and not _SET_WARNED.search(pattern):
        return pattern
    held = property_ranges_held(pattern)
    if held > MAX_PROPERTY_RANGES:
        raise re.error(
            f"its \\p{{…}} classes hold {held:,} ranges of code points, more than {MAX_PROPERTY_RANGES:,} "
            "(each is written out in full): name each class once, e.g. [\\p{L}\\p{N}]+"
        )
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            text, i, ranges = _escape_at(pattern, i)
            out.append(text if ranges is None else f"[{_class_text(ranges)}]")
        elif pattern.startswith(("[]", "[^]"), i):
            out.append("(?!)" if pattern[i + 1] == "]" else "[\\s\\S]")
            i += 2 if pattern[i + 1] == "]" else 3
        elif ch == "[":
            i = _rewrite_class(pattern, i, out)
        elif pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
            out.append("(?P<")
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _rewrite_class(pattern: str, i: int, out: list[str]) -> int:
    """Copy the class starting at ``pattern[i]`` (``[``) into ``out``, a property escape as
    its ranges; the index after its ``]``. Items are read as ``re`` reads them (a ``]`` first
    is a literal, a ``-`` after a single item and before anything but ``]`` makes a range);
    an unterminated class is copied as is, for ``re`` to report."""
    n = len(pattern)
    out.append("[")
    i += 1
    if i < n and pattern[i] == "^":
        out.append("^")
        i += 1
    first = True
    starts = False  # the previous item is one character that a "-" would start a range from
    ends = False  # the previous item is a range's "-": this one ends the range
    while i < n and (pattern[i] != "]" or first):
        first = False
        if pattern[i] == "\\":
            text, nxt, ranges = _escape_at(pattern, i)
            starts_range = pattern[nxt : nxt + 1] == "-" and pattern[nxt + 1 : nxt + 2] not in ("]", "")
            if ranges is not None and (ends or starts_range):
                raise re.error("a Unicode property class cannot be a range's end", pattern, i)
            out.append(text if ranges is None else _class_text(ranges))
            i, single = nxt, ranges is None
        else:
            if pattern[i] == "-" and starts and pattern[i + 1 : i + 2] not in ("]", ""):
                out.append("-")  # a range's
                i, starts, ends = i + 1, False, True
                continue
            # re warns of a "[" in a class, and of a doubled "-", "&", "~" or "|" (a nested set,
            # a set operation: FutureWarning, one day perhaps read so); escaped, each is what
            # ECMA-262 reads, the character itself
            out.append("\\" + pattern[i] if pattern[i] in _SET_SYNTAX else pattern[i])
            single = True
            i += 1
        starts, ends = single and not ends, False
    if i < n:
        out.append("]")
        i += 1
    return i


#: re's class categories (\d, \D, ...) → ECMA-262's ranges
_ECMA_CATEGORIES = {
    _constants.CATEGORY_DIGIT: ECMA_DIGIT,
    _constants.CATEGORY_WORD: ECMA_WORD,
    _constants.CATEGORY_SPACE: ECMA_SPACE,
    _constants.CATEGORY_NOT_DIGIT: _complement(ECMA_DIGIT),
    _constants.CATEGORY_NOT_WORD: _complement(ECMA_WORD),
    _constants.CATEGORY_NOT_SPACE: _complement(ECMA_SPACE),
}


def _ecma(op: Any, av: Any, flags: int) -> tuple[Any, Any]:
    """A one-character item as ECMA-262 reads it (a JSON Schema ``pattern`` is an ECMA-262
    regex, §6.4): ``\\d``, ``\\w`` and ``\\b``'s word ASCII; ``\\s`` ECMA's white space and line
    terminators (U+FEFF, U+00A0, ... but not U+001C-U+001F or U+0085, which ``re`` adds);
    ``.`` no line terminator (``\\r``, U+2028 and U+2029 too)."""
    c = _constants
    if op is c.ANY and not flags & _constants.SRE_FLAG_DOTALL:
        return c.IN, [(c.NEGATE, None), *((c.RANGE, r) for r in ECMA_LINE_TERMINATORS)]
    if op is c.IN and any(kind is c.CATEGORY for kind, _ in av):
        items: list[tuple[Any, Any]] = []
        for kind, value in av:
            ranges = _ECMA_CATEGORIES.get(value) if kind is c.CATEGORY else None
            if ranges is None:
                items.append((kind, value))
            else:
                items.extend((c.RANGE, r) for r in ranges)
        return c.IN, items
    return op, av


#: the one-character matchers of every pattern, by item and flags: re's compiler takes ~7 ms
#: for a class as large as ``\\p{L}``, which 200 patterns of one schema each hold
_CHARS: Kept[Callable[[str], Any]] = Kept(4096, 16 << 20)


def _one_char(op: Any, av: Any, flags: int) -> Callable[[str], Any]:
    """A matcher for one character, compiled by ``re`` itself from this one parse item (read
    as ECMA-262 reads it: :func:`_ecma`)."""
    state = _parser.State()
    state.flags = flags
    return _compiler.compile(_parser.SubPattern(state, [_ecma(op, av, flags)]), flags).fullmatch


#: ECMA-262's word characters (what \b and \B look at), whatever the flags
_WORD_CHAR = re.compile(r"\w", re.ASCII).fullmatch


def _assertion(code: Any, flags: int) -> tuple[str, Any]:
    """An anchor as (name, word matcher or None), after ``re``'s own flag rules."""
    at = _constants
    if code is at.AT_BEGINNING:
        return ("bol" if flags & _MULTILINE else "bos", None)
    if code is at.AT_BEGINNING_STRING:
        return ("bos", None)
    if code is at.AT_END:  # ECMA-262's $: the very end (re's also before a final newline)
        return ("eol" if flags & _MULTILINE else "eos", None)
    if code is at.AT_END_STRING:
        return ("eos", None)
    if code is at.AT_BOUNDARY:
        return ("b", _WORD_CHAR)
    if code is at.AT_NON_BOUNDARY:
        return ("B", _WORD_CHAR)
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
    if name == "eol":
        return i == n or text[i] == "\n"
    if n == 0:  # no word character: no boundary (re fails \B there too; ECMA-262 does not)
        return name == "B"
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
        self.reversed_text = ("", "")  # the last text a variable-width lookbehind read, reversed

    @property
    def states(self) -> int:
        """The NFA states built for the whole pattern, its lookarounds' included (they share one budget)."""
        return MAX_STATES - self.nfa.budget[0]

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
            if width is None:  # variable-width lookbehind: its reversed body, leftwards from i
                reversed_text = self.reversed_text
                if reversed_text[0] is not text:
                    reversed_text = self.reversed_text = (text, text[::-1])
                found = sub.run(reversed_text[1], len(text) - i, anchored=True, work=work)
            else:
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
            if cached is not None:
                # a cached step costs one unit: a lookaround's sub-search at every position
                # reads up to the whole text each time, all of it from the cache (quadratic)
                work[0] -= 1
                if work[0] < 0:
                    _spend(work, 0, text)
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


def _compiled(pattern: str, capture: int | None = None) -> _Matcher:
    built = _built(pattern, capture)
    if isinstance(built, str):
        raise PatternUnsupported(built)
    return built


def _built(pattern: str, capture: int | None) -> _Matcher | str:
    """The matcher of ``pattern`` (recording group ``capture``'s bounds), or why it has none:
    kept too, as finding out may take a whole :data:`MAX_STATES` build (a pattern a config's
    schema holds is searched with ``fallback`` again for every value it checks)."""
    return _BUILT.get((pattern, capture), lambda: _build_matcher(pattern, capture), _weight)


def _weight(built: _Matcher | str) -> int:
    return 1 + (0 if isinstance(built, str) else built.states)


#: :func:`_built`'s latest results, weighed in NFA states: all the patterns of four schemas at
#: once (a schema's are at most :data:`MAX_SCHEMA_STATES`), so checking answers that visit
#: more patterns than it once held no longer builds each again at every value (600 patterns
#: of 150 states, kept by the 512 latest, took 15 s for a 385 KB answer)
_BUILT: Kept[_Matcher | str] = Kept(8192, 4 * MAX_SCHEMA_STATES)


def _build_matcher(pattern: str, capture: int | None) -> _Matcher | str:
    tree = _parser.parse(python_pattern(pattern), 0)  # re.error for what re cannot parse, as re.search raises
    if capture is not None and not 0 < capture < tree.state.groups:
        raise IndexError("no such group")
    try:
        return _build(tree, tree.state.flags, [MAX_STATES], {}, capture)
    except PatternUnsupported as exc:
        return str(exc)
    except RecursionError:
        return "it nests groups too deeply"


# \b and \B over ECMA-262's (ASCII) word characters, whatever the flags
_BOUNDARY = r"(?-i:(?<=[A-Za-z0-9_])(?![A-Za-z0-9_])|(?<![A-Za-z0-9_])(?=[A-Za-z0-9_]))"
_NOT_BOUNDARY = r"(?-i:(?<=[A-Za-z0-9_])(?=[A-Za-z0-9_])|(?<![A-Za-z0-9_])(?![A-Za-z0-9_]))"


def _ecma_items(items: Any, flags: int, *, one: tuple[Any, Any] | None = None) -> list[tuple[Any, Any]]:
    """``re``'s parse items rewritten to mean what ECMA-262 reads (:func:`_ecma`; ``$`` the
    very end; ``\\b`` and ``\\B`` over ASCII word characters); with ``one``, every
    one-character item replaced by it."""
    c = _constants
    out: list[tuple[Any, Any]] = []
    for op, av in items:
        item = (op, av)
        if op in _CHAR_OPS:
            item = _ecma(op, av, flags) if one is None else one
        elif op is c.AT and av is c.AT_END and not flags & _MULTILINE:
            item = (op, c.AT_END_STRING)
        elif op is c.AT and av in (c.AT_BOUNDARY, c.AT_NON_BOUNDARY):
            item = (c.SUBPATTERN, (None, 0, 0, _parser.parse(_BOUNDARY if av is c.AT_BOUNDARY else _NOT_BOUNDARY)))
        elif op is c.SUBPATTERN:
            _, add, remove, body = av
            body.data = _ecma_items(body, (flags | add) & ~remove, one=one)
        elif op is c.BRANCH:
            for branch in av[1]:
                branch.data = _ecma_items(branch, flags, one=one)
        elif op in _REPEATS or op is getattr(c, "POSSESSIVE_REPEAT", None):
            av[2].data = _ecma_items(av[2], flags, one=one)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            av[1].data = _ecma_items(av[1], flags, one=one)
        elif op is getattr(c, "ATOMIC_GROUP", None):
            av.data = _ecma_items(av, flags, one=one)
        elif op is c.GROUPREF_EXISTS:
            for body in av[1:]:
                if body is not None:
                    body.data = _ecma_items(body, flags, one=one)
        out.append(item)
    return out


@functools.lru_cache(maxsize=64)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled by ``re`` (backtracking) as ECMA-262 reads it, as :func:`search`
    does: for the constructs :func:`search` has no linear-time match for (``fallback``)."""
    tree = _parser.parse(python_pattern(pattern), 0)
    tree.data = _ecma_items(tree, tree.state.flags)
    return _compiler.compile(tree, tree.state.flags)


def _re_compiles(pattern: str) -> None:
    """Raise ``re.error`` when ``re`` cannot compile :func:`ecma_regex`'s reading of
    ``pattern``: compiled with every one-character item an ``a``, as what one reads never
    decides that, and re's compiler took ~7 ms for each class as large as ``\\p{L}``."""
    tree = _parser.parse(python_pattern(pattern), 0)
    tree.data = _ecma_items(tree, tree.state.flags, one=(_constants.LITERAL, ord("a")))
    _compiler.compile(tree, tree.state.flags)


def check(pattern: str) -> None:
    """Raise ``re.error`` (naming why) when :func:`search` cannot read ``pattern`` even with
    ``fallback``: what ``re`` cannot parse, or a construct with no linear-time match that
    ``re`` cannot compile either (a lookaround inside a variable-width lookbehind)."""
    try:  # re's compiler first: it writes no repeat out (the NFA of ``a{19999}`` is 50 ms)
        _re_compiles(pattern)
    except re.error:
        if isinstance(_built(pattern, None), str):  # nor has it a linear-time match: re's reason
            raise


def search(pattern: str, text: str, *, fallback: bool = False) -> bool:
    """Does ``pattern`` (read as ECMA-262 reads it: :func:`_ecma`) match somewhere in
    ``text``? In O(len(text) × pattern size) time.

    Raises ``re.error`` when ``re`` cannot parse ``pattern`` and :class:`PatternUnsupported`
    for a construct with no linear-time match (see :func:`unsupported_reason`) — unless
    ``fallback``, for callers whose schemas were checked already: then ``re`` decides those
    (:func:`ecma_regex`)."""
    try:
        return _compiled(pattern).run(text)
    except PatternUnsupported:
        if not fallback:
            raise
        return ecma_regex(pattern).search(text) is not None


def search_group(pattern: str, text: str, number: int = 1, *, fallback: bool = False) -> str | None:
    """``re.search(pattern, text)``'s ``group(number)`` (None when nothing matches or the group
    takes no part in the match), in O(len(text) × pattern size) time: the leftmost match,
    and in it the choices ``re`` prefers (greedy or lazy repeats, alternatives in order).

    Raises what :func:`search` raises, :class:`PatternUnsupported` also for a group inside a
    lookaround, and ``IndexError`` for a group the pattern does not have (as ``re`` does).
    With ``fallback``, ``re`` extracts what has no linear answer, but only from a text
    :func:`search` found to match: never the near miss where backtracking explodes."""
    try:
        matcher = _compiled(pattern, number)
    except PatternUnsupported:
        if not fallback:
            raise
        found = ecma_regex(pattern).search(text) if search(pattern, text, fallback=True) else None
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


def expanded_states(pattern: str) -> int:
    """How many NFA states :func:`search` builds for ``pattern`` (each counted repeat written
    out, its lookarounds' included), up to :data:`MAX_STATES`; 0 when it builds none (see
    :func:`unsupported_reason`)."""
    try:
        built = _built(pattern, None)
    except (re.error, RecursionError, OverflowError):
        return 0
    return 0 if isinstance(built, str) else built.states
