"""``${PLUGIN_ROOT}`` / ``${PLUGIN_DATA}`` expansion (Agent Plugins 1.0.0 §9.2).

Expansion is one textual pass over the *original* string: every exact occurrence of
either placeholder is replaced, and the replacement text is never scanned again, so a
plugin root whose path happens to contain ``${PLUGIN_DATA}`` stays literal. No other
``${VAR}`` is expanded — the spec forbids environment-variable expansion in plugin
files — so such text reaches the process verbatim; :func:`foreign_placeholders` finds it
so the loader can say so.
"""

from __future__ import annotations

import re

PLUGIN_ROOT = "${PLUGIN_ROOT}"
PLUGIN_DATA = "${PLUGIN_DATA}"

_PLACEHOLDER = re.compile(r"\$\{PLUGIN_(ROOT|DATA)\}")
_ANY_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def expand_placeholders(text: str, *, plugin_root: str, plugin_data: str) -> str:
    """Replace ``${PLUGIN_ROOT}`` and ``${PLUGIN_DATA}`` in ``text``, single-pass."""
    # re.sub scans the input once and never looks at what a callback returned, which
    # is exactly the spec's "text introduced by a replacement is not rescanned".
    return _PLACEHOLDER.sub(
        lambda m: plugin_root if m.group(1) == "ROOT" else plugin_data,
        text,
    )


def foreign_placeholders(text: str) -> list[str]:
    """Every ``${NAME}`` in ``text`` other than the two plugin placeholders, in order."""
    return [m.group(0) for m in _ANY_PLACEHOLDER.finditer(text) if m.group(0) not in (PLUGIN_ROOT, PLUGIN_DATA)]
