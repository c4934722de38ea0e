"""A plugin directory's MCP servers answering real calls through the mcp_stdio / mcp_http transports.

This is the path ``plugin_dirs:`` takes: load → ``mcp_agent_decls`` → (stdio) ``prepare_spawn``
→ transport. The servers are the official-SDK reference MCP server of the agent tests.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.mcp_http import McpHttpAgent
from localllm.agents.mcp_stdio import McpStdioAgent
from localllm.config import McpHttpDecl, McpStdioDecl
from localllm.plugins import PluginLoaded, load_agent_plugin, mcp_agent_decls, prepare_spawn
from tests.unit.agents_fixtures.helpers import MCP_SERVER, McpHttpServer, ask_request, deadline

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"


def make_plugin(tmp_path: Path, url: str) -> PluginLoaded:
    root = tmp_path / "plugins" / "fixer"
    (root / "bin").mkdir(parents=True)
    # The bundled executable: a launcher inside the plugin that execs the reference server.
    launcher = root / "bin" / "mcp-server"
    launcher.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, {str(MCP_SERVER)!r}, *sys.argv[1:]])\n"
    )
    launcher.chmod(0o755)
    (root / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": "fixer"}))
    (root / "mcp.json").write_text(
        json.dumps(
            {
                "$schema": MCP_SCHEMA,
                "mcpServers": {
                    "helper": {
                        "type": "stdio",
                        "command": "./bin/mcp-server",
                        "args": ["stdio"],
                        "env": {"STATE_DIR": "${PLUGIN_DATA}/state"},
                        "cwd": "${PLUGIN_DATA}",
                    },
                    "remote": {"type": "streamable-http", "url": url},
                },
            }
        )
    )
    result = load_agent_plugin(root)
    assert isinstance(result, PluginLoaded), [str(d) for d in result.diagnostics]
    assert result.diagnostics == ()
    return result


def answer(agent: Any, prompt: str) -> Any:
    response = agent.ask(ask_request(prompt), deadline=deadline(30.0))
    assert response.submission is not None
    return json.loads(response.submission)


def test_stdio_and_http_plugin_servers_answer_calls(tmp_path: Path, mcp_http_server: McpHttpServer) -> None:
    plugin = make_plugin(tmp_path, f"{mcp_http_server.base}/mcp")
    decls = dict(mcp_agent_decls(plugin))
    assert sorted(decls) == ["agent.fixer.helper", "agent.fixer.remote"]

    stdio = decls["agent.fixer.helper"]
    spec = prepare_spawn(stdio, plugin)
    agent = McpStdioAgent(
        McpStdioDecl(
            alias="agent.fixer.helper",
            plugin="mcp_stdio",
            command=spec.argv[0],
            args=spec.argv[1:],
            env=dict(spec.env),
            cwd=spec.cwd,
        )
    )
    try:
        assert answer(agent, "hello")["echo"] == "hello"
        root = answer(agent, "env:PLUGIN_ROOT")
        assert root["value"] == str(plugin.root)
        assert root["cwd"] == os.path.realpath(plugin.data_dir)
        assert answer(agent, "env:PLUGIN_DATA")["value"] == str(plugin.data_dir)
        assert answer(agent, "env:STATE_DIR")["value"] == f"{plugin.data_dir}/state"
    finally:
        agent.close()

    remote = decls["agent.fixer.remote"]
    http = McpHttpAgent(
        McpHttpDecl(alias="agent.fixer.remote", plugin="mcp_http", endpoint=remote.url, headers=dict(remote.headers))
    )
    try:
        assert answer(http, "over http")["echo"] == "over http"
    finally:
        http.close()


def test_plugin_dir_servers_answer_localllm_call(
    tmp_path: Path, mcp_http_server: McpHttpServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """config `plugin_dirs:` → agent.<plugin>.<server> aliases → validated answers via `localllm call`."""
    from localllm.cli import main
    from localllm.trace import read_trace

    plugin = make_plugin(tmp_path, f"{mcp_http_server.base}/mcp")
    (tmp_path / "echo.json").write_text(
        json.dumps({"type": "object", "properties": {"echo": {"type": "string"}}, "required": ["echo"]})
    )
    config = tmp_path / "app.yaml"
    config.write_text(f"plugin_dirs: ['{plugin.root}']\n")
    trace = tmp_path / "t.jsonl"
    for alias in ("agent.fixer.helper", "agent.fixer.remote"):
        code = main(
            [
                "call",
                "ask",
                "--config",
                str(config),
                "--agent",
                alias,
                "--prompt",
                f"via {alias}",
                "--schema",
                str(tmp_path / "echo.json"),
                "--trace",
                str(trace),
                "--json",
            ]
        )
        out = json.loads(capsys.readouterr().out)
        assert code == 0
        assert out["submission"]["echo"] == f"via {alias}"
        assert out["agent"] == alias
    assert [e.payload["agent"] for e in read_trace(trace).events if e.kind == "agent.call.complete"] == [
        "agent.fixer.helper",
        "agent.fixer.remote",
    ]
    assert main(["trace", "verify", str(trace)]) == 0


def test_plugin_dir_command_symlinked_out_fails_that_alias_only(tmp_path: Path, mcp_http_server: McpHttpServer) -> None:
    """The realpath containment re-check runs right before spawn, through the config path."""
    from localllm.errors import AgentError, ErrorKind
    from localllm.loading import load_config
    from localllm.runtime import Runtime

    plugin = make_plugin(tmp_path, f"{mcp_http_server.base}/mcp")
    config = tmp_path / "app.yaml"
    config.write_text(f"plugin_dirs: ['{plugin.root}']\n")
    loaded = load_config(config)
    launcher = plugin.root / "bin" / "mcp-server"
    outside = tmp_path / "outside-server"
    outside.write_text(launcher.read_text())
    outside.chmod(0o755)
    launcher.unlink()
    launcher.symlink_to(outside)  # swapped after load: must be caught at spawn
    with Runtime(loaded) as rt:
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.fixer.helper", prompt="x")
        assert info.value.kind is ErrorKind.PLUGIN_CRASH and "cannot spawn" in info.value.detail
        assert rt.call("ask", agent="agent.fixer.remote", prompt="still fine").submission["echo"] == "still fine"
