"""localllm: small local models as a dependable part of an agent runtime.

Importing this package is cheap: only the standard library and localllm's own light
modules are imported (httpx, numpy, jsonschema and YAML load when first used).
"""

from __future__ import annotations

from localllm.config import Config
from localllm.errors import AgentError, ConfigError, ErrorKind, LocalLLMError
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.wire import AskRequest, AskResponse, CallResult

__version__ = "0.1.0"

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
