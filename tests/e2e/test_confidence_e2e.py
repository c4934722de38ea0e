"""Per-answer confidence end to end: the real llama-server's token logprobs on gemma-3-270m."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace

pytestmark = pytest.mark.e2e

CONFIG = """\
app_id: confidence-e2e
agent_plugins:
  agent.local: {plugin: builtin.local_llm, model: gemma-3-270m, parallel: 1, ctx_size: 1024, max_tokens: 16,
                schema_in_prompt: false}
"""
FRUIT = {
    "type": "object",
    "properties": {"w": {"enum": ["apple", "banana", "cherry"]}, "n": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["w", "n"],
}
#: ``w`` is copied from the input (the model can hardly be unsure); ``n`` follows no rule at
#: all (every value appears, none fits the word), so whatever the model writes is a guess
PROMPT = """Copy the word, then write any number.
Word: cherry
{{"w":"cherry","n":3}}
Word: apple
{{"w":"apple","n":1}}
Word: banana
{{"w":"banana","n":5}}
Word: cherry
{{"w":"cherry","n":2}}
Word: apple
{{"w":"apple","n":4}}
Word: {word}
"""


def test_confidence_is_present_and_orders_copied_above_guessed(tmp_path: Path, managed_env: Path) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    trace = tmp_path / "trace.jsonl"
    copied: list[float] = []
    guessed: list[float] = []
    with Runtime(load_config(tmp_path / "c.yaml"), trace=trace) as rt:
        for word in ("banana", "apple", "cherry"):
            result = rt.call("decide", agent="agent.local", prompt=PROMPT.format(word=word), schema=FRUIT)
            meta = result.meta
            assert meta["confidence_method"] == "logprobs"
            assert 0.0 <= meta["confidence"] <= 1.0
            fields = meta["confidence_fields"]
            assert set(fields) == {"w", "n"}
            assert meta["confidence"] == pytest.approx(fields["w"] * fields["n"], abs=1e-5)
            assert result.submission["w"] == word  # copying works for this model
            copied.append(fields["w"])
            guessed.append(fields["n"])
    # copying is near-certain; a number that follows no rule is not
    assert min(copied) > max(guessed)
    assert sum(copied) / 3 > sum(guessed) / 3 + 0.3  # measured: 0.82 vs 0.27
    completes = [e for e in read_trace(trace).events if e.kind == "agent.call.complete"]
    assert len(completes) == 3
    assert [e.payload["meta"]["confidence_fields"]["w"] for e in completes] == pytest.approx(copied, abs=1e-5)


def test_score_method_on_the_real_server(tmp_path: Path, managed_env: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        CONFIG.replace("schema_in_prompt: false}", "schema_in_prompt: false,\n                confidence: score}")
    )
    with Runtime(load_config(tmp_path / "c.yaml")) as rt:
        result = rt.call("decide", agent="agent.local", prompt=PROMPT.format(word="cherry"), schema=FRUIT)
    meta = result.meta
    assert meta["confidence_method"] == "score" and meta["confidence_ms"] >= 0
    fields = meta["confidence_fields"]
    assert set(fields) == {"w", "n"} and all(0.0 <= v <= 1.0 for v in fields.values())
    assert result.submission["w"] == "cherry"
    assert fields["w"] > fields["n"]  # the copied word is surer than the number that follows no rule
