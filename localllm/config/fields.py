"""Declarations → parsing, unknown-key errors and the reference table.

:func:`parse_decl` reads one mapping against a declaration class: every key the class
declares (a field with a :class:`~localllm.config.decls.Key`) is type- and range-checked
by the field's annotation and its key's rules; anything else is an unknown key with a
"did you mean". Every string that reaches a process, a path or a header is checked here
too: no NUL, no lone surrogate, finite numbers only, so what loads also runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import shutil
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localllm import settings
from localllm._fs import TEXT_LIMIT, inside, read_capped
from localllm.config.decls import Key
from localllm.errors import ProblemList

_VAR = re.compile(r"\$\{([^}]*)\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_TYPE_NAMES = {
    str: "a string",
    float: "a number",
    int: "an integer",
    bool: "true or false",
    tuple: "a list of strings",
    dict: "a mapping of names to strings",
    Path: "a path",
}
_DOC_TYPES = {
    str: "string",
    float: "number",
    int: "integer",
    bool: "bool",
    tuple: "list of strings",
    dict: "map",
    Path: "path",
}
#: NAME_MAX / PATH_MAX on Linux: longer names fail every file operation
_NAME_MAX, _PATH_MAX = 255, 4096
BAD = object()


@dataclass
class Context:
    """What parsing one file needs: where it is, where problems go, the secrets it saw."""

    base_dir: Path
    problems: ProblemList
    secrets: set[str] = field(default_factory=set)
    lookup: Callable[[str], str | None] = settings.env_value


@dataclass(frozen=True)
class KeySpec:
    """One declared key: its field name, base type, whether ``None`` is allowed, its rules."""

    name: str
    type: type
    key: Key
    default: Any


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (values can be huge)."""
    try:
        text = repr(value)
    except ValueError:  # an int past the str-conversion digit limit
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean "x"?)`` for the closest candidate, or ``""``."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f' (did you mean "{found[0]}"?)' if found else ""


def text_issue(value: str) -> str:
    """Why ``value`` cannot be passed to a process, a path or a trace; ``""`` when it can."""
    if "\x00" in value:
        return "must not contain NUL bytes"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return ""


def path_issue(value: str) -> str:
    """Why ``value`` cannot be a file path on this system; ``""`` when it can."""
    issue = text_issue(value)
    if issue:
        return issue
    raw = os.fsencode(value)
    if len(raw) > _PATH_MAX or any(len(part) > _NAME_MAX for part in raw.split(b"/")):
        return f"is too long for a file name (max {_NAME_MAX} bytes per name, {_PATH_MAX} in all)"
    return ""


def expand(value: str, base_dir: Path) -> Path | None:
    """``value`` as a path: ``~`` expanded, relative to ``base_dir``; ``None`` for ``~nosuchuser``."""
    try:
        path = Path(value).expanduser()
    except RuntimeError:
        return None
    return path if path.is_absolute() else base_dir / path


def _base(hint: Any) -> tuple[type, bool]:
    """(base type, optional) of an annotation like ``int | None`` or ``tuple[str, ...]``."""
    optional = False
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    origin = typing.get_origin(hint) or hint
    return origin, optional


def declared_keys(cls: type) -> dict[str, KeySpec]:
    """The config keys of a declaration class, in field order."""
    hints = typing.get_type_hints(cls)
    out: dict[str, KeySpec] = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key")
        if isinstance(key, Key):
            base, _ = _base(hints[f.name])
            factory: Any = f.default_factory
            default = f.default if f.default is not dataclasses.MISSING else factory()
            out[f.name] = KeySpec(f.name, base, key, default)
    return out


def interpolate(value: str, lookup: Callable[[str], str | None]) -> tuple[str, list[str], list[str]]:
    """Single-pass, left-to-right ``${VAR}`` expansion: (text, problems, substituted values).

    A resolved value containing ``${`` is kept verbatim (never re-expanded). ``${}`` and
    unset variables are problems, never silent blanks.
    """
    out: list[str] = []
    problems: list[str] = []
    used: list[str] = []
    pos = 0
    for match in _VAR.finditer(value):
        out.append(value[pos : match.start()])
        name = match.group(1)
        if not name:
            problems.append("empty ${} reference")
        elif not ENV_NAME.match(name):
            problems.append(f"invalid variable name ${{{name}}}")
        else:
            resolved = lookup(name)
            if resolved is None:
                problems.append(f"env var {name} not set")
            else:
                out.append(resolved)
                used.append(resolved)
        pos = match.end()
    out.append(value[pos:])
    return "".join(out), problems, used


def parse_decl(
    cls: type, raw: Mapping[Any, Any], where: str, ctx: Context, *, skip: tuple[str, ...] = (), what: str = ""
) -> dict[str, Any]:
    """The field values ``raw`` sets for ``cls`` (only the valid ones); problems to ``ctx``.

    ``skip`` keys are read by the caller; ``what`` names the declaration in messages
    ("subprocess plugin").
    """
    spec = declared_keys(cls)
    allowed = sorted([*spec, *skip])
    values: dict[str, Any] = {}
    for raw_name, value in raw.items():
        name = str(raw_name)
        if name in skip:
            continue
        found = spec.get(name)
        if found is None:
            label = f" for {what}" if what else ""
            ctx.problems.add(
                f"{where}.{name}", f"unknown key{label}{closest(name, allowed)}", f"allowed keys: {', '.join(allowed)}"
            )
            continue
        if value is None:
            continue  # null means the default
        coerced = _coerce(found, value, f"{where}.{name}", ctx)
        if coerced is not BAD:
            values[name] = coerced
    reported = {p.key for p in ctx.problems.items}
    for group in getattr(cls, "REQUIRED", ()):
        if any(values.get(k) for k in group) or any(f"{where}.{k}" in reported for k in group):
            continue
        examples = " or ".join(spec[k].key.example for k in group if spec[k].key.example)
        needs = " or ".join(f"{k}:" for k in group)
        ctx.problems.add(where, f"{what or 'it'} requires {needs}", examples)
    return values


def _coerce(spec: KeySpec, value: Any, where: str, ctx: Context) -> Any:
    kind = spec.type
    if kind is bool:
        if isinstance(value, bool) or (isinstance(value, str) and value in spec.key.choices):
            return value  # a bool key's choices are the words it takes besides true/false
    elif kind in (int, float):
        return _number(spec, value, where, ctx)
    elif kind is str:
        if isinstance(value, str):
            return _string(spec, value, where, ctx)
    elif kind is tuple:
        return _strings(value, where, ctx)
    elif kind is dict:
        return _secret_map(spec.key.check, value, where, ctx)
    elif kind is Path and isinstance(value, str):
        return _path(spec, value, where, ctx)
    meant = str(value).strip().lower() if kind is bool and isinstance(value, str) else ""
    hint = f"write it unquoted: {where.rsplit('.', 1)[-1]}: {meant}" if meant in ("true", "false") else ""
    ctx.problems.add(where, f"must be {_TYPE_NAMES[kind]}, got {show(value)}", hint)
    return BAD


def _number(spec: KeySpec, value: Any, where: str, ctx: Context) -> Any:
    wrong = spec.type is int and isinstance(value, float)
    if wrong or isinstance(value, bool) or not isinstance(value, (int, float)):
        ctx.problems.add(where, f"must be {_TYPE_NAMES[spec.type]}, got {show(value)}", _number_hint(value, where))
        return BAD
    try:
        number = float(value) if spec.type is float else value
    except OverflowError:
        number = math.inf
    if isinstance(number, float) and not math.isfinite(number):
        ctx.problems.add(where, f"must be a finite number, got {show(value)}")
        return BAD
    rules = spec.key
    if rules.check == "positive" and number <= 0:
        ctx.problems.add(where, f"must be > 0, got {show(number)}")
        return BAD
    low, high = rules.low, rules.high
    if (low is not None and number < low) or (high is not None and number > high):
        shown = f"{low:g}" if isinstance(low, float) else low
        top = f"{high:g}" if isinstance(high, float) else high
        ctx.problems.add(where, f"must be between {shown} and {top}, got {show(number)}")
        return BAD
    return number


#: a number written as text: quoted ("30"), with a unit ("30s", as --keep-alive takes it), or
#: an exponent without a dot (YAML reads 1e3 as text; 1.0e3 is a number)
_NUMBER_TEXT = re.compile(r"\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(?:s|sec|secs|seconds)?\s*")


def _number_hint(value: Any, where: str) -> str:
    """How to write ``value`` as the number it means, when it is one written as text."""
    found = _NUMBER_TEXT.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return ""
    number = float(found.group(1))
    if not math.isfinite(number):  # 1e309: no number to suggest (the range check says why)
        return ""
    shown = str(int(number)) if number.is_integer() and number < 1e15 else found.group(1)
    return f"write the number alone, unquoted: {where.rsplit('.', 1)[-1]}: {shown}"


def _string(spec: KeySpec, value: str, where: str, ctx: Context) -> Any:
    issue = text_issue(value)
    if issue:
        ctx.problems.add(where, issue)
        return BAD
    check = spec.key.check
    if spec.key.choices and value not in spec.key.choices:
        ctx.problems.add(
            where, f"must be one of {', '.join(spec.key.choices)}, got {show(value)}{closest(value, spec.key.choices)}"
        )
        return BAD
    if check == "env_name":
        if value == "":
            return None  # "" disables auth (contract §9)
        if not ENV_NAME.match(value):
            ctx.problems.add(
                where,
                "must be the NAME of an environment variable (not the key itself)",
                'e.g. api_key_env: GLM_API_KEY, or "" for no auth',
            )
            return BAD
    elif check in ("url", "api_base"):
        problem = url_issue(value)
        if problem:
            ctx.problems.add(where, problem, "e.g. http://127.0.0.1:8080")
            return BAD
        operation = api_operation(value) if check == "api_base" else ""
        if operation:
            base = value[: value.rstrip("/").rindex(operation)]
            ctx.problems.add(
                where,
                f"is the URL of one API operation ({operation}), not the server's: {show(value)}",
                f"endpoint: {base} (the server's root or its /v1: the /v1/… paths are added to it)",
            )
            return BAD
    elif check in ("executable", "program"):
        return _program(value, where, ctx, must_exist=check == "executable")
    elif check in ("fallback", "name") and not value:
        ctx.problems.add(where, "must not be empty")
        return BAD
    return value


def url_issue(value: str) -> str:
    """Why ``value`` is not a usable http(s) URL; ``""`` when it is."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc}): {show(value)}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http(s) URL, got {show(value)}"
    if port == 0:
        return "port must be between 1 and 65535"
    if not value.isascii() or any(ch.isspace() for ch in value):
        return f"must be an ASCII URL without spaces, got {show(value)}"
    return ""


#: the OpenAI operations a base URL is mistaken for when copied from an API's docs
_API_OPERATIONS = ("/chat/completions", "/completions", "/embeddings", "/models")


def api_operation(value: str) -> str:
    """The OpenAI operation a declared base URL ends with (``…/v1/chat/completions`` →
    ``/chat/completions``), or ``""``: localllm appends ``/v1/<operation>`` to the base."""
    path = urlsplit(value).path.rstrip("/")
    return next((op for op in _API_OPERATIONS if path.endswith(op)), "")


def _program(value: str, where: str, ctx: Context, *, must_exist: bool) -> Any:
    """A path-like value (``./llama-server``, ``bin/x``, ``~/x``) resolved against the config
    directory; a bare name looked up on PATH. ``executable`` values must exist now."""
    issue = path_issue(value)
    if issue:
        ctx.problems.add(where, issue)
        return BAD
    if "/" not in value and not value.startswith("~"):
        found = shutil.which(value, path=ctx.lookup("PATH"))
        if found is None:
            if must_exist:
                ctx.problems.add(where, f"{value!r} is not on PATH", "give a path (relative to the config file)")
                return BAD
            return value
        return found
    full = expand(value, ctx.base_dir)
    if full is None:
        ctx.problems.add(where, f"cannot expand {show(value)}: no such user")
        return BAD
    try:
        ok = full.is_file() and os.access(full, os.X_OK)
        exists = full.exists()
    except (OSError, ValueError) as exc:
        ctx.problems.add(where, f"cannot check {full}: {exc}")
        return BAD
    if not ok and (must_exist or exists):
        what = "is not an executable file" if exists else "not found"
        ctx.problems.add(where, f"{full} {what}", "fix the path (relative to the config file) or chmod +x it")
        return BAD
    return str(full)


def _path(spec: KeySpec, value: str, where: str, ctx: Context) -> Any:
    issue = path_issue(value)
    if issue or not value:
        ctx.problems.add(where, issue or "must not be empty")
        return BAD
    full = expand(value, ctx.base_dir)
    if full is None:
        ctx.problems.add(where, f"cannot expand {show(value)}: no such user")
        return BAD
    if spec.key.check == "json_file":
        return read_json_under(full, value, where, ctx)
    if spec.key.check == "under" and inside(ctx.base_dir, value) is None:
        ctx.problems.add(
            where, f"{value!r} is outside the config directory {ctx.base_dir}", "keep it under the config directory"
        )
        return BAD
    return full


def _strings(value: Any, where: str, ctx: Context) -> Any:
    items = value if isinstance(value, list) else None
    out: list[str] = []
    for item in items or ():
        if (
            isinstance(item, bool)
            or not isinstance(item, (str, int, float))
            or (isinstance(item, float) and not math.isfinite(item))
        ):
            items = None
            break
        text = item if isinstance(item, str) else show(item, 100)
        issue = text_issue(text)
        if issue:
            ctx.problems.add(where, f"item {show(text)}: {issue}")
            return BAD
        out.append(text)
    if items is None:
        ctx.problems.add(where, f"must be a list of strings, got {show(value)}")
        return BAD
    return tuple(out)


def _secret_map(check: str, raw: Any, where: str, ctx: Context) -> Any:
    """``env:``/``headers:`` → interpolated str→str map (values are secrets: never echoed)."""
    if not isinstance(raw, dict):
        ctx.problems.add(where, f"must be a mapping of names to strings, got {type(raw).__name__}")
        return BAD
    out: dict[str, str] = {}
    for raw_name, val in raw.items():
        name = str(raw_name)
        name_ok = ENV_NAME.match(name) if check == "env" else _HEADER_NAME.match(name)
        if not name_ok:
            ctx.problems.add(
                f"{where}.{name}", f"is not a valid {'environment variable' if check == 'env' else 'header'} name"
            )
        elif isinstance(val, bool) or not isinstance(val, (str, int, float)):
            ctx.problems.add(f"{where}.{name}", "must be a string")
        else:
            text = _secret_value(check, name, val if isinstance(val, str) else show(val), where, ctx)
            if text is not None:
                out[name] = text
    return out


def _secret_value(check: str, name: str, value: str, where: str, ctx: Context) -> str | None:
    """One interpolated value, remembered as a secret; ``None`` after a problem."""
    owner, section = where.rsplit(".", 1)
    text, issues, used = interpolate(value, ctx.lookup)
    for issue in issues:
        if issue.startswith("env var "):
            var = issue.split()[2]
            ctx.problems.add(
                owner,
                f"env var {var} referenced in {section}.{name} not set",
                f"export {var}=… before loading, or remove the reference",
            )
        else:
            ctx.problems.add(f"{where}.{name}", issue, "write ${NAME} with a variable name")
    problem = text_issue(text) or (_header_value_issue(text) if check == "headers" else "")
    if problem:  # never quote the value: it may be a secret
        ctx.problems.add(f"{where}.{name}", f"value {problem}")
        return None
    if used:  # only what ${VAR} resolved is secret: a plain value is configuration, shown as is
        ctx.secrets.update(v for v in (text, *used) if v)
        if check == "headers" and " " in text:
            ctx.secrets.add(text.split(" ", 1)[1])  # the token of "Bearer <token>"
    return text


def _header_value_issue(text: str) -> str:
    if not text.isascii():
        return "must be ASCII (HTTP header values are sent as ASCII)"
    if any(ch in text for ch in "\r\n") or any(ord(ch) < 32 and ch != "\t" for ch in text):
        return "must not contain control characters (CR, LF, …)"
    return ""


# ----------------------------------------------------------------------------- reference


def _default_text(spec: KeySpec) -> str:
    value = spec.default
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, dict)):
        return "[]" if isinstance(value, tuple) else "{}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if value != "" else '""'


def reference_table(sections: Mapping[str, type]) -> str:
    """The README's configuration table: one row per key of each declaration class (keys
    of a base class listed earlier are not repeated)."""
    rows = ["| section | key | type | default | meaning |", "|---|---|---|---|---|"]
    shown: list[type] = []
    for section, cls in sections.items():
        groups = {k for group in getattr(cls, "REQUIRED", ()) for k in group}
        inherited = {name for base in shown if issubclass(cls, base) for name in declared_keys(base)}
        shown.append(cls)
        for spec in declared_keys(cls).values():
            if spec.name in inherited:
                continue
            kind = _DOC_TYPES[spec.type]
            if spec.key.low is not None or spec.key.high is not None:
                low, high = spec.key.low, spec.key.high
                kind += f" {low:g}–{high:g}" if isinstance(low, float) else f" {low}–{high}"
            if spec.key.check == "positive":
                kind += " > 0"
            mine = [g for g in getattr(cls, "REQUIRED", ()) if spec.name in g]
            required = (
                " **required**"
                if mine and len(mine[0]) == 1
                else (" **one of** " + "/".join(sorted(mine[0])) if mine else "")
            )
            choices = f" ({', '.join(spec.key.choices)})" if spec.key.choices else ""
            if spec.type is bool and spec.key.choices:  # the words a bool key takes besides true/false
                kind, choices = " or ".join((kind, *spec.key.choices)), ""
            default = "—" if spec.name in groups else _default_text(spec)
            rows.append(f"| {section} | `{spec.name}` | {kind} | {default} | {spec.key.doc}{choices}{required} |")
    return "\n".join(rows) + "\n"


def read_json_under(full: Path, raw: str, key: str, ctx: Context) -> Any:
    """``full`` (written ``raw``) if it lies under the config directory and parses as JSON."""
    path = inside(ctx.base_dir, raw)
    if path is None:
        ctx.problems.add(
            key, f"{raw!r} is outside the config directory {ctx.base_dir}", "keep it under the config directory"
        )
        return BAD
    try:
        json.loads(read_capped(path, TEXT_LIMIT, regular=True).decode("utf-8"))
    except FileNotFoundError:
        # §2: selection is evidence metadata first; `localllm eval` writes the file later
        # (`check` warns, and runtime selection stays on the gate's agent until it exists)
        return path
    except (OSError, UnicodeError, ValueError, RecursionError) as exc:
        ctx.problems.add(key, f"{path} is not readable JSON: {show(str(exc), 120)}")
        return BAD
    return path
