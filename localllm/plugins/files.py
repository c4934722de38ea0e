"""Reading plugin files without trusting them: containment, kind, size, encoding, JSON, YAML.

Each reader returns the value or a :class:`Diagnostic` — never raises for anything the
plugin directory can contain (dangling or looping symlinks, FIFOs, directories where a
file should be, unreadable files, invalid UTF-8, invalid or absurdly nested JSON or YAML).

What a reader returns is always Unicode text that can be encoded and printed: a lone
surrogate escape (``"\\ud800"``, which JSON and YAML accept but which is no character) is
refused, naming its key. YAML is bounded before it is built: at most
:data:`MAX_YAML_DEPTH` levels and :data:`MAX_YAML_NODES` nodes counting each alias as
the nodes it repeats (a billion-laughs document is refused, not expanded), and an alias
inside the collection it names (a recursive structure) is refused.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.plugins.containment import resolves_within
from localllm.plugins.diagnostics import Diagnostic, json_pointer, origin_of
from localllm.wire import LONE_SURROGATE

#: larger plugin files are refused rather than read into memory
MAX_FILE_BYTES = 4 * 1024 * 1024
#: deepest YAML nesting accepted (the loader's recursion stays far from Python's limit)
MAX_YAML_DEPTH = 64
#: most YAML nodes accepted, each alias counted as the nodes it stands for
MAX_YAML_NODES = 100_000

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Missing:
    """The path does not exist at all (not even as a dangling symlink)."""


MISSING = Missing()


def _where(path: Path) -> str:
    return str(path)


def probe_location(path: Path, root: Path, *, section: str, want_dir: bool, clause: str) -> Missing | Diagnostic | None:
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
        return Diagnostic(
            section, "unreadable", _where(path), f"cannot inspect {path.name}: {_os_reason(exc)}", clause=clause
        )
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
                return Diagnostic(
                    section,
                    "component-location-wrong-kind",
                    _where(path),
                    f"{path.name} is not a regular file",
                    clause="6.2",
                )
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        return Diagnostic(
            section, "unreadable", _where(path), f"cannot read {path.name}: {_os_reason(exc)}", clause=clause
        )
    if len(raw) > MAX_FILE_BYTES:
        return Diagnostic(
            section, "file-too-large", _where(path), f"{path.name} is larger than {MAX_FILE_BYTES} bytes", clause=clause
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Diagnostic(
            section,
            "invalid-utf8",
            _where(path),
            f"{path.name} is not UTF-8 text (byte {exc.start}); save it as UTF-8",
            clause=clause,
        )


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
        return Diagnostic(
            section,
            rule,
            _where(path),
            f"{path.name} is not valid JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} column {exc.colno}",
            clause=clause,
        )
    except (ValueError, RecursionError) as exc:  # RecursionError: pathologically nested input
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return Diagnostic(section, rule, _where(path), f"{path.name} is not valid JSON: {reason}", clause=clause)
    if _SURROGATE_ESCAPE.search(text):  # the only way a lone surrogate gets into the value
        pointer = surrogate_pointer(value)
        if pointer is not None:
            return _surrogate_diagnostic(path, pointer, section=section, rule=rule, clause=clause)
    warnings: tuple[Diagnostic, ...] = ()
    if duplicates:
        names = ", ".join(sorted(set(duplicates)))
        warnings = (
            Diagnostic(
                section,
                "duplicate-json-key",
                _where(path),
                f"{path.name} repeats the key(s) {names} in one object; the last value is used",
                severity="warning",
                clause=clause,
            ),
        )
    return ParsedJson(value, warnings)


def utf8_name(name: str) -> bool:
    """False for a file name the OS gave as undecodable bytes (``os.fsdecode`` surrogates)."""
    return LONE_SURROGATE.search(name) is None


def surrogate_pointer(value: Any) -> tuple[str | int, ...] | None:
    """The key path of the first string (or key) holding a lone surrogate, else ``None``.

    Iterative, so the depth of ``value`` does not matter.
    """
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and LONE_SURROGATE.search(key):
                    return (*where, key)
                stack.append(((*where, key if isinstance(key, (str, int)) else str(key)), sub))
        elif isinstance(item, list):
            stack.extend(((*where, i), sub) for i, sub in enumerate(item))
    return None


def _surrogate_diagnostic(
    path: Path | str, pointer: tuple[str | int, ...], *, section: str, rule: str, clause: str
) -> Diagnostic:
    name = Path(path).name
    return Diagnostic(
        section,
        rule,
        origin_of(str(path), *pointer),
        f"{name} has a lone surrogate escape (such as \\ud800) at {json_pointer(*pointer) or '/'}: "
        "that is no Unicode character; write the character itself",
        clause=clause,
    )


def parse_yaml(text: str, path: Path | str, *, section: str, rule: str, clause: str = "", first_line: int = 1) -> Any:
    """Parse one YAML document safely and within bounds; the value or a :class:`Diagnostic`.

    ``first_line`` is the file line of the text's first line (for front matter).
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        problem = _yaml_shape_problem(yaml.parse(text, Loader=loader))
        if problem is None:
            value = yaml.load(text, Loader=loader)  # a SafeLoader (C when libyaml is there)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + first_line}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or "cannot be parsed"
        return Diagnostic(section, rule, str(path), f"not valid YAML{at}: {reason}", clause=clause)
    except Exception as exc:
        # PyYAML's constructors raise assorted builtins on bad tagged scalars (``!!timestamp
        # banana`` → AttributeError, ``!!bool maybe`` → KeyError): reported, never raised.
        return Diagnostic(section, rule, str(path), f"not valid YAML: {type(exc).__name__}: {exc}"[:300], clause=clause)
    if problem is not None:
        return Diagnostic(section, rule, str(path), f"YAML refused: {problem}", clause=clause)
    pointer = surrogate_pointer(value)
    if pointer is not None:
        return _surrogate_diagnostic(path, pointer, section=section, rule=rule, clause=clause)
    return value


def _yaml_shape_problem(events: Any) -> str | None:
    """Depth and alias-expanded size of a YAML event stream, before anything is built."""
    import yaml

    sizes: dict[str, int] = {}
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, nodes before it)
    total = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_YAML_DEPTH:
                return f"nested deeper than {MAX_YAML_DEPTH} levels"
            stack.append((event.anchor, total))
            total += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, before = stack.pop()
            if anchor is not None:
                sizes[anchor] = total - before
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                return f"alias *{event.anchor} is inside the collection it names (a recursive structure)"
            total += sizes.get(str(event.anchor), 1)  # an undefined alias fails when the document is built
        if total > MAX_YAML_NODES:
            return f"more than {MAX_YAML_NODES} nodes once aliases are expanded"
    return None


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
