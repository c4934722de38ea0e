"""jsonschema validator classes whose keywords stay fast and exception-free on hostile answers.

Every answer localllm validates goes through :func:`bounded_validator` (by way of
``localllm.grammar.compile.validator_class`` and ``localllm.schema.SchemaSet``). It is
jsonschema's own class for the draft, with four keyword families swapped, messages
unchanged but a long ``enum``'s (verdicts too, but for ``multipleOf``'s and the regexes', below):

* **regexes** (``pattern``, ``patternProperties``, ``additionalProperties``,
  ``unevaluatedProperties``, ``propertyNames``): ``re.search`` backtracks exponentially on
  ``^(a+)+$`` and a near-miss answer, holding the GIL; here :func:`localllm.grammar.pattern.search`
  matches in linear time, reading the pattern as ECMA-262 does (JSON Schema's dialect: ASCII
  ``\\d`` and ``\\w``, ``$`` the very end), where ``re`` reads Python's;
* **uniqueItems**: jsonschema compares unhashable items pairwise, 43 s for 5,000 objects;
  here each item gets a hashable key with JSON's equality (``1 == 1.0``, ``true != 1``, key
  order ignored), linear time;
* **enum** longer than :data:`ENUM_SCAN` entries: a set lookup with JSON's equality, where
  jsonschema compares with each entry in Python (28 s for 2,000 values against 30,000
  integers); a wrong value's message names the enum's size and first entries, not its whole
  ``repr``;
* **multipleOf** with a float divisor or a float answer: decided exactly on the numbers as
  written (each float read as its shortest decimal, ``repr``), as the specification's own
  example has it (4.02 is a multiple of 0.01). jsonschema divides in binary floating point
  and calls 0.07, 1.11, 19.99, 600.03 not multiples of 0.01 (python-jsonschema issues #185,
  #679, #1099, #1234), so a price the model wrote right failed validation and escalated; and
  a 400-digit integer raised a bare ``OverflowError``.

And every check of one answer is **metered** (:class:`ValidationTooCostly`): each subschema
applied to a value (jsonschema's ``iter_errors`` and ``descend``) is a step, one of
:data:`CHECK_BASE` + :data:`CHECK_PER_VALUE` × the answer's JSON values. jsonschema applies every
subschema it meets where it meets it, so 20 ``$defs`` that each ``allOf`` the next one twice
(1.5 KB) apply 2^20 times to one string: 34 s for one answer, days at 30. The most any
of JSONSchemaBench's 40,826 test instances (and the JSON-Schema-Test-Suite's) takes is 3,094
steps, 42.2 a value. A missing ``required`` name's error and a name searched with a
``patternProperties`` pattern are steps too (each as many as the schema lists), and so are
every 4 characters of an answer to ``format: regex`` that ``re``'s parser reads.
``localllm.grammar.compile.schema_problem`` refuses a schema whose subschemas fan out that far
in one place before any answer is checked.

And its default registry retrieves nothing (:func:`_no_retrieval`): jsonschema's fetches a
remote ``$ref`` with urllib; and ``additionalProperties`` reports its errors in the answer's
order (:func:`in_instance_order`), not in a set's, which changed from process to process.

The regex keywords are jsonschema's own functions, copied to run in a copy of their module's
namespace where ``re`` is :class:`_LinearRe`; jsonschema itself is left untouched.
"""

from __future__ import annotations

import functools
import importlib
import re
import threading
import types
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from localllm.grammar.pattern import search

__all__ = [
    "CHECK_BASE",
    "CHECK_PER_VALUE",
    "ENUM_SCAN",
    "ValidationTooCostly",
    "bounded_validator",
    "in_instance_order",
    "spend",
    "written",
]

#: the steps one check of an answer may take (a subschema applied, ~10 µs; a missing required
#: name's error; a name searched with a pattern): this many, ~2 s, plus :data:`CHECK_PER_VALUE`
#: for each JSON value of the answer (42.2 the most a corpus check takes)
CHECK_BASE, CHECK_PER_VALUE = 200_000, 100


class ValidationTooCostly(ValueError):
    """Checking one answer would take more steps than :data:`CHECK_BASE` and
    :data:`CHECK_PER_VALUE` allow (a step: a subschema applied, a missing required name's
    error, a name searched with a ``patternProperties`` pattern, 4 characters of an answer to
    ``format: regex`` read)."""


# jsonschema's modules whose keyword functions call ``re.search`` (directly or through each other)
_KEYWORD_MODULES = ("jsonschema._utils", "jsonschema._keywords", "jsonschema._legacy_keywords")


class _LinearRe:
    """What those modules see as ``re``: ``search`` runs in linear time, the rest is ``re``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: str, text: str) -> bool | None:
        # what schema checks refuse is re's to decide, for a caller that skipped them
        return search(pattern, text, fallback=True) or None


@functools.cache
def _linear_functions() -> dict[Any, Any]:
    """Each function of :data:`_KEYWORD_MODULES` → a copy that runs in a copy of its module's
    namespace where ``re`` is :class:`_LinearRe` and every such function is its copy (so a
    helper one keyword calls searches linearly too)."""
    modules = [importlib.import_module(name) for name in _KEYWORD_MODULES]
    spaces = {m.__name__: {**vars(m), "re": _LinearRe()} for m in modules}
    copies: dict[Any, Any] = {}
    for space in spaces.values():
        for value in space.values():
            if isinstance(value, types.FunctionType) and value.__module__ in spaces and value not in copies:
                copy = types.FunctionType(
                    value.__code__, spaces[value.__module__], value.__name__, value.__defaults__, value.__closure__
                )
                copy.__kwdefaults__ = value.__kwdefaults__
                copies[value] = copy
    for space in spaces.values():
        space.update(
            {
                key: copies[value]
                for key, value in space.items()
                if isinstance(value, types.FunctionType) and value in copies
            }
        )
    legacy = spaces["jsonschema._legacy_keywords"]
    if "find_evaluated_property_keys_by_schema" in legacy:  # draft 2019-09's unevaluatedProperties
        legacy["find_evaluated_property_keys_by_schema"] = _additional_evaluated(
            legacy["find_evaluated_property_keys_by_schema"]
        )
    return copies


def _additional_evaluated(find: Any) -> Any:
    """Draft 2019-09's evaluated property names, with what ``additionalProperties`` evaluates
    when it is a schema: every name no ``properties`` or ``patternProperties`` entry takes.
    jsonschema 4.26 takes the subschema's own keywords (``type``, ...) for property names there,
    so an additional property an ``unevaluatedProperties: false`` beside it should let through
    was refused (the JSON-Schema-Test-Suite's "unevaluatedProperties with adjacent non-bool
    additionalProperties"), an answer the compiled grammar admits."""

    def evaluated(validator: Any, instance: Any, schema: Any) -> Any:
        if not (isinstance(schema, dict) and isinstance(schema.get("additionalProperties"), dict)):
            return find(validator, instance, schema)
        keys = find(validator, instance, {k: v for k, v in schema.items() if k != "additionalProperties"})
        declared, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        return keys + [name for name in instance if name not in declared and not any(search(p, name) for p in patterns)]

    return evaluated


def _key(value: Any) -> Any:
    """A hashable stand-in for a JSON value, equal exactly when the values are JSON-equal."""
    if value is True or value is False:
        return (0, value)
    if isinstance(value, (int, float)):
        return (1, value)  # 1 == 1.0, and their hashes agree
    if isinstance(value, str):
        return (2, value)
    if value is None:
        return (3,)
    if isinstance(value, (list, tuple)):
        return (4, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return (5, frozenset((k, _key(v)) for k, v in value.items()))
    raise TypeError(type(value).__name__)


def _error(message: str) -> Any:
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    from jsonschema import ValidationError

    return ValidationError(message)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not unique or not validator.is_type(instance, "array"):
        return
    try:
        keys = [_key(item) for item in instance]
    except TypeError:  # not JSON data (a caller's own objects): jsonschema's comparison
        yield from validator._UNBOUNDED["uniqueItems"](validator, unique, instance, schema)
        return
    if len(set(keys)) != len(keys):
        yield _error(f"{instance!r} has non-unique elements")


#: an ``enum`` longer than this is decided by a set of its values' keys (:func:`_enum`)
ENUM_SCAN = 32
#: the key sets of the latest long enums, by the list's identity (the list is kept with them)
_ENUM_KEYS: dict[int, tuple[Any, frozenset[Any]]] = {}


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``enum``, but a long one is a set lookup. jsonschema compares the value with
    each entry in Python (``_utils.equal``): 14 ms a value against 30,000 integers (a 200 KB
    schema), so an answer of 2,000 such values took 28 s, and each wrong one's message held
    the whole enum's ``repr``."""
    keys = _enum_keys(enums) if isinstance(enums, list) and len(enums) > ENUM_SCAN else None
    if keys is None:
        yield from validator._UNBOUNDED["enum"](validator, enums, instance, schema)
        return
    try:
        found = _key(instance) in keys
    except TypeError:  # not JSON data (a caller's own objects): jsonschema's comparison
        yield from validator._UNBOUNDED["enum"](validator, enums, instance, schema)
        return
    if not found:
        shown = ", ".join(repr(each) for each in enums[:3])
        yield _error(f"{instance!r} is not one of the {len(enums):,} values of the enum ({shown}, …)")


def _enum_keys(enums: list[Any]) -> frozenset[Any] | None:
    """The keys (:func:`_key`) of ``enums``' values, kept for the latest 256 enums; None when one
    is not JSON data."""
    kept = _ENUM_KEYS.get(id(enums))
    if kept is not None and kept[0] is enums:
        return kept[1]
    try:
        keys = frozenset(_key(each) for each in enums)
    except TypeError:
        return None
    if len(_ENUM_KEYS) >= 256:
        _ENUM_KEYS.clear()
    _ENUM_KEYS[id(enums)] = (enums, keys)
    return keys


def written(number: Any) -> Fraction:
    """``number`` as the decimal it was written as: a float's shortest decimal (``repr``, which
    is the JSON text for any number of at most 15 significant digits), an int or a Decimal
    exactly. ValueError for an infinity or NaN (no JSON number)."""
    return Fraction(repr(number)) if isinstance(number, float) else Fraction(number)


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "number") or not validator.is_type(divisor, "number"):
        yield from validator._UNBOUNDED["multipleOf"](validator, divisor, instance, schema)
        return
    try:
        exact = written(instance) / written(divisor)
    except (ValueError, ZeroDivisionError, TypeError):  # not JSON numbers: jsonschema decides
        yield from validator._UNBOUNDED["multipleOf"](validator, divisor, instance, schema)
        return
    if exact.denominator != 1:
        yield _error(f"{instance!r} is not a multiple of {divisor}")


@functools.cache
def bounded_validator(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) with its regex, ``uniqueItems`` and
    ``multipleOf`` keywords bounded as the module docstring says."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    copies = _linear_functions()
    keywords = {key: copies.get(fn, fn) for key, fn in cls.VALIDATORS.items()}
    for key, fn in (("uniqueItems", _unique_items), ("multipleOf", _multiple_of), ("enum", _enum)):
        if key in keywords:
            keywords[key] = fn
    for key in ("required", "dependentRequired", "dependencies"):  # an error per missing name
        if key in keywords:
            keywords[key] = _charged(keywords[key])
    if "patternProperties" in keywords:  # each name searched with each pattern
        keywords["patternProperties"] = _charged_searches(keywords["patternProperties"])
    if "additionalProperties" in keywords:
        keywords["additionalProperties"] = in_instance_order(keywords["additionalProperties"])
    validator = jsonschema.validators.extend(cls, keywords)
    validator.__name__ = validator.__qualname__ = cls.__name__  # the same draft (callers read its name)
    validator._UNBOUNDED = cls.VALIDATORS
    validator.__init__ = _no_retrieval(validator.__init__)
    validator.evolve = _bounded_evolve(validator.evolve, jsonschema.validators)
    validator.descend = _metered_descend(validator.descend)
    validator.iter_errors = _metered(validator.iter_errors)
    return validator


def in_instance_order(keyword: Any) -> Any:
    """``keyword`` (jsonschema's ``additionalProperties``) with its errors in the order of the
    instance's names. jsonschema 4.26 goes through the extra names as a set, and ``str``
    hashes are salted per process: which of two errors came first, the one a refusal, a 400
    or a trace names, changed from one run to the next."""

    def ordered(validator: Any, value: Any, instance: Any, schema: Any) -> list[Any]:
        errors = list(keyword(validator, value, instance, schema) or ())
        if len(errors) > 1 and isinstance(instance, dict):
            place = {name: i for i, name in enumerate(instance)}
            errors.sort(key=lambda e: place.get(e.path[0], -1) if e.path else -1)
        return errors

    return ordered


def _bounded_evolve(evolve: Any, module: types.ModuleType) -> Any:
    """``evolve`` whose validator for a subschema is bounded too. jsonschema picks its class by
    the subschema's own ``$schema``: a nested ``"$schema": "…draft-07…"`` got the plain
    Draft7Validator, whose ``re.search`` took 1.5 s for ``^(a+)+$`` on 24 characters and a
    near-miss, doubling with each one more (and no meter).
    ``module`` is ``jsonschema.validators``, whose namespace the copy runs in."""

    def validator_for(schema: Any, default: Any) -> Any:
        cls = module.validator_for(schema, default=default)
        return cls if hasattr(cls, "_UNBOUNDED") else bounded_validator(cls)

    space = {**vars(module), "validator_for": validator_for}
    return types.FunctionType(evolve.__code__, space, evolve.__name__, evolve.__defaults__, evolve.__closure__)


def _metered_descend(descend: Any) -> Any:
    """``descend`` spending one step of the running check (:func:`_metered`), and whose
    error for a ``false`` subschema carries the path it was given: jsonschema's returns that
    error before adding it, so an answer failing ``properties: {b: false}`` at ``b`` was
    reported at ``$`` (jsonschema 4.26)."""

    @functools.wraps(descend)
    def wrapper(
        self: Any, instance: Any, schema: Any, *, path: Any = None, schema_path: Any = None, resolver: Any = None
    ) -> Any:
        spend()  # when the errors are first asked for, inside the check
        for error in descend(self, instance, schema, path=path, schema_path=schema_path, resolver=resolver):
            if schema is False:
                if path is not None:
                    error.path.appendleft(path)
                if schema_path is not None:
                    error.schema_path.appendleft(schema_path)
            yield error

    return wrapper


def _no_retrieval(init: Any) -> Any:
    """``init`` with an empty ``registry`` by default: jsonschema's default registry fetches
    any ``http(s)`` ``$ref`` with urllib, so a schema from a service client could make
    localllm request any URL (its internal network included). References resolve within the
    schema and to the JSON Schema meta-schemas (which jsonschema adds to every registry);
    ``localllm.schema.SchemaSet`` passes its own registry, serving files under its root."""
    from referencing import Registry

    empty = Registry()

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, registry: Any = empty, **kwargs: Any) -> None:
        init(self, *args, registry=registry, **kwargs)

    return __init__


class _Meter(threading.local):
    #: the steps the check running on this thread has left; None while none runs
    left: int | None = None


_METER = _Meter()
_TOO_COSTLY = (
    f"checking the answer takes more than the allowed {CHECK_BASE:,} + {CHECK_PER_VALUE} per value steps "
    "(a step: a subschema applied, a missing required name, a name searched with a pattern, "
    "4 characters of an answer to format: regex read); "
    "allOf, anyOf, oneOf and $ref applying the same subschemas again multiply them: share or simplify those subschemas"
)


def spend(steps: int = 1) -> None:
    """``steps`` of the check running on this thread (none runs: nothing to spend)."""
    left = _METER.left
    if left is not None:
        if left < steps:
            raise ValidationTooCostly(_TOO_COSTLY)
        _METER.left = left - steps


def _charged(keyword: Any) -> Any:
    """``keyword`` (``required`` and its kin: an error for each missing name, as many as the
    schema lists) spending one step of the running check for each error."""

    def charged(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        for error in keyword(validator, value, instance, schema) or ():
            spend()
            yield error

    return charged


def _charged_searches(keyword: Any) -> Any:
    """``patternProperties`` spending a step of the running check for each name and pattern it
    searches: 500 patterns and an answer of 4,000 names are 2 M searches (7.7 s; 5,000
    patterns, past the matchers' cache, and 1,000 names took 86 s)."""

    def charged(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(patterns, dict) and isinstance(instance, dict):
            spend(len(patterns) * len(instance))
        yield from keyword(validator, patterns, instance, schema) or ()

    return charged


def _metered(iter_errors: Any) -> Any:
    """``iter_errors`` spending one step of the check that is running; a call while none runs
    starts a check, metered by :class:`_Check`."""

    @functools.wraps(iter_errors)
    def wrapper(self: Any, instance: Any, _schema: Any = None) -> Any:
        left = _METER.left
        if left is None:  # the schema itself is the check's first application
            budget = CHECK_BASE + CHECK_PER_VALUE * _values(instance) - 1
            return _Check(iter_errors(self, instance, _schema), budget)
        if left <= 0:
            raise ValidationTooCostly(_TOO_COSTLY)
        _METER.left = left - 1
        return iter_errors(self, instance, _schema)

    return wrapper


class _Check:
    """The errors of one check, its budget on the thread only while it runs: a check left
    half-read (``next(iter_errors(...))``) never charges the next one."""

    def __init__(self, errors: Iterator[Any], budget: int) -> None:
        self.errors, self.left = errors, budget

    def __iter__(self) -> _Check:
        return self

    def __next__(self) -> Any:
        _METER.left = self.left
        try:
            return next(self.errors)
        finally:
            self.left, _METER.left = _METER.left, None


def _values(instance: Any) -> int:
    """How many JSON values ``instance`` holds (itself and every member, at every depth)."""
    count, stack = 0, [instance]
    while stack:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return count
