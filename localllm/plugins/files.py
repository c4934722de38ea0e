"""Reading plugin files without trusting them: containment, kind, size, encoding, JSON.

Each reader returns the value or a :class:`Diagnostic` — never raises for anything the
plugin directory can contain (dangling or looping symlinks, FIFOs, directories where a
file should be, unreadable files, invalid UTF-8, invalid or absurdly nested JSON).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.plugins.containment import resolves_within
from localllm.plugins.diagnostics import Diagnostic

#: larger plugin files are refused rather than read into memory
MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Missing:
    """The path does not exist at all (not even as a dangling symlink)."""


MISSING = Missing()


def _where(path: Path) -> str:
    return str(path)


def probe_location(
    path: Path, root: Path, *, section: str, want_dir: bool, clause: str
) -> Missing | Diagnostic | None:
    """Check a fixed component location: absent → ``MISSING``; bad → a diagnostic; ok → None.

    ``root`` is the filesystem-resolved plugin root.
    """
    try:
        if not os.path.lexists(path):
            return MISSING
        if not resolves_within(path, root):
            return Diagnostic(
                section,
                "path-escapes-plugin-root",
                _where(path),
                f"{path.name} resolves to {os.path.realpath(path)}, outside the plugin root {root}; "
                "keep plugin files inside the plugin directory",
                clause="4.1",
            )
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        return Diagnostic(section, "unreadable", _where(path), f"cannot inspect {path.name}: {_os_reason(exc)}",
                          clause=clause)
    ok = stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)
    if not ok:
        kind = "a directory" if want_dir else "a regular file"
        return Diagnostic(
            section,
            "component-location-wrong-kind",
            _where(path),
            f"{path.name} exists but is not {kind}",
            clause="6.2",
        )
    return None


def read_text(path: Path, *, section: str, clause: str = "") -> str | Diagnostic:
    """Read a UTF-8 text file (a leading BOM is tolerated), at most ``MAX_FILE_BYTES``."""
    try:
        # O_NONBLOCK: a FIFO swapped in after the kind check must not hang the loader.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return Diagnostic(section, "component-location-wrong-kind", _where(path),
                                  f"{path.name} is not a regular file", clause="6.2")
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        return Diagnostic(section, "unreadable", _where(path), f"cannot read {path.name}: {_os_reason(exc)}",
                          clause=clause)
    if len(raw) > MAX_FILE_BYTES:
        return Diagnostic(section, "file-too-large", _where(path),
                          f"{path.name} is larger than {MAX_FILE_BYTES} bytes", clause=clause)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Diagnostic(section, "invalid-utf8", _where(path),
                          f"{path.name} is not UTF-8 text (byte {exc.start}); save it as UTF-8", clause=clause)


@dataclass(frozen=True)
class ParsedJson:
    """A parsed JSON document plus warnings (repeated keys: the last one wins)."""

    value: Any
    warnings: tuple[Diagnostic, ...] = ()


def parse_json(text: str, path: Path, *, section: str, rule: str, clause: str = "") -> ParsedJson | Diagnostic:
    """Parse JSON strictly (no NaN/Infinity); a repeated key is reported as a warning."""
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.append(key)
            out[key] = value
        return out

    def bad_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=bad_constant)
    except json.JSONDecodeError as exc:
        return Diagnostic(section, rule, _where(path),
                          f"{path.name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          clause=clause)
    except (ValueError, RecursionError) as exc:  # RecursionError: pathologically nested input
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return Diagnostic(section, rule, _where(path), f"{path.name} is not valid JSON: {reason}", clause=clause)
    warnings: tuple[Diagnostic, ...] = ()
    if duplicates:
        names = ", ".join(sorted(set(duplicates)))
        warnings = (
            Diagnostic(section, "duplicate-json-key", _where(path),
                       f"{path.name} repeats the key(s) {names} in one object; the last value is used",
                       severity="warning", clause=clause),
        )
    return ParsedJson(value, warnings)


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
