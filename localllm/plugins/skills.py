"""``skills/`` (Agent Plugins 1.0.0 §7.1): each immediate child directory with a ``SKILL.md``.

A skill must follow the Agent Skills format: YAML front matter between ``---`` lines
with ``name`` (1-64 of a-z, 0-9 and single hyphens, equal to the directory name) and
``description`` (1-1024 characters); optional ``license``, ``compatibility`` (≤ 500),
``metadata`` and ``allowed-tools``. A skill that breaks a rule is skipped with a
diagnostic; the others load. Deeper directories are never searched.

As the Agent Skills reference validator (``skills-ref``) does: ``allowed-tools`` may be a
string or a YAML list of strings (kept space-delimited, ``Bash Read``), and ``metadata``
is any mapping whose values are kept as text — strings as written, other scalars and
nested values as their JSON text (``1.0`` → ``"1.0"``, ``{a: b}`` → ``'{"a": "b"}'``).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

from localllm.errors import truncate_detail
from localllm.plugins import files
from localllm.plugins.diagnostics import Diagnostic
from localllm.plugins.result import Skill

SKILLS_DIR = "skills"
SKILL_FILE = "SKILL.md"
SECTION = "skills"

_SKILL_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
SKILL_NAME_RULES = "1-64 characters of a-z, 0-9 and '-', not starting or ending with '-', without '--'"


def valid_skill_name(name: object) -> bool:
    """True if ``name`` satisfies the Agent Skills ``name`` rules."""
    return isinstance(name, str) and 1 <= len(name) <= 64 and _SKILL_NAME.fullmatch(name) is not None


def load_skills(root: Path, shown_root: Path) -> tuple[list[Skill], list[Diagnostic]]:
    """Discover and validate every skill under ``skills/``; missing ``skills/`` is fine."""
    probe = files.probe_location(root / SKILLS_DIR, root, section=SECTION, want_dir=True, clause="6.2")
    if isinstance(probe, files.Missing):
        return [], []
    if probe is not None:
        return [], [_shown(probe, shown_root / SKILLS_DIR)]
    try:
        with os.scandir(root / SKILLS_DIR) as it:
            names = sorted(entry.name for entry in it)
    except OSError as exc:
        return [], [
            Diagnostic(
                SECTION,
                "unreadable",
                str(shown_root / SKILLS_DIR),
                f"cannot list skills/: {exc.strerror or exc}",
                clause="7.1",
            )
        ]
    skills: list[Skill] = []
    diagnostics: list[Diagnostic] = []
    for name in names:
        if name.startswith("."):
            continue  # .git, .DS_Store: never skills
        directory = root / SKILLS_DIR / name
        try:
            if not directory.is_dir():
                continue  # a README or other file beside the skills: not a skill, not an error
        except OSError:
            continue
        skill, problems = _load_one(root, directory, shown_root / SKILLS_DIR / name)
        diagnostics.extend(problems)
        if skill is not None:
            skills.append(skill)
    return skills, diagnostics


def _load_one(root: Path, directory: Path, shown: Path) -> tuple[Skill | None, list[Diagnostic]]:
    md = directory / SKILL_FILE
    where = str(shown / SKILL_FILE)
    probe = files.probe_location(md, root, section=SECTION, want_dir=False, clause="7.1")
    if isinstance(probe, files.Missing):
        return None, [
            Diagnostic(
                SECTION,
                "skill-md-missing",
                where,
                f"skills/{directory.name}/ has no {SKILL_FILE}; it is not loaded as a skill",
                severity="warning",
                clause="7.1",
            )
        ]
    if probe is not None:
        return None, [_shown(probe, Path(where))]
    text = files.read_text(md, section=SECTION, clause="7.1")
    if isinstance(text, Diagnostic):
        return None, [_shown(text, Path(where))]
    parsed = _front_matter(text, where)
    if isinstance(parsed, Diagnostic):
        return None, [parsed]
    front, body = parsed
    problem = _check_fields(front, directory.name, where)
    if problem is not None:
        return None, [problem]
    metadata = {_as_text(k): _as_text(v) for k, v in (front.get("metadata") or {}).items()}
    tools = front.get("allowed-tools")
    return Skill(
        name=front["name"],
        description=front["description"],
        path=directory,
        body=body,
        license=front.get("license"),
        compatibility=front.get("compatibility"),
        metadata=MappingProxyType(metadata),
        allowed_tools=" ".join(tools) if isinstance(tools, list) else tools,
    ), []


def _front_matter(text: str, where: str) -> tuple[dict[str, Any], str] | Diagnostic:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        return Diagnostic(
            SECTION,
            "skill-frontmatter-missing",
            where,
            f"{SKILL_FILE} must start with a '---' line opening YAML front matter (name, description)",
            clause="7.1",
        )
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        return Diagnostic(
            SECTION,
            "skill-frontmatter-unterminated",
            where,
            "the YAML front matter is never closed by a '---' line",
            clause="7.1",
        )
    front = files.parse_yaml(
        "".join(lines[1:end]), where, section=SECTION, rule="skill-frontmatter-invalid-yaml", clause="7.1", first_line=2
    )
    if isinstance(front, Diagnostic):
        return front
    if not isinstance(front, dict):
        return Diagnostic(
            SECTION,
            "skill-frontmatter-not-mapping",
            where,
            "front matter must be a YAML mapping with name and description",
            clause="7.1",
        )
    return front, "".join(lines[end + 1 :])


def _check_fields(front: dict[Any, Any], dirname: str, where: str) -> Diagnostic | None:
    name = front.get("name")
    if name is None:
        return Diagnostic(
            SECTION, "skill-name-missing", where, f'front matter has no "name"; add `name: {dirname}`', clause="7.1"
        )
    if not valid_skill_name(name):
        shown = truncate_detail(repr(name), 80)
        return Diagnostic(
            SECTION, "skill-name-invalid", where, f"skill name {shown} is invalid: use {SKILL_NAME_RULES}", clause="7.1"
        )
    if name != dirname:
        return Diagnostic(
            SECTION,
            "skill-name-mismatch",
            where,
            f"front matter name {name!r} does not match its directory {dirname!r}; rename one so they are equal",
            clause="7.1",
        )
    description = front.get("description")
    if not isinstance(description, str) or not description.strip() or len(description) > 1024:
        return Diagnostic(
            SECTION,
            "skill-description-invalid",
            where,
            '"description" must be a non-empty string of at most 1024 characters',
            clause="7.1",
        )
    if "license" in front and not isinstance(front["license"], str):
        return Diagnostic(SECTION, "skill-field-invalid", where, "'license' must be a string", clause="7.1")
    tools = front.get("allowed-tools")
    if (
        tools is not None
        and not isinstance(tools, str)
        and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools))
    ):
        return Diagnostic(
            SECTION, "skill-field-invalid", where, "'allowed-tools' must be a string or a list of strings", clause="7.1"
        )
    compat = front.get("compatibility")
    if compat is not None and (not isinstance(compat, str) or len(compat) > 500):
        return Diagnostic(
            SECTION,
            "skill-field-invalid",
            where,
            '"compatibility" must be a string of at most 500 characters',
            clause="7.1",
        )
    meta = front.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return Diagnostic(
            SECTION, "skill-field-invalid", where, '"metadata" must be a mapping of names to values', clause="7.1"
        )
    return None


def _as_text(value: Any) -> str:
    """A metadata key or value as text: strings as written, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return json.dumps(_string_keys(value), ensure_ascii=False, default=str)


def _string_keys(value: Any) -> Any:
    """``value`` with every mapping key as text (YAML allows dates, numbers, nulls as keys;
    ``json.dumps`` refuses a date key, which rejected the whole plugin)."""
    if isinstance(value, dict):
        return {_as_text(k): _string_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_string_keys(v) for v in value]
    return value


def _shown(d: Diagnostic, where: Path) -> Diagnostic:
    return Diagnostic(d.component, d.rule, str(where), d.message, d.severity, d.clause)
