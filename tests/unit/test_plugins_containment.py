"""Containment with real symlinks (load time and right before spawn), PLUGIN_DATA, real spawns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm.errors import PluginPathEscape, PluginSpawnError
from localllm.plugins import (
    PluginLoaded,
    PluginRejected,
    escape_diagnostic,
    load_agent_plugin,
    prepare_data_dir,
    prepare_spawn,
)

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"

# A real MCP-server stand-in: reports what it was started with, as JSON on stdout.
REPORTER = f"""#!{sys.executable}
import json, os, sys
print(json.dumps({{
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "PLUGIN_ROOT": os.environ.get("PLUGIN_ROOT"),
    "PLUGIN_DATA": os.environ.get("PLUGIN_DATA"),
    "DATA_DIR": os.environ.get("DATA_DIR"),
    "BASE": os.environ.get("BASE"),
}}))
"""


def make(tmp_path: Path, servers: dict[str, Any], *, name: str = "acme") -> Path:
    root = tmp_path / "plugins" / name
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": name}))
    (root / "mcp.json").write_text(json.dumps({"$schema": MCP_SCHEMA, "mcpServers": servers}))
    tool = root / "bin" / "server"
    tool.write_text(REPORTER)
    tool.chmod(0o755)
    return root


def load(root: Path, **kw: Any) -> PluginLoaded:
    result = load_agent_plugin(root, **kw)
    assert isinstance(result, PluginLoaded), [str(d) for d in result.diagnostics]
    return result


def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    tool = out / "tool"
    tool.write_text("#!/bin/sh\necho escaped\n")
    tool.chmod(0o755)
    return out


def run(spec: Any) -> dict[str, Any]:
    proc = subprocess.run(
        list(spec.argv), env=dict(spec.env), cwd=spec.cwd, capture_output=True, text=True, timeout=60, check=True
    )
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


# ----------------------------------------------------------------------------- load-time checks


def test_command_symlink_out_of_root_invalidates_that_server_only(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(
        tmp_path,
        {"evil": {"type": "stdio", "command": "./bin/evil"}, "good": {"type": "stdio", "command": "./bin/server"}},
    )
    os.symlink(out / "tool", root / "bin" / "evil")
    result = load(root)
    assert [s.name for s in result.mcp_servers] == ["good"]
    (diag,) = result.diagnostics
    assert (diag.component, diag.rule, diag.clause) == ("mcp", "path-escapes-plugin-root", "4.1")
    assert diag.origin.endswith("#/mcpServers/evil/command")
    assert str(out / "tool") in diag.message


def test_command_symlink_staying_inside_root_is_fine(tmp_path: Path) -> None:
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/link", "args": ["a"]}})
    (root / "libexec").mkdir()
    os.replace(root / "bin" / "server", root / "libexec" / "real-server")
    os.symlink("../libexec/real-server", root / "bin" / "link")
    result = load(root)
    assert result.diagnostics == ()
    spec = prepare_spawn(result.mcp_servers[0], result)
    assert spec.argv == (str(result.root / "libexec" / "real-server"), "a")
    assert run(spec)["argv"] == ["a"]


def test_cwd_symlink_out_of_root_invalidates_that_server(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(
        tmp_path,
        {
            "s": {"type": "stdio", "command": "./bin/server", "cwd": "./work"},
            "t": {"type": "stdio", "command": "./bin/server", "cwd": "${PLUGIN_ROOT}/work/sub"},
        },
    )
    os.symlink(out, root / "work")
    result = load(root)
    assert result.mcp_servers == ()
    assert [d.rule for d in result.diagnostics] == ["path-escapes-plugin-root"] * 2


def test_cwd_symlink_inside_root_is_fine(tmp_path: Path) -> None:
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server", "cwd": "./work"}})
    (root / "real-work").mkdir()
    os.symlink("real-work", root / "work")
    result = load(root)
    spec = prepare_spawn(result.mcp_servers[0], result)
    assert spec.cwd == result.root / "real-work"
    assert run(spec)["cwd"] == str(result.root / "real-work")


def test_symlinked_component_files_out_of_root(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {})
    (out / "smuggled").mkdir()
    (out / "smuggled" / "SKILL.md").write_text("---\nname: smuggled\ndescription: x\n---\n")
    (out / "x.flow.json").write_text(json.dumps({"name": "x", "start": "a", "nodes": [{"id": "a", "kind": "k"}]}))
    (root / "skills" / "fine").mkdir(parents=True)
    (root / "skills" / "fine" / "SKILL.md").write_text("---\nname: fine\ndescription: ok\n---\n")
    os.symlink(out / "smuggled", root / "skills" / "smuggled")
    os.symlink("fine", root / "skills" / "alias-dir")  # inside, but its name ≠ front matter name
    (root / "flows").mkdir()
    os.symlink(out / "x.flow.json", root / "flows" / "x.flow.json")
    result = load(root)
    assert [s.name for s in result.skills] == ["fine"]
    assert result.flows == ()
    found = {(d.component, d.rule) for d in result.diagnostics}
    assert ("skills", "path-escapes-plugin-root") in found
    assert ("flows", "path-escapes-plugin-root") in found
    assert ("skills", "skill-name-mismatch") in found  # the inside symlink was read, not refused


def test_plugin_json_symlink_out_rejects_inside_is_fine(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {})
    manifest = (root / "plugin.json").read_text()
    (root / "plugin.json").unlink()
    (out / "smuggled.json").write_text(manifest)
    os.symlink(out / "smuggled.json", root / "plugin.json")
    result = load_agent_plugin(root)
    assert isinstance(result, PluginRejected)
    assert [d.rule for d in result.diagnostics] == ["path-escapes-plugin-root"]

    (root / "plugin.json").unlink()
    (root / "nested").mkdir()
    (root / "nested" / "real.json").write_text(manifest)
    os.symlink("nested/real.json", root / "plugin.json")
    assert load(root).manifest.name == "acme"


def test_mcp_json_symlink_out_disables_mcp(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {"s": {"type": "stdio", "command": "x"}})
    os.replace(root / "mcp.json", out / "mcp.json")
    os.symlink(out / "mcp.json", root / "mcp.json")
    result = load(root)
    assert result.mcp_servers == ()
    assert [d.rule for d in result.diagnostics] == ["path-escapes-plugin-root"]


def test_plugin_root_given_through_a_symlink_resolves(tmp_path: Path) -> None:
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}})
    os.symlink(root, tmp_path / "via-link")
    result = load(tmp_path / "via-link")
    assert result.root == Path(os.path.realpath(root))
    assert result.mcp_servers[0].command_path == result.root / "bin" / "server"


# ----------------------------------------------------------------------------- spawn-time re-check


def test_command_swapped_to_symlink_out_after_load_is_refused_at_spawn(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}})
    result = load(root)
    server = result.mcp_servers[0]
    (root / "bin" / "server").unlink()
    os.symlink(out / "tool", root / "bin" / "server")
    with pytest.raises(PluginPathEscape) as info:
        prepare_spawn(server, result)
    assert info.value.field == "command"
    assert info.value.resolved == str(out / "tool")
    assert isinstance(info.value, PermissionError)
    diag = escape_diagnostic(info.value, server)
    assert (diag.component, diag.rule, diag.severity) == ("mcp", "path-escapes-plugin-root", "error")
    assert diag.origin.endswith("#/mcpServers/s/command")


def test_cwd_swapped_to_symlink_out_after_load_is_refused_at_spawn(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server", "cwd": "./work"}})
    (root / "work").mkdir()
    result = load(root)
    (root / "work").rmdir()
    os.symlink(out, root / "work")
    with pytest.raises(PluginPathEscape) as info:
        prepare_spawn(result.mcp_servers[0], result)
    assert info.value.field == "cwd"


def test_data_cwd_symlinked_out_of_the_data_dir_is_refused(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server", "cwd": "${PLUGIN_DATA}/work/sub"}})
    result = load(root)
    result.data_dir.mkdir(parents=True)
    os.symlink(out, result.data_dir / "work")
    with pytest.raises(PluginPathEscape) as info:
        prepare_spawn(result.mcp_servers[0], result)
    assert info.value.field == "cwd"
    assert not (out / "sub").exists()  # refused before creating anything out there


# ----------------------------------------------------------------------------- PLUGIN_DATA and env


def test_spawned_process_gets_expanded_config_and_plugin_variables(tmp_path: Path) -> None:
    entry = {
        "type": "stdio",
        "command": "./bin/server",
        "args": ["--config", "${PLUGIN_ROOT}/config.json", "--data", "${PLUGIN_DATA}/db"],
        "env": {"DATA_DIR": "${PLUGIN_DATA}/database"},
        "cwd": "${PLUGIN_DATA}/work",
    }
    root = make(tmp_path, {"db": entry})
    result = load(root)
    data = tmp_path / "plugins" / "data" / "acme"
    assert result.data_dir == data and not data.exists()
    base = {"PATH": os.environ.get("PATH", ""), "BASE": "kept", "PLUGIN_ROOT": "/bogus", "PLUGIN_DATA": "/bogus"}
    spec = prepare_spawn(result.mcp_servers[0], result, base_env=base)
    assert data.is_dir() and (data / "work").is_dir()
    assert list(data.glob(".localllm-probe-*")) == []  # the writability probe cleaned up
    report = run(spec)
    real_root = os.path.realpath(root)
    assert report == {
        "argv": ["--config", f"{real_root}/config.json", "--data", f"{data}/db"],
        "cwd": str(data / "work"),
        "PLUGIN_ROOT": real_root,
        "PLUGIN_DATA": str(data),
        "DATA_DIR": f"{data}/database",
        "BASE": "kept",
    }


def test_default_base_env_is_this_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASE", "from-parent")
    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}}))
    spec = prepare_spawn(result.mcp_servers[0], result)
    assert spec.cwd == result.root
    assert run(spec)["BASE"] == "from-parent"


def test_data_root_option_places_plugin_data(tmp_path: Path) -> None:
    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}}), data_root=tmp_path / "st")
    assert prepare_data_dir(result) == tmp_path / "st" / "acme"
    assert run(prepare_spawn(result.mcp_servers[0], result))["PLUGIN_DATA"] == str(tmp_path / "st" / "acme")


def test_unwritable_data_dir_is_a_spawn_error(tmp_path: Path) -> None:
    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}}))
    result.data_dir.parent.mkdir(parents=True)
    result.data_dir.write_text("a file where the directory should be")
    with pytest.raises(PluginSpawnError) as info:
        prepare_spawn(result.mcp_servers[0], result)
    assert info.value.field == "PLUGIN_DATA"
    assert str(result.data_dir) in str(info.value)


def test_probe_write_failure_is_a_spawn_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Running as root, permissions cannot make a directory unwritable: fail the probe write.
    import tempfile

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(28, "No space left on device")

    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}}))
    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(PluginSpawnError, match="No space left on device"):
        prepare_spawn(result.mcp_servers[0], result)


def test_bare_command_resolves_on_path_or_fails_clearly(tmp_path: Path) -> None:
    result = load(
        make(
            tmp_path,
            {"py": {"type": "stdio", "command": "python3"}, "nope": {"type": "stdio", "command": "no-such-binary-xyz"}},
        )
    )
    py, nope = result.mcp_servers
    bindir = Path(sys.executable).parent
    spec = prepare_spawn(py, result, base_env={"PATH": str(bindir)})
    assert spec.argv[0] == str(bindir / "python3")
    with pytest.raises(PluginSpawnError, match="not found on PATH"):
        prepare_spawn(nope, result, base_env={"PATH": str(bindir)})


def test_non_executable_command_and_http_server_are_spawn_errors(tmp_path: Path) -> None:
    root = make(
        tmp_path,
        {
            "s": {"type": "stdio", "command": "./bin/server"},
            "h": {"type": "streamable-http", "url": "http://127.0.0.1:1/mcp"},
        },
    )
    (root / "bin" / "server").chmod(0o644)
    result = load(root)
    s, h = result.mcp_servers
    with pytest.raises(PluginSpawnError, match="not an executable file"):
        prepare_spawn(s, result)
    with pytest.raises(PluginSpawnError, match="nothing to spawn"):
        prepare_spawn(h, result)


def test_missing_command_under_a_symlinked_out_directory_is_caught_at_load(tmp_path: Path) -> None:
    out = outside(tmp_path)
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./ext/not-there-yet"}})
    os.symlink(out, root / "ext")
    result = load(root)
    assert result.mcp_servers == ()
    assert [d.rule for d in result.diagnostics] == ["path-escapes-plugin-root"]
