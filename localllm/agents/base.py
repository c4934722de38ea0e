"""The Agent interface every transport implements."""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping
from typing import ClassVar

from localllm.wire import AskRequest, AskResponse


class Agent(abc.ABC):
    """One declared agent plugin.

    ``ask`` is called from a runtime worker thread. ``deadline`` is a ``time.monotonic()``
    instant: the hard cap. Transports bound every wait by it (finite HTTP timeouts, process
    waits); the runtime also enforces it from outside and then calls :meth:`cancel` so that
    the transport can abort in-flight work (kill a child, close a connection) and the
    worker thread ends. Errors are raised as :class:`localllm.errors.AgentError`.
    """

    plugin: ClassVar[str]
    #: a local model backend: its ``schema_invalid`` answers fall back to agent.claude
    is_local_model: bool = False

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @abc.abstractmethod
    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        """Answer one request or raise AgentError."""

    def prepare(self, *, wait: bool = True) -> None:  # noqa: B027 - optional hook
        """Resolve what this agent's calls go to — attach to a running service, or fetch and
        start its server — before the first call instead of during it. ``wait=False`` begins
        it in the background and returns at once; the first call then waits for it and
        raises its error. Default: nothing to prepare."""

    def continue_session(self, plays: Mapping[str, int]) -> None:  # noqa: B027 - optional hook
        """The trace being continued already holds ``plays[episode_id]`` replays of each
        episode; a replaying agent counts on from there. Default: nothing."""

    def cancel(self, call_id: str) -> None:  # noqa: B027 - optional hook
        """Abort the in-flight call ``call_id`` (hard deadline passed). Default: nothing."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release every resource (processes, sessions). Idempotent."""

    @staticmethod
    def remaining(deadline: float) -> float:
        """Seconds left until ``deadline`` (never negative)."""
        return max(0.0, deadline - time.monotonic())
