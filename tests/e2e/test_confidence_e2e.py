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
    "properties": {"w": {"enum": ["apple", "banana", "cherry"]}},
    "required": ["w"],
}
#: the answer is copied from the input: the model can hardly be unsure
COPY = """Copy the word.
Word: cherry
{{"w":"cherry"}}
Word: apple
{{"w":"apple"}}
Word: banana
{{"w":"banana"}}
Word: {word}
"""
#: the word is none of the alternatives: whichever it picks, it is guessing
GUESS = COPY.replace("Word: {word}\n", "Word: {word}\n") + ""


def test_confidence_is_present_and_orders_clear_above_guessed(tmp_path: Path, managed_env: Path) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    trace = tmp_path / "trace.jsonl"
    clear: list[float] = []
    guessed: list[float] = []
    with Runtime(load_config(tmp_path / "c.yaml"), trace=trace) as rt:
        for word in ("apple", "banana", "cherry"):
            result = rt.call("decide", agent="agent.local", prompt=COPY.format(word=word), schema=FRUIT)
            assert result.meta["confidence_method"] == "logprobs"
            assert 0.0 <= result.meta["confidence"] <= 1.0
            assert set(result.meta["confidence_fields"]) == {"w"}
            if result.submission["w"] == word:
                clear.append(result.meta["confidence"])
        for word in ("table", "river", "seven"):
            result = rt.call("decide", agent="agent.local", prompt=GUESS.format(word=word), schema=FRUIT)
            assert 0.0 <= result.meta["confidence"] <= 1.0
            guessed.append(result.meta["confidence"])
    assert clear, "the model copied none of the three words"
    # copying is near-certain; a forced guess among three wrong words is not
    assert min(clear) > max(guessed)
    assert sum(clear) / len(clear) > 0.8
    completes = [e for e in read_trace(trace).events if e.kind == "agent.call.complete"]
    assert all(0.0 <= e.payload["meta"]["confidence"] <= 1.0 for e in completes)
    assert {e.payload["meta"]["confidence_method"] for e in completes} == {"logprobs"}
