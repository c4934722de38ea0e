"""The README's configuration reference is true: its YAML loads as written and its table is
the one the declarations generate."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from localllm import load_config
from localllm.config import REFERENCE_SECTIONS, LocalLLMDecl, reference_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_readme_configuration_table_matches_the_declarations() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", text, re.S)
    assert found is not None, "README lacks the config-table markers"
    assert found.group(1) == reference_table(REFERENCE_SECTIONS), (
        "regenerate with: python -c 'from localllm.config import *; print(reference_table(REFERENCE_SECTIONS))'"
    )


def test_readme_configuration_reference_loads_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(
        r"```yaml\n(.*?)```", section(README.read_text(encoding="utf-8"), "## Configuration reference"), re.S
    )
    assert block is not None
    config_path = tmp_path / "app.yaml"
    config_path.write_text(block.group(1), encoding="utf-8")
    demo = ROOT / "examples" / "demo"
    shutil.copytree(demo / "prompts", tmp_path / "prompts")
    shutil.copytree(demo / "schemas", tmp_path / "schemas")
    (tmp_path / "evals" / "reports" / "triage").mkdir(parents=True)
    (tmp_path / "evals" / "reports" / "triage" / "latest.json").write_text(
        '{"kind": "localllm_eval_report", "version": 1, "gate": "triage", "fingerprint": {}, "agents": {}}'
    )
    plugin = tmp_path / "plugins" / "fixer"
    plugin.mkdir(parents=True)
    (plugin / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": "fixer"}))
    (plugin / "mcp.json").write_text(
        json.dumps(
            {
                "$schema": MCP_SCHEMA,
                "mcpServers": {"remote": {"type": "streamable-http", "url": "http://127.0.0.1:7302/mcp"}},
            }
        )
    )
    monkeypatch.setenv("MY_AGENT_API_KEY", "k-readme")
    monkeypatch.setenv("FIXER_TOKEN", "t-readme")

    config = load_config(config_path)

    assert sorted(config.agents) == [
        "agent.claude",
        "agent.fixer",
        "agent.fixer.remote",
        "agent.local",
        "agent.remote",
        "agent.stub",
    ]
    local = config.agents["agent.local"]
    assert isinstance(local, LocalLLMDecl) and local.temperature is None and local.port is None
    assert config.fallbacks() == {"triage": "agent.claude", "classify": "agent.claude"}
    assert config.gates["classify"].agent == "agent.stub" and config.gates["classify"].templated_schema
    assert config.gates["triage"].selection is not None
    assert config.router is not None and config.router.embedder == "docs"
