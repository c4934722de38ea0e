"""The agent half shared by the stdio transports (``subprocess``, ``mcp_stdio``).

Owns one :class:`~localllm.agents._child.LineChild`: spawned lazily on the first call,
reused, replaced on the call after it died. Calls are serialised by a lock whose wait is
bounded by the call's deadline. A passed deadline, or :meth:`ChildAgent.cancel` from the
runtime's thread, kills the child: its late answer must never be read as the next call's.
Subclasses implement the protocol on top of the lines (:meth:`ChildAgent._call`) and
any per-process handshake (:meth:`ChildAgent._on_spawn`).
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from localllm.agents._child import DeadlineReached, LineChild
from localllm.agents.base import Agent
from localllm.errors import AgentError, ErrorKind
from localllm.redact import Redactor
from localllm.wire import AskRequest, AskResponse

logger = logging.getLogger(__name__)

#: how long ``close()`` waits for an in-flight call to let go after killing its child
_CLOSE_WAIT = 10.0


class ChildAgent(Agent):
    """An agent answered by one long-lived child process; see the module docstring."""

    def __init__(
        self,
        alias: str,
        *,
        command: str,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        secrets: Sequence[str] | None = None,
    ) -> None:
        super().__init__(alias)
        self._argv = [command, *args]
        self._env = dict(env)
        self._cwd = cwd
        # resolved secrets (the Runtime's; else every env value): never in an error or a log line
        self.redact = Redactor(list(env.values()) if secrets is None else secrets)
        self._lock = threading.Lock()
        self._child: LineChild | None = None
        self._inflight: str | None = None
        self._cancelled = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.alias} command={self._argv[0]!r} env_keys={sorted(self._env)}>"

    @property
    def pid(self) -> int | None:
        """The running child's pid (``None`` before the first call or after a crash)."""
        child = self._child
        return child.pid if child is not None and child.alive else None

    @abc.abstractmethod
    def _call(self, child: LineChild, request: AskRequest, deadline: float) -> AskResponse:
        """Exchange the frames of one call (the lock is held)."""

    def _on_spawn(self, child: LineChild, deadline: float) -> None:
        """Per-process handshake, run once after each spawn. Default: nothing."""

    def _launch_spec(self) -> tuple[list[str], dict[str, str], Path | None]:
        """argv, environment overrides and cwd for the next spawn."""
        return self._argv, self._env, self._cwd

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        if not self._lock.acquire(timeout=self.remaining(deadline)):
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED, "deadline passed waiting for the previous call", alias=self.alias
            )
        try:
            if self._closed:
                raise AgentError(ErrorKind.TRANSPORT_ERROR, "agent is closed", alias=self.alias)
            self._inflight = request.call_id
            self._cancelled = False
            try:
                return self._call(self._ensure_child(deadline), request, deadline)
            except DeadlineReached:
                child = self._child
                assert child is not None
                child.kill()
                raise AgentError(
                    ErrorKind.DEADLINE_EXCEEDED,
                    child.crash_detail("no answer before the deadline; process killed", exit_code=False),
                    alias=self.alias,
                ) from None
            except AgentError as exc:
                if self._cancelled:
                    # cancel() killed the child: the EOF that followed is ours, not a crash.
                    raise AgentError(
                        ErrorKind.DEADLINE_EXCEEDED, "cancelled at the deadline; process killed", alias=self.alias
                    ) from exc
                raise
        finally:
            self._inflight = None
            self._lock.release()

    def _ensure_child(self, deadline: float) -> LineChild:
        child = self._child
        if child is not None and child.alive:
            return child
        if child is not None:
            # Died between calls: reap it before spawning its replacement.
            logger.info("%s: process exited (code %s); respawning", self.alias, child.returncode)
            child.kill()
        argv, env, cwd = self._launch_spec()
        child = LineChild(label=self.alias, argv=argv, env=env, cwd=cwd, redact=self.redact)
        self._child = child
        child.start()
        self._on_spawn(child, deadline)
        return child

    def cancel(self, call_id: str) -> None:
        """Kill the child if ``call_id`` is in flight; the waiting call ends at once."""
        child = self._child
        if self._inflight == call_id and child is not None:
            self._cancelled = True
            child.signal_kill()

    def close(self) -> None:
        """Stop the child (stdin close, SIGTERM, grace, SIGKILL). Idempotent."""
        self._closed = True
        got = self._lock.acquire(timeout=0.05)
        if not got:
            # A call is in flight: kill its child so that it lets go of the lock promptly.
            child = self._child
            if child is not None:
                self._cancelled = True
                child.signal_kill()
            if not self._lock.acquire(timeout=_CLOSE_WAIT):
                # The caller is stuck outside our waits; its child is already SIGKILLed,
                # and its pipes are its to release (closing them under it is unsafe).
                logger.warning("%s: close() gave up waiting for the in-flight call", self.alias)
                return
        try:
            child, self._child = self._child, None
            if child is not None:
                child.stop()
        finally:
            self._lock.release()
