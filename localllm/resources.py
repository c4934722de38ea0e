"""Where the shipped data lives: top-level ``pins/``, ``grammar/`` and ``embed/``.

In a checkout ``localllm/_data/<name>`` links to the top-level directory; in a wheel the
data is copied there. Either way :func:`data_path` finds it.
"""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).resolve().parent / "_data"


def data_path(*parts: str) -> Path:
    """Path of a shipped data file, e.g. ``data_path("pins", "artifacts.json")``."""
    return _DATA.joinpath(*parts)
