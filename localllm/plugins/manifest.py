"""``plugin.json`` (Agent Plugins 1.0.0 §5): the one file whose failure rejects a plugin.

Fatal: missing, unreadable, not JSON, not an object, an unsupported ``$schema``, or any
schema violation (including the §5.5 name rules). Non-fatal, per §5.2 and §8.1: an
unknown top-level field and a non-object ``extensions`` are reported and ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

from localllm.errors import truncate_detail
from localllm.plugins import files
from localllm.plugins.diagnostics import Diagnostic, origin_of
from localllm.plugins.result import PluginAuthor, PluginManifest
from localllm.plugins.schemas import PLUGIN_SCHEMA_ID, SCHEMA_ID_PATTERN, plugin_schema

MANIFEST_FILE = "plugin.json"
SECTION = "manifest"

_KNOWN_FIELDS = frozenset(
    (
        "$schema",
        "name",
        "version",
        "description",
        "author",
        "homepage",
        "repository",
        "license",
        "keywords",
        "extensions",
    )
)
# Same rule as the schema's pattern, but matched with fullmatch: the schema's ``$`` would
# also accept a trailing newline under Python's re.search.
_NAME = re.compile(r"(?!.*(?:--|\.\.))[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?")
NAME_RULES = (
    "1-64 characters of a-z, 0-9, '-' and '.', starting and ending with a letter or digit, without '--' or '..'"
)


def valid_plugin_name(name: object) -> bool:
    """True if ``name`` satisfies the §5.5 plugin name constraints."""
    return isinstance(name, str) and 1 <= len(name) <= 64 and _NAME.fullmatch(name) is not None


def schema_version(identifier: object, kind: str) -> str | None:
    """The Agent Plugins version in a canonical ``$schema`` identifier of ``kind``, else None."""
    if not isinstance(identifier, str):
        return None
    m = re.fullmatch(SCHEMA_ID_PATTERN[1:-1], identifier)
    return m.group(1) if m and m.group(2) == kind else None


def load_manifest(root: Path, shown_root: Path) -> tuple[PluginManifest | None, list[Diagnostic]]:
    """Load and validate ``plugin.json``; ``None`` means the plugin is rejected.

    ``root`` is the filesystem-resolved root; ``shown_root`` the path as the caller gave it
    (used in origins so messages name what the user typed).
    """
    path = shown_root / MANIFEST_FILE
    where = str(path)
    probe = files.probe_location(root / MANIFEST_FILE, root, section=SECTION, want_dir=False, clause="5.1")
    if isinstance(probe, files.Missing):
        return None, [
            Diagnostic(
                SECTION,
                "manifest-missing",
                where,
                f"no {MANIFEST_FILE} in {shown_root}; every plugin needs one (§4.1)",
                clause="5.1",
            )
        ]
    if probe is not None:
        return None, [_reorigin(probe, where)]
    text = files.read_text(root / MANIFEST_FILE, section=SECTION, clause="5.1")
    if isinstance(text, Diagnostic):
        return None, [_reorigin(text, where)]
    parsed = files.parse_json(text, path, section=SECTION, rule="manifest-invalid-json", clause="5.2")
    if isinstance(parsed, Diagnostic):
        return None, [parsed]
    diagnostics = list(parsed.warnings)
    data = parsed.value
    if not isinstance(data, dict):
        diagnostics.append(
            Diagnostic(
                SECTION,
                "manifest-not-object",
                where,
                f"{MANIFEST_FILE} must contain a JSON object, not {_json_type(data)}",
                clause="5.2",
            )
        )
        return None, diagnostics

    declared = data.get("$schema")
    if declared != PLUGIN_SCHEMA_ID:
        diagnostics.append(_schema_problem(declared, where))
        return None, diagnostics

    cleaned: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _KNOWN_FIELDS:
            diagnostics.append(
                Diagnostic(
                    SECTION,
                    "manifest-unknown-field",
                    origin_of(where, key),
                    f'unknown top-level field {key!r} ignored; client-specific data belongs under "extensions" (§5.2)',
                    severity="warning",
                    clause="5.2",
                )
            )
            continue
        cleaned[key] = value
    if "extensions" in cleaned:
        ext = cleaned["extensions"]
        if not isinstance(ext, dict):
            diagnostics.append(
                Diagnostic(
                    SECTION,
                    "manifest-extensions-not-object",
                    origin_of(where, "extensions"),
                    f'"extensions" must be an object keyed by reverse-domain namespace, not {_json_type(ext)}; '
                    "ignored (§8.1)",
                    severity="warning",
                    clause="8.1",
                )
            )
            del cleaned["extensions"]
        else:
            kept = {}
            for ns, value in ext.items():
                if isinstance(value, dict):
                    kept[ns] = value
                else:
                    diagnostics.append(
                        Diagnostic(
                            SECTION,
                            "manifest-extension-not-object",
                            origin_of(where, "extensions", ns),
                            f"extension namespace {ns!r} must map to an object, not {_json_type(value)}; ignored",
                            severity="warning",
                            clause="8.1",
                        )
                    )
            cleaned["extensions"] = kept

    errors = _schema_errors(cleaned, where)
    if errors:
        return None, diagnostics + errors
    return _build(cleaned), diagnostics


def _schema_problem(declared: object, where: str) -> Diagnostic:
    origin = origin_of(where, "$schema")
    if declared is None:
        return Diagnostic(
            SECTION,
            "manifest-schema-missing",
            origin,
            f'required field "$schema" is missing; set it to {PLUGIN_SCHEMA_ID!r}',
            clause="5.3",
        )
    version = schema_version(declared, "plugin")
    if version is not None:
        return Diagnostic(
            SECTION,
            "manifest-unsupported-version",
            origin,
            f"Agent Plugins version {version} is not supported (this client supports 1.0.0: {PLUGIN_SCHEMA_ID!r})",
            clause="5.2",
        )
    shown = truncate_detail(repr(declared), 120)
    return Diagnostic(
        SECTION,
        "manifest-schema-unrecognized",
        origin,
        f'"$schema" is {shown}, not a recognised plugin manifest identifier; use {PLUGIN_SCHEMA_ID!r}',
        clause="5.2",
    )


def _schema_errors(data: dict[str, Any], where: str) -> list[Diagnostic]:
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    validator = jsonschema.Draft202012Validator(plugin_schema())
    out: list[Diagnostic] = []
    name_reported = False
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        path = [str(p) for p in error.absolute_path]
        if path[:1] == ["name"] or (error.validator == "required" and "'name'" in error.message):
            name_reported = True
            out.append(_name_problem(data.get("name"), where))
            continue
        out.append(
            Diagnostic(
                SECTION,
                "manifest-schema-violation",
                origin_of(where, *path),
                truncate_detail(error.message, 200) + " (plugin.schema.json 1.0.0)",
                clause="5.2",
            )
        )
    if not name_reported and not valid_plugin_name(data.get("name")):
        out.append(_name_problem(data.get("name"), where))
    return _dedupe(out)


def _name_problem(name: object, where: str) -> Diagnostic:
    origin = origin_of(where, "name")
    if name is None:
        return Diagnostic(SECTION, "manifest-name-missing", origin, 'required field "name" is missing', clause="5.3")
    shown = truncate_detail(repr(name), 80)
    return Diagnostic(
        SECTION,
        "manifest-name-invalid",
        origin,
        f"plugin name {shown} is invalid: use {NAME_RULES} (§5.5)",
        clause="5.5",
    )


def _dedupe(items: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[Diagnostic] = set()
    out = []
    for d in items:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _build(data: dict[str, Any]) -> PluginManifest:
    author = data.get("author")
    return PluginManifest(
        name=data["name"],
        schema=data["$schema"],
        version=data.get("version"),
        description=data.get("description"),
        author=PluginAuthor(author.get("name"), author.get("email"), author.get("url"))
        if isinstance(author, dict)
        else None,
        homepage=data.get("homepage"),
        repository=data.get("repository"),
        license=data.get("license"),
        keywords=tuple(data.get("keywords", ())),
        extensions=MappingProxyType(dict(data.get("extensions", {}))),
    )


def _reorigin(d: Diagnostic, where: str) -> Diagnostic:
    # Probing used the resolved root; report the path the user gave.
    return Diagnostic(d.component, d.rule, where, d.message, d.severity, d.clause)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
