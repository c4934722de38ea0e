"""What loading a plugin directory produces: frozen data, nothing connected or spawned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from localllm.plugins.diagnostics import Diagnostic

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class PluginAuthor:
    name: str | None = None
    email: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class PluginManifest:
    """A validated ``plugin.json`` (unknown top-level fields already dropped)."""

    name: str
    schema: str
    version: str | None = None
    description: str | None = None
    author: PluginAuthor | None = None
    homepage: str | None = None
    repository: str | None = None
    license: str | None = None
    keywords: tuple[str, ...] = ()
    #: reverse-domain namespace → opaque object; never interpreted here
    extensions: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Skill:
    """One ``skills/<name>/SKILL.md`` whose front matter passed the Agent Skills rules."""

    name: str
    description: str
    #: the skill directory (``skills/<name>``) under the plugin root
    path: Path
    #: the Markdown after the front matter: the skill's instructions
    body: str
    license: str | None = None
    compatibility: str | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    allowed_tools: str | None = None


@dataclass(frozen=True)
class McpServerConfig:
    """One valid ``mcp.json`` server entry, parsed but not connected.

    ``transport`` is ``stdio`` or ``http`` (the spec's ``streamable-http``). For stdio,
    ``args``, ``env`` values and ``cwd`` are already placeholder-expanded; ``command`` is
    the declared token and ``command_path`` the plugin-relative command resolved
    against the plugin root (``None`` for a bare name resolved through ``PATH`` at
    spawn). ``cwd_root`` says which root ``cwd`` must stay in. ``env`` and ``headers``
    values (and ``url``, whose query may hold a token) stay out of ``repr`` and are never printed.
    """

    name: str
    transport: Literal["stdio", "http"]
    #: ``<plugin>/mcp.json#/mcpServers/<name>``
    origin: str
    command: str = ""
    command_path: Path | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: _EMPTY, repr=False)
    cwd: Path | None = None
    cwd_root: Literal["plugin", "data"] = "plugin"
    #: not in repr either: a query string can carry a token
    url: str = field(default="", repr=False)
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY, repr=False)


@dataclass(frozen=True)
class Flow:
    """One ``flows/*.flow.{json,yaml,yml}`` file whose envelope validated (host extension).

    ``definition`` is the whole parsed document for the host to register; localllm
    does not run flows itself.
    """

    name: str
    start: str
    origin: str
    description: str | None = None
    node_ids: tuple[str, ...] = ()
    definition: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)


@dataclass(frozen=True)
class PluginLoaded:
    """A plugin that loaded, possibly with some components skipped (see ``diagnostics``)."""

    manifest: PluginManifest
    skills: tuple[Skill, ...]
    mcp_servers: tuple[McpServerConfig, ...]
    flows: tuple[Flow, ...]
    diagnostics: tuple[Diagnostic, ...]
    #: filesystem-resolved plugin root (the value of ``PLUGIN_ROOT``)
    root: Path = Path(".")
    #: the plugin's data directory (the value of ``PLUGIN_DATA``); created only at spawn
    data_dir: Path = Path(".")

    @property
    def ok(self) -> Literal[True]:
        return True

    @property
    def name(self) -> str:
        return self.manifest.name


@dataclass(frozen=True)
class PluginRejected:
    """A plugin refused as a whole (bad ``plugin.json``); nothing of it was discovered."""

    diagnostics: tuple[Diagnostic, ...]
    root: Path = Path(".")

    @property
    def ok(self) -> Literal[False]:
        return False

    @property
    def message(self) -> str:
        """The first error, as one line (what a caller shows when it refuses the plugin)."""
        for d in self.diagnostics:
            if d.severity == "error":
                return str(d)
        return str(self.diagnostics[0]) if self.diagnostics else f"plugin at {self.root} rejected"


PluginLoadResult = PluginLoaded | PluginRejected
