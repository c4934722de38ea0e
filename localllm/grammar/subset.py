"""Will the pinned llama-server enforce every structural constraint of a JSON Schema?

:func:`check_subset` walks a schema the way llama.cpp's converter does
(``common/json-schema.cpp`` builds a typed tree, ``common/json-schema-to-grammar.cpp``
turns it into GBNF) and reports each place where the server would refuse the schema,
silently ignore a constraint that validation still enforces, or fall back to "any
string". Findings are ``error`` (out of the subset: the request fails, or the grammar
lets through answers validation rejects) or ``warning`` (a value-level constraint the
grammar ignores, e.g. a number bound; validation catches it).

How the converter reads a schema object, and so how this module does:

1. ``$ref`` wins: every keyword beside it is ignored. Only ``#/…`` pointers into the
   same document resolve (no ``~``/``%`` unescaping); ``#``, remote and unresolvable refs
   fail the request, and a ref cycle that consumes no input is left recursion (fails).
2. ``oneOf`` (else ``anyOf``) wins next: every sibling keyword is ignored; ``oneOf`` is
   generated as ``anyOf``.
3. ``type`` as a list is expanded into alternatives; then ``const``, then ``enum`` win,
   ignoring their siblings.
4. The type (or, without one, the structural keywords in the order properties →
   allOf → items → string keywords) picks one kind; keywords the kind does not read are
   ignored.

What counts as a constraint is what the schema's own draft validates (jsonschema's
validator for its ``$schema``): a keyword that draft does not have, and before 2019-09
every keyword beside ``$ref``, constrains nothing; so does a keyword that the values the
converter generates satisfy anyway (an ``unevaluatedProperties`` on an object closed on
its ``properties``, a sibling of ``$ref``/``oneOf`` that each alternative implies).

Paths are JSON paths from ``$`` (``$.properties.a.items``), siblings are visited in
sorted order, and findings inside a ``$ref`` target are reported once, at the target.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from localllm.grammar import keywords
from localllm.grammar.paths import child_path
from localllm.grammar.pattern import PatternTooCostly, search
from localllm.grammar.pattern import check as check_regex

Severity = Literal["error", "warning"]

SUBSET = "is outside the llama.cpp grammar subset"
_REJECTS = "(llama.cpp rejects the request)"

# Ignored but value-level: validation still rejects a bad answer, the shape is right.
_WARNING_KW = keywords.NUMBER | {"minProperties", "maxProperties", "format"}

_RELEVANT: dict[str, frozenset[str]] = {
    "object": keywords.OBJECT | keywords.ANY,
    "array": keywords.ARRAY | keywords.ANY,
    "string": keywords.STRING | keywords.ANY,
    "integer": keywords.NUMBER | keywords.ANY,
    "number": keywords.NUMBER | keywords.ANY,
    "boolean": keywords.ANY,
    "null": keywords.ANY,
    "any": keywords.ASSERTING,
}
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
_KNOWN_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})

#: formats whose strings all have one length (a min/maxLength that allows it is implied)
_FIXED_LENGTH = {"date": 10, "uuid": 36, "uuid1": 36, "uuid2": 36, "uuid3": 36, "uuid4": 36, "uuid5": 36}


@dataclass(frozen=True)
class Violation:
    """One finding: where (JSON path of the schema object), what keyword, why, how bad."""

    path: str
    construct: str
    message: str
    severity: Severity = "error"
    #: never to be sent to llama.cpp's converter, strict or not: it would make of it a grammar
    #: llama-server's parser never finishes reading (memory without end)
    runaway: bool = False

    def __str__(self) -> str:
        return self.message


def format_violation(v: Violation, alias: str, schema_file: str) -> str:
    """The load-time message for a ``grammar: true`` local_llm decide gate."""
    return (
        f'agent "{alias}" is builtin.local_llm with grammar: true but its decide schema '
        f'"{schema_file}" {SUBSET}: {v.message}'
    )


def check_subset(schema: Mapping[str, Any] | Any, *, where: str = "") -> list[Violation]:
    """Every finding for ``schema``, in a stable order (depth first, keys sorted).

    ``where`` optionally labels the schema (e.g. its file); messages then start with it.
    """
    from localllm.grammar.compile import MAX_DEPTH, schema_problem
    from localllm.wire import nesting

    depth = nesting(schema, 4 * MAX_DEPTH)
    checker = _Checker(schema)
    if depth > 4 * MAX_DEPTH:
        checker.error(
            "$",
            "depth",
            f"$: the schema nests {depth} levels deep (at most {4 * MAX_DEPTH}); "
            "flatten it or move repeated parts into $defs",
        )
    else:
        try:
            checker.visit(schema, "$", owner="$")
            checker.check_left_recursion()
        except _CHECK_FAILURES as exc:
            checker.findings = [v for v in checker.findings if v.severity == "error"][:1]
            problem = schema_problem(schema)
            where, why = problem if problem else ("$", f"cannot be analysed ({type(exc).__name__}: {exc})")
            checker.error(where, "schema", f"{where}: not a valid JSON Schema: {why} {_REJECTS}")
        if not any(v.severity == "error" for v in checker.findings):
            problem = schema_problem(schema)
            if problem:
                checker.error(problem[0], "schema", f"{problem[0]}: not a valid JSON Schema: {problem[1]} {_REJECTS}")
    out: list[Violation] = []
    seen: set[tuple[str, str, str]] = set()
    for v in checker.findings:
        key = (v.path, v.construct, v.message)
        if key in seen:
            continue
        seen.add(key)
        out.append(Violation(v.path, v.construct, f"{where}: {v.message}", v.severity) if where else v)
    return out


_CHECK_FAILURES: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    ValueError,
    LookupError,
    RecursionError,
    re.error,
)


def unenforced(schema: Any, *, compiled: bool = True) -> list[Violation]:
    """The errors that leave ``schema`` unenforced on the path ``builtin.local_llm`` takes:
    none when localllm's compiler expresses it exactly (``compiled``, i.e. ``grammar: true``),
    else those of llama.cpp's converter (the fallback, and ``grammar: server``)."""
    if compiled:
        from localllm.grammar.compile import compile_schema

        if compile_schema(schema).exact:
            return []
    return [v for v in check_subset(schema) if v.severity == "error"]


def _q(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def unsupported(path: str, key: str, why: str = "") -> str:
    """The reference message shape for a keyword llama.cpp does not enforce."""
    text = f'{path}: unsupported construct "{key}" {SUBSET}'
    return f"{text} ({why})" if why else text


class _Checker:
    """One walk over one schema document; owns its findings and ref bookkeeping."""

    def __init__(self, root: Any) -> None:
        from localllm.grammar.compile import validator_class

        self.root = root
        # what the schema's own draft enforces: validation ignores every other keyword (e.g.
        # "if" in draft 4), and before 2019-09 also every keyword beside "$ref"
        known = set(validator_class(root).VALIDATORS)
        if "contains" in known:
            known |= {"minContains", "maxContains"}  # read by "contains"
        if "minimum" in known:
            known |= {"exclusiveMinimum", "exclusiveMaximum"}  # draft 4: flags read by minimum/maximum
        self.vocabulary = frozenset(known)
        self.ref_siblings = "unevaluatedProperties" in self.vocabulary
        self.findings: list[Violation] = []
        self.followed: set[str] = set()
        # Refs reachable from each ref target (or "$") without consuming input: a cycle
        # here is a left-recursive grammar, which llama.cpp refuses to parse.
        self.bare_edges: dict[str, list[tuple[str, str]]] = {}

    # ------------------------------------------------------------------ helpers

    def asserts(self, node: Mapping[str, Any], key: str) -> bool:
        """Does ``key`` constrain anything in ``node`` under the schema's draft?"""
        return key in self.vocabulary and _asserts(node, key)

    def asserts_beside_ref(self, node: Mapping[str, Any], key: str) -> bool:
        return self.ref_siblings and self.asserts(node, key)

    def error(self, path: str, construct: str, message: str) -> None:
        self.findings.append(Violation(path, construct, message, "error"))

    def warn(self, path: str, construct: str, message: str) -> None:
        self.findings.append(Violation(path, construct, message, "warning"))

    def ignored(self, path: str, key: str, why: str = "") -> None:
        if key in _WARNING_KW:
            reason = f" ({why})" if why else ""
            self.warn(
                path,
                key,
                f'{path}: "{key}" is not enforced by the llama.cpp grammar{reason}; validation still checks it',
            )
        else:
            self.error(path, key, unsupported(path, key, why))

    def resolve(self, ref: str) -> tuple[Any, str] | None:
        """Resolve ``#/a/b`` exactly as llama.cpp does (split on ``/``, no unescaping)."""
        target = self.root
        path = "$"
        for token in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and token in target:
                target = target[token]
                path = child_path(path, token)
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
                path = child_path(path, int(token))
            else:
                return None
        return target, path

    def deref(self, node: Any) -> Any:
        """``node`` with a bare ``{"$ref": ...}`` chain followed (None if it does not resolve)."""
        seen: set[str] = set()
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and _only_keyword(node, "$ref"):
            if node["$ref"] in seen or not node["$ref"].startswith("#/"):
                return None
            seen.add(node["$ref"])
            resolved = self.resolve(node["$ref"])
            node = resolved[0] if resolved else None
        return node

    # ------------------------------------------------------------------ walk

    def visit(self, node: Any, path: str, *, owner: str | None) -> None:
        """Check one subschema. ``owner`` is the ref (or "$") whose input is not yet consumed."""
        if isinstance(node, bool):
            self.error(
                path,
                "boolean schema",
                f"{path}: boolean subschema {_q(node)} {SUBSET} (llama.cpp rejects the request; "
                + ("use {} instead" if node else "remove the keyword or use a schema that says what is allowed")
                + ")",
            )
            return
        if not isinstance(node, dict):
            self.error(path, "schema", f"{path}: a schema must be a JSON object, got {_q(node)}")
            return
        if "$ref" in node:
            self.visit_ref(node, path, owner=owner)
            return
        if "oneOf" in node or "anyOf" in node:
            self.visit_alternatives(node, path, owner=owner)
            return
        if "const" in node:
            self.check_literals(node, path, "const", [node["const"]])
            return
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                self.error(path, "enum", f'{path}: "enum" must be a non-empty array {_REJECTS}')
                return
            self.check_literals(node, path, "enum", values)
            return
        type_ = node.get("type")
        if isinstance(type_, list):
            if not type_:
                self.error(path, "type", f'{path}: "type" must not be an empty array {_REJECTS}')
            for t in type_:
                self.visit_typed(node, path, t, owner=owner)
            return
        self.visit_typed(node, path, type_, owner=owner)

    def implies_type(self, alt: Any, type_: Any) -> bool:
        """Does every value valid against ``alt`` have JSON type ``type_`` (a name or a list)?"""
        wanted = {type_} if isinstance(type_, str) else set(type_) if isinstance(type_, list) else set()
        if "number" in wanted:
            wanted.add("integer")
        seen: set[str] = set()
        while isinstance(alt, dict) and isinstance(alt.get("$ref"), str) and alt["$ref"] not in seen:
            seen.add(alt["$ref"])
            resolved = self.resolve(alt["$ref"])
            alt = resolved[0] if resolved else None
        if not isinstance(alt, dict):
            return False
        literals = [alt["const"]] if "const" in alt else alt.get("enum") if isinstance(alt.get("enum"), list) else None
        if literals is not None:
            return all(_json_type(v) in wanted or (_json_type(v) == "integer" and "number" in wanted) for v in literals)
        own = alt.get("type")
        if own is None:  # the converter's kind inference without a type
            own = (
                "object"
                if _has_properties(alt)
                else "array"
                if ("items" in alt or "prefixItems" in alt)
                else "string"
                if any(k in alt for k in ("pattern", "minLength", "maxLength"))
                else None
            )
        names = {own} if isinstance(own, str) else set(own) if isinstance(own, list) and own else None
        return names is not None and all(isinstance(n, str) for n in names) and names <= wanted

    def implied(self, alt: Any, node: Mapping[str, Any], key: str) -> bool:
        """Does every value the converter generates for ``alt`` satisfy ``node[key]``? Known
        for "type", and for a closed object (only its "properties" are generated) also for
        "properties" (what it says of the generated names is only a type they have),
        "additionalProperties": false (it lists them), "required" (they are required in
        ``alt``) and "unevaluatedProperties" (``alt`` evaluates them)."""
        if key == "type":
            return self.implies_type(alt, node["type"])
        target = self.deref(alt)
        if (
            not isinstance(target, dict)
            or not _closed_on_properties(target)
            or target.get("type", "object") != "object"
            or any(k in target for k in ("$ref", "anyOf", "oneOf", "allOf", "const", "enum"))
        ):
            return False
        generated: dict[str, Any] = target["properties"]
        value = node[key]
        if key == "unevaluatedProperties":
            return True
        if key == "patternProperties":
            closed = {"properties": generated, "additionalProperties": False, "patternProperties": value}
            return self.pattern_properties_unused(closed)
        if key == "required":
            own = target.get("required")
            return isinstance(value, list) and isinstance(own, list) and set(value) <= set(own)
        if key == "additionalProperties":
            listed = node.get("properties")
            return value is False and isinstance(listed, dict) and set(generated) <= set(listed)
        if key == "properties" and isinstance(value, dict):
            for name in set(generated) & set(value):
                sub = value[name]
                vacuous = isinstance(sub, dict) and not any(self.asserts(sub, k) for k in sub)
                typed = isinstance(sub, dict) and _only_keyword(sub, "type")
                if not vacuous and not (typed and self.implies_type(generated[name], sub["type"])):
                    return False
            return True
        return False

    def visit_ref(self, node: dict[str, Any], path: str, *, owner: str | None) -> None:
        for key in sorted(node):
            if key != "$ref" and self.asserts_beside_ref(node, key) and self.implied({"$ref": node["$ref"]}, node, key):
                continue
            if key != "$ref" and self.asserts_beside_ref(node, key):
                self.error(
                    path,
                    key,
                    unsupported(
                        path, key, 'llama.cpp ignores every keyword beside "$ref"; move it into the referenced schema'
                    ),
                )
        ref = node["$ref"]
        if not isinstance(ref, str):
            self.error(path, "$ref", f'{path}: "$ref" must be a string, got {_q(ref)}')
            return
        if ref == "#":
            self.error(
                path,
                "$ref",
                f'{path}: "$ref": "#" (the whole document) {SUBSET}; '
                'move the recursive part into "$defs" and reference "#/$defs/<name>"',
            )
            return
        if not ref.startswith("#/"):
            self.error(
                path,
                "$ref",
                f'{path}: "$ref": {_q(ref)} {SUBSET}; only local '
                '"#/..." references into the same document are supported',
            )
            return
        resolved = self.resolve(ref)
        if resolved is None:
            self.error(
                path,
                "$ref",
                f'{path}: "$ref": {_q(ref)} cannot be resolved in this document '
                "(llama.cpp resolves #/ pointers literally, without ~0/~1 or % unescaping)",
            )
            return
        target, target_path = resolved
        if owner is not None:
            self.bare_edges.setdefault(owner, []).append((ref, path))
        if ref in self.followed:
            return
        self.followed.add(ref)
        self.visit(target, target_path, owner=ref)

    def visit_alternatives(self, node: dict[str, Any], path: str, *, owner: str | None) -> None:
        key = "oneOf" if "oneOf" in node else "anyOf"
        if key == "oneOf" and "anyOf" in node:
            why = 'llama.cpp uses "oneOf" and ignores "anyOf" beside it'
            self.error(path, "anyOf", unsupported(path, "anyOf", why))
        siblings = [k for k in sorted(node) if self.asserts(node, k) and k not in ("anyOf", "oneOf")]
        if isinstance(node[key], list) and node[key]:
            siblings = [k for k in siblings if not all(self.implied(alt, node, k) for alt in node[key])]
        if siblings:
            if "properties" in siblings or "type" in siblings:
                self.error(path, key, f'{path}: "{key}" alongside sibling properties/type {SUBSET}')
            else:
                names = ", ".join(f'"{k}"' for k in siblings)
                self.error(
                    path,
                    key,
                    f'{path}: "{key}" alongside sibling {names} {SUBSET} '
                    f'(llama.cpp ignores every keyword beside "{key}")',
                )
        alts = node[key]
        if not isinstance(alts, list) or not alts:
            self.error(path, key, f'{path}: "{key}" must be a non-empty array of schemas {_REJECTS}')
            return
        if key == "oneOf" and not self.disjoint(alts):
            self.warn(
                path,
                "oneOf",
                f'{path}: "oneOf" is enforced as "anyOf" by the llama.cpp grammar '
                "(exclusivity is not enforced); validation still checks it",
            )
        for i, alt in enumerate(alts):
            self.visit(alt, child_path(child_path(path, key), i), owner=owner)

    def visit_typed(self, node: dict[str, Any], path: str, type_: Any, *, owner: str | None) -> None:
        if type_ is not None and (not isinstance(type_, str) or type_ not in _TYPES):
            self.error(path, "type", f'{path}: "type" {_q(type_)} is not a JSON Schema type {_REJECTS}')
            return
        has_props = _has_properties(node)
        kind: str
        if type_ is None:
            if has_props:
                kind = "object"
            elif "allOf" in node:
                kind = "allOf"
            elif "items" in node or "prefixItems" in node:
                kind = "array"
            elif (
                "pattern" in node
                or "minLength" in node
                or "maxLength" in node
                or (isinstance(node.get("format"), str) and node["format"] in _KNOWN_FORMATS)
            ):
                kind = "string"
            else:
                kind = "any"
        elif type_ == "object":
            kind = "allOf" if not has_props and "allOf" in node else "object"
        elif type_ == "string" and "allOf" in node:
            self.error(
                path,
                "allOf",
                f'{path}: "allOf" under type "string" {SUBSET} '
                '(llama.cpp\'s converter turns it into an object rule that accepts only "{}")',
            )
            return
        else:
            kind = str(type_)
        handler = {
            "object": self.visit_object,
            "array": self.visit_array,
            "string": self.visit_string,
            "integer": self.visit_integer,
            "allOf": self.visit_all_of,
        }.get(kind)
        handled = handler(node, path) if handler is not None else frozenset()
        if kind == "object" and "patternProperties" in node and self.pattern_properties_unused(node):
            handled = handled | {"patternProperties"}
        if kind == "object" and "allOf" in node and self.all_of_implied(node):
            handled = handled | {"allOf"}
        if kind == "allOf" or (kind == "object" and _closed_on_properties(node)):
            # every key generated is declared in "properties" (of the node or of an allOf
            # component, all merged): evaluated, so "unevaluatedProperties" has nothing to check
            handled = handled | {"unevaluatedProperties"}
        relevant = _RELEVANT["object" if kind == "allOf" else kind]
        for key in sorted(node):
            if key in relevant and key not in handled and key != "type" and self.asserts(node, key):
                if kind in ("integer", "number") and key in ("allOf", "if") and _only_number_keywords(node, key):
                    self.warn(
                        path,
                        key,
                        f'{path}: "{key}" under type {_q(kind)} holds only number bounds, which '
                        "the llama.cpp grammar does not enforce; validation still checks them",
                    )
                elif key == "if":
                    self.ignored(path, key, 'llama.cpp ignores "if"/"then"/"else"')
                else:
                    self.ignored(path, key)

    # ------------------------------------------------------------------ kinds

    def visit_object(self, node: dict[str, Any], path: str) -> frozenset[str]:
        props = node.get("properties", {})
        if not isinstance(props, dict):
            self.error(path, "properties", f'{path}: "properties" must be an object {_REJECTS}')
            props = {}
        if node is self.root and "" in props:
            # llama.cpp names the rule of the root's property "" "root": the grammar then
            # generates only that property's value, never the object
            unnamed = child_path(child_path(path, "properties"), "")
            only_object_keywords = all(k in keywords.OBJECT or not self.asserts(node, k) for k in node)
            if (
                "type" not in node
                and only_object_keywords
                and self.implies_type(props[""], ["array", "string", "number", "boolean", "null"])
            ):
                self.visit(props[""], unnamed, owner=None)  # what the root's object keywords never see
                return frozenset(node)
            self.error(
                path,
                "properties",
                f'{unnamed}: a property named "" at the root {SUBSET}: llama.cpp\'s grammar then generates '
                "only that property's value, not the object; rename the property",
            )
        for name in sorted(props):
            self.visit(props[name], child_path(child_path(path, "properties"), name), owner=None)
        if "additionalProperties" in node:
            extra = node["additionalProperties"]
            if isinstance(extra, dict):
                self.visit(extra, child_path(path, "additionalProperties"), owner=None)
            elif not isinstance(extra, bool):
                self.error(
                    path,
                    "additionalProperties",
                    f'{path}: "additionalProperties" must be a boolean or a schema {_REJECTS}',
                )
            if extra is not False and props:
                self.error(
                    path,
                    "additionalProperties",
                    (
                        f'{path}: "additionalProperties" {_q(extra)} beside "properties" {SUBSET}: llama.cpp\'s '
                        'extra-key rule starts with [^"...], which admits a backslash and raw control characters '
                        '(e.g. {"\\q": 1}, not JSON); set it to false or drop "properties"'
                    ),
                )
        self.check_required(node, path, set(props) if "properties" in node else set())
        return frozenset({"properties", "additionalProperties", "required"})

    def all_of_implied(self, node: dict[str, Any]) -> bool:
        """An "allOf" the converter ignores beside "properties" that every generated object
        satisfies anyway: each component says only what :meth:`implied` proves of the closed
        object, or (untyped) what applies only to other types."""
        comps = node["allOf"]
        if not _closed_on_properties(node) or not isinstance(comps, list):
            return False
        own = {k: v for k, v in node.items() if k != "allOf"}
        for listed in comps:
            comp = self.deref(listed)
            if not isinstance(comp, dict):
                return False
            other_types = keywords.NUMBER | keywords.STRING | keywords.ARRAY
            untyped = not any(k in comp for k in ("type", "enum", "const"))
            for key in comp:
                if not self.asserts(comp, key) or self.implied(own, comp, key):
                    continue
                if not (untyped and key in other_types and not _holds_boolean(comp[key])):
                    return False
        return True

    def pattern_properties_unused(self, node: dict[str, Any]) -> bool:
        """On a closed object (llama.cpp generates only declared names; none at all without
        "properties"), patternProperties constrains nothing generated when each declared name
        a pattern matches already has a schema that implies the pattern's (only a "type")."""
        props, patterns = node.get("properties", {}), node["patternProperties"]
        if not isinstance(props, dict) or not isinstance(patterns, dict):
            return False
        if node.get("additionalProperties", not props) is not False:
            return False  # without "properties", only an explicit false closes the object
        for pattern, sub in patterns.items():
            implied_type = sub.get("type") if isinstance(sub, dict) and _only_keyword(sub, "type") else None
            try:
                matched = [name for name in props if search(pattern, name, fallback=True)]
            except (re.error, PatternTooCostly):
                return False
            if matched and (
                implied_type is None or not all(self.implies_type(props[n], implied_type) for n in matched)
            ):
                return False
        return True

    def check_required(self, node: dict[str, Any], path: str, known: set[str]) -> None:
        required = node.get("required")
        if not isinstance(required, list):
            return
        missing = sorted({r for r in required if isinstance(r, str) and r not in known})
        if missing:
            names = ", ".join(_q(m) for m in missing)
            self.error(
                path,
                "required",
                f'{path}: "required" {names} without a schema in "properties" {SUBSET}: '
                "llama.cpp only generates listed properties, so it cannot enforce it",
            )

    def visit_array(self, node: dict[str, Any], path: str) -> frozenset[str]:
        for bound in ("minItems", "maxItems"):
            if bound in node and not _count(node[bound]):
                self.error(path, bound, f'{path}: "{bound}" must be a non-negative integer {_REJECTS}')
        key: str | None = "items" if "items" in node else "prefixItems" if "prefixItems" in node else None
        if key == "items" and "prefixItems" in node:
            self.error(
                path,
                "prefixItems",
                unsupported(
                    path, "prefixItems", 'llama.cpp uses "items" for every element and ignores "prefixItems" beside it'
                ),
            )
        if key is None:
            return frozenset({"minItems", "maxItems"})
        # a tuple "items" is generated with exactly its elements: "additionalItems" holds
        handled = frozenset({"items", "prefixItems", "minItems", "maxItems", "additionalItems"})
        items = node[key]
        if isinstance(items, list):
            for i, item in enumerate(items):
                self.visit(item, child_path(child_path(path, key), i), owner=None)
            self.check_tuple_bounds(node, path, len(items))
            return handled
        self.visit(items, child_path(path, key), owner=None)
        return handled

    def check_tuple_bounds(self, node: dict[str, Any], path: str, n: int) -> None:
        # A tuple is generated with exactly n elements; the converter ignores min/maxItems.
        lo: Any = node.get("minItems")
        hi: Any = node.get("maxItems")
        too_few = _count(lo) and int(lo) > n
        too_many = _count(hi) and int(hi) < n
        for key, bad in (("minItems", too_few), ("maxItems", too_many)):
            if bad:
                self.error(
                    path,
                    key,
                    unsupported(
                        path, key, f"llama.cpp ignores it on a tuple and always generates exactly {n} element(s)"
                    ),
                )

    def visit_string(self, node: dict[str, Any], path: str) -> frozenset[str]:
        fmt = node.get("format")
        if "format" in node and not isinstance(fmt, str):
            self.error(path, "format", f'{path}: "format" must be a string {_REJECTS}')
        for key in ("minLength", "maxLength"):
            if key in node and not _count(node[key]):
                self.error(path, key, f'{path}: "{key}" must be a non-negative integer {_REJECTS}')
        if "pattern" in node:
            self.check_pattern(node["pattern"], path)
            for key in ("format", "maxLength", "minLength"):
                if key in node:
                    self.ignored(path, key, 'llama.cpp ignores it beside "pattern"; fold it into the pattern')
            return keywords.STRING
        if isinstance(fmt, str) and fmt in _KNOWN_FORMATS:
            fixed = _FIXED_LENGTH.get(fmt)
            for key in ("maxLength", "minLength"):
                if key in node:
                    bound = node[key]
                    implied = (
                        fixed is not None
                        and _count(bound)
                        and (bound <= fixed if key == "minLength" else bound >= fixed)
                    )
                    if not implied:
                        self.ignored(path, key, f'llama.cpp ignores it beside "format": {_q(fmt)}')
            if fmt in ("date", "date-time"):
                self.warn(
                    path,
                    "format",
                    f'{path}: "format": {_q(fmt)} is enforced by llama.cpp\'s grammar only '
                    "as digits in place (it admits 0000-01-01 and 2023-02-31); validation "
                    "still checks the date",
                )
            return keywords.STRING
        if "format" in node and isinstance(fmt, str):
            self.ignored(path, "format", "llama.cpp only knows the formats date, date-time, time and uuid")
        low = node.get("minLength")
        if isinstance(low, int) and _count(low) and low >= 2:
            self.error(
                path,
                "minLength",
                f'{path}: "minLength": {low} {SUBSET}: llama.cpp counts each \\u escape as one character, '
                'so a surrogate pair ("\\ud83d\\ude00", one character) counts twice and a shorter string '
                'gets through; use "minLength": 1 or a pattern',
            )
        return keywords.STRING

    def visit_integer(self, node: dict[str, Any], path: str) -> frozenset[str]:
        handled = set()
        for plain, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            used = plain if plain in node else exclusive if exclusive in node else None
            if used is None:
                continue
            value = node[used]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.error(path, used, f'{path}: "{used}" must be a number {_REJECTS}, got {_q(value)}')
            handled.add(used)
            if used == plain and exclusive in node:
                self.ignored(path, exclusive, f'llama.cpp reads only "{plain}" when both are present')
                handled.add(exclusive)
        lower = next((k for k in ("minimum", "exclusiveMinimum") if k in node), None)
        upper = next((k for k in ("maximum", "exclusiveMaximum") if k in node), None)
        if self.int64_bounds(node, path, lower, upper):
            return frozenset(handled)
        if (lower is None) != (upper is None):
            key = lower or upper
            assert key is not None
            value = node[key]
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and value == int(value)
                and not _one_sided_exact(int(value), lower is not None, key.startswith("exclusive"))
            ):
                self.error(
                    path,
                    key,
                    (
                        f'{path}: "{key}": {_q(value)} without the other bound {SUBSET}: llama.cpp\'s one-sided '
                        "integer range is not exact for it (maximum -5 admits -01, minimum 100 admits 10-19); "
                        "give both bounds"
                    ),
                )
        return frozenset(handled)

    def int64_bounds(self, node: dict[str, Any], path: str, lower: str | None, upper: str | None) -> bool:
        """The integer bounds as llama.cpp's converter reads them, as 64-bit integers: an error
        for a bound it reads as another, a ``runaway`` one for bounds it makes a grammar of that
        llama-server's parser never finishes reading. True when either was found."""
        read = {
            key: _int64_readings(node[key], key)
            for key in (lower, upper)
            if key is not None and not isinstance(node[key], bool) and isinstance(node[key], (int, float))
        }
        if not read:
            return False
        lows = read.get(lower or "", (_I64_MIN,))
        highs = read.get(upper or "", (_I64_MAX,))
        runaway = next((k for lo in lows for hi in highs if (k := _runaway(lower, lo, upper, hi))), None)
        found = False
        for key, readings in read.items():
            value = node[key]
            if key == runaway:
                message = (
                    f'{path}: "{key}": {_q(value)} {SUBSET}: llama.cpp writes the range it reads (64-bit integers) '
                    "with a repeat whose minimum passes its maximum, which llama-server's grammar parser never "
                    f"finishes reading (memory without end); give both bounds, each within ±{_INT64_BOUND:,}"
                )
                self.findings.append(Violation(path, key, message, runaway=True))
            elif readings != (_exact_bound(value, key),):
                self.error(
                    path,
                    key,
                    f'{path}: "{key}": {_q(value)} {SUBSET}: llama.cpp reads it as a 64-bit integer, '
                    f"{' or '.join(map(str, readings))}; keep bounds within ±{_INT64_BOUND:,}",
                )
            else:
                continue
            found = True
        return found

    def visit_all_of(self, node: dict[str, Any], path: str) -> frozenset[str]:
        # The converter merges allOf components by hand: only object components' properties
        # (all made required, object closed) or, when every component is an enum, the
        # intersection of the enums. Anything else in a component is dropped.
        comps = node["allOf"]
        if not isinstance(comps, list) or not comps:
            self.error(path, "allOf", f'{path}: "allOf" must be a non-empty array of schemas {_REJECTS}')
            return frozenset({"allOf"})
        resolved: list[tuple[Any, str]] = []
        for i, comp in enumerate(comps):
            cpath = child_path(child_path(path, "allOf"), i)
            target = self.follow_component(comp, cpath)
            if target is not None:
                resolved.append(target)
        if not resolved:
            return frozenset({"allOf"})
        if all(isinstance(c, dict) and "enum" in c and "$ref" not in c for c, _ in resolved) and len(resolved) == len(
            comps
        ):
            common = {_q(v) for v in resolved[0][0]["enum"]} if isinstance(resolved[0][0]["enum"], list) else set()
            for comp, _ in resolved[1:]:
                common &= {_q(v) for v in comp["enum"]} if isinstance(comp["enum"], list) else set()
            if not common:
                self.error(path, "allOf", f'{path}: "allOf" of enums with no common value {SUBSET}')
            return frozenset({"allOf"})
        seen: dict[str, str] = {}
        merged = {
            name for comp, _ in resolved if isinstance(comp.get("properties"), dict) for name in comp["properties"]
        }
        for comp, cpath in resolved:
            self.visit_all_of_component(comp, cpath, seen, merged)
        self.check_required(node, path, set(seen))
        return frozenset({"allOf", "required"})

    def follow_component(self, comp: Any, cpath: str) -> tuple[Any, str] | None:
        chain: set[str] = set()
        while isinstance(comp, dict) and "$ref" in comp:
            ref = comp["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/") or ref in chain:
                self.visit(comp, cpath, owner=None)  # reports the bad ref
                return None
            for key in sorted(comp):
                if key != "$ref" and self.asserts_beside_ref(comp, key):
                    self.error(cpath, key, unsupported(cpath, key, 'llama.cpp ignores every keyword beside "$ref"'))
            chain.add(ref)
            resolved = self.resolve(ref)
            if resolved is None:
                self.visit(comp, cpath, owner=None)
                return None
            comp, cpath = resolved
        if isinstance(comp, dict) and ("anyOf" in comp or "oneOf" in comp):
            key = "oneOf" if "oneOf" in comp else "anyOf"
            alts = comp[key]
            if isinstance(alts, list) and alts and all(_optional_object(self.deref(a)) for a in alts):
                # merged as optional properties: every such object is valid against some alternative
                for i, alt in enumerate(alts):
                    self.visit(alt, child_path(child_path(cpath, key), i), owner=None)
                return None
            why = "inside allOf, llama.cpp merges the alternatives into one object with every property optional"
            self.error(cpath, key, unsupported(cpath, key, why))
            return None
        if not isinstance(comp, dict):
            self.visit(comp, cpath, owner=None)
            return None
        return comp, cpath

    def visit_all_of_component(self, comp: dict[str, Any], cpath: str, seen: dict[str, str], merged: set[str]) -> None:
        type_ = comp.get("type")
        has_props = _has_properties(comp)
        is_object = (
            "enum" not in comp
            and "const" not in comp
            and (has_props or type_ == "object")
            and not (type_ is not None and type_ != "object")
        )
        if not is_object:
            # the merged value is an object: keywords that apply only to other types are vacuous
            vacuous = (
                keywords.NUMBER | keywords.STRING | keywords.ARRAY
                if type_ is None and "enum" not in comp
                else frozenset()
            )
            for key in sorted(comp):
                if self.asserts(comp, key) and (key not in vacuous or _holds_boolean(comp[key])):
                    self.error(
                        cpath,
                        key,
                        unsupported(cpath, key, "llama.cpp keeps only the properties of object components of an allOf"),
                    )
            return
        props = comp.get("properties", {})
        if isinstance(props, dict):
            for name in sorted(props):
                ppath = child_path(child_path(cpath, "properties"), name)
                if name in seen:
                    self.error(
                        ppath,
                        "allOf",
                        f'{ppath}: property {_q(name)} in more than one "allOf" component '
                        f"(also {seen[name]}) {SUBSET}: llama.cpp emits the key twice",
                    )
                    continue
                seen[name] = ppath
                self.visit(props[name], ppath, owner=None)
        own = set(props) if isinstance(props, dict) else set()
        for key in sorted(comp):
            if key == "unevaluatedProperties" and merged <= own:
                continue  # every merged key is this component's own: evaluated here
            if self.asserts(comp, key) and key not in ("properties", "required", "type"):
                why = (
                    "llama.cpp closes the merged object and ignores it; it rejects other components' properties"
                    if key == "additionalProperties"
                    else "llama.cpp keeps only the properties of object components of an allOf"
                )
                self.ignored(cpath, key, why)

    # ------------------------------------------------------------------ literals, patterns

    def check_literals(self, node: dict[str, Any], path: str, key: str, values: Sequence[Any]) -> None:
        """``const``/``enum`` win over their siblings; they must all satisfy what is ignored."""
        rest = {k: v for k, v in node.items() if k != key and self.asserts(node, k)}
        if not rest:
            return
        from localllm import _jsonschema

        _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
        import jsonschema
        from referencing.exceptions import Unresolvable

        doc = dict(self.root) if isinstance(self.root, dict) else {}
        doc.update(rest)
        for drop in keywords.ASSERTING - set(rest):
            doc.pop(drop, None)
        from localllm.grammar.compile import _validation_failures, validator_class

        try:
            validator = validator_class(doc)(doc)
            bad = [v for v in values if not validator.is_valid(v)]
        except (jsonschema.exceptions.SchemaError, Unresolvable, *_validation_failures()):
            bad = list(values)
        if bad:
            keys = ", ".join(f'"{k}"' for k in sorted(rest))
            shown = ", ".join(_q(b) for b in bad)
            self.error(
                path,
                key,
                f'{path}: "{key}" beside {keys} {SUBSET}: llama.cpp ignores them, and {shown} does not satisfy them',
            )

    def check_pattern(self, pattern: Any, path: str) -> None:
        if not isinstance(pattern, str):
            self.error(path, "pattern", f'{path}: "pattern" must be a string {_REJECTS}')
            return
        problem = pattern_problem(pattern)
        if problem is None:
            try:
                check_regex(pattern)
            except re.error as exc:
                problem = f"is not a valid regular expression ({exc})"
        if problem is not None:
            self.error(path, "pattern", f"{path}.pattern: {_q(pattern)} {problem}")

    # ------------------------------------------------------------------ oneOf, recursion

    def disjoint(self, alts: Sequence[Any]) -> bool:
        """True when the alternatives provably cannot both match (so anyOf == oneOf)."""
        if len(alts) == 1:
            return True
        targets = []
        for alt in alts:
            node: Any = alt
            seen: set[str] = set()
            while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"] not in seen:
                seen.add(node["$ref"])
                resolved = self.resolve(node["$ref"])
                node = resolved[0] if resolved else None
            if not isinstance(node, dict):
                return False
            targets.append(node)
        literal_sets = [_literals(t) for t in targets]
        if all(s is not None for s in literal_sets) and _pairwise_disjoint([s for s in literal_sets if s is not None]):
            return True
        types = [t.get("type") for t in targets]
        if (
            all(isinstance(t, str) and t in _TYPES for t in types)
            and len(set(types)) == len(types)
            and not {"integer", "number"} <= set(types)
        ):
            return True
        # A discriminated union: one required property with disjoint literal values.
        shared: set[str] | None = None
        for t in targets:
            req = set(t.get("required", [])) if isinstance(t.get("required"), list) else set()
            props: dict[str, Any] = t["properties"] if isinstance(t.get("properties"), dict) else {}
            names = {n for n in req if isinstance(props.get(n), dict) and _literals(props[n]) is not None}
            shared = names if shared is None else shared & names
        for name in sorted(shared or ()):
            sets = [_literals(t["properties"][name]) for t in targets]
            if _pairwise_disjoint([s for s in sets if s is not None]):
                return True
        return False

    def check_left_recursion(self) -> None:
        state: dict[str, int] = {}  # 1 = on the stack, 2 = done

        def walk(ref: str) -> None:
            state[ref] = 1
            for nxt, where in self.bare_edges.get(ref, []):
                if state.get(nxt) == 1:
                    self.error(
                        where,
                        "$ref",
                        f'{where}: "$ref": {_q(nxt)} recursing without consuming input '
                        f"(left recursion) {SUBSET}: llama.cpp cannot build the grammar",
                    )
                elif nxt not in state:
                    walk(nxt)
            state[ref] = 2

        for start in ["$", *sorted(self.bare_edges)]:
            if start not in state:
                walk(start)


def _optional_object(alt: Any) -> bool:
    """An object schema with only optional properties that admits extra keys."""
    return (
        isinstance(alt, dict)
        and isinstance(alt.get("properties"), dict)
        and alt.get("type", "object") == "object"
        and not alt.get("required")
        and alt.get("additionalProperties", True) is not False
        and all(k in ("properties", "type") or not _asserts(alt, k) for k in alt)
    )


def _only_number_keywords(node: Mapping[str, Any], key: str) -> bool:
    parts = node[key] if key == "allOf" else [node.get(k) for k in ("if", "then", "else") if k in node]
    if not isinstance(parts, list):
        return False
    return all(isinstance(p, dict) and all(k in keywords.NUMBER or not _asserts(p, k) for k in p) for p in parts)


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
#: bounds within this magnitude llama.cpp's converter reads as written and ranges both ways
_INT64_BOUND = 2**63 - 2
#: a one-sided integer range from this magnitude up may run away: llama.cpp writes the digits
#: after the first of a bound of n digits as ``[0-9]{n - 1,15}`` and, one level down each digit,
#: 14, 13, …: past 15 digits a repeat whose minimum passes its maximum (measured on the pinned
#: server: 999,999,999,999,999 read; 9,999,999,999,999,999 and 10^16 ran away)
_ONE_SIDED_SAFE = 10**15


def _exact_bound(value: float, key: str) -> int | None:
    """The integer bound ``key``: ``value`` stands for (None: not finite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if key == "minimum":
        return math.ceil(value)
    if key == "maximum":
        return math.floor(value)
    return math.floor(value) + 1 if key == "exclusiveMinimum" else math.ceil(value) - 1


def _int64_readings(value: float, key: str) -> tuple[int, ...]:
    """How llama.cpp's converter reads the integer bound ``key``: ``value`` (``get_bound`` in
    ``common/json-schema.cpp``): a JSON integer as an int64 (one from 2^63 to 2^64 - 1, stored
    unsigned, wraps), any other number rounded as a double and cast; then 1 added or taken for
    an exclusive bound, wrapping. Where C++ leaves the cast undefined, both readings machines
    give: -2^63 (x86) and the nearest end of the range (ARM)."""
    if isinstance(value, int) and _I64_MIN <= value < 2**64:
        readings: tuple[int, ...] = (value - 2**64 if value > _I64_MAX else value,)
    else:
        try:
            as_double = float(value)
        except OverflowError:  # an integer past any double: JSON's parser refuses the request
            as_double = math.copysign(math.inf, value)
        if math.isnan(as_double):
            readings = (_I64_MIN, 0)
        elif math.isinf(as_double) or not _I64_MIN <= as_double <= _I64_MAX:
            readings = (_I64_MIN, _I64_MAX if as_double > 0 else _I64_MIN)
        else:
            readings = (math.ceil(as_double) if key in ("minimum", "exclusiveMaximum") else math.floor(as_double),)
    step = {"exclusiveMinimum": 1, "exclusiveMaximum": -1}.get(key, 0)
    return tuple(dict.fromkeys((r + step - _I64_MIN) % 2**64 + _I64_MIN for r in readings))


def _runaway(lower: str | None, lo: int, upper: str | None, hi: int) -> str | None:
    """The bound whose range llama.cpp writes with a repeat its parser never finishes reading.

    As its ``build_min_max_int`` branches: -2^63 as the minimum, 2^63 - 1 as the maximum mean
    no bound (neither: a plain integer; a bound negated to -2^63, wrapping, neither too: an
    error); a range of two negatives is built as the negated range, two bounds otherwise digit
    by digit (safe); a minimum alone from 0 up digit by digit, fewer digits allowed at each
    level (see ``_ONE_SIDED_SAFE``), below 0 as a range up to its negation (safe); a maximum
    alone from 0 up as a range (safe), below 0 as a minimum alone of its negation.
    """
    has_min, has_max = lo != _I64_MIN, hi != _I64_MAX
    if has_min and has_max:  # two negatives: negated, 1 - 2^63 becomes 2^63 - 1, no maximum
        return lower if hi < 0 and lo == _I64_MIN + 1 and _neg(hi) >= _ONE_SIDED_SAFE else None
    if has_min:
        return lower if lo >= _ONE_SIDED_SAFE else None
    if has_max and hi < 0:
        return upper if _neg(hi) >= _ONE_SIDED_SAFE else None
    return None


def _neg(value: int) -> int:
    """``-value`` as an int64 in C++ (wrapping: -(-2^63) is -2^63)."""
    return (-value - _I64_MIN) % 2**64 + _I64_MIN


def _one_sided_exact(bound: int, is_min: bool, exclusive: bool) -> bool:
    """Is llama.cpp's grammar for an integer with only this bound exact?

    Its digit-by-digit construction recurses on the digits after the first as a number, so
    a zero among the inner digits loses a digit position (minimum 100 admits 10-19,
    minimum 1024 admits 124); below zero, an upper bound is built as a lower bound on the
    magnitude without the leading-digit guard (maximum -5 admits -01), unless the
    magnitude starts with 1 and has at least two digits.
    """
    if exclusive:
        bound = bound + 1 if is_min else bound - 1
    if is_min:
        return bound <= 9 or "0" not in str(bound)[1:-1]
    if bound >= 0:
        return True
    digits = str(-bound)
    return len(digits) >= 2 and digits[0] == "1" and "0" not in digits[1:-1]


def _closed_on_properties(node: Mapping[str, Any]) -> bool:
    """llama.cpp generates only the keys of "properties" (no extra-key rule)."""
    return isinstance(node.get("properties"), dict) and node.get("additionalProperties", False) is False


def _only_keyword(node: Mapping[str, Any], key: str) -> bool:
    return key in node and all(k == key or not _asserts(node, k) for k in node)


def _never(node: Any) -> bool:
    """A subschema nothing is valid against (so a "not" of it constrains nothing)."""
    if node is False:
        return True
    if not isinstance(node, dict) or "not" not in node:
        return False
    inner = node["not"]
    return inner is True or (isinstance(inner, dict) and not any(_asserts(inner, k) for k in inner))


def _holds_boolean(value: Any) -> bool:
    """A boolean anywhere inside a keyword's value: llama.cpp parses subschemas of keywords it
    then drops, and refuses a boolean subschema."""
    if isinstance(value, bool):
        return True
    if isinstance(value, list):
        return any(_holds_boolean(v) for v in value)
    return isinstance(value, dict) and any(_holds_boolean(v) for v in value.values())


def _has_properties(node: Mapping[str, Any]) -> bool:
    """The converter's test for "this is an object schema" when no type says so."""
    return "properties" in node or ("additionalProperties" in node and node["additionalProperties"] is not True)


def _asserts(node: Mapping[str, Any], key: str) -> bool:
    """Does ``key`` constrain anything in ``node``? :func:`keywords.asserts`, and no-ops it
    does not know: a "not" of nothing; "unevaluatedItems" beside "items" (a schema) and
    "unevaluatedProperties" beside "additionalProperties" (they evaluate every element and
    key); "additionalItems" without a tuple "items" (validation ignores it)."""
    if not keywords.asserts(node, key):
        return False
    if key == "not" and _never(node[key]):
        return False
    if key == "unevaluatedItems" and isinstance(node.get("items"), (dict, bool)):
        return False
    if key == "additionalItems" and not isinstance(node.get("items"), list):
        return False
    return not (key == "unevaluatedProperties" and "additionalProperties" in node)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _literals(node: dict[str, Any]) -> set[str] | None:
    if "const" in node:
        return {_q(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_q(v) for v in node["enum"]}
    return None


def _pairwise_disjoint(sets: Iterable[set[str]]) -> bool:
    union: set[str] = set()
    for s in sets:
        if union & s:
            return False
        union |= s
    return True


# ---------------------------------------------------------------------------- patterns
# A port of the scanner in llama.cpp's _pattern_to_rule: it decides which patterns the
# converter turns into grammar and which it degrades to "any string" (or rejects).

_NON_LITERAL = frozenset("|.()[]{}*+?^$")
_ESCAPED_LITERALS = frozenset("^$.[]()|{}*+?")
_HINTS = {
    "d": "use [0-9]",
    "w": "use [A-Za-z0-9_]",
    "s": "use an explicit class such as [ \\t]",
    "b": "remove it (word boundaries have no grammar equivalent)",
    "D": "use [^0-9]",
    "W": "use [^A-Za-z0-9_]",
    "S": "use an explicit class",
    "B": "remove it",
}


class _Unsupported(Exception):
    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint


class _Invalid(Exception):
    pass


def _escape_length(s: str, pos: int) -> int:
    if pos + 1 >= len(s) or s[pos] != "\\":
        return 0
    nxt = s[pos + 1]
    n_hex = {"x": 2, "u": 4, "U": 8}.get(nxt)
    if n_hex is None:
        return 2 if nxt in 'trn\\"[]-' else 0
    digits = s[pos + 2 : pos + 2 + n_hex]
    if len(digits) != n_hex or not all(c in "0123456789abcdefABCDEF" for c in digits):
        return 0
    return 2 + n_hex


def _escape_problem(s: str, pos: int, in_class: bool) -> _Unsupported:
    esc = s[pos : pos + 2]
    hint = _HINTS.get(
        esc[1:],
        "write the character unescaped or as \\xHH"
        if not in_class
        else 'inside [...] only \\t \\r \\n \\\\ \\" \\[ \\] \\- \\xHH \\uHHHH are understood',
    )
    where = " inside [...]" if in_class else ""
    return _Unsupported(f'uses "{esc}"{where}', hint)


def _group_problem(rest: str) -> _Unsupported:
    if rest.startswith(("?=", "?!")):
        what = "a lookahead"
    elif rest.startswith(("?<=", "?<!")):
        what = "a lookbehind"
    elif rest.startswith(("?<", "?P<", "?'")):
        what = "a named group"
    elif re.match(r"\?[a-zA-Z-]+[:)]", rest):
        what = "inline flags"
    else:
        what = "an extended group"
    return _Unsupported(f'uses {what} "({rest[:3]}..."', "use plain or (?:...) groups")


def _pattern_hole(s: str) -> str | None:
    """The first construct of an (otherwise supported) pattern body whose characters llama.cpp
    would emit raw where JSON needs an escape: ``.``, a negated class, ``\\\\``, ``\\t``/``\\n``/``\\r``,
    an escape of a quote/backslash/control character, or a literal ``"``."""
    i = 0
    in_class = False
    after_range = False  # in [0-9-_] the second "-" is a literal, not a range
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt == "\\":
                return 'an escaped backslash "\\\\"'
            if nxt in "tnr":
                return f'"\\{nxt}" (a raw control character)'
            if nxt == '"':
                return 'a literal "'
            if nxt in "xu":
                digits = s[i + 2 : i + 4] if nxt == "x" else s[i + 2 : i + 6]
                try:
                    cp = int(digits, 16)
                except ValueError:
                    cp = -1
                if cp >= 0 and (cp < 0x20 or cp in (0x22, 0x5C, 0x7F)):
                    return f'"\\{nxt}{digits}" (a quote, backslash or control character)'
            i += 2
            continue
        if c == '"':
            return 'a literal "'
        if in_class:
            if c == "]":
                in_class = False
            elif c == "-" and not after_range and s[i - 1] not in "[\\" and i + 1 < len(s) and s[i + 1] not in "]\\":
                lo, hi = ord(s[i - 1]), ord(s[i + 1])
                if lo <= 0x22 <= hi or lo <= 0x5C <= hi or lo < 0x20:
                    return f'the range "{s[i - 1]}-{s[i + 1]}" (it spans a quote, backslash or control character)'
                after_range = True
                i += 2
                continue
            after_range = False
        elif c == "[":
            after_range = False
            in_class = True
            if s.startswith("^", i + 1):
                return "a negated class [^...]"
            if s.startswith("]", i + 1):
                i += 1
        elif c == ".":
            return '"." (any character)'
        i += 1
    return None


def pattern_problem(pattern: str) -> str | None:
    """Why llama.cpp would not enforce ``pattern`` (message tail), or None if it would."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        return 'is not anchored (^...$): llama.cpp ignores the pattern and accepts any string; anchor it as "^...$"'
    s = pattern[1:-1]
    n = len(s)
    pos = 0
    depth = 0

    def transform() -> None:
        nonlocal pos, depth
        seq = 0
        while pos < n:
            c = s[pos]
            if c == ".":
                seq += 1
                pos += 1
            elif c == "(":
                pos += 1
                if pos < n and s[pos] == "?":
                    if pos + 1 < n and s[pos + 1] == ":":
                        pos += 2
                    else:
                        raise _group_problem(s[pos : pos + 4])
                depth += 1
                if depth > 100:
                    raise _Unsupported("nests groups deeper than 100 levels")
                transform()
                seq += 1
            elif c == ")":
                pos += 1
                if depth == 0:
                    raise _Invalid("unbalanced parentheses")
                depth -= 1
                return
            elif c in "^$":
                raise _Unsupported(f'uses "{c}" inside the pattern', "anchor only the whole pattern")
            elif c == "[":
                pos += 1
                while pos < n and s[pos] != "]":
                    if s[pos] == "\\":
                        length = _escape_length(s, pos)
                        if length == 0:
                            raise _escape_problem(s, pos, in_class=True)
                        pos += length
                    else:
                        pos += 1
                if pos >= n:
                    raise _Invalid("unterminated character class")
                pos += 1
                seq += 1
            elif c == "|":
                seq += 1
                pos += 1
            elif c in "*+?":
                if seq == 0:
                    raise _Invalid("nothing to repeat")
                pos += 1
            elif c == "{":
                end = s.find("}", pos + 1)
                if end < 0:
                    raise _Unsupported("has an unterminated {...}")
                nums = s[pos + 1 : end].split(",")
                pos = end + 1
                if len(nums) not in (1, 2):
                    raise _Unsupported("has a {...} repetition llama.cpp cannot read", "use {n}, {n,} or {n,m}")
                wanted = nums if len(nums) == 1 else [x for x in nums if x]
                if not all(re.match(r"\s*[+-]?\d", x) for x in wanted):
                    raise _Unsupported("has a {...} repetition llama.cpp cannot read", "use {n}, {n,} or {n,m}")
                if seq == 0:
                    raise _Invalid("nothing to repeat")
            else:
                consumed = 0
                while pos < n:
                    ch = s[pos]
                    if ch == "\\":
                        if pos == n - 1:
                            raise _Invalid("trailing backslash")
                        if s[pos + 1] in _ESCAPED_LITERALS:
                            pos += 2
                        else:
                            length = _escape_length(s, pos)
                            if length == 0:
                                raise _escape_problem(s, pos, in_class=False)
                            pos += length
                        consumed += 1
                    elif ch == '"' or (
                        ch not in _NON_LITERAL
                        and (pos == n - 1 or consumed == 0 or s[pos + 1] == "." or s[pos + 1] not in _NON_LITERAL)
                    ):
                        pos += 1
                        consumed += 1
                    else:
                        break
                if consumed == 0:
                    raise _Unsupported(f'has a stray "{c}"', f"escape it as \\{c}")
                seq += 1

    try:
        transform()
        if depth != 0:
            raise _Invalid("unbalanced parentheses")
        hole = _pattern_hole(s)
        if hole:
            return (
                f"uses {hole}: llama.cpp copies pattern characters raw into the JSON string, so the "
                'answer can hold a raw " or \\ or control character (e.g. "^.+$" admits "a"b", not JSON); '
                "list the allowed characters explicitly, without quote, backslash or control characters"
            )
    except _Unsupported as exc:
        tail = f"; {exc.hint}" if exc.hint else ""
        return f"{exc.what}, which llama.cpp cannot turn into grammar (it accepts any string instead){tail}"
    except _Invalid as exc:
        return f"is not a valid pattern for llama.cpp ({exc}); the request fails"
    return None
