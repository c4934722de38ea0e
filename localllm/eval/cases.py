"""Eval cases: one JSON object per line of ``evals/<gate>/cases.jsonl``, and their matchers.

A case::

    {"id": "t01", "args": {"ticket": "…"}, "world": {…}, "labelled": true,
     "expect": {"queue": "billing", "priority": {"number": 1, "tolerance": 1}}}

``expect`` is one of

- ``{"exact": VALUE}``: the whole submission must equal VALUE;
- ``{"fields": {NAME: M, …}}`` or, shorter, ``{NAME: M, …}``: a subset of the submission's
  top-level fields, each checked by its matcher ``M``. ``{}`` accepts any valid answer.

A matcher is a plain JSON value (equal to it), or a mapping of exactly one form:
``{"equals": V}`` (V may itself be a mapping), ``{"one_of": [V, …]}``,
``{"number": N, "tolerance": T}`` (a number within ``T`` of ``N``; T defaults to 0),
``{"regex": "…"}`` (``re.search`` on a string), ``{"any_valid": true}`` (present, any value).

``id`` defaults to ``line-N``; ``labelled`` (default true) is false for cases turned out of a
trace (``localllm trace cases``) until a person confirms the answers. Every problem of the
file is reported at once, as a ConfigError naming ``line N`` and the key.

A case's *input* is its ``args`` and ``world``, as the verb sees them. Two cases of one input
expecting different answers are a problem of the file, naming both lines (the one answer
would be judged twice, by each; an ``expect`` that checks nothing contradicts none). The
same input expecting the same answer again is one case, not two answers of evidence:
:func:`distinct_cases` leaves the repeat out (``localllm eval`` asks each once and reports
the lines it left out), where calibration would count one answer as two independent ones.

Read as a gate's examples (:func:`distinct_examples`), an example is its text as an embedder
sees it and its labels: the same text under the same labels again is one example (it would
vote twice), under other labels a problem naming both lines.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localllm._fs import DATA_LIMIT, read_capped
from localllm.errors import ConfigError, ProblemList
from localllm.wire import finite_float, loads_json

__all__ = [
    "Case",
    "Expect",
    "Matcher",
    "distinct_cases",
    "distinct_examples",
    "dump_case",
    "load_cases",
    "parse_expect",
]

MATCHER_KEYS = ("equals", "one_of", "number", "tolerance", "regex", "any_valid")
_CASE_KEYS = ("id", "args", "world", "expect", "labelled")


@dataclass(frozen=True)
class Matcher:
    """How one field is judged: ``kind`` is equals | one_of | number | regex | any_valid."""

    kind: str
    value: Any = None
    tolerance: float = 0.0

    def matches(self, present: bool, got: Any) -> bool:
        if not present:
            return False
        if self.kind == "any_valid":
            return True
        if self.kind == "equals":
            return _same(self.value, got)
        if self.kind == "one_of":
            return any(_same(v, got) for v in self.value)
        if self.kind == "number":
            return _is_number(got) and abs(float(got) - float(self.value)) <= self.tolerance
        assert self.kind == "regex"
        if not isinstance(got, str):
            return False
        # in linear time: the answer is the model's, and an everyday pattern such as
        # ^(\w+\s?)+$ backtracks for minutes on an answer that ends in a full stop
        from localllm.grammar.pattern import PatternTooCostly, search

        try:
            return search(self.value, got, fallback=True)  # read as a schema's pattern (ECMA-262)
        except PatternTooCostly:
            return False

    @property
    def label(self) -> Any:
        """The single expected value (for confusion tables), or ``None``."""
        return self.value if self.kind in ("equals", "number") else None


@dataclass(frozen=True)
class Expect:
    """What a case expects: the whole submission (``exact``) or matchers per field."""

    fields: dict[str, Matcher] = field(default_factory=dict)
    exact: Any = None
    is_exact: bool = False

    def judge(self, submission: Any) -> tuple[bool, dict[str, bool]]:
        """(correct, field → correct) for a validated submission."""
        if self.is_exact:
            per = {}
            if isinstance(self.exact, dict):
                got = submission if isinstance(submission, dict) else {}
                per = {k: k in got and _same(v, got[k]) for k, v in self.exact.items()}
            return _same(self.exact, submission), per
        got = submission if isinstance(submission, dict) else {}
        per = {name: m.matches(name in got, got.get(name)) for name, m in self.fields.items()}
        return isinstance(submission, dict) and all(per.values()), per

    @property
    def checks_anything(self) -> bool:
        """Whether some answer could fail this expectation (``{}`` and all-``any_valid`` cannot)."""
        return self.is_exact or any(m.kind != "any_valid" for m in self.fields.values())

    def labels(self) -> dict[str, Any]:
        """field → the single expected value, where there is one."""
        if self.is_exact:
            return dict(self.exact) if isinstance(self.exact, dict) else {}
        return {name: m.label for name, m in self.fields.items() if m.label is not None}


@dataclass(frozen=True)
class Case:
    """One eval case; ``line`` is its 1-based line in the file."""

    id: str
    args: dict[str, Any]
    expect: Expect
    world: dict[str, Any] = field(default_factory=dict)
    labelled: bool = True
    line: int = 0


def _is_number(value: Any) -> bool:
    return finite_float(value) is not None


def _same(expected: Any, got: Any) -> bool:
    """JSON equality (1 == 1.0, True != 1)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if _is_number(expected) and _is_number(got):
        return float(expected) == float(got)
    return json.dumps(expected, sort_keys=True) == json.dumps(got, sort_keys=True)


def _matcher(raw: Any, key: str, problems: ProblemList) -> Matcher | None:
    if not isinstance(raw, dict) or not raw or not set(raw) <= set(MATCHER_KEYS):
        return Matcher("equals", raw)  # a plain value (a mapping with other keys is a literal too)
    forms = [k for k in raw if k != "tolerance"]
    if len(forms) != 1 or ("tolerance" in raw and forms != ["number"]):
        problems.add(
            key,
            f"matcher {json.dumps(raw)} must have exactly one of equals, one_of, number (+ tolerance), "
            "regex, any_valid",
            'e.g. {"one_of": ["bug", "feature"]}; a literal mapping: {"equals": {...}}',
        )
        return None
    kind, value = forms[0], raw[forms[0]]
    if kind == "one_of" and (not isinstance(value, list) or not value):
        problems.add(f"{key}.one_of", "must be a non-empty list", 'e.g. {"one_of": [1, 2]}')
        return None
    if kind == "number":
        tolerance = raw.get("tolerance", 0)
        if not _is_number(value) or not _is_number(tolerance) or tolerance < 0:
            problems.add(
                key, "number and tolerance must be numbers, tolerance >= 0", 'e.g. {"number": 3, "tolerance": 1}'
            )
            return None
        return Matcher("number", value, float(tolerance))
    if kind == "regex":
        from localllm.grammar.pattern import check

        try:
            check(value)
        except (re.error, TypeError, RecursionError) as exc:
            hint = "write a JSON Schema (ECMA-262) pattern"
            problems.add(f"{key}.regex", f"is not a regular expression: {exc}", hint)
            return None
    if kind == "any_valid" and value is not True:
        problems.add(f"{key}.any_valid", "must be true", 'write {"any_valid": true}')
        return None
    return Matcher(kind, value)


def parse_expect(raw: Any, key: str, problems: ProblemList) -> Expect | None:
    """``expect`` checked into an Expect (problems recorded under ``key``)."""
    if not isinstance(raw, dict):
        problems.add(key, "must be a mapping", '{"exact": …}, {"fields": {…}} or {FIELD: matcher, …}')
        return None
    if set(raw) == {"exact"}:
        return Expect(exact=raw["exact"], is_exact=True)
    given = raw["fields"] if set(raw) == {"fields"} else raw
    if not isinstance(given, dict):
        problems.add(f"{key}.fields", "must be a mapping of field names to matchers")
        return None
    fields: dict[str, Matcher] = {}
    ok = True
    for name, value in given.items():
        matcher = _matcher(value, f"{key}.{name}", problems)
        ok = ok and matcher is not None
        if matcher is not None:
            fields[str(name)] = matcher
    return Expect(fields=fields) if ok else None


def _input_key(case: Case) -> str:
    """The case's input as the verb sees it: its args and world, exactly (1 and 1.0 render
    differently in a prompt), their keys in any order."""
    return json.dumps([case.args, case.world], sort_keys=True, default=repr)


def _number_free(value: Any) -> Any:
    """``value`` with every whole float as an int (1 and 1.0 are one number to a matcher; an
    int past the float range stays exact)."""
    if isinstance(value, dict):
        return {k: _number_free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_number_free(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _expect_key(expect: Expect) -> str:
    """What the case expects, however it was spelt (``{"q": "x"}`` is ``{"fields": {"q": {"equals": "x"}}}``)."""
    if expect.is_exact:
        return json.dumps(["exact", _number_free(expect.exact)], sort_keys=True)
    fields = {name: [m.kind, _number_free(m.value), m.tolerance] for name, m in expect.fields.items()}
    return json.dumps(["fields", fields], sort_keys=True)


def distinct_cases(cases: Sequence[Case]) -> tuple[list[Case], list[Case]]:
    """``cases`` without their repeats, and the repeats left out (in file order).

    A repeat has the input (args and world) and the expected answer of an earlier case: the
    same question asked again, whose answer is no new evidence (``--repeat`` asks a case
    again on purpose). The first case is kept, labelled when any of its copies is."""
    first: dict[tuple[str, str], int] = {}
    kept: list[Case] = []
    repeats: list[Case] = []
    for case in cases:
        at = first.setdefault((_input_key(case), _expect_key(case.expect)), len(kept))
        if at == len(kept):
            kept.append(case)
            continue
        repeats.append(case)
        if case.labelled and not kept[at].labelled:
            kept[at] = replace(kept[at], labelled=True)
    return kept, repeats


def distinct_examples(cases: Sequence[Case], input_arg: str, file: object) -> tuple[list[Case], list[Case]]:
    """The cases a gate's examples tier votes with (labelled, the text ``args.<input_arg>``)
    without their repeats, and the repeats left out (in file order).

    An example is its text as an embedder sees it (:func:`~localllm.calibrate.same_text`:
    case, spacing and Unicode form aside) and its labels. The same text under the same labels
    again is one example: kept twice, it would be two of a near input's ``k`` neighbours,
    doubling its weight in the vote and pushing another example out. The same text under
    other labels is a :class:`~localllm.errors.ConfigError` naming both lines of ``file``:
    one of the labels is wrong, and an input like it would be voted for both. An example
    that labels nothing votes for nothing and contradicts none."""
    from localllm.calibrate import same_text

    problems = ProblemList(file)
    first: dict[tuple[str, str], int] = {}  # (same text, labels) → its index in kept
    labelled: dict[str, tuple[int, str, str]] = {}  # same text → (its first line, its text there, its labels)
    kept: list[Case] = []
    repeats: list[Case] = []
    for case in cases:
        text = case.args.get(input_arg)
        if not case.labelled or not isinstance(text, str):
            continue
        labels = case.expect.labels()
        answer = json.dumps(_number_free(labels), sort_keys=True, ensure_ascii=False)
        if labels:
            line, there, before = labelled.setdefault(same_text(text), (case.line, text, answer))
            if before != answer:
                also = f", as {there!r}" if there != text else ""
                problems.add(
                    f"line {case.line}.expect",
                    f"labels the text {answer} where line {line}{also} labels it {before}: one of the labels "
                    "is wrong, and an input like the text would be voted for both",
                    f"label the text with its one answer (line {line} or line {case.line}); case, spacing and "
                    "Unicode form aside, as an embedder sees it",
                )
                continue
        at = first.setdefault((same_text(text), answer), len(kept))
        if at == len(kept):
            kept.append(case)
        else:
            repeats.append(case)
    if problems.items:
        raise ConfigError(problems.items)
    return kept, repeats


def _objects(text: str, problems: ProblemList, shape: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL text with their line numbers; a line that is not one is a
    problem (``shape`` the hint). Lines end at "\\n" only (a "\\r" before it is JSON white
    space): str.splitlines() also breaks at U+2028, U+0085 and \\x1c-\\x1e, which JSON strings
    hold raw, and which dump_case writes raw (ensure_ascii=False). A byte-order mark is no
    part of the JSON."""
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        if not line.strip():
            continue
        try:  # NaN and Infinity, json.loads' own: an expected NaN matched no answer, silently
            raw = loads_json(line)
        except ValueError as exc:
            problems.add(f"line {number}", f"is not JSON: {exc}", "one JSON object per line")
            continue
        if not isinstance(raw, dict):
            problems.add(f"line {number}", "is not a JSON object", shape)
            continue
        yield number, raw


def load_cases(path: Path, *, regular: bool = False) -> list[Case]:
    """Read and check a cases file; ConfigError lists every problem (``line N.key``).

    ``regular=True`` (a file the config names) refuses a named pipe or anything else that
    is not a regular file."""
    problems = ProblemList(path)
    try:
        text = read_capped(path, DATA_LIMIT, regular=regular).decode("utf-8")
    except FileNotFoundError as exc:
        problems.add(
            "",
            "cases file not found",
            "write evals/<gate>/cases.jsonl, or turn a trace into cases: `localllm trace cases TRACE --gate GATE`",
        )
        raise ConfigError(problems.items) from exc
    except (OSError, UnicodeError) as exc:
        problems.add("", f"cannot read: {exc}", "pass a UTF-8 JSONL file")
        raise ConfigError(problems.items) from exc
    cases: list[Case] = []
    seen: dict[str, int] = {}
    expected: dict[str, tuple[int, str]] = {}  # input → (its first checking line, what that line expects)
    for number, raw in _objects(text, problems, '{"args": {…}, "expect": {…}}'):
        where = f"line {number}"
        try:  # a lone surrogate (valid JSON text, "\ud800") is not UTF-8: no report could hold it
            json.dumps(raw, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            problems.add(
                where, "contains a lone surrogate (an unpaired \\ud800-\\udfff escape)", "write the text as UTF-8"
            )
            continue
        for extra in [k for k in raw if k not in _CASE_KEYS]:
            near = difflib.get_close_matches(extra, _CASE_KEYS, n=1, cutoff=0.6)
            meant = f' (did you mean "{near[0]}"?)' if near else ""
            problems.add(f"{where}.{extra}", f"unknown key{meant}", f"allowed keys: {', '.join(_CASE_KEYS)}")
        case_id = raw.get("id", f"line-{number}")
        if not isinstance(case_id, str) or not case_id:
            problems.add(f"{where}.id", "must be a non-empty string")
            continue
        if case_id in seen:
            problems.add(
                f"{where}.id", f"duplicate id {case_id!r} (also line {seen[case_id]})", "give every case its own id"
            )
            continue
        seen[case_id] = number
        args, world = raw.get("args", {}), raw.get("world", {})
        labelled = raw.get("labelled", True)
        bad = False
        for name, value in (("args", args), ("world", world)):
            if not isinstance(value, Mapping):
                problems.add(f"{where}.{name}", "must be a mapping")
                bad = True
        if not isinstance(labelled, bool):
            problems.add(f"{where}.labelled", "must be true or false")
            bad = True
        if "expect" not in raw:
            problems.add(
                f"{where}.expect", "missing", '{"exact": …} or {FIELD: matcher, …}; {} accepts any valid answer'
            )
            continue
        expect = parse_expect(raw["expect"], f"{where}.expect", problems)
        if expect is None or bad:
            continue
        case = Case(id=case_id, args=dict(args), world=dict(world), expect=expect, labelled=labelled, line=number)
        if expect.checks_anything:  # one that checks nothing ({}, any_valid) contradicts none, calibrates nothing
            answer = _expect_key(expect)
            line, first = expected.setdefault(_input_key(case), (number, answer))
            if first != answer:
                problems.add(
                    f"{where}.expect",
                    f"expects another answer than line {line} for the same args and world: the one answer to "
                    "them would be judged twice, by different expectations",
                    f"keep one case for the input, expecting its right answer (line {line} or line {number}, "
                    "or the two merged)",
                )
                continue
        cases.append(case)
    if not cases and not problems.items:
        problems.add("", "has no cases", 'one JSON object per line: {"args": {…}, "expect": {…}}')
    if problems.items:
        raise ConfigError(problems.items)
    return cases


def dump_case(
    case_id: str, args: Mapping[str, Any], expect: Any, *, world: Mapping[str, Any] | None = None, labelled: bool = True
) -> str:
    """One case as its JSONL line (no newline)."""
    doc: dict[str, Any] = {"id": case_id, "args": dict(args)}
    if world:
        doc["world"] = dict(world)
    doc["expect"] = expect
    doc["labelled"] = labelled
    return json.dumps(doc, ensure_ascii=False, sort_keys=False)


def load_intent_cases(path: Path, intents: Collection[str] = (), *, regular: bool = False) -> list[tuple[str, str]]:
    """``(text, intent)`` pairs from a JSONL file: a router's held-out calibration cases.

    One object per line: ``{"text": …, "intent": …}``, or an eval case of a routing gate
    (``{"args": {"text": …}, "expect": {"intent": …}}``, as ``tests/bench/data/clinc150_cases.jsonl``).
    With ``intents``, an intent must be one of them. A :class:`~localllm.errors.ConfigError`
    lists every problem as ``line N.key``; ``regular=True`` (a file the config names) refuses
    anything but a regular file.

    A text under two intents (as an embedder sees it: :func:`~localllm.calibrate.same_text`,
    case, spacing and Unicode form aside) is a problem naming both lines: one label is wrong.
    The same text under its intent again is read as given; calibration counts it once.
    """
    from localllm.calibrate import same_text

    problems = ProblemList(path)
    try:
        text = read_capped(path, DATA_LIMIT, regular=regular).decode("utf-8")
    except (OSError, UnicodeError) as exc:
        problems.add("", f"cannot read: {exc}", "pass a UTF-8 JSONL file")
        raise ConfigError(problems.items) from exc
    out: list[tuple[str, str]] = []
    labelled: dict[str, tuple[int, str, str]] = {}  # same text → (its first line, its text there, its intent)
    for number, raw in _objects(text, problems, '{"text": "…", "intent": "…"}'):
        where = f"line {number}"
        nested = isinstance(raw.get("args"), dict) and isinstance(raw.get("expect"), dict)
        doc = (raw["args"] | raw["expect"]) if nested and "text" not in raw else raw
        case: list[str] = []
        shown = ""
        for key in ("text", "intent"):
            value = doc.get(key)
            shown = f"{where}.{'' if doc is raw else ('args.' if key == 'text' else 'expect.')}{key}"
            if not isinstance(value, str) or not value.strip():
                problems.add(shown, "missing or not a non-empty string", '{"text": "…", "intent": "…"}')
            elif key == "intent" and intents and value not in intents:
                problems.add(shown, f"{value!r} is not a declared intent", f"one of {sorted(intents)}")
            else:
                case.append(value)
        if len(case) < 2:
            continue
        line, there, intent = labelled.setdefault(same_text(case[0]), (number, case[0], case[1]))
        if intent != case[1]:
            also = f", as {there!r}" if there != case[0] else ""
            problems.add(
                shown,
                f"{case[1]!r} for the same text as line {line}{also}, labelled {intent!r} there: one label is wrong",
                f"label the text with its one intent (line {line} or line {number}); case, spacing and Unicode "
                "form aside, as an embedder sees it",
            )
            continue
        out.append((case[0], case[1]))
    if not out and not problems.items:
        problems.add("", "no cases", 'one {"text": "…", "intent": "…"} object per line')
    if problems.items:
        raise ConfigError(problems.items)
    return out
