"""Diagnostics: what the plugin loader found wrong, where, and how much it cost.

Every problem the loader meets becomes one :class:`Diagnostic`; the loader never raises.
``severity`` says what happened to the thing it names:

- ``error``   — that thing was dropped (the plugin, the MCP component, one skill,
  one server entry, one flow);
- ``warning`` — it was loaded, but something about it is wrong (an unknown manifest
  field ignored, a credential embedded in ``env``/``headers``);
- ``info``    — nothing is wrong per the spec, but you may be surprised (``${VAR}`` text
  that stays literal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]

#: the components a diagnostic can belong to, in the order the loader reports them
COMPONENTS = ("plugin", "manifest", "skills", "mcp", "secrets", "flows")
#: ``section`` of a diagnostic whose rule is a host extension (no spec clause), e.g. ``flows/``
HOST_SECTION = "host"

SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Diagnostic:
    """One loader finding.

    ``section`` is the Agent Plugins 1.0.0 clause the rule comes from (``"7.2.2"``,
    ``"4.1"``), as the spec and the reference loader report it; ``"host"`` for a host
    extension (``flows/``). ``component`` is the part of the plugin it belongs to
    (``plugin``, ``manifest``, ``skills``, ``mcp``, ``secrets``, ``flows``); ``rule`` a
    stable identifier such as ``server-entry-invalid``; ``origin`` the file, with a JSON
    pointer after ``#`` where the key is known (``/p/acme/mcp.json#/mcpServers/db/cwd``).
    ``clause`` is the clause as given (empty for host extensions). Messages never contain
    a secret value, and every field is encodable text: a lone surrogate (from a file name
    that is not UTF-8) is kept as its escape (``\\udcff``).
    """

    component: str
    rule: str
    origin: str
    message: str
    severity: Severity = "error"
    clause: str = ""

    def __post_init__(self) -> None:
        for name in ("origin", "message"):
            text = getattr(self, name)
            if not text.isascii():
                object.__setattr__(self, name, text.encode("utf-8", "backslashreplace").decode("utf-8"))

    @property
    def section(self) -> str:
        """The spec clause (``"7.2.2"``), or ``"host"`` for a host extension."""
        return self.clause or HOST_SECTION

    def __str__(self) -> str:
        return f"{self.severity}: {self.component}/{self.rule}: {self.origin}: {self.message} [§{self.section}]"

    def to_json(self) -> dict[str, str]:
        """The diagnostic as a JSON object (``plugins check --json``)."""
        return {
            "section": self.section,
            "component": self.component,
            "rule": self.rule,
            "origin": self.origin,
            "message": self.message,
            "severity": self.severity,
            "clause": self.clause,
        }


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer for ``parts`` (``~`` and ``/`` escaped): ``/mcpServers/a~1b``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def origin_of(path: str, *pointer: str | int) -> str:
    """``path#/pointer`` (or just ``path`` without pointer parts)."""
    return f"{path}#{json_pointer(*pointer)}" if pointer else path
