"""Import ``jsonschema`` without paying for rfc3987-syntax at import time.

When rfc3987-syntax is installed (``jsonschema[format-nongpl]`` brings it), ``import
jsonschema`` imports it for the ``iri`` format, and importing it builds 39 Lark parsers
(~2 s measured on a busy 2-core machine) before any schema is looked at. localllm
checks ``iri``/``iri-reference`` itself (``localllm.grammar.formats``), so that work only
delays every command that loads a config.

:func:`prepare` is called before each ``import jsonschema`` in localllm. The first time, while
jsonschema imports, ``rfc3987_syntax`` names a stand-in whose ``is_valid_syntax`` imports the
real module on its first call; the stand-in is removed from ``sys.modules`` right after, so
anyone importing ``rfc3987_syntax`` later gets the real module. jsonschema's own ``iri``
checker is still registered and gives the same verdicts: it only builds the parsers when it
is first used. A process that imported jsonschema before localllm is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

__all__ = ["prepare"]

_LOCK = threading.Lock()
_NAME = "rfc3987_syntax"


def prepare() -> None:
    """Import jsonschema (cheaply, the first time) so that the caller's ``import jsonschema``
    finds it whole.

    The import runs under a lock, and every caller takes it: ``"jsonschema" in sys.modules``
    is true as soon as another thread *starts* importing it, and a second thread importing
    ``jsonschema.validators`` then met the first half-way (``cannot import name
    'Draft3Validator' from partially initialized module``: 2 of 8 concurrent first calls
    of ``Runtime.call`` failed in 5 of 8 fresh processes)."""
    with _LOCK:
        if "jsonschema.validators" in sys.modules:
            return
        if "jsonschema" not in sys.modules and _NAME not in sys.modules and _has_real():
            sys.modules[_NAME] = _stand_in()
        try:
            import jsonschema.validators  # noqa: F401
        finally:
            if isinstance(sys.modules.get(_NAME), _StandIn):
                del sys.modules[_NAME]


def _has_real() -> bool:
    """Whether rfc3987-syntax is installed (it is what makes the first import slow)."""
    try:
        return importlib.util.find_spec(_NAME) is not None
    except (ImportError, ValueError):
        return False


class _StandIn(types.ModuleType):
    """``rfc3987_syntax`` while jsonschema imports: every name resolves to the real module's."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_real(), name)


def _real() -> types.ModuleType:
    module = sys.modules.get(_NAME)
    if isinstance(module, _StandIn):
        del sys.modules[_NAME]
    return importlib.import_module(_NAME)


def is_valid_syntax(*args: Any, **kwargs: Any) -> Any:
    """rfc3987-syntax's ``is_valid_syntax``, its parsers built on the first call."""
    return _real().is_valid_syntax(*args, **kwargs)


def _stand_in() -> _StandIn:
    module = _StandIn(_NAME, "stand-in for rfc3987_syntax while jsonschema imports (localllm._jsonschema)")
    module.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    return module
