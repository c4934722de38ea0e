"""Agent Plugins 1.0.0 directories: ``plugin.json``, ``skills/``, ``mcp.json`` and ``flows/``.

``load_agent_plugin(root)`` returns ``PluginLoaded`` or ``PluginRejected`` and never
raises; ``prepare_spawn(server, plugin)`` re-checks containment, creates ``PLUGIN_DATA``
and builds the launch spec of a stdio server; ``mcp_agent_decls(plugin)`` names each MCP
server as an agent alias ``agent.<plugin>.<server>``.
"""

from __future__ import annotations

from localllm.plugins.aliases import ALIAS_PATTERN, alias_part, mcp_agent_decls
from localllm.plugins.diagnostics import Diagnostic
from localllm.plugins.loader import default_data_dir, load_agent_plugin
from localllm.plugins.placeholders import expand_placeholders
from localllm.plugins.result import (
    Flow,
    McpServerConfig,
    PluginAuthor,
    PluginLoaded,
    PluginLoadResult,
    PluginManifest,
    PluginRejected,
    Skill,
)
from localllm.plugins.spawn import SpawnSpec, escape_diagnostic, prepare_data_dir, prepare_spawn

__all__ = [
    "ALIAS_PATTERN",
    "Diagnostic",
    "Flow",
    "McpServerConfig",
    "PluginAuthor",
    "PluginLoadResult",
    "PluginLoaded",
    "PluginManifest",
    "PluginRejected",
    "Skill",
    "SpawnSpec",
    "alias_part",
    "default_data_dir",
    "escape_diagnostic",
    "expand_placeholders",
    "load_agent_plugin",
    "mcp_agent_decls",
    "prepare_data_dir",
    "prepare_spawn",
]
