"""localllm: small local models as a dependable part of an agent runtime.

Importing this package is cheap: nothing heavy is imported and nothing runs.
"""

from __future__ import annotations

from localllm.errors import AgentError, ConfigError, ErrorKind, LocalLLMError
from localllm.wire import AskRequest, AskResponse, CallResult

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AskRequest",
    "AskResponse",
    "CallResult",
    "ConfigError",
    "ErrorKind",
    "LocalLLMError",
    "__version__",
]
