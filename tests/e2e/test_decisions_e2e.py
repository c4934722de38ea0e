"""The examples tier and the ``min_precision`` cascade on the real llama-server + all-MiniLM.

Examples: 3 intents of the committed CLINC150 sample (20 labelled utterances each). The
evidence is a real ``evaluate`` of the examples tier (leave-one-out over the examples);
the strong tier is a cassette-backed agent.claude. The gate's local model (gemma-3-270m)
reports no calibrated confidence on this evidence, so the cascade leaves it out and says
why; the examples tier is the local rung under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localllm.agents.cassette import CassetteAgent
from localllm.eval import evaluate
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
LABELS = ("calculator", "transfer", "uber")
SURE = "what is 45 times 12"
OUT_OF_SCOPE = "how tall is mount everest"
#: in scope (near the uber and transfer examples) but the nearest examples split their vote
AMBIGUOUS = "add up my ride and my transfer"

CONFIG = """\
app_id: decisions-e2e
agent_plugins:
  agent.local:
    plugin: builtin.local_llm
    model: gemma-3-270m
    grammar: true
    ctx_size: 1024
    max_tokens: 24
    timeout: 120
  agent.claude: {plugin: builtin.claude_cli}
embedders:
  minilm: {model: all-minilm-l6-v2}
gates:
  intent:
    invoke: host.agent.decide
    agent: agent.local
    with:
      prompt: "Classify the text.\\n\\n{{ examples }}\\n\\nText: {{ args.text }}"
      schema: intent.json
      args: {text: "{{ args.text }}"}
    examples: {cases: examples.jsonl, embedder: minilm, input: text}
"""


@pytest.fixture
def app(tmp_path: Path, managed_env: Path) -> Path:
    rows = [json.loads(line) for line in (DATA / "clinc150_examples.jsonl").read_text().splitlines()]
    (tmp_path / "examples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if r["expect"]["intent"] in LABELS)
    )
    schema = {"title": "intent", "type": "object", "properties": {"intent": {"enum": list(LABELS)}}}
    (tmp_path / "intent.json").write_text(json.dumps({**schema, "required": ["intent"]}))
    (tmp_path / "app.yaml").write_text(CONFIG)
    report = evaluate(load_config(tmp_path / "app.yaml"), "intent", agents=["examples"]).paths["latest"]
    assert json.loads(report.read_text())["agents"]["examples"]["accuracy"] >= 0.9
    (tmp_path / "app.yaml").write_text(
        CONFIG + f"    selection: {{min_precision: 0.8, evidence: {report.relative_to(tmp_path)}}}\n"
    )
    episodes = [
        {
            "id": f"claude-{n}",
            "match": {"schema_name": "intent", "text": text},
            "replay": "any",
            "agent": {"verb": "decide", "response": {"intent": "calculator"}, "meta": {"cost_usd": 0.002}},
        }
        for n, text in enumerate((SURE, OUT_OF_SCOPE, AMBIGUOUS))
    ]
    (tmp_path / "claude.yaml").write_text(yaml.safe_dump({"kind": "host_cassette", "episodes": episodes}))
    return tmp_path


def run(app: Path, text: str, trace: Path) -> tuple[Any, bool]:
    with Runtime(load_config(app / "app.yaml"), trace=trace) as rt:
        rt.register_agent("agent.claude", CassetteAgent(app / "claude.yaml", alias="agent.claude"))
        result = rt.run_gate("intent", {"text": text})
        started = "agent.local" in rt._agents  # built (and its sidecar started) only when asked
    return result, started


def test_a_confident_examples_answer_stays_local_without_starting_an_llm(app: Path) -> None:
    result, llm_started = run(app, SURE, app / "t.jsonl")
    assert result.agent == "examples" and result.submission == {"intent": "calculator"}
    assert result.meta["tier"] == "examples" and result.meta["confidence"] >= result.meta["cascade"][0]["threshold"]
    assert llm_started is False
    assert result.meta["selected_by"]["disabled"]["agent.local"] == "no calibrated confidence in the evidence"
    ends = [e for e in read_trace(app / "t.jsonl").events if e.kind == "agent.call.complete"]
    assert len(ends) == 1 and "substitution" not in ends[0].payload


def test_a_low_confidence_answer_escalates_once_with_both_legs_in_the_trace(app: Path) -> None:
    result, llm_started = run(app, AMBIGUOUS, app / "t.jsonl")
    assert result.agent == "agent.claude"
    assert [(s["agent"], s["accepted"], s["reason"]) for s in result.meta["cascade"]] == [
        ("examples", False, "low_confidence"),
        ("agent.claude", True, "last tier"),
    ]
    assert result.meta["cascade"][0]["confidence"] < result.meta["cascade"][0]["threshold"]
    assert not llm_started  # the local model has no calibrated confidence in this evidence: left out
    events = read_trace(app / "t.jsonl").events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.complete"]
    end = events[1].payload
    assert end["substitution"] == {
        "reason": "low_confidence",
        "original_plugin": "examples",
        "fallback_plugin": "agent.claude",
    }
    assert end["original_meta"]["tier"] == "examples"
    assert end["meta"]["cost_usd"] == 0.002


def test_an_out_of_scope_input_escalates_without_any_local_tier(app: Path) -> None:
    result, llm_started = run(app, OUT_OF_SCOPE, app / "t.jsonl")
    assert result.agent == "agent.claude" and not llm_started
    first, last = result.meta["cascade"]
    assert (first["agent"], first["accepted"], first["reason"]) == ("examples", False, "out_of_scope")
    assert first["novelty"] <= first["novelty_bar"] and first["skipped"] == ["examples"]
    assert (last["agent"], last["reason"]) == ("agent.claude", "last tier")
    events = read_trace(app / "t.jsonl").events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.complete"]
    assert events[1].payload["substitution"] == {
        "reason": "out_of_scope",
        "original_plugin": "examples",
        "fallback_plugin": "agent.claude",
    }
    assert events[1].payload["meta"]["cost_usd"] == 0.002


def test_stale_evidence_disables_the_local_tiers(app: Path) -> None:
    with (app / "examples.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "more", "args": {"text": "add 2 and 2"}, "expect": {"intent": "calculator"}}) + "\n")
    result, llm_started = run(app, SURE, app / "t.jsonl")
    assert result.agent == "agent.claude" and not llm_started
    assert result.meta["selected_by"]["tiers"] == ["agent.claude"]
    assert result.meta["selected_by"]["disabled"]["examples"].startswith("evidence is stale")
