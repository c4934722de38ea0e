"""JSON Schema loading (file ``$ref``s rooted at the config directory) and validation.

Schemas are loaded and compiled once per ``SchemaSet`` (one per Config). File ``$ref``s
resolve relative to the referring schema's file (or the enclosing ``$id``, as validation
resolves them) and must stay inside the root directory; a remote ref no schema in the
document declares, or an escaping one, is a load-time problem (:func:`ref_problems`), never a
call-time surprise. Validation failures become ``AgentError(schema_invalid)`` with the
JSON path of the offending value and the failed constraint.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlparse, urlsplit

from localllm._fs import TEXT_LIMIT, read_capped
from localllm.errors import AgentError, ErrorKind, SchemaError, truncate_detail
from localllm.wire import loads_json, text_problem

_MISSING = object()
#: the errors of one answer read (:meth:`SchemaSet.validate` reports the first, and how many more)
MAX_ERRORS = 100


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
    # Python 3.13's decoder names a trailing comma itself (3.12 and before: "Expecting ...")
    ("Illegal trailing comma", "remove the trailing comma before the closing bracket"),
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
    # json.loads' own extensions, which no other reader of the file takes: NaN and Infinity (a
    # `maximum: NaN` bounded nothing), and a "\ud800" escape, which no UTF-8 answer holds (its
    # grammar failed the request's encoding, "cannot start llama-server")
    if (problem := json_problem(data)) is not None:
        where, why = problem
        raise SchemaError(
            f"{path}: not JSON data at {where}: {why}", hint="write finite numbers and text without lone surrogates"
        )
    return data


_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "dependentSchemas", "patternProperties"})


def json_problem(value: Any) -> tuple[str, str] | None:
    """Where ``value`` is not JSON data, and why (an object's keys before what they hold, else
    in document order): a key that is not a string, a number JSON has not (NaN, an infinity),
    text that is no UTF-8 (:func:`text_problem`), a value of another type. None when it is
    JSON (a tuple is read as a list, as ``json`` does)."""
    from localllm.grammar.paths import child_path

    stack: list[tuple[str, Any]] = [("$", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str):
                    return path, f"the key {key!r} is not a string ({type(key).__name__})"
                if (why := text_problem(key)) is not None:
                    return path, f"the key {key!r} {why}"
            stack.extend((child_path(path, k), v) for k, v in reversed(node.items()))
        elif isinstance(node, (list, tuple)):
            stack.extend((child_path(path, i), v) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, str):
            if (why := text_problem(node)) is not None:
                return path, f"the text {why}"
        elif isinstance(node, float) and not math.isfinite(node):
            return path, f"{node!r} is no JSON number"
        elif node is not None and not isinstance(node, (int, float)):
            return path, f"{type(node).__name__} is no JSON type"
    return None


def _schema_nodes(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (json-path, object) for every object in a schema position of ``node``."""
    for pointer, schema, _ in _scoped_nodes(node, "", None):
        yield pointer, schema


def _scoped_nodes(
    node: Any, base: str, id_of: Callable[[Any], str | None] | None, pointer: str = "$", names: bool = False
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Yield (json-path, object, base URI) for every object in a schema position of ``node``
    (``names``: ``node`` maps names to subschemas, so a property *named* ``enum`` is a
    subschema, not data; ``const``/``enum``/``default``/``examples`` hold data). ``id_of``, a
    dialect's reading of ``$id`` (draft 4: ``id``), moves the base as validation does."""
    if isinstance(node, dict):
        if not names:
            found = id_of(node) if id_of is not None else None
            if isinstance(found, str):
                base = urljoin(base, found.rstrip("#"))  # as referencing's Resolver.in_subresource
            yield pointer, node, base
        for key in sorted(node):
            if not names and key in ("const", "enum", "default", "examples"):
                continue  # data, not subschemas
            yield from _scoped_nodes(node[key], base, id_of, f"{pointer}.{key}", not names and key in _SCHEMA_MAPS)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _scoped_nodes(item, base, id_of, f"{pointer}[{i}]")


def _iter_refs(node: Any) -> Iterator[tuple[str, str]]:
    """Yield (json-path, ref) for every ``$ref`` string in a schema position of ``node``."""
    for pointer, schema in _schema_nodes(node):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            yield pointer, ref


def _shown(path: Path, root: Path) -> Path:
    """``path`` as problems name it: relative to the config directory when inside it."""
    return path.relative_to(root) if path.is_relative_to(root) else path


def _not_a_uri(value: str) -> str | None:
    """Why ``value`` is not a URI reference a ref or ``$id`` can hold (``None``: it is one)."""
    if "\x00" in unquote(value):
        return "it holds a NUL character"
    try:
        urlsplit(value)
    except ValueError as exc:  # "http://[x": Invalid IPv6 URL
        return str(exc)
    return None


def _uri_problems(doc: Any, where: object, id_key: str = "$id") -> list[str]:
    """Each ``$ref``, ``$id`` (``id_key``: draft 4 spells it ``id``) or anchor of ``doc`` that
    is not a string URI reference (resolving through it would raise), named in ``where``."""
    found = []
    for pointer, node in _schema_nodes(doc):
        for key in (id_key, "$ref", "$dynamicRef", "$anchor", "$dynamicAnchor"):
            if key in node:
                value = node[key]
                bad = _not_a_uri(value) if isinstance(value, str) else f"not a string: {value!r}"
                if bad:
                    found.append(f"{where}: {pointer}.{key}: {bad}; a {key} must be a URI reference")
    return found


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


def ref_problems(schema_path: Path, root: Path, read: Callable[[Path], dict[str, Any]] = read_schema_file) -> list[str]:
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
                docs[path] = read(path)
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
        where = _shown(path, root)
        bad = _uri_problems(doc, where)
        if bad:
            problems.extend(bad)
            continue
        if any(_needs_registry(node) for _, node in _schema_nodes(doc)):
            # resolve as validation does (referencing, whose import the plain case does without)
            return _resolved_ref_problems(schema_path.resolve(), root, read)
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


#: keywords that give a schema a base URI or a name of its own: a file holding one is not
#: copied into another document (its refs would resolve against something else there)
_IDENTITY_KEYS = frozenset({"$id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveAnchor", "$recursiveRef"})


def _needs_registry(node: dict[str, Any]) -> bool:
    """Does resolving refs in ``node``'s document take more than files and pointers: an
    ``$id`` (draft 4: ``id``) moving the base, an anchor, or an absolute ref (which may name
    an embedded resource or a meta-schema validation knows)?"""
    ref = node.get("$ref")
    return bool(
        _IDENTITY_KEYS & node.keys()
        or isinstance(node.get("id"), str)
        or (isinstance(ref, str) and urlsplit(ref).scheme)
    )


def _resolved_ref_problems(schema_path: Path, root: Path, read: Callable[[Path], dict[str, Any]]) -> list[str]:
    """:func:`ref_problems` for documents with an ``$id`` or anchor: each ref looked up as
    validation looks it up (from the base its enclosing ``$id``s give, embedded resources and
    anchors found, files read through the same rules as :meth:`SchemaSet._registry`)."""
    from referencing import Registry, Resource, Specification
    from referencing.exceptions import NoSuchResource, Unresolvable
    from referencing.jsonschema import DRAFT202012, specification_with

    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    from jsonschema_specifications import REGISTRY as SPECIFICATIONS

    problems: list[str] = []
    reached: list[Path] = [schema_path]
    dialect: Specification[Any] = DRAFT202012
    try:
        dialect = specification_with(str(read(schema_path).get("$schema", "")), default=DRAFT202012)
    except SchemaError as exc:
        return [str(exc)]

    # each file reached, in its dialect (a file without $schema: the root's); None: unreadable,
    # or an $id that is no URI
    resources: dict[Path, tuple[Resource[Any], Specification[Any]] | None] = {}

    def retrieve(uri: str) -> Resource[Any]:
        parsed = urlparse(uri)
        target = Path(unquote(parsed.path)).resolve()
        if parsed.scheme != "file" or not target.is_relative_to(root) or not target.is_file():
            raise NoSuchResource(ref=uri)  # type: ignore[call-arg]
        if target not in resources:
            resources[target] = resource_of(target)
            reached.append(target)  # its own refs are checked in turn
        found = resources[target]
        if found is None:
            raise NoSuchResource(ref=uri)  # type: ignore[call-arg]
        return found[0]

    def resource_of(path: Path) -> tuple[Resource[Any], Specification[Any]] | None:
        try:
            contents = read(path)
        except SchemaError as exc:
            problems.append(str(exc))
            return None
        spec = specification_with(str(contents.get("$schema", "")), default=dialect)
        where = _shown(path, root)
        id_key = "id" if spec.id_of({"id": "x"}) else "$id"  # draft 4 spells it "id"
        bad = _uri_problems(contents, where, id_key)
        problems.extend(bad)
        return None if bad else (spec.create_resource(contents), spec)

    resources[schema_path] = resource_of(schema_path)
    for path in reached:  # grows as lookups reach other files
        found = resources[path]
        if found is None:
            continue
        resource, spec = found
        # the meta-schemas too: validation resolves a ref to one offline
        registry = SPECIFICATIONS.combine(Registry(retrieve=retrieve)).with_resource(path.as_uri(), resource)  # type: ignore[call-arg]
        with contextlib.suppress(TypeError, AttributeError):
            # a subschema malformed for its dialect (a draft-4 `false`, a draft-7 `dependencies`
            # array) trips referencing's crawl; lookups then crawl only as far as validation does
            registry = registry.crawl()
        where = _shown(path, root)
        for pointer, schema, base in _scoped_nodes(resource.contents, path.as_uri(), spec.id_of):
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                continue
            resolver = registry.resolver(base_uri=base)
            try:
                resolver.lookup(ref)
                continue
            except Unresolvable:
                pass
            except (TypeError, AttributeError) as exc:  # see the crawl above: validation would fail the same way
                problems.append(
                    f"{where}: {pointer}: $ref {ref!r} cannot be looked up: a subschema of the document is "
                    f"malformed for its dialect ({exc})"
                )
                continue
            url = urldefrag(ref)[0]
            target_uri = urldefrag(urljoin(base, url))[0]
            parsed = urlparse(target_uri)
            target = Path(unquote(parsed.path)).resolve()
            if not url or _found(resolver, target_uri):
                problems.append(f"{where}: {pointer}: $ref {ref!r} does not resolve")
            elif parsed.scheme == "file" and not target.is_relative_to(root):
                problems.append(f"{where}: {pointer}: $ref {ref!r} points outside the config directory {root}")
            elif parsed.scheme == "file" and not target.is_file():
                problems.append(f"{where}: {pointer}: $ref {ref!r}: file {target} not found")
            elif parsed.scheme != "file" and not urlparse(url).scheme:
                problems.append(
                    f"{where}: {pointer}: $ref {ref!r} resolves against the $id {base!r} to {target_uri!r}, "
                    "which no schema here declares; drop that $id (refs then resolve against the file) "
                    "or give the ref's target that $id"
                )
            elif parsed.scheme != "file":
                problems.append(
                    f"{where}: {pointer}: $ref {ref!r} is absolute or remote and no schema here declares it "
                    "as its $id; use a path relative to the schema file inside the config directory"
                )
            # else: the file is unreadable or has a bad $id, recorded by retrieve
    return problems


def _found(resolver: Any, uri: str) -> bool:
    from referencing.exceptions import Unresolvable

    try:
        resolver.lookup(uri)
    except Unresolvable:
        return False
    return True


class _NotBundled(Exception):
    pass


def bundle_file_refs(path: Path, root: Path, load: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """The schema at ``path`` as one self-contained document: every file it reaches through
    ``$ref`` copied under its ``$defs`` (keyed by the file's path relative to ``path``'s
    directory, ``..`` left out and ``/`` read as ``.``: ``"common.json"``, ``"shared.ids.json"``)
    and every file ref pointed there (``common.json#/$defs/x`` →
    ``#/$defs/common.json/$defs/x``), so that a plugin, a remote
    model or the grammar compiler, none of which can read the config's files, sees what the
    files say. Validation keeps reading the files themselves.

    The document as loaded when it has no file ref, or when one cannot be made local
    exactly: an ``$id`` or anchor in any file (refs there resolve against it), a file in
    another dialect (``$schema``), a fragment that is not a JSON pointer, or a ref the load
    check refuses (remote, outside ``root``, unreadable) — the load check names those.
    """
    doc = load(path)
    if not any(urldefrag(ref)[0] for _, ref in _iter_refs(doc)):
        return doc
    try:
        return _bundled(path, root.resolve(), doc, load)
    except (_NotBundled, SchemaError, RecursionError, OSError, ValueError):  # ValueError: a ref no URI
        return doc


def _bundled(path: Path, root: Path, doc: dict[str, Any], load: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    import copy

    path = path.resolve()
    out = copy.deepcopy(doc)
    defs = out.setdefault("$defs", {})
    if not isinstance(defs, dict):
        raise _NotBundled
    dialect = doc.get("$schema")
    # draft 3 and 4 spell $id "id"
    id_key = "id" if re.search(r"draft-0[34]/", str(dialect)) else "$id"
    identity = _IDENTITY_KEYS | {id_key}

    def own_id(node: dict[str, Any], here: Path) -> bool:
        """Does the document's ``$id`` name its own file (``"$id": "gate.json"`` in gate.json)?
        Then it moves no base: refs resolve against the file either way."""
        value = node.get(id_key)
        return isinstance(value, str) and urldefrag(urljoin(here.as_uri(), value))[0] == here.as_uri()

    keys: dict[Path, str] = {path: ""}
    pending: list[tuple[Path, dict[str, Any]]] = [(path, out)]

    def key_of(target: Path) -> str:
        if target not in keys:
            if not target.is_relative_to(root):
                raise _NotBundled
            other = copy.deepcopy(load(target))
            if other.get("$schema", dialect) != dialect:
                raise _NotBundled
            other.pop("$schema", None)
            if own_id(other, target):  # copied under $defs, it would make a new base there
                other.pop(id_key)
            # a key any JSON-pointer reader takes literally (llama.cpp's converter does not
            # unescape ~1 or %20): "../shared/people.json" -> "shared.people.json"
            parts = [p for p in Path(os.path.relpath(target, path.parent)).parts if p != ".."]
            name = base = re.sub(r"[^A-Za-z0-9._-]+", "_", ".".join(parts))
            for n in itertools.count(2):
                if name not in defs:
                    break
                name = f"{base}-{n}"
            keys[target], defs[name] = name, other
            pending.append((target, other))
        return keys[target]

    while pending:
        here, node = pending.pop()
        # the objects listed before any ref is rewritten: files copied into $defs meanwhile
        # are walked on their own, with their own base
        for _, schema in list(_schema_nodes(node)):
            if identity & schema.keys() - ({id_key} if schema is out and own_id(out, path) else set()):
                raise _NotBundled
            ref = schema.get("$ref")
            if not isinstance(ref, str):
                continue
            url, fragment = urldefrag(ref)
            if fragment and not fragment.startswith("/"):
                raise _NotBundled  # an anchor
            if url and (urlparse(url).scheme or url.startswith("/")):
                raise _NotBundled
            key = key_of((here.parent / unquote(url)).resolve()) if url else keys[here]
            if key:
                schema["$ref"] = f"#/$defs/{key}{fragment}"
            elif url:
                schema["$ref"] = f"#{fragment}"
    return out


def _error_order(error: Any) -> tuple[list[tuple[int, int, str]], str]:
    """Sort key of a validation error: by instance path, then keyword. An error of a ``false``
    schema has no keyword (``None``, which does not compare with a string)."""
    path = [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error.absolute_path]
    return path, error.validator or ""


class SchemaSet:
    """Schemas of one config, loaded and compiled once, with file refs rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._lock = threading.Lock()
        self._docs: dict[Path, dict[str, Any]] = {}
        self._bundles: dict[Path, dict[str, Any]] = {}
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

    def bundled(self, path: Path) -> dict[str, Any]:
        """The schema at ``path`` with its file refs made local (:func:`bundle_file_refs`):
        what an agent is sent. Validation reads :meth:`load`'s document and the files."""
        full = (self.root / path).resolve() if not path.is_absolute() else path.resolve()
        found = self._bundles.get(full)
        if found is None:
            found = self._bundles.setdefault(full, bundle_file_refs(full, self.root, self.load))
        return found

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
        from localllm.grammar.compile import fan_out, meta_problem

        invalid = meta_problem(schema, formats=False)
        if invalid is not None:  # jsonschema would raise its own AttributeError/TypeError mid-validation
            raise SchemaError(f"{base}: not a valid JSON Schema at {invalid[0]}: {invalid[1]}", hint="fix the schema")
        if costly := fan_out(schema):  # no answer could be checked in time
            raise SchemaError(f"{base}: at {costly[0]}: {costly[1]}", hint="fix the schema")
        from localllm.grammar.bounded import bounded_validator

        cls = bounded_validator(validator_for(schema))  # patterns, uniqueItems, multipleOf bounded
        # the file is the document's retrieval URI: its base, or what a relative $id resolves
        # against (draft 4 reads "id"; a fragment-only draft-7 "$id" is an anchor, left alone)
        doc, id_key = dict(schema), "id" if cls.ID_OF({"id": "x"}) else "$id"
        if problems := _uri_problems(schema, base, id_key):  # resolving through it would raise ValueError
            raise SchemaError(problems[0])
        own = doc.get(id_key)
        if not isinstance(own, str):
            doc[id_key] = base.resolve().as_uri()
        elif urldefrag(own)[0]:
            doc[id_key] = urljoin(base.resolve().as_uri(), own)
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

        from localllm.grammar.bounded import ValidationTooCostly
        from localllm.grammar.pattern import PatternTooCostly

        validator = self.validator(schema, base=base)
        try:
            # the first errors only: 300 empty objects against 20,000 required names made 6 M (18 GiB)
            errors = sorted(itertools.islice(validator.iter_errors(value), MAX_ERRORS + 1), key=_error_order)
        except re.error as exc:  # an ECMA-only pattern (named groups, inline flags) Python cannot compile
            detail = f"the schema's pattern cannot be checked ({exc}); rewrite it without ECMA-only syntax"
            raise AgentError(ErrorKind.SCHEMA_INVALID, detail) from exc
        except RecursionError:  # a recursive schema and an answer nested hundreds of levels deep
            detail = "the submission nests too deeply to validate against this recursive schema"
            raise AgentError(ErrorKind.SCHEMA_INVALID, detail) from None
        except PatternTooCostly as exc:  # a huge repeat searched unanchored in a long answer
            raise AgentError(ErrorKind.SCHEMA_INVALID, f"a pattern of the schema cannot be checked: {exc}") from None
        except ValidationTooCostly as exc:  # subschemas applied again and again (allOf/$ref fan-out)
            raise AgentError(ErrorKind.SCHEMA_INVALID, f"the answer cannot be checked: {exc}") from None
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
            detail = (
                f"{path}: {first.validator or 'false'} constraint failed: {first.message}"  # None: a `false` schema
            )
            if got:
                detail = f"{path}: submission is JSON null: {first.message}"
            if len(errors) > MAX_ERRORS:
                detail += f" (and at least {MAX_ERRORS} more)"
            elif len(errors) > 1:
                detail += f" (and {len(errors) - 1} more)"
            raise AgentError(ErrorKind.SCHEMA_INVALID, truncate_detail(detail, 512))
        return value
