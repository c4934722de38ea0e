"""localllm: small local models as a dependable part of an agent runtime.

Importing this package is cheap: the public names below load their modules on first
access (PEP 562), so ``import localllm`` — and the CLI's ``--help`` — import no subsystem,
and httpx, numpy, jsonschema and YAML load only when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from localllm._version import __version__

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.errors import AgentError, ConfigError, ErrorKind, LocalLLMError
    from localllm.loading import load_config
    from localllm.runtime import Runtime
    from localllm.wire import AskRequest, AskResponse, CallResult

__all__ = [
    "AgentError",
    "AskRequest",
    "AskResponse",
    "CallResult",
    "Config",
    "ConfigError",
    "ErrorKind",
    "LocalLLMError",
    "Runtime",
    "__version__",
    "load_config",
]

# public name → the module that defines it
_HOME = {
    "AgentError": "localllm.errors",
    "AskRequest": "localllm.wire",
    "AskResponse": "localllm.wire",
    "CallResult": "localllm.wire",
    "Config": "localllm.config",
    "ConfigError": "localllm.errors",
    "ErrorKind": "localllm.errors",
    "LocalLLMError": "localllm.errors",
    "Runtime": "localllm.runtime",
    "load_config": "localllm.loading",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'localllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
