"""The JSON Schema keywords a validator enforces, by the kind of value they apply to.

Shared by the compiler and the checker: draft 2020-12 plus the earlier drafts' names
(``additionalItems``, ``dependencies``, draft 3's ``divisibleBy``/``extends``/``disallow``).
Anything else (``title``, ``$defs``, ``x-…``, ``then``/``else`` read by ``if``,
``contentEncoding``/``contentMediaType``, which jsonschema treats as annotations)
constrains nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ANY", "ARRAY", "ASSERTING", "NUMBER", "OBJECT", "STRING", "asserts"]

OBJECT = frozenset(
    {
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "required",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "minProperties",
        "maxProperties",
        "unevaluatedProperties",
    }
)
ARRAY = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "minContains",
        "maxContains",
        "minItems",
        "maxItems",
        "uniqueItems",
        "unevaluatedItems",
    }
)
STRING = frozenset({"pattern", "minLength", "maxLength", "format"})
NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "divisibleBy"})
ANY = frozenset(
    {
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "enum",
        "const",
        "type",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
        "extends",
        "disallow",
    }
)
ASSERTING = OBJECT | ARRAY | STRING | NUMBER | ANY

# values that make a keyword a no-op
_TRUE_IS_NOOP = frozenset(
    {"additionalProperties", "items", "unevaluatedProperties", "unevaluatedItems", "propertyNames", "additionalItems"}
)
_EMPTY_IS_NOOP = frozenset(
    {"required", "properties", "patternProperties", "dependentSchemas", "dependentRequired", "dependencies"}
)


def asserts(node: Mapping[str, Any], key: str) -> bool:
    """Does ``key`` constrain anything in ``node`` (as far as validation is concerned)?"""
    if key not in node or key not in ASSERTING:
        return False
    value = node[key]
    if key in _TRUE_IS_NOOP and (value is True or value == {}):
        return False
    if key in _EMPTY_IS_NOOP and value in ([], {}):
        return False
    if key == "uniqueItems" and value is False:
        return False
    if (
        key in ("allOf", "anyOf", "oneOf")
        and isinstance(value, list)
        and value
        and all(v is True or v == {} for v in value)
        # oneOf of two or more always-true branches: every value matches more than one, none is valid
        and (key != "oneOf" or len(value) == 1)
    ):
        return False
    return not (key in ("minItems", "minLength", "minProperties") and value == 0 and not isinstance(value, bool))
