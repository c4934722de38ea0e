"""Compile a JSON Schema into an exact, compact llama.cpp GBNF grammar — or say why not.

:func:`compile_schema` returns a :class:`CompiledGrammar`: the grammar text when every
answer the grammar admits is valid against the schema (``grammar`` is set, ``refusals``
empty), else ``grammar is None`` and a :class:`Refusal` names the schema path and the
construct it cannot express exactly. "Exact" means *sound*: the grammar may admit fewer
answers than the schema (properties in any order only up to ANY_ORDER of them, else in
declared order; undeclared keys only after them and never a declared name; no free
whitespace; integers for ``number`` bounds' edges), never more.

How the schema is read (the semantics of the ``jsonschema`` validator for the schema's
draft): ``$ref`` overrides its siblings up to draft 7 and combines with them from
2019-09 (same-document ``$id``/``$anchor`` refs are rewritten as ``#/`` pointers first);
``allOf`` components are merged into one schema (positional item keywords position by
position; several patterns as the product of their automata, :mod:`localllm.grammar.automaton`;
decimal steps as their common multiples the validator accepts between two bounds);
``anyOf``/``oneOf`` distribute their siblings into each branch, and a ``oneOf`` that is not
provably disjoint becomes each branch without the others; ``not``,
``if``/``then``/``else`` and the ``dependent*`` keywords are rewritten into ``anyOf``/``allOf``
of positive schemas (:meth:`_Compiler.negate`); ``const``/``enum`` keep the values that
validate against the whole schema object. Malformed schemas and constructs without a
grammar here (``unevaluated*`` beside anyOf/oneOf/not/if, ``uniqueItems`` over an open domain,
``multipleOf`` with a decimal step whose digits are above 32 and no two bounds, negations of
patterns with lookaround or inner anchors and of formats, refs to other documents …) are
refused, never raised. Narrowings beyond the documented defaults are listed in
:attr:`CompiledGrammar.notes`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from localllm.grammar import automaton, keywords
from localllm.grammar.automaton import Branch
from localllm.grammar.bounded import CHECK_BASE, written
from localllm.grammar.formats import SUPERSETS, format_checker
from localllm.grammar.kept import Kept
from localllm.grammar.meta import meta_error
from localllm.grammar.paths import child_path, pointer_tokens, resolve_pointer
from localllm.grammar.pattern import (
    ECMA_DIGIT,
    ECMA_LINE_TERMINATORS,
    ECMA_SPACE,
    ECMA_WORD,
    MAX_SCHEMA_PROPERTY_RANGES,
    MAX_SCHEMA_STATES,
    MAX_STATES,
    PatternTooCostly,
    expanded_states,
    property_ranges_held,
    python_pattern,
    search,
    unsupported_reason,
)
from localllm.grammar.walk import TOKEN, Grammar
from localllm.wire import nesting

MAX_DEPTH = 64
#: steps (schemas negated) all partial negations of one schema may take together
MAX_PARTIAL_NEGATIONS = 10_000
#: llama.cpp expands ``x{m,n}`` into n nested rules and advances all of them per token: a
#: larger maximum is lowered to this (sound: fewer answers), a larger minimum refused
MAX_REPEAT = 1_000
MAX_BRANCHES = 64
#: patterns one string's schemas may join (each join is parsed whole, so n patterns parse in
#: n² time: 128 take ~1.5 s, 400 took 17 s from a 7 KB schema)
MAX_JOINED_PATTERNS = 128
#: alternatives of multiplied-out allOf of anyOf one schema may generate on trial, to drop those
#: that admit no value
MAX_TRIALS = 1024
#: and the characters of those alternatives (canonical JSON) together: 1,000,000 is about half a
#: second of trials (JSONSchemaStore openrewrite needs 404,000, 324 trials)
MAX_TRIAL_CHARS = 1_000_000
#: objects with at most this many generated properties (and uniqueItems arrays with at most
#: this many values) admit them in any order (2^n rules); more keep their declared order
ANY_ORDER = 6
#: at most this many any-order rules per grammar (size and compile time); past it, declared order
ANY_ORDER_RULES = 256
#: "not" of a pattern searching for literals compiles for literals up to this long, with an
#: automaton of at most MAX_AVOIDED_STATES states
MAX_AVOIDED = 6
MAX_AVOIDED_STATES = 24
#: the largest integer step compiled without two bounds (its grammar has step*16 rules)
MAX_STEP = 32
#: rules of properties (or unique items) in declared order with minProperties/maxProperties
#: (minItems/maxItems) to count: one per position and count
MAX_COUNTED_RULES = 4_096
#: states of the automaton for several patterns on one string (and their length bounds)
MAX_PRODUCT_STATES = 1_000
MAX_GRAMMAR_CHARS = 2_000_000
#: what compiling one schema may do: each subschema generated and each allOf component
#: merged costs its keywords and the entries of its arrays and objects (:func:`_weight`),
#: each pair of branches compared a step, each alternative written out for its trial a step
#: per 32 characters
MAX_COMPILE_WORK = 2_000_000
#: llama.cpp's grammar parser refuses a repeat whose group made more than this many rules,
#: times its count (``MAX_REPETITION_THRESHOLD``): such a group is made a rule of its own
LLAMA_REPEAT_RULES = 2_000
#: integer bounds with more digits than this are refused (grammar size grows with them)
MAX_BOUND_DIGITS = 40
#: the longest digit run an unbounded integer (or integer part of a number) is generated with
MAX_INT_DIGITS = 16
#: bounded numbers get a fraction part of at most this many digits, with an integer part below
#: FRACTION_INT_CAP + 1 (15 significant digits in all: the parsed float orders like the decimal)
FRACTION_DIGITS = 6
FRACTION_INT_CAP = 10**9 - 1

_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")

_KIND_KW = {"object": keywords.OBJECT, "array": keywords.ARRAY, "string": keywords.STRING, "number": keywords.NUMBER}

# Standard formats we generate exactly; other standard formats a validator may check are
# refused; unknown formats are annotations (a validator ignores them).
_FORMATS = (
    "date",
    "time",
    "date-time",
    "uuid",
    "ipv4",
    "email",
    "idn-email",
    "hostname",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uri-template",
    "duration",
    "ipv6",
    "idn-hostname",
    "json-pointer",
    "relative-json-pointer",
    "regex",
)
#: formats whose grammar is written over the decoded characters (a regex's one backslash is two
#: characters of JSON text): always compiled through ``product``, which writes them as JSON
_DECODED_FORMATS = frozenset({"regex"})
#: formats whose grammar admits only part of what the format allows (sound, narrower)
_NARROWED_FORMATS = {
    "hostname": "lowercase, at most 4 labels of at most 32 characters, none with -- in its 3rd and 4th places",
    "email": "ASCII local part of at most 3 dot-separated runs of at most 10 [A-Za-z0-9_+-] at a narrowed hostname",
    "idn-email": "ASCII local part of at most 3 dot-separated runs of at most 10 [A-Za-z0-9_+-] at a narrowed hostname",
    "uri": "https, http, ftp or file://host/path only (at most 4 path segments, no query or fragment)",
    "uri-reference": "https, http, ftp or file://host/path only (at most 4 path segments, no query or fragment)",
    "iri": "https, http, ftp or file://host/path only (ASCII, at most 4 path segments, no query or fragment)",
    "iri-reference": "https, http, ftp or file://host/path only (ASCII, at most 4 path segments, no query or fragment)",
    "uri-template": "https://host/path only, each of at most 4 path segments a literal or one {variable}",
    "duration": "RFC 3339's form (P1Y2M3DT4H5M6S, P2W), whole numbers of at most 4 digits",
    "idn-hostname": "ASCII only, as the hostname format is generated",
    "json-pointer": "reference tokens of printable ASCII but quote and backslash",
    "relative-json-pointer": (
        "a prefix of at most 4 digits, then reference tokens of printable ASCII but quote and backslash"
    ),
    "regex": (
        "literals, ., escapes, [classes] with a-z A-Z 0-9 ranges, groups nested at most 2 deep, "
        "alternation, the quantifiers * + ? {n} {n,} {n,mm} (lazy too), ^ and $"
    ),
}
#: (shortest, longest) string each format grammar generates (None: no longest)
_FORMAT_LENGTHS: dict[str, tuple[int, int | None]] = {
    "date": (10, 10),
    "time": (9, 24),
    "date-time": (20, 35),
    "uuid": (36, 36),
    "ipv4": (7, 15),
    "hostname": (1, 131),
    "email": (3, 164),
    "idn-email": (3, 164),
    "uri": (7, 223),
    "uri-reference": (7, 223),
    "iri": (7, 223),
    "iri-reference": (7, 223),
    "uri-template": (9, 223),
    "duration": (3, 32),
    "ipv6": (2, 45),
    "idn-hostname": (1, 131),
    "json-pointer": (0, None),
    "relative-json-pointer": (1, None),
    "regex": (0, None),
}

_PRIMITIVES = {
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex-cp )',
    # \u escapes of anything but a surrogate: one escape is one code point
    "hex-cp": "[0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}",
    "string": '"\\"" char* "\\""',
    # digit runs are capped (integer part 16 digits, fraction 16, exponent 2) so that a model
    # cannot write digits until max_tokens; llama.cpp's converter caps integer digits at 16 too
    "integer": '"0" | "-"? [1-9] [0-9]{0,15}',
    "number": '"-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?',
    # a number written with a fraction part or an exponent: what a JSON parser reads as a float,
    # which draft 4 never counts as an integer (1.0 is not one there)
    "float": (
        '"-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} ( [eE] [-+]? [0-9]{1,2} )? | [eE] [-+]? [0-9]{1,2} )'
    ),
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ( string COLON value ( COMMA string COLON value )* )? "}"',
    "array": '"[" ( value ( COMMA value )* )? "]"',
    "year": "[0-9]{3} [1-9] | [0-9]{2} [1-9] [0-9] | [0-9] [1-9] [0-9]{2} | [1-9] [0-9]{3}",
    "leap-year": '[0-9]{2} leap-yy | leap-yy "00"',
    "leap-yy": '"0" [48] | [2468] [048] | [13579] [26]',
    "month-day": (
        '( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) '
        '| ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) '
        '| "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] )'
    ),
    "date": 'year "-" month-day | leap-year "-02-29"',
    "hh": '[01] [0-9] | "2" [0-3]',
    "time": 'hh ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] hh ":" [0-5] [0-9] )',
    "date-time": 'date "T" time',
    "hex": "[0-9a-fA-F]",
    "uuid": 'hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}',
    "octet": '"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]',
    "ipv4": 'octet "." octet "." octet "." octet',
    # 1 to 32 characters, no "--" in the 3rd and 4th places (an IDNA A-label's "xn--", or a
    # reserved label: the hostname format refuses both unless a valid A-label)
    "label": (
        '[a-z0-9] ( [a-z0-9] | [a-z0-9-] [a-z0-9] | [a-z0-9-] ( [a-z0-9] | "-" ) [a-z0-9] '
        '| [a-z0-9-] ( [a-z0-9] [a-z0-9-] | "-" [a-z0-9] ) [a-z0-9-]{0,27} [a-z0-9] )?'
    ),
    "hostname": 'label ( "." label ){0,3}',
    # RFC 5321's dot-atoms: no dot first, last or twice
    "email": '[A-Za-z0-9_+-]{1,10} ( "." [A-Za-z0-9_+-]{1,10} ){0,2} "@" hostname',
    "idn-email": "email",
    "uri": '( "https" | "http" | "ftp" | "file" ) "://" hostname ( "/" [A-Za-z0-9._~-]{0,20} ){0,4}',
    "uri-reference": "uri",
    "iri": "uri",
    "iri-reference": "uri",
    "uri-template": '"https://" hostname ( "/" ( [A-Za-z0-9._~-]{0,20} | "{" [A-Za-z0-9_]{1,16} "}" ) ){0,4}',
    # RFC 3339 appendix A: a part may be followed only by the next smaller ones, in order
    "dur-n": "[0-9]{1,4}",
    "duration": '"P" ( dur-date | dur-time | dur-n "W" )',
    "dur-date": '( dur-n "D" | dur-n "M" ( dur-n "D" )? | dur-n "Y" ( dur-n "M" ( dur-n "D" )? )? ) dur-time?',
    "dur-time": '"T" ( dur-n "S" | dur-n "M" ( dur-n "S" )? | dur-n "H" ( dur-n "M" ( dur-n "S" )? )? )',
    # RFC 3986's IPv6address: what ipaddress.IPv6Address reads (the format refuses a zone)
    "h16": "hex{1,4}",
    "ls32": 'h16 ":" h16 | ipv4',
    "ipv6": (
        '( h16 ":" ){6} ls32 | "::" ( h16 ":" ){5} ls32 | h16? "::" ( h16 ":" ){4} ls32 '
        '| ( h16 ( ":" h16 )? )? "::" ( h16 ":" ){3} ls32 | ( h16 ( ":" h16 ){0,2} )? "::" ( h16 ":" ){2} ls32 '
        '| ( h16 ( ":" h16 ){0,3} )? "::" h16 ":" ls32 | ( h16 ( ":" h16 ){0,4} )? "::" ls32 '
        '| ( h16 ( ":" h16 ){0,5} )? "::" h16 | ( h16 ( ":" h16 ){0,6} )? "::"'
    ),
    "idn-hostname": "hostname",
    # RFC 6901: reference tokens after "/", a "~" written "~0" and a "/" "~1"
    "ptr-char": r'[ !#-.0-\x5B\x5D-}] | "~" [01]',
    "json-pointer": '( "/" ptr-char* )*',
    "relative-json-pointer": '( "0" | [1-9] [0-9]{0,3} ) ( "#" | json-pointer )',
    # format "regex", over the decoded characters (_DECODED_FORMATS): groups nest 2 deep, so
    # that the rules are not recursive and the product's automaton reads them
    "re-lit": "[A-Za-z0-9 _,:;@#%&'=<>!/~-]",
    "re-esc": r'"\\" [dDwWsSnrt.\\/()\x5B\x5D{}*+?|^$-]',
    "re-class-item": r'[A-Za-z0-9 _,:;@#%=<>!/.] | "a-z" | "A-Z" | "0-9" | "\\" [dDwWsS.\\\x5D-]',
    "re-class": '"[" "^"? re-class-item+ "-"? "]"',
    # {n,m} needs n <= m: a one-digit n with a two-digit m, or both one digit, m at least n
    "re-quant": (
        '( [*+?] | "{" ( [0-9] ( "," ( [1-9] [0-9] )? )? | "0," [0-9] | "1," [1-9] | "2," [2-9] | "3," [3-9] '
        '| "4," [4-9] | "5," [5-9] | "6," [6-9] | "7," [7-9] | "8," [89] | "9,9" ) "}" ) "?"?'
    ),
    "re-atom0": 're-lit | "." | re-esc | re-class',
    # an anchor or a word boundary is never quantified (a quantifier after one is an error)
    "re-piece0": 're-atom0 re-quant? | "^" | "$" | "\\\\" [bB]',
    "re-alt0": 're-piece0* ( "|" re-piece0* )*',
    "re-atom1": 're-atom0 | "(" "?:"? re-alt0 ")"',
    "re-piece1": 're-atom1 re-quant? | "^" | "$" | "\\\\" [bB]',
    "re-alt1": 're-piece1* ( "|" re-piece1* )*',
    "re-atom2": 're-atom0 | "(" "?:"? re-alt1 ")"',
    "re-piece2": 're-atom2 re-quant? | "^" | "$" | "\\\\" [bB]',
    "regex": 're-piece2* ( "|" re-piece2* )*',
}


@functools.cache
def _primitive_deps(name: str) -> tuple[str, ...]:
    """The primitives ``name``'s rule refers to (read off its body: the names outside its
    quoted literals and character classes)."""
    body = re.sub(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]', " ", _PRIMITIVES[name])
    return tuple(n for n in dict.fromkeys(re.findall(r"[a-z][a-z0-9-]*", body)) if n in _PRIMITIVES and n != name)


@dataclass(frozen=True)
class Refusal:
    """Why a schema has no exact grammar: where (JSON path), which keyword, and why."""

    path: str
    construct: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class CompiledGrammar:
    """The GBNF text (root rule ``root``), or ``None`` with the refusals that explain why."""

    grammar: str | None
    refusals: list[Refusal] = field(default_factory=list)
    #: facts about the compilation a user may want to know (e.g. oneOf read as anyOf)
    notes: list[str] = field(default_factory=list)
    #: the refusal is that no value meets the schema (as far as the compiler generates values)
    unsatisfiable: bool = False

    @property
    def exact(self) -> bool:
        return self.grammar is not None


_TOO_DEEP = Refusal("$", "depth", "$: the schema nests too deeply to compile")


class _Refuse(Exception):
    def __init__(self, path: str, construct: str, why: str) -> None:
        super().__init__(why)
        self.refusal = Refusal(path, construct, f"{path}: {why}")


class _Unsatisfiable(_Refuse):
    """No value satisfies this (sub)schema: an anyOf branch may be dropped for it."""


def compile_schema(
    schema: Mapping[str, Any] | bool, *, space: bool = False, open_objects: bool = True
) -> CompiledGrammar:
    """An exact GBNF grammar for ``schema``, or the refusal saying which construct prevents one.

    ``space=True`` allows one space after ``:`` and ``,``; by default there is no free
    whitespace anywhere. ``open_objects=False`` keeps objects whose ``additionalProperties``
    is absent or true closed (only the declared properties are generated; an
    ``additionalProperties`` schema or ``patternProperties`` still extends them). Never
    raises for any JSON-like input.
    """
    try:
        depth = nesting(schema, 4 * MAX_DEPTH)
        if depth > 4 * MAX_DEPTH:
            raise _Refuse("$", "depth", f"the schema nests {depth} levels deep (at most {4 * MAX_DEPTH})")
        # every validator refuses such a schema (nested repeats multiply past the linear
        # matcher's states: "(a{1000}){1000}"), so no grammar may claim to enforce it
        if (slow := _heavy_properties(schema) or _slow_pattern(schema)) is not None:
            raise _Refuse(slow[0], "pattern", slow[1])
        compiler = _Compiler(schema, space=space, open_objects=open_objects)
        return compiler.run()
    except _Refuse as exc:
        return CompiledGrammar(None, [exc.refusal], unsatisfiable=isinstance(exc, _Unsatisfiable))
    except RecursionError:
        return CompiledGrammar(None, [_TOO_DEEP])


def compile_shared(schema: Any, *, space: bool = False, open_objects: bool = True) -> CompiledGrammar:
    """:func:`compile_schema` for a schema given again and again: clients of the service send
    the same ``response_format`` and tools with every request, and a large schema takes
    seconds to compile. The latest results are kept (:data:`_COMPILED`) by the schema's JSON
    text (key order included: it is the declared order); a result is shared: do not change it."""
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError, RecursionError):  # not JSON: compiled (refused) as it is
        return compile_schema(schema, space=space, open_objects=open_objects)
    return compile_text(text, space, open_objects)


def compile_text(text: str, space: bool, open_objects: bool) -> CompiledGrammar:
    """:func:`compile_shared` of the schema whose JSON ``text`` is."""

    def compiled() -> CompiledGrammar:
        try:
            schema = json.loads(text)
        except RecursionError:
            return CompiledGrammar(None, [_TOO_DEEP])
        return compile_schema(schema, space=space, open_objects=open_objects)

    return _COMPILED.get((text, space, open_objects), compiled, lambda c: len(text) + len(c.grammar or ""))


#: :func:`compile_text`'s latest results: 64, and 32 Mi characters of schema text and
#: grammar in all (a request's schemas are at most 256 KiB, a grammar 2 M characters)
_COMPILED: Kept[CompiledGrammar] = Kept(64, 32 << 20)


def schema_problem(schema: Any) -> tuple[str, str] | None:
    """Why ``schema`` is not a valid JSON Schema for its draft, has patterns that cannot be
    checked in linear time or cost too much to read and build (:func:`_heavy_properties`,
    :func:`_slow_pattern`), or subschemas that apply to one value too often to check an answer
    in time (:func:`fan_out`) — (JSON path, reason) — or None."""
    return _heavy_properties(schema) or meta_problem(schema) or _slow_pattern(schema) or fan_out(schema)


def meta_problem(schema: Any, *, formats: bool = True) -> tuple[str, str] | None:
    """Why ``schema`` is not a valid JSON Schema for its draft — (JSON path, reason) — or None.

    ``formats=False`` lets a ``format`` of the meta-schema pass (an ECMA-only ``pattern`` such
    as ``(?<x>a)`` that Python's ``re`` cannot compile: a call reports it when it checks one)."""
    if nesting(schema, 4 * MAX_DEPTH) > 4 * MAX_DEPTH:
        return "$", f"it nests more than {4 * MAX_DEPTH} levels deep"
    if isinstance(schema, dict) and "$schema" in schema and not isinstance(schema["$schema"], str):
        return "$", '"$schema" must be a URI string'
    cls = validator_class(schema)
    try:
        exc = meta_error(cls, schema)
        if exc is not None and (formats or exc.validator != "format"):
            where = "$"
            for p in exc.absolute_path:
                where = child(where, p)
            cause = f" ({exc.cause})" if exc.validator == "format" and exc.cause is not None else ""
            return where, exc.message + cause
    except _validation_failures() as exc:
        return "$", f"the validator cannot read it ({type(exc).__name__})"
    return None


_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas", "patternProperties"})


def _slow_pattern(schema: Any) -> tuple[str, str] | None:
    """The first ``pattern`` (or ``patternProperties`` name) with no linear-time match, as
    (JSON path, reason): validation would fall back to ``re``, which can backtrack for
    minutes on one near-miss answer (see :mod:`localllm.grammar.pattern`); or the first past
    which the schema's distinct patterns expand to more than :data:`MAX_SCHEMA_STATES` NFA
    states in all (each is built before any answer is checked)."""
    states = 0
    for pattern, where in _patterns(schema):
        if (reason := unsupported_reason(pattern)) is not None:
            return where, (
                f"the pattern {_q(pattern)} cannot be checked in time linear in the answer: {reason} "
                "(a near-miss answer could stall validation); rewrite it without that"
            )
        states += expanded_states(pattern)
        if states > MAX_SCHEMA_STATES:
            return where, (
                f"the schema's patterns expand to more than {MAX_SCHEMA_STATES:,} NFA states in all (each counted "
                "repeat is written out, and each pattern is built before any answer is checked); write fewer "
                "counted repeats, or smaller ones"
            )
    return None


def _heavy_properties(schema: Any) -> tuple[str, str] | None:
    """The first pattern past which the schema's distinct patterns hold more than
    :data:`MAX_SCHEMA_PROPERTY_RANGES` ranges of ``\\p{…}`` classes, as (JSON path, reason):
    counted from the text alone, before ``re`` parses any of them (checking the schema does)."""
    ranges = 0
    for pattern, where in _patterns(schema):
        ranges += property_ranges_held(pattern)
        if ranges > MAX_SCHEMA_PROPERTY_RANGES:
            return where, (
                f"the schema's patterns hold more than {MAX_SCHEMA_PROPERTY_RANGES:,} ranges of code points in "
                "their \\p{…} classes in all (each is written out in each pattern that names it: \\p{L} is "
                "over 600); name such classes in fewer distinct patterns"
            )
    return None


def _patterns(schema: Any) -> Iterator[tuple[str, str]]:
    """Each distinct ``pattern`` and ``patternProperties`` name of ``schema`` where it first
    stands, with its JSON path, in document order."""
    seen: set[str] = set()
    for node, path in _subschemas(schema):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                found = [(value, child(path, key))]
            elif key == "patternProperties" and isinstance(value, dict):
                found = [(name, child(child(path, key), name)) for name in value]
            else:
                continue
            for pattern, where in found:
                if pattern not in seen:
                    seen.add(pattern)
                    yield pattern, where


def _subschemas(schema: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Every object of ``schema`` that may be a subschema, with its JSON path, in document
    order: the values of every keyword but those holding data (``const``, ``enum``, …), a
    map's (``properties``, ``$defs``, …) by name, so a property called ``enum`` is one."""
    stack: list[tuple[Any, str]] = [(schema, "$")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, child(path, i)) for i, v in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        yield node, path
        children: list[tuple[Any, str]] = []
        for key, value in node.items():
            if key in DATA_KEYWORDS:
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                children.extend((sub, child(child(path, key), name)) for name, sub in value.items())
            else:
                children.append((value, child(path, key)))
        stack.extend(reversed(children))


def fan_out(schema: Any) -> tuple[str, str] | None:
    """The first subschema (as (JSON path, reason)) whose checking of one value may apply
    subschemas to it more than :data:`~localllm.grammar.bounded.CHECK_BASE` times, or None.

    jsonschema applies every subschema it meets in place (``allOf``, ``anyOf`` and ``oneOf``
    against a wrong value, ``not``, ``if``/``then``/``else``, ``dependentSchemas``, ``$ref``)
    each time it meets it: ``$defs`` that each ``allOf`` the next twice double the work at
    each step. Counted as the metered validator counts (one per subschema applied, a
    reference's target at each use), every branch taken; a reference outside ``#/…`` counts
    one, a cycle (which jsonschema never finishes) one. Validation would stop such an answer at
    its budget (:class:`~localllm.grammar.bounded.ValidationTooCostly`); this says so before
    any answer is made."""
    if not isinstance(schema, dict):
        return None
    draft = _DRAFTS.get(validator_class(schema).__name__, 2020)
    legacy = draft <= 7  # a $ref's siblings are ignored
    try:
        root = _local_refs(schema, "id" if draft == 4 else "$id", legacy=legacy)
    except ValueError:  # an $id or $ref that is no URI (the checks that read them name it)
        root = schema

    def in_place(node: dict[str, Any]) -> Iterator[Any]:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            found = resolve_pointer(root, ref[1:])
            yield True if found is None else found[0]
        yield from _in_place(node, legacy=legacy)

    applied: dict[int, int] = {}

    def count(top: dict[str, Any]) -> int:
        stack: list[tuple[dict[str, Any], bool]] = [(top, False)]
        open_: set[int] = set()  # on the path from ``top``: a subschema met again is a cycle
        while stack:
            node, done = stack.pop()
            if done:
                total = 1 + sum(applied.get(id(sub), 1) for sub in in_place(node))
                applied[id(node)] = min(total, CHECK_BASE + 1)
                open_.discard(id(node))
            elif id(node) not in applied and id(node) not in open_:
                open_.add(id(node))
                stack.append((node, True))
                stack.extend((sub, False) for sub in in_place(node) if isinstance(sub, dict))
        return applied[id(top)]

    for node, path in _subschemas(root):
        if count(node) > CHECK_BASE:
            return path, (
                f"its subschemas apply to one value more than {CHECK_BASE:,} times (allOf, anyOf, oneOf and $ref "
                "applying the same subschemas again multiply each other), so a wrong answer could not be checked "
                "in time; share the repeated subschemas or simplify them"
            )
    return None


def _in_place(node: dict[str, Any], *, legacy: bool) -> Iterator[Any]:
    """The subschemas ``node`` applies to the value it applies to (its ``$ref``'s target aside):
    ``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else``, ``dependentSchemas``
    (and draft 7's schema ``dependencies``); none beside a ``$ref`` before 2019-09 (``legacy``)."""
    if legacy and isinstance(node.get("$ref"), str):
        return
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            yield from node[key]
    yield from (node[key] for key in ("not", "if", "then", "else") if key in node)
    for key in ("dependentSchemas", "dependencies"):
        if isinstance(node.get(key), dict):
            yield from (sub for sub in node[key].values() if not isinstance(sub, list))


def unresolvable_ref(schema: Any) -> tuple[str, str] | None:
    """The first ``$ref`` of ``schema`` that does not resolve within it (or to a JSON Schema
    meta-schema), as (JSON path, reason), or None. For a schema that arrives alone (a service
    request): nothing is fetched for it, so such a reference could only fail its answer."""
    if not isinstance(schema, dict):
        return None
    meta = validator_class(schema).META_SCHEMA  # jsonschema imported (and prepared) by now
    from jsonschema_specifications import REGISTRY as META_SCHEMAS
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import specification_with

    resource = specification_with(str(meta.get("$schema") or meta.get("$id"))).create_resource(schema)

    def walk(resource: Any, resolver: Any) -> str | None:
        ref = resource.contents.get("$ref") if isinstance(resource.contents, dict) else None
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except (Unresolvable, ValueError):
                return ref
        for sub in resource.subresources():
            found = walk(sub, resolver.in_subresource(sub))
            if found is not None:
                return found
        return None

    try:
        ref = walk(resource, META_SCHEMAS.resolver_with_root(resource))
    except RecursionError:
        return "$", "it nests too deeply to resolve its references"
    if ref is None:
        return None
    return _ref_path(schema, ref, "$"), (
        f'"$ref": {_q(ref)} does not resolve: a reference must point inside the schema (or at a '
        "JSON Schema meta-schema); nothing is fetched"
    )


def _ref_path(node: Any, ref: str, path: str) -> str:
    """The path of the first object whose ``$ref`` is ``ref`` (depth first, in key order)."""
    stack: list[tuple[Any, str]] = [(node, path)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if node.get("$ref") == ref:
                return child(path, "$ref")
            stack.extend((v, child(path, k)) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, child(path, i)) for i, v in reversed(list(enumerate(node))))
    return "$"


def validator_class(schema: Any) -> Any:
    """The jsonschema validator class for ``schema``'s ``$schema`` (2020-12 when absent or
    unknown), with the keywords a hostile answer could stall or crash bounded
    (:func:`localllm.grammar.bounded.bounded_validator`)."""
    import warnings

    from localllm import _jsonschema
    from localllm.grammar.bounded import bounded_validator

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    if not isinstance(schema, dict) or not isinstance(schema.get("$schema", ""), str):
        return bounded_validator(jsonschema.Draft202012Validator)
    with warnings.catch_warnings():
        # an unknown $schema: jsonschema warns and uses its latest draft, as we do
        warnings.simplefilter("ignore", DeprecationWarning)
        return bounded_validator(jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator))


def child(path: str, key: str | int) -> str:
    return child_path(path, key)


def _q(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------------- GBNF text


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (every non-alphanumeric character escaped; the "C"
    of COMMA and COLON too, the separators' placeholders until the grammar is written: an
    enum value "COMMAND" became ``"\\"","ND\\""``, a grammar no parser takes)."""
    body = "".join(_gbnf_char(c, in_class=False) for c in text)
    if "COMMA" in body or "COLON" in body:
        body = body.replace("COMMA", "\\x43OMMA").replace("COLON", "\\x43OLON")
    return f'"{body}"'


def _gbnf_char(c: str, *, in_class: bool) -> str:
    cp = ord(c)
    if c.isascii() and (c.isalnum() or (not in_class and c in " !#$%&'()*+,-./:;<=>?@^_`{|}~")):
        return c
    if not in_class and c in '"\\':
        return "\\" + c
    if cp < 0x100:
        return f"\\x{cp:02X}"
    if cp < 0x10000:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def gbnf_class(ranges: Sequence[tuple[int, int]]) -> str:
    parts = []
    for lo, hi in ranges:
        a = _gbnf_char(chr(lo), in_class=True)
        parts.append(a if lo == hi else f"{a}-{_gbnf_char(chr(hi), in_class=True)}")
    return "[" + "".join(parts) + "]"


def _repeat(expr: str, lo: int, hi: int | None) -> str:
    """``expr`` repeated lo..hi times (hi None: unbounded), as compact GBNF."""
    atom = expr if _is_atom(expr) else f"( {expr} )"
    if hi is None:
        return {0: f"{atom}*", 1: f"{atom}+"}.get(lo, f"{atom}{{{lo},}}")
    if hi == 0:
        return '""'
    if (lo, hi) == (0, 1):
        return f"{atom}?"
    if (lo, hi) == (1, 1):
        return expr
    return f"{atom}{{{lo}}}" if lo == hi else f"{atom}{{{lo},{hi}}}"


_ATOM = re.compile(r'^(?:[A-Za-z0-9-]+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\])$')
#: what a GBNF expression's parentheses are read among: literals and classes (whose "(" and
#: ")" are characters, not groups) and the parentheses themselves
_GROUPING = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[()]')


def _is_atom(expr: str) -> bool:
    """Is ``expr`` one rule name, literal, class or parenthesised group (so a repeat suffix
    applies to all of it)?"""
    if _ATOM.match(expr):
        return True
    if not (expr.startswith("(") and expr.endswith(")")):
        return False
    depth = 0
    for token in _GROUPING.finditer(expr):
        if token.group() == "(":
            depth += 1
        elif token.group() == ")":
            depth -= 1
            if depth == 0:  # the first group closes: at the end, or it is one of several
                return token.end() == len(expr)
    return False


def _gbnf_parts(body: str) -> Iterator[tuple[str, str, int, int]]:
    """A GBNF body's tokens as :mod:`localllm.grammar.walk` reads them: (kind, text, start, end)."""
    for m in TOKEN.finditer(body):
        kind = m.lastgroup or ""
        yield kind, m.group(kind), m.start(kind), m.end(kind)


def _gbnf_names(body: str) -> list[str]:
    """The rule names a GBNF body refers to (and COMMA/COLON, the separators' placeholders)."""
    return [text for kind, text, _, _ in _gbnf_parts(body) if kind == "name"]


#: a counted repeat, and whether it repeats a group
_COUNTED = re.compile(r"(\)?)\{(\d+)(,?)(\d*)\}")


def _llama_may_refuse(body: str) -> bool:
    """Might llama.cpp refuse to repeat a group of ``body`` (:func:`_llama_refused_group`)?
    False when an upper bound says no, without reading the body as its parser does: every
    group, name (a space before it) and repeat made a rule in every group, times the largest
    count a group is repeated."""
    if "(" not in body:
        return False
    if "{" not in body:  # every count 1, and at most a rule per character
        return len(body) > LLAMA_REPEAT_RULES
    made = sum(body.count(c) for c in "( *+?") + 1
    most = 1
    for group, lo, comma, hi in _COUNTED.findall(body):
        count = int(hi) if hi else int(lo)
        made += (int(hi) - int(lo)) if hi else (0 if not comma else 1)
        if group:
            most = max(most, count)
    return made * most > LLAMA_REPEAT_RULES


def _llama_refused_group(body: str, seen: set[str]) -> tuple[int, int] | None:
    """The span of the first group in ``body`` that llama.cpp's parser refuses to repeat, or
    None. It counts the rules a group makes (itself, the groups in it, one per repeat
    beyond the least count, one per name it has not met before: ``seen``) and refuses when
    that times the repeat's largest count (its least when unbounded) passes
    :data:`LLAMA_REPEAT_RULES`."""
    made = 0
    opened: list[tuple[int, int]] = []  # (where, rules made before) per open group
    last: tuple[int, int, int] | None = None  # the last item: (start, end, rules it made)
    met: set[str] = set()  # names first met in this body
    for kind, part, start, end in _gbnf_parts(body):
        if part == "(":
            opened.append((start, made))
            made += 1
            last = None
        elif part == ")":
            begun, before = opened.pop()
            last = (begun, end, made - before)
        elif kind == "rep" or part in ("*", "+", "?"):
            if last is None:
                continue
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(part, (0, None))
            if kind == "rep":
                low, comma, high = part[1:-1].partition(",")
                lo = int(low)
                hi = lo if not comma else (int(high) if high else None)
            count = hi if hi else (lo or 1)
            if max(1, last[2]) * count > LLAMA_REPEAT_RULES and body[last[0]] == "(":
                return last[0], last[1]
            made += 1 if hi is None else hi - lo
            last = (last[0], last[1], max(1, last[2]) * count)
        elif part == "|":
            last = None
        else:
            if kind == "name" and part not in ("COMMA", "COLON") and part not in seen and part not in met:
                met.add(part)
                made += 1
            last = (start, end, 1)
    return None


def _alt(parts: Sequence[str]) -> str:
    unique = list(dict.fromkeys(parts))
    if len(unique) == 1:
        return unique[0]
    return "( " + " | ".join(unique) + " )"


def _trie(seqs: list[list[str]]) -> str:
    """Token sequences as one expression with every shared prefix written once."""
    groups: dict[str, list[list[str]]] = {}
    for seq in seqs:
        groups.setdefault(seq[0], []).append(seq[1:])
    alts = []
    for first, rests in groups.items():
        inner = [r for r in rests if r]
        if not inner:
            alts.append(first)
            continue
        sub = _trie(inner)
        sub = sub if _is_atom(sub) else f"( {sub} )"
        alts.append(f"{first} {sub}?" if len(inner) < len(rests) else f"{first} {sub}")
    return " | ".join(alts)


#: a const/enum with more values than this is written as a character trie (_literal_trie)
TRIE_LITERALS = 32
#: ... unless its values branch more than this many times along one value
TRIE_DEPTH = 32


def _literal_trie(texts: Sequence[str]) -> str | None:
    """Literal ``texts`` as one expression with every shared prefix written once, or None when
    they branch more than :data:`TRIE_DEPTH` times along one text.

    llama.cpp keeps one parse stack per alternative that can start at a position and checks
    each against the whole vocabulary for every token: 10,000 enum values as 10,000
    alternatives cost seconds a token; as a trie, the live alternatives at a position are the
    distinct next characters there. Runs without a branch are one literal. (:func:`_trie` is
    the same idea over GBNF tokens, for sequences of values.)"""
    root: dict[str | None, Any] = {}
    for text in texts:
        node = root
        for c in text:
            node = node.setdefault(c, {})
        node[None] = True

    def emit(node: dict[str | None, Any], depth: int) -> str | None:
        if depth > TRIE_DEPTH:
            raise _TooDeep
        alts = []
        for first, child in node.items():
            if first is None:
                continue
            run, at = [first], child
            while None not in at and len(at) == 1:
                (c, at), *_ = at.items()
                run.append(c)
            tail = emit(at, depth + 1)
            head = gbnf_literal("".join(run))
            alts.append(head if tail is None else f"{head} {tail}")
        if not alts:
            return None  # a value ends here and nothing follows
        inner = alts[0] if len(alts) == 1 else "( " + " | ".join(alts) + " )"
        if None in node:  # a value ends here, and others go on
            return f"{inner}?" if _is_atom(inner) else f"( {inner} )?"
        return inner

    try:
        return emit(root, 0) or '""'
    except _TooDeep:
        return None


class _TooDeep(Exception):
    """A literal trie branches deeper than TRIE_DEPTH (never leaves _literal_trie)."""


# ---------------------------------------------------------------------------- integers


def _same_length(a: str, b: str) -> str:
    """Digit strings of equal length between ``a`` and ``b`` (inclusive)."""
    if not a:
        return '""'
    if a == b:
        return gbnf_literal(a)
    if a[0] == b[0]:
        return f"{gbnf_literal(a[0])} {_same_length(a[1:], b[1:])}"
    n = len(a) - 1
    zeros, nines = "0" * n, "9" * n
    tail = f" [0-9]{{{n}}}" if n > 1 else (" [0-9]" if n == 1 else "")
    parts = []
    start, end = int(a[0]), int(b[0])
    if a[1:] != zeros:
        parts.append(f"{gbnf_literal(a[0])} {_same_length(a[1:], nines)}")
        start += 1
    high = None
    if b[1:] != nines:
        high = f"{gbnf_literal(b[0])} {_same_length(zeros, b[1:])}"
        end -= 1
    if start <= end:
        head = gbnf_literal(str(start)) if start == end else f"[{start}-{end}]"
        parts.append(head + tail)
    if high:
        parts.append(high)
    return _alt(parts)


def _nonneg_range(lo: int, hi: int | None) -> str:
    """Decimal integers in [lo, hi] without leading zeros (hi None: unbounded)."""
    lo_len = len(str(lo))
    parts = []
    if hi is None:
        # open above: up to MAX_INT_DIGITS digits (the lower bound's own length at least)
        parts.append(_same_length(str(lo), "9" * lo_len))
        longest = max(MAX_INT_DIGITS, lo_len)
        if longest > lo_len:
            parts.append(f"[1-9] {_repeat('[0-9]', lo_len, longest - 1)}")
    else:
        for length in range(lo_len, len(str(hi)) + 1):
            a = max(lo, 10 ** (length - 1) if length > 1 else 0)
            b = min(hi, 10**length - 1)
            parts.append(_same_length(str(a), str(b)))
    return _alt(parts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """Canonical JSON integers in [lo, hi]; either side may be open (then at most
    ``MAX_INT_DIGITS`` digits, or the bound's own length); never ``-0``."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append('"-" ' + _nonneg_range(mag_lo, None if lo is None else -lo))
    return _alt(parts)


# ---------------------------------------------------------------------------- the compiler


@dataclass
class _Bound:
    value: Fraction
    exclusive: bool


class _Compiler:
    def __init__(self, root: Any, *, space: bool, open_objects: bool = True) -> None:

        self.root = root
        self.colon = '":" " "?' if space else '":"'
        self.comma = '"," " "?' if space else '","'
        self.open_objects = open_objects
        self.rules: dict[str, str] = {}
        self.bodies: dict[str, str] = {}
        self.suffixes: dict[str, int] = {}  # per rule-name base: the last number it took
        self.renumbered: list[tuple[str, int | None]] = []  # (base, its number before), for restore
        self.refs: dict[str, str] = {}
        #: per ref target (in the root, so its id stays its): whether it reaches itself in
        #: place (:meth:`recursive`)
        self.cycles: dict[int, bool] = {}
        #: the rules of refs kept through the restores of failed branches (:meth:`restore`),
        #: and per note the ref whose rule it tells of (innermost; :meth:`owned`)
        self.kept: set[str] = set()
        self.owners: list[str | None] = []
        self.order_rules = 0
        #: regexes made by negating a literal search pattern -> the literal (see _avoiding)
        self.avoided: dict[str, tuple[_Search, ...]] = {}
        #: regexes made for the validator from the patterns of allOf components -> those patterns
        #: (their grammar is the product of their automata: see :meth:`product`)
        self.intersected: dict[str, tuple[str, ...]] = {}
        #: regexes made for the validator from a negated pattern -> that pattern
        self.complemented: dict[str, str] = {}
        #: NFA states the automata of this schema's patterns may still build and visit
        self.automaton_work = [automaton.WORK, automaton.WORK]
        #: pairs of patterns no string matches both of, and what such proofs may still spend
        self.disjoint: dict[tuple[str, str], bool] = {}
        #: excludes' verdicts on pairs of schema objects, and flat's objects (each with the
        #: objects it was given, held so that their ids stay theirs)
        self.excluded: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], bool]] = {}
        self.flats: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.proof_work = [automaton.WORK // 4, automaton.WORK // 4]
        self.products = 0
        #: partial negations taken (:meth:`negate`): fewer values, noted; the steps they may
        #: still take, and the refs being negated
        self.partial_negations = 0
        self.negations_left = MAX_PARTIAL_NEGATIONS
        #: overlapping oneOf branches read as anyOf (more values: only to prove a schema
        #: unsatisfiable, see :meth:`unsatisfiable_anyway`)
        self.overlapping = False
        self.negating: set[str] = set()
        #: satisfiable's trial verdicts: an alternative (canonical JSON) -> whether it admits a
        #: value; and the trials this schema may still run
        self.admits: dict[str, bool] = {}
        self.trials, self.trial_chars = MAX_TRIALS, MAX_TRIAL_CHARS
        self.work = MAX_COMPILE_WORK
        self.spent: _Refuse | None = None
        self.notes: list[str] = []
        if isinstance(root, dict) and "$schema" in root and not isinstance(root["$schema"], str):
            raise _Refuse("$", "$schema", f'"$schema" must be a URI string, got {_q(root["$schema"])}')
        cls = validator_class(root)
        self.draft = _DRAFTS.get(cls.__name__, 2020)
        if self.draft == 3:
            raise _Refuse("$", "$schema", "draft 3 schemas are not compiled (their keywords differ)")
        exc = meta_error(cls, root)
        if exc is not None:
            where = "$"
            for p in exc.absolute_path:
                where = child(where, p)
            raise _Refuse(where, "schema", f"not a valid schema: {exc.message}")
        self.validator = cls(root, format_checker=format_checker(cls))
        self.vocabulary = frozenset(cls.VALIDATORS)
        #: asserting keywords of other drafts: validation ignores them, so the grammar does
        self.foreign = keywords.ASSERTING - self.vocabulary - _READ_BY_OTHERS.get(self.draft, frozenset())
        self.root_id = root.get("$id") or root.get("id") if isinstance(root, dict) else None
        self.failures = _validation_failures()
        self.verdicts: dict[tuple[str, str], bool] = {}  # valid_among's
        #: the patterns read (:func:`_pattern_tree`): a subschema's patterns are read at each
        #: of its uses, and the negations the compiler writes are long (o19343 read 15
        #: patterns 675 times, 18 % of its time)
        self.trees: dict[str, tuple[Any, ...] | str] = {}
        if isinstance(root, dict):
            self.root = _local_refs(root, "id" if self.draft == 4 else "$id", legacy=self.draft <= 7)

    def valid(self, schema: Any, value: Any, path: str, construct: str) -> bool:
        """Does ``value`` validate against ``schema`` (a subschema of the root)? A schema the
        validator cannot evaluate is a refusal."""
        try:
            return bool(self.validator.evolve(schema=schema).is_valid(value))
        except self.failures as exc:
            why = f"the validator cannot evaluate this schema ({type(exc).__name__})"
            raise _Refuse(path, construct, why) from None

    def admitted(self, schema: Any, values: list[Any], path: str, construct: str) -> list[Any]:
        """The ``values`` valid against ``schema``, in order. Its ``const``/``enum`` are decided
        by JSON equality (:func:`_canon`) over a set: jsonschema's ``enum`` compares a value
        with every member, so n values against n members was quadratic (10,000 took 35 s)."""
        seen: set[str] = set()
        # a bare ref is its target (siblings of a ref would apply too: then no shortcut)
        while isinstance(schema, dict) and list(schema) == ["$ref"] and isinstance(schema["$ref"], str):
            if schema["$ref"] in seen:
                break
            seen.add(schema["$ref"])
            schema = self.resolve(schema["$ref"], path)[0]
        keys = [k for k in ("const", "enum") if isinstance(schema, dict) and k in schema and k in self.vocabulary]
        if not keys or not isinstance(schema.get("enum", []), list) or ("$ref" in schema and self.draft <= 7):
            return self.valid_among(schema, values, path, construct)
        members = [{_canon(schema["const"])}] if "const" in keys else []
        if "enum" in keys:
            members.append({_canon(m) for m in schema["enum"]})
        around = {k: v for k, v in schema.items() if k not in keys}
        listed = [v for v in values if all(_canon(v) in m for m in members)]
        return self.valid_among(around, listed, path, construct)

    def valid_among(self, schema: Any, values: list[Any], path: str, construct: str) -> list[Any]:
        """The ``values`` valid against ``schema``, in order. The verdicts are kept for the
        compile by the JSON text of both: the objects merged at each use of a subschema are
        new objects with the same content (o83932 checked 190 values against 33 schemas
        20,613 times, 30 % of its 7 s)."""
        try:
            text = json.dumps(schema, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return [v for v in values if self.valid(schema, v, path, construct)]
        kept = []
        for value in values:
            try:  # the JSON text tells 1 from 1.0 and true (draft 4's integer does too)
                key = (text, json.dumps(value, sort_keys=True, allow_nan=False))
            except (TypeError, ValueError, RecursionError):
                key = None
            verdict = self.verdicts.get(key) if key is not None else None
            if verdict is None:
                verdict = self.valid(schema, value, path, construct)
                if key is not None:
                    self.verdicts[key] = verdict
            if verdict:
                kept.append(value)
        return kept

    # ------------------------------------------------------------------ rules

    def run(self) -> CompiledGrammar:
        try:
            expr = self.gen(self.root, "$", 0, frozenset())
        except _Unsatisfiable as exc:
            if self.spent:
                raise self.spent from None
            if not self.partial_negations or self.unsatisfiable_anyway():
                raise
            # the values partial negations left out may be all the schema has
            why = exc.refusal.message.split(": ", 1)[-1]
            raise _Refuse(
                exc.refusal.path,
                "oneOf",
                f"{why}; but only once overlapping oneOf branches were told apart by partial negations, "
                "so the schema itself may admit values: not compiled",
            ) from None
        if self.spent:
            raise self.spent
        self.rules = {"root": expr, **self.rules}
        self.drop_unused()
        self.name_large_repeats()
        lines = [f"{name} ::= {body}" for name, body in self.rules.items()]
        text = "\n".join(lines).replace("COLON", self.colon).replace("COMMA", self.comma) + "\n"
        if len(text) > MAX_GRAMMAR_CHARS:
            raise _Refuse("$", "size", f"the grammar would be {len(text)} characters (at most {MAX_GRAMMAR_CHARS})")
        return CompiledGrammar(text, [], self.notes)

    def drop_unused(self) -> None:
        """The rules kept through failed branches (:meth:`restore`) that no other rule reaches
        in the end left out, and the notes of those refs. Every other rule stays, used or not
        (an object's property that its ``maxProperties`` leaves out keeps its rule), and so
        does each kept rule one of them names: llama.cpp refuses a grammar naming a rule it
        does not define, used or not."""
        if not self.kept:
            return
        used: set[str] = set()
        todo = ["root", *(name for name in self.rules if name not in self.kept)]
        while todo:
            name = todo.pop()
            if name not in used and name in self.rules:
                used.add(name)
                todo += _gbnf_names(self.rules[name])
        unused = self.kept - used  # some may be gone: a later restore found them not closed
        for name in unused:
            self.rules.pop(name, None)
        self.notes = [n for n, o in zip(self.notes, self.owned(), strict=True) if o not in unused]

    def name_large_repeats(self) -> None:
        """Make a rule of each group llama.cpp's parser would refuse to repeat
        (:func:`_llama_refused_group`), reading the rules in the order it does: ``( class{1,100}
        class-2{1,100} ){0,11}`` ("at most 12 words of at most 100 characters") made 199
        rules, and 199 × 11 passes its 2,000: the server refused the grammar the compiler
        called exact. Grammars under the limit are left as they are, byte for byte."""
        seen: set[str] = set()  # the names llama.cpp has met before the rule it reads
        names = list(self.rules)
        read = 0  # the rules whose names are in ``seen``
        i = 0
        while i < len(names):
            body = self.rules[names[i]]
            if _llama_may_refuse(body):
                for name in names[read:i]:
                    seen.add(name)
                    seen.update(_gbnf_names(self.rules[name]))
                seen.add(names[i])
                while (span := _llama_refused_group(body, seen)) is not None:
                    start, end = span
                    named = self.rule("group", body[start + 1 : end - 1].strip())
                    if named not in names:
                        names.append(named)
                    body = f"{body[:start]}{named}{body[end:]}"
                self.rules[names[i]] = body
                seen.update(_gbnf_names(body))
                read = i + 1
            i += 1

    def save(self) -> tuple[int, int, int, int, int]:
        """Where the rule tables and the notes stand, to undo a branch that turned out
        unsatisfiable (its notes would tell of something not generated).

        The tables only grow while a branch is built (a ``$ref``'s pending rule is filled in
        by the branch that added it), so undoing is dropping what came after; copying them
        for every property made an object of 100,000 properties quadratic."""
        return len(self.rules), len(self.bodies), len(self.refs), len(self.renumbered), len(self.notes)

    def restore(self, saved: tuple[int, int, int, int, int], *, keep: bool = True) -> None:
        """Undo what came after ``saved``, but for the refs whose rules were generated in
        full (:meth:`closed`): a ref's rule is the same wherever it is used, and generating it
        again in each branch of nested alternatives doubled the work at every level (a 3 KB
        schema: 3 s, each two more levels 4× that). ``keep=False`` for a trial, whose refs
        were generated without the context's depth and left-recursion guards."""
        kept = self.closed(saved) if keep else set()
        for table, size in zip((self.rules, self.bodies, self.refs), saved, strict=False):
            held = []
            while len(table) > size:
                key, value = table.popitem()  # the last added
                if (key if table is self.rules else value) in kept:
                    held.append((key, value))
            table.update(reversed(held))
        self.kept |= kept
        owners = self.owned()
        notes = [(n, o) for n, o in zip(self.notes[saved[4] :], owners[saved[4] :], strict=True) if o in kept]
        del self.notes[saved[4] :], self.owners[saved[4] :]
        self.notes += [n for n, _ in notes]
        self.owners += [o for _, o in notes]
        while len(self.renumbered) > saved[3]:
            base, before = self.renumbered.pop()
            if before is None:
                del self.suffixes[base]
            else:
                self.suffixes[base] = before

    def owned(self) -> list[str | None]:
        """Each note's ref (:meth:`ref` records it when the ref is done; None before), one
        per note."""
        self.owners += [None] * (len(self.notes) - len(self.owners))
        return self.owners

    def closed(self, saved: tuple[int, int, int, int, int]) -> set[str]:
        """The rules added since ``saved`` that belong to refs generated in full: each such
        ref's rule and the rules added since that it reaches, when none of them reaches a ref
        still being generated (whose rule may yet be dropped)."""
        added = set(itertools.islice(reversed(self.rules), len(self.rules) - saved[0]))
        kept: set[str] = set()
        for ref in itertools.islice(reversed(self.refs.values()), len(self.refs) - saved[2]):
            reached: set[str] = set()
            todo = [ref]
            while todo:
                name = todo.pop()
                body = self.rules.get(name)
                if body is None or name in reached or name in kept:
                    continue
                if body.startswith("@pending"):
                    break
                if name in added:
                    reached.add(name)
                    todo += _gbnf_names(body)
            else:
                kept |= reached
        return kept

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _PRIMITIVES[name]
            for dep in _primitive_deps(name):
                self.primitive(dep)
        return name

    def rule(self, hint: str, body: str) -> str:
        """A named rule for ``body`` (one rule per distinct body)."""
        if not body.startswith("(") and _is_atom(body):
            return body
        known = self.bodies.get(body)
        if known:
            return known
        base = re.sub(r"[^A-Za-z0-9]+", "-", hint).strip("-").lower()[:40] or "r"
        # names are only ever added: the numbers below the last one this base took are taken
        # still (probing from 1 each time made 8,000 properties take 11 s)
        before = self.suffixes.get(base)
        n = before or 1
        name = base if n == 1 else f"{base}-{n}"
        while name in self.rules or name in _PRIMITIVES or name == "root":
            n += 1
            name = f"{base}-{n}"
        if n != before:
            self.suffixes[base] = n
            self.renumbered.append((base, before))
        self.rules[name] = body
        self.bodies[body] = name
        return name

    # ------------------------------------------------------------------ schema objects

    def gen(self, node: Any, path: str, depth: int, bare: frozenset[str]) -> str:
        """The GBNF expression for ``node``; ``bare`` = refs entered without consuming input."""
        if depth > MAX_DEPTH:
            raise _Refuse(path, "depth", f"nested deeper than {MAX_DEPTH} schema levels")
        if node is True:
            return self.primitive("value")
        if node is False:
            raise _Unsatisfiable(path, "false", "the schema false admits no value")
        if not isinstance(node, dict):
            raise _Refuse(path, "schema", f"a schema must be an object or a boolean, got {_q(node)}")
        node = self.own(node)
        self.spend(_weight(node), path)
        if path != "$" and any(
            # the root's own id, carried into merged or distributed copies of the root, is no nesting
            isinstance(node.get(k), str) and not node[k].startswith("#") and node[k] != self.root_id
            for k in (("id",) if self.draft == 4 else ("$id",))  # draft 4 reads no "$id"
        ):
            raise _Refuse(path, "$id", "a nested $id changes how refs resolve; not compiled")
        if "$ref" in node and self.draft >= 2019 and ("unevaluatedProperties" in node or "unevaluatedItems" in node):
            node = self.unevaluated(node, path)  # before the $ref is split off: it evaluates too
        if "$ref" in node:
            siblings = {k: v for k, v in node.items() if k != "$ref" and _asserts(node, k)}
            if self.draft <= 7 or not siblings:
                return self.ref(node["$ref"], path, depth, bare)
            node = {"allOf": [{"$ref": node["$ref"]}, siblings]}
        if "unevaluatedProperties" in node or "unevaluatedItems" in node:
            node = self.unevaluated(node, path)
        for key in ("$dynamicRef", "$recursiveRef", "extends", "disallow"):
            if key in node and _asserts(node, key):
                raise _Refuse(path, key, f'"{key}" has no exact grammar equivalent')
        if "const" in node or "enum" in node:
            return self.literals(node, path)
        components = node.get("allOf")
        if (
            isinstance(components, list)
            and len(components) == 1
            and isinstance(components[0], dict)
            and [k for k in node if _asserts(node, k)] == ["allOf"]
        ):
            # {"allOf": [S]} is S (pydantic's and many hand-written schemas' way to describe a
            # ref): read as S, a ref in it stays a ref, so a recursive one is a recursive rule
            # rather than a merge unrolled level by level (a menu's "children": refused at 64)
            return self.gen(components[0], path, depth + 1, bare)
        rewritten = self.rewrite(node, path, depth)
        if rewritten is not None:
            return self.gen(rewritten, path, depth + 1, bare)
        if "allOf" in node and _asserts(node, "allOf"):
            merged, inlined = self.merge_all(node, path, depth, bare)
            return self.gen(merged, path, depth + 1, bare | inlined)
        if ("anyOf" in node and _asserts(node, "anyOf")) or ("oneOf" in node and _asserts(node, "oneOf")):
            return self.alternatives(node, path, depth, bare)
        return self.typed(node, path, depth)

    def spend(self, work: int, path: str) -> None:
        """Take ``work`` from the compile's budget (:data:`MAX_COMPILE_WORK`); refused past it:
        alternatives distributed over allOf components whose refs are merged in multiply at
        each level (a 2.7 KB schema of 14 levels took 10 s, each level more twice that)."""
        self.work -= work
        if self.work < 0:
            # kept: a refusal caught on the way (an extension pair left out) must not leave a
            # grammar narrowed by the budget alone (:meth:`run` raises it at the end)
            self.spent = self.spent or _Refuse(
                path,
                "size",
                f"compiling the schema takes more than {MAX_COMPILE_WORK:,} steps (a step for each keyword "
                "and entry of each subschema generated or allOf component merged, each pair of branches "
                "compared, each 32 characters of alternatives tried): its alternatives and allOf "
                "components multiply",
            )
            raise self.spent

    def own(self, node: dict[str, Any]) -> dict[str, Any]:
        """``node`` without the keywords its draft does not have (draft 4's ``const`` and
        ``contains``, ``unevaluated*`` before 2019-09, draft 3's ``divisibleBy`` …): the
        validator ignores them, so they neither constrain the grammar nor tell branches apart."""
        if self.foreign.isdisjoint(node):
            return node
        return {k: v for k, v in node.items() if k not in self.foreign}

    def unevaluated(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        """``unevaluatedProperties``/``unevaluatedItems`` in their simple form — no in-place
        applicator beside them (no allOf/anyOf/oneOf/not/if/dependentSchemas/$ref), so only the
        adjacent keywords evaluate — rewritten as the adjacent keyword they then equal:
        ``additionalProperties`` (none when it is already there: every key is evaluated),
        ``items`` after ``prefixItems`` (2019-09: ``additionalItems`` after an ``items``
        array). Beside in-place applicators it is refused (also in an allOf component, before
        the components are merged); ``contains`` (which evaluates the items it matches from
        2020-12) keeps ``unevaluatedItems`` refused."""
        if self.draft < 2019:
            return node
        if any(k in node for k in _IN_PLACE):
            return self.unevaluated_static(node, path)
        out = dict(node)
        if "unevaluatedProperties" in out and _asserts(out, "unevaluatedProperties"):
            value = out.pop("unevaluatedProperties")
            out.setdefault("additionalProperties", value)
        if "unevaluatedItems" in out and _asserts(out, "unevaluatedItems") and "contains" not in out:
            value = out.pop("unevaluatedItems")
            items = out.get("items")
            if self.draft >= 2020 or items is None or isinstance(items, (dict, bool)):
                out.setdefault("items", value)
            else:
                out.setdefault("additionalItems", value)
        return out

    def unevaluated_static(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        """``unevaluated*`` beside ``allOf``/``$ref`` only (through nested allOf and refs): which
        keys and positions are evaluated is then fixed by the schemas, not by which branch a
        value takes — the union of their ``properties`` names and ``patternProperties``
        patterns (every key once one has ``additionalProperties`` or ``unevaluatedProperties``),
        the longest prefix (every item once one has ``items`` after it or ``unevaluatedItems``).
        The keyword becomes one more allOf component saying exactly that. Beside
        anyOf/oneOf/not/if/dependentSchemas/contains (evaluation depends on the branch taken)
        it is refused."""
        names: dict[str, bool] = {}
        patterns: dict[str, bool] = {}
        every = {"unevaluatedProperties": False, "unevaluatedItems": False}
        prefix = 0
        seen: set[str] = set()

        def visit(schema: Any, top: bool, depth: int) -> str | None:
            nonlocal prefix
            if not isinstance(schema, dict) or depth > MAX_DEPTH:
                return None
            for key in _DYNAMIC_EVALUATION:
                if key in schema and _asserts(schema, key):
                    return key
            props, pats = schema.get("properties"), schema.get("patternProperties")
            names.update(dict.fromkeys(props if isinstance(props, dict) else {}, True))
            patterns.update(dict.fromkeys(pats if isinstance(pats, dict) else {}, True))
            if "additionalProperties" in schema or (not top and "unevaluatedProperties" in schema):
                every["unevaluatedProperties"] = True
            items = schema.get("items")
            if self.draft >= 2020:
                pre = schema.get("prefixItems")
                prefix = max(prefix, len(pre) if isinstance(pre, list) else 0)
                rest_items = "items" in schema
            else:
                prefix = max(prefix, len(items) if isinstance(items, list) else 0)
                rest_items = ("items" in schema and not isinstance(items, list)) or (
                    isinstance(items, list) and "additionalItems" in schema
                )
            if rest_items or (not top and "unevaluatedItems" in schema):
                every["unevaluatedItems"] = True
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref not in seen:
                seen.add(ref)
                found = visit(self.resolve(ref, path)[0], False, depth + 1)
                if found:
                    return found
            comps = schema.get("allOf")
            for comp in comps if isinstance(comps, list) else []:
                found = visit(comp, False, depth + 1)
                if found:
                    return found
            return None

        keys = [k for k in ("unevaluatedProperties", "unevaluatedItems") if k in node and _asserts(node, k)]
        blocker = visit(node, True, 0)
        if blocker is not None and keys:
            raise _Refuse(
                path,
                keys[0],
                f'"{keys[0]}" with "{blocker}" in an applicator beside it (evaluation depends on the branch taken) '
                "is not compiled",
            )
        out = {k: v for k, v in node.items() if k not in ("unevaluatedProperties", "unevaluatedItems")}
        extra: list[Any] = []
        for key in keys:
            if every[key]:
                continue  # every key (item) is evaluated: the keyword never applies
            if key == "unevaluatedProperties":
                comp: dict[str, Any] = {"properties": dict.fromkeys(names, True), "additionalProperties": node[key]}
                if patterns:
                    comp["patternProperties"] = dict.fromkeys(patterns, True)
                extra.append(comp)
            elif self.draft >= 2020:
                extra.append({"prefixItems": [True] * prefix, "items": node[key]} if prefix else {"items": node[key]})
            else:
                extra.append(
                    {"items": [True] * prefix, "additionalItems": node[key]} if prefix else {"items": node[key]}
                )
        if extra:
            own = out.get("allOf")
            out["allOf"] = [*(own if isinstance(own, list) else []), *extra]
        return out

    # ------------------------------------------------------------------ rewriting into anyOf/allOf

    def rewrite(self, node: dict[str, Any], path: str, depth: int) -> dict[str, Any] | None:
        """``node`` with ``not``, ``if``/``then``/``else``, ``dependentRequired``,
        ``dependentSchemas`` and ``dependencies`` rewritten into ``allOf``/``anyOf`` of positive
        schemas (the same values, or fewer with a note), or None when it has none of them."""
        present = [k for k in _REWRITTEN if k in node]
        if "not" in present and (_not_an_integer(node) or _excluded_steps(node) is not None):
            present.remove("not")  # no positive schema says it: gen_number writes it
        if not present:
            return None
        # a keyword the schema's draft does not have constrains nothing (draft 4 has no "if")
        keys = [k for k in present if k in self.vocabulary and _asserts(node, k)]
        rest = {k: v for k, v in node.items() if k not in (*present, "then", "else")}
        parts: list[Any] = []
        for key in keys:
            value = node[key]
            if key == "not":
                neg = self.negate(value, child(path, "not"), depth)
                if neg is None:
                    raise _Refuse(path, "not", f'"not" of {_brief(value)} has no exact grammar equivalent')
                parts.append(neg)
            elif key == "if":
                then, other = node.get("then", True), node.get("else", True)
                neg = self.negate(value, child(path, "if"), depth)
                if neg is None:
                    raise _Refuse(path, "if", '"if" whose condition cannot be negated has no exact grammar equivalent')
                parts.append({"anyOf": [_both(value, then), _both(neg, other)]})
            else:
                if not isinstance(value, dict):
                    raise _Refuse(path, key, f'"{key}" must be an object')
                for name, dep in value.items():
                    absent = {"properties": {name: False}}
                    if isinstance(dep, list):
                        if not all(isinstance(d, str) for d in dep):
                            raise _Refuse(path, key, f'"{key}" lists must hold property names')
                        when: Any = {"required": [name, *dep]}
                    elif key == "dependentRequired":
                        raise _Refuse(path, key, '"dependentRequired" values must be arrays of names')
                    else:
                        when = _both({"required": [name]}, dep)
                    parts.append({"anyOf": [absent, when]})
        if not parts:
            return rest
        own = rest.get("allOf")
        components = [*(own if isinstance(own, list) else []), *parts]
        rest.pop("allOf", None)
        return {**rest, "allOf": components} if components else rest

    def negate(self, node: Any, path: str, depth: int, partial: bool = False) -> Any | None:
        """A schema for the values ``node`` rejects (fewer only where a note says so), or None
        when that has no grammar here. Keywords of one kind constrain only values of that
        kind, so ``not {type: string, minLength: 3}`` is "not a string, or a string of at most 2".

        ``partial``: a value is rejected when one keyword rejects it, so the values the
        keywords with a negation here reject are some of them (fewer, noted); None only when
        no keyword has one. A ref met again inside its own negation has none (what only its
        recursion rejects is left out), and one schema's partial negations take at most
        :data:`MAX_PARTIAL_NEGATIONS` steps: two recursive properties would otherwise double
        the work at each level."""
        if partial:
            self.negations_left -= 1
            if depth > MAX_DEPTH or self.negations_left < 0:
                return None
        if depth > MAX_DEPTH:
            raise _Refuse(path, "depth", f"nested deeper than {MAX_DEPTH} schema levels")
        if node is True:
            return False
        if node is False:
            return True
        if not isinstance(node, dict):
            return None
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str):
                return None
            target = self.resolve(ref, path)[0]
            siblings = {k: v for k, v in node.items() if k != "$ref" and _asserts(node, k)}
            whole = target if self.draft <= 7 or not siblings else {"allOf": [target, siblings]}
            if partial:
                if ref in self.negating:
                    return None
                self.negating.add(ref)
                try:
                    return self.negate(whole, path, depth + 1, partial)
                finally:
                    self.negating.discard(ref)
            if whole is target:
                return self.negate(target, path, depth + 1)
            node = whole
        # a keyword the schema's draft does not have rejects nothing (draft 4 has no "const")
        keys = [k for k in node if k in keywords.ASSERTING and k in self.vocabulary and _asserts(node, k)]
        if not keys:
            return False
        alts: list[Any] = []
        dropped: list[str] = []
        for key in keys:
            neg = self.negate_keyword(node, key, path, depth, partial)
            if neg is None:
                if not partial:
                    return None
                dropped.append(key)
                continue
            if neg is True:
                return True
            if neg is not False:
                alts.append(neg)
        if dropped:
            if not alts:
                return None
            self.negated_partly(path, ", ".join(f'"{k}"' for k in dropped))
        if not alts:
            return False
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def negate_keyword(
        self, node: dict[str, Any], key: str, path: str, depth: int, partial: bool = False
    ) -> Any | None:
        """The values ``node[key]`` alone rejects (False: none; None: not expressible);
        ``partial`` as in :meth:`negate`."""
        value = node[key]
        if key == "type":
            types = _type_set(value)
            if types is None:
                return None
            others = [t for t in _TYPES if t not in types and not (t == "integer" and "number" in types)]
            if "integer" in types and "number" not in types:
                # the numbers left are the non-integers: no type says that, a kept "not" does
                fraction = {"type": "number", "not": {"type": "integer"}}
                others = [t for t in others if t != "number"]
                return {"anyOf": [{"type": others}, fraction]} if others else fraction
            return {"type": others} if others else False
        if key in ("const", "enum"):
            values = [value] if key == "const" else value
            return self.negate_literals(values, path) if isinstance(values, list) else None
        if key == "allOf" and isinstance(value, list):
            negs = [self.negate(v, path, depth + 1, partial) for v in value]
            if any(n is None for n in negs):
                if not partial or all(n is None for n in negs):
                    return None
                self.negated_partly(path, '"allOf" components')
            negs = [n for n in negs if n is not False and n is not None]
            return {"anyOf": negs} if negs else False
        if key == "oneOf" and isinstance(value, list) and len(value) == 1:
            return self.negate(value[0], path, depth + 1, partial)
        if key == "anyOf" and isinstance(value, list):
            negs = [self.negate(v, path, depth + 1, partial) for v in value]
            if any(n is None for n in negs):
                return None
            if any(n is False for n in negs):
                return False
            return {"allOf": negs}
        if key == "not":
            return value
        if self.draft == 4 and key in _EXCL and node.get(_EXCL[key]) is True:
            # "not < 5" is ">= 5": draft 4 writes it as the plain opposite bound
            if not _num(value):
                return None
            return {"type": "number", "minimum" if key == "maximum" else "maximum": value}
        flipped = _FLIPPED_BOUNDS.get(key)
        if flipped is not None:
            kind, other, step = flipped
            if not _num(value):
                return None
            if step:
                if not _count(value) or (step < 0 and value == 0):
                    return False if _count(value) else None
                return {"type": kind, other: int(value) + step}
            return {"type": kind, **(self.strict_bound(other, value) if key in _EXCL else {other: value})}
        if key in ("multipleOf", "divisibleBy"):
            # the numbers that are no multiple of an integer step: no positive keyword says it,
            # a kept "not" does (gen_non_multiples); a decimal step's have no grammar here
            whole = _num(value) and value > 0 and Fraction(str(value)).denominator == 1
            return {"type": "number", "not": {key: value}} if whole else None
        if key == "pattern" and isinstance(value, str):
            searches = _literal_searches(value)
            avoid = None if searches is None else _avoiding(searches)
            if searches is not None and avoid is not None:
                self.avoided[avoid] = searches
                return {"type": "string", "pattern": avoid}
            negation = self.complement(value)
            return None if negation is None else {"type": "string", "pattern": negation}
        if key == "format" and isinstance(value, str):
            if value not in self.validator.format_checker.checkers:
                return False  # an annotation in this draft: it rejects nothing
            superset, exact = SUPERSETS.get(value, (None, False))
            if superset is None or not (exact or partial) or (negation := self.complement(superset)) is None:
                return None
            if not exact:
                self.negated_partly(
                    path, f'"format": {_q(value)}', f"negated here as the strings {_q(superset)} does not match"
                )
            return {"type": "string", "pattern": negation}
        if key == "required" and isinstance(value, list):
            names = [n for n in value if isinstance(n, str)]
            return {"anyOf": [{"type": "object", "properties": {n: False}} for n in names]} if names else False
        if key == "properties" and isinstance(value, dict):
            alts = []
            dropped = []
            for name, sub in value.items():
                neg = self.negate(sub, child(child(path, "properties"), name), depth + 1, partial)
                if neg is None:
                    if not partial:
                        return None
                    dropped.append(name)
                elif neg is not False:
                    alts.append({"type": "object", "required": [name], "properties": {name: neg}})
            if dropped:
                if not alts:
                    return None
                self.negated_partly(path, "the schemas of " + ", ".join(map(_q, dropped)))
            return {"anyOf": alts} if alts else False
        if key == "additionalProperties" and value is False:
            # an object with a key outside properties/patternProperties: objects are generated
            # closed, so none is generated (fewer values)
            self.notes.append(f"{path}: objects with undeclared keys are not generated")
            return False
        if key == "items" and isinstance(value, (dict, bool)) and "prefixItems" not in node:
            neg = self.negate(value, child(path, "items"), depth + 1, partial)
            if neg is None or neg is False:
                return neg
            self.notes.append(f"{path}: only arrays whose first item breaks items are generated")
            first = {"prefixItems": [neg]} if self.draft >= 2020 else {"items": [neg]}
            return {"type": "array", "minItems": 1, **first}
        return None

    def unsatisfiable_anyway(self) -> bool:
        """Does the schema admit no value even with overlapping ``oneOf`` branches read as
        ``anyOf`` (more values)? Then no partial negation left its values out. Tried on the
        work budgets left; a refusal there is no proof."""
        wider = _Compiler(self.root, space=False, open_objects=self.open_objects)
        wider.overlapping = True
        wider.automaton_work, wider.proof_work, wider.work = self.automaton_work, self.proof_work, self.work
        try:
            wider.gen(wider.root, "$", 0, frozenset())
        except _Unsatisfiable:
            return True
        except _Refuse:
            return False
        return False

    def negated_partly(self, path: str, what: str, why: str = "no negation here") -> None:
        """A partial negation (:meth:`negate`) left out (some of) what ``what`` alone rejects: noted."""
        self.partial_negations += 1
        self.notes.append(
            f"{path}: of the values this schema rejects, those rejected only by {what} are not generated ({why})"
        )

    def negate_literals(self, values: list[Any], path: str) -> Any:
        """Every value but ``values``: each kind none of them has, the other booleans, numbers
        between the excluded ones, and strings outside a finite set (a trie complement regex)."""
        alts: list[Any] = []
        kinds = {_kind(v) for v in values}
        for kind in ("object", "array", "string", "number", "boolean", "null"):
            if kind not in kinds:
                alts.append({"type": "number" if kind == "number" else kind})
        if "boolean" in kinds:
            rest = [b for b in (True, False) if not any(v is b for v in values)]
            if rest:
                alts.append({"enum": rest})
        if "number" in kinds:
            points = sorted(
                {Fraction(repr(v)) if isinstance(v, float) else Fraction(v) for v in values if _kind(v) == "number"}
            )
            edges: list[Any] = [None, *points, None]
            for lo, hi in itertools.pairwise(edges):
                interval: dict[str, Any] = {"type": "number"}
                if lo is not None:
                    interval.update(self.strict_bound("exclusiveMinimum", _plain(lo)))
                if hi is not None:
                    interval.update(self.strict_bound("exclusiveMaximum", _plain(hi)))
                alts.append(interval)
        if "string" in kinds:
            strings = [v for v in values if isinstance(v, str)]
            alts.append({"type": "string", "pattern": _not_one_of(strings)})
        if kinds & {"array", "object"}:
            self.notes.append(f"{path}: arrays/objects are left out where a negated enum lists one")
        return {"anyOf": alts} if alts else False

    def strict_bound(self, key: str, value: Any) -> dict[str, Any]:
        """``exclusiveMinimum``/``exclusiveMaximum`` at ``value`` as the schema's draft writes it:
        draft 4's are flags beside ``minimum``/``maximum`` (a number there is ignored)."""
        if self.draft == 4:
            return {"minimum" if key == "exclusiveMinimum" else "maximum": value, key: True}
        return {key: value}

    def ref(self, ref: Any, path: str, depth: int, bare: frozenset[str]) -> str:
        if not isinstance(ref, str):
            raise _Refuse(path, "$ref", f'"$ref" must be a string, got {_q(ref)}')
        target, target_path = self.resolve(ref, path)
        if ref in bare and self.recursive(target, path):
            raise _Refuse(path, "$ref", f'"$ref": {_q(ref)} recurses without consuming input (left recursion)')
        name = self.refs.get(ref)
        if name is not None:
            return name
        name = self.rule(f"ref-{ref.split('/')[-1] or 'root'}", f"@pending {ref}")
        self.refs[ref] = name
        notes = len(self.notes)
        self.rules[name] = self.gen(target, target_path, depth + 1, bare | {ref})
        owners = self.owned()
        for i in range(notes, len(owners)):
            owners[i] = owners[i] or name
        return name

    def recursive(self, target: Any, path: str) -> bool:
        """Whether a ref's ``target`` reaches itself in place (through what applies to the same
        value: :func:`_in_place`'s subschemas, refs followed). Only such a ref met again
        without input consumed is left recursion; one that cannot was met again as a conjunct
        of what is being generated (devinit's items: ``allOf: [runObject]`` beside ``anyOf:
        [runObject]``; an allOf of a ref and an ``if`` whose ``then`` names it) and is generated
        again: the conjunction is the same, and the ref's rule never depends on where it was met."""
        if id(target) not in self.cycles:
            todo, reached, found = [target], {id(target)}, False
            while todo and not found:
                node = todo.pop()
                self.spend(1, path)
                if not isinstance(node, dict):
                    continue
                subs = list(_in_place(node, legacy=self.draft <= 7))
                if isinstance(node.get("$ref"), str):
                    with contextlib.suppress(_Refuse):  # refused where it is generated, if it is
                        subs.insert(0, self.resolve(node["$ref"], path)[0])
                for sub in subs:
                    found = sub is target
                    if found:
                        break
                    if isinstance(sub, dict) and id(sub) not in reached:
                        reached.add(id(sub))
                        todo.append(sub)
            self.cycles[id(target)] = found
        return self.cycles[id(target)]

    def resolve(self, ref: str, path: str) -> tuple[Any, str]:
        fragment = ref
        if isinstance(self.root_id, str) and "#" in ref and ref.split("#", 1)[0] == self.root_id.split("#", 1)[0]:
            fragment = "#" + ref.split("#", 1)[1]
        if fragment in ("#", ""):
            return self.root, "$"
        if not fragment.startswith("#/"):
            raise _Refuse(path, "$ref", f'"$ref": {_q(ref)} is not a local "#/..." reference')
        found = resolve_pointer(self.root, fragment[1:])
        if found is None:
            raise _Refuse(path, "$ref", f'"$ref": {_q(ref)} does not resolve in this document')
        return found

    # ------------------------------------------------------------------ literals

    def literals(self, node: dict[str, Any], path: str) -> str:
        values = [node["const"]] if "const" in node else node["enum"]
        if not isinstance(values, list):
            raise _Refuse(path, "enum", '"enum" must be an array')
        for value in values:
            try:
                json.dumps(value, allow_nan=False)
            except (ValueError, TypeError, RecursionError) as exc:
                raise _Refuse(path, "enum", f"a listed value is not finite JSON ({exc})") from None
        texts = [
            json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            for value in self.admitted(node, values, path, "enum")
        ]
        if not texts:
            raise _Unsatisfiable(
                path, "const" if "const" in node else "enum", "no listed value satisfies the schema around it"
            )
        if len(texts) > TRIE_LITERALS and (trie := _literal_trie(list(dict.fromkeys(texts)))) is not None:
            return trie
        return _alt([gbnf_literal(text) for text in texts])

    # ------------------------------------------------------------------ anyOf / oneOf

    def alternatives(self, node: dict[str, Any], path: str, depth: int, bare: frozenset[str]) -> str:
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
        groups: list[tuple[str, list[Any]]] = []
        for key in ("anyOf", "oneOf"):
            if key in node:
                alts = node[key]
                if not isinstance(alts, list) or not alts:
                    raise _Refuse(path, key, f'"{key}" must be a non-empty array')
                groups.append((key, alts))
        branches: list[Any] = [rest] if any(_asserts(rest, k) for k in rest) else [{}]
        for key, given in groups:
            if len(branches) * len(given) > MAX_BRANCHES:  # before oneOf's pairwise proofs: 1,000 took 17 s
                raise _Refuse(path, key, f"more than {MAX_BRANCHES} alternatives after distributing siblings")
            alts = self.exclusive(given, rest, path, depth) if key == "oneOf" else given
            combined = []
            for b in branches:
                for a in alts:
                    combined.append({"allOf": [b, a]} if b else a)
            if len(combined) > MAX_BRANCHES:
                raise _Refuse(path, key, f"more than {MAX_BRANCHES} alternatives after distributing siblings")
            branches = combined
        exprs = []
        first: _Refuse | None = None
        for i, branch in enumerate(branches):
            saved = self.save()
            try:
                exprs.append(self.gen(branch, child(path, i) if len(branches) > 1 else path, depth + 1, bare))
            except _Unsatisfiable as exc:
                self.restore(saved)
                first = first or exc
        if not exprs:
            assert first is not None
            raise first
        return _alt(exprs)

    def exclusive(self, alts: list[Any], rest: dict[str, Any], path: str, depth: int) -> list[Any]:
        """``oneOf`` branches as ``anyOf`` branches: as they are when provably disjoint, else
        each branch and the negation of every other (refused when one has no negation). A
        negation may be partial (:meth:`negate`: the values some of the branch's keywords
        reject, noted): each value generated still matches exactly one branch."""
        try:
            self.check_disjoint(alts, rest, path)
            return alts
        except _Unsatisfiable:
            raise
        except _Refuse as first:
            if self.overlapping:
                return alts
            saved, partial, left = self.save(), self.partial_negations, self.negations_left
            negs = [self.negate(a, child(child(path, "oneOf"), i), depth + 1, True) for i, a in enumerate(alts)]
            width = [len(n["anyOf"]) if isinstance(n, dict) and isinstance(n.get("anyOf"), list) else 1 for n in negs]
            if any(n is None for n in negs) or any(
                math.prod(w for j, w in enumerate(width) if j != i) > MAX_BRANCHES for i in range(len(negs))
            ):
                self.restore(saved)
                self.partial_negations, self.negations_left = partial, left
                told = self.discriminated(alts, rest, path)
                if told is None:
                    raise first from None
                return told
            out = []
            for i, a in enumerate(alts):
                others = [n for j, n in enumerate(negs) if j != i and n is not True]
                out.append({"allOf": [a, *others]} if others else a)
            return out

    def discriminated(self, alts: list[Any], rest: dict[str, Any], path: str) -> list[Any] | None:
        """``oneOf`` branches told apart by a property each declares with values no other
        branch's admits (``{"kind": {"const": "a"}}``, ...) but none requires: generated with
        it present (fewer values, noted), each value then matches its own branch alone. None
        when no declared property does that."""
        targets = [self.flat(a, path) for a in alts]
        if not all(isinstance(t, dict) and isinstance(t.get("properties"), dict) for t in targets):
            return None
        for name in targets[0]["properties"]:
            if not all(name in t["properties"] for t in targets[1:]):
                continue
            try:
                self.check_disjoint(alts, {**rest, "required": [*_required(rest), name]}, path)
            except _Refuse:
                continue
            self.partial_negations += 1  # no value left would be no proof the schema has none
            self.notes.append(f"{path}: oneOf branches are generated with {_q(name)}, which tells them apart")
            return [{"allOf": [{"required": [name]}, a]} for a in alts]
        return None

    def check_disjoint(self, alts: list[Any], rest: dict[str, Any], path: str) -> None:
        targets = [self.flat(a, path) for a in alts]
        always = [i for i, t in enumerate(targets) if t is True or t == {}]
        if len(always) > 1:
            raise _Unsatisfiable(
                child(child(path, "oneOf"), always[1]),
                "oneOf",
                f'"oneOf" branches {always[0]} and {always[1]} both admit every value, so no value is valid',
            )
        for i, a in enumerate(targets):
            for j, b in enumerate(targets):
                if i != j and not self.excludes(a, b, rest, path):
                    raise _Refuse(
                        child(child(path, "oneOf"), j),
                        "oneOf",
                        f'"oneOf" branches {i} and {j} may both match; only provably disjoint '
                        'branches are compiled (use "anyOf" if overlap is fine)',
                    )

    def flat(self, node: Any, path: str) -> Any:
        """``node`` with its refs followed and without the keywords its draft does not have
        (the same object for the same node, which :meth:`excludes` keeps its verdicts by)."""
        seen: set[str] = set()
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"] not in seen:
            seen.add(node["$ref"])
            node = self.resolve(node["$ref"], path)[0]
        if not isinstance(node, dict) or self.foreign.isdisjoint(node):
            return node
        held = self.flats.get(id(node))
        if held is None or held[0] is not node:
            held = self.flats[id(node)] = (node, self.own(node))
        return held[1]

    def excludes(self, a: Any, b: Any, rest: dict[str, Any] | None = None, path: str = "$") -> bool:
        """True when no value generated for ``a`` (beside ``rest``) is valid against ``b``.
        Without ``rest``, each pair's verdict is kept (by the objects, held): objects whose
        required properties share schemas are a DAG, read as a tree it doubled at every level
        (a 2 KB schema: 26 s); a pair met again while being decided (a recursive ref) is not
        proven apart."""
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False
        if rest:
            return self.excluding(a, b, rest, path)
        held = self.excluded.get((id(a), id(b)))
        if held is not None and held[0] is a and held[1] is b:
            return held[2]
        self.excluded[id(a), id(b)] = (a, b, False)
        self.spend(1, path)
        verdict = self.excluding(a, b, None, path)
        self.excluded[id(a), id(b)] = (a, b, verdict)
        return verdict

    def excluding(self, a: dict[str, Any], b: dict[str, Any], rest: dict[str, Any] | None, path: str) -> bool:
        """:meth:`excludes` decided."""
        lits = _literal_values(a)
        if lits is not None:
            return not self.admitted(b, lits, "$", "oneOf")
        ka, kb = self.kinds(a) or _generated_kinds({**(rest or {}), **a}), self.kinds(b)
        if ka is not None and kb is not None and not ka & kb:
            return True
        if ka == {"string"}:
            # a's strings match its pattern and its format's superset; b's valid ones, b's
            mine, theirs = self.string_patterns(a, generated=True), self.string_patterns(b)
            return any(self.no_string_matches_both(p, q) for p in mine for q in theirs)
        if ka == {"object"}:
            pa: dict[str, Any] = a["properties"] if isinstance(a.get("properties"), dict) else {}
            pb: dict[str, Any] = b["properties"] if isinstance(b.get("properties"), dict) else {}
            for name in dict.fromkeys([*_required(a), *_required(rest or {})]):
                # every value for a has the name (a or its siblings require it): b forbids it,
                # or their schemas for it exclude
                if _forbids(b, name):
                    return True
                if (
                    name in pa
                    and name in pb
                    and self.excludes(self.flat(pa[name], "$"), self.flat(pb[name], "$"), path=path)
                ):
                    return True
            for name in _required(b):
                # a value for a lacks the name (b rejects it) or has a's value for it
                if _forbids(a, name):
                    return True
                if name in pa and (
                    pa[name] is False
                    or (name in pb and self.excludes(self.flat(pa[name], "$"), self.flat(pb[name], "$"), path=path))
                ):
                    return True
        return False

    def string_patterns(self, node: dict[str, Any], *, generated: bool = False) -> list[str]:
        """Patterns every string valid against ``node`` matches (``generated``: every string
        generated for it): its own, and its format's superset (:data:`SUPERSETS`) when the
        format is checked here (or, generated, when its grammar writes it)."""
        out = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        fmt = node.get("format")
        if fmt in SUPERSETS and (fmt in _FORMATS if generated else fmt in self.validator.format_checker.checkers):
            out.append(SUPERSETS[fmt][0])
        return out

    def no_string_matches_both(self, a: str, b: str) -> bool:
        """True when ``re`` finds both patterns in no string: their exact readings' product
        is empty (False when one has no exact reading or the product is too large to build).
        The proofs of one schema share a work budget of their own (a quarter of the
        automata's), so they never take what its patterns' products need."""
        key = (a, b) if a <= b else (b, a)
        if key not in self.disjoint:
            try:
                both = [self.branches(a, "$", exact=True), self.branches(b, "$", exact=True)]
                empty = automaton.intersection(
                    both, ((0, _MAX_CP),), limit=MAX_PRODUCT_STATES, nfa_limit=MAX_STATES, work=self.proof_work
                )
                self.disjoint[key] = empty is None
            except (_Refuse, automaton.TooLarge):
                self.disjoint[key] = False
        return self.disjoint[key]

    def kinds(self, node: Any, depth: int = 0) -> set[str] | None:
        """The JSON kinds ``node`` admits at most (integer counts as number), when its type,
        literals or alternatives say (refs followed), else None."""
        if not isinstance(node, dict) or depth > 16:
            return None
        known = _schema_kinds(node)
        for key in ("anyOf", "oneOf"):
            alts = node.get(key)
            if isinstance(alts, list) and alts:
                union: set[str] = set()
                for alt in alts:
                    k = self.kinds(self.flat(alt, "$"), depth + 1)
                    if k is None:
                        union = set(_TYPES) - {"integer"}
                        break
                    union |= k
                known = union if known is None else known & union
        return known

    # ------------------------------------------------------------------ allOf

    def merge_all(
        self, node: dict[str, Any], path: str, depth: int, bare: frozenset[str]
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """``node``'s allOf merged into one schema, and the refs inlined on the way."""
        comps = node["allOf"]
        if not isinstance(comps, list) or not comps:
            raise _Refuse(path, "allOf", '"allOf" must be a non-empty array')
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
        seen: set[str] = set()
        if "if" in self.vocabulary:

            def objects_only(schema: Any) -> bool:
                try:
                    kinds = self.kinds(self.flat(schema, path))
                except _Refuse:
                    return False
                return kinds is not None and kinds <= {"object"}

            comps = _switch(node, comps, objects_only)
        for comp in self.flatten(comps, path, depth, frozenset(bare), seen):
            merged = self.merge(merged, comp, path)
        return merged, frozenset(bare) | frozenset(seen)

    def flatten(
        self, comps: list[Any], path: str, depth: int, chain: frozenset[str], seen: set[str]
    ) -> Iterator[dict[str, Any]]:
        """The allOf components, refs inlined: ``chain`` holds the refs being expanded (reaching
        one again is left recursion), ``seen`` those already merged (a second use adds nothing)."""
        if depth > MAX_DEPTH:
            raise _Refuse(path, "allOf", f"allOf nested deeper than {MAX_DEPTH}")
        for given in comps:
            if given is True:
                continue
            if given is False:
                raise _Unsatisfiable(path, "allOf", "an allOf component is false")
            if not isinstance(given, dict):
                raise _Refuse(path, "allOf", f"an allOf component must be a schema, got {_q(given)}")
            comp = dict(self.own(given))
            if "unevaluatedProperties" in comp or "unevaluatedItems" in comp:
                comp = self.unevaluated(comp, path)  # before the $ref is taken out: it evaluates too
            if "$ref" in comp:
                ref = comp.pop("$ref")
                if not isinstance(ref, str):
                    raise _Refuse(path, "$ref", '"$ref" must be a string')
                target = self.resolve(ref, path)[0]
                if ref in chain and self.recursive(target, path):
                    raise _Refuse(path, "$ref", f"allOf reaches {_q(ref)} again without consuming input")
                if self.draft <= 7:
                    comp.clear()
                if ref not in seen:  # allOf is idempotent: the same target merged twice is merged once
                    seen.add(ref)
                    yield from self.flatten([target], path, depth + 1, chain | {ref}, seen)
            if "unevaluatedProperties" in comp or "unevaluatedItems" in comp:
                comp = self.unevaluated(comp, path)
            if any(k in comp for k in _REWRITTEN if k != "not"):
                # if/dependent* of a component become allOf/anyOf parts merged like the rest (two
                # components' "if" cannot be merged as keywords); "not" merges as it is
                comp = self.rewrite({k: v for k, v in comp.items() if k != "not"}, path, depth + 1) or comp
                if "not" in given:
                    comp["allOf"] = [*comp.get("allOf", []), {"not": given["not"]}]
            if "allOf" in comp:
                inner = comp.pop("allOf")
                if not isinstance(inner, list):
                    raise _Refuse(path, "allOf", '"allOf" must be an array')
                yield from self.flatten(inner, path, depth + 1, chain, seen)
            if "oneOf" in comp:
                alts = comp.pop("oneOf")
                if not isinstance(alts, list) or not alts:
                    raise _Refuse(path, "oneOf", '"oneOf" must be a non-empty array')
                alts = self.exclusive(alts, comp, path, depth)
                comp["anyOf"] = (
                    alts if "anyOf" not in comp else [{"allOf": [x, {"anyOf": comp["anyOf"]}]} for x in alts]
                )
            yield comp

    def merge(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        self.spend(_weight(a) + _weight(b), path)
        out = dict(a)
        shape = ("properties", "additionalProperties", "patternProperties")
        if any(k in b for k in shape) and any(k in a for k in shape):
            out.update(self.merge_properties(a, b, path))
        positional = _POSITIONAL_ITEMS
        if any(k in b for k in positional) and any(k in a for k in positional):
            # each component's items/additionalItems apply after its OWN prefix: merge position by position
            for k in positional:
                out.pop(k, None)
            out.update(self.merge_items(a, b, path))
        literal_merge = ("const" in b or "enum" in b) and ("const" in out or "enum" in out)
        if literal_merge:
            mine = _literal_values(out)
            other = _literal_values(b)
            if mine is None or other is None:
                raise _Refuse(path, "enum", '"enum" must be an array')
            keys = {_canon(v) for v in other}
            out.pop("const", None)
            out["enum"] = [v for v in mine if _canon(v) in keys]
        flagged = self.merge_flagged_bounds(out, b) if self.draft == 4 else set()
        if self.draft >= 2019:
            flagged |= self.merge_contains(out, b, path)
        for key, value in b.items():
            if key in flagged:
                continue
            if key in ("const", "enum") and literal_merge:
                continue
            if key in shape and any(k in a for k in shape):
                continue
            if key in positional and any(k in a for k in positional):
                continue
            if key not in out:
                out[key] = value
                continue
            held = out[key]
            # JSON-equal values are equal in Python (which also takes true for 1): the JSON
            # texts only when Python says equal (o13457: 108,620 compared, 41,619 equal)
            if not _asserts(b, key) or held is value or (held == value and _canon(held) == _canon(value)):
                continue
            out[key] = self.merge_keyword(key, out[key], value, path)
        return out

    def merge_flagged_bounds(self, out: dict[str, Any], b: dict[str, Any]) -> set[str]:
        """Draft 4's bounds of ``b`` merged into ``out`` (in place) as (value, exclusive flag)
        pairs: a component's ``exclusiveMaximum: true`` makes only its own ``maximum`` strict,
        so the tighter bound is kept with its own flag (``{maximum: 7, exclusiveMaximum: true}``
        and ``{maximum: 5}`` is ``<= 5``). The keys handled, for the caller to skip."""
        handled: set[str] = set()
        for plain, flag in _EXCL.items():
            if plain not in b and flag not in b:
                continue
            if not all(_num(n.get(plain, 0)) and isinstance(n.get(flag, False), bool) for n in (out, b)):
                continue  # malformed: the keyword-by-keyword merge refuses it
            # a flag without its bound constrains nothing (the draft reads it only beside one)
            sides = [(n[plain], n.get(flag) is True) for n in (out, b) if plain in n]
            out.pop(plain, None)
            out.pop(flag, None)
            if sides:
                lower = plain == "minimum"
                # the tighter value; at the same value, the strict one
                value, strict = max(sides, key=lambda s: (s[0] if lower else -s[0], s[1]))
                out[plain] = value
                if strict:
                    out[flag] = True
            handled |= {plain, flag}
        return handled

    def merge_contains(self, out: dict[str, Any], b: dict[str, Any], path: str) -> set[str]:
        """``b``'s ``contains`` with its ``minContains``/``maxContains`` merged into ``out`` (in
        place): the counts belong to their own component's ``contains`` (1 to any when absent),
        and mean nothing without one. One ``contains`` in both: the tighter counts. The keys
        handled, for the caller to skip."""
        keys = ("contains", "minContains", "maxContains")
        if not any(k in b for k in keys):
            return set()
        sides = []
        for n in (out, b):
            if "contains" not in n:
                continue
            low, high = n.get("minContains", 1), n.get("maxContains")
            if not _count(low) or (high is not None and not _count(high)):
                raise _Refuse(path, "minContains", '"minContains"/"maxContains" must be non-negative integers')
            sides.append((n["contains"], int(low), None if high is None else int(high)))
        for k in keys:
            out.pop(k, None)
        if not sides:
            return set(keys)
        if len(sides) == 2 and _canon(sides[0][0]) != _canon(sides[1][0]):
            raise _Refuse(
                path, "contains", f'allOf components disagree on "contains" ({_q(sides[0][0])} vs {_q(sides[1][0])})'
            )
        highs = [h for _, _, h in sides if h is not None]
        out["contains"] = sides[0][0]
        out["minContains"] = max(low for _, low, _ in sides)
        if highs:
            out["maxContains"] = min(highs)
        return set(keys)

    def merge_keyword(self, key: str, mine: Any, other: Any, path: str) -> Any:
        """One keyword two allOf components both give, as one value (refused when not mergeable)."""
        if key == "type":
            return _merge_types(mine, other, path)
        merged = self.merge_bound(key, mine, other)
        if merged is not None:
            return merged
        if (
            key == "required"
            and isinstance(mine, list)
            and isinstance(other, list)
            and all(isinstance(n, str) for n in [*mine, *other])
        ):
            return list(dict.fromkeys([*mine, *other]))
        if (
            key in ("items", "additionalItems", "propertyNames")
            and isinstance(mine, (dict, bool))
            and isinstance(other, (dict, bool))
        ):
            return {"allOf": [mine, other]}
        if key == "not":
            return {"anyOf": [mine, other]}
        if key == "pattern" and isinstance(mine, str) and isinstance(other, str):
            return self.both_patterns(mine, other, path)
        if key in ("multipleOf", "divisibleBy") and all(_finite(v) and v > 0 for v in (mine, other)):
            # a multiple of both is a multiple of their least common multiple: the validator
            # decides multipleOf exactly on the decimals written (localllm.grammar.bounded)
            common = _lcm(written(mine), written(other))
            if common.denominator == 1:
                return int(common)
            if Fraction(repr(step := float(_decimal_text(common)))) == common:
                return step
            raise _Refuse(
                path,
                key,
                f'allOf components give "{key}" {mine} and {other}, whose least common multiple '
                f"{_decimal_text(common)} has more digits than a JSON number read as a float keeps",
            )
        if key == "anyOf" and isinstance(mine, list) and isinstance(other, list):
            product = [{"allOf": [x, y]} for x in mine for y in other]
            if len(product) > MAX_BRANCHES:
                product = self.satisfiable(product, path)
                if not product:
                    raise _Unsatisfiable(path, "anyOf", "no alternative of the allOf of anyOf admits a value")
            if len(product) > MAX_BRANCHES:
                raise _Refuse(path, "anyOf", f"allOf of anyOf gives more than {MAX_BRANCHES} alternatives")
            return product
        raise _Refuse(path, key, f'allOf components disagree on "{key}" ({_q(mine)} vs {_q(other)}); not merged')

    def satisfiable(self, alternatives: list[Any], path: str) -> list[Any]:
        """``alternatives`` (an allOf of anyOf multiplied out, more than MAX_BRANCHES) without
        those that admit no value, each generated on trial and its rules dropped: the branches
        of if/then/else components keyed on one property mostly contradict each other (a
        ``const`` beside its own negation), and only the few that agree are a grammar. Stops
        past MAX_BRANCHES kept, or with the alternatives as they are (refused) when the
        schema's MAX_TRIALS trials, or MAX_TRIAL_CHARS characters of alternatives tried (about
        half a second of work), run out. A trial that refuses keeps its alternative, for the
        grammar to refuse it as before. Verdicts are remembered: trials nest (an alternative's
        own allOf of anyOf is tried inside it)."""
        kept: list[Any] = []
        for alternative in alternatives:
            key = _canon(alternative)
            # written out for every use: a step of the budget for every 32 characters (an
            # allOf of two 16-branch anyOfs merged into 300 properties: 16 s, within the steps)
            self.spend(1 + len(key) // 32, path)
            if key not in self.admits:
                if self.trials <= 0 or len(key) > self.trial_chars:
                    return alternatives
                self.trials -= 1
                self.trial_chars -= len(key)
                saved = self.save()
                self.admits[key] = True
                try:
                    self.gen(alternative, path, 0, frozenset())
                except _Unsatisfiable:
                    self.admits[key] = False
                except _Refuse:
                    pass
                finally:
                    self.restore(saved, keep=False)
            if not self.admits[key]:
                continue
            kept.append(alternative)
            if len(kept) > MAX_BRANCHES:
                break
        return kept

    def both_patterns(self, a: str, b: str, path: str) -> str:
        """One regex for what ``a`` and ``b`` both find — lookaheads from the start, read by
        the validator wherever the merged schema is checked — remembered with the patterns
        it joins, whose automata :meth:`product` intersects for the grammar."""
        parts = tuple(dict.fromkeys([*self.intersected.get(a, (a,)), *self.intersected.get(b, (b,))]))
        if len(parts) > MAX_JOINED_PATTERNS:
            why = f"allOf components give more than {MAX_JOINED_PATTERNS} patterns for one string"
            raise _Refuse(path, "pattern", why)
        joined = "\\A" + "".join(f"(?=[\\s\\S]*?(?:{p}))" for p in parts)
        for regex in (*parts, joined):
            try:
                re.compile(python_pattern(regex))
            except (re.error, OverflowError, RecursionError) as exc:
                why = f'allOf components give "pattern" {_q(a)} and {_q(b)}, and no one regex for both compiles: {exc}'
                raise _Refuse(path, "pattern", why) from None
        self.intersected[joined] = parts
        return joined

    def complement(self, pattern: str) -> str | None:
        """A regex for the strings ``pattern`` finds nothing in — a negative lookahead from the
        start, read by the validator wherever the schema holding it is checked — remembered
        with ``pattern``, whose automaton :meth:`product` complements for the grammar. None
        when the compiler's reading of ``pattern`` is not exact (Unicode classes read as
        ASCII, ``$`` beside ``\\Z``: the complement would admit strings it finds) or it has
        no tree here."""
        negation = f"\\A(?![\\s\\S]*?(?:{pattern}))"
        try:
            re.compile(python_pattern(negation))
            self.branches(pattern, "$", exact=True)
        except (re.error, OverflowError, RecursionError, _Refuse):
            return None
        self.complemented[negation] = pattern
        return negation

    def merge_bound(self, key: str, mine: Any, other: Any) -> Any:
        """The tighter of two bounds (numbers; draft 4's flags are merged with their bounds
        by :meth:`merge_flagged_bounds`); None if ``key`` is not a bound or the values are not
        comparable."""
        if _num(mine) and _num(other):
            if key in ("minimum", "minLength", "minItems", "minProperties"):
                return max(mine, other)
            if key in ("maximum", "maxLength", "maxItems", "maxProperties"):
                return min(mine, other)
            if key in ("exclusiveMinimum", "exclusiveMaximum") and self.draft > 4:
                return max(mine, other) if key == "exclusiveMinimum" else min(mine, other)
        if key == "uniqueItems" and isinstance(mine, bool) and isinstance(other, bool):
            return mine or other
        return None

    def positions(self, node: dict[str, Any], path: str) -> tuple[list[Any], Any]:
        """``node``'s per-position item schemas: (the prefix, the schema of every later item)."""
        if self.draft >= 2020:
            prefix, rest = node.get("prefixItems", []), node.get("items", True)
        else:
            items = node.get("items", True)
            prefix, rest = (items, node.get("additionalItems", True)) if isinstance(items, list) else ([], items)
        if not isinstance(prefix, list):
            raise _Refuse(path, "prefixItems", '"prefixItems" must be an array')
        return prefix, rest

    def merge_items(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """Two components' positional item keywords as one: item i must satisfy both
        components' schema for position i (a prefix entry, or the rest schema beyond it)."""
        pa, ra = self.positions(a, path)
        pb, rb = self.positions(b, path)
        n = max(len(pa), len(pb))
        prefix = [_both(pa[i] if i < len(pa) else ra, pb[i] if i < len(pb) else rb) for i in range(n)]
        rest = _both(ra, rb)
        out: dict[str, Any] = {}
        if self.draft >= 2020:
            if prefix:
                out["prefixItems"] = prefix
            if rest is not True:
                out["items"] = rest
        elif prefix:
            out["items"] = prefix
            if rest is not True:
                out["additionalItems"] = rest
        elif rest is not True:
            out["items"] = rest
        return out

    def merge_properties(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """Two components' object shapes as one. A name either declares gets what each side
        gives it (its property schema, else its matching patterns' schemas, else its
        additionalProperties). A pattern both give gets both schemas; a pattern one side gives
        also gets the other side's additionalProperties (exact for a key no pattern of the
        other side matches; narrower, never wider, for one that does)."""
        pa = a.get("properties", {})
        pb = b.get("properties", {})
        qa = a.get("patternProperties", {})
        qb = b.get("patternProperties", {})
        if not all(isinstance(x, dict) for x in (pa, pb, qa, qb)):
            raise _Refuse(path, "properties", '"properties" and "patternProperties" must be objects')
        ap_a = a.get("additionalProperties", True)
        ap_b = b.get("additionalProperties", True)

        def side(props: dict[str, Any], pats: dict[str, Any], extra: Any, name: str) -> Any:
            if name in props:
                return props[name]
            try:
                matching = [sub for pat, sub in pats.items() if search(pat, name, fallback=True)]
            except re.error:
                raise _Refuse(path, "patternProperties", "a pattern is not a valid regex") from None
            except PatternTooCostly as exc:
                raise _Refuse(path, "patternProperties", f"a pattern cannot be checked on {_q(name)}: {exc}") from None
            if not matching:
                return extra
            return True  # the merged patternProperties apply these again

        props: dict[str, Any] = {}
        for name in list(dict.fromkeys([*pa, *pb])):
            props[name] = _both(side(pa, qa, ap_a, name), side(pb, qb, ap_b, name))
        out: dict[str, Any] = {"properties": props}
        patterns: dict[str, Any] = {}
        for pat in dict.fromkeys([*qa, *qb]):
            if pat in qa and pat in qb:
                patterns[pat] = _both(qa[pat], qb[pat])
            elif pat in qa:
                patterns[pat] = _both(qa[pat], ap_b)
            else:
                patterns[pat] = _both(qb[pat], ap_a)
        if patterns:
            out["patternProperties"] = patterns
        ap = _both(ap_a, ap_b)
        if ap is not True:
            out["additionalProperties"] = ap
        return out

    # ------------------------------------------------------------------ types

    def typed(self, node: dict[str, Any], path: str, depth: int) -> str:
        declared = node.get("type")
        types = _type_set(declared) if declared is not None else None
        if declared is not None and types is None:
            raise _Refuse(path, "type", f'"type" {_q(declared)} is not a type name or a list of them')
        if types is None:
            inferred = [k for k, kws in _KIND_KW.items() if any(_asserts(node, kw) for kw in kws)]
            types = inferred or list(_TYPES)
        if "number" in types and "integer" in types:
            types = [t for t in types if t != "integer"]
        if not types:
            raise _Unsatisfiable(path, "type", '"type" is an empty list')
        exprs = []
        first: _Refuse | None = None
        for t in types:
            saved = self.save()
            try:
                exprs.append(self.one_type(t, node, path, depth))
            except _Unsatisfiable as exc:
                self.restore(saved)
                first = first or exc
        if not exprs:
            assert first is not None
            raise first
        handled = {
            "type",
            "anyOf",
            "oneOf",
            "allOf",
            "$ref",
            "enum",
            "const",
        }
        for t in types:
            handled |= _KIND_KW.get("number" if t == "integer" else t, frozenset())
        leftover = [k for k in sorted(node) if k in keywords.ASSERTING and k not in handled and _asserts(node, k)]
        if leftover and declared is None:
            raise _Refuse(path, leftover[0], f'"{leftover[0]}" has no exact grammar equivalent')
        return _alt(exprs)

    def one_type(self, t: str, node: dict[str, Any], path: str, depth: int) -> str:
        if t == "object":
            return self.gen_object(node, path, depth)
        if t == "array":
            return self.gen_array(node, path, depth)
        if t == "string":
            return self.gen_string(node, path)
        if t in ("integer", "number"):
            return self.gen_number(node, path, integer=t == "integer")
        return self.primitive(t)

    # ------------------------------------------------------------------ objects

    def gen_object(self, node: dict[str, Any], path: str, depth: int) -> str:
        for key in ("unevaluatedProperties",):
            if key in node and _asserts(node, key):
                raise _Refuse(path, key, f'"{key}" has no exact grammar equivalent')
        props, required, extra, patterns, names = _object_shape(node, path)
        declared = self.declared(props, required, path, extra=extra, patterns=patterns, names=names)
        lo, hi = _counts(node, path, "minProperties", "maxProperties")
        if not declared and extra is not False and not (patterns or (names is not True and names != {})):
            return self.open_object(extra, lo, hi, path, depth)
        required_set = set(required)
        items: list[tuple[str, bool]] = []
        for name, sub, ppath in declared:
            is_required = name in required_set
            saved = self.save()
            try:
                value = self.gen(sub, ppath, depth + 1, frozenset())
            except _Unsatisfiable:
                if is_required:
                    raise
                self.restore(saved)
                continue
            key = gbnf_literal(json.dumps(name, ensure_ascii=False))
            items.append((self.rule(f"{path}-{name}-kv", f"{key} COLON {value}"), is_required))
        n_required = sum(1 for _, r in items if r)
        # the declared properties written are counted; undeclared keys may repeat one another
        # (the parsed object keeps one), so they count only as "not empty"
        least = lo if lo > n_required else 0
        if least > max(len(items), 1):
            raise _Refuse(
                path,
                "minProperties",
                f"minProperties {lo} exceeds the {len(items)} declared properties (undeclared keys may repeat "
                f"one another, so they are not counted)",
            )
        most = hi if hi is not None and hi < len(items) else None
        if most is not None and most < n_required:
            why = f"maxProperties {hi} is below the {n_required} required properties"
            raise _Unsatisfiable(path, "maxProperties", why)
        present = {d[0] for d in declared}
        if missing := [r for r in required_set if r not in present]:
            raise _Unsatisfiable(path, "required", f"required {_q(sorted(missing))} can never be present")
        ext = self.extension(node, declared, path, depth) if hi is None else None
        if least == 1 and not items and ext is None:
            raise _Unsatisfiable(path, "minProperties", "minProperties 1 on an object that admits no property")
        if least > 1 and ext is not None:
            self.notes.append(f"{path}: minProperties {lo} is met by declared properties (undeclared keys not counted)")
        body = self.ordered(items, path, least=least, most=most)
        if ext is not None:
            more = _repeat(f"COMMA {ext}", 0, None)
            if n_required or least > 1:
                body = f"{body} {more}"
            else:
                some = f"{self.ordered(items, path, least=1)} {more}" if items else None
                only = f"{ext} {more}"
                either = self.rule(f"{path}-some", f"{some} | {only}" if some else only)
                body = either if least else f"{either}?"
        return self.rule(f"{path}-object", f'"{{" {body} "}}"')

    def extension(
        self, node: dict[str, Any], declared: list[tuple[str, Any, str]], path: str, depth: int
    ) -> str | None:
        """The extension-key rule: one key/value pair the schema allows beside the declared
        properties (generated after them), or None when there is none or none is expressible
        exactly (then the object is generated closed: fewer values, never more).

        Without ``patternProperties``: keys that are no declared or required name
        (:meth:`key_not_in`), with ``additionalProperties``' values — when it is a schema, or
        when it is absent/true and open objects are on. With ``patternProperties``: keys
        matching one pattern, with values valid against that pattern's schema, every other
        pattern's schema unless the two provably share no key, and the schema of each
        declared name the pattern matches (a repeated key leaves the last value, which meets
        both). Keys also satisfy ``propertyNames``. Extension keys may repeat one another (the
        parsed object keeps the last value, valid too), so ``maxProperties`` keeps the
        object closed (the caller)."""
        props, required, extra, patterns, names = _object_shape(node, path)
        names_schema = None if names is True or names == {} else names
        taken = list(dict.fromkeys([*props, *required]))
        pairs: list[tuple[Any, Any, str]] = []  # (key schema or None for key_not_in, value schema, path)
        bounds: tuple[int, int | None] = (0, None)  # key lengths for key_not_in
        if not patterns:
            if extra is False or ((extra is True or extra == {}) and not self.open_objects):
                return None
            key: Any = None
            only = None if names_schema is None else _length_only(names_schema, path)
            if only is not None:
                bounds = only
            elif names_schema is not None:
                string = {"type": "string", "pattern": _not_one_of(taken)} if taken else {"type": "string"}
                key = {"allOf": [string, names_schema]}
            pairs.append((key, extra, child(path, "additionalProperties")))
        else:
            schemas = list(patterns.values())
            for (pat, pschema), others in zip(patterns.items(), _overlapping(list(patterns)), strict=True):
                values = [pschema, *(schemas[j] for j in others)]
                try:
                    values += [sub for name, sub, _ in declared if search(pat, name, fallback=True)]
                except (re.error, PatternTooCostly):
                    return None
                key = {"type": "string", "pattern": pat}
                if names_schema is not None:
                    key = {"allOf": [key, names_schema]}
                value = values[0] if len(values) == 1 else {"allOf": values}
                pairs.append((key, value, child(child(path, "patternProperties"), pat)))
        exprs = []
        for key_schema, value_schema, vpath in pairs:
            saved = self.save()
            try:
                if key_schema is None:
                    key_expr = self.key_not_in(taken, path, *bounds)
                else:
                    key_expr = self.gen(key_schema, child(path, "propertyNames"), depth + 1, frozenset())
                value_expr = self.gen(value_schema, vpath, depth + 1, frozenset())
            except _Refuse:
                self.restore(saved)
                continue
            exprs.append(self.rule(f"{path}-ext-kv", f"{key_expr} COLON {value_expr}"))
        if not exprs:
            return None
        return self.rule(f"{path}-ext", " | ".join(dict.fromkeys(exprs)))

    def key_not_in(self, names: list[str], path: str, lo: int = 0, hi: int | None = None) -> str:
        """A JSON string (quotes included) that is none of ``names``, kept small: a key whose
        first character starts no name, or whose length (in characters) differs from every
        name with the same first character. Fewer keys than "not a name" (a key as long as a
        name with its first character is left out), never a name; the first character is
        written raw. ``lo``/``hi``: the key's length bounds."""
        char = self.primitive("char")
        if not names:
            return self.primitive("string") if (lo, hi) == (0, None) else f'"\\"" {_repeat(char, lo, hi)} "\\""'
        if hi is not None and hi < lo:
            raise _Unsatisfiable(path, "propertyNames", "no key meets the length bounds")
        by_first: dict[str, set[int]] = {}
        empty = False
        for name in names:
            if name:
                by_first.setdefault(name[0], set()).add(len(name) - 1)
            else:
                empty = True
        firsts = sorted(by_first)
        other = "".join(_gbnf_char(c, in_class=True) for c in firsts)
        rest_lo, rest_hi = max(lo - 1, 0), None if hi is None else hi - 1
        parts = []
        if hi != 0:
            parts.append(f'[^{other}"\\\\\\x7F\\x00-\\x1F] {_repeat(char, rest_lo, rest_hi)}')
            for c in firsts:
                runs, start = [], rest_lo
                for n in sorted(by_first[c]):
                    if n > start and (rest_hi is None or start <= rest_hi):
                        runs.append(_repeat(char, start, n - 1 if rest_hi is None else min(n - 1, rest_hi)))
                    start = max(start, n + 1)
                if rest_hi is None or start <= rest_hi:
                    runs.append(_repeat(char, start, rest_hi))
                if runs:
                    parts.append(f"{gbnf_literal(json.dumps(c, ensure_ascii=False)[1:-1])} {_alt(runs)}")
        if not empty and lo == 0:
            parts.append('""')
        if not parts:
            raise _Unsatisfiable(path, "propertyNames", "every key the length bounds allow is a declared name")
        return f'"\\"" {self.rule(f"{path}-key", " | ".join(parts))} "\\""'

    def declared(
        self, props: dict[str, Any], required: list[str], path: str, *, extra: Any, patterns: dict[str, Any], names: Any
    ) -> list[tuple[str, Any, str]]:
        """The generated names with their schemas and paths: each declared property (and
        undeclared required name) must satisfy its property schema and every
        patternProperties schema whose pattern it matches; an undeclared required name,
        those patterns or else additionalProperties. Names propertyNames refuses are dropped."""
        declared: list[tuple[str, Any, str]] = [(n, s, child(child(path, "properties"), n)) for n, s in props.items()]
        declared += [(r, None, child(path, "additionalProperties")) for r in dict.fromkeys(required) if r not in props]
        for i, (name, sub, ppath) in enumerate(declared):
            matching = []
            for pattern, pschema in patterns.items():
                try:
                    if search(pattern, name, fallback=True):
                        matching.append(pschema)
                except re.error:
                    raise _Refuse(path, "patternProperties", f"pattern {_q(pattern)} is not a valid regex") from None
                except PatternTooCostly as exc:
                    why = f"pattern {_q(pattern)} cannot be checked on a declared name: {exc}"
                    raise _Refuse(path, "patternProperties", why) from None
            if sub is None:
                declared[i] = (name, {"allOf": matching} if matching else extra, ppath)
            elif matching:
                declared[i] = (name, {"allOf": [sub, *matching]}, ppath)
        if names is not True and names != {}:
            bad = {n for n, _, _ in declared if not self.valid(names, n, path, "propertyNames")}
            for n in sorted(bad & set(required)):
                raise _Unsatisfiable(path, "propertyNames", f"required property {_q(n)} breaks propertyNames")
            declared = [d for d in declared if d[0] not in bad]
        return declared

    def open_object(self, extra: Any, lo: int, hi: int | None, path: str, depth: int) -> str:
        """A map: any string key (the JSON string rule) with ``extra``'s values."""
        if lo > 1:
            raise _Refuse(path, "minProperties", "minProperties > 1 on an open object (keys could repeat)")
        value = self.gen(extra, child(path, "additionalProperties"), depth + 1, frozenset())
        kv = self.rule(f"{path}-extra-kv", f"{self.primitive('string')} COLON {value}")
        if hi == 0:
            return gbnf_literal("{}")
        body = f"{kv} {_repeat(f'COMMA {kv}', 0, None if hi is None else hi - 1)}"
        return self.rule(f"{path}-object", f'"{{" {body if lo else _repeat(body, 0, 1)} "}}"')

    def ordered(self, items: list[tuple[str, bool]], path: str, *, least: int = 0, most: int | None = None) -> str:
        """Properties (or unique array items) in any order, each at most once, the required
        ones always, at least ``least`` and at most ``most`` of them in all — up to ANY_ORDER
        of them; more keep their declared order (a note says so)."""
        if not items:
            return '""'
        if len(items) == 1:
            return self.in_order(items, path, least=least, most=most)
        if len(items) <= ANY_ORDER and self.order_rules + (1 << len(items)) <= ANY_ORDER_RULES:
            self.order_rules += 1 << len(items)
            return self.any_order(items, path, least=least, most=most)
        why = f"any order up to {ANY_ORDER}" if len(items) > ANY_ORDER else "the grammar's any-order budget is spent"
        self.notes.append(f"{path}: {len(items)} properties or items in declared order ({why})")
        return self.in_order(items, path, least=least, most=most)

    def any_order(self, items: list[tuple[str, bool]], path: str, *, least: int, most: int | None) -> str:
        """``items`` in any order, each at most once, ``least`` to ``most`` of them: one rule
        per set of items already written (2^n rules), whose alternatives are the items not
        yet written — each starts with its own key literal, so the alternatives the engine
        keeps are prefix-disjoint."""
        need = sum(1 << i for i, (_, req) in enumerate(items) if req)
        rests: dict[int, str | None] = {}

        def rest(used: int) -> str | None:
            """What may follow once the items in ``used`` are written (None: no end is left)."""
            if used in rests:
                return rests[used]
            count = used.bit_count()
            alts = []
            if most is None or count < most:
                for i, (kv, _) in enumerate(items):
                    if not used & 1 << i and (after := rest(used | 1 << i)) is not None:
                        alts.append(f"{kv} {after}".strip())
            end = need & ~used == 0 and count >= least
            if not alts:
                expr = "" if end else None
            else:
                body = f"COMMA {_alt(alts)}"
                expr = self.rule(f"{path}-rest", f"( {body} )?" if end else body)
            rests[used] = expr
            return expr

        starts = [f"{kv} {after}".strip() for i, (kv, _) in enumerate(items) if (after := rest(1 << i)) is not None]
        if most == 0 or not starts:
            return '""'  # the caller checked that the count bounds leave a value: "{}"
        first = _alt(starts)
        if need == 0 and not least:
            first = _repeat(first, 0, 1)
        return self.rule(f"{path}-props", first)

    def in_order(self, items: list[tuple[str, bool]], path: str, *, least: int = 0, most: int | None = None) -> str:
        """Properties in declared order: required ones always, optional ones optionally, at
        least ``least`` and at most ``most`` of them in all (:meth:`counted_in_order` when
        that takes counting)."""
        n_required = sum(1 for _, req in items if req)
        if most is not None or least > max(n_required, 1):
            return self.counted_in_order(items, path, least, most)
        nonempty = least == 1 and n_required == 0
        # many properties: every tail and choice a named rule (linear size, shallow nesting)
        named = len(items) > 8
        tails: list[str] = [""] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            kv, req = items[i]
            step = f"COMMA {kv}" if req else f"( COMMA {kv} )?"
            tails[i] = f"{step} {tails[i + 1]}".strip()
            if named:
                tails[i] = self.rule(f"{path}-tail", tails[i])
        head = ""
        for i in range(len(items) - 1, -1, -1):
            kv, req = items[i]
            with_it = f"{kv} {tails[i + 1]}".strip()
            if req:
                head = with_it
            elif not head:
                head = with_it if nonempty else f"( {with_it} )?"
            else:
                head = self.rule(f"{path}-head", f"{with_it} | {head}") if named else f"( {with_it} | {head} )"
        return self.rule(f"{path}-props", head)

    def counted_in_order(self, items: list[tuple[str, bool]], path: str, least: int, most: int | None) -> str:
        """Properties in declared order, ``least`` to ``most`` of them: one rule per position
        and count written so far (counts past ``least`` are one when there is no ``most``), at
        most MAX_COUNTED_RULES of them."""
        cap = least if most is None else most
        if len(items) * (cap + 1) > MAX_COUNTED_RULES:
            key = "minProperties" if most is None else "maxProperties"
            raise _Refuse(
                path,
                key,
                f"counting {least}..{most} of {len(items)} properties or items in declared order takes "
                f"{len(items) * (cap + 1)} rules, more than {MAX_COUNTED_RULES}",
            )
        memo: dict[tuple[int, int], str | None] = {}

        def tail(i: int, count: int) -> str | None:
            """What may follow once the items before ``i`` are decided, ``count`` of them written."""
            if i == len(items):
                return "" if count >= least else None
            if (i, count) in memo:
                return memo[(i, count)]
            kv, req = items[i]
            write = None
            if most is None or count < most:
                after = tail(i + 1, min(count + 1, cap) if most is None else count + 1)
                if after is not None:
                    write = f"{'COMMA ' if count else ''}{kv} {after}".strip()
            skip = None if req else tail(i + 1, count)
            if write is None:
                expr = skip
            elif skip is None:
                expr = self.rule(f"{path}-count", write)
            else:
                expr = self.rule(f"{path}-count", _repeat(write, 0, 1) if skip == "" else f"{write} | {skip}")
            memo[(i, count)] = expr
            return expr

        head = tail(0, 0)
        if not head:
            return '""'  # the caller checked that the count bounds leave a value: "{}"
        return self.rule(f"{path}-props", head)

    # ------------------------------------------------------------------ arrays

    def gen_array(self, node: dict[str, Any], path: str, depth: int) -> str:
        for key in ("unevaluatedItems",):
            if key in node and _asserts(node, key):
                raise _Refuse(path, key, f'"{key}" has no exact grammar equivalent')
        lo, hi = _counts(node, path, "minItems", "maxItems")
        if "contains" in node and _asserts(node, "contains"):
            return self.gen_contains(node, path, depth, lo, hi)
        if node.get("uniqueItems") is True and (hi is None or hi > 1):
            return self.gen_unique(node, path, depth, lo, hi)
        if self.draft >= 2020:
            prefix = node.get("prefixItems", [])
            rest: Any = node.get("items", True)
            rest_path = child(path, "items")
        else:
            items = node.get("items", True)
            prefix, rest = (items, node.get("additionalItems", True)) if isinstance(items, list) else ([], items)
            rest_path = child(path, "additionalItems" if isinstance(items, list) else "items")
        if not isinstance(prefix, list):
            raise _Refuse(path, "prefixItems", '"prefixItems" must be an array')
        elements: list[str | None] = []
        for i, sub in enumerate(prefix):
            if hi is not None and i >= hi:
                break
            saved = self.save()
            try:
                elements.append(
                    self.gen(
                        sub,
                        child(child(path, "prefixItems" if self.draft >= 2020 else "items"), i),
                        depth + 1,
                        frozenset(),
                    )
                )
            except _Unsatisfiable:
                self.restore(saved)
                elements.append(None)
                break
        saved = self.save()
        try:
            rest_expr: str | None = self.gen(rest, rest_path, depth + 1, frozenset())
        except _Unsatisfiable:
            self.restore(saved)
            rest_expr = None
        # elements[i] None: no array reaches length i+1
        usable = len(elements) if None not in elements else elements.index(None)
        max_len = hi
        if usable < len(prefix) or rest_expr is None:
            max_len = usable if hi is None else min(hi, usable)
        if max_len is not None and lo > max_len:
            raise _Unsatisfiable(path, "minItems", f"minItems {lo} cannot be met")
        known = [e for e in elements[:usable] if e is not None]

        def seq(i: int) -> str:
            # positions i.. (0-based), i elements already written
            if max_len is not None and i >= max_len:
                return ""
            if i >= len(known):
                if rest_expr is None:
                    return ""
                more_lo = max(0, lo - i)
                more_hi = None if max_len is None else max_len - i
                first = "" if i == 0 else "COMMA "
                if i == 0:
                    more = _repeat(f"COMMA {rest_expr}", max(0, more_lo - 1), None if more_hi is None else more_hi - 1)
                    body = f"{rest_expr} {more}"
                    return body if more_lo >= 1 else _repeat(body, 0, 1)
                return _repeat(f"{first}{rest_expr}", more_lo, more_hi)
            step = f"{'' if i == 0 else 'COMMA '}{known[i]} {seq(i + 1)}".strip()
            return step if i < lo else _repeat(step, 0, 1)

        inner = seq(0)
        return self.rule(f"{path}-array", f'"[" {inner} "]"' if inner else '"[]"')

    def item_schemas(self, node: dict[str, Any]) -> tuple[list[Any], Any]:
        """(prefix item schemas, the schema of the items after them) under the schema's draft."""
        if self.draft >= 2020:
            return node.get("prefixItems", []), node.get("items", True)
        items = node.get("items", True)
        return (items, node.get("additionalItems", True)) if isinstance(items, list) else ([], items)

    def gen_unique(self, node: dict[str, Any], path: str, depth: int, lo: int, hi: int | None) -> str:
        """uniqueItems over a finite item domain (enum/const/boolean/null items): each allowed
        value at most once, in any order (:meth:`ordered`); with positional items, every array
        of distinct values listed (:meth:`unique_tuples`)."""
        prefix, rest = self.item_schemas(node)
        domain = self.finite_domain(rest, path)
        if prefix:
            return self.unique_tuples(node, prefix, rest, path, lo=lo, hi=hi)
        if domain is None:
            raise _Refuse(path, "uniqueItems", '"uniqueItems" is compiled only over a finite item domain (enum items)')
        values: dict[str, Any] = {}
        for v in self.admitted(rest, domain, path, "uniqueItems"):
            values.setdefault(_canon(v), v)
        if lo > len(values):
            raise _Unsatisfiable(path, "minItems", f"minItems {lo} but {len(values)} distinct item values are allowed")
        items = [
            (gbnf_literal(json.dumps(v, ensure_ascii=False, separators=(",", ":"))), False) for v in values.values()
        ]
        most = hi if hi is not None and hi < len(values) else None
        inner = self.ordered(items, path, least=lo, most=most) if items else '""'
        return self.rule(f"{path}-unique", f'"[" {inner} "]"')

    def finite_domain(self, schema: Any, path: str) -> list[Any] | None:
        """The values ``schema`` lists (enum/const), or booleans/null by type alone; None
        when its domain is not such a finite list (False: the empty list)."""
        if schema is False:
            return []
        target = self.flat(schema, path)
        domain = _literal_values(target) if isinstance(target, dict) else None
        if domain is None and isinstance(target, dict):
            types = _type_set(target.get("type"))
            if (
                types
                and set(types) <= {"boolean", "null"}
                and all(_asserts(target, k) is False or k == "type" for k in target)
            ):
                domain = [v for t, vals in (("boolean", [True, False]), ("null", [None])) if t in types for v in vals]
        return domain

    def unique_tuples(
        self, node: dict[str, Any], prefix: list[Any], rest: Any, path: str, *, lo: int, hi: int | None
    ) -> str:
        """uniqueItems with positional items, every position over a finite domain: each array
        of distinct values listed (at most MAX_BRANCHES*4), kept when the validator accepts it."""
        domains = [self.finite_domain(p, path) for p in prefix]
        tail = self.finite_domain(rest, path)
        if any(d is None for d in domains) or tail is None:
            raise _Refuse(
                path,
                "uniqueItems",
                '"uniqueItems" is compiled only over a finite item domain (enum items) at every position',
            )
        longest = len(prefix) + len(tail)
        if hi is not None:
            longest = min(longest, hi)
        found: list[list[Any]] = []

        def extend(arr: list[Any]) -> None:
            if len(found) > 4 * MAX_BRANCHES:
                return
            if len(arr) >= lo:
                found.append(list(arr))
            if len(arr) == longest:
                return
            pos = len(arr)
            choices = domains[pos] if pos < len(domains) else tail
            taken = {_canon(v) for v in arr}
            for v in choices or []:
                if _canon(v) not in taken:
                    extend([*arr, v])

        extend([])
        if len(found) > 4 * MAX_BRANCHES:
            raise _Refuse(path, "uniqueItems", f"more than {4 * MAX_BRANCHES} distinct arrays to list; not compiled")
        seqs = []
        for arr in found:
            if not self.valid(node, arr, path, "uniqueItems"):
                continue
            lits = [gbnf_literal(json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for v in arr]
            seqs.append(['"["', *(t for i, lit in enumerate(lits) for t in (["COMMA"] if i else []) + [lit]), '"]"'])
        if not seqs:
            raise _Unsatisfiable(path, "uniqueItems", "no array of distinct allowed values meets the schema")
        return self.rule(f"{path}-unique", _trie(seqs))  # shared prefixes once: prefix-disjoint alternatives

    def gen_contains(self, node: dict[str, Any], path: str, depth: int, lo: int, hi: int | None) -> str:
        """contains (with minContains/maxContains): items that match it counted between the
        others, which match its negation; without a negation, only matching items."""
        prefix, rest = self.item_schemas(node)
        if prefix or node.get("uniqueItems") is True:
            raise _Refuse(path, "contains", '"contains" beside prefixItems or uniqueItems is not compiled')
        cmin, cmax = 1, None
        if self.draft >= 2019:
            cmin, cmax = _counts(node, path, "minContains", "maxContains")
            cmin = node.get("minContains", 1) if _count(node.get("minContains", 1)) else 1
        if cmax is not None and cmin > cmax:
            raise _Unsatisfiable(path, "maxContains", "minContains exceeds maxContains")
        contains = node["contains"]
        cpath = child(path, "contains")
        neg = self.negate(contains, cpath, depth + 1)
        if neg is None or lo > cmin or hi is not None:
            # only matching items: the count is the length
            self.notes.append(f"{path}: arrays are generated with matching items only (contains)")
            low = max(lo, cmin)
            high = cmax if hi is None else (hi if cmax is None else min(hi, cmax))
            if high is not None and low > high:
                raise _Refuse(path, "contains", "contains counts and minItems/maxItems meet in no length")
            plain = {k: v for k, v in node.items() if k not in ("contains", "minContains", "maxContains")}
            plain.update({"items": _both(rest, contains), "minItems": low})
            plain.pop("additionalItems", None)
            if high is not None:
                plain["maxItems"] = high
            else:
                plain.pop("maxItems", None)
            return self.gen_array(plain, path, depth)
        hit = self.gen(_both(rest, contains), cpath, depth + 1, frozenset())
        saved = self.save()
        try:
            miss: str | None = self.gen(_both(rest, neg), cpath, depth + 1, frozenset())
        except _Unsatisfiable:
            self.restore(saved)
            miss = None
        misses = _repeat(f"COMMA {miss}", 0, None) if miss else ""
        lead = _repeat(f"{miss} COMMA", 0, None) if miss else ""
        one = f"{hit} {misses}".strip()
        more = _repeat(f"COMMA {one}", max(cmin - 1, 0), None if cmax is None else cmax - 1)
        counted = f"{lead} {one} {more}".strip()
        if cmin == 0:
            nothing = f"{miss} {misses}".strip() if miss else ""
            counted = _alt([c for c in (counted, nothing) if c]) if cmax != 0 else nothing
            body = _repeat(counted, 0, 1) if counted else '""'
        else:
            body = counted
        return self.rule(f"{path}-contains", f'"[" {body} "]"')

    # ------------------------------------------------------------------ strings

    def gen_string(self, node: dict[str, Any], path: str) -> str:
        lo, hi = _counts(node, path, "minLength", "maxLength")
        fmt = node.get("format")
        pattern = node.get("pattern")
        if isinstance(fmt, str) and fmt in _FORMATS:
            if fmt in _NARROWED_FORMATS:
                self.notes.append(f'{path}: "format": {_q(fmt)} is generated narrowed: {_NARROWED_FORMATS[fmt]}')
            flo, fhi = _FORMAT_LENGTHS[fmt]
            within = lo <= flo and (hi is None or (fhi is not None and hi >= fhi))
            if pattern is None and within and fmt not in _DECODED_FORMATS:
                return f'"\\"" {self.primitive(fmt)} "\\""'
            # a pattern or length bounds beside it: the product of the format's automaton and the patterns'
            if pattern is not None and not isinstance(pattern, str):
                raise _Refuse(path, "pattern", '"pattern" must be a string')
            patterns = () if pattern is None else self.intersected.get(pattern, (pattern,))
            return self.product(patterns, path, lo, hi, fmt=fmt)
        if isinstance(fmt, str) and fmt in self.validator.format_checker.checkers:
            raise _Refuse(path, "format", f'"format": {_q(fmt)} has no grammar here')
        if pattern is not None:
            if not isinstance(pattern, str):
                raise _Refuse(path, "pattern", '"pattern" must be a string')
            if pattern in self.intersected:
                return self.product(self.intersected[pattern], path, lo, hi)
            if pattern in self.complemented:
                return self.product((pattern,), path, lo, hi)
            if pattern in self.avoided and 0 < lo <= 3 and hi is None:
                # a negated literal search with minLength: the length counted in the automaton
                pattern = _avoiding(self.avoided[pattern], lo) or pattern
            branches = self.branches(pattern, path)
            if any(_has_anchor(body) for _, _, body in branches):
                # ^/$ inside (`(/|$)`: a slash or the end): only an automaton reads them
                return self.product((pattern,), path, lo, hi)
            saved = self.save()
            try:
                expr, plo, phi = self.pattern(pattern, branches, path, lo, hi)
                if plo < lo or (hi is not None and (phi is None or phi > hi)):
                    raise _Refuse(
                        path,
                        "minLength" if plo < lo else "maxLength",
                        "length bounds beside a pattern whose lengths exceed them are not intersected",
                    )
            except _Refuse:
                if lo == 0 and hi is None:
                    raise
                # lengths the repeats cannot be cut to: the pattern's automaton counts them
                self.restore(saved)
                return self.product((pattern,), path, lo, hi)
            return self.rule(f"{path}-pattern", f'"\\"" {expr} "\\""')
        if lo == 0 and hi is None:
            return self.primitive("string")
        return self.rule(f"{path}-string", f'"\\"" {_repeat(self.primitive("char"), lo, hi)} "\\""')

    def branches(self, pattern: str, path: str, *, exact: bool = False) -> list[Branch]:
        """``pattern``'s top-level alternatives as (anchored at the start, at the end, body).

        The bodies match exactly what the validator finds (the pattern read as ECMA-262 reads
        it: :class:`_RegexParser`); ``^``/``$`` inside a body stay in it as ("bol",)/("eol",),
        which only :meth:`product`'s automata read. ``exact`` (for a complement, where fewer
        would be more) refuses those inner anchors."""
        tree = self.trees.get(pattern)
        if tree is None:
            tree = self.trees[pattern] = _pattern_tree(pattern)
        if isinstance(tree, str):
            raise _Refuse(path, "pattern", f"pattern {_q(pattern)} {tree}")
        out: list[Branch] = []
        for branch in tree[1] if tree[0] == "alt" else [tree]:
            items = list(branch[1]) if branch[0] == "cat" else [branch]
            start = bool(items) and items[0][0] == "bol"
            if start:
                items = items[1:]
            end = bool(items) and items[-1][0] == "eol"
            if end:
                items = items[:-1]
            body = ("cat", items)
            if exact and _has_anchor(body):
                why = f"the negation of pattern {_q(pattern)} is not compiled: it has ^ or $ inside"
                raise _Refuse(path, "not", why)
            out.append((start, end, body))
        return out

    def pattern(
        self, pattern: str, branches: list[Branch], path: str, lo: int = 0, hi: int | None = None
    ) -> tuple[str, int, int | None]:
        """The GBNF of ``pattern``, read as ``branches`` (:meth:`branches`), within ``lo``..``hi``
        characters: (expression, its shortest and longest length, None when unbounded)."""
        exprs = []
        lo_all: int | None = None
        hi_all: int | None = 0
        for start, end, whole in branches:
            items = list(whole[1])
            body = whole
            blo, bhi = _regex_lengths(body)
            bhi = bhi if start and end else None
            try:
                if blo < lo or (hi is not None and (bhi is None or bhi > hi)):
                    # intersect with minLength/maxLength: repeat counts cut to fit
                    anyrep = ("rep", ("set", _ANY_CHAR), 0, None)
                    full = [*([] if start else [anyrep]), *items, *([] if end else [anyrep])]
                    fitted = _fit_lengths(full, lo, hi)
                    if fitted is None:
                        continue
                    self.notes.append(f"{path}: the pattern's repeats are cut to meet minLength/maxLength")
                    body = ("cat", fitted)
                    blo, bhi = _regex_lengths(body)
                    parts = [self.regex_expr(body)]
                else:
                    parts = [self.primitive("char") + "*"] if not start else []
                    parts.append(self.regex_expr(body))
                    if not end:
                        parts.append(self.primitive("char") + "*")
            except _RegexUnsupported as exc:
                raise _Refuse(path, "pattern", f"pattern {_q(pattern)} {exc}") from None
            exprs.append(" ".join(p for p in parts if p) or '""')
            lo_all = blo if lo_all is None else min(lo_all, blo)
            hi_all = None if hi_all is None or bhi is None else max(hi_all, bhi)
        if not exprs:
            raise _Unsatisfiable(path, "maxLength", f"no string matching {_q(pattern)} meets the length bounds")
        return _alt(exprs), lo_all or 0, hi_all

    def product(self, patterns: Sequence[str], path: str, lo: int, hi: int | None, *, fmt: str | None = None) -> str:
        """The strings every one of ``patterns`` matches (and that ``fmt``'s grammar writes),
        ``lo``..``hi`` characters long: the product of their automata (see
        :mod:`localllm.grammar.automaton`), one rule per state, each reading one character and
        naming the next state. Refused past :data:`MAX_PRODUCT_STATES` states."""
        negated = [p in self.complemented for p in patterns]
        branches = [
            self.branches(self.complemented[p], path, exact=True) if neg else self.branches(p, path)
            for p, neg in zip(patterns, negated, strict=True)
        ]
        shown = " and ".join(
            f"not {_q(self.complemented[p])}" if neg else _q(p) for p, neg in zip(patterns, negated, strict=True)
        )
        if fmt is not None:
            branches.append([(True, True, _format_tree(fmt))])
            negated.append(False)
            shown = " and ".join(filter(None, [shown, f"format {_q(fmt)}"]))
        if lo or hi is not None:
            shown += f" (length {lo}..{'' if hi is None else hi})"
        try:
            if fmt is not None and not patterns:
                dfa = _format_dfa(fmt, lo, hi)
            else:
                dfa = self.intersect(branches, negated, lo, hi)
        except automaton.TooLarge as exc:
            # the length bounds are what is refused when the patterns alone compile (a word
            # count beside maxLength: words × characters states), as beside a format alone;
            # the relaxed grammar then drops them and keeps the patterns
            why = f"{'pattern ' * bool(patterns)}{shown} is not compiled: {exc}"
            bounded = bool(lo) or hi is not None
            if patterns and not (bounded and self.unbounded_product(branches, negated)):
                raise _Refuse(path, "pattern", why) from None
            if patterns:
                why += "; without the length bounds it compiles"
            raise _Refuse(path, "maxLength" if hi is not None else "minLength", why) from None
        if dfa is None:
            raise _Unsatisfiable(path, "pattern", f"no string matches {shown}")
        self.products += 1
        names = [self.rule(f"{path}-pattern-state", f"@product {self.products} {i}") for i in range(len(dfa.accepting))]
        for name, accepting, moves in zip(names, dfa.accepting, dfa.moves, strict=True):
            alts = [f"{_json_char_set(list(ranges))} {names[t]}" for ranges, t in moves]
            self.rules[name] = " | ".join([*alts, '""'] if accepting else alts)
        return self.rule(f"{path}-pattern", f'"\\"" {names[0]} "\\""')

    def intersect(
        self, branches: list[list[Branch]], negated: list[bool], lo: int = 0, hi: int | None = None
    ) -> automaton.Dfa | None:
        """The patterns' product automaton over JSON string characters, ``lo``..``hi`` long
        (None: no string); raises :class:`automaton.TooLarge` past :data:`MAX_PRODUCT_STATES`."""
        return automaton.intersection(
            branches,
            _JSON_UNIVERSE,
            lo=lo,
            hi=hi,
            limit=MAX_PRODUCT_STATES,
            nfa_limit=MAX_STATES,
            work=self.automaton_work,
            negated=negated,
        )

    def unbounded_product(self, branches: list[list[Branch]], negated: list[bool]) -> bool:
        """Do the patterns' automata intersect within :data:`MAX_PRODUCT_STATES` without length bounds?"""
        try:
            self.intersect(branches, negated)
        except automaton.TooLarge:
            return False
        return True

    def regex_expr(self, node: tuple[Any, ...]) -> str:
        kind = node[0]
        if kind == "set":
            if node[1] == _ANY_CHAR:
                return self.primitive("char")
            expr = _json_char_set(node[1])
            return self.rule("class", expr) if len(expr) > 60 else expr
        if kind == "cat":
            parts = [self.regex_expr(n) for n in node[1]]
            return " ".join(p for p in parts if p != '""') or '""'
        if kind == "alt":
            return _alt([self.regex_expr(n) for n in node[1]])
        if kind == "rep":
            _, inner, lo, hi = node
            if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
                raise _RegexUnsupported(f"repeats more than {MAX_REPEAT} times")
            if hi is None and _regex_lengths(inner)[0] == 0:
                # what may be empty, repeated without end: "X' ::= X X' |" in llama.cpp's
                # parser, a left recursion it refuses (the pattern "(|\.\w+)*"); the same
                # strings are the repeats of its non-empty part
                starred = _starred(inner)
                return '""' if starred is None else _repeat(self.regex_expr(starred), 0, None)
            return _repeat(self.regex_expr(inner), lo, hi)
        raise _RegexUnsupported("has an anchor where it cannot be compiled")

    # ------------------------------------------------------------------ numbers

    def gen_number(self, node: dict[str, Any], path: str, *, integer: bool) -> str:
        not_integer = _not_an_integer(node)
        if not_integer and integer:
            raise _Unsatisfiable(path, "not", "an integer type beside a negated integer type admits no value")
        excluded = _excluded_steps(node)
        if excluded is not None:
            return self.gen_non_multiples(node, path, excluded, integer=integer)
        for key in ("multipleOf", "divisibleBy"):
            if key in node:
                step = node[key]
                if _num(step) and step == 1:
                    if not_integer and self.draft == 4:
                        # 2.0 is a multiple of 1 and no integer in draft 4: whole values with .0
                        return self.gen_multiples(node, path, key, integer=integer)
                    if not_integer:
                        raise _Unsatisfiable(path, "not", "every multiple of 1 is an integer")
                    integer = True
                    continue
                return self.gen_multiples(node, path, key, integer=integer)
        lo = self.bound(node, path, "minimum", "exclusiveMinimum")
        hi = self.bound(node, path, "maximum", "exclusiveMaximum")
        if not_integer:
            return self.gen_non_integer(lo, hi, path)
        if lo is None and hi is None:
            return self.primitive("integer" if integer else "number")
        ilo = None if lo is None else _int_at_least(lo)
        ihi = None if hi is None else _int_at_most(hi)
        empty = lo is not None and hi is not None and (lo.value, lo.exclusive or hi.exclusive) > (hi.value, False)
        no_integer = ilo is not None and ihi is not None and ilo > ihi
        if empty or (integer and no_integer):  # before any bound's size: 1e308 above 7 admits nothing
            raise _Unsatisfiable(path, "minimum", f"no {'integer' if integer else 'number'} meets the bounds")
        for b in (ilo, ihi):
            if b is not None and len(str(abs(b))) > MAX_BOUND_DIGITS:
                raise _Refuse(path, "minimum" if b == ilo else "maximum", "bound too large to compile")
        parts = []
        if not no_integer:
            parts.append(integer_range(ilo, ihi))
        if not integer:
            parts.extend(self.fractions(lo, hi, path))
        if not parts:  # numbers between two integers, none with few enough decimals
            raise _Refuse(
                path,
                "minimum",
                f"no integer and no number with at most {FRACTION_DIGITS} decimals and an integer part below "
                f"10^9 meets the bounds (the grammar narrows numbers to those; "
                f"{_bound_text(lo, True)}, {_bound_text(hi, False)})",
            )
        return self.rule(f"{path}-{'integer' if integer else 'number'}", _alt(parts))

    def gen_multiples(self, node: dict[str, Any], path: str, key: str, *, integer: bool) -> str:
        """Multiples of ``step``. Between two bounds with at most MAX_BRANCHES*4 of them: each
        multiple listed, kept only when the validator accepts it. An integer step up to
        MAX_STEP otherwise: the integers it divides (divisibility is regular: one rule per
        remainder and digit count), beside any bounds; a decimal step ``a / 10^k`` with ``a``
        up to MAX_STEP likewise: :meth:`unbounded_multiples`. Else refused."""
        step = node[key]
        lo = self.bound(node, path, "minimum", "exclusiveMinimum")
        hi = self.bound(node, path, "maximum", "exclusiveMaximum")
        if not _num(step) or step <= 0:
            raise _Refuse(path, key, f'"{key}" must be a positive number')
        exact = Fraction(str(step)) if isinstance(step, float) else Fraction(step)
        listed = _multiples_between(lo, hi, exact)
        if listed is not None:
            kept = []
            for n in listed:
                if integer and (n * exact).denominator != 1:
                    continue
                text = self.valid_multiple(node, n * exact, path, key)
                if text is not None:
                    kept.append(gbnf_literal(text))
            if not kept:
                raise _Unsatisfiable(path, key, f"no multiple of {step} between the bounds passes the validator")
            return self.rule(f"{path}-multiple", _alt(kept))
        if exact.denominator != 1 and integer:
            # the integers among the multiples of p/q (lowest terms): the multiples of p
            return self.gen_number({**node, key: exact.numerator}, path, integer=True)
        point = ""
        if _not_an_integer(node):
            if exact.denominator != 1:
                raise _Refuse(path, key, f'"{key}": a decimal step beside a negated integer type is not compiled')
            if self.draft != 4:
                raise _Unsatisfiable(path, "not", f"every multiple of {_decimal_text(exact)} is an integer")
            # draft 4 reads a number written with a point as no integer: 4.0 is a multiple of 2
            # there (a float's remainder is exact), written so, at most 15 digits before the
            # point so the float parsed is the integer written (10^15 < 2^53)
            point = '".0"'
        return self.unbounded_multiples(exact, lo, hi, path, key, point=point, integer=integer)

    def multiples_within(
        self,
        lo: _Bound | None,
        hi: _Bound | None,
        path: str,
        key: str,
        *,
        a: int,
        k: int,
        residues: frozenset[int],
        integer: bool,
    ) -> str:
        """The numbers ``n / 10^k`` between the bounds (either may be absent) whose ``n``
        leaves a remainder modulo ``a`` in ``residues`` (the multiples of ``a / 10^k`` by
        default: 16 from 16 on, 0.01 from 0.01 on), written with at most ``k`` decimals
        (trailing zeros optional) and an integer part below 10^(15-k) (MAX_INT_DIGITS digits
        for an integer step): 15 digits, so the float parsed is the decimal written. Per count
        of integer digits, a walk over the digits of ``n`` that keeps its remainder and, while
        the digits so far equal a bound's, the bound's digits still to compare (one rule per
        state; digits leading to the same state share a class); the fraction may end early when
        the digits it leaves out, all 0, keep the remainder and the lower bound. A bound beyond
        the magnitudes written bounds nothing written."""
        scale = 10**k
        width = 15 - k if k else MAX_INT_DIGITS
        cap = 10**width * scale - 1  # the largest n written
        low_n = -cap if lo is None else max(-cap, _int_at_least(_Bound(lo.value * scale, lo.exclusive)))
        high_n = cap if hi is None else min(cap, _int_at_most(_Bound(hi.value * scale, hi.exclusive)))
        memo: dict[tuple[bool, int, int, str | None, str | None, bool, frozenset[int]], str | None] = {}

        def walk(
            fraction: bool, left: int, rem: int, low: str | None, high: str | None, *, first: bool, mods: frozenset[int]
        ) -> str | None:
            """What may follow digits leaving ``rem``, ``left`` integer digits (or fraction
            digits) still to write; ``low``/``high``: a bound's digits still to match (None: the
            digits so far already differ from it). ``first``: the integer's first digit (1-9
            unless it is the only one), or the fraction's (it may not end before one)."""
            state = (fraction, left, rem, low, high, first, mods)
            if state in memo:
                return memo[state]
            memo[state] = None  # no cycles: left shrinks, the integer part before the fraction
            alts = []
            if not fraction and not left:  # the integer part is written
                if (rem * scale) % a in mods and (low is None or not low.strip("0")):
                    alts.append('""')
                if k and (tail := walk(True, k, rem, low, high, first=True, mods=mods)) is not None:
                    alts.append(f'"." {tail}')
            else:
                if fraction and not first and (rem * 10**left) % a in mods and (low is None or not low.strip("0")):
                    alts.append('""')  # the digits left out are 0
                targets: dict[tuple[int, str | None, str | None], list[int]] = {}
                for d in range(1 if first and not fraction and left > 1 else 0, 10 if left else 0):
                    if (low is not None and d < int(low[0])) or (high is not None and d > int(high[0])):
                        continue
                    nlow = low[1:] if low is not None and d == int(low[0]) else None
                    nhigh = high[1:] if high is not None and d == int(high[0]) else None
                    targets.setdefault(((10 * rem + d) % a, nlow, nhigh), []).append(d)
                for (target, nlow, nhigh), ds in targets.items():
                    nxt = walk(fraction, left - 1, target, nlow, nhigh, first=False, mods=mods)
                    if nxt is not None:
                        digit = gbnf_class([(ord(str(d)), ord(str(d))) for d in ds])
                        alts.append(digit if nxt == '""' else f"{digit} {nxt}")
            found = _alt(alts) if alts else None
            memo[state] = found if found in (None, '""') else self.rule(f"{path}-mult", found)
            return memo[state]

        def digits(n: int) -> str:
            """``n``'s integer part, then its ``k`` fraction digits."""
            return str(n // scale) + str(n % scale).zfill(k) if k else str(n)

        def magnitudes(least: int, most: int, mods: frozenset[int]) -> str | None:
            if least > most:
                return None
            shortest, longest = len(str(least // scale)), len(str(most // scale))
            found = [
                walk(
                    False,
                    n,
                    0,
                    digits(least) if n == shortest else None,
                    digits(most) if n == longest else None,
                    first=True,
                    mods=mods,
                )
                for n in range(shortest, longest + 1)
            ]
            kept = [part for part in found if part is not None]
            return _alt(kept) if kept else None

        parts = []
        if high_n >= 0 and (found := magnitudes(max(low_n, 0), high_n, residues)) is not None:
            parts.append(found)
        mirrored = frozenset((-r) % a for r in residues)
        if low_n < 0 and (found := magnitudes(max(-high_n, 1), -low_n, mirrored)) is not None:
            parts.append(f'"-" {found}' if _is_atom(found) else f'"-" ( {found} )')
        shown = _decimal_text(Fraction(a, scale))
        if not parts:
            raise _Unsatisfiable(path, key, f"no multiple of {shown} lies between the bounds")
        self.note_multiples(path, shown, k, width, integer=integer)
        return self.rule(f"{path}-multiple", _alt(parts))

    def gen_non_multiples(self, node: dict[str, Any], path: str, excluded: list[Any], *, integer: bool) -> str:
        """Numbers that are no multiple of any ``excluded`` step (a kept ``"not"`` of
        ``multipleOf``, or of an ``anyOf`` of them), multiples of the node's own step if it has
        one: integer steps only. Between two bounds with at most MAX_BRANCHES*4 candidates, each
        listed and kept when the validator accepts it; else the integers whose remainder modulo
        the steps' least common multiple (at most MAX_STEP) is one the steps allow, as
        :meth:`unbounded_multiples` writes them. A number type adds the non-integers (never a
        multiple of an integer step) when the node has no step of its own."""
        key = next((k for k in ("multipleOf", "divisibleBy") if k in node), None)
        step = node[key] if key is not None else 1
        steps = [step, *excluded]
        if not all(_num(v) and v > 0 and Fraction(str(v)).denominator == 1 for v in steps):
            raise _Refuse(path, "not", '"not" of "multipleOf" is compiled for integer steps only')
        step, excluded = int(step), [int(Fraction(str(v))) for v in excluded]
        if any(step % k == 0 for k in excluded):
            raise _Unsatisfiable(path, "not", f'every multiple of {step} is a multiple of a step the "not" excludes')
        lo = self.bound(node, path, "minimum", "exclusiveMinimum")
        hi = self.bound(node, path, "maximum", "exclusiveMaximum")
        fractions = [] if integer or key is not None else self.fractions(lo, hi, path, whole=False)
        listed = _multiples_between(lo, hi, Fraction(step))
        if listed is not None:
            texts = (self.valid_multiple(node, Fraction(n * step), path, "not") for n in listed)
            kept = [gbnf_literal(t) for t in texts if t is not None] + fractions
            if not kept:
                raise _Unsatisfiable(path, "not", 'no number between the bounds is left by the "not"')
            return self.rule(f"{path}-number", _alt(kept))
        modulus = math.lcm(step, *excluded)
        if modulus > MAX_STEP:
            raise _Refuse(
                path, "not", f'"not" of "multipleOf" needs one rule per remainder of {modulus}, above {MAX_STEP}'
            )
        residues = frozenset(r for r in range(modulus) if r % step == 0 and all(r % k for k in excluded))
        whole = self.unbounded_multiples(
            Fraction(modulus), lo, hi, path, "not", point="", integer=True, residues=residues
        )
        return self.rule(f"{path}-number", _alt([whole, *fractions])) if fractions else whole

    def unbounded_multiples(
        self,
        step: Fraction,
        lo: _Bound | None,
        hi: _Bound | None,
        path: str,
        key: str,
        *,
        point: str,
        integer: bool,
        residues: frozenset[int] = frozenset({0}),
    ) -> str:
        """The multiples of ``step`` (``a / 10**k``, ``k`` 0 for an integer step) without two
        bounds that list them, written ``i`` or ``i.f`` with at most ``k`` fraction digits:
        divisibility of the digits read as one integer by ``a`` is regular (a rule per
        remainder and digit count, the fraction's digits scaled by the ``10**(k - j)`` still to
        come). At most MAX_INT_DIGITS digits for an integer step (one fewer before ``point``),
        15 in all for a decimal one (so the float a validator parses is the decimal written,
        and :mod:`localllm.grammar.bounded` decides ``multipleOf`` on it exactly). Bounds:
        none, or ones that only say "not negative" / "positive" (or the mirror), or beyond the
        magnitudes written; other bounds go to :meth:`multiples_within`. ``a`` above MAX_STEP
        is refused. ``residues`` (an
        integer ``step`` only): the remainders modulo ``step`` the integers written leave
        (:meth:`gen_non_multiples`); the multiples by default."""
        k = 0
        while (step * 10**k).denominator != 1:
            k += 1
        a = int(step * 10**k)
        shown = _decimal_text(step)
        if not k and a > MAX_STEP:
            raise _Refuse(path, key, f'"{key}": {a} above {MAX_STEP} needs one rule per remainder; not compiled')
        if k >= 15 or a > MAX_STEP:
            raise _Refuse(
                path,
                key,
                f'"{key}": {shown} is a decimal step with {k} decimals and {a} as its digits; without '
                f"two bounds listing at most {4 * MAX_BRANCHES} values it is compiled only up to 14 decimals and "
                f"digits up to {MAX_STEP}",
            )
        whole = 15 - k if k else MAX_INT_DIGITS - 1 if point else MAX_INT_DIGITS  # integer digits at most
        top = Fraction(10) ** whole  # every magnitude written is below it
        least = Fraction(float(step)) if k else step  # the smallest positive multiple as the validator reads it
        if residues != {0}:
            least = Fraction(min(r or a for r in residues))  # the smallest positive value written
        positive = _all_beyond(lo, hi, least, top)
        negative = _all_beyond(_mirror(hi), _mirror(lo), least, top)
        if (positive is None or negative is None) and not point:
            # a bound other than 0 / ±step: 0.01 from 0.01 up to 99999999999999.98, 16 from 16 on
            return self.multiples_within(lo, hi, path, key, a=a, k=k, residues=residues, integer=integer)
        if positive is None or negative is None:
            raise _Refuse(
                path,
                key,
                f'"{key}": {shown} with a bound other than 0 (or ±{shown}) is compiled only between two bounds '
                f"listing at most {4 * MAX_BRANCHES} values",
            )
        zero = (
            0 in residues
            and (lo is None or lo.value < 0 or (lo.value == 0 and not lo.exclusive))
            and (hi is None or hi.value > 0 or (hi.value == 0 and not hi.exclusive))
        )
        states: dict[tuple[str, int, int, bool], str | None] = {}

        def digits(phase: str, rem: int, n: int, nonzero: bool) -> str | None:
            """What may follow ``n`` digits (of the integer part, or of the fraction) whose value
            leaves ``rem`` modulo ``a``: None when no multiple can."""
            if (phase, rem, n, nonzero) in states:
                return states[(phase, rem, n, nonzero)]
            states[(phase, rem, n, nonzero)] = None  # no cycles: n grows
            alts: list[str] = []
            room = whole if phase == "int" else k
            if n < room:
                by_target: dict[tuple[int, bool], list[int]] = {}
                for d in range(10):
                    by_target.setdefault(((10 * rem + d) % a, nonzero or d > 0), []).append(d)
                for (target, nz), ds in by_target.items():
                    nxt = digits(phase, target, n + 1, nz)
                    if nxt is not None:
                        alts.append(f"{gbnf_class([(ord(str(d)), ord(str(d))) for d in ds])} {nxt}".strip())
            if phase == "int" and k:
                fraction = digits("frac", rem, 0, nonzero)
                if fraction is not None:
                    alts.append(f'"." {fraction}'.strip())
            scale = 10 ** (k - n) if phase == "frac" else 10**k
            ends = nonzero and (rem * scale) % a in residues and (phase == "int" or n > 0)
            if not alts:
                expr = "" if ends else None
            else:
                body = " | ".join(alts)
                expr = self.rule(f"{path}-mult", f"( {body} )?" if ends else body)
            states[(phase, rem, n, nonzero)] = expr
            return expr

        starts = [f'"{d}" {nxt}'.strip() for d in range(1, 10) if (nxt := digits("int", d % a, 1, True)) is not None]
        if k and (fraction := digits("frac", 0, 0, False)) is not None:
            starts.append(f'"0." {fraction}'.strip())
        magnitude = self.rule(f"{path}-multiples", " | ".join(starts))
        parts = ['"0"'] if zero else []
        if positive and negative:
            parts.append(f'"-"? {magnitude}')
        elif positive:
            parts.append(magnitude)
        elif negative:
            parts.append(f'"-" {magnitude}')
        if not parts:
            raise _Unsatisfiable(path, key, f"no multiple of {shown} lies between the bounds")
        if point:
            self.notes.append(f"{path}: multiples of {shown} are written as integers with .0 (at most 15 digits)")
            return self.rule(f"{path}-multiple", f"( {' | '.join(parts)} ) {point}")
        self.note_multiples(path, shown, k, whole, integer=integer)
        return self.rule(f"{path}-multiple", " | ".join(parts))

    def note_multiples(self, path: str, shown: str, k: int, whole: int, *, integer: bool) -> None:
        """How multiples of ``shown`` are written: at most ``k`` decimals below 10^``whole``,
        or (a number type, k = 0) as integers."""
        if k:
            self.notes.append(
                f"{path}: multiples of {shown} are written with at most {k} decimal{'s' * (k > 1)}, "
                f"below 10^{whole} and with no exponent"
            )
        elif not integer:
            self.notes.append(f"{path}: multiples of {shown} are written as integers")

    def valid_multiple(self, schema: Any, value: Fraction, path: str, key: str) -> str | None:
        """``value`` written as a JSON number ``schema`` accepts (checked by the validator), or
        None. A whole value is tried as an integer, then (draft 4, where that is no integer)
        with ``.0``."""
        text = _decimal_text(value)
        texts = [text, f"{text}.0"] if self.draft == 4 and value.denominator == 1 else [text]
        return next((t for t in texts if self.valid(schema, json.loads(t), path, key)), None)

    def gen_non_integer(self, lo: _Bound | None, hi: _Bound | None, path: str) -> str:
        """Numbers that are no integer (``"not": {"type": "integer"}`` beside a number type).

        Draft 4 counts every number written with a fraction or an exponent as no integer (the
        parser reads a float: 1.0 is not an integer there), so that is exact. Later drafts count
        1.0 as an integer: a non-integer is then written ``k.ddd`` with a digit other than 0
        after the point, 1-6 of them and |k| < 10^9 (15 significant digits at most, so the
        float parsed is no integer either: ``9999999999999999.5`` would read as 10^16). An
        exponent form is left out (``1.5e1`` is 15), as are longer fractions (noted)."""
        if lo is None and hi is None and self.draft == 4:
            return self.primitive("float")
        parts = self.fractions(lo, hi, path, whole=self.draft == 4)
        if not parts:
            if lo is not None and hi is not None:
                point = lo.value == hi.value and not (lo.exclusive or hi.exclusive)
                if (
                    lo.value > hi.value
                    or (lo.value == hi.value and not point)
                    or (point and self.draft > 4 and lo.value.denominator == 1)
                ):
                    raise _Unsatisfiable(path, "not", "no number that is not an integer meets the bounds")
            raise _Refuse(
                path,
                "minimum",
                f"no number with 1-{FRACTION_DIGITS} decimals and an integer part below 10^9 meets the bounds "
                f"(non-integers are narrowed to those; {_bound_text(lo, True)}, {_bound_text(hi, False)})",
            )
        if lo is None and hi is None:
            self.notes.append(
                f"{path}: numbers that are not integers are generated with 1-{FRACTION_DIGITS} decimals, "
                "an integer part below 10^9 and no exponent"
            )
        return self.rule(f"{path}-non-integer", _alt(parts))

    def fractions(self, lo: _Bound | None, hi: _Bound | None, path: str, *, whole: bool = True) -> list[str]:
        """Numbers written with a fraction part ``k.ddd`` (|k| < 10^9, 1-6 fraction digits: at
        most 15 significant digits, so the float a validator parses orders exactly like the
        decimal against a bound of at most 15 significant digits), exactly within the bounds;
        ``whole=False`` leaves out those whose fraction digits are all 0 (``2.0``)."""
        dlo = None if lo is None else _decimal_bound(lo)
        dhi = None if hi is None else _decimal_bound(hi)
        if (lo is not None and dlo is None) or (hi is not None and dhi is None):
            self.notes.append(
                f"{path}: a bound has more than 15 significant digits; only integers are generated "
                "(decimals could round onto the bound when parsed)"
            )
            return []
        parts = []
        # non-negative: magnitude in [max(lo, 0), hi]
        if dhi is None or dhi.value >= 0:
            low = dlo if dlo is not None and dlo.value >= 0 else _Bound(Fraction(0), False)
            expr = self.magnitudes(low, dhi, whole=whole)
            if expr:
                parts.append(expr)
        # negative: -m with m in [max(-hi, 0), -lo]
        if dlo is None or dlo.value < 0:
            low = _Bound(-dhi.value, dhi.exclusive) if dhi is not None and dhi.value <= 0 else _Bound(Fraction(0), True)
            high = None if dlo is None else _Bound(-dlo.value, dlo.exclusive)
            expr = self.magnitudes(low, high, whole=whole)
            if expr:
                parts.append(f'"-" {expr}' if _is_atom(expr) else f'"-" ( {expr} )')
        return parts

    def magnitudes(self, lo: _Bound, hi: _Bound | None, *, whole: bool = True) -> str | None:
        """``I.ddd`` (0 <= I < 10^9, 1-6 fraction digits) with lo <= value <= hi (strict where
        exclusive); ``whole=False``: a digit other than 0 among the ddd."""
        cap = FRACTION_INT_CAP
        i_lo = math.floor(lo.value)
        lo_digits = _fraction_digits(lo.value - i_lo)
        if hi is None or hi.value >= cap + 1:
            i_hi, hi_digits, hi_strict = cap, None, False
        else:
            i_hi = math.floor(hi.value)
            hi_digits, hi_strict = _fraction_digits(hi.value - i_hi), hi.exclusive
        if i_lo > i_hi:
            return None
        frac = _FractionDigits(FRACTION_DIGITS, self.rule)

        def digits(low: str | None, low_strict: bool, high: str | None, high_strict: bool) -> str | None:
            if not whole and not low:
                low, low_strict = "", True  # 0.ddd > 0: not all zeros
            return frac.expr(low, low_strict, high, high_strict)

        parts = []
        if i_lo == i_hi:
            tail = digits(lo_digits, lo.exclusive, hi_digits, hi_strict)
            if tail is not None:
                parts.append(f"{gbnf_literal(str(i_lo) + '.')} {tail}")
        else:
            tail = digits(lo_digits, lo.exclusive, None, False)
            if tail is not None:
                parts.append(f"{gbnf_literal(str(i_lo) + '.')} {tail}")
            if i_lo + 1 <= i_hi - 1:
                parts.append(f'{_nonneg_range(i_lo + 1, i_hi - 1)} "." {digits(None, False, None, False)}')
            tail = digits(None, False, hi_digits, hi_strict)
            if tail is not None:
                parts.append(f"{gbnf_literal(str(i_hi) + '.')} {tail}")
        return _alt(parts) if parts else None

    def bound(self, node: dict[str, Any], path: str, plain: str, exclusive: str) -> _Bound | None:
        best: _Bound | None = None
        candidates: list[_Bound] = []
        if plain in node:
            value = node[plain]
            if not _finite(value):
                raise _Refuse(path, plain, f'"{plain}" must be a finite number')
            candidates.append(_Bound(Fraction(value), self.draft == 4 and node.get(exclusive) is True))
        if exclusive in node and self.draft > 4:
            value = node[exclusive]
            if not _finite(value):
                raise _Refuse(path, exclusive, f'"{exclusive}" must be a finite number')
            candidates.append(_Bound(Fraction(value), True))
        lower = plain == "minimum"
        for c in candidates:
            if best is None:
                best = c
                continue
            tighter = c.value > best.value if lower else c.value < best.value
            if tighter or (c.value == best.value and c.exclusive):
                best = c
        return best


_BASE = "https://localllm.invalid/root.json"
#: keywords whose values are data, not schemas: a "$ref" in them is no reference
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


#: keywords whose value is a subschema or a list of them, and those whose value maps names to
#: subschemas: where an ``$id`` or ``$anchor`` names a resource (not inside an unknown keyword)
_APPLICATORS = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "allOf",
        "anyOf",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "oneOf",
        "prefixItems",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_APPLICATOR_MAPS = _SCHEMA_MAPS | {"dependencies"}  # draft 7's maps a name to a schema or a list


def _local_refs(root: dict[str, Any], id_key: str, *, legacy: bool = False) -> dict[str, Any]:
    """``root`` with every ``$ref`` that names a resource of this document (a nested ``$id``,
    an ``$anchor``, a draft-7 ``"$id": "#name"``) rewritten as a ``#/...`` pointer from the
    root, and those ``$id``/``$anchor`` keys dropped; the structure (so every JSON path) is
    unchanged. Refs to other documents are left as they are (refused when followed). As the
    validator reads them: an ``$id`` inside an unknown keyword names nothing, and before
    2019-09 (``legacy``) an ``$id`` beside a ``$ref`` is ignored with every other sibling."""
    from urllib.parse import quote, urldefrag, urljoin

    def has_ids(node: Any, top: bool) -> bool:
        if isinstance(node, list):
            return any(has_ids(v, False) for v in node)
        if not isinstance(node, dict):
            return False
        ref = node.get("$ref")
        if "$anchor" in node or (not top and isinstance(node.get(id_key), str)):
            return True
        if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
            return True
        # a map's keys are names (a property may be called "default"), its values schemas
        return any(
            any(has_ids(sub, False) for sub in v.values())
            if k in _APPLICATOR_MAPS and isinstance(v, dict)
            else has_ids(v, False)
            for k, v in node.items()
            if k not in DATA_KEYWORDS
        )

    if not has_ids(root, True):
        return root
    top_id = root.get(id_key)
    root_base = urldefrag(urljoin(_BASE, top_id))[0] if isinstance(top_id, str) else _BASE
    resources: dict[str, list[str | int]] = {root_base: []}
    anchors: dict[tuple[str, str], list[str | int]] = {}
    bases: dict[int, str] = {}

    def index(node: Any, base: str, pointer: list[str | int]) -> None:
        if isinstance(node, list):
            for i, v in enumerate(node):
                index(v, base, [*pointer, i])
            return
        if not isinstance(node, dict):
            return
        ident = node.get(id_key)
        if isinstance(ident, str) and pointer and not ("$ref" in node and legacy):
            joined = urljoin(base, ident)
            doc, frag = urldefrag(joined)
            if ident.startswith("#"):
                anchors[(doc, frag)] = pointer
            else:
                base = doc
                resources[doc] = pointer
                if frag:
                    anchors[(doc, frag)] = pointer
        if isinstance(node.get("$anchor"), str):
            anchors[(base, node["$anchor"])] = pointer
        bases[id(node)] = base
        for k, v in node.items():
            if k in _APPLICATORS:
                index(v, base, [*pointer, k])
            elif k in _APPLICATOR_MAPS and isinstance(v, dict):
                for name, sub in v.items():
                    index(sub, base, [*pointer, k, name])

    index(root, root_base, [])

    def escape(token: str | int) -> str:
        return quote(str(token).replace("~", "~0").replace("/", "~1"), safe="~!$&'()*+,;=:@")

    def rewrite(node: Any, top: bool) -> Any:
        if isinstance(node, list):
            return [rewrite(v, False) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        base = bases.get(id(node), root_base)
        for k, v in node.items():
            if k in DATA_KEYWORDS:
                out[k] = v
            elif k in ("$anchor",) or (k == id_key and not top and isinstance(v, str)):
                continue
            elif k == "$ref" and isinstance(v, str):
                doc, frag = urldefrag(urljoin(base, v))
                target: list[str | int] | None = None
                if frag.startswith("/") or not frag:
                    start = resources.get(doc)
                    if start is not None:
                        target = [*start, *pointer_tokens(frag)]
                else:
                    target = anchors.get((doc, frag))
                out[k] = v if target is None else "#" + "".join("/" + escape(t) for t in target)
            elif k in _APPLICATOR_MAPS and isinstance(v, dict):
                out[k] = {name: rewrite(sub, False) for name, sub in v.items()}
            else:
                out[k] = rewrite(v, False)
        return out

    rewritten: dict[str, Any] = rewrite(root, True)
    return rewritten


def _validation_failures() -> tuple[type[BaseException], ...]:
    """What jsonschema may raise while evaluating a schema it accepted (bad refs, odd values)."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema
    from referencing.exceptions import Unresolvable

    return (
        Unresolvable,
        jsonschema.exceptions.UnknownType,
        jsonschema.exceptions.FormatError,
        jsonschema.exceptions.SchemaError,
        ValueError,
        TypeError,
        LookupError,
        AttributeError,
        RecursionError,
        OverflowError,
        re.error,
    )


def _bound_text(b: _Bound | None, lower: bool) -> str:
    if b is None:
        return "no lower bound" if lower else "no upper bound"
    op = (">" if b.exclusive else ">=") if lower else ("<" if b.exclusive else "<=")
    return f"value {op} {float(b.value) if b.value.denominator != 1 else b.value}"


def _decimal_bound(b: _Bound) -> _Bound | None:
    """``b`` as the shortest decimal that denotes it (what the schema author wrote: 0.1, not
    the binary 0.1000000000000000055…), or None when that has more than 15 significant digits."""
    if b.value.denominator == 1:
        return b
    text = repr(float(b.value))
    mantissa = text.split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    if len(mantissa) > 15:
        return None
    return _Bound(Fraction(text), b.exclusive)


def _fraction_digits(frac: Fraction) -> str:
    """The decimal digits of ``0 <= frac < 1`` without trailing zeros (frac is a finite decimal)."""
    digits = ""
    while frac:
        frac *= 10
        d = math.floor(frac)
        digits += str(d)
        frac -= d
        if len(digits) > 40:
            break
    return digits


class _FractionDigits:
    """Digit strings ``t`` (1..n digits) with ``0.lo <(=) 0.t <(=) 0.hi``, as GBNF rules.

    A bound is its digit string without trailing zeros (None: no bound on that side); the
    walk keeps, per side, the bound's digits still to compare (None once ``t`` is strictly
    inside), so each state is one rule and digits with the same next state share a class.
    """

    def __init__(self, n: int, rule: Any) -> None:
        self.n = n
        self.rule = rule
        self.memo: dict[tuple[str | None, bool, str | None, bool, int, bool], str | None] = {}
        self.ls = self.hs = False

    def expr(self, lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> str | None:
        self.ls, self.hs = lo_strict, hi_strict
        return self.state(lo, hi, self.n, True)

    def state(self, lo: str | None, hi: str | None, m: int, need: bool) -> str | None:
        ls, hs = self.ls, self.hs
        key = (lo, ls, hi, hs, m, need)
        if key in self.memo:
            return self.memo[key]
        if lo is None and hi is None:
            out: str | None = _repeat("[0-9]", 1 if need else 0, m) if m else (None if need else '""')
            self.memo[key] = out
            return out
        alts: list[str] = []
        # the string may end here (0.t's remaining digits are 0)
        lo_ok = lo is None or (lo == "" and not ls)
        hi_ok = hi is None or hi != "" or not hs
        can_end = not need and lo_ok and hi_ok
        if m > 0:
            groups: dict[tuple[str | None, str | None], list[int]] = {}
            for d in range(10):
                nlo: str | None
                if lo is None:
                    nlo = None
                elif lo == "":
                    nlo = None if d > 0 else ""
                else:
                    if d < int(lo[0]):
                        continue
                    nlo = None if d > int(lo[0]) else lo[1:]
                nhi: str | None
                if hi is None:
                    nhi = None
                elif hi == "":
                    if d > 0:
                        continue
                    nhi = ""
                else:
                    if d > int(hi[0]):
                        continue
                    nhi = None if d < int(hi[0]) else hi[1:]
                groups.setdefault((nlo, nhi), []).append(d)
            for (nlo, nhi), ds in groups.items():
                rest = self.state(nlo, nhi, m - 1, False)
                if rest is None:
                    continue
                cls = f"[{ds[0]}]" if len(ds) == 1 else f"[{ds[0]}-{ds[-1]}]"
                if len(ds) > 1 and ds != list(range(ds[0], ds[-1] + 1)):
                    cls = "[" + "".join(str(d) for d in ds) + "]"
                alts.append(cls if rest == '""' else f"{cls} {rest}")
        if not alts:
            out = '""' if can_end else None
        else:
            body = " | ".join(alts)
            if can_end:
                body = f"( {body} )?" if len(alts) > 1 else _repeat(alts[0], 0, 1)
            out = self.rule(f"frac-{lo}-{hi}-{m}", body) if (len(alts) > 1 or can_end) else alts[0]
        self.memo[key] = out
        return out


def _decimal_text(value: Fraction) -> str:
    """``value`` (a decimal fraction) written as a JSON number: an integer, or digits with a point."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    mag = abs(value)
    scale = 0
    while (mag * 10**scale).denominator != 1:
        scale += 1
    digits = str((mag * 10**scale).numerator).rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


@functools.cache
def _format_tree(fmt: str) -> tuple[Any, ...]:
    """``fmt``'s grammar (:data:`_PRIMITIVES`, its rules inlined: none is recursive) as the
    regex tree the automata read, so a pattern or length bounds beside a format intersect with
    exactly what the format's rule writes."""

    names, todo = [], [fmt]
    while todo:
        name = todo.pop()
        if name not in names:
            names.append(name)
            todo.extend(_primitive_deps(name))
    rules = Grammar.parse("\n".join([f"root ::= {fmt}", *(f"{n} ::= {_PRIMITIVES[n]}" for n in names)])).rules

    def tree(node: tuple[Any, ...]) -> tuple[Any, ...]:
        kind = node[0]
        if kind == "seq":
            return ("cat", [tree(n) for n in node[1]])
        if kind == "alt":
            return ("alt", [tree(n) for n in node[1]])
        if kind == "lit":
            return ("cat", [("set", ((ord(c), ord(c)),)) for c in node[1]])
        if kind == "cls" and not node[1]:
            return ("set", tuple(automaton.normalize(node[2])))
        if kind == "ref":
            return tree(rules[node[1]])
        if kind == "rep":
            return ("rep", tree(node[1]), node[2], node[3])
        raise ValueError(f"format {fmt!r}: {kind} is not read as a regex tree")

    return tree(rules["root"])


@functools.lru_cache(maxsize=64)
def _format_dfa(fmt: str, lo: int, hi: int | None) -> automaton.Dfa | None:
    """``fmt``'s strings ``lo``..``hi`` long, as a DFA: the same for every schema (a regex
    format's determinisation alone takes ~80 ms), so made once per process."""
    tree = _format_tree(fmt)
    return automaton.intersection(
        [[(True, True, tree)]], _JSON_UNIVERSE, lo=lo, hi=hi, limit=MAX_PRODUCT_STATES, nfa_limit=MAX_STATES
    )


def _mirror(b: _Bound | None) -> _Bound | None:
    """``b`` for the negated values (a lower bound of -x read as an upper bound of x)."""
    return None if b is None else _Bound(-b.value, b.exclusive)


def _multiples_between(lo: _Bound | None, hi: _Bound | None, step: Fraction) -> range | None:
    """The ``n`` whose ``n * step`` lies between two bounds, when there are two and at most
    MAX_BRANCHES*4 such multiples (few enough to list one by one); else None."""
    if lo is None or hi is None:
        return None
    first, last = math.ceil(lo.value / step), math.floor(hi.value / step)
    first += lo.exclusive and first * step == lo.value
    last -= hi.exclusive and last * step == hi.value
    return range(first, last + 1) if last - first + 1 <= 4 * MAX_BRANCHES else None


def _all_beyond(lo: _Bound | None, hi: _Bound | None, step: Fraction, top: Fraction) -> bool | None:
    """Whether every positive multiple of a step whose least is ``step`` (the float a validator
    reads, as are the bounds) and that is below ``top`` meets the bounds (True), none does
    (False), or some do and some do not (None)."""
    below = hi is not None and (hi.value < step or (hi.value == step and hi.exclusive))
    above = lo is not None and (lo.value > top or (lo.value == top and lo.exclusive))
    if below or above:
        return False
    low_ok = lo is None or lo.value < step or (lo.value == step and not lo.exclusive)
    high_ok = hi is None or hi.value >= top
    return True if low_ok and high_ok else None


def _int_at_least(b: _Bound) -> int:
    n = math.ceil(b.value)
    return n + 1 if b.exclusive and n == b.value else n


def _int_at_most(b: _Bound) -> int:
    n = math.floor(b.value)
    return n - 1 if b.exclusive and n == b.value else n


# ---------------------------------------------------------------------------- helpers


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A number that is not inf or nan (an int always is, 10**400 too: ``math.isfinite`` overflows on it)."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value)
    )


def _count(value: Any) -> bool:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(node: dict[str, Any], path: str, low: str, high: str) -> tuple[int, int | None]:
    """``node``'s (low, high) count keywords as ints; a high bound above MAX_REPEAT is lowered to it
    (fewer answers, all still valid)."""
    lo = node.get(low, 0)
    hi = node.get(high)
    if not _count(lo) or (hi is not None and not _count(hi)):
        raise _Refuse(path, low if not _count(lo) else high, f"{low}/{high} must be non-negative integers")
    lo_i = int(lo)
    hi_i = None if hi is None else min(int(hi), MAX_REPEAT)
    if lo_i > MAX_REPEAT:
        raise _Refuse(path, low, f"{low} above {MAX_REPEAT}")
    if hi_i is not None and lo_i > hi_i:
        raise _Unsatisfiable(path, low, f"{low} exceeds {high}")
    return lo_i, hi_i


def _excluded_steps(node: dict[str, Any]) -> list[Any] | None:
    """The steps of a number type's ``"not": {"multipleOf": k}`` (or of ``anyOf``s of such
    schemas, as negations merged in ``allOf`` nest them), or None. No positive keyword says "no
    multiple of k", so it is kept, not rewritten, and :meth:`_Compiler.gen_non_multiples` writes it."""
    types = _type_set(node.get("type"))
    if types is None or not types or not set(types) <= {"number", "integer"}:
        return None
    steps: list[Any] = []
    stack = [node.get("not")]
    while stack:
        part = stack.pop()
        if not isinstance(part, dict):
            return None
        keys = [k for k in part if _asserts(part, k)]
        if keys == ["anyOf"] and isinstance(part["anyOf"], list):
            stack.extend(part["anyOf"])
        elif keys in (["multipleOf"], ["divisibleBy"]):
            steps.append(part[keys[0]])
        else:
            return None
    return steps or None


def _not_an_integer(node: dict[str, Any]) -> bool:
    """Is ``node`` a number type with ``"not": {"type": "integer"}`` (and nothing else in the
    "not")? No positive keyword says "not an integer", so it is kept, not rewritten, and
    :meth:`_Compiler.gen_non_integer` writes it."""
    neg = node.get("not")
    types = _type_set(node.get("type"))
    return (
        isinstance(neg, dict)
        and [k for k in neg if _asserts(neg, k)] == ["type"]
        and _type_set(neg["type"]) == ["integer"]
        and types is not None
        and bool(types)
        and set(types) <= {"number", "integer"}
    )


def _type_set(value: Any) -> list[str] | None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPES for n in names):
        return None
    return list(dict.fromkeys(names))


def _schema_kinds(node: dict[str, Any]) -> set[str] | None:
    """The JSON kinds ``node`` admits at most (integer counts as number), if it says."""
    lits = _literal_values(node)
    if lits is not None:
        return {_kind(v) for v in lits}
    types = _type_set(node.get("type"))
    if types is None:
        return None
    return {"number" if t == "integer" else t for t in types}


def _generated_kinds(node: dict[str, Any]) -> set[str] | None:
    """The kinds :meth:`_Compiler.typed` generates for ``node`` when it has no ``type``: those
    whose keywords it holds (None when something else decides: refs, combinators, literals)."""
    if _schema_kinds(node) is not None or any(k in node for k in ("$ref", "allOf", "anyOf", "oneOf")):
        return _schema_kinds(node)
    kinds = {k for k, kws in _KIND_KW.items() if any(_asserts(node, kw) for kw in kws)}
    return kinds or None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _required(node: dict[str, Any]) -> list[str]:
    req = node.get("required")
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def _forbids(node: dict[str, Any], name: str) -> bool:
    """``node`` admits no object with the key ``name``: its ``additionalProperties`` is false
    and the name is neither declared nor found by a ``patternProperties`` pattern."""
    if node.get("additionalProperties") is not False:
        return False
    props, patterns = node.get("properties", {}), node.get("patternProperties", {})
    if not isinstance(props, dict) or not isinstance(patterns, dict) or name in props:
        return False
    try:
        return not any(search(p, name, fallback=True) for p in patterns)
    except (re.error, ValueError, TypeError, RecursionError, OverflowError):
        return False


def _weight(node: dict[str, Any]) -> int:
    """What generating or merging ``node`` costs the compile's budget: its keywords and the
    entries of the arrays and objects they hold (properties, enum values, branches)."""
    weight = 1 + len(node)
    for value in node.values():
        if isinstance(value, (list, dict)):
            weight += len(value)
    return weight


def _literal_values(node: Any) -> list[Any] | None:
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def _lcm(a: Fraction, b: Fraction) -> Fraction:
    """The least positive rational both ``a`` and ``b`` divide (a whole number of each)."""
    return Fraction(math.lcm(a.numerator * b.denominator, b.numerator * a.denominator), a.denominator * b.denominator)


def _canon(value: Any) -> str:
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, list):
            return [norm(x) for x in v]
        return v

    try:
        return json.dumps(norm(value), sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


#: the draft each jsonschema validator class reads (2020 for 2020-12 and anything newer)
_DRAFTS = {
    "Draft3Validator": 3,
    "Draft4Validator": 4,
    "Draft6Validator": 6,
    "Draft7Validator": 7,
    "Draft201909Validator": 2019,
}
_POSITIONAL_ITEMS = ("prefixItems", "items", "additionalItems")
#: keywords rewritten into allOf/anyOf before generation
_REWRITTEN = ("not", "if", "dependentRequired", "dependentSchemas", "dependencies")
#: keywords that apply subschemas to the instance itself (their annotations count as evaluated)
_IN_PLACE = (
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
)
#: applicators whose evaluated keys/items depend on the branch a value takes (or on its items)
_DYNAMIC_EVALUATION = (
    "anyOf",
    "oneOf",
    "not",
    "if",
    "dependentSchemas",
    "dependencies",
    "contains",
    "$dynamicRef",
    "$recursiveRef",
)
#: a bound's negation: (the kind it applies to, the opposite keyword, +/-1 for counts, 0 for numbers)
_FLIPPED_BOUNDS: dict[str, tuple[str, str, int]] = {
    "minimum": ("number", "exclusiveMaximum", 0),
    "maximum": ("number", "exclusiveMinimum", 0),
    "exclusiveMinimum": ("number", "maximum", 0),
    "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1),
    "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1),
    "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1),
    "maxProperties": ("object", "minProperties", 1),
}
_EXCL = {"minimum": "exclusiveMinimum", "maximum": "exclusiveMaximum"}
#: keywords a draft's validator reads beside another one (no validator of their own)
_READ_BY_OTHERS = {
    4: frozenset(_EXCL.values()),
    2019: frozenset({"minContains", "maxContains"}),
    2020: frozenset({"minContains", "maxContains"}),
}


def _brief(value: Any) -> str:
    text = _q(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Fraction) -> int | float:
    return int(value) if value.denominator == 1 else float(value)


def _not_one_of(strings: list[str]) -> str:
    """A Python regex matching every string except those listed (a trie's complement)."""
    trie: dict[str, Any] = {}
    for text in strings:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}
    anything = "(?:.|\\n)"

    def esc(ch: str) -> str:
        return f"\\U{ord(ch):08X}"

    def comp(node: dict[str, Any]) -> str:
        chars = sorted(k for k in node if k)
        parts = [] if "" in node else [""]
        other = f"[^{''.join(esc(c) for c in chars)}]" if chars else anything
        parts.append(f"{other}{anything}*")
        parts.extend(f"{esc(c)}(?:{comp(node[c])})" for c in chars)
        return "|".join(parts)

    return f"^(?:{comp(trie)})$"


_REGEX_META = frozenset(".^$*+?{}[]\\|()")


def _pattern_literal(pattern: str) -> str | None:
    """The text an unanchored pattern of plain characters (and escaped punctuation) searches
    for, or None when the pattern is anything else."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1].isalnum() or pattern[i + 1] == "_":
                return None
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in _REGEX_META:
            return None
        out.append(c)
        i += 1
    return "".join(out)


#: one alternative of a literal search pattern: (literal, anchored at the start, at the end)
_Search = tuple[str, bool, bool]


def _literal_searches(pattern: str) -> tuple[_Search, ...] | None:
    """``a|^b|c$``-style patterns: top-level alternatives, each a literal (plain characters,
    escaped punctuation) with an optional ``^`` before and ``$`` after; None for any other."""
    branches, start = [], 0
    for k, c in enumerate(pattern):
        if c == "\\":
            continue
        if k and pattern[k - 1] == "\\" and (k < 2 or pattern[k - 2] != "\\"):
            continue
        if c == "|":
            branches.append(pattern[start:k])
            start = k + 1
    branches.append(pattern[start:])
    out = []
    for branch in branches:
        head = branch.startswith("^")
        body = branch[1:] if head else branch
        tail = body.endswith("$") and not body.endswith("\\$")
        body = body[:-1] if tail else body
        literal = _pattern_literal(body)
        if not literal or "\n" in literal or len(literal) > MAX_AVOIDED:
            return None
        out.append((literal, head, tail))  # "$": the very end, as ECMA-262 reads it
    return tuple(out)


def _avoiding(searches: tuple[_Search, ...], min_len: int = 0) -> str | None:
    """An anchored Python regex for the strings of at least ``min_len`` characters that no
    search of ``searches`` finds, or None past MAX_AVOIDED_STATES: the automaton whose state
    is the set of partial matches in progress (a completed unanchored-end match is no state;
    a completed end-anchored one is a state that may not end the string), times a counter of
    the first ``min_len`` characters, turned into a regex by state elimination (the states
    found last first)."""

    def esc(ch: str) -> str:
        return f"\\U{ord(ch):08X}"

    chars = sorted({c for lit, _, _ in searches for c in lit})
    other = f"[^{''.join(esc(c) for c in chars)}]"
    free = frozenset((i, 0) for i, (_, head, _) in enumerate(searches) if not head)

    def step(state: frozenset[tuple[int, int]], ch: str | None) -> frozenset[tuple[int, int]] | None:
        nxt = set(free)
        for i, k in state:
            lit, _, tail = searches[i]
            if k < len(lit) and ch == lit[k]:
                if k + 1 == len(lit) and not tail:
                    return None  # found: every continuation is rejected
                nxt.add((i, k + 1))
        return frozenset(nxt)

    def ends(state: frozenset[tuple[int, int]]) -> bool:
        return not any(k == len(searches[i][0]) for i, k in state)

    first = frozenset((i, 0) for i in range(len(searches)))
    order: list[tuple[frozenset[tuple[int, int]], int]] = [(first, 0)]
    index = {order[0]: 0}
    labels: dict[tuple[int, int], str] = {}
    k = 0
    while k < len(order):
        state, count = order[k]
        nxt_count = min(count + 1, min_len)
        for ch, label in [*((c, esc(c)) for c in chars), (None, other)]:
            target = step(state, ch)
            if target is None:
                continue
            key = (target, nxt_count)
            if key not in index:
                if len(order) >= MAX_AVOIDED_STATES:
                    return None
                index[key] = len(order)
                order.append(key)
            edge = (k, index[key])
            labels[edge] = _re_alt(labels.get(edge), label)
        k += 1
    n = len(order)
    start, final = n, n + 1
    edges = dict(labels)
    edges[(start, 0)] = ""
    for q, (state, count) in enumerate(order):
        if count == min_len and ends(state):
            edges[(q, final)] = ""
    for q in range(n - 1, -1, -1):
        loop = edges.pop((q, q), None)
        star = f"(?:{loop})*" if loop else ""
        ins = [(i, lab) for (i, j), lab in edges.items() if j == q]
        outs = [(j, lab) for (i, j), lab in edges.items() if i == q]
        for i, _ in ins:
            edges.pop((i, q))
        for j, _ in outs:
            edges.pop((q, j))
        for i, a in ins:
            for j, b in outs:
                edges[(i, j)] = _re_alt(edges.get((i, j)), f"{_re_group(a)}{star}{_re_group(b)}")
    body = edges.get((start, final))
    return None if body is None else f"^(?:{body})$"


def _re_group(expr: str) -> str:
    return f"(?:{expr})" if "|" in expr else expr


def _re_alt(a: str | None, b: str) -> str:
    return b if a is None else f"{a}|{b}"


def _length_only(schema: Any, path: str) -> tuple[int, int | None] | None:
    """(minLength, maxLength) when ``schema`` (a propertyNames) asserts nothing else, else None."""
    if not isinstance(schema, dict):
        return None
    asserting = {k for k in schema if _asserts(schema, k)}
    if not asserting <= {"minLength", "maxLength", "type"} or schema.get("type", "string") != "string":
        return None
    return _counts(schema, path, "minLength", "maxLength")


def _literal_prefix(pattern: str) -> str | None:
    """The literal text every match of an anchored ``pattern`` starts with (None: not anchored)."""
    if not pattern.startswith("^") or "|" in pattern:
        return None
    out: list[str] = []
    for c in pattern[1:]:
        if c in "\\.[](){}*+?^$":
            if c in "*?{" and out:  # a quantifier that allows zero takes the character back
                out.pop()
            break
        out.append(c)
    return "".join(out)


def _overlapping(patterns: list[str]) -> list[list[int]]:
    """For each pattern, the indices (in order) of the others a string may match along with it:
    all but those whose literal prefixes (:func:`_literal_prefix`, both anchored) diverge. By
    prefix, not pair by pair: 2,000 ``patternProperties`` took 9 s pairwise (a 60 KB schema)."""
    prefixes = [_literal_prefix(p) for p in patterns]
    unanchored = [i for i, p in enumerate(prefixes) if p is None]
    by_prefix: dict[str, list[int]] = {}
    for i, p in enumerate(prefixes):
        if p is not None:
            by_prefix.setdefault(p, []).append(i)
    ordered = sorted(by_prefix)
    out = []
    for i, p in enumerate(prefixes):
        if p is None:
            out.append([j for j in range(len(patterns)) if j != i])
            continue
        found = [*unanchored, *(j for k in range(len(p) + 1) for j in by_prefix.get(p[:k], ()))]  # p's prefixes
        at = bisect.bisect_right(ordered, p)  # then the prefixes p is a prefix of
        while at < len(ordered) and ordered[at].startswith(p):
            found += by_prefix[ordered[at]]
            at += 1
        out.append(sorted(set(found) - {i}))
    return out


def _switch(node: dict[str, Any], comps: list[Any], objects_only: Callable[[Any], bool]) -> list[Any]:
    """``comps`` with its ``if``/``then``/``else`` components keyed on one property's string
    ``const`` (``if: {properties: {kind: {const: "a"}}}, then: …``, one per value) as one
    ``anyOf`` with a branch per value, one for any other value and one for the property
    absent: the same values. Distributed one by one, n such components give 2^n
    alternatives (each ``if`` or its negation), which past six pass every budget, though at
    most one ``if`` can hold. Only where the schema admits objects alone (``objects_only`` of
    the node or a component other than these, refs followed; every branch is an object: on any
    other value the ``if``s hold, or fail, all together), and only for components holding
    nothing else."""
    group: dict[int, tuple[str, bool, bool]] = {}  # index -> (const, if requires the key, if typed)
    key: str | None = None
    for i, comp in enumerate(comps):
        found = _switch_case(comp)
        if found is not None and found[0] == (key or found[0]):
            key = found[0]
            group[i] = found[1:]
    values = [value for value, _, _ in group.values()]
    if key is None or len(group) < 2 or len(set(values)) < len(values) or len({c[1:] for c in group.values()}) > 1:
        return comps
    _, requires, typed = next(iter(group.values()))
    thens = {i: comps[i].get("then", True) for i in group}
    elses = {i: comps[i].get("else", True) for i in group}
    # a value that is not an object: every "if" holds (untyped) or fails (typed) at once
    rest = [node, *(c for i, c in enumerate(comps) if i not in group)]
    if not any(map(objects_only, rest)) and (typed or not any(map(objects_only, thens.values()))):
        return comps

    def branch(head: dict[str, Any], parts: list[Any]) -> dict[str, Any]:
        parts = [p for p in parts if p is not True and p != {}]
        return {"type": "object", **head, **({"allOf": parts} if parts else {})}

    # the key holds one if's value: that if holds, every other fails
    others = {i: [elses[j] for j in group if j != i] for i in group}
    branches = [
        branch({"properties": {key: {"const": value}}, "required": [key]}, [thens[i], *others[i]])
        for i, (value, _, _) in group.items()
    ]
    props = node.get("properties")
    declared = props.get(key) if isinstance(props, dict) else None
    if not (isinstance(declared, dict) and set() < _string_literals(declared) <= set(values)):
        branches.append(branch({"properties": {key: {"not": {"enum": values}}}, "required": [key]}, [*elses.values()]))
    required = node.get("required")
    if not (isinstance(required, list) and key in required):
        # the key absent: an "if" that requires it fails (else), one that does not holds (then)
        branches.append(branch({"properties": {key: False}}, [*(elses if requires else thens).values()]))
    first = min(group)
    return [{"anyOf": branches} if i == first else c for i, c in enumerate(comps) if i not in group or i == first]


_SWITCH_IF = frozenset({"properties", "required", "type"})


def _switch_case(comp: Any) -> tuple[str, str, bool, bool] | None:
    """(property, string, whether the if requires it, whether it says ``type: "object"``) of a
    component ``{if: {properties: {property: {const: string}}, [required: [property]], [type:
    object]}, then: …, else: …}`` holding no other assertion, else None."""
    if not isinstance(comp, dict) or {k for k in comp if keywords.asserts(comp, k)} != {"if"}:
        return None
    cond = comp["if"]
    if not isinstance(cond, dict) or {k for k in cond if keywords.asserts(cond, k)} - _SWITCH_IF:
        return None
    props = cond.get("properties")
    if not isinstance(props, dict) or len(props) != 1 or cond.get("type", "object") != "object":
        return None
    ((name, inner),) = props.items()
    required = cond.get("required", [])
    if required not in ([], [name]) or not isinstance(inner, dict) or inner.get("type", "string") != "string":
        return None
    if {k for k in inner if keywords.asserts(inner, k)} - {"const", "enum", "type"}:
        return None
    literals = _string_literals(inner)
    if len(literals) != 1 or ("const" in inner and "enum" in inner):
        return None
    return name, next(iter(literals)), bool(required), "type" in cond


def _string_literals(node: dict[str, Any]) -> set[str]:
    """The strings ``node``'s const or enum allow, when it allows only strings by them (else
    an empty set)."""
    values = _literal_values(node) or []
    return set(values) if all(isinstance(v, str) for v in values) else set()


def _both(a: Any, b: Any) -> Any:
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def _merge_types(mine: Any, other: Any, path: str) -> list[str]:
    ta, tb = _type_set(mine), _type_set(other)
    if ta is None or tb is None:
        raise _Refuse(path, "type", '"type" must be a type name or a list of them')
    both = {t for t in ta if t in tb or (t == "integer" and "number" in tb)}
    both |= {t for t in tb if t == "integer" and "number" in ta}
    if not both:
        raise _Unsatisfiable(path, "type", f"allOf requires types {sorted(ta)} and {sorted(tb)} at once")
    return sorted(both)


def _object_shape(node: dict[str, Any], path: str) -> tuple[dict[str, Any], list[str], Any, dict[str, Any], Any]:
    """properties, required, additionalProperties, patternProperties, propertyNames (checked)."""
    props = node.get("properties", {})
    if not isinstance(props, dict):
        raise _Refuse(path, "properties", '"properties" must be an object')
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _Refuse(path, "required", '"required" must be an array of names')
    patterns = node.get("patternProperties", {})
    if not isinstance(patterns, dict):
        raise _Refuse(path, "patternProperties", '"patternProperties" must be an object')
    return props, required, node.get("additionalProperties", True), patterns, node.get("propertyNames", True)


_asserts = keywords.asserts


# ---------------------------------------------------------------------------- regular expressions

_MAX_CP = 0x10FFFF
_JSON_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
# what may appear raw inside a JSON string: no quote, backslash, control, DEL or surrogate
_RAW_OK = [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0x80, 0xD7FF), (0xE000, _MAX_CP)]
_ANY_CHAR = [(0, _MAX_CP)]
#: the code points a JSON string can hold (raw or escaped): all but the surrogates
_JSON_UNIVERSE = ((0, 0xD7FF), (0xE000, _MAX_CP))


class _RegexUnsupported(Exception):
    pass


def _json_char_set(ranges: list[tuple[int, int]]) -> str:
    """One JSON-string character whose decoded code point is in ``ranges``."""
    return _json_char_set_of(tuple(ranges))


@functools.lru_cache(maxsize=1024)
def _json_char_set_of(ranges: tuple[tuple[int, int], ...]) -> str:
    # Cached: a regex's classes repeat (the negation of a 2,000-value enum renders the
    # complement of the same few letters ~36,000 times: 9 of its 14 s, profiled)
    raw = automaton.intersect(list(ranges), _RAW_OK)
    parts = [gbnf_class(raw)] if raw else []
    for cp, esc in _JSON_ESCAPES.items():
        if any(lo <= cp <= hi for lo, hi in ranges):
            parts.append(gbnf_literal(esc))
    # other control characters only as \u00XX escapes, and DEL as \u007f: JSON allows it raw,
    # but like llama.cpp's converter the grammar never writes it raw (the "char" rule neither)
    controls = automaton.complement([(cp, cp) for cp in _JSON_ESCAPES], [(0, 0x1F), (0x7F, 0x7F)])
    for lo, hi in automaton.intersect(list(ranges), controls):
        for cp in range(lo, hi + 1):
            parts.append(gbnf_literal(f"\\u{cp:04x}"))
    if not parts:
        raise _RegexUnsupported("has a character class with no character a JSON string can hold here")
    return _alt(parts)


def _fit_lengths(items: list[tuple[Any, ...]], lo: int, hi: int | None) -> list[tuple[Any, ...]] | None:
    """``items`` (a concatenation) with repeat counts cut so every match is lo..hi characters
    long (fewer strings, each still a match), None when no match can be; raises when a
    variable-length part is not a repeat of a fixed-length piece."""
    lens = [_regex_lengths(n) for n in items]
    if hi is not None and sum(a for a, _ in lens) > hi:
        return None
    out = list(items)

    def piece(n: tuple[Any, ...]) -> int:
        a, b = _regex_lengths(n[1])
        if n[0] != "rep" or a != b or a == 0:
            raise _RegexUnsupported("has a variable-length part that cannot be cut to the length bounds")
        return a

    if hi is not None:
        out = list(_cut(("cat", out), hi - sum(a for a, _ in lens))[1])
    deficit = lo - sum(_regex_lengths(n)[0] for n in out)
    for i, n in enumerate(out):
        if deficit <= 0:
            break
        a, b = _regex_lengths(n)
        if a == b:
            continue
        size = piece(n)
        add = -(-deficit // size)
        if n[3] is not None:
            add = min(add, n[3] - n[2])
        out[i] = ("rep", n[1], n[2] + add, n[3])
        deficit -= add * size
    total_lo = sum(_regex_lengths(n)[0] for n in out)
    highs = [_regex_lengths(n)[1] for n in out]
    total_hi = None if None in highs else sum(h for h in highs if h is not None)
    if total_lo < lo or (hi is not None and (total_hi is None or total_hi > hi)):
        return None
    return out


def _cut(node: tuple[Any, ...], extra: int) -> tuple[Any, ...]:
    """``node`` with its repeats cut so that no match is more than ``extra`` characters longer
    than its shortest (fewer strings, each still a match; the shortest kept): a
    concatenation's variable parts take the budget first come, first served, an optional
    part is cut to it or dropped, each alternative gets what the shortest leaves it. Raises
    when a variable part is none of these."""
    lo, hi = _regex_lengths(node)
    if hi is not None and hi - lo <= extra:
        return node
    kind = node[0]
    if kind == "cat":
        items = list(node[1])
        for i, item in enumerate(items):
            a, b = _regex_lengths(item)
            give = extra if b is None else min(extra, b - a)
            items[i] = _cut(item, give)
            extra -= give
        return ("cat", items)
    if kind == "alt":
        kept = []
        for branch in node[1]:
            room = lo + extra - _regex_lengths(branch)[0]
            if room >= 0:
                kept.append(_cut(branch, room))
        return ("alt", kept)
    if kind == "rep":
        a, b = _regex_lengths(node[1])
        if a == b and a > 0:
            room = extra // a if node[3] is None else min(extra // a, node[3] - node[2])
            return ("rep", node[1], node[2], node[2] + room)
        if (node[2], node[3]) == (1, 1):
            return ("rep", _cut(node[1], extra), 1, 1)
        if (node[2], node[3]) == (0, 1):
            if extra < a:
                return ("rep", node[1], 0, 0)
            return ("rep", _cut(node[1], extra - a), 0, 1)
    raise _RegexUnsupported("has a variable-length part that cannot be cut to the length bounds")


def _has_anchor(node: tuple[Any, ...]) -> bool:
    kind = node[0]
    if kind in ("bol", "eol"):
        return True
    if kind in ("cat", "alt"):
        return any(_has_anchor(n) for n in node[1])
    if kind == "rep":
        return _has_anchor(node[1])
    return False


def _starred(node: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A regex matching no empty string whose repeats (``*``) match what ``node``'s do
    (None: ``node`` matches the empty string only). Under a repeat the empty string adds
    nothing, a concatenation of parts that may all be empty repeats as their alternation
    does (each part is such a concatenation with the others empty; the concatenation is a
    sequence of its parts), and a repeat of a part repeats as the part does."""
    kind = node[0]
    if kind in ("bol", "eol") or _regex_lengths(node)[0] > 0:
        return node
    if kind == "rep":
        return None if node[3] == 0 else _starred(node[1])
    parts = [p for p in (_starred(n) for n in node[1]) if p is not None]  # "cat" or "alt"
    return None if not parts else parts[0] if len(parts) == 1 else ("alt", parts)


def _regex_lengths(node: tuple[Any, ...]) -> tuple[int, int | None]:
    kind = node[0]
    if kind == "set":
        return 1, 1
    if kind == "cat":
        lo = 0
        hi_sum: int | None = 0
        for n in node[1]:
            a, b = _regex_lengths(n)
            lo += a
            hi_sum = None if hi_sum is None or b is None else hi_sum + b
        return lo, hi_sum
    if kind == "alt":
        pairs = [_regex_lengths(n) for n in node[1]]
        highs = [b for _, b in pairs]
        return min(a for a, _ in pairs), None if None in highs else max(b for b in highs if b is not None)
    if kind == "rep":
        a, b = _regex_lengths(node[1])
        if node[3] == 0:
            return 0, 0
        return a * node[2], None if node[3] is None or b is None else b * node[3]
    return 0, 0


def capped_pattern(pattern: str, cap: int) -> str | None:
    """``pattern`` with every repeat allowed more than ``cap`` times (``*``, ``+``, ``{n,}``,
    ``{n,m}``) allowed at most max(n, ``cap``) times, or None when none is (or the compiler
    cannot read the pattern).

    A string of at most ``cap`` characters that ``pattern`` matches, the capped pattern
    matches too: a match repeats a part non-empty at most ``cap`` times, and empty only to
    reach the least count n; so beside ``maxLength: cap`` it admits what ``pattern`` does,
    and a run (a word the model never ends) stops at ``cap`` characters. The text is the
    pattern as the validator reads it (:func:`python_pattern`), quantifiers rewritten."""
    try:
        source = python_pattern(pattern)
        re.compile(source)
        parser = _RegexParser(source)
        parser.parse()
    except (re.error, OverflowError, RecursionError, _RegexUnsupported):
        return None
    out: list[str] = []
    last = 0
    for start, end, lo, hi in parser.quantifiers:
        top = max(lo, cap)
        if hi is None or hi > top:
            out += [source[last:start], f"{{{lo},{top}}}"]
            last = end
    return None if not out else "".join([*out, source[last:]])


def _pattern_tree(pattern: str) -> tuple[Any, ...] | str:
    """``pattern`` (ECMA-262) as :class:`_RegexParser` reads it, or why it cannot be read
    (the refusal's words after the quoted pattern)."""
    try:
        source = python_pattern(pattern)
        re.compile(source)
    except (re.error, OverflowError, RecursionError) as exc:
        return f"is not a valid regex: {exc}"
    try:
        return _RegexParser(source).parse()
    except _RegexUnsupported as exc:
        return str(exc)


class _RegexParser:
    """Python ``re`` syntax (what the validator parses, after :func:`python_pattern` has
    rewritten ECMA-262's ``\\cX`` and ``\\p{…}``) → a small AST, read as ECMA-262 reads
    it, as the validator does (``localllm.grammar.pattern``): ``\\d`` and ``\\w`` ASCII,
    ``\\s`` ECMA's white space and line terminators, ``.`` no line terminator, ``$`` the very end.

    Nodes: ("set", ranges) one character; ("cat", [..]); ("alt", [..]); ("rep", n, lo, hi);
    ("bol",), ("eol",).
    """

    def __init__(self, pattern: str) -> None:
        self.s = pattern
        self.pos = 0
        #: every repeat read: (where its quantifier starts in the text, where it ends, lo, hi)
        self.quantifiers: list[tuple[int, int, int, int | None]] = []

    def parse(self) -> tuple[Any, ...]:
        node = self.alternation(0)
        if self.pos != len(self.s):
            raise _RegexUnsupported("has an unbalanced )")
        return node

    def peek(self) -> str:
        return self.s[self.pos] if self.pos < len(self.s) else ""

    def alternation(self, depth: int) -> tuple[Any, ...]:
        if depth > 50:
            raise _RegexUnsupported("nests groups too deeply")
        branches = [self.sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence(depth))
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self, depth: int) -> tuple[Any, ...]:
        items: list[tuple[Any, ...]] = []
        while self.pos < len(self.s) and self.peek() not in "|)":
            atom = self.atom(depth)
            items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else ("cat", items)

    def quantified(self, atom: tuple[Any, ...]) -> tuple[Any, ...]:
        while True:
            start = self.pos
            c = self.peek()
            if c in ("*", "+", "?"):
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.pos += 1
            elif c == "{":
                m = re.compile(r"\{(\d*)(,?)(\d*)\}").match(self.s, self.pos)
                if not m or (not m.group(1) and not m.group(2)):
                    return atom  # "{}" and a "{" that starts no repeat are literals, read by atom()
                # "{,}" repeats as "*" does and "{,3}" as "{0,3}" (Python's re reads them so)
                lo = int(m.group(1) or 0)
                hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
                self.pos = m.end()
            else:
                return atom
            if self.peek() == "?":
                self.pos += 1  # lazy: same language
            elif self.peek() == "+":
                raise _RegexUnsupported("uses a possessive quantifier")
            self.quantifiers.append((start, self.pos, lo, hi))
            atom = ("rep", atom, lo, hi)

    def atom(self, depth: int) -> tuple[Any, ...]:
        c = self.s[self.pos]
        self.pos += 1
        if c == "(":
            if self.s.startswith("?:", self.pos):
                self.pos += 2
            elif self.s.startswith("?P<", self.pos) or (
                self.s.startswith("?<", self.pos) and not self.s.startswith(("?<=", "?<!"), self.pos)
            ):
                end = self.s.find(">", self.pos)
                if end < 0:
                    raise _RegexUnsupported("has an unterminated group name")
                self.pos = end + 1
            elif self.peek() == "?":
                raise _RegexUnsupported("uses lookaround, backreferences or inline flags")
            node = self.alternation(depth + 1)
            if self.peek() != ")":
                raise _RegexUnsupported("has an unbalanced (")
            self.pos += 1
            return node
        if c == "[":
            return ("set", self.char_class())
        if c == ".":  # ECMA-262: no line terminator
            return ("set", automaton.complement(ECMA_LINE_TERMINATORS))
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?":
            raise _RegexUnsupported("has nothing to repeat")
        return ("set", [(ord(c), ord(c))])

    def escape(self, *, in_class: bool) -> tuple[Any, ...]:
        if self.pos >= len(self.s):
            raise _RegexUnsupported("ends with a backslash")
        c = self.s[self.pos]
        self.pos += 1
        # a JSON Schema pattern is an ECMA-262 regex: its classes, as the validator reads them
        classes = {"d": ECMA_DIGIT, "w": ECMA_WORD, "s": ECMA_SPACE}
        if c in classes:
            return ("set", list(classes[c]))
        if c.lower() in classes:
            return ("set", automaton.complement(classes[c.lower()]))
        simple = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07}
        if c in simple:
            return ("set", [(simple[c], simple[c])])
        if c == "b" and in_class:
            return ("set", [(0x08, 0x08)])
        if c in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[c]
            digits = self.s[self.pos : self.pos + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise _RegexUnsupported(f"has a malformed \\{c} escape")
            self.pos += n
            cp = int(digits, 16)
            if cp > _MAX_CP:
                raise _RegexUnsupported("has an escape beyond Unicode")
            return ("set", [(cp, cp)])
        if c == "A" and not in_class:
            return ("bol",)
        if c == "Z" and not in_class:
            return ("eol",)
        if c in "01234567" and (c == "0" or in_class or self.octal_at(self.pos, 2)):
            # an octal escape as Python's re reads it: \0 plus up to two octal digits, inside a
            # class any \1-\7 too; outside a class \1-\7 needs three digits (else a backreference)
            digits = c
            while len(digits) < 3 and self.octal_at(self.pos, 1):
                digits += self.s[self.pos]
                self.pos += 1
            cp = int(digits, 8)
            if cp > 0o377:
                raise _RegexUnsupported("has an octal escape above \\377")
            return ("set", [(cp, cp)])
        if c.isalnum():
            raise _RegexUnsupported(f'uses "\\{c}", which has no grammar equivalent here')
        return ("set", [(ord(c), ord(c))])

    def octal_at(self, pos: int, n: int) -> bool:
        """Are the ``n`` characters at ``pos`` octal digits?"""
        chunk = self.s[pos : pos + n]
        return len(chunk) == n and all(ch in "01234567" for ch in chunk)

    def char_class(self) -> list[tuple[int, int]]:
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.s):
                raise _RegexUnsupported("has an unterminated [")
            c = self.s[self.pos]
            if c == "]" and not first:
                self.pos += 1
                break
            first = False
            if c == "[" and self.s.startswith("[:", self.pos):
                raise _RegexUnsupported("uses a POSIX class")
            self.pos += 1
            if c == "\\":
                esc = self.s[self.pos] if self.pos < len(self.s) else ""
                node = self.escape(in_class=True)
                if esc.lower() in "dws":
                    ranges.extend(node[1])
                    continue
                lo = node[1][0][0] if len(node[1]) == 1 and node[1][0][0] == node[1][0][1] else None
                if lo is None:
                    ranges.extend(node[1])
                    continue
            else:
                lo = ord(c)
            if self.peek() == "-" and self.pos + 1 < len(self.s) and self.s[self.pos + 1] != "]":
                self.pos += 1
                d = self.s[self.pos]
                self.pos += 1
                if d == "\\":
                    node = self.escape(in_class=True)
                    if len(node[1]) != 1 or node[1][0][0] != node[1][0][1]:
                        raise _RegexUnsupported("has a range ending in a class")
                    hi = node[1][0][0]
                else:
                    hi = ord(d)
                if hi < lo:
                    raise _RegexUnsupported("has a reversed range")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        if negate:
            return automaton.complement(ranges)
        return automaton.normalize(ranges)
