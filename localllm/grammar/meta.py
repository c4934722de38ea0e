"""Is a schema valid against its draft's meta-schema? The same verdict as ``check_schema``, faster.

The 2019-09 and 2020-12 meta-schemas are split into vocabulary documents joined by
``$recursiveRef``/``$dynamicRef``; jsonschema resolves those dynamically on every
subschema, which made meta-validation 80% of :func:`~localllm.grammar.compile.compile_schema`'s
time. When validating a schema against the standard meta-schema, every dynamic reference
lands on the top meta-schema itself, so one static document (the vocabularies as an
``allOf``, their ``$defs`` merged, dynamic refs as ``{"$ref": "#"}``) validates the same
instances (``tests/unit/test_grammar_meta.py`` compares the verdicts and error paths on
both corpora and thousands of mutated schemas). Earlier drafts' meta-schemas are one
document already and are used as they are.
"""

from __future__ import annotations

import functools
from typing import Any

from localllm.grammar.formats import meta_format_checker
from localllm.grammar.kept import Kept

__all__ = ["meta_error"]

_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
_DATA = frozenset({"enum", "const", "default", "examples", "required", "type"})
_DROP = frozenset({"$dynamicAnchor", "$recursiveAnchor", "$id", "$schema", "$vocabulary", "$comment"})


def _static(node: Any) -> Any:
    """One meta-schema document with its dynamic and cross-document refs made local."""
    if isinstance(node, list):
        return [_static(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$dynamicRef", "$recursiveRef"):
            out["$ref"] = "#"
        elif key == "$ref" and isinstance(value, str):
            out["$ref"] = "#" + value.split("#", 1)[1] if "#" in value else "#"
        elif key in _DROP:
            continue
        elif key in _MAPS and isinstance(value, dict):
            out[key] = {name: _static(sub) for name, sub in value.items()}
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _static(value)
    return out


@functools.lru_cache(maxsize=8)
def _validator(cls: Any) -> Any:
    meta = cls.META_SCHEMA
    if not isinstance(meta.get("allOf"), list) or not all(
        isinstance(c, dict) and isinstance(c.get("$ref"), str) for c in meta["allOf"]
    ):
        return cls(meta, format_checker=meta_format_checker(cls))
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    from jsonschema.validators import SPECIFICATIONS as REGISTRY

    base = meta["$id"].rsplit("/", 1)[0] + "/"
    defs: dict[str, Any] = {}
    comps = []
    for comp in meta["allOf"]:
        vocab = _static(REGISTRY.contents(base + comp["$ref"]))
        defs.update(vocab.pop("$defs", {}))
        comps.append(vocab)
    flat: dict[str, Any] = {}
    for key, value in meta.items():  # the meta-schema's own keyword order
        flat.update({"allOf": comps} if key == "allOf" else _static({key: value}))
    flat["$defs"] = {**defs, **flat.get("$defs", {})}
    return cls(flat, format_checker=meta_format_checker(cls))


#: verdicts of the latest schemas checked: a service client sends the same response_format
#: with every request, and a request's schema is checked, then compiled (which checks it);
#: 4 Mi characters of keys (schema reprs) in all: a larger schema's verdict is not kept
_VERDICTS: Kept[Any] = Kept(64, 4 << 20)


def meta_error(cls: Any, schema: Any) -> Any:
    """What ``cls.check_schema(schema)`` raises, returned (a ``SchemaError``), or None when valid.

    The static meta-schema answers "valid" fast; anything else (invalid, or a schema it
    cannot evaluate) is left to ``check_schema`` itself, so errors are exactly its own. The
    verdicts of the latest schemas are kept, keyed by their ``repr`` (which tells a tuple
    from a list, ``1`` from ``1.0`` and ``True``, and keeps key order)."""
    try:
        text = repr(schema)
    except (RecursionError, ValueError):  # deeper than repr goes; an int too long to print
        return _meta_error(cls, schema)
    return _VERDICTS.get((cls, text), lambda: _meta_error(cls, schema), lambda _: len(text))


def _meta_error(cls: Any, schema: Any) -> Any:
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    try:
        if _validator(cls).is_valid(schema):
            return None
    except Exception:
        pass
    error = next(iter(_checker(cls).iter_errors(schema)), None)
    return None if error is None else jsonschema.exceptions.SchemaError.create_from(error)


@functools.lru_cache(maxsize=8)
def _checker(cls: Any) -> Any:
    """What ``cls.check_schema`` validates with (the meta-schema's own validator class), its
    ``additionalProperties`` errors in the schema's order: check_schema raises the first
    error, and which one that was changed from one process to the next."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    from localllm.grammar.bounded import in_instance_order

    meta = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
    ordered = in_instance_order(meta.VALIDATORS["additionalProperties"])
    return jsonschema.validators.extend(meta, {"additionalProperties": ordered})(
        cls.META_SCHEMA, format_checker=meta_format_checker(cls)
    )
