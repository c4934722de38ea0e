"""Agent Plugins directory loader: the blast-radius table, manifest, skills and flows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from localllm.plugins import (
    PluginLoaded,
    PluginRejected,
    load_agent_plugin,
)
from localllm.plugins.schemas import mcp_schema, plugin_schema
from tests.conftest import SHARED

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"


def write_tree(root: Path, files: dict[str, Any]) -> Path:
    """Create ``files`` (relative path → text, or JSON-able value) under ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return root


def manifest(name: str = "acme", **extra: Any) -> dict[str, Any]:
    return {"$schema": PLUGIN_SCHEMA, "name": name, **extra}


def skill(name: str, description: str = "Does a thing.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n# {name}\nInstructions.\n"


def stdio(command: str = "python3", **extra: Any) -> dict[str, Any]:
    return {"type": "stdio", "command": command, **extra}


def mcp(**servers: Any) -> dict[str, Any]:
    return {"$schema": MCP_SCHEMA, "mcpServers": servers}


FLOW = {"name": "refund", "start": "a", "nodes": [{"id": "a", "kind": "reply", "next": {"end": "done"}}]}


def full_plugin(tmp_path: Path, **overrides: Any) -> Path:
    files: dict[str, Any] = {
        "plugin.json": manifest(version="1.2.0", description="Acme tools"),
        "skills/alpha/SKILL.md": skill("alpha"),
        "skills/beta/SKILL.md": skill("beta"),
        "mcp.json": mcp(one=stdio(), two=stdio("node", args=["x"])),
        "flows/refund.flow.json": FLOW,
        "flows/greet.flow.yaml": "name: greet\nstart: hi\nnodes:\n  - {id: hi, kind: reply}\n",
    }
    files.update(overrides)
    return write_tree(tmp_path / "plugins" / "acme", {k: v for k, v in files.items() if v is not None})


def loaded(result: Any) -> PluginLoaded:
    assert isinstance(result, PluginLoaded), [str(d) for d in result.diagnostics]
    assert result.ok is True
    return result


def rules(result: Any) -> list[str]:
    return [d.rule for d in result.diagnostics]


# ----------------------------------------------------------------------------- happy path


def test_full_plugin_loads_every_component(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    result = loaded(load_agent_plugin(root))
    assert result.manifest.name == "acme"
    assert result.manifest.version == "1.2.0"
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    assert result.skills[0].description == "Does a thing."
    assert "Instructions." in result.skills[0].body
    assert [s.name for s in result.mcp_servers] == ["one", "two"]
    assert [f.name for f in result.flows] == ["greet", "refund"]
    assert result.diagnostics == ()
    assert result.root == Path(os.path.realpath(root))
    # PLUGIN_DATA is the sibling data/<plugin-name> directory, and loading never creates it.
    assert result.data_dir == tmp_path / "plugins" / "data" / "acme"
    assert not result.data_dir.exists()


def test_data_root_overrides_the_data_directory(tmp_path: Path) -> None:
    root = full_plugin(tmp_path)
    result = loaded(load_agent_plugin(root, data_root=tmp_path / "state"))
    assert result.data_dir == tmp_path / "state" / "acme"


def test_embedded_schemas_match_the_published_ones() -> None:
    spec = SHARED / "spec" / "agent-plugins-1.0.0"
    assert plugin_schema() == json.loads((spec / "plugin.schema.json").read_text())
    assert mcp_schema() == json.loads((spec / "mcp.schema.json").read_text())


# ----------------------------------------------------------------------------- blast radii


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        (None, "manifest-missing"),
        ("{not json", "manifest-invalid-json"),
        ("[1, 2]", "manifest-not-object"),
        ({"name": "acme"}, "manifest-schema-missing"),
        (
            {"$schema": "https://agent-plugins.org/schemas/2.0.0/plugin.schema.json", "name": "acme"},
            "manifest-unsupported-version",
        ),
        ({"$schema": "https://example.com/x.json", "name": "acme"}, "manifest-schema-unrecognized"),
        ({"$schema": PLUGIN_SCHEMA}, "manifest-name-missing"),
        (manifest("My-Plugin"), "manifest-name-invalid"),
        (manifest("-start"), "manifest-name-invalid"),
        (manifest("has--double"), "manifest-name-invalid"),
        (manifest("too.many..dots"), "manifest-name-invalid"),
        (manifest(""), "manifest-name-invalid"),
        (manifest("a" * 65), "manifest-name-invalid"),
        (manifest("acme\n"), "manifest-name-invalid"),
        (manifest(version=3), "manifest-schema-violation"),
        (manifest(author={"name": "x", "phone": "1"}), "manifest-schema-violation"),
        (manifest(keywords=["ok", 3]), "manifest-schema-violation"),
    ],
)
def test_bad_plugin_json_rejects_the_whole_plugin(tmp_path: Path, content: Any, rule: str) -> None:
    root = full_plugin(tmp_path, **{"plugin.json": content})
    result = load_agent_plugin(root)
    assert isinstance(result, PluginRejected)
    assert result.ok is False
    assert rule in rules(result)
    assert all(d.component == "manifest" for d in result.diagnostics)
    assert result.message.startswith("error: manifest/")
    # Nothing else is discovered: rejected results carry only manifest diagnostics.
    assert not any(d.component in ("skills", "mcp", "flows") for d in result.diagnostics)


def test_schema_violation_origin_names_file_and_pointer(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"plugin.json": manifest(author={"name": 5})})
    result = load_agent_plugin(root)
    assert isinstance(result, PluginRejected)
    (diag,) = [d for d in result.diagnostics if d.rule == "manifest-schema-violation"]
    assert diag.origin == f"{root / 'plugin.json'}#/author/name"
    assert diag.clause == "5.2"


def test_unknown_manifest_field_and_bad_extensions_are_reported_not_fatal(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"plugin.json": manifest(hooks="./x", extensions=["nope"])})
    result = loaded(load_agent_plugin(root))
    found = {d.rule: d for d in result.diagnostics}
    assert found["manifest-unknown-field"].severity == "warning"
    assert found["manifest-unknown-field"].origin.endswith("plugin.json#/hooks")
    assert found["manifest-extensions-not-object"].severity == "warning"
    assert dict(result.manifest.extensions) == {}
    assert len(result.skills) == 2


def test_extension_namespaces_are_kept_opaque(tmp_path: Path) -> None:
    ext = {"com.example.client": {"anything": [1, {"deep": True}]}}
    root = full_plugin(tmp_path, **{"plugin.json": manifest(extensions=ext)})
    result = loaded(load_agent_plugin(root))
    assert result.manifest.extensions["com.example.client"] == {"anything": [1, {"deep": True}]}
    assert result.diagnostics == ()


def test_bad_mcp_json_disables_mcp_only(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"mcp.json": "{ broken"})
    result = loaded(load_agent_plugin(root))
    assert result.mcp_servers == ()
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    assert [f.name for f in result.flows] == ["greet", "refund"]
    (diag,) = result.diagnostics
    assert (diag.component, diag.rule, diag.severity) == ("mcp", "mcp-config-invalid-json", "error")
    assert "MCP is disabled" in diag.message


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        ("[]", "mcp-config-invalid"),
        ({"mcpServers": {}}, "mcp-config-invalid"),
        ({"$schema": MCP_SCHEMA}, "mcp-config-invalid"),
        ({"$schema": MCP_SCHEMA, "mcpServers": []}, "mcp-config-invalid"),
        ({"$schema": MCP_SCHEMA, "mcpServers": {}, "extra": 1}, "mcp-config-invalid"),
        (
            {"$schema": "https://agent-plugins.org/schemas/1.1.0/mcp.schema.json", "mcpServers": {}},
            "mcp-config-version-mismatch",
        ),
        ({"$schema": "https://example.com/mcp.json", "mcpServers": {}}, "mcp-config-invalid"),
    ],
)
def test_mcp_json_top_level_problems_disable_mcp(tmp_path: Path, content: Any, rule: str) -> None:
    root = full_plugin(tmp_path, **{"mcp.json": content})
    result = loaded(load_agent_plugin(root))
    assert result.mcp_servers == ()
    assert rules(result) == [rule]
    assert len(result.skills) == 2 and len(result.flows) == 2


def test_mcp_json_that_is_a_directory_disables_mcp(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"mcp.json": None})
    (root / "mcp.json").mkdir()
    result = loaded(load_agent_plugin(root))
    assert rules(result) == ["component-location-wrong-kind"]
    assert result.mcp_servers == ()


def test_one_bad_skill_is_skipped_and_the_rest_load(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"skills/gamma/SKILL.md": skill("not-gamma")})
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    (diag,) = result.diagnostics
    assert (diag.component, diag.rule) == ("skills", "skill-name-mismatch")
    assert diag.origin == str(root / "skills" / "gamma" / "SKILL.md")
    assert len(result.mcp_servers) == 2 and len(result.flows) == 2


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("# no front matter\n", "skill-frontmatter-missing"),
        ("---\nname: gamma\ndescription: x\n", "skill-frontmatter-unterminated"),
        ("---\nname: [gamma\n---\n", "skill-frontmatter-invalid-yaml"),
        ("---\n- a list\n---\n", "skill-frontmatter-not-mapping"),
        ("---\ndescription: x\n---\n", "skill-name-missing"),
        ("---\nname: Gamma\ndescription: x\n---\n", "skill-name-invalid"),
        ("---\nname: gamma\n---\n", "skill-description-invalid"),
        ("---\nname: gamma\ndescription: '   '\n---\n", "skill-description-invalid"),
        ("---\nname: gamma\ndescription: x\nmetadata: [version, 1.0]\n---\n", "skill-field-invalid"),
        ("---\nname: gamma\ndescription: x\nallowed-tools: [Bash, {a: b}]\n---\n", "skill-field-invalid"),
        ("---\nname: gamma\ndescription: x\ncompatibility: " + "c" * 501 + "\n---\n", "skill-field-invalid"),
        (b"---\nname: gamma\ndescription: \xff\n---\n", "invalid-utf8"),
    ],
)
def test_skill_front_matter_rules(tmp_path: Path, text: str | bytes, rule: str) -> None:
    root = full_plugin(tmp_path)
    md = root / "skills" / "gamma" / "SKILL.md"
    md.parent.mkdir()
    md.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    assert rules(result) == [rule]


def test_skill_folder_without_skill_md_is_reported_and_skipped(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"skills/empty/notes.txt": "x", "skills/README.md": "about"})
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.skills] == ["alpha", "beta"]
    assert rules(result) == ["skill-md-missing"]


def test_nested_skills_are_not_discovered(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"skills/nested/deep/SKILL.md": skill("deep")})
    result = loaded(load_agent_plugin(root))
    assert "deep" not in [s.name for s in result.skills]


def test_skill_optional_fields_are_kept(tmp_path: Path) -> None:
    text = (
        "---\nname: gamma\ndescription: Handles gamma.\nlicense: MIT\ncompatibility: needs git\n"
        'metadata:\n  author: acme\n  version: "1.0"\nallowed-tools: Bash Read\n---\nBody\n'
    )
    root = full_plugin(tmp_path, **{"skills/gamma/SKILL.md": text})
    result = loaded(load_agent_plugin(root))
    gamma = next(s for s in result.skills if s.name == "gamma")
    assert (gamma.license, gamma.compatibility, gamma.allowed_tools) == ("MIT", "needs git", "Bash Read")
    assert dict(gamma.metadata) == {"author": "acme", "version": "1.0"}
    assert gamma.body == "Body\n"


def test_skill_metadata_with_a_nested_date_key_loads_as_text(tmp_path: Path) -> None:
    text = "---\nname: gamma\ndescription: Handles gamma.\nmetadata:\n  a: {2020-01-01: x, 3: y}\n---\nBody\n"
    root = full_plugin(tmp_path, **{"skills/gamma/SKILL.md": text})
    result = loaded(load_agent_plugin(root))  # before: loader-internal-error, the whole plugin rejected
    gamma = next(s for s in result.skills if s.name == "gamma")
    assert json.loads(dict(gamma.metadata)["a"]) == {"2020-01-01": "x", "3": "y"}


def test_skills_that_is_a_file_invalidates_skills_only(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"skills/alpha/SKILL.md": None, "skills/beta/SKILL.md": None})
    assert not (root / "skills").exists()
    (root / "skills").write_text("not a directory")
    result = loaded(load_agent_plugin(root))
    assert result.skills == ()
    assert rules(result) == ["component-location-wrong-kind"]
    assert len(result.mcp_servers) == 2


def test_one_bad_server_entry_is_skipped_and_siblings_load(tmp_path: Path) -> None:
    servers = {"one": stdio(), "bad": {"type": "stdio", "command": "x", "url": "https://a"}, "two": stdio("node")}
    root = full_plugin(tmp_path, **{"mcp.json": mcp(**servers)})
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.mcp_servers] == ["one", "two"]
    (diag,) = result.diagnostics
    assert (diag.component, diag.rule) == ("mcp", "server-entry-invalid")
    assert diag.origin.endswith("mcp.json#/mcpServers/bad/url")
    assert len(result.skills) == 2 and len(result.flows) == 2


def test_one_bad_flow_file_is_skipped_and_siblings_load(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"flows/broken.flow.json": "{"})
    result = loaded(load_agent_plugin(root))
    assert [f.name for f in result.flows] == ["greet", "refund"]
    (diag,) = result.diagnostics
    assert (diag.component, diag.rule, diag.origin) == (
        "flows",
        "flow-invalid-json",
        str(root / "flows" / "broken.flow.json"),
    )
    assert len(result.skills) == 2 and len(result.mcp_servers) == 2


@pytest.mark.parametrize(
    "doc",
    [
        {"start": "a", "nodes": [{"id": "a", "kind": "reply"}]},
        {"name": "x", "start": "b", "nodes": [{"id": "a", "kind": "reply"}]},
        {"name": "x", "start": "a", "nodes": []},
        {"name": "x", "start": "a", "nodes": [{"id": "a"}]},
        {"name": "x", "start": "a", "nodes": [{"id": "a", "kind": "r"}, {"id": "a", "kind": "r"}]},
        {"name": "bad name", "start": "a", "nodes": [{"id": "a", "kind": "r"}]},
        ["not", "an", "object"],
    ],
)
def test_flow_envelope_rules(tmp_path: Path, doc: Any) -> None:
    root = full_plugin(tmp_path, **{"flows/x.flow.json": doc})
    result = loaded(load_agent_plugin(root))
    assert [f.name for f in result.flows] == ["greet", "refund"]
    assert rules(result) == ["flow-schema-invalid"]


def test_flow_yaml_errors_and_duplicates(tmp_path: Path) -> None:
    root = full_plugin(
        tmp_path,
        **{
            "flows/bad.flow.yml": "name: [oops\n",
            "flows/zz.flow.json": FLOW,  # same name as refund.flow.json, later in name order
            "flows/notes.txt": "not a flow",
        },
    )
    result = loaded(load_agent_plugin(root))
    assert [f.name for f in result.flows] == ["greet", "refund"]
    assert sorted(rules(result)) == ["flow-duplicate-name", "flow-invalid-yaml", "not-a-flow-file"]
    refund = next(f for f in result.flows if f.name == "refund")
    assert refund.origin.endswith("refund.flow.json")
    assert refund.definition["nodes"][0]["next"] == {"end": "done"}


def test_missing_components_are_not_errors(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "acme", {"plugin.json": manifest()})
    result = loaded(load_agent_plugin(root))
    assert (result.skills, result.mcp_servers, result.flows, result.diagnostics) == ((), (), (), ())


def test_root_problems_reject(tmp_path: Path) -> None:
    missing = load_agent_plugin(tmp_path / "nope")
    assert isinstance(missing, PluginRejected) and rules(missing) == ["plugin-root-missing"]
    (tmp_path / "file").write_text("x")
    not_dir = load_agent_plugin(tmp_path / "file")
    assert isinstance(not_dir, PluginRejected) and rules(not_dir) == ["plugin-root-not-directory"]


def test_duplicate_json_keys_warn_and_last_wins(tmp_path: Path) -> None:
    text = f'{{"$schema": "{PLUGIN_SCHEMA}", "name": "first", "name": "acme"}}'
    root = full_plugin(tmp_path, **{"plugin.json": text})
    result = loaded(load_agent_plugin(root))
    assert result.manifest.name == "acme"
    assert rules(result) == ["duplicate-json-key"]


def test_nan_is_not_json(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"plugin.json": f'{{"$schema": "{PLUGIN_SCHEMA}", "name": "a", "v": NaN}}'})
    assert rules(load_agent_plugin(root)) == ["manifest-invalid-json"]


def test_oversized_and_deeply_nested_files_are_diagnosed(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"mcp.json": "[" * 200_000 + "]" * 200_000})
    result = loaded(load_agent_plugin(root))
    assert rules(result) == ["mcp-config-invalid-json"]
    (root / "mcp.json").write_bytes(b" " * (5 * 1024 * 1024))
    result = loaded(load_agent_plugin(root))
    assert rules(result) == ["file-too-large"]


def test_unreadable_files_are_diagnosed_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root here, so chmod cannot make a file unreadable; fail os.open instead.
    root = full_plugin(tmp_path)
    real_open = os.open

    def deny(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(("SKILL.md", "mcp.json")) and "alpha" not in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result = loaded(load_agent_plugin(root))
    assert [s.name for s in result.skills] == ["alpha"]
    assert rules(result) == ["unreadable", "unreadable"]
    assert all("Permission denied" in d.message for d in result.diagnostics)


def test_unlistable_skills_dir_is_diagnosed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = full_plugin(tmp_path)
    real_scandir = os.scandir

    def deny(path: Any = ".") -> Any:
        if str(path).endswith("skills"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", deny)
    result = loaded(load_agent_plugin(root))
    assert result.skills == () and rules(result) == ["unreadable"]


def test_looping_symlink_and_fifo_do_not_raise_or_hang(tmp_path: Path) -> None:
    root = full_plugin(tmp_path, **{"mcp.json": None, "skills/alpha/SKILL.md": None})
    os.symlink("mcp.json", root / "mcp.json")  # points at itself: ELOOP
    (root / "skills" / "alpha").mkdir()
    os.mkfifo(root / "skills" / "alpha" / "SKILL.md")
    result = loaded(load_agent_plugin(root))
    assert sorted(rules(result)) == ["component-location-wrong-kind", "unreadable"]
    assert [s.name for s in result.skills] == ["beta"]


def test_unexpected_internal_error_becomes_a_rejection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.plugins import loader

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(loader, "load_manifest", boom)
    result = load_agent_plugin(full_plugin(tmp_path))
    assert isinstance(result, PluginRejected)
    assert rules(result) == ["loader-internal-error"]
    assert "RuntimeError: bug" in result.diagnostics[0].message


def test_diagnostic_section_is_the_spec_clause_and_component_the_part(tmp_path: Path) -> None:
    """As the spec and the reference loader: ``section`` names the clause (issue 10 item 16)."""
    from localllm.plugins.diagnostics import Diagnostic

    contained = Diagnostic("mcp", "path-escapes-plugin-root", "/p/mcp.json#/mcpServers/a/cwd", "escapes", clause="4.1")
    assert (contained.section, contained.component, contained.clause) == ("4.1", "mcp", "4.1")
    assert contained.to_json()["section"] == "4.1" and contained.to_json()["component"] == "mcp"
    assert Diagnostic("flows", "flow-invalid", "/p/flows/a.json", "bad").section == "host"
