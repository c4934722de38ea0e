"""``localllm plugins check DIR [--json]``: load one plugin directory and show what survived.

Exit 0 when the plugin loads (even with diagnostics), 1 when it is rejected, 2 when DIR
(or ``--data-root``) is not a directory.
Credentials never reach the output: ``env`` and ``headers`` are shown by name only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli.output import EXIT_FAILED, EXIT_OK, emit_json, input_path, out, output_path

if TYPE_CHECKING:
    from localllm.plugins.result import McpServerConfig, PluginLoadResult


def _setup(parser: argparse.ArgumentParser) -> None:
    psub = parser.add_subparsers(dest="plugins_command", metavar="SUBCOMMAND", required=True)
    check = psub.add_parser(
        "check",
        help="load a plugin directory and print what loaded and every diagnostic",
        description="Load an Agent Plugins 1.0.0 directory. Exit 0 if it loads (even with diagnostics), "
        "1 if it is rejected, 2 if DIR is not a directory.",
    )
    check.add_argument("dir", metavar="DIR", type=Path, help="the plugin root (the directory with plugin.json)")
    check.add_argument(
        "--data-root",
        type=Path,
        default=None,
        metavar="D",
        help="parent of PLUGIN_DATA directories (default: DIR/../data)",
    )
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.set_defaults(handler=_check)


SETUP = {"plugins": _setup}


def _check(args: argparse.Namespace) -> int:
    from localllm.plugins.loader import load_agent_plugin

    input_path(args.dir, "plugin directory", directory=True)
    if args.data_root is not None:
        output_path(args.data_root, "--data-root", directory=True)
    result = load_agent_plugin(args.dir, data_root=args.data_root)
    if args.json:
        emit_json(result_to_json(result))
    else:
        out(render_text(result).removesuffix("\n"))
    return EXIT_OK if result.ok else EXIT_FAILED


def result_to_json(result: PluginLoadResult) -> dict[str, Any]:
    """The load result as a JSON object; secret values are omitted."""
    from localllm.plugins.aliases import mcp_agent_decls
    from localllm.plugins.result import PluginLoaded

    doc: dict[str, Any] = {"ok": result.ok, "root": str(result.root)}
    if isinstance(result, PluginLoaded):
        m = result.manifest
        aliases = {id(server): alias for alias, server in mcp_agent_decls(result)}
        doc.update(
            {
                "data_dir": str(result.data_dir),
                "manifest": {"name": m.name, "version": m.version, "description": m.description},
                "skills": [{"name": s.name, "description": s.description, "path": str(s.path)} for s in result.skills],
                "mcp_servers": [_server_json(s, aliases[id(s)]) for s in result.mcp_servers],
                "flows": [
                    {"name": f.name, "start": f.start, "nodes": len(f.node_ids), "origin": f.origin}
                    for f in result.flows
                ],
            }
        )
    doc["diagnostics"] = [d.to_json() for d in result.diagnostics]
    return doc


def _server_json(server: McpServerConfig, alias: str) -> dict[str, Any]:
    item: dict[str, Any] = {"name": server.name, "alias": alias, "transport": server.transport}
    if server.transport == "stdio":
        item.update(
            {
                "command": server.command,
                "args": list(server.args),
                "env": sorted(server.env),  # names only: values may be credentials
                "cwd": str(server.cwd) if server.cwd is not None else None,
            }
        )
    else:
        item.update({"url": _url_without_query(server.url), "headers": sorted(server.headers)})
    return item


def render_text(result: PluginLoadResult) -> str:
    """The human-readable report of ``plugins check``."""
    from localllm.plugins.aliases import mcp_agent_decls
    from localllm.plugins.result import PluginLoaded

    lines: list[str] = []
    if isinstance(result, PluginLoaded):
        m = result.manifest
        lines.append(f"ok: {m.name} {m.version or '(no version)'} at {result.root}")
        lines.append(f"data dir: {result.data_dir}")
        lines.append(f"skills ({len(result.skills)}):")
        lines += [f"  {s.name}: {_one_line(s.description)}" for s in result.skills]
        lines.append(f"mcp servers ({len(result.mcp_servers)}):")
        for alias, s in mcp_agent_decls(result):
            if s.transport == "stdio":
                detail = " ".join([s.command, *s.args])
                env = f" env: {', '.join(sorted(s.env))}" if s.env else ""
                lines.append(f"  {s.name} [stdio] {_one_line(detail)}{env} -> {alias}")
            else:
                headers = f" headers: {', '.join(sorted(s.headers))}" if s.headers else ""
                lines.append(f"  {s.name} [http] {_url_without_query(s.url)}{headers} -> {alias}")
        lines.append(f"flows ({len(result.flows)}):")
        lines += [f"  {f.name} (start: {f.start}, {len(f.node_ids)} nodes)" for f in result.flows]
    else:
        lines.append(f"rejected: {result.root}")
    lines.append(f"diagnostics ({len(result.diagnostics)}):")
    lines += [f"  {d}" for d in result.diagnostics]
    return "\n".join(lines) + "\n"


def _url_without_query(url: str) -> str:
    # A query string can carry a token; the location is enough to identify the server.
    return url.split("?", 1)[0]


def _one_line(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
