"""``mcp.json`` (Agent Plugins 1.0.0 §7.2): MCP server entries, parsed and checked.

Two blast radii: a bad file (not JSON, bad top level, wrong or mismatched ``$schema``)
disables MCP for the plugin; a bad entry skips that one server. Supported transports
are ``stdio`` and ``streamable-http``; legacy ``sse`` entries are skipped and reported
(§7.2.2 rule 4). Placeholders are expanded here, once; paths are checked lexically and,
for what already exists, through ``realpath`` (spawn re-checks, see ``spawn.py``).
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from localllm._http import is_loopback
from localllm.plugins import files
from localllm.plugins.containment import (
    is_plugin_relative,
    relative_escapes,
    resolve_relative,
    resolves_within,
    within,
)
from localllm.plugins.credentials import looks_like_secret
from localllm.plugins.diagnostics import Diagnostic, origin_of
from localllm.plugins.manifest import schema_version
from localllm.plugins.placeholders import PLUGIN_DATA, PLUGIN_ROOT, expand_placeholders, foreign_placeholders
from localllm.plugins.result import McpServerConfig
from localllm.plugins.schemas import MCP_SCHEMA_ID, mcp_schema

MCP_FILE = "mcp.json"
SECTION = "mcp"
RESERVED_ENV = ("PLUGIN_ROOT", "PLUGIN_DATA")

_STDIO_FIELDS = frozenset(("type", "command", "args", "env", "cwd"))
_REMOTE_FIELDS = frozenset(("type", "url", "headers"))
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_DISABLED = "; MCP is disabled for this plugin (skills and flows still load)"


class _EntryInvalid(Exception):
    """Internal: one server entry is invalid (caught in this module, never escapes)."""

    def __init__(self, rule: str, message: str, pointer: tuple[str, ...] = (), clause: str = "7.2.1") -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.pointer = pointer
        self.clause = clause


class _Context:
    """What parsing one ``mcp.json`` needs to know about its plugin."""

    def __init__(self, root: Path, data_dir: Path, where: str) -> None:
        self.root = root
        self.data_dir = data_dir
        self.where = where

    def expand(self, text: str) -> str:
        return expand_placeholders(text, plugin_root=str(self.root), plugin_data=str(self.data_dir))


def load_mcp(
    root: Path, shown_root: Path, *, manifest_schema: str, data_dir: Path
) -> tuple[list[McpServerConfig], list[Diagnostic]]:
    """Parse ``mcp.json``; a missing file means no servers and no diagnostics."""
    path = shown_root / MCP_FILE
    where = str(path)
    probe = files.probe_location(root / MCP_FILE, root, section=SECTION, want_dir=False, clause="7.2.2")
    if isinstance(probe, files.Missing):
        return [], []
    if probe is not None:
        return [], [_disabled(probe, where)]
    text = files.read_text(root / MCP_FILE, section=SECTION, clause="7.2.2")
    if isinstance(text, Diagnostic):
        return [], [_disabled(text, where)]
    parsed = files.parse_json(text, path, section=SECTION, rule="mcp-config-invalid-json", clause="7.2.2")
    if isinstance(parsed, Diagnostic):
        return [], [_disabled(parsed, where)]
    diagnostics = list(parsed.warnings)
    top = _check_top_level(parsed.value, where, manifest_schema)
    if isinstance(top, Diagnostic):
        return [], [*diagnostics, top]

    ctx = _Context(root, data_dir, where)
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    validator = jsonschema.Draft202012Validator(mcp_schema())
    servers: list[McpServerConfig] = []
    for name, entry in top.items():
        config, found = _parse_entry(ctx, name, entry, validator)
        diagnostics.extend(found)
        if config is not None:
            servers.append(config)
    return servers, diagnostics


def _check_top_level(data: Any, where: str, manifest_schema: str) -> dict[str, Any] | Diagnostic:
    def invalid(message: str, *pointer: str, rule: str = "mcp-config-invalid", clause: str = "7.2.1") -> Diagnostic:
        return Diagnostic(SECTION, rule, origin_of(where, *pointer), message + _DISABLED, clause=clause)

    if not isinstance(data, dict):
        return invalid(f"{MCP_FILE} must contain a JSON object")
    for key in data:
        if key not in ("$schema", "mcpServers"):
            return invalid(f'unknown top-level field {key!r}; only "$schema" and "mcpServers" are allowed', key)
    declared = data.get("$schema")
    if declared is None:
        return invalid(f'required field "$schema" is missing; set it to {MCP_SCHEMA_ID!r}', "$schema")
    version = schema_version(declared, "mcp")
    plugin_version = schema_version(manifest_schema, "plugin")
    if version is not None and plugin_version is not None and version != plugin_version:
        return invalid(
            f"mcp.json targets Agent Plugins {version} but plugin.json targets {plugin_version}",
            "$schema",
            rule="mcp-config-version-mismatch",
            clause="10.1",
        )
    if declared != MCP_SCHEMA_ID:
        if version is not None:
            return invalid(
                f"Agent Plugins version {version} is not supported; use {MCP_SCHEMA_ID!r}",
                "$schema",
                rule="mcp-config-unsupported-version",
            )
        return invalid(f'"$schema" is not a recognised MCP configuration identifier; use {MCP_SCHEMA_ID!r}', "$schema")
    servers = data.get("mcpServers")
    if not isinstance(servers, dict):
        return invalid('required field "mcpServers" must be an object of server entries', "mcpServers")
    return servers


def _parse_entry(
    ctx: _Context, name: str, entry: Any, validator: Any
) -> tuple[McpServerConfig | None, list[Diagnostic]]:
    base = ("mcpServers", name)
    origin = origin_of(ctx.where, *base)
    try:
        if not isinstance(entry, dict):
            raise _EntryInvalid("server-entry-invalid", "a server entry must be an object")
        kind = entry.get("type")
        if kind == "stdio":
            config, notes = _parse_stdio(ctx, name, entry, origin)
        elif kind in ("streamable-http", "sse"):
            config, notes = _parse_remote(ctx, name, entry, origin, kind)
        elif kind is None:
            raise _EntryInvalid("server-entry-invalid", 'missing "type"; use "stdio" or "streamable-http"', ("type",))
        else:
            shown = repr(kind) if isinstance(kind, str) else "a non-string"
            raise _EntryInvalid(
                "server-entry-invalid",
                f'unknown transport type {shown[:60]}; use "stdio" or "streamable-http"',
                ("type",),
            )
        _schema_backstop(validator, name, entry)
    except _EntryInvalid as bad:
        return None, [
            Diagnostic(
                SECTION,
                bad.rule,
                origin_of(ctx.where, *base, *bad.pointer),
                f"server {name!r} skipped: {bad.message}",
                clause=bad.clause,
            )
        ]
    if kind == "sse":
        return None, [
            Diagnostic(
                SECTION,
                "unsupported-transport",
                origin,
                f'server {name!r} skipped: the legacy "sse" transport is not supported; '
                'serve MCP over "streamable-http" instead',
                severity="warning",
                clause="7.2.2",
            )
        ]
    return config, notes


def _schema_backstop(validator: Any, name: str, entry: dict[str, Any]) -> None:
    # The hand-written checks above give the precise messages; the official schema is run
    # as well so nothing it forbids slips through. Its error text can quote values (which
    # may be secrets), so only the failing location and keyword are reported.
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors({"$schema": MCP_SCHEMA_ID, "mcpServers": {name: entry}}))
    if error is not None:
        pointer = tuple(str(p) for p in list(error.absolute_path)[2:])
        raise _EntryInvalid(
            "server-entry-invalid", f"does not satisfy mcp.schema.json 1.0.0 ({error.validator!s} constraint)", pointer
        )


def _parse_stdio(
    ctx: _Context, name: str, entry: dict[str, Any], origin: str
) -> tuple[McpServerConfig, list[Diagnostic]]:
    _only_fields(entry, _STDIO_FIELDS, "stdio")
    notes: list[Diagnostic] = []
    command = entry.get("command")
    if not isinstance(command, str) or not command:
        raise _EntryInvalid("server-entry-invalid", '"command" must be a non-empty string', ("command",))
    command_path = _check_command(ctx, command, notes, origin)

    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _EntryInvalid("server-entry-invalid", '"args" must be an array of strings', ("args",))
    for i, arg in enumerate(args):
        if "\x00" in arg:
            raise _EntryInvalid("server-entry-invalid", "an argument contains a NUL character", ("args", str(i)))
        _note_foreign(ctx, notes, arg, name, ("args", str(i)))

    env = entry.get("env", {})
    if not isinstance(env, dict):
        raise _EntryInvalid("server-entry-invalid", '"env" must be an object of strings', ("env",))
    for reserved in RESERVED_ENV:
        if reserved in env:
            raise _EntryInvalid(
                "env-reserved-name",
                f'"env" sets {reserved}, which the client supplies itself; remove it',
                ("env", reserved),
                clause="9.2",
            )
    expanded_env: dict[str, str] = {}
    secrets: list[Diagnostic] = []
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key:
            raise _EntryInvalid(
                "server-entry-invalid",
                f"environment variable name {key!r} is invalid (empty, or contains '=' or NUL)",
                ("env", key),
            )
        if not isinstance(value, str) or "\x00" in value:
            raise _EntryInvalid(
                "server-entry-invalid", f"env value of {key!r} must be a string without NUL", ("env", key)
            )
        if looks_like_secret(key, value):
            secrets.append(
                _secret(ctx, name, rule="secret-in-env", what=f"env {key!r}", pointer=("env", key), clause="9.2")
            )
        _note_foreign(ctx, notes, value, name, ("env", key))
        expanded_env[key] = ctx.expand(value)

    cwd, cwd_root = _check_cwd(ctx, name, entry.get("cwd"), notes, origin)
    config = McpServerConfig(
        name=name,
        transport="stdio",
        origin=origin,
        command=command,
        command_path=command_path,
        args=tuple(ctx.expand(a) for a in args),
        env=MappingProxyType(expanded_env),
        cwd=cwd,
        cwd_root=cwd_root,
    )
    return config, notes + secrets


def _check_command(ctx: _Context, command: str, notes: list[Diagnostic], origin: str) -> Path | None:
    if "\x00" in command:
        raise _EntryInvalid("server-entry-invalid", '"command" contains a NUL character', ("command",))
    if is_plugin_relative(command):
        if relative_escapes(command):
            raise _EntryInvalid(
                "path-escapes-plugin-root",
                f"command {command!r} climbs out of the plugin root; bundle the executable "
                "inside the plugin and refer to it as ./path",
                ("command",),
                clause="4.1",
            )
        path = resolve_relative(ctx.root, command)
        if path == ctx.root:
            raise _EntryInvalid(
                "server-entry-invalid", f"command {command!r} names the plugin root, not a file", ("command",)
            )
        # realpath is not strict: for a path that does not exist yet it still resolves the
        # existing prefix, so a symlinked parent directory is caught too.
        if not resolves_within(path, ctx.root):
            raise _EntryInvalid(
                "path-escapes-plugin-root",
                f"command {command!r} resolves to {os.path.realpath(path)}, outside the "
                "plugin root (a symlink leaves the plugin)",
                ("command",),
                clause="4.1",
            )
        if not os.path.lexists(path):
            notes.append(
                Diagnostic(
                    SECTION,
                    "command-not-found",
                    origin_of(origin, "command"),
                    f"command {command!r} does not exist yet; the server will fail to start until it does",
                    severity="warning",
                    clause="7.2.1",
                )
            )
        return path
    if command == ".." or command.startswith("../"):
        raise _EntryInvalid(
            "path-escapes-plugin-root",
            f"command {command!r} points outside the plugin root; bundle the executable "
            "inside the plugin and refer to it as ./path",
            ("command",),
            clause="4.1",
        )
    if "${" in command:
        raise _EntryInvalid(
            "server-entry-invalid",
            f'command {command!r}: placeholders are not expanded in "command"; '
            "use a plugin-relative path such as ./bin/server",
            ("command",),
        )
    if "/" in command or "\\" in command:
        raise _EntryInvalid(
            "server-entry-invalid",
            f"command {command!r} must be a bare executable name or a plugin-relative path starting with ./",
            ("command",),
        )
    if any(ch.isspace() for ch in command):
        raise _EntryInvalid(
            "server-entry-invalid",
            f"command {command!r} must be a single executable token, not a shell command; "
            'move the arguments into "args"',
            ("command",),
        )
    return None


def _check_cwd(
    ctx: _Context, name: str, cwd: Any, notes: list[Diagnostic], origin: str
) -> tuple[Path, Literal["plugin", "data"]]:
    if cwd is None:
        return ctx.root, "plugin"
    if not isinstance(cwd, str) or not cwd or "\x00" in cwd:
        raise _EntryInvalid("server-entry-invalid", '"cwd" must be a non-empty string', ("cwd",))
    _note_foreign(ctx, notes, cwd, name, ("cwd",))
    form: Literal["plugin", "data"]
    if is_plugin_relative(cwd):
        if relative_escapes(cwd):
            raise _EntryInvalid(
                "path-escapes-plugin-root", f"cwd {cwd!r} climbs out of the plugin root", ("cwd",), clause="4.1"
            )
        # A ./ cwd is a path, not a placeholder field: expand first (§7.2.1), then resolve.
        resolved = resolve_relative(ctx.root, ctx.expand(cwd))
        form, bound = "plugin", ctx.root
    elif _rooted(cwd, PLUGIN_ROOT):
        resolved, form, bound = Path(posixpath.normpath(ctx.expand(cwd))), "plugin", ctx.root
    elif _rooted(cwd, PLUGIN_DATA):
        resolved, form, bound = Path(posixpath.normpath(ctx.expand(cwd))), "data", ctx.data_dir
    elif cwd == ".." or cwd.startswith("../"):
        raise _EntryInvalid(
            "path-escapes-plugin-root", f"cwd {cwd!r} points outside the plugin root", ("cwd",), clause="4.1"
        )
    else:
        raise _EntryInvalid(
            "server-entry-invalid", f"cwd {cwd!r} must start with ./, ${{PLUGIN_ROOT}} or ${{PLUGIN_DATA}}", ("cwd",)
        )
    if not within(resolved, bound):
        root_name = "plugin root" if form == "plugin" else "plugin data directory"
        raise _EntryInvalid("path-escapes-plugin-root", f"cwd {cwd!r} leaves the {root_name}", ("cwd",), clause="7.2.1")
    if form == "plugin":
        if not resolves_within(resolved, ctx.root):
            raise _EntryInvalid(
                "path-escapes-plugin-root",
                f"cwd {cwd!r} resolves to {os.path.realpath(resolved)}, outside the plugin root",
                ("cwd",),
                clause="4.1",
            )
        if not os.path.isdir(resolved):
            notes.append(
                Diagnostic(
                    SECTION,
                    "cwd-not-found",
                    origin_of(origin, "cwd"),
                    f"cwd {cwd!r} is not an existing directory; the server will fail to start",
                    severity="warning",
                    clause="7.2.1",
                )
            )
    return resolved, form


def _rooted(value: str, placeholder: str) -> bool:
    return value == placeholder or value.startswith(placeholder + "/")


def _parse_remote(
    ctx: _Context, name: str, entry: dict[str, Any], origin: str, kind: str
) -> tuple[McpServerConfig, list[Diagnostic]]:
    _only_fields(entry, _REMOTE_FIELDS, kind)
    notes: list[Diagnostic] = []
    url = entry.get("url")
    if not isinstance(url, str) or not url:
        raise _EntryInvalid("server-entry-invalid", '"url" must be a non-empty string', ("url",))
    secrets = _check_url(ctx, name, url)
    _note_foreign(ctx, notes, url, name, ("url",), remote=True)
    headers = entry.get("headers", {})
    if not isinstance(headers, dict):
        raise _EntryInvalid("server-entry-invalid", '"headers" must be an object of strings', ("headers",))
    seen: dict[str, str] = {}
    for key, value in headers.items():
        if not _HEADER_NAME.fullmatch(key):
            raise _EntryInvalid(
                "server-entry-invalid", f"header name {key[:60]!r} is not a valid HTTP field name", ("headers", key)
            )
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise _EntryInvalid(
                "server-entry-invalid",
                f"header {key!r} must be a string of printable ASCII (no line breaks)",
                ("headers", key),
            )
        if key.lower() in seen:
            raise _EntryInvalid(
                "server-entry-invalid",
                f"header {key!r} repeats {seen[key.lower()]!r} under different casing",
                ("headers", key),
            )
        seen[key.lower()] = key
        if looks_like_secret(key, value, header=True):
            secrets.append(
                _secret(
                    ctx,
                    name,
                    rule="secret-in-headers",
                    what=f"header {key!r}",
                    pointer=("headers", key),
                    clause="7.2.1",
                )
            )
        _note_foreign(ctx, notes, value, name, ("headers", key), remote=True)
    config = McpServerConfig(
        name=name, transport="http", origin=origin, url=url, headers=MappingProxyType(dict(headers))
    )
    return config, notes + secrets


def _check_url(ctx: _Context, name: str, url: str) -> list[Diagnostic]:
    ptr = ("url",)
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise _EntryInvalid("server-entry-invalid", '"url" contains whitespace or control characters', ptr)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a malformed port
    except ValueError as exc:
        raise _EntryInvalid("server-entry-invalid", f'"url" is not a valid URL ({exc})', ptr) from exc
    scheme = parts.scheme.lower()
    shown = f"{scheme}://{parts.hostname or ''}{parts.path}"
    if scheme not in ("http", "https") or not parts.hostname:
        raise _EntryInvalid("server-entry-invalid", f'"url" {shown!r} must be an absolute http(s) URL', ptr)
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise _EntryInvalid(
            "server-entry-invalid",
            '"url" must not contain user information (user:password@); credentials are '
            "configured by the client, not the plugin",
            ptr,
        )
    if "#" in url:
        raise _EntryInvalid("server-entry-invalid", f'"url" {shown!r} must not contain a fragment', ptr)
    if scheme == "http" and not is_loopback(parts.hostname):
        raise _EntryInvalid(
            "server-entry-invalid",
            f'"url" {shown!r} uses plain http to a non-loopback host; use https '
            "(http is allowed only for localhost and loopback addresses)",
            ptr,
        )
    found: list[Diagnostic] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if looks_like_secret(key, value):
            found.append(
                _secret(
                    ctx, name, rule="secret-in-url", what=f"url query parameter {key!r}", pointer=ptr, clause="7.2.1"
                )
            )
    return found


def _only_fields(entry: dict[str, Any], allowed: frozenset[str], kind: str) -> None:
    for key in entry:
        if key not in allowed:
            fields = ", ".join(sorted(allowed))
            raise _EntryInvalid(
                "server-entry-invalid", f"field {key!r} is not allowed in a {kind} entry (allowed: {fields})", (key,)
            )


def _note_foreign(
    ctx: _Context,
    notes: list[Diagnostic],
    text: str,
    name: str,
    pointer: tuple[str, ...],
    *,
    remote: bool = False,
) -> None:
    foreign = foreign_placeholders(text)
    if not foreign:
        return
    shown = ", ".join(dict.fromkeys(f[:40] for f in foreign))
    rule = "url and headers are never expanded" if remote else "only ${PLUGIN_ROOT} and ${PLUGIN_DATA} are expanded"
    notes.append(
        Diagnostic(
            SECTION,
            "placeholder-not-expanded",
            origin_of(ctx.where, "mcpServers", name, *pointer),
            f"{shown} stays literal: {rule} (Agent Plugins §9.2); configure credentials and "
            "host-specific values in your localllm config instead",
            severity="info",
            clause="9.2",
        )
    )


def _secret(ctx: _Context, name: str, *, rule: str, what: str, pointer: tuple[str, ...], clause: str) -> Diagnostic:
    return Diagnostic(
        "secrets",
        rule,
        origin_of(ctx.where, "mcpServers", name, *pointer),
        f"server {name!r}: {what} looks like an embedded credential (value not shown); plugins "
        "must not ship secrets. The server is loaded anyway; rotate the credential and supply "
        "it from your own configuration",
        severity="warning",
        clause=clause,
    )


def _disabled(d: Diagnostic, where: str) -> Diagnostic:
    return Diagnostic(d.component, d.rule, where, d.message + _DISABLED, d.severity, d.clause or "7.2.2")
