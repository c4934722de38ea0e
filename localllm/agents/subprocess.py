"""``subprocess``: an external program speaking JSON-RPC 2.0 over stdio (contract §1, §6).

One JSON object per line. Request::

    {"jsonrpc": "2.0", "id": n, "method": "agent.ask", "params": <AskRequest>}

reply ``{"jsonrpc": "2.0", "id": n, "result": <AskResponse>}`` or ``{…, "error": {"code",
"message"}}``.

Lifecycle: spawned on the first call (argv = ``command`` + ``args``, environment = this
process's environment + the declaration's ``env``, ``cwd``), reused across calls,
respawned on the call after a crash. ``close()`` closes stdin, then SIGTERM, a grace
period, SIGKILL; the child runs in its own process group so grandchildren go too.

Error kinds:

- ``plugin_crash`` — the process cannot start, exits, closes stdout (EOF), leaves a partial
  frame, writes a malformed frame, or answers with a frame whose ``id`` is not the pending
  request's (a stray or mismatched frame, notifications included, means the stream is
  desynchronised). The process is reaped and respawned on the next call; the detail
  carries the exit code, the stderr tail and this call's stdout noise (lines that do not
  start with ``{``, which are otherwise logged and skipped).
- ``transport_error`` — the program answered *in protocol* but not with an answer: a
  JSON-RPC ``error`` object, or a ``result`` that is not an AskResponse object. The stream
  is still in sync, so the process is kept.
- ``deadline_exceeded`` — the deadline passed (or the runtime called ``cancel``): the
  process is killed, since its late answer would otherwise be read as the next call's.

Concurrency: calls are **serialised** by a lock (waiting for it is bounded by the call's
deadline). Plugins are not required to be concurrent, one pipe pair gives no isolation
between interleaved answers, and serialising makes every frame attributable to exactly
one call, so a misbehaving frame fails that call alone. Declare several aliases for
parallelism.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

from localllm.agents._child import LineChild
from localllm.agents._mcp import jsonrpc_error_text
from localllm.agents._stdio import ChildAgent
from localllm.config import SubprocessDecl
from localllm.errors import AgentError, ErrorKind, truncate_detail
from localllm.wire import AskRequest, AskResponse

METHOD = "agent.ask"


class SubprocessAgent(ChildAgent):
    """A ``subprocess`` agent plugin; see the module docstring for the protocol."""

    plugin: ClassVar[str] = "subprocess"

    def __init__(self, decl: SubprocessDecl, *, secrets: Sequence[str] | None = None) -> None:
        super().__init__(decl.alias, command=decl.command, args=decl.args, env=decl.env, cwd=decl.cwd, secrets=secrets)
        self.decl = decl
        self._ids = itertools.count(1)

    def _call(self, child: LineChild, request: AskRequest, deadline: float) -> AskResponse:
        child.noise.clear()  # details report what *this* call saw
        req_id = next(self._ids)
        child.send({"jsonrpc": "2.0", "id": req_id, "method": METHOD, "params": request.to_json()}, deadline=deadline)
        reply = child.read_frame(deadline=deadline)
        return self._answer(child, req_id, reply)

    def _answer(self, child: LineChild, req_id: int, reply: dict[str, Any]) -> AskResponse:
        if reply.get("jsonrpc") != "2.0":
            raise child.crash(f"frame is not JSON-RPC 2.0: {truncate_detail(self.redact(str(reply)))}")
        got = reply.get("id")
        if type(got) is not int or got != req_id:
            raise child.crash(
                f"stray frame: response id {truncate_detail(self.redact(repr(got)))} does not match request id {req_id}"
            )
        if "error" in reply:
            text = jsonrpc_error_text(reply["error"])
            raise AgentError(ErrorKind.TRANSPORT_ERROR, truncate_detail(self.redact(text)), alias=self.alias)
        result = reply.get("result")
        if not isinstance(result, dict):
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"result is not an AskResponse object: {truncate_detail(self.redact(repr(result)))}",
                alias=self.alias,
            )
        try:
            return AskResponse.from_json(result)
        except AgentError as exc:
            raise exc.replace(alias=self.alias) from exc
