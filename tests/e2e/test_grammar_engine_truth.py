"""The truth test: every compiled schema walked through the real pinned llama.cpp grammar engine.

Not our GBNF interpreter (localllm.grammar.walk): the engine itself, ``llama_grammar_init_impl``
/ ``llama_grammar_accept`` of the libllama the server was built from, driven at code-point level
by a C++ shim (``tests/e2e/grammar_engine/shim.cpp``) that reads the engine's allowed characters
from its pushdown stacks at every step.

- **Walks**: every schema of ``grammar/corpus`` and ``grammar/realworld`` that compiles (as
  compile_schema emits it, and with ``open_objects=False`` where that differs) is walked
  ``WALKS`` times inside the engine (a random allowed code point per step; past a per-walk soft
  budget the walk follows the stack with the shortest completion; cut at ``HARD`` code points
  and counted as unfinished). Every finished sample (deduplicated) is parsed as strict JSON (no
  NaN/Infinity; a repeated key read both last-wins and first-wins) and validated with formats asserted (the harness's
  ``validator``): 0 invalid. At random steps the shim offers the engine a code point just
  outside the set it read (the engine must reject it) and one inside (it must take it): 0
  mismatches, so the samples are what the engine allows.
- **Instances**: every instance JSONSchemaBench and the JSON-Schema-Test-Suite ship with the
  corpus schemas (``grammar/realworld/instances.jsonl``, built by
  ``grammar_engine/make_instances.py``), the JSONSchemaBench sample of ``tests/bench`` and the
  corpus probes, compact JSON with and without ``\\u`` escapes, fed to the engine whole: no
  instance the validator rejects is admitted.
- **Our interpreter agrees**: ``localllm.grammar.walk`` (what the unit tests judge grammars
  with) matches every engine sample, and the engine admits every sample it draws.
- **The test can fail**: a grammar with one rule widened yields invalid samples and admits an
  invalid instance through the same checks.

Run: ``make e2e`` (all of tests/e2e), or alone after ``make fetch-llama-server``:
``pytest tests/e2e/test_grammar_engine_truth.py -q -s`` (``-s`` prints the totals per chunk).
Never skipped: without the source build of llama.cpp the module fails naming the command.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from localllm.grammar.relax import relax
from localllm.grammar.walk import Grammar
from tests.conftest import REPO
from tests.e2e.grammar_engine import Engine, EngineError, EngineUnavailable, engine, llama_build
from tests.unit.grammar_harness import CORPUS_DIR, corpus, realworld, validator

pytestmark = pytest.mark.e2e

WALKS = 1000  # per schema
SOFT = 192  # mean soft budget (code points) of a walk; each walk draws its own in [SOFT/8, 2*SOFT]
HARD = 4096  # a walk still open here is unfinished
PROBE_EVERY = 16  # one in/out probe of the engine's state per this many steps, on average
MAX_UNFINISHED = 0.01  # per schema: at most this share of walks may hit HARD
CHUNKS = 8  # the corpus is split in this many tests (``-n`` can spread them)
INSTANCES = REPO / "grammar" / "realworld" / "instances.jsonl"
BENCH_SAMPLE = REPO / "tests" / "bench" / "data" / "jsonschemabench_sample.jsonl"


@dataclass(frozen=True)
class Entry:
    id: str  # "<schema id>" (compile_schema's default: open objects) or "<schema id> [closed]"
    schema: Any
    grammar: str
    closed: bool


ENTRIES = [*corpus(), *realworld()]


def grammars(sid: str, schema: Any) -> list[Entry]:
    """The schema as compile_schema emits it by default (objects open where additionalProperties
    allows) and, when that differs, with ``open_objects=False`` (what the service and
    builtin.local_llm send by default); empty when it does not compile."""
    grammar = compile_schema(schema).grammar
    if grammar is None:
        return []
    out = [Entry(sid, schema, grammar, closed=False)]
    closed = compile_schema(schema, open_objects=False).grammar
    if closed is not None and closed != grammar:
        out.append(Entry(f"{sid} [closed]", schema, closed, closed=True))
    return out


@pytest.fixture(scope="module")
def llama() -> Engine:
    try:
        return engine()
    except EngineUnavailable as exc:
        pytest.fail(f"the truth test needs the pinned llama.cpp grammar engine: {exc}", pytrace=False)


# ---------------------------------------------------------------------------- checks


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def parse(text: str) -> tuple[Any, Any, bool]:
    """Strict JSON (no NaN/Infinity; ValueError): the value as Python reads it (a repeated key
    keeps its last value), as a first-wins parser reads it, and whether a key repeats."""
    repeated = False

    def last_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated
        repeated = repeated or len({k for k, _ in pairs}) != len(pairs)
        return dict(pairs)

    last = json.loads(text, object_pairs_hook=last_wins, parse_constant=_no_constant)
    if not repeated:
        return last, last, False
    return last, json.loads(text, object_pairs_hook=_first_wins, parse_constant=_no_constant), True


def why_invalid(schema: Any, text: str) -> str | None:
    """Why ``text`` is not a valid answer for ``schema`` (None when it is): not strict JSON, or
    invalid read last-wins or, when a key repeats, first-wins. (A grammar cannot keep the keys
    of an open object or of an untyped value unique: repeated keys are counted, and must be
    valid either way.)"""
    try:
        last, first, repeated = parse(text)
    except ValueError as exc:
        return f"not strict JSON: {exc}"
    check = validator(schema)
    for reading, value in (("", last), (" (first-wins reading)", first)):
        error = next(iter(check.iter_errors(value)), None)
        if error is not None:
            return f"{error.message} at {'/'.join(map(str, error.absolute_path)) or '$'}{reading}"
        if not repeated:
            break
    return None


@dataclass
class Findings:
    grammars: int = 0
    walks: int = 0
    finished: int = 0
    distinct: int = 0
    steps: int = 0
    probes: int = 0
    unfinished: dict[str, int] = field(default_factory=dict)
    invalid: list[str] = field(default_factory=list)  # "schema id: sample: why"
    repeated_keys: int = 0  # distinct valid samples with a repeated (extension) key
    mismatches: list[str] = field(default_factory=list)

    def add(self, other: Findings) -> None:
        self.grammars += other.grammars
        self.walks += other.walks
        self.finished += other.finished
        self.distinct += other.distinct
        self.steps += other.steps
        self.probes += other.probes
        self.unfinished.update(other.unfinished)
        self.invalid += other.invalid
        self.repeated_keys += other.repeated_keys
        self.mismatches += other.mismatches


def walk_check(llama: Engine, sid: str, schema: Any, grammar: str, *, walks: int, seed: int) -> Findings:
    """``walks`` engine walks of ``grammar``, each distinct finished sample validated against ``schema``."""
    found = Findings()
    with llama.grammar(grammar) as g:
        result = g.walk(walks, seed=seed, soft=SOFT, hard=HARD, probe_every=PROBE_EVERY)
    found.grammars = 1
    found.walks = walks
    found.finished = len(result.samples)
    found.steps = result.steps
    found.probes = result.probes_in + result.probes_out
    if result.unfinished:
        found.unfinished[sid] = len(result.unfinished)
    if result.mismatches:
        found.mismatches.append(f"{sid}: {result.mismatches} mismatches, first: {result.failure}")
    distinct = sorted(set(result.samples))
    found.distinct = len(distinct)
    for text in distinct:
        why = why_invalid(schema, text)
        if why is not None:
            found.invalid.append(f"{sid}: {text[:300]!r}: {why}")
        elif parse(text)[2]:
            found.repeated_keys += 1
    return found


def _seed(sid: str) -> int:
    return int.from_bytes(sid.encode()[:8].ljust(8, b"\0"), "little") ^ len(sid)


def _report(label: str, found: Findings) -> str:
    unfinished = sum(found.unfinished.values())
    return (
        f"{label}: {found.walks} walks of {found.grammars} grammars, {found.finished} finished, {unfinished} unfinished "
        f"({unfinished / max(1, found.walks):.3%}), {found.distinct} distinct samples validated, "
        f"{len(found.invalid)} invalid, {found.steps} engine steps, {found.probes} state probes, "
        f"{len(found.mismatches)} mismatching grammars, {found.repeated_keys} valid with a repeated key"
    )


# ---------------------------------------------------------------------------- walks


@pytest.mark.timeout(900)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_compiled_schema_walks_valid_through_the_engine(llama: Engine, chunk: int) -> None:
    total = Findings()
    mine = ENTRIES[chunk::CHUNKS]
    compiled = 0
    for sid, schema in mine:
        entries = grammars(sid, schema)
        compiled += bool(entries)
        for entry in entries:
            found = walk_check(llama, entry.id, entry.schema, entry.grammar, walks=WALKS, seed=_seed(entry.id))
            total.add(found)
    print(f"\n{_report(f'chunk {chunk}: {compiled} of {len(mine)} schemas compile', total)}")
    assert compiled >= len(mine) // 2, "most of the corpus no longer compiles: the walks would prove little"
    assert total.mismatches == [], "the engine and the shim's reading of its state disagree"
    assert total.invalid == [], f"{len(total.invalid)} invalid samples:\n" + "\n".join(total.invalid[:20])
    assert total.walks >= WALKS * compiled
    too_many = {sid: n for sid, n in total.unfinished.items() if n > MAX_UNFINISHED * WALKS}
    assert too_many == {}, f"walks cut at {HARD} code points: {too_many}"


CROSS = 10  # per schema and direction


@pytest.mark.timeout(600)
def test_our_gbnf_interpreter_agrees_with_the_engine(llama: Engine) -> None:
    """The unit tests judge grammars with localllm.grammar.walk; it must read GBNF as the engine
    does: every engine sample matches there, every sample it draws is admitted by the engine."""
    disagree: list[str] = []
    checked = 0
    for i, (sid, schema) in enumerate(ENTRIES):
        grammar = compile_schema(schema).grammar
        if grammar is None:
            continue
        ours = Grammar.parse(grammar)
        rng = random.Random(i)
        with llama.grammar(grammar) as g:
            for text in g.walk(CROSS, seed=i).samples:
                checked += 1
                if not ours.matches(text):
                    disagree.append(f"{sid}: the engine admits, the interpreter rejects {text[:200]!r}")
            for _ in range(CROSS):
                text = ours.sample(rng)
                checked += 1
                if not g.accepts(text):
                    disagree.append(f"{sid}: the interpreter draws, the engine rejects {text[:200]!r}")
    print(f"\ninterpreter vs engine: {checked} answers, {len(disagree)} disagreements")
    assert checked >= 8000
    assert disagree == [], "\n".join(disagree[:20])


# ---------------------------------------------------------------------------- instances


def _shipped() -> Iterator[tuple[str, Any, Any, bool | None]]:
    """(schema id, schema, instance, shipped label) for every instance shipped with a schema."""
    schemas = dict(realworld())
    for line in INSTANCES.read_text().splitlines():
        entry = json.loads(line)
        for test in entry["tests"]:
            yield entry["id"], schemas[entry["id"]], test["data"], test["valid"]
    for line in BENCH_SAMPLE.read_text().splitlines():
        entry = json.loads(line)
        for test in entry.get("tests", []):
            yield entry["id"], entry["schema"], test["data"], test["valid"]
    for path in sorted(CORPUS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        if "probe" in doc:
            yield f"corpus/{path.stem}", doc["schema"], doc["probe"], None


@dataclass
class InstanceFindings:
    schemas: int = 0
    checked: int = 0
    invalid: int = 0  # by the validator
    shipped_invalid: int = 0  # labelled invalid upstream
    admitted_invalid: list[str] = field(default_factory=list)
    valid: int = 0
    admitted_valid: int = 0


def _compile(schema: Any) -> str | None:
    return compile_schema(schema).grammar


def instance_check(
    llama: Engine, items: list[tuple[str, Any, Any, bool | None]], compile: Callable[[Any], str | None] = _compile
) -> InstanceFindings:
    """Feed every instance (compact JSON, with and without \\u escapes) to the engine whole."""
    found = InstanceFindings()
    grammars: dict[str, str | None] = {}
    opened: dict[str, Any] = {}
    try:
        for sid, schema, data, label in items:
            if sid not in grammars:
                grammars[sid] = compile(schema)
                if grammars[sid] is not None:
                    found.schemas += 1
                    opened[sid] = llama.grammar(grammars[sid] or "")
            if grammars[sid] is None:
                continue
            g = opened[sid]
            texts = {json.dumps(data, separators=(",", ":"), ensure_ascii=e) for e in (False, True)}
            admitted = [t for t in sorted(texts) if g.accepts(t)]
            found.checked += 1
            found.shipped_invalid += label is False
            valid = validator(schema).is_valid(data)
            if valid:
                found.valid += 1
                found.admitted_valid += bool(admitted)
            else:
                found.invalid += 1
                if admitted:
                    found.admitted_invalid.append(f"{sid}: {admitted[0][:300]} (labelled {label})")
    finally:
        for g in opened.values():
            g.close()
    return found


@pytest.mark.timeout(600)
def test_no_invalid_instance_is_admitted_by_the_engine(llama: Engine) -> None:
    items = list(_shipped())
    found = instance_check(llama, items)
    print(
        f"\ninstances: {found.checked} checked on {found.schemas} compiled schemas; "
        f"{found.invalid} invalid by the validator ({found.shipped_invalid} labelled invalid upstream), "
        f"{len(found.admitted_invalid)} admitted; {found.admitted_valid}/{found.valid} valid admitted"
    )
    assert found.checked >= 1000 and found.invalid >= 500, (found.checked, found.invalid)
    assert found.admitted_invalid == [], "\n".join(found.admitted_invalid[:20])


# ---------------------------------------------------------------------------- counted shapes


def _props(n: int, required: list[str], **bounds: int) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(n)]
    return {"type": "object", "properties": {k: {"type": "integer"} for k in names}, "required": required, **bounds}


#: min/maxProperties and min/maxItems that count (none of the corpora needs the counting rules)
COUNTED = {
    "any order 2..3 of 4": _props(4, [], minProperties=2, maxProperties=3),
    "any order at most 1 of 5": _props(5, [], maxProperties=1),
    "declared order 3..4 of 8, c required": _props(8, ["c"], minProperties=3, maxProperties=4),
    "declared order at least 5 of 9": _props(9, [], minProperties=5),
    "declared names counted beside undeclared ones": _props(3, [], minProperties=2),
    "unique enum 2..3 of 5": {
        "type": "array",
        "items": {"enum": ["v", "w", "x", "y", "z"]},
        "uniqueItems": True,
        "minItems": 2,
        "maxItems": 3,
    },
}


#: ECMA-262's property and control escapes, compiled into classes of hundreds of ranges
#: (astral ones too): walked through the engine and judged by the validator's own reading
PROPERTIES = {
    "capitalised word": {"type": "string", "pattern": r"^\p{Lu}\p{Ll}{1,8}$"},
    "letters but a": {"type": "string", "pattern": r"^[^\P{L}a]{1,6}$"},
    "digits then a non-number": {"type": "string", "pattern": r"^\p{Nd}{2}-\P{N}$"},
    "a control escape": {"type": "string", "pattern": r"^[\cA-\cZ]x$"},
}


#: the formats compiled since session 29 (none of the corpora holds one): ipv6's nine
#: compressed forms as one ambiguous rule, the regex format's product automaton over
#: escaped characters, pointers' "~" escapes
FORMATS = {
    f"format {fmt}{' within 12' if bounded else ''}": {
        "type": "string",
        "format": fmt,
        **({"maxLength": 12} if bounded else {}),
    }
    for fmt in ("ipv6", "regex", "json-pointer", "relative-json-pointer", "idn-hostname")
    for bounded in (False, True)
}


#: steps beside bounds other than 0, compiled since session 29 (0.01: amounts of money; 0.25;
#: 16): a digit walk that keeps a bound's digits while the digits so far equal it
STEPS = {
    "cents from 0.01": {"type": "number", "multipleOf": 0.01, "minimum": 0.01},
    "tenths in (-2.5, 1000]": {"type": "number", "multipleOf": 0.1, "exclusiveMinimum": -2.5, "maximum": 1000},
    "quarters in [0, 100]": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.25},
    "sixteens in [0, 4096]": {"type": "integer", "minimum": 0, "maximum": 4096, "multipleOf": 16},
    "tens below 100": {"type": "number", "exclusiveMaximum": 100, "multipleOf": 10},
    "odd threes from -1000": {"type": "integer", "multipleOf": 3, "minimum": -1000, "not": {"multipleOf": 2}},
}

#: oneOf told apart since session 30: by a name the oneOf's siblings require, by formats'
#: supersets and negations (the product of hostname with IPv4's complement), by a property no
#: branch requires (generated with it present)
ONE_OF: dict[str, dict[str, Any]] = {
    "host name or address": {
        "type": "string",
        "oneOf": [{"format": "hostname"}, {"format": "ipv4"}, {"format": "ipv6"}],
    },
    "not an ipv4 within 20": {"type": "string", "maxLength": 20, "not": {"format": "ipv4"}},
    "asserts by name": {
        "required": ["assert"],
        "oneOf": [
            {"properties": {"assert": {"enum": [name]}, "min": {"type": kind}}}
            for name, kind in [("Length", "integer"), ("Range", "string"), ("Blank", "null")]
        ],
    },
    "address per country": {
        "type": "object",
        "oneOf": [
            {
                "properties": {
                    "country": {"const": country},
                    "state": {"enum": states},
                    "postalCode": {"type": "string", "maxLength": 10},
                }
            }
            for country, states in [
                ("BRA", ["AC", "SP"]),
                ("ITA", ["AL", "MI"]),
                ("USA", ["AL", "NY"]),
                ("MEX", ["AG", "BC"]),
                ("CAN", ["AB", "BC"]),
            ]
        ],
    },
}
#: "at most 12 words in 100 characters": the compiler refuses the product, and the relaxed
#: schema keeps the word count with each run capped at the 100 (session 34): counted
#: repeats inside a counted group
WORDS = {"type": "string", "pattern": "^(?:\\S+\\s+){0,11}\\S+$", "maxLength": 100}
_RELAXED_WORDS = relax(WORDS)
RELAXED = {"relaxed word count": {} if _RELAXED_WORDS is None else _RELAXED_WORDS.schema}
#: groups repeated past what llama.cpp's parser takes (the rules a group makes × its count
#: over 2,000: "failed to parse grammar" until session 34), now made rules of their own
LARGE_REPEATS = {
    "300 labels of 1-10 letters": {"type": "string", "pattern": "^(?:[a-z]{1,10}-){0,300}$"},
    "60 runs of 1-40 ab": {"type": "string", "pattern": "^(?:(?:ab){1,40}c){1,60}$"},
    "a host name of 126 labels": {"type": "string", "pattern": "^(?:[a-z0-9-]{1,63}\\.){1,126}[a-z]{2,6}$"},
}
#: what may be empty, repeated without end: a left recursion llama.cpp refused ("left
#: recursion detected", JSONSchemaBench o62947's id until session 34), now its non-empty part
EMPTY_REPEATS = {
    "dotted parts that may be empty": {"type": "string", "pattern": "^\\w+(|\\.[\\w,]+)*$"},
    "optional letters repeated": {"type": "string", "pattern": "^(a?b?)+c$"},
}
#: values and names holding the separators' placeholder names ("COMMAND" became "\"","ND\"":
#: JSON Schema Store's jreleaser, refused by llama.cpp until session 34)
SEPARATOR_NAMES = {
    "enum values like COMMAND": {
        "type": "object",
        "properties": {
            "mode": {"enum": ["COMMAND", "COLONEL", "COMMA"]},
            "COLON": {"const": "COMMAS"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["mode"],
    },
}
NEW = {
    **COUNTED,
    **PROPERTIES,
    **FORMATS,
    **STEPS,
    **ONE_OF,
    **RELAXED,
    **LARGE_REPEATS,
    **EMPTY_REPEATS,
    **SEPARATOR_NAMES,
}


@pytest.mark.parametrize("name", NEW)
def test_constructs_no_corpus_holds_walk_valid_through_the_engine(llama: Engine, name: str) -> None:
    schema = NEW[name]
    entries = grammars(name, schema)
    assert entries, compile_schema(schema).refusals
    for entry in entries:
        found = walk_check(llama, entry.id, schema, entry.grammar, walks=WALKS, seed=_seed(entry.id))
        assert found.mismatches == [] and found.invalid == [], found.mismatches + found.invalid[:20]
        assert found.distinct >= 10  # the walks reach more than one count, more than one character


def test_the_relaxed_word_count_caps_each_run_in_the_engine(llama: Engine) -> None:
    assert _RELAXED_WORDS is not None and _RELAXED_WORDS.compiled.grammar is not None
    with llama.grammar(_RELAXED_WORDS.compiled.grammar) as g:
        assert g.accepts(json.dumps("x" * 100)) and g.accepts(json.dumps(" ".join(["word"] * 12)))
        assert g.accepts(json.dumps("x" * 100 + "\n" + "y" * 100))  # 201 characters: left to validation
        for text in ("x" * 101, "x " + "y" * 101, "x" + " " * 101 + "y", " ".join(["word"] * 13)):
            assert not g.accepts(json.dumps(text)), text


# ---------------------------------------------------------------------------- the checks can fail

DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}}, "required": ["n"]}


def _widened(grammar: str) -> str:
    """The grammar with the 3..7 digit class widened to any digit (a loosened rule)."""
    loose, n = re.subn(r"\[3-7\]", "[0-9]", grammar)
    assert n >= 1, grammar
    return loose


def test_a_widened_rule_is_caught_by_the_walks_and_the_instances(llama: Engine) -> None:
    grammar = compile_schema(DIGIT).grammar
    assert grammar is not None
    assert walk_check(llama, "digit", DIGIT, grammar, walks=300, seed=1).invalid == []
    caught = walk_check(llama, "digit", DIGIT, _widened(grammar), walks=300, seed=1)
    assert caught.invalid and all(line.startswith("digit: ") for line in caught.invalid)
    items: list[tuple[str, Any, Any, bool | None]] = [("digit", DIGIT, {"n": n}, False) for n in (0, 2, 8, 9)]
    assert instance_check(llama, items).admitted_invalid == []
    loose = instance_check(llama, items, compile=lambda s: _widened(compile_schema(s).grammar or ""))
    assert len(loose.admitted_invalid) == 4 and loose.invalid == 4


def test_the_validity_check_is_strict() -> None:
    assert why_invalid({}, "NaN") is not None
    assert why_invalid({}, "[1,2]") is None
    assert why_invalid({"type": "string", "format": "date"}, '"2024-02-30"') is not None
    assert why_invalid({}, '{"a":1,"a":2}') is None
    # a repeated key is read both ways: Python keeps the last value, other parsers the first
    ints = {"additionalProperties": {"type": "integer"}}
    assert why_invalid(ints, '{"a":"x","a":2}') is not None
    assert why_invalid(ints, '{"a":2,"a":"x"}') is not None
    assert why_invalid({"minProperties": 2}, '{"a":1,"a":2}') is not None


# ---------------------------------------------------------------------------- the shim reads the engine


def test_the_shim_reads_char_sets_as_the_engine_matches_them(llama: Engine) -> None:
    with llama.grammar('root ::= [a-cx] "y" | [^a-z0-9] | "q" [^\\x00-\\U0010FFFF]? "z"* | "" ') as g:
        # [a-c] joins the negated class's [58-96]; the empty "" alternative lets it end at once
        assert g.allowed("") == ([(0, 47), (58, 99), (113, 113), (120, 120), (123, 0x10FFFF)], True)
        assert g.allowed("b") == ([(ord("y"), ord("y"))], False)
        assert g.allowed("q") == ([(ord("z"), ord("z"))], True)
        assert g.allowed("by") == ([], True)
        assert g.allowed("5") is None
        assert g.accepts("cy") and g.accepts("\U0001f600") and g.accepts("qzz") and g.accepts("")
        assert not g.accepts("c") and not g.accepts("d") and not g.accepts("cyy")
    with llama.grammar("root ::= . [^\\n]") as g:
        assert g.allowed("") == ([(0, 0x10FFFF)], False)
        assert g.allowed("a") == ([(0, 9), (11, 0x10FFFF)], False)


def test_a_grammar_the_engine_refuses_is_an_error_not_a_crash(llama: Engine) -> None:
    with pytest.raises(EngineError, match="refused"):
        llama.grammar('root ::= root "a"')
    with pytest.raises(EngineError, match="refused"):
        llama.grammar("root ::= undefined-rule")


def test_walks_are_seeded_and_long_answers_are_reported_unfinished(llama: Engine) -> None:
    with llama.grammar("root ::= word{100}\nword ::= [a-z]{60}") as g:  # 6,000 code points at least
        result = g.walk(3, seed=7, hard=HARD)
        assert len(result.unfinished) == 3 and result.samples == []
        assert all(len(u) == HARD for u in result.unfinished)
    with llama.grammar(compile_schema(DIGIT).grammar or "") as g:
        first = g.walk(50, seed=3)
        assert first.samples == g.walk(50, seed=3).samples and len(first.samples) == 50


def test_a_missing_build_names_the_command_to_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(tmp_path))
    with pytest.raises(EngineUnavailable, match="make fetch-llama-server"):
        llama_build()
