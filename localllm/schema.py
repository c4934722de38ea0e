"""JSON Schema loading (file ``$ref``s rooted at the config directory) and validation.

Schemas are loaded and compiled once per ``SchemaSet`` (one per Config). File ``$ref``s
resolve relative to the referring schema's file and must stay inside the root directory;
an absolute, remote or escaping ref is a load-time problem (:func:`ref_problems`), never a
call-time surprise. Validation failures become ``AgentError(schema_invalid)`` with the
JSON path of the offending value and the failed constraint.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urlparse

from localllm._fs import TEXT_LIMIT, read_capped
from localllm.errors import AgentError, ErrorKind, SchemaError, truncate_detail

_MISSING = object()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``/``Infinity``/``-Infinity`` (Python accepts them;
    JSON, the trace and every other reader do not), and nesting deeper than Python's decoder
    goes as a ``ValueError`` like any other malformed text, not a ``RecursionError``."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply for the JSON decoder") from None


def unreadable(path: Path, exc: Exception) -> SchemaError:
    """The SchemaError for a path that cannot be opened (printable even for a surrogate in it)."""
    text = f"{str(path)[:300]}: cannot read schema file: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
    return SchemaError(text, hint="pass the path of a JSON Schema file inside the config directory")


#: what most often causes each of the decoder's messages, and the fix
_JSON_FIXES = (
    (
        "Expecting property name",
        "a key must be a double-quoted string: remove a trailing comma before }, or change 'key' to \"key\"",
    ),
    (
        "Expecting value",
        "a value is missing there: remove a trailing comma, a comment (JSON has none), or change 'text' to \"text\"",
    ),
    ("Expecting ',' delimiter", "add the comma between the two items (or close the bracket before)"),
    ("Expecting ':' delimiter", "put a colon between the key and its value"),
    ("Unterminated string", "close the string with a double quote"),
    ("Invalid control character", "write a newline or tab inside a string as \\n or \\t"),
    ("Invalid \\escape", "write a backslash inside a string as \\\\"),
    ("Extra data", "one JSON document per file: remove what follows the first one"),
)


def invalid_json(path: Path, text: str, exc: json.JSONDecodeError) -> SchemaError:
    """The SchemaError for a file that is not JSON: the line and column, the line itself, the fix."""
    lines = text.split("\n")  # the decoder counts lines by \n alone (splitlines also splits at U+2028)
    line = lines[exc.lineno - 1] if exc.lineno <= len(lines) else ""
    shown = line.strip()
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    fix = next((f for start, f in _JSON_FIXES if exc.msg.startswith(start)), "fix the JSON there")
    near = f" (near {shown!r})" if shown else ""
    error = SchemaError(
        f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}{near}",
        hint=f"{fix} (line {exc.lineno}, column {exc.colno})",
    )
    error.line, error.column = exc.lineno, exc.colno
    return error


def read_schema_file(path: Path) -> dict[str, Any]:
    """Read one schema file; ``SchemaError`` names the file and the problem."""
    try:
        text = read_capped(path, TEXT_LIMIT, regular=True).decode("utf-8")
    except FileNotFoundError as exc:
        raise SchemaError(
            f"{path}: schema file not found", hint="fix the path (relative to the config file, or to where you run it)"
        ) from exc
    except (OSError, UnicodeError, ValueError) as exc:  # ValueError: a NUL in the path; UnicodeError: a surrogate
        raise unreadable(path, exc) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid_json(path, text, exc) from exc
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: a schema must be a JSON object, got {type(data).__name__}")
    return data


_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas", "patternProperties"})


def _iter_refs(node: Any, pointer: str = "$", *, names: bool = False) -> Iterator[tuple[str, str]]:
    """Yield (json-path, ref) for every ``$ref`` string in ``node`` (``names``: ``node`` maps
    names to subschemas, so a property *named* ``enum`` is a subschema, not data)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not names:
            yield pointer, ref
        for key in sorted(node):
            if not names and key in ("const", "enum", "default", "examples"):
                continue  # data, not subschemas
            yield from _iter_refs(node[key], f"{pointer}.{key}", names=not names and key in _SCHEMA_MAPS)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _iter_refs(item, f"{pointer}[{i}]")


def _resolve_pointer(doc: Any, fragment: str) -> Any:
    if fragment in ("", "/"):
        return doc
    if not fragment.startswith("/"):
        return _MISSING  # anchors are not supported
    node = doc
    for raw in fragment[1:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")  # a URI fragment: %20 first
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def ref_problems(schema_path: Path, root: Path) -> list[str]:
    """Every unresolvable or out-of-tree ``$ref`` reachable from ``schema_path``.

    Returns messages like ``$.properties.a: $ref "../x.json" points outside <root>``;
    an empty list means every reference resolves inside ``root``.
    """
    root = root.resolve()
    problems: list[str] = []
    docs: dict[Path, Any] = {}

    def load(path: Path) -> Any:
        """The parsed file (each read once); ``_MISSING`` after recording why not."""
        if path not in docs:
            try:
                docs[path] = read_schema_file(path)
            except SchemaError as exc:
                problems.append(str(exc))
                docs[path] = _MISSING
        return docs[path]

    pending = [schema_path.resolve()]
    checked: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in checked:
            continue
        checked.add(path)
        doc = load(path)
        if doc is _MISSING:
            continue
        where = path.relative_to(root) if path.is_relative_to(root) else path
        for pointer, ref in _iter_refs(doc):
            url, fragment = urldefrag(ref)
            target_doc = doc
            if url:
                if urlparse(url).scheme or url.startswith("/"):
                    problems.append(
                        f"{where}: {pointer}: $ref {ref!r} is absolute or remote; "
                        "use a path relative to the schema file inside the config directory"
                    )
                    continue
                target = (path.parent / unquote(url)).resolve()
                if not target.is_relative_to(root):
                    problems.append(f"{where}: {pointer}: $ref {ref!r} points outside the config directory {root}")
                    continue
                if not target.is_file():
                    problems.append(f"{where}: {pointer}: $ref {ref!r}: file {target} not found")
                    continue
                pending.append(target)
                target_doc = load(target)
                if target_doc is _MISSING:
                    continue
            if fragment and _resolve_pointer(target_doc, fragment) is _MISSING:
                problems.append(f"{where}: {pointer}: $ref {ref!r} does not resolve")
    return problems


class SchemaSet:
    """Schemas of one config, loaded and compiled once, with file refs rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._lock = threading.Lock()
        self._docs: dict[Path, dict[str, Any]] = {}
        self._validators: dict[str, Any] = {}

    def load(self, path: Path) -> dict[str, Any]:
        """The parsed schema at ``path`` (relative paths resolve against the root)."""
        full = (self.root / path).resolve() if not path.is_absolute() else path.resolve()
        with self._lock:
            doc = self._docs.get(full)
            if doc is None:
                doc = read_schema_file(full)
                self._docs[full] = doc
            return doc

    def _registry(self, dialect: Any) -> Any:
        """A registry serving files under the root; a file without ``$schema`` (the common
        case) is read in ``dialect``, the referring schema's."""
        from referencing import Registry, Resource
        from referencing.exceptions import NoSuchResource

        root = self.root

        def retrieve(uri: str) -> Resource[Any]:
            parsed = urlparse(uri)
            if parsed.scheme != "file":
                raise NoSuchResource(ref=uri)  # type: ignore[call-arg]
            target = Path(unquote(parsed.path)).resolve()  # as_uri() wrote a space as %20
            if not target.is_relative_to(root):
                raise NoSuchResource(ref=uri)  # type: ignore[call-arg]
            return Resource.from_contents(self.load(target), default_specification=dialect)

        return Registry(retrieve=retrieve)  # type: ignore[call-arg]

    def validator(self, schema: dict[str, Any], *, base: Path | None = None) -> Any:
        """A compiled validator for ``schema`` (cached by content and base)."""
        from localllm import _jsonschema

        _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
        from jsonschema.validators import validator_for

        base = base or self.root / "schema.json"
        key = f"{base}\0{json.dumps(schema, sort_keys=True)}"
        with self._lock:
            cached = self._validators.get(key)
        if cached is not None:
            return cached
        from localllm.grammar.compile import meta_problem

        invalid = meta_problem(schema, formats=False)
        if invalid is not None:  # jsonschema would raise its own AttributeError/TypeError mid-validation
            raise SchemaError(f"{base}: not a valid JSON Schema at {invalid[0]}: {invalid[1]}", hint="fix the schema")
        doc = dict(schema)
        doc.setdefault("$id", base.resolve().as_uri())
        from localllm.grammar.bounded import bounded_validator

        cls = bounded_validator(validator_for(doc))  # patterns, uniqueItems, multipleOf bounded
        from referencing.jsonschema import specification_with

        dialect = specification_with(str(cls.META_SCHEMA.get("$schema") or cls.META_SCHEMA.get("$id")))
        # formats (date, time, date-time, uuid, email, uri, hostname, iri, …: grammar.formats.ASSERTED)
        # are asserted, not just annotated: as strict as the compiled grammar on every path
        from localllm.grammar.formats import format_checker

        validator = cls(doc, registry=self._registry(dialect), format_checker=format_checker(cls))
        with self._lock:
            self._validators[key] = validator
        return validator

    def validate(self, submission: str | None, schema: dict[str, Any], *, base: Path | None = None) -> Any:
        """Parse and validate a raw submission; return the parsed value.

        Raises ``AgentError(schema_invalid)``: absent (``None``) and JSON ``null`` get
        different details; a parse error quotes the head of the text.
        """
        if submission is None:
            raise AgentError(ErrorKind.SCHEMA_INVALID, "no submission: the agent returned nothing")
        try:
            value = loads_json(submission)
        except ValueError as exc:
            raise AgentError(
                ErrorKind.SCHEMA_INVALID,
                f"submission is not valid JSON ({exc}): {truncate_detail(submission)}",
            ) from exc
        from referencing.exceptions import Unresolvable

        from localllm.grammar.pattern import PatternTooCostly

        validator = self.validator(schema, base=base)
        try:
            errors = sorted(validator.iter_errors(value), key=lambda e: (list(e.absolute_path), e.validator))
        except re.error as exc:  # an ECMA-only pattern (named groups, inline flags) Python cannot compile
            detail = f"the schema's pattern cannot be checked ({exc}); rewrite it without ECMA-only syntax"
            raise AgentError(ErrorKind.SCHEMA_INVALID, detail) from exc
        except RecursionError:  # a recursive schema and an answer nested hundreds of levels deep
            detail = "the submission nests too deeply to validate against this recursive schema"
            raise AgentError(ErrorKind.SCHEMA_INVALID, detail) from None
        except PatternTooCostly as exc:  # a huge repeat searched unanchored in a long answer
            raise AgentError(ErrorKind.SCHEMA_INVALID, f"a pattern of the schema cannot be checked: {exc}") from None
        except Unresolvable as exc:  # the schema's fault, not the answer's
            where = base or "the schema"
            raise SchemaError(
                f"{where}: a $ref cannot be resolved: {exc}",
                hint="keep $ref targets as files inside the config directory",
            ) from exc
        if errors:
            first = errors[0]
            path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
            got = "null" if value is None and not first.absolute_path else None
            detail = f"{path}: {first.validator} constraint failed: {first.message}"
            if got:
                detail = f"{path}: submission is JSON null: {first.message}"
            if len(errors) > 1:
                detail += f" (and {len(errors) - 1} more)"
            raise AgentError(ErrorKind.SCHEMA_INVALID, truncate_detail(detail, 512))
        return value
