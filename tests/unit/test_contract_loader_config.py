"""Config and loader rules of the specs (issue 24.5–24.6): the contract's own ``selection:``
example loads before its evidence exists; every skipped part of an Agent Plugins directory
leaves a diagnostic whose ``section`` names the spec clause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm import load_config
from localllm.cli import main
from localllm.runtime import Runtime

SPEC_SELECTION = """agent_plugins:
  agent.judge: {plugin: builtin.inprocess}
gates:
  merge_judge:
    invoke: host.agent.decide
    id: merge_judge
    with:
      agent: agent.judge
      prompt: judge the merge
    selection:
      profile: synthetic-codex
      model: syn:small:text
      effort: low
      evidence: evals/reports/merge_judge/latest.json
      fallback_profile: claude
"""


def test_the_spec_selection_example_loads_before_its_evidence_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(SPEC_SELECTION)  # as the contract writes it, id: included
    config = load_config(path)
    selection = config.gates["merge_judge"].selection
    assert selection is not None and selection.profile == "synthetic-codex"
    assert selection.evidence == tmp_path / "evals" / "reports" / "merge_judge" / "latest.json"
    assert main(["check", str(path), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any(w.startswith("gates.merge_judge.selection.evidence:") for w in warnings)
    with Runtime(config) as rt:  # runtime selection stays conservative: the gate's own agent
        rt.register_inprocess("agent.judge", lambda request: {"ok": True})
        assert rt.run_gate("merge_judge").agent == "agent.judge"


def _plugin(root: Path) -> Path:
    plugin = root / "pl"
    (plugin / "skills" / "hello").mkdir(parents=True)
    (plugin / "flows").mkdir()
    (plugin / "plugin.json").write_text(
        json.dumps(
            {
                "$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json",
                "name": "pl",
                "version": "1.0.0",
                "description": "x",
            }
        )
    )
    (plugin / "skills" / "hello" / "SKILL.md").write_text("---\nname: hello\ndescription: says hi\n---\nHi\n")
    (plugin / "mcp.json").write_text("{bad")
    (plugin / "flows" / "x.flow.json").write_text("{bad")
    return plugin


def test_every_skipped_part_of_a_plugin_dir_leaves_a_diagnostic_with_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _plugin(tmp_path)
    path = tmp_path / "app.yaml"
    path.write_text("plugin_dirs: [pl]\n")
    config = load_config(path)
    found = {(d["rule"], d["section"], d["key"]) for d in config.diagnostics}
    assert ("mcp-config-invalid-json", "7.2.2", "plugin_dirs[0]") in found
    assert ("flow-invalid-json", "host", "plugin_dirs[0]") in found
    assert all(d["severity"] == "error" for d in config.diagnostics)
    assert main(["check", str(path), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert sum("mcp-config-invalid-json" in w for w in warnings) == 1
    assert sum("flow-invalid-json" in w for w in warnings) == 1
