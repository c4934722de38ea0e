"""``localllm plugins check DIR [--json]``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.cli import main

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"
SECRET = "hunter2-do-not-print"


def make(tmp_path: Path) -> Path:
    root = tmp_path / "plugins" / "acme.tools"
    (root / "skills" / "invoice-policy").mkdir(parents=True)
    (root / "skills" / "broken").mkdir()
    (root / "flows").mkdir()
    (root / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": "acme.tools", "version": "1.2.0"}))
    (root / "skills" / "invoice-policy" / "SKILL.md").write_text(
        "---\nname: invoice-policy\ndescription: Invoice rules.\n---\nBody\n"
    )
    (root / "skills" / "broken" / "SKILL.md").write_text("---\nname: other\ndescription: x\n---\n")
    (root / "mcp.json").write_text(
        json.dumps(
            {
                "$schema": MCP_SCHEMA,
                "mcpServers": {
                    "validator": {
                        "type": "stdio",
                        "command": "python3",
                        "args": ["-m", "v"],
                        "env": {"API_KEY": SECRET},
                    },
                    "deploy": {
                        "type": "streamable-http",
                        "url": "https://deploy.example.com/mcp?token=" + SECRET,
                        "headers": {"X-Tenant": "public"},
                    },
                    "bad": {"type": "stdio", "command": "../escape"},
                },
            }
        )
    )
    (root / "flows" / "refund.flow.json").write_text(
        json.dumps({"name": "refund", "start": "a", "nodes": [{"id": "a", "kind": "reply"}]})
    )
    return root


def test_check_prints_everything_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make(tmp_path)
    assert main(["plugins", "check", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: acme.tools 1.2.0 at ")
    assert "invoice-policy: Invoice rules." in out
    assert "validator [stdio] python3 -m v env: API_KEY -> agent.acme_tools.validator" in out
    assert "deploy [http] https://deploy.example.com/mcp headers: X-Tenant -> agent.acme_tools.deploy" in out
    assert "refund (start: a, 1 nodes)" in out
    assert "error: skills/skill-name-mismatch:" in out
    assert "error: mcp/path-escapes-plugin-root:" in out
    assert "warning: secrets/secret-in-env:" in out
    assert "warning: secrets/secret-in-url:" in out
    assert SECRET not in out


def test_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make(tmp_path)
    assert main(["plugins", "check", str(root), "--json", "--data-root", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    data = json.loads(out)
    assert data["ok"] is True
    assert data["manifest"] == {"name": "acme.tools", "version": "1.2.0", "description": None}
    assert data["data_dir"] == str(tmp_path / "state" / "acme.tools")
    assert [s["name"] for s in data["skills"]] == ["invoice-policy"]
    servers = {s["name"]: s for s in data["mcp_servers"]}
    assert servers["validator"] == {
        "name": "validator",
        "alias": "agent.acme_tools.validator",
        "transport": "stdio",
        "command": "python3",
        "args": ["-m", "v"],
        "env": ["API_KEY"],
        "cwd": data["root"],
    }
    assert servers["deploy"]["url"] == "https://deploy.example.com/mcp"
    assert servers["deploy"]["headers"] == ["X-Tenant"]
    assert [f["name"] for f in data["flows"]] == ["refund"]
    diag_rules = sorted(d["rule"] for d in data["diagnostics"])
    assert diag_rules == ["path-escapes-plugin-root", "secret-in-env", "secret-in-url", "skill-name-mismatch"]
    assert set(data["diagnostics"][0]) == {"section", "component", "rule", "origin", "message", "severity", "clause"}


def test_rejected_plugin_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make(tmp_path)
    (root / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": "Bad Name"}))
    assert main(["plugins", "check", str(root)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"rejected: {root}")
    assert "error: manifest/manifest-name-invalid:" in out
    assert main(["plugins", "check", str(root), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert [d["rule"] for d in data["diagnostics"]] == ["manifest-name-invalid"]
    assert "skills" not in data


def test_missing_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "check", str(tmp_path / "nope")]) == 2
    assert f"plugin directory {tmp_path / 'nope'}: no such directory" in capsys.readouterr().err


def test_cli_as_a_real_process(tmp_path: Path) -> None:
    root = make(tmp_path)
    cmd = [sys.executable, "-m", "localllm", "plugins", "check", str(root), "--json"]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    (root / "plugin.json").write_text("{")
    bad = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 1
    assert "manifest/manifest-invalid-json" in bad.stdout
