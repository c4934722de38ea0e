"""localllm's MCP client as the conformance suite's "client under test".

``@modelcontextprotocol/conformance client --command "python -m tests.e2e.mcp_conformance_client"``
starts a scenario server, then runs this with the server's URL appended and the scenario
name in ``MCP_CONFORMANCE_SCENARIO``. We do what localllm does for an agent call: one
``McpHttpAgent`` (initialize, ``notifications/initialized``, one ``tools/call`` of the
scenario's tool with an AskRequest as arguments), then ``close()``. Only the tool name
and, for the elicitation scenario, the ``elicitation`` policy depend on the scenario.

Exit status: 0 when the call answered (or, for ``initialize``, when the handshake did),
1 with the error's kind and detail on stderr otherwise.
"""

from __future__ import annotations

import os
import sys
import time

from localllm.agents.mcp_http import McpHttpAgent
from localllm.config import McpHttpDecl
from localllm.errors import AgentError
from localllm.wire import AskRequest

#: scenario → (tool to call, elicitation policy)
SCENARIOS = {
    "initialize": ("ask", "decline"),
    "tools_call": ("add_numbers", "decline"),
    "sse-retry": ("test_reconnection", "decline"),
    "elicitation-sep1034-client-defaults": ("test_client_elicitation_defaults", "defaults"),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.e2e.mcp_conformance_client URL", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "tools_call")
    tool, elicitation = SCENARIOS.get(scenario, ("ask", "decline"))
    elicitation = os.environ.get("LOCALLLM_CONFORMANCE_ELICITATION", elicitation)
    decl = McpHttpDecl(
        alias="agent.conformance", plugin="mcp_http", endpoint=argv[0], tool=tool, elicitation=elicitation
    )
    agent = McpHttpAgent(decl)
    request = AskRequest(
        session_id="conformance",
        turn=1,
        state_path="main",
        verb="ask",
        prompt=scenario,
        call_id="0123456789abcdef",
        deadline="2030-01-01T00:00:00Z",
    )
    try:
        response = agent.ask(request, deadline=time.monotonic() + 25.0)
    except AgentError as exc:
        print(f"{exc.kind.value}: {exc.detail}", file=sys.stderr)
        # initialize's server answers tools/call with {}: only the handshake counts there
        return 0 if scenario == "initialize" and agent.protocol_version is not None else 1
    finally:
        agent.close()
    print(response.submission)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
