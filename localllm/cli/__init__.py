"""The localllm command line: outside the library, which never imports it.

``main`` is the console script (``localllm``) and ``python -m localllm``. Commands live
one module per noun (``foundation``, ``artifacts``, ``grammar``, ``embed``, ``plugins``,
``trace``) behind the lazy table in :mod:`localllm.cli.app`; a command module takes its
shared helpers (exit codes, ``UsageError``, ``emit_json``, ``err``, ``parse_kv``) from
:mod:`localllm.cli.output`, re-exported here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from localllm.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, emit_json, err, parse_kv


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (:func:`localllm.cli.app.main`). Run as the program, a ``run``/``call``
    first spawns the server its last run of the same command line used (:mod:`localllm._head_start`),
    before the CLI and the config are even imported."""
    if argv is None and not {"run", "call"}.isdisjoint(sys.argv[1:]):  # the others pay no import for it
        from localllm import _head_start

        _head_start.begin(sys.argv[1:])
    from localllm.cli.app import main as run

    return run(argv)


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "UsageError", "emit_json", "err", "main", "parse_kv"]
