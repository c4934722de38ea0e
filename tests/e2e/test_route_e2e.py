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
    assert float(semantic["similarity"]) >= float(semantic["bars"]["confident"])  # type: ignore[arg-type, index]
    assert 0.0 < float(semantic["confidence"]) <= 1.0  # type: ignore[arg-type]

    trace2 = tmp_path / "route2.jsonl"
    code = main(["route", "What is the capital of France?", "--config", str(config), "--trace", str(trace2), "--json"])
    llm = json.loads(capsys.readouterr().out)
    assert llm["routed_by"] == "llm"
    # the decide tier answers an intent (exit 0) or none of these (exit 1)
    assert (llm["intent"], code) in (("billing", 0), ("bug", 0), ("feature", 0), (None, 1))

    first = [e.kind for e in read_trace(trace).events]
    assert first == ["turn.start"]  # the embedding tier answered: no agent call
    events = read_trace(trace2).events
    # turn.start opens the turn; the decide call's events follow it
    assert [e.kind for e in events] == ["turn.start", "agent.call.start", "agent.call.complete"]
    assert events[0].payload["routed_by"] == "llm" and events[0].payload["match_type"] == "decide"
    assert events[2].payload["meta"]["grammar_source"] == "compiled"
    assert main(["trace", "verify", str(trace2)]) == 0


CALIBRATED = """\
app_id: router-calibrated-e2e
agent_plugins:
  agent.local: {plugin: builtin.local_llm, model: gemma-3-270m, parallel: 1, ctx_size: 1024, max_tokens: 32}
embedders:
  minilm: {model: all-minilm-l6-v2, threads: 2}
intents:
  billing: {examples: ["I was charged twice this month", "please refund my payment", "my invoice is wrong"]}
  bug: {examples: ["the app crashes when I save", "I get an error on login", "the button does nothing"]}
  feature: {examples: ["please add a dark mode", "it would be nice to export to CSV", "can you support Linux"]}
router: {embedder: minilm, agent: agent.local, calibrate: true}
"""


def test_calibrated_bars_route_clear_matches_semantically_and_decide_can_say_none(
    tmp_path: Path, managed_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(CALIBRATED)
    assert main(["route", "--calibrate", "--config", str(config), "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert (cal["in_scope"], cal["out_of_scope"]) == (9, 9)
    assert cal["confident"] < 0.82  # MiniLM's cosines run far below the old fixed bar
    clear = {
        "I got charged two times this month": "billing",
        "the app crashes every time I save a file": "bug",
        "please add dark mode to the app": "feature",
    }
    for text, intent in clear.items():
        code = main(["route", text, "--config", str(config), "--json"])
        verdict = json.loads(capsys.readouterr().out)
        assert code == 0, verdict
        assert (verdict["intent"], verdict["routed_by"], verdict["bars"]["source"]) == (
            intent,
            "semantic",
            "calibrated",
        )
        assert verdict["similarity"] >= cal["confident"] and verdict["margin"] >= cal["margin"]
        assert 0.0 <= verdict["confidence"] <= 1.0
    # off-topic: the embedding tier misses, the decide tier may answer none_of_these
    code = main(["route", "What is the capital of France?", "--config", str(config), "--json"])
    off = json.loads(capsys.readouterr().out)
    assert off["routed_by"] == "llm" and off["similarity"] < cal["confident"]
    assert off["outcome"] == "none" and off["intent"] is None and code == 1
    assert off["confidence"] is not None and 0.0 <= off["confidence"] <= 1.0
