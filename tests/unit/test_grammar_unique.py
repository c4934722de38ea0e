"""uniqueItems with positional items: when every position (and the items after them) has a
finite domain (enum/const, booleans, null), each array of distinct values is listed, kept when
the validator accepts it, with shared prefixes written once. An open domain anywhere stays
refused (distinct strings or numbers are not a context-free language).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from localllm.grammar.compile import compile_schema
from tests.unit.grammar_harness import grammar_of, invalid_walks, validator

D7 = "http://json-schema.org/draft-07/schema#"
D2020 = "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    "schema",
    [
        # JSON-Schema-Test-Suite draft7 uniqueItems group 2: two boolean positions, nothing after
        {"$schema": D7, "items": [{"type": "boolean"}, {"type": "boolean"}], "additionalItems": False}
        | {"uniqueItems": True},
        {"$schema": D2020, "prefixItems": [{"enum": [1, 2]}], "items": {"enum": [1, 3, "x"]}, "uniqueItems": True}
        | {"minItems": 1},
        {"$schema": D2020, "prefixItems": [{"const": "a"}, {"type": ["boolean", "null"]}], "items": False}
        | {"uniqueItems": True, "maxItems": 2},
    ],
)
def test_unique_tuples_over_finite_domains_compile_exactly(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is not None, compiled.refusals
    assert invalid_walks(schema, compiled, 300) == []
    g = grammar_of(schema)
    check = validator(schema)
    pool = [True, False, None, 1, 2, 3, "a", "x"]
    for n in range(5):
        for arr in itertools.product(pool, repeat=n) if n < 4 else itertools.permutations(pool, n):
            text = json.dumps(list(arr), separators=(",", ":"))
            assert g.matches(text) == check.is_valid(list(arr)), text


def test_repeated_booleans_are_rejected() -> None:
    g = grammar_of({"$schema": D7, "items": [{"type": "boolean"}, {"type": "boolean"}], "additionalItems": False,
                    "uniqueItems": True})  # fmt: skip
    assert g.matches("[true,false]") and g.matches("[false]") and g.matches("[]")
    assert not g.matches("[true,true]") and not g.matches("[false,false]") and not g.matches("[true,false,true]")


@pytest.mark.parametrize(
    "schema",
    [
        # JSON-Schema-Test-Suite draft2020-12 uniqueItems group 1: items after the prefix are open
        {"$schema": D2020, "prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "uniqueItems": True},
        {"$schema": D2020, "prefixItems": [{"type": "string"}], "items": False, "uniqueItems": True},
    ],
)
def test_open_domains_stay_refused(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled.grammar is None
    assert [r.construct for r in compiled.refusals] == ["uniqueItems"]
