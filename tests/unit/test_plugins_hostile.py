"""Hostile plugin directories (issue 10 item 18, issue 11): lone surrogates, YAML bombs and
tags, and the skill fields the Agent Skills reference validator accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.plugins import PluginLoaded, PluginRejected, load_agent_plugin
from localllm.plugins.files import MAX_YAML_DEPTH, MAX_YAML_NODES
from tests.conftest import REPO
from tests.unit.test_plugins_loader import full_plugin, loaded, manifest, rules

SURROGATE = "\\ud800"  # as written in the file: a JSON / YAML escape


def check_json(root: Path) -> tuple[int, dict[str, Any]]:
    """``localllm plugins check ROOT --json`` in a real process: exit code and parsed stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "localllm", "plugins", "check", os.fsdecode(root), "--json"],
        capture_output=True,
        cwd=str(REPO),
        timeout=60,
        check=False,
    )
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    return proc.returncode, json.loads(proc.stdout)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- lone surrogates


def test_surrogate_in_plugin_json_rejects_the_plugin_with_a_diagnostic(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    text = json.dumps(manifest(description="x")).replace('"x"', f'"a{SURROGATE}b"')
    _write(root / "plugin.json", text)
    result = load_agent_plugin(root)
    assert isinstance(result, PluginRejected)
    (diag,) = result.diagnostics
    assert (diag.rule, diag.origin) == ("manifest-invalid-json", f"{root / 'plugin.json'}#/description")
    code, out = check_json(root)
    assert code == 1 and out["diagnostics"][0]["rule"] == "manifest-invalid-json"


def test_surrogate_key_in_mcp_json_disables_mcp_only(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    _write(root / "mcp.json", '{"mcpServers": {"s' + SURROGATE + '": {"type": "stdio", "command": "x"}}}')
    result = loaded(load_agent_plugin(root))
    assert result.mcp_servers == () and [s.name for s in result.skills] == ["alpha", "beta"]
    assert rules(result) == ["mcp-config-invalid-json"]
    assert "/mcpServers/s\\ud800" in result.diagnostics[0].message
    code, out = check_json(root)
    assert code == 0 and [d["rule"] for d in out["diagnostics"]] == ["mcp-config-invalid-json"]


@pytest.mark.parametrize("field", ["description", "metadata"])
def test_surrogate_in_skill_md_skips_that_skill(tmp_path: Path, field: str) -> None:
    root = full_plugin(tmp_path)
    value = f'"x{SURROGATE}"' if field == "description" else f'{{k: "x{SURROGATE}"}}'
    extra = "description: ok\n" if field != "description" else ""
    _write(root / "skills" / "gamma" / "SKILL.md", f"---\nname: gamma\n{extra}{field}: {value}\n---\nBody\n")
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    assert rules(result) == ["skill-frontmatter-invalid-yaml"]
    code, out = check_json(root)
    assert code == 0 and len(out["skills"]) == 2


def test_undecodable_file_names_give_printable_diagnostics(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    weird = os.fsencode(root / "skills") + b"/caf\xe9"
    os.mkdir(weird)
    with open(weird + b"/SKILL.md", "w", encoding="utf-8") as fh:
        fh.write("---\nname: cafe\ndescription: x\n---\n")
    with open(os.fsencode(root / "flows") + b"/caf\xe9.flow.yaml", "w", encoding="utf-8") as fh:
        fh.write("name: cafe\nstart: a\nnodes:\n  - {id: a, kind: reply}\n")
    result = loaded(load_agent_plugin(root))
    assert rules(result) == ["skill-name-mismatch", "flow-file-name-invalid"]
    assert sorted(f.name for f in result.flows) == ["greet", "refund"]
    for d in result.diagnostics:
        str(d).encode("utf-8")
        assert "\\udce9" in d.origin
    code, out = check_json(root)
    assert code == 0 and len(out["diagnostics"]) == 2


# --------------------------------------------------------------------------- reference-validator fields


def test_allowed_tools_list_and_nested_metadata_are_accepted(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    _write(
        root / "skills" / "gamma" / "SKILL.md",
        "---\nname: gamma\ndescription: x\nallowed-tools:\n  - Bash\n  - Read\n"
        "metadata:\n  author: acme\n  version: 1.0\n  released: 2025-01-02\n  nested:\n    k: v\n    n: [1, 2]\n"
        "---\nBody\n",
    )
    result = loaded(load_agent_plugin(root))
    assert rules(result) == []
    gamma = next(s for s in result.skills if s.name == "gamma")
    assert gamma.allowed_tools == "Bash Read"
    assert dict(gamma.metadata) == {
        "author": "acme",
        "version": "1.0",
        "released": "2025-01-02",
        "nested": '{"k": "v", "n": [1, 2]}',
    }


# --------------------------------------------------------------------------- YAML bombs and tags


def _laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels + 1):
        refs = ", ".join(f"*a{i - 1}" for _ in range(10))
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


BAD_FRONT = {
    "billion-laughs": (f"name: gamma\ndescription: x\nmetadata:\n  bomb: 1\n{_laughs()}", "nodes once aliases"),
    "recursive-alias": ("name: gamma\ndescription: x\nmetadata: &m {k: *m}\n", "recursive"),
    "deep-flow": ("name: gamma\ndescription: x\nmetadata: {k: " + "[" * 5000 + "]" * 5000 + "}\n", "nest"),
    "deep-block": (
        "name: gamma\ndescription: x\nmetadata:\n"
        + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(800))
        + " " * 801
        + "v\n",
        "nest",
    ),
    "timestamp-tag": ("name: gamma\ndescription: !!timestamp banana\n", "AttributeError"),
    "bool-tag": ("name: gamma\ndescription: x\nlicense: !!bool maybe\n", "KeyError"),
    "python-tag": ("name: gamma\ndescription: !!python/object/apply:os.system [echo]\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(BAD_FRONT))
def test_yaml_bombs_and_bad_tags_skip_the_skill_fast(tmp_path: Path, case: str) -> None:
    front, problem = BAD_FRONT[case]
    root = full_plugin(tmp_path)
    _write(root / "skills" / "gamma" / "SKILL.md", f"---\n{front}---\nBody\n")
    started = time.monotonic()
    result = load_agent_plugin(root)
    assert time.monotonic() - started < 5.0
    assert isinstance(result, PluginLoaded)
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    (diag,) = result.diagnostics
    assert diag.rule == "skill-frontmatter-invalid-yaml" and problem in diag.message


def test_flow_yaml_bomb_skips_that_flow(tmp_path: Path) -> None:
    root = full_plugin(
        tmp_path, **{"flows/bomb.flow.yaml": "name: bomb\nstart: a\nnodes: [{id: a, kind: x}]\n" + _laughs()}
    )
    result = loaded(load_agent_plugin(root))
    assert sorted(f.name for f in result.flows) == ["greet", "refund"]
    assert rules(result) == ["flow-invalid-yaml"]
    assert str(MAX_YAML_NODES) in result.diagnostics[0].message


def test_bounds_leave_ordinary_yaml_alone(tmp_path: Path) -> None:
    root = full_plugin(
        tmp_path,
        **{
            "flows/anchors.flow.yaml": "name: anchors\nstart: a\nbase: &b {kind: reply}\n"
            "nodes:\n  - {id: a, kind: reply, opts: *b}\n  - {id: b, kind: reply, opts: *b}\n"
        },
    )
    _write(
        root / "skills" / "gamma" / "SKILL.md",
        "---\nname: gamma\ndescription: x\nmetadata:\n  deep:\n"
        + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(MAX_YAML_DEPTH - 4))
        + "  " * MAX_YAML_DEPTH
        + "v\n---\n",
    )
    result = loaded(load_agent_plugin(root))
    assert rules(result) == []
    assert "anchors" in [f.name for f in result.flows] and "gamma" in [s.name for s in result.skills]
