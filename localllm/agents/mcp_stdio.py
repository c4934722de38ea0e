"""``mcp_stdio``: an MCP server run as a child process, spoken to over stdin/stdout.

The MCP stdio transport: newline-delimited JSON-RPC. Per process: ``initialize`` (version
negotiation as in :mod:`localllm.agents._mcp`, supporting 2024-11-05 through 2025-11-25),
``notifications/initialized``; per call: ``tools/call`` of the declared tool with the
AskRequest as arguments. Result rules (structuredContent, text, envelope or bare
submission) are :func:`localllm.agents._mcp.answer_from_tool_result`.

While waiting for its response the client skips server notifications (logging,
progress), answers ``ping`` with ``{}``, declines ``elicitation/create`` and refuses other
server requests ("method not found": sampling and roots are not declared), as
:func:`localllm.agents._mcp.reply_to_server_request` says.
Lines that do not start with ``{`` are noise: logged, skipped.

Lifecycle and errors as for ``subprocess`` (spawned lazily, reused, env = parent + the
declaration's ``env``, ``cwd``; stdin close, SIGTERM, grace, SIGKILL on close):
``plugin_crash`` when the process cannot start, exits, or breaks framing (EOF, partial or
malformed frame, a response whose id is not pending) — it is reaped and respawned (and
re-initialised) on the next call; ``transport_error`` for an in-protocol failure
(``isError``, a JSON-RPC error object such as an unknown tool, an unsupported protocol
version) with the process kept, except after a failed handshake; ``deadline_exceeded``
kills the process. Calls are serialised by a lock, like ``subprocess``: one answer per
call, attributable, at the cost of parallelism (MCP servers may be concurrent, but a
stdio plugin is a local helper and its calls are short).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from localllm.agents import _mcp
from localllm.agents._child import LineChild
from localllm.agents._stdio import ChildAgent
from localllm.config import McpStdioDecl
from localllm.errors import AgentError, ErrorKind, PluginError, truncate_detail
from localllm.wire import AskRequest, AskResponse

logger = logging.getLogger(__name__)


class McpStdioAgent(ChildAgent):
    """An MCP server over stdio whose ``tool`` answers agent calls."""

    plugin: ClassVar[str] = "mcp_stdio"

    def __init__(self, decl: McpStdioDecl, *, secrets: Sequence[str] | None = None) -> None:
        super().__init__(decl.alias, command=decl.command, args=decl.args, env=decl.env, cwd=decl.cwd, secrets=secrets)
        self.decl = decl
        self._ids = itertools.count(1)
        #: the protocol version negotiated with the current process
        self.protocol_version: str | None = None

    def _launch_spec(self) -> tuple[list[str], dict[str, str], Path | None]:
        """A plugin-directory server is re-checked (realpath containment) and its
        PLUGIN_DATA prepared right before every spawn."""
        if self.decl.plugin_dir is None:
            return super()._launch_spec()
        from localllm.plugins.spawn import spawn_server

        try:
            spec = spawn_server(self.decl.plugin_dir, self.decl.server)
        except (PluginError, OSError) as exc:
            hint = exc.hint if isinstance(exc, PluginError) else ""
            raise AgentError(ErrorKind.PLUGIN_CRASH, f"cannot spawn: {exc}", alias=self.alias, hint=hint) from exc
        return list(spec.argv), dict(spec.env), spec.cwd

    def _on_spawn(self, child: LineChild, deadline: float) -> None:
        self.protocol_version = None
        req_id = next(self._ids)
        child.send(_mcp.initialize_request(req_id), deadline=deadline)
        message = self._await_response(child, req_id, deadline)
        try:
            result = _mcp.result_of(message, alias=self.alias, what="initialize")
            version = _mcp.negotiated_version(result, supported=_mcp.STDIO_VERSIONS, alias=self.alias)
        except AgentError:
            # A server we cannot talk to is useless alive; the next call starts afresh.
            child.kill()
            raise
        child.send(_mcp.initialized_notification(), deadline=deadline)
        self.protocol_version = version

    def _call(self, child: LineChild, request: AskRequest, deadline: float) -> AskResponse:
        child.noise.clear()  # details report what *this* call saw
        req_id = next(self._ids)
        child.send(_mcp.tools_call_request(req_id, self.decl.tool, request), deadline=deadline)
        message = self._await_response(child, req_id, deadline)
        result = _mcp.result_of(message, alias=self.alias, what=f"tools/call {self.decl.tool!r}")
        return _mcp.answer_from_tool_result(result, alias=self.alias, tool=self.decl.tool)

    def _await_response(self, child: LineChild, req_id: int, deadline: float) -> dict[str, Any]:
        while True:
            message = child.read_frame(deadline=deadline)
            if _mcp.is_response(message):
                got = message.get("id")
                if type(got) is not int or got != req_id:
                    raise child.crash(
                        f"stray frame: response id {truncate_detail(self.redact(repr(got)))} "
                        f"does not match request id {req_id}"
                    )
                return message
            reply = _mcp.reply_to_server_request(message)
            if reply is not None:
                child.send(reply, deadline=deadline)
            else:
                logger.debug("%s: server notification %s", self.alias, message.get("method"))
