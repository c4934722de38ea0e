"""``load_agent_plugin``: one Agent Plugins 1.0.0 directory → a graded result, never an exception.

Blast radii (Agent Plugins §5, §6.2, §7, §11.3):

| what failed                   | outcome                                   |
|-------------------------------|-------------------------------------------|
| ``plugin.json``               | ``PluginRejected``: nothing else is read  |
| ``mcp.json``                  | no MCP servers; skills and flows load     |
| one ``skills/<name>``         | that skill skipped; the rest load         |
| one server entry              | that server skipped; its siblings load    |
| one ``flows/*.flow.*`` file   | that flow skipped; its siblings load      |
| missing ``skills/``, ``mcp.json``, ``flows/`` | not an error              |
"""

from __future__ import annotations

import os
from pathlib import Path

from localllm.plugins.diagnostics import Diagnostic
from localllm.plugins.flows import load_flows
from localllm.plugins.manifest import load_manifest
from localllm.plugins.mcp import load_mcp
from localllm.plugins.result import PluginLoaded, PluginLoadResult, PluginRejected
from localllm.plugins.skills import load_skills

DATA_DIR = "data"


def default_data_dir(root: Path, name: str, data_root: Path | None = None) -> Path:
    """``PLUGIN_DATA`` for plugin ``name`` at ``root``: ``data_root/<name>`` or ``<root>/../data/<name>``.

    Outside the plugin root on purpose: writing state must never change the bundle.
    """
    base = Path(os.path.abspath(data_root)) if data_root is not None else root.parent / DATA_DIR
    return base / name


def load_agent_plugin(root: Path | str, *, data_root: Path | str | None = None) -> PluginLoadResult:
    """Load the plugin directory ``root``; returns ``PluginLoaded`` or ``PluginRejected``.

    Never raises: every problem, down to an unreadable file or a looping symlink, becomes
    a :class:`Diagnostic` on the result. Nothing is spawned or connected and nothing is
    written; ``PLUGIN_DATA`` (``data_root/<name>``, default ``<root>/../data/<name>``) is
    created only by :func:`localllm.plugins.prepare_spawn`.
    """
    shown = Path(root) if isinstance(root, (str, os.PathLike)) else Path(str(root))
    try:
        return _load(shown, Path(data_root) if data_root is not None else None)
    except Exception as exc:
        # The contract is "never raises": a bug here must cost this plugin, not the
        # caller's session. It is reported, not swallowed (rule loader-internal-error).
        return PluginRejected(
            (
                Diagnostic(
                    "plugin",
                    "loader-internal-error",
                    str(shown),
                    f"the loader failed unexpectedly ({type(exc).__name__}: {exc}); please report this",
                ),
            ),
            root=shown,
        )


def _load(shown: Path, data_root: Path | None) -> PluginLoadResult:
    try:
        exists = os.path.lexists(shown)
        real = Path(os.path.realpath(shown))
        is_dir = os.path.isdir(real)
    except (OSError, ValueError) as exc:
        return _reject(shown, "plugin-root-unreadable", f"cannot inspect the plugin directory: {exc}")
    if not exists:
        return _reject(shown, "plugin-root-missing", "no such directory; pass the plugin's root directory")
    if not is_dir:
        return _reject(
            shown, "plugin-root-not-directory", "not a directory; pass the directory that contains plugin.json"
        )

    manifest, diagnostics = load_manifest(real, shown)
    if manifest is None:
        return PluginRejected(tuple(diagnostics), root=real)
    data_dir = default_data_dir(real, manifest.name, data_root)

    skills, found = load_skills(real, shown)
    diagnostics.extend(found)
    servers, found = load_mcp(real, shown, manifest_schema=manifest.schema, data_dir=data_dir)
    diagnostics.extend(found)
    flows, found = load_flows(real, shown)
    diagnostics.extend(found)
    return PluginLoaded(
        manifest=manifest,
        skills=tuple(skills),
        mcp_servers=tuple(servers),
        flows=tuple(flows),
        diagnostics=tuple(diagnostics),
        root=real,
        data_dir=data_dir,
    )


def _reject(shown: Path, rule: str, message: str) -> PluginRejected:
    return PluginRejected((Diagnostic("plugin", rule, str(shown), message, clause="4.1"),), root=shown)
