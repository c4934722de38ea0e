"""`localllm route` end to end: the real MiniLM embedding sidecar, then a real gemma decide tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.trace import read_trace

pytestmark = pytest.mark.e2e

CONFIG = """\
app_id: router-e2e
agent_plugins:
  agent.local: {plugin: builtin.local_llm, model: gemma-3-270m, parallel: 1, ctx_size: 1024, max_tokens: 32}
embedders:
  minilm: {model: all-minilm-l6-v2, threads: 2}
intents:
  billing: {examples: ["I was charged twice this month", "please refund my payment", "my invoice is wrong"]}
  bug: {examples: ["the app crashes when I save", "I get an error on login", "the button does nothing"]}
  feature: {examples: ["please add a dark mode", "it would be nice to export to CSV"]}
router: {embedder: minilm, agent: agent.local}
"""


def route(config: Path, text: str, trace: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    code = main(["route", text, "--config", str(config), "--trace", str(trace), "--json"])
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    assert code == 0, out
    return out


def test_paraphrase_by_embeddings_and_ambiguity_by_decide(
    tmp_path: Path, managed_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(CONFIG)
    trace = tmp_path / "route.jsonl"

    semantic = route(config, "Please refund my payment!", trace, capsys)
    assert semantic["intent"] == "billing" and semantic["routed_by"] == "semantic"
    assert float(semantic["confidence"]) >= 0.82  # type: ignore[arg-type]

    trace2 = tmp_path / "route2.jsonl"
    llm = route(config, "What is the capital of France?", trace2, capsys)
    assert llm["routed_by"] == "llm"
    assert llm["intent"] in ("billing", "bug", "feature")

    first = [e.kind for e in read_trace(trace).events]
    assert first == ["turn.start"]  # the embedding tier answered: no agent call
    events = read_trace(trace2).events
    # turn.start opens the turn; the decide call's events follow it
    assert [e.kind for e in events] == ["turn.start", "agent.call.start", "agent.call.complete"]
    assert events[0].payload["routed_by"] == "llm" and events[0].payload["match_type"] == "decide"
    assert events[2].payload["meta"]["grammar_source"] == "compiled"
    assert main(["trace", "verify", str(trace2)]) == 0
