"""Attack: ``localllm check`` on mutated configs and their evidence (issue 25f).

Config errors exit 2 everywhere; before the fix a gate's ``selection.evidence`` whose
fingerprint had a mutated shape crashed the staleness check (exit 1, ``internal_error``).
Every mutation here must exit 0 or 2, never 1, and never print a traceback.
"""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm import load_config
from localllm.cli import main
from localllm.selection import REPORT_KIND, REPORT_VERSION, fingerprint

CONFIG = """agent_plugins:
  agent.i: {plugin: builtin.inprocess}
  agent.l: {plugin: builtin.local_llm, model: gemma-3-270m}
gates:
  g:
    invoke: host.agent.decide
    agent: agent.l
    with: {prompt: p.md}
    selection: {evidence: ev/r.json, policy: cheapest-passing, min_accuracy: 0.5}
"""
_VALUES = st.sampled_from([None, 1, -1, "x", "agent.l", [], {}, [1], {"a": 1}, True, 1e308, {"agent.l": 1}])


def _report(root: Path) -> dict[str, Any]:
    (root / "ev").mkdir(exist_ok=True)
    (root / "p.md").write_text("pick")
    (root / "c.yaml").write_text(CONFIG)
    stub = {"kind": REPORT_KIND, "version": REPORT_VERSION, "gate": "g", "fingerprint": {}, "agents": {}}
    (root / "ev" / "r.json").write_text(json.dumps(stub))
    config = load_config(root / "c.yaml")
    fp = fingerprint(config, config.gates["g"], ["agent.l", "agent.i"])
    return {**stub, "fingerprint": fp, "agents": {"agent.l": {"accuracy": 0.9}, "agent.i": {}}}


def _paths(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path] if path else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    return found


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_mutated_evidence_never_exits_1(tmp_path_factory: Any, data: st.DataObject) -> None:
    root = tmp_path_factory.mktemp("check")
    report = _report(root)
    mutated = copy.deepcopy(report)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(mutated) or [("gate",)]))
        node = mutated
        for key in path[:-1]:
            node = node[key] if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[path[-1]] = copy.deepcopy(data.draw(_VALUES))  # sampled_from hands out one shared object
    (root / "ev" / "r.json").write_text(json.dumps(mutated))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["check", str(root / "c.yaml"), "--json"])
    assert code in (0, 2), out.getvalue()
    assert "Traceback" not in out.getvalue() + err.getvalue()
    if code == 2:
        assert json.loads(out.getvalue())["kind"] == "config_error"


def test_the_crashing_mutation_is_a_config_error(tmp_path: Path) -> None:
    report = _report(tmp_path)
    report["fingerprint"]["agents"]["agent.l"] = [1]
    (tmp_path / "ev" / "r.json").write_text(json.dumps(report))
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main(["check", str(tmp_path / "c.yaml"), "--json"])
    assert code == 2
    doc = json.loads(out.getvalue())
    assert doc["kind"] == "config_error" and doc["problems"][0]["key"] == "gates.g.selection.evidence"
