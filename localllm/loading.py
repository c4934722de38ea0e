"""``load_config``: the whole load, composed from the data layer and the checks above it.

Layering: :mod:`localllm.config` is data and imports nothing above the pins; this module
sits above it *and* above :mod:`localllm.schema`, :mod:`localllm.grammar` and
:mod:`localllm.plugins`, and runs the checks that need them::

    parse (config)  →  plugin_dirs: agents (plugins)  →  names across sections (config)
                    →  schema files, $refs, the decide-gate grammar subset (schema, grammar)
                    →  Config, or one ConfigError with every problem in file order
"""

from __future__ import annotations

import os
from pathlib import Path

from localllm.config import Config, LocalLLMDecl, McpHttpDecl, McpStdioDecl
from localllm.config.parse import Draft, check_references, parse

__all__ = ["load_config"]


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load and check a config file; raise ``ConfigError`` listing every problem."""
    draft = parse(Path(path))
    for key, plugin_dir in draft.plugin_dirs.items():
        _plugin_agents(draft, key, plugin_dir)
    check_references(draft)
    _check_schemas(draft)
    _check_evidence(draft)
    return draft.config()


def _check_evidence(draft: Draft) -> None:
    """A gate's ``selection.evidence`` is an eval report of that gate (staleness is `check`'s warning)."""
    from localllm.selection import gate_problems

    for gate in draft.gates.values():
        if gate.selection is not None and gate.selection.evidence is not None:
            for problem in gate_problems(gate, gate.selection.evidence):
                draft.problems.add(
                    f"gates.{gate.name}.selection.evidence",
                    f"{gate.selection.evidence} {problem}",
                    f"run `localllm eval {gate.name} -c {draft.file}` to write it, or fix the path",
                )


def _plugin_agents(draft: Draft, key: str, plugin_dir: Path) -> None:
    """Declare ``agent.<plugin>.<server>`` for each MCP server of an Agent Plugins directory."""
    from localllm.plugins import load_agent_plugin, mcp_agent_decls

    result = load_agent_plugin(plugin_dir)
    if not result.ok:
        for diag in result.diagnostics:
            draft.problems.add(key, f"plugin rejected: {diag.message}", f"run `localllm plugins check {plugin_dir}`")
        return
    for diag in result.diagnostics:  # a part skipped (bad mcp.json, bad flow) is reported, never silent
        draft.diagnostics.append({**diag.to_json(), "key": key})
    for alias, server in mcp_agent_decls(result):
        if alias in draft.agents:
            draft.problems.add(key, f'MCP server alias "{alias}" collides with a declared agent')
            continue
        query = server.url.partition("?")[2]  # a query string can carry a token (plugins keeps url out of repr)
        values = (*server.env.values(), *server.headers.values(), query, server.url if query else "")
        draft.ctx.secrets.update(v for v in values if v)
        if server.transport == "http":
            draft.agents[alias] = McpHttpDecl(
                alias=alias, plugin="mcp_http", endpoint=server.url, headers=dict(server.headers)
            )
        else:
            draft.agents[alias] = McpStdioDecl(
                alias=alias,
                plugin="mcp_stdio",
                command=server.command,
                args=server.args,
                env=dict(server.env),
                cwd=server.cwd,
                plugin_dir=plugin_dir,
                server=server.name,
            )


def _check_schemas(draft: Draft) -> None:
    """Each static gate schema parses, its ``$ref``s stay inside, and a ``decide`` gate on a
    ``grammar: true`` local model stays inside the llama.cpp grammar subset."""
    from localllm.errors import SchemaError
    from localllm.schema import read_schema_file, ref_problems

    for gate in draft.gates.values():
        if gate.schema_path is None:
            continue
        key = f"gates.{gate.name}.with.schema"
        try:
            schema = read_schema_file(gate.schema_path)
            issues = ref_problems(gate.schema_path, draft.ctx.base_dir)
        except SchemaError as exc:
            draft.problems.add(key, str(exc))
            continue
        except RecursionError:
            draft.problems.add(key, f"{gate.schema_path} is nested too deeply to check")
            continue
        for issue in issues:
            draft.problems.add(key, issue)
        decl = draft.agents.get(gate.agent)
        if (
            issues
            or gate.verb != "decide"
            or not isinstance(decl, LocalLLMDecl)
            or not decl.grammar
            or decl.json_schema
        ):
            continue
        from localllm.grammar import format_violation, unenforced

        for violation in unenforced(schema, compiled=decl.grammar is True):
            draft.problems.add(
                key,
                format_violation(violation, gate.agent, str(gate.schema_path)),
                "simplify the schema, set json_schema: true, or route the gate to another agent",
            )
