"""The static meta-schema gives check_schema's verdict on every schema (corpora and mutants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from localllm.grammar.compile import validator_class
from localllm.grammar.formats import meta_format_checker
from localllm.grammar.meta import _checker, _validator, meta_error
from tests.unit.grammar_fuzz import mutations
from tests.unit.grammar_harness import corpus, realworld


def slow_verdict(schema: Any) -> str:
    """``check_schema``'s verdict, patterns read as localllm reads them (ECMA-262's named groups,
    ``\\p{…}``, ...: :func:`localllm.grammar.formats.meta_format_checker`); its error is the
    first in the schema's order (check_schema's first came in a set's order)."""
    cls = validator_class(schema)
    try:
        cls.check_schema(schema, format_checker=meta_format_checker(cls))
    except jsonschema.exceptions.SchemaError:
        exc = next(iter(_checker(cls).iter_errors(schema)))
        return f"invalid {list(exc.absolute_path)} {exc.message}"
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    return "valid"


def fast_verdict(schema: Any) -> str:
    try:
        exc = meta_error(validator_class(schema), schema)
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    return "valid" if exc is None else f"invalid {list(exc.absolute_path)} {exc.message}"


@pytest.mark.slow
def test_static_meta_schema_agrees_with_check_schema() -> None:
    seeds = [s for _, s in corpus()] + [s for _, s in realworld()]
    schemas = seeds + list(mutations(seeds, 1500, seed=29))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        disagree = [(s, fast_verdict(s), slow_verdict(s)) for s in schemas if fast_verdict(s) != slow_verdict(s)]
    assert disagree == []


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "kaboom"},
        {"prefixItems": {"type": "string"}},
        {"$defs": {"a": {"minLength": -1}}},
        {"properties": {"a": {"items": {"$dynamicRef": 3}}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": 1}]},
        {"$schema": "https://json-schema.org/draft/2019-09/schema", "properties": {"a": {"maxItems": "2"}}},
    ],
)
def test_invalid_schemas_are_invalid_on_the_fast_path_too(schema: Any) -> None:
    assert not _validator(validator_class(schema)).is_valid(schema)
    assert fast_verdict(schema) == slow_verdict(schema) != "valid"


def test_kept_verdicts_tell_apart_what_json_would_not() -> None:
    # verdicts are kept by repr: a tuple is no JSON array to jsonschema, True no number
    cls = validator_class({})
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"type": "object", "required": ["a"]}, {"type": "object", "required": ("a",)}),
        ({"minimum": 1}, {"minimum": True}),
        ({"multipleOf": 2}, {"multipleOf": 0}),
    ]
    for _ in range(2):  # the second round answers from the kept verdicts
        for good, bad in pairs:
            assert meta_error(cls, good) is None
            assert meta_error(cls, bad) is not None
            assert meta_error(cls, dict(good)) is None  # an equal schema, another object


def test_kept_verdicts_stay_within_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.grammar import meta
    from localllm.grammar.kept import Kept

    monkeypatch.setattr(meta, "_VERDICTS", Kept(64, 10_000))
    cls = validator_class({})
    for i in range(60):
        assert meta_error(cls, {"type": "object", "properties": {f"p{j}": {} for j in range(i * 4)}}) is None
    assert meta._VERDICTS.held <= 10_000 and len(meta._VERDICTS) > 1


def test_the_error_reported_is_the_first_in_the_documents_order_in_every_process() -> None:
    # jsonschema goes through additionalProperties' extra names as a set; str hashes are
    # salted per process, so a schema with two bad definitions was refused naming one in one
    # run and the other in the next (JSONSchemaBench o15286), and an answer's first error too
    names = ["zeta", "alpha", "mid", "beta", "omega", "kappa", "delta", "eta"]
    child = f"""
import json
from localllm.grammar.compile import compile_schema, validator_class
names = {names!r}
refusal = compile_schema({{"definitions": {{n: {{"minLength": -1}} for n in names}}}}).refusals[0]
schema = {{"type": "object", "additionalProperties": {{"type": "integer"}}}}
error = next(iter(validator_class(schema)(schema).iter_errors({{n: "x" for n in names}})))
print(json.dumps([refusal.path, list(error.absolute_path)]))
"""
    seen = set()
    for seed in ("1", "2", "3", "4"):
        run = subprocess.run(
            [sys.executable, "-c", child],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        seen.add(run.stdout.strip())
    assert [json.loads(s) for s in seen] == [["$.definitions.zeta.minLength", ["zeta"]]]
