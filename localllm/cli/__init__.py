"""The localllm command line: outside the library, which never imports it.

``main`` is the console script (``localllm``) and ``python -m localllm``. Commands live
one module per noun (``foundation``, ``artifacts``, ``grammar``, ``embed``, ``plugins``,
``trace``) behind the lazy table in :mod:`localllm.cli.app`; a command module takes its
shared helpers (exit codes, ``UsageError``, ``emit_json``, ``err``, ``parse_kv``) from
:mod:`localllm.cli.output`, re-exported here.
"""

from __future__ import annotations

from localllm.cli.app import main
from localllm.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, emit_json, err, parse_kv

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "UsageError", "emit_json", "err", "main", "parse_kv"]
