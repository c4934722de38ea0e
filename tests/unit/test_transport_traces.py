"""Every error kind the external transports produce, provoked for real through the Runtime,
leaves a trace that `localllm trace verify` accepts (and the next call still succeeds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.errors import AgentError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace
from tests.unit.agents_fixtures.helpers import JSONRPC_AGENT, McpHttpServer


@pytest.mark.slow
def test_error_kinds_leave_valid_traces(tmp_path: Path, mcp_http_server: McpHttpServer) -> None:
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n"
        f"  agent.sub: {{plugin: subprocess, command: '{sys.executable}', args: ['{JSONRPC_AGENT}'], timeout: 2}}\n"
        f"  agent.mcp: {{plugin: mcp_http, endpoint: '{mcp_http_server.base}/mcp', timeout: 5}}\n"
        "  agent.dead: {plugin: mcp_http, endpoint: 'http://127.0.0.1:9/mcp'}\n"
    )
    trace = tmp_path / "t.jsonl"
    cases = [
        ("agent.sub", "crash", ErrorKind.PLUGIN_CRASH),
        ("agent.sub", "partial", ErrorKind.PLUGIN_CRASH),
        ("agent.sub", "wrongid", ErrorKind.PLUGIN_CRASH),
        ("agent.sub", "slow:10", ErrorKind.DEADLINE_EXCEEDED),
        ("agent.sub", "rpcerror", ErrorKind.TRANSPORT_ERROR),
        ("agent.dead", "hello", ErrorKind.TRANSPORT_ERROR),
    ]
    with Runtime(load_config(config), trace=trace) as rt:
        for alias, prompt, kind in cases:
            with pytest.raises(AgentError) as info:
                rt.call("ask", agent=alias, prompt=prompt)
            assert (info.value.kind, info.value.alias) == (kind, alias), (prompt, info.value)
            after = rt.call("ask", agent=alias if alias != "agent.dead" else "agent.mcp", prompt="echo")
            assert (after.submission["echo"], after.ok, after.exit_code) == ("echo", True, 0)
        schema = {"type": "object", "required": ["missing"]}
        with pytest.raises(AgentError) as info:
            rt.call("decide", agent="agent.mcp", prompt="hi", schema=schema)
        assert info.value.kind is ErrorKind.SCHEMA_INVALID  # external plugins are never substituted
    errors = [e.payload["kind"] for e in read_trace(trace).events if e.kind == "agent.call.error"]
    assert errors == [k.value for _, _, k in cases] + ["schema_invalid"]
    assert main(["trace", "verify", str(trace)]) == 0
