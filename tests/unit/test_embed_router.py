"""Router tiers: semantic route, tie and miss to the decide tier, provenance in the trace."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pytest

from localllm.config import Intent
from localllm.embed.embedder import EmbedderIdentity, FakeEmbedder
from localllm.embed.router import Caller, Router, decide_schema, runtime_decide
from localllm.errors import EmbedError


class BagOfWords:
    """A tiny semantic-ish embedder: texts sharing words are close (for paraphrase tests)."""

    identity = EmbedderIdentity("bow", 64, "sum", "", "")

    def embed(self, texts: Sequence[str], role: str) -> np.ndarray:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                out[i] += FakeEmbedder(64).embed([word], "query")[0]
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n else out[i]
        return out


INTENTS = [
    Intent("weather", ("what is the weather like today", "will it rain tomorrow")),
    Intent("music", ("play some jazz music", "put on a song")),
    Intent("timer", ("set a timer for ten minutes", "start a countdown")),
]


def test_paraphrase_routes_by_the_embedding_tier() -> None:
    calls: list[Any] = []

    def decide(text: str, candidates: list[str]) -> str | None:
        calls.append(candidates)
        return None

    router = Router(INTENTS, BagOfWords(), confident=0.7, margin=0.08, decide=decide)
    verdict = router.route("what is the weather like")
    assert (verdict.outcome, verdict.intent, verdict.routed_by) == ("route", "weather", "semantic")
    assert verdict.match_type == "example:what is the weather like today"
    assert verdict.similarity is not None and verdict.similarity >= 0.7
    # the semantic tier's confidence is the similarity margin over the runner-up
    runner_up = verdict.scores[1][1]
    assert verdict.confidence == pytest.approx(verdict.similarity - runner_up)
    assert verdict.confidence is not None and verdict.confidence >= 0.08
    assert verdict.margin == pytest.approx(verdict.confidence)
    assert calls == []  # the paid tier was not consulted
    payload = verdict.turn_start_payload()
    assert payload["direct"] is True and payload["routed_by"] == "semantic" and payload["intent"] == "weather"
    assert payload["match_type"].startswith("example:")


def test_exact_example_routes_with_the_default_bars() -> None:
    router = Router(INTENTS, FakeEmbedder(64))
    verdict = router.route("start a countdown")
    assert verdict.intent == "timer" and verdict.similarity == pytest.approx(1.0, abs=1e-5)
    assert verdict.confidence == pytest.approx(1.0 - verdict.scores[1][1], abs=1e-5)
    assert router.confident == 0.82 and router.margin == 0.08 and verdict.bars["source"] == "default"


def test_tie_sends_both_candidates_to_decide() -> None:
    intents = [Intent("a", ("red apple",)), Intent("b", ("red apple pie",)), Intent("c", ("blue sky",))]
    seen: list[list[str]] = []

    def decide(text: str, candidates: list[str]) -> str | None:
        seen.append(candidates)
        return "b"

    verdict = Router(intents, BagOfWords(), confident=0.5, margin=0.5, decide=decide).route("red apple")
    assert sorted(seen[0]) == ["a", "b"]
    assert (verdict.intent, verdict.routed_by, verdict.match_type, verdict.outcome) == ("b", "llm", "decide", "route")
    payload = verdict.turn_start_payload()
    assert "direct" not in payload and payload["routed_by"] == "llm"


def test_tie_without_decide_reports_both_candidates() -> None:
    intents = [Intent("a", ("red apple",)), Intent("b", ("red apple pie",))]
    verdict = Router(intents, BagOfWords(), confident=0.5, margin=0.5).route("red apple")
    assert verdict.outcome == "tie" and verdict.intent is None
    assert sorted(verdict.candidates) == ["a", "b"] and verdict.similarity == pytest.approx(1.0, abs=1e-5)
    assert verdict.confidence is not None and verdict.confidence < 0.5  # the margin that made it a tie


def test_ambiguous_input_falls_through_to_decide_over_all_intents() -> None:
    seen: list[list[str]] = []

    def decide(text: str, candidates: list[str]) -> str | None:
        seen.append(candidates)
        return "music"

    verdict = Router(INTENTS, BagOfWords(), decide=decide).route("hmm, not sure")
    assert seen == [["weather", "music", "timer"]]
    assert (verdict.intent, verdict.routed_by) == ("music", "llm")


def test_miss_without_decide_and_decide_declining() -> None:
    verdict = Router(INTENTS, BagOfWords()).route("zzz qqq")
    assert (verdict.outcome, verdict.intent, verdict.routed_by) == ("miss", None, "semantic")
    assert verdict.confidence is not None and verdict.confidence < 0.82
    declined = Router(INTENTS, BagOfWords(), decide=lambda t, c: "not-an-intent").route("zzz")
    assert (declined.outcome, declined.intent, declined.routed_by) == ("miss", None, "llm")
    assert declined.turn_start_payload()["intent"] == ""


def test_runtime_decide_calls_the_decide_verb_with_an_enum_schema() -> None:
    class Result:
        submission: ClassVar[dict[str, str]] = {"intent": "timer"}

    class FakeRuntime:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def call(self, verb: str, **kw: Any) -> Result:
            self.calls.append({"verb": verb, **kw})
            return Result()

    rt = FakeRuntime()
    decide = runtime_decide(cast(Caller, rt), "agent.local", INTENTS)  # a loose fake of the protocol
    assert decide("wake me in 10", ["weather", "timer"]) == ("timer", None)  # no meta: unmeasured
    call = rt.calls[0]
    assert call["verb"] == "decide" and call["agent"] == "agent.local"
    assert call["schema"] == decide_schema(["weather", "timer"])
    assert call["schema"]["properties"]["intent"]["enum"] == ["weather", "timer", "none_of_these"]
    assert "none_of_these" in call["prompt"] and "Input: wake me in 10" in call["prompt"]
    assert call["prompt"].count('{"intent":"timer"}') == 2  # one shot per example of a candidate


def test_provenance_lands_in_the_trace(tmp_path: Path) -> None:
    from localllm.trace import TraceWriter

    verdict = Router(INTENTS, BagOfWords(), confident=0.7).route("will it rain tomorrow?")
    trace = tmp_path / "t.jsonl"
    writer = TraceWriter.open(trace)
    writer.append("turn.start", verdict.turn_start_payload(), turn=1, state_path="route")
    writer.close()
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    event = lines[1]
    assert event["kind"] == "turn.start"
    assert event["payload"]["routed_by"] == "semantic"
    assert event["payload"]["match_type"] == "example:will it rain tomorrow"
    assert event["payload"]["confidence"] == pytest.approx(verdict.confidence, abs=1e-4)
    assert 0.0 < event["payload"]["confidence"] <= 1.0


def test_router_needs_intents_and_examples() -> None:
    with pytest.raises(EmbedError):
        Router([], FakeEmbedder(8))
    with pytest.raises(EmbedError, match="no examples"):
        Router([Intent("x", ())], FakeEmbedder(8))


def test_router_names_a_wrong_type() -> None:
    # before: AttributeError "'str' object has no attribute 'name'" for config.intents (a mapping)
    intents = {"a": Intent("a", ("x",)), "b": Intent("b", ("y",))}
    with pytest.raises(TypeError, match=r"list\(config.intents.values\(\)\)"):
        Router(intents, FakeEmbedder(8))  # type: ignore[arg-type]
    router = Router(list(intents.values()), FakeEmbedder(8))
    with pytest.raises(TypeError, match="takes a Calibration"):
        router.apply(None)  # type: ignore[arg-type]
