"""The files a config names: prompts, schemas, evidence, GGUFs — found, inside, readable.

Every path is checked as text first (:func:`~localllm.config.fields.path_issue`) so no
file operation can fail on a NUL, a lone surrogate or an over-long name, and every file
operation's ``OSError`` becomes a problem naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._fs import TEXT_LIMIT, inside, read_capped
from localllm.config.fields import expand, path_issue, show

if TYPE_CHECKING:
    from localllm.config.fields import Context

_PROMPT_SUFFIXES = (".md", ".txt", ".prompt", ".tmpl", ".j2")
TEMPLATE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TEMPLATE_REF = re.compile(r"^(args|world)\.[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


def resolve_prompt(raw: Any, key: str, ctx: Context) -> tuple[str, Path | None]:
    """A prompt value is a file path (relative to the config) when one exists, else inline text."""
    if not isinstance(raw, str) or not raw.strip():
        ctx.problems.add(key, "prompt is required: inline text or a path to a prompt file")
        return "", None
    issue = path_issue(raw)
    if issue and "\n" not in raw and raw.endswith(_PROMPT_SUFFIXES):
        ctx.problems.add(key, f"prompt file name {issue}")
        return "", None
    looks_like_path = "\n" not in raw and "{{" not in raw and not issue
    if looks_like_path:
        candidate = ctx.base_dir / raw
        try:
            if candidate.is_file():
                if inside(ctx.base_dir, raw) is None:
                    ctx.problems.add(
                        key,
                        f"prompt file {candidate} is outside the config directory {ctx.base_dir}",
                        "keep prompt files under the config directory",
                    )
                    return "", None
                return read_capped(candidate, TEXT_LIMIT, regular=True).decode("utf-8"), candidate.resolve()
            meant = _meant_as_file(raw, candidate)
        except (OSError, UnicodeError) as exc:
            ctx.problems.add(key, f"cannot read prompt file {candidate}: {exc}")
            return "", candidate
        if meant:
            ctx.problems.add(
                key,
                f"prompt file {candidate} {meant}",
                "fix the path (relative to the config file); inline prompt text has a space in it",
            )
            return "", None
    return raw, None


def _meant_as_file(raw: str, candidate: Path) -> str:
    """Why a single-line prompt that is not a file still names one (``"not found"``,
    ``"is a directory"``), or ``""`` for inline text. ``prompts/triage`` (its directory
    exists, no space) names a file as surely as ``triage.md`` does: sending the path to
    the model as the prompt would answer, and wrongly, instead of failing here."""
    if candidate.is_dir():
        return "is a directory"
    if raw.endswith(_PROMPT_SUFFIXES):
        return "not found"
    one_word = not any(ch.isspace() for ch in raw)
    return "not found" if one_word and "/" in raw and candidate.parent.is_dir() else ""


def template_issue(text: str, extra: tuple[str, ...] = ()) -> str:
    """The first ``{{ … }}`` in ``text`` that is not ``args.NAME`` / ``world.NAME`` (or one of
    the ``extra`` names, e.g. a gate's ``{{ examples }}``)."""
    for match in TEMPLATE.finditer(text):
        expr = match.group(1)
        if not _TEMPLATE_REF.match(expr) and expr not in extra:
            name = expr.partition(".")[2] if "." in expr else expr  # {{ arg.name }}, {{ ticket }}
            meant = f"{{{{ args.{name} }}}} or {{{{ world.{name} }}}}" if _NAME.match(name) else ""
            return f"unsupported template {{{{ {expr} }}}} (use {meant or '{{ args.NAME }} or {{ world.NAME }}'})"
    return ""


def schema_file(raw: Any, key: str, ctx: Context) -> Path | None:
    """A static ``with.schema``: the file under the config directory (its content is checked
    by the loader); a templated one: at least one file must match its pattern."""
    if not isinstance(raw, str) or not raw or path_issue(raw):
        ctx.problems.add(key, "must be a path to a JSON Schema file relative to the config file")
        return None
    if "{{" in raw:
        issue = template_issue(raw)
        pattern = TEMPLATE.sub("*", raw)
        if issue:
            ctx.problems.add(key, issue)
        elif inside(ctx.base_dir, pattern.replace("*", "x")) is None:
            ctx.problems.add(key, f"schema {raw!r} is outside the config directory {ctx.base_dir}")
        elif not _glob(ctx.base_dir, pattern):
            ctx.problems.add(
                key,
                f"no schema file matches {pattern!r} under {ctx.base_dir}",
                "the template is resolved per call; at least one file must exist",
            )
        return None
    path = inside(ctx.base_dir, raw)
    if path is None:
        ctx.problems.add(
            key,
            f"schema {raw!r} is outside the config directory {ctx.base_dir}",
            "keep schemas under the config's directory",
        )
    return path


def _glob(base_dir: Path, pattern: str) -> bool:
    if Path(pattern).is_absolute():  # pathlib globs relative patterns only
        return False
    try:
        return any(p.is_file() for p in base_dir.glob(pattern))
    except (OSError, ValueError):
        return False


def gguf_issue(model: str, base_dir: Path) -> tuple[Path | None, str]:
    """(resolved path, problem) for a ``*.gguf`` model value."""
    issue = path_issue(model)
    if issue:
        return None, issue
    full = expand(model, base_dir)
    if full is None:
        return None, f"cannot expand {show(model)}: no such user"
    try:
        found = full.is_file()
    except (OSError, ValueError) as exc:
        return None, f"cannot check {full}: {exc}"
    return full, "" if found else f"model file {full} not found"
