"""Right before a stdio server starts: re-check containment, prepare PLUGIN_DATA, build argv/env.

Load-time checks are not enough: a symlink can be swapped between load and spawn, and
``${PLUGIN_DATA}`` only exists once created here. So, immediately before spawning:

1. ``PLUGIN_DATA`` is created (parents too) and proven writable by writing, fsyncing and
   deleting a probe file (Agent Plugins §9.1);
2. a plugin-relative ``command`` must ``realpath`` inside the resolved plugin root and be
   an executable file; a bare command is looked up on the parent's ``PATH`` (a ``PATH``
   in the entry's ``env`` reaches the child but does not pick the executable —
   plugins may not rely on either behaviour, §7.2.1);
3. ``cwd`` must ``realpath`` inside the plugin root (``./…``, ``${PLUGIN_ROOT}…``) or the
   data directory (``${PLUGIN_DATA}…``, created if missing);
4. env = base environment, overlaid by the entry's expanded ``env``, then ``PLUGIN_ROOT``
   and ``PLUGIN_DATA`` set last (§9.1).

A containment failure raises :class:`~localllm.errors.PluginPathEscape` (that one
server is invalid: :func:`escape_diagnostic` gives its diagnostic); anything else that
prevents the launch raises :class:`~localllm.errors.PluginSpawnError`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from localllm import settings
from localllm.errors import PluginPathEscape, PluginSpawnError
from localllm.plugins.containment import within
from localllm.plugins.diagnostics import Diagnostic
from localllm.plugins.result import McpServerConfig, PluginLoaded


@dataclass(frozen=True)
class SpawnSpec:
    """How to launch one stdio server: argv list, full environment, working directory."""

    argv: tuple[str, ...]
    #: the complete child environment (values may be secrets: not in repr)
    env: Mapping[str, str] = field(repr=False)
    cwd: Path


def prepare_data_dir(plugin: PluginLoaded) -> Path:
    """Create ``PLUGIN_DATA`` if needed and prove it writable; returns its path."""
    data = plugin.data_dir
    try:
        data.mkdir(parents=True, exist_ok=True)
        if not data.is_dir():
            raise NotADirectoryError(f"{data} exists and is not a directory")
        # Prove writability the only reliable way: write, fsync, delete a unique file.
        fd, probe = tempfile.mkstemp(prefix=".localllm-probe-", dir=data)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise PluginSpawnError(
            f"PLUGIN_DATA directory {data} is not a writable directory ({exc.strerror or exc})",
            plugin=plugin.name,
            server="*",
            field="PLUGIN_DATA",
            hint=f"make {data} a writable directory, or load the plugin with another data_root",
        ) from exc
    return data


def prepare_spawn(
    server: McpServerConfig, plugin: PluginLoaded, *, base_env: Mapping[str, str] | None = None
) -> SpawnSpec:
    """Re-check ``server``'s paths, prepare ``PLUGIN_DATA`` and return its :class:`SpawnSpec`.

    ``base_env`` defaults to this process's environment. Raises ``PluginPathEscape``
    when ``command`` or ``cwd`` now resolves outside its root, ``PluginSpawnError`` when
    the server cannot be launched.
    """
    if server.transport != "stdio":
        raise PluginSpawnError(
            "is an HTTP server; there is nothing to spawn", plugin=plugin.name, server=server.name, field="type"
        )
    base = dict(settings.environ() if base_env is None else base_env)
    data = prepare_data_dir(plugin)
    root_real = os.path.realpath(plugin.root)
    argv0 = _resolve_command(server, plugin, root_real, base.get("PATH"))
    cwd = _resolve_cwd(server, plugin, root_real, data)
    env = base
    env.update(server.env)
    # Set last so neither the base environment nor the entry can override them (§9.1).
    env["PLUGIN_ROOT"] = str(plugin.root)
    env["PLUGIN_DATA"] = str(data)
    return SpawnSpec(argv=(argv0, *server.args), env=MappingProxyType(env), cwd=cwd)


def escape_diagnostic(exc: PluginPathEscape, server: McpServerConfig) -> Diagnostic:
    """The diagnostic that records a spawn-time containment failure for ``server``."""
    return Diagnostic(
        "mcp",
        "path-escapes-plugin-root",
        f"{server.origin}/{exc.field}",
        f"server {server.name!r} invalid: {exc.field} {exc.path} resolves to {exc.resolved}, outside {exc.root}",
        clause="4.1",
    )


def _resolve_command(server: McpServerConfig, plugin: PluginLoaded, root_real: str, path_var: str | None) -> str:
    if server.command_path is None:
        found = shutil.which(server.command, path=path_var)
        if found is None:
            raise PluginSpawnError(
                f"command {server.command!r} was not found on PATH",
                plugin=plugin.name,
                server=server.name,
                field="command",
                hint=f"install {server.command!r} or bundle it in the plugin as ./bin/…",
            )
        return found
    real = os.path.realpath(server.command_path)
    if not within(real, root_real):
        raise PluginPathEscape(
            plugin=plugin.name,
            server=server.name,
            field="command",
            path=str(server.command_path),
            resolved=real,
            root=root_real,
        )
    if not os.path.isfile(real) or not os.access(real, os.X_OK):
        raise PluginSpawnError(
            f"command {server.command!r} ({real}) is not an executable file",
            plugin=plugin.name,
            server=server.name,
            field="command",
            hint=f"check that {server.command} exists and is executable",
        )
    # Launch the file that was checked, not a path a swapped symlink could redirect.
    return real


def _resolve_cwd(server: McpServerConfig, plugin: PluginLoaded, root_real: str, data: Path) -> Path:
    cwd = server.cwd if server.cwd is not None else plugin.root
    if server.cwd_root == "data":
        bound = os.path.realpath(data)
        # Check before mkdir too: a symlink inside the data dir must not make us create
        # directories elsewhere.
        if not within(os.path.realpath(cwd), bound):
            raise PluginPathEscape(
                plugin=plugin.name,
                server=server.name,
                field="cwd",
                path=str(cwd),
                resolved=os.path.realpath(cwd),
                root=bound,
            )
        try:
            cwd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PluginSpawnError(
                f"cannot create cwd {cwd} ({exc.strerror or exc})", plugin=plugin.name, server=server.name, field="cwd"
            ) from exc
    else:
        bound = root_real
    real = os.path.realpath(cwd)
    if not within(real, bound):
        raise PluginPathEscape(
            plugin=plugin.name, server=server.name, field="cwd", path=str(cwd), resolved=real, root=bound
        )
    if not os.path.isdir(real):
        raise PluginSpawnError(
            f"cwd {cwd} is not a directory",
            plugin=plugin.name,
            server=server.name,
            field="cwd",
            hint="create the directory inside the plugin, or drop cwd",
        )
    return Path(real)


def spawn_server(root: Path, server: str) -> SpawnSpec:
    """:func:`prepare_spawn` for server ``server`` of the plugin directory ``root``, re-loaded
    now: a declaration stays plain data, and a directory that changed since the config
    was loaded is judged as it is."""
    from localllm.plugins.loader import load_agent_plugin

    plugin = load_agent_plugin(root)
    found = next((s for s in plugin.mcp_servers if s.name == server), None) if plugin.ok else None
    if not plugin.ok or found is None:
        why = "; ".join(d.message for d in plugin.diagnostics) or "it is no longer in mcp.json"
        raise PluginSpawnError(
            f"no longer loads from {root}: {why}",
            plugin=root.name,
            server=server,
            field="mcpServers",
            hint=f"run `localllm plugins check {root}`",
        )
    return prepare_spawn(found, plugin)
