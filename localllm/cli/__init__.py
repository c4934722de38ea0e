"""The localllm command line: outside the library, which never imports it.

``main`` is the console script (``localllm``) and ``python -m localllm``; the commands
live one module per noun (``foundation``, ``artifacts``, ``grammar``, ``embed``,
``plugins``, ``trace``) behind the lazy table in :mod:`localllm.cli.app`.
"""

from __future__ import annotations

from localllm.cli.app import main

__all__ = ["main"]
