"""Path containment (Agent Plugins 1.0.0 §4.1): plugin paths stay inside the plugin.

Two checks, at two moments. At parse time a declared ``./…`` path is normalised
lexically and refused if it climbs out (``./../x``, ``./a/../../x``). Through
``realpath`` — at load for what exists and again right before spawn, because a symlink
can be swapped between the two — the filesystem-resolved path must stay inside the
filesystem-resolved root. Symlinks that stay inside are fine: this is containment, not
a ban on symlinks, and not a sandbox for what the launched process does.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path


def is_plugin_relative(value: str) -> bool:
    """True if ``value`` has the plugin-relative form (starts with ``./``)."""
    return value.startswith("./")


def relative_escapes(value: str) -> bool:
    """True if the plugin-relative ``./…`` path climbs above the plugin root lexically."""
    normal = posixpath.normpath(value)
    return normal == ".." or normal.startswith("../") or posixpath.isabs(normal)


def resolve_relative(root: Path, value: str) -> Path:
    """``root`` joined with the lexically normalised ``./…`` path ``value``."""
    normal = posixpath.normpath(value)
    return root if normal == "." else root / normal


def within(path: Path | str, root: Path | str) -> bool:
    """True if ``path`` is ``root`` or below it, comparing the strings as given."""
    p, r = os.path.abspath(path), os.path.abspath(root)
    try:
        return os.path.commonpath([p, r]) == r
    except ValueError:  # different drives (Windows) or mixed absolute/relative
        return False


def resolves_within(path: Path | str, root: Path | str) -> bool:
    """True if ``realpath(path)`` is ``realpath(root)`` or below it.

    A path that does not exist yet resolves as far as it exists (``realpath`` is not
    strict), so a symlinked parent directory still counts.
    """
    return within(os.path.realpath(path), os.path.realpath(root))
