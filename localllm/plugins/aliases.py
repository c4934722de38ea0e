"""Agent aliases for a plugin's MCP servers: ``agent.<plugin>.<server>``.

Each part is sanitised to ``[a-z0-9][a-z0-9_-]*``: lower-cased, every other character
(including the ``.`` plugin names may contain) becomes ``_``, runs of ``_`` collapse,
leading/trailing ``_``/``-`` are dropped, and an empty result becomes ``server``. Plugin
names cannot contain ``_``, so ``acme.tools`` → ``acme_tools`` is unambiguous; two
servers of one plugin that sanitise to the same part get ``_2``, ``_3`` … in
``mcp.json`` order. Every alias therefore has exactly two dots and matches
:data:`ALIAS_PATTERN`.
"""

from __future__ import annotations

import re

from localllm.plugins.result import McpServerConfig, PluginLoaded

ALIAS_PATTERN = re.compile(r"agent\.[a-z0-9][a-z0-9_-]*\.[a-z0-9][a-z0-9_-]*")

_UNSAFE = re.compile(r"[^a-z0-9_-]+")
_RUNS = re.compile(r"_{2,}")


def alias_part(name: str) -> str:
    """``name`` sanitised into one dot-free alias segment."""
    part = _RUNS.sub("_", _UNSAFE.sub("_", name.lower())).strip("_-")
    return part or "server"


def mcp_agent_decls(plugin: PluginLoaded) -> list[tuple[str, McpServerConfig]]:
    """``(alias, server)`` for every loaded MCP server of ``plugin``, in ``mcp.json`` order.

    stdio servers map to MCP over stdio, http servers to ``mcp_http``; the alias calls
    their ``ask`` tool.
    """
    prefix = f"agent.{alias_part(plugin.manifest.name)}."
    taken: set[str] = set()
    out: list[tuple[str, McpServerConfig]] = []
    for server in plugin.mcp_servers:
        base = prefix + alias_part(server.name)
        alias, n = base, 1
        while alias in taken:
            n += 1
            alias = f"{base}_{n}"
        taken.add(alias)
        out.append((alias, server))
    return out
