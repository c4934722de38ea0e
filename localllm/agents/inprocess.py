"""``builtin.inprocess``: a Python callable registered for an alias (tests, deterministic stubs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localllm.agents.base import Agent
from localllm.errors import AgentError, ErrorKind
from localllm.wire import AskRequest, AskResponse


class InprocessAgent(Agent):
    """Calls ``fn(request)``; a non-AskResponse return value becomes the submission.

    An exception other than AgentError raised by ``fn`` (``SystemExit`` and
    ``KeyboardInterrupt`` included) is reported as ``plugin_crash`` (the in-process equivalent
    of a crashed plugin). A hung ``fn`` cannot be interrupted: the runtime abandons its
    (daemon) worker thread at the hard deadline.
    """

    plugin = "builtin.inprocess"

    def __init__(self, alias: str, fn: Callable[[AskRequest], AskResponse | Any], *, local_model: bool = False) -> None:
        super().__init__(alias)
        self._fn = fn
        self.is_local_model = local_model

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        try:
            result = self._fn(request)
        except AgentError:
            raise
        except (Exception, KeyboardInterrupt, SystemExit) as exc:
            # the boundary where a plugin's own bug becomes plugin_crash; fn runs on the call's
            # worker thread, where no signal lands, so a KeyboardInterrupt or SystemExit is its
            # own raise (before, re-raised in the caller: sys.exit() in fn ended the program)
            raise AgentError(ErrorKind.PLUGIN_CRASH, f"raised {type(exc).__name__}: {exc}", alias=self.alias) from exc
        return result if isinstance(result, AskResponse) else AskResponse.of(result)


class UnregisteredInprocessAgent(Agent):
    """A declared ``builtin.inprocess`` alias whose callable was never registered."""

    plugin = "builtin.inprocess"

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        raise AgentError(
            ErrorKind.PLUGIN_UNSUPPORTED,
            "is builtin.inprocess but no callable is registered",
            alias=self.alias,
            hint=f"call Runtime.register_inprocess({self.alias!r}, fn) first",
        )
