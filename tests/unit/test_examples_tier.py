"""The examples tier (k-NN vote, dynamic few-shot) and the min_precision cascade, hermetic.

A bag-of-words embedder stands in for a sentence embedder: texts sharing words are similar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localllm import load_config
from localllm.embed.embedder import EmbedderIdentity
from localllm.embed.examples import Example, Neighbour, render_shots, vote
from localllm.errors import ConfigError
from localllm.eval import evaluate
from localllm.runtime import Runtime
from localllm.trace import read_trace
from localllm.wire import AskRequest, AskResponse

VOCAB = ["refund", "charged", "invoice", "crash", "error", "broken", "add", "please", "feature", "weather"]


class WordsEmbedder:
    def __init__(self) -> None:
        self.texts = 0

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity("words", len(VOCAB) + 1, "bag", "", "")

    def embed(self, texts: Sequence[str], role: str) -> Any:
        self.texts += len(texts)
        rows = []
        for text in texts:
            words = text.lower().split()
            row = [float(sum(w.startswith(v) for w in words)) for v in VOCAB] + [0.01]
            rows.append(row)
        m = np.asarray(rows, dtype=np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)


EXAMPLES = [
    ("e1", "refund please I was charged twice", "billing"),
    ("e2", "charged twice refund", "billing"),
    ("e3", "invoice wrong charged", "billing"),
    ("e4", "app crash on start", "bug"),
    ("e5", "error and crash when saving", "bug"),
    ("e6", "broken page error", "bug"),
    ("e7", "please add dark mode feature", "feature"),
    ("e8", "add export feature please", "feature"),
    ("e9", "feature request add tags", "feature"),
]


def neighbours(*pairs: tuple[str, float]) -> list[Neighbour]:
    return [Neighbour(Example(f"x{i}", "t", {"queue": q}), s) for i, (q, s) in enumerate(pairs)]


def test_vote_margin_by_hand() -> None:
    got = vote(neighbours(("bug", 0.9), ("bug", 0.7), ("billing", 0.4)), ["queue"])
    assert got.answer == {"queue": "bug"}
    assert got.confidence == pytest.approx((1.6 - 0.4) / 2.0 * 0.9)  # margin × nearest bug's similarity
    unanimous = vote(neighbours(("bug", 0.9), ("bug", 0.1)), ["queue"])
    assert unanimous.confidence == pytest.approx(0.9)
    far = vote(neighbours(("bug", 0.2), ("bug", 0.1)), ["queue"])
    assert far.confidence == pytest.approx(0.2)  # agreeing but distant neighbours are not confident
    tie = vote(neighbours(("bug", 0.5), ("billing", 0.5)), ["queue"])
    assert (tie.answer, tie.confidence) == ({"queue": "bug"}, 0.0)  # the nearer label wins the tie, at 0
    negative = vote(neighbours(("bug", -0.2)), ["queue"])
    assert negative.confidence == 0.0
    assert vote([], ["queue"]).answer == {}


def test_render_shots_puts_the_nearest_last() -> None:
    text = render_shots(neighbours(("bug", 0.9), ("billing", 0.4)), "ticket")
    assert text.splitlines() == ["Ticket: t", '{"queue":"billing"}', "", "Ticket: t", '{"queue":"bug"}']


CONFIG = """\
app_id: ex
agent_plugins:
  agent.local: {plugin: builtin.inprocess}
  agent.claude: {plugin: builtin.inprocess}
embedders:
  words: {model: all-minilm-l6-v2}
gates:
  queue:
    invoke: host.agent.decide
    agent: agent.local
    with:
      prompt: "Sort the ticket.\\n{{ examples }}\\nTicket: {{ args.ticket }}"
      schema: schema.json
      args: {ticket: "{{ args.ticket }}"}
    examples: {cases: examples.jsonl, embedder: words, input: ticket, k: 3, shots: 2}
"""
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"queue": {"enum": ["billing", "bug", "feature"]}},
    "required": ["queue"],
}


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "app.yaml").write_text(CONFIG)
    write_examples(tmp_path / "examples.jsonl", EXAMPLES)
    return tmp_path


def write_examples(path: Path, rows: Sequence[tuple[str, str, str]]) -> None:
    path.write_text(
        "".join(json.dumps({"id": i, "args": {"ticket": t}, "expect": {"queue": q}}) + "\n" for i, t, q in rows)
    )


def test_config_fills_the_voted_fields_and_reports_bad_examples(app: Path) -> None:
    config = load_config(app / "app.yaml")
    assert config.gates["queue"].examples is not None
    assert config.gates["queue"].examples.fields == ("queue",)
    text = (app / "app.yaml").read_text()
    (app / "app.yaml").write_text(
        text.replace("embedder: words", "embedder: nope").replace("input: ticket", "input: body")
    )
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    keys = {p.key for p in info.value.problems}
    assert keys == {"gates.queue.examples.embedder", "gates.queue.examples.input"}
    (app / "app.yaml").write_text(text)
    (app / "schema.json").write_text(
        json.dumps(
            {**SCHEMA, "properties": {**SCHEMA["properties"], "why": {"type": "string"}}, "required": ["queue", "why"]}
        )
    )
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    assert [p.key for p in info.value.problems] == ["gates.queue.examples.answer"]
    (app / "examples.jsonl").write_text('{"args": {"ticket": 3}, "expect": {"queue": "bug"}}\nnot json\n')
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    assert [p.key for p in info.value.problems] == ["gates.queue.examples.cases"]


def test_dynamic_few_shot_renders_the_nearest_examples_into_the_prompt(app: Path) -> None:
    prompts: list[str] = []

    def local(request: AskRequest) -> AskResponse:
        prompts.append(request.prompt)
        return AskResponse.of({"queue": "bug"})

    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", WordsEmbedder())
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.run_gate("queue", {"ticket": "crash with an error"})
    assert 'Ticket: error and crash when saving\n{"queue":"bug"}' in prompts[0]
    assert "please add" not in prompts[0]  # only the 2 nearest


def evidence(app: Path, embedder: WordsEmbedder, local: Any = None) -> Path:
    """An eval of the examples tier (leave-one-out) and agent.local, agent.claude as the strong tier."""
    config = load_config(app / "app.yaml")

    def prepare(rt: Runtime) -> None:
        rt.register_embedder("words", embedder)
        rt.register_inprocess("agent.local", local or (lambda _: AskResponse.of({"queue": "bug"})), local_model=True)
        rt.register_inprocess("agent.claude", lambda _: AskResponse.of({"queue": "billing"}))

    result = evaluate(
        config, "queue", agents=["examples", "agent.local", "agent.claude"], prepare=prepare, holdout=0.34
    )
    return result.paths["latest"]


def test_eval_records_each_tier_confidence_and_the_decision(app: Path) -> None:
    latest = evidence(app, WordsEmbedder())
    report = json.loads(latest.read_text())
    page = (latest.parent / "latest.html").read_text()
    assert page.count("<polyline") == 1  # one scored tier, one curve
    assert "min_precision cascade" in page
    tiers = report["calibration"]["tiers"]
    assert tiers["examples"]["scored"] == 9  # the vote always reports a confidence
    assert tiers["agent.local"]["scored"] == 0  # this agent reports none: never accepted
    assert len(tiers["examples"]["calibration"]["scores"]) == 6  # 3 of 9 held out, one per label
    assert report["calibration"]["held_out_cases"] and len(report["calibration"]["held_out_cases"]) == 3
    assert report["agents"]["examples"]["local"] is True
    assert report["agents"]["examples"]["accuracy"] == 1.0  # leave-one-out: never its own label
    decision = report["decision"]["0.9"]
    assert decision["order"] == ["examples", "agent.local", "agent.claude"]
    # 6 calibration answers, all right: the lower bound 0.05**(1/6) = 0.61 is under 0.9 → accept nothing
    assert decision["thresholds"]["examples"] is None
    assert decision["local_share"] == 0.0


def test_eval_prints_the_decision(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli.eval import _print_decision

    _print_decision(json.loads(evidence(app, WordsEmbedder()).read_text()))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("examples: 9 of 9 answers carry a confidence") for line in lines)
    assert sum("accept nothing" in line for line in lines) == 2  # both targets, too little evidence
    assert sum(line.startswith("min_precision ") for line in lines) == 2
    per_label = next(line for line in lines if line.startswith("examples queue per label: "))
    assert per_label.count(" of 3") == 3  # three labels, three examples each


def cascade_app(app: Path, min_precision: float) -> Path:
    # 30 examples: enough evidence for a 0.9 bound when all are right
    rows = [(f"{i}-{j}", text + f" {'x' * j}", q) for j in range(4) for i, text, q in EXAMPLES]
    write_examples(app / "examples.jsonl", rows)
    labels = {text: q for _, text, q in rows}

    def knows(request: AskRequest) -> AskResponse:  # right on every example, and sure of it
        ticket = str((request.with_ or {})["args"]["ticket"])
        return AskResponse.of({"queue": labels[ticket]}, meta={"confidence": 0.95, "confidence_method": "test"})

    report = evidence(app, WordsEmbedder(), knows)
    text = (app / "app.yaml").read_text()
    (app / "app.yaml").write_text(
        text + f"    selection: {{min_precision: {min_precision}, evidence: {report.relative_to(app)}}}\n"
    )
    return report


def test_a_confident_vote_answers_without_the_llm_and_an_unsure_one_escalates_once(app: Path, tmp_path: Path) -> None:
    cascade_app(app, 0.8)
    calls: list[str] = []

    def local(request: AskRequest) -> AskResponse:
        calls.append("local")
        sure = "export" in str((request.with_ or {})["args"]["ticket"])
        return AskResponse.of({"queue": "feature"}, meta={"confidence": 0.97 if sure else 0.5})

    def claude(request: AskRequest) -> AskResponse:
        calls.append("claude")
        return AskResponse.of({"queue": "billing"}, meta={"cost_usd": 0.01})

    trace = tmp_path / "t.jsonl"
    embedder = WordsEmbedder()
    with Runtime(load_config(app / "app.yaml"), trace=trace) as rt:
        rt.register_embedder("words", embedder)
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        sure = rt.run_gate("queue", {"ticket": "app crash error"})
        assert calls == []  # the examples tier answered: no LLM
        unsure = rt.run_gate("queue", {"ticket": "refund error crash charged"})  # in scope, split vote
    assert sure.agent == "examples" and sure.submission == {"queue": "bug"}
    assert sure.meta["tier"] == "examples" and sure.meta["cascade"][0]["accepted"] is True
    assert sure.meta["selected_by"]["policy"] == "min_precision"
    assert calls == ["local", "claude"]
    assert unsure.agent == "agent.claude"
    assert [s["agent"] for s in unsure.meta["cascade"]] == ["examples", "agent.local", "agent.claude"]
    assert [s["reason"] for s in unsure.meta["cascade"]] == ["low_confidence", "low_confidence", "last tier"]
    assert unsure.meta["cascade"][1]["threshold"] == 0.95
    with Runtime(load_config(app / "app.yaml"), trace=trace) as rt:
        rt.register_embedder("words", embedder)
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        kept = rt.run_gate("queue", {"ticket": "refund error crash charged export"})  # examples unsure, model sure
    assert calls == ["local", "claude", "local"]
    assert kept.agent == "agent.local" and kept.meta["fallback_of"] == "examples"
    ends = [e for e in read_trace(trace).events if e.kind == "agent.call.complete"]
    assert "substitution" not in ends[0].payload
    assert ends[1].payload["substitution"]["reason"] == "low_confidence"
    assert ends[1].payload["original_meta"]["tier"] == "examples"  # both legs' meta kept
    assert ends[1].payload["meta"]["cost_usd"] == 0.01
    assert ends[2].payload["substitution"]["fallback_plugin"] == "agent.local"
    from localllm.cli import main

    assert main(["trace", "verify", str(trace)]) == 0


def test_stale_evidence_disables_the_local_tiers(app: Path) -> None:
    cascade_app(app, 0.8)
    with (app / "examples.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "new", "args": {"ticket": "refund"}, "expect": {"queue": "billing"}}) + "\n")
    calls: list[str] = []
    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", WordsEmbedder())
        rt.register_inprocess("agent.local", lambda _: calls.append("local") or {"queue": "bug"}, local_model=True)  # type: ignore[func-returns-value]
        rt.register_inprocess("agent.claude", lambda _: calls.append("claude") or {"queue": "bug"})  # type: ignore[func-returns-value]
        result = rt.run_gate("queue", {"ticket": "app crash error"})
    assert calls == ["claude"]
    assert result.meta["selected_by"]["tiers"] == ["agent.claude"]
    assert "stale" in result.meta["selected_by"]["disabled"]["agent.local"]
    assert "stale" in result.meta["selected_by"]["disabled"]["examples"]


def test_examples_are_embedded_once_and_again_only_when_they_change(app: Path) -> None:
    embedder = WordsEmbedder()
    for _ in range(2):
        with Runtime(load_config(app / "app.yaml")) as rt:
            rt.register_embedder("words", embedder)
            rt.register_inprocess("agent.local", lambda _: {"queue": "bug"}, local_model=True)
            rt.run_gate("queue", {"ticket": "crash"})
    assert embedder.texts == len(EXAMPLES) + 2  # the examples once (then the store), a query per call
    write_examples(app / "examples.jsonl", [*EXAMPLES, ("e10", "weather report", "feature")])
    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", embedder)
        rt.register_inprocess("agent.local", lambda _: {"queue": "bug"}, local_model=True)
        rt.run_gate("queue", {"ticket": "crash"})
    assert embedder.texts == len(EXAMPLES) + 2 + 1 + 1  # only the new example, and the query


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("    selection: {min_precision: 0.9, policy: cheapest-passing}\n", "gates.queue.selection.min_precision"),
        ("    selection: {min_precision: 1.5}\n", "gates.queue.selection.min_precision"),
    ],
)
def test_selection_min_precision_is_checked_at_load(app: Path, extra: str, key: str) -> None:
    (app / "app.yaml").write_text(CONFIG + extra)
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    assert [p.key for p in info.value.problems] == [key]


def test_unknown_examples_key_is_named(app: Path) -> None:
    (app / "app.yaml").write_text(CONFIG.replace("k: 3,", "kk: 3,"))
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    assert [p.key for p in info.value.problems] == ["gates.queue.examples.kk"]


def test_without_evidence_every_call_goes_to_the_strong_tier(app: Path) -> None:
    (app / "app.yaml").write_text(CONFIG + "    selection: {min_precision: 0.9}\n")
    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", WordsEmbedder())
        rt.register_inprocess("agent.local", lambda _: {"queue": "bug"}, local_model=True)
        rt.register_inprocess("agent.claude", lambda _: {"queue": "billing"})
        result = rt.run_gate("queue", {"ticket": "app crash error"})
    assert result.agent == "agent.claude"
    assert set(result.meta["selected_by"]["disabled"]) == {"examples", "agent.local"}


def test_simulate_cascade_by_hand() -> None:
    import math

    from localllm.eval.decision import Outcome, simulate_cascade

    tiers = {
        "examples": {"a": Outcome(True, 0.9, 1), "b": Outcome(False, 0.4, 1), "c": Outcome(False, 0.8, 1)},
        "llm": {"a": Outcome(True, None, 100), "b": Outcome(True, 0.95, 100), "c": Outcome(True, 0.2, 100)},
        "strong": {
            "a": Outcome(True, None, 1000, 0.01),
            "b": Outcome(True, None, 1000, 0.01),
            "c": Outcome(True, None, 1000, 0.01),
        },
    }
    got = simulate_cascade(["examples", "llm", "strong"], {"examples": 0.75, "llm": 0.9}, tiers, ["a", "b", "c"])
    # a: examples (right); b: examples low → llm 0.95 (right); c: examples 0.8 accepted (wrong)
    assert got["local_share"] == 1.0
    assert got["local_precision"] == pytest.approx(2 / 3, abs=1e-6)
    assert got["cascade_accuracy"] == pytest.approx(2 / 3, abs=1e-6)
    assert got["strong_accuracy"] == 1.0 and got["cost_usd"] == 0.0 and got["strong_cost_usd"] == 0.03
    nothing = simulate_cascade(["examples", "strong"], {"examples": math.inf}, tiers, ["a", "b", "c"])
    assert (nothing["local_share"], nothing["cascade_accuracy"], nothing["mean_ms"]) == (0.0, 1.0, 1001.0)


class FailingEmbedder(WordsEmbedder):
    """Embeds the examples, then fails every question (the sidecar died)."""

    def embed(self, texts: Sequence[str], role: str) -> Any:
        from localllm.errors import EmbedError

        if len(texts) == 1:
            raise EmbedError("embedding sidecar exited")
        return super().embed(texts, role)


def test_an_embedder_failure_escalates_instead_of_failing_the_call(app: Path) -> None:
    cascade_app(app, 0.8)
    asked: list[str] = []

    def local(request: AskRequest) -> AskResponse:  # sure of itself: would be accepted if asked
        asked.append("local")
        return AskResponse.of({"queue": "bug"}, meta={"confidence": 0.99})

    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", FailingEmbedder())
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", lambda _: {"queue": "billing"})
        result = rt.run_gate("queue", {"ticket": "app crash error"})
    assert result.agent == "agent.claude" and asked == []
    first = result.meta["cascade"][0]
    # the question cannot be embedded: its scope is unknown, so no local rung answers it
    assert (first["agent"], first["accepted"], first["reason"]) == ("examples", False, "scope_unknown")
    assert first["skipped"] == ["examples", "agent.local"] and first["novelty"] is None


def test_novelty_bar_by_hand_held_out_label_and_out_of_scope_examples() -> None:
    from localllm.embed.examples import ExampleSet

    def ex(i: str, text: str, queue: str) -> Example:
        return Example(i, text, {"queue": queue})

    inside = [ex("a1", "refund", "billing"), ex("a2", "refund charged", "billing")]
    inside += [ex("b1", "crash", "bug"), ex("b2", "crash refund", "bug")]
    # no out-of-scope examples: each example against the other label's only
    # a1 → b2: 1/√2; a2 → b2: 1/2; b1 → none sharing a word: ~0; b2 → a1: 1/√2. The bar: the max.
    held_out = ExampleSet(inside, WordsEmbedder()).novelty_bar(["queue"])
    assert held_out.n == 4 and held_out.value == pytest.approx(2**-0.5, abs=1e-3)
    assert held_out.pass_rate_bound == pytest.approx(0.2)
    # out-of-scope examples: nearest in-scope − nearest other out-of-scope example
    # o1 "weather": ~0 − sim(o1, o2) = −1/√2; o2 "weather refund": sim(o2, a1) − sim(o2, o1) = 1/√2 − 1/√2 = 0
    sets = ExampleSet([*inside, ex("o1", "weather", "oos"), ex("o2", "weather refund", "oos")], WordsEmbedder())
    bar = sets.novelty_bar(["queue"], "oos")
    assert bar.n == 2 and bar.value == pytest.approx(0.0, abs=1e-3)
    assert sets.novelty("refund", ["queue"], "oos") == pytest.approx(1 - 2**-0.5, abs=1e-3)
    assert sets.novelty("weather", ["queue"], "oos") == pytest.approx(-1.0, abs=1e-3)
    assert bar.admits(sets.novelty("refund", ["queue"], "oos"))
    assert not bar.admits(sets.novelty("weather", ["queue"], "oos"))
    assert ExampleSet(inside[:2], WordsEmbedder()).novelty_bar(["queue"]).measured is False  # one label: no rule


def test_an_out_of_scope_input_skips_every_local_tier_with_the_reason_in_the_trace(app: Path, tmp_path: Path) -> None:
    cascade_app(app, 0.8)
    calls: list[str] = []

    def local(request: AskRequest) -> AskResponse:
        calls.append("local")
        return AskResponse.of({"queue": "feature"}, meta={"confidence": 0.99})  # sure, and it would be wrong

    def claude(request: AskRequest) -> AskResponse:
        calls.append("claude")
        return AskResponse.of({"queue": "billing"}, meta={"cost_usd": 0.01})

    trace = tmp_path / "t.jsonl"
    with Runtime(load_config(app / "app.yaml"), trace=trace) as rt:
        rt.register_embedder("words", WordsEmbedder())
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        far = rt.run_gate("queue", {"ticket": "the weather"})  # no example shares a word
        near = rt.run_gate("queue", {"ticket": "refund error crash charged"})
    assert calls == ["claude", "local"]  # the far input never reached a local tier
    assert far.agent == "agent.claude"
    step = far.meta["cascade"][0]
    assert (step["agent"], step["accepted"], step["reason"]) == ("examples", False, "out_of_scope")
    assert step["skipped"] == ["examples", "agent.local"]
    assert step["novelty"] <= step["novelty_bar"]
    assert [s["reason"] for s in far.meta["cascade"]] == ["out_of_scope", "last tier"]
    assert near.agent == "agent.local" and near.meta["cascade"][0]["reason"] == "low_confidence"
    ends = [e for e in read_trace(trace).events if e.kind == "agent.call.complete"]
    assert ends[0].payload["substitution"] == {
        "reason": "out_of_scope",
        "original_plugin": "examples",
        "fallback_plugin": "agent.claude",
    }
    from localllm.cli import main

    assert main(["trace", "verify", str(trace)]) == 0


def test_eval_applies_the_out_of_scope_rule_before_calibrating(app: Path) -> None:
    rows = [(f"{i}-{j}", text + f" {'x' * j}", q) for j in range(2) for i, text, q in EXAMPLES]
    rows += [(f"w{j}", f"the weather {'y' * j}", "oos") for j in range(4)]  # out of scope, labelled so
    write_examples(app / "examples.jsonl", rows)
    schema = {**SCHEMA, "properties": {"queue": {"enum": ["billing", "bug", "feature", "oos"]}}}
    (app / "schema.json").write_text(json.dumps(schema))
    (app / "app.yaml").write_text(CONFIG.replace("k: 3, shots: 2}", "k: 3, shots: 2, out_of_scope: oos}"))
    report = json.loads(evidence(app, WordsEmbedder()).read_text())
    verdicts = {r["case"]: r["in_scope"] for r in report["calls"] if r["agent"] == "examples"}
    assert {c for c, v in verdicts.items() if v is False} == {"w0", "w1", "w2", "w3"}
    assert all(v is True for c, v in verdicts.items() if not c.startswith("w"))
    calibration = report["calibration"]
    out = calibration["out_of_scope"]
    assert out["cases"] == 4
    # the examples tier's calibration pairs: the calibration split's in-scope cases only
    cal_cases = len(rows) - len(calibration["held_out_cases"])
    assert len(calibration["tiers"]["examples"]["calibration"]["scores"]) == cal_cases - out["calibration_cases"]
    assert calibration["tiers"]["examples"]["calls"] == len(rows)  # accuracy and curve: every case


def test_eval_prints_the_out_of_scope_rule(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli.eval import _print_decision

    rows = [(f"{i}-{j}", text + f" {'x' * j}", q) for j in range(2) for i, text, q in EXAMPLES]
    rows += [(f"w{j}", f"the weather {'y' * j}", "oos") for j in range(4)]
    write_examples(app / "examples.jsonl", rows)
    (app / "schema.json").write_text(
        json.dumps({**SCHEMA, "properties": {"queue": {"enum": ["billing", "bug", "feature", "oos"]}}})
    )
    (app / "app.yaml").write_text(CONFIG.replace("k: 3, shots: 2}", "k: 3, shots: 2, out_of_scope: oos}"))
    _print_decision(json.loads(evidence(app, WordsEmbedder()).read_text()))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"out-of-scope rule: 4 of {len(rows)} cases") for line in lines)


def test_a_cascade_call_embeds_its_question_once(app: Path) -> None:
    cascade_app(app, 0.8)
    embedder = WordsEmbedder()
    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", embedder)
        rt.register_inprocess("agent.local", lambda _: {"queue": "bug"}, local_model=True)
        rt.register_inprocess("agent.claude", lambda _: {"queue": "bug"})
        rt.run_gate("queue", {"ticket": "app crash error"})  # embeds the examples, then the question
        before = embedder.texts
        result = rt.run_gate("queue", {"ticket": "broken error page"})
    assert result.agent == "examples" and "novelty" in result.meta  # few-shot, scope, vote, novelty
    assert embedder.texts - before == 1


def test_an_unknown_models_examples_are_not_read_back_at_another_width(tmp_path: Path) -> None:
    import base64

    import httpx

    from localllm.embed.embedder import fake_vector
    from localllm.embed.examples import ExampleSet
    from localllm.embed.local import LocalEmbedder

    def embedder(dims: int) -> LocalEmbedder:
        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            data = [
                {
                    "index": i,
                    "embedding": base64.b64encode(np.array(fake_vector(t, dims), dtype="<f4").tobytes()).decode(),
                }
                for i, t in enumerate(body["input"])
            ]
            return httpx.Response(200, json={"data": data})

        with pytest.warns(Warning, match="not in the registry"):
            return LocalEmbedder("http://embed.test", "my-embed", transport=httpx.MockTransport(handler))

    examples = [Example("1", "refund please", {"q": "billing"}), Example("2", "app crashes", {"q": "bug"})]
    assert ExampleSet(examples, embedder(384), store_root=tmp_path).neighbours("refund", 1)
    # the same model name, the server now running another GGUF: before, a bare numpy ValueError
    (best,) = ExampleSet(examples, embedder(768), store_root=tmp_path).neighbours("refund", 1)
    assert best.example.id in ("1", "2")


def test_an_example_repeated_under_its_label_is_one_example_with_one_vote(app: Path) -> None:
    from localllm.embed.examples import load_examples

    # e2 pasted again (its case and spacing differ: the embedder sees the same text). Before, a
    # near input found it twice among its k = 3, a billing vote that pushed e4 (bug) out
    write_examples(app / "examples.jsonl", [*EXAMPLES, ("e2-again", " Charged  TWICE refund", "billing")])
    with Runtime(load_config(app / "app.yaml")) as rt:
        rt.register_embedder("words", WordsEmbedder())
        sets = rt.examples("queue")
        assert sets is not None
        near = sets.neighbours("charged twice refund crash", 3)
    assert [n.example.id for n in near] == ["e2", "e1", "e4"]
    result = vote(near, ["queue"])
    assert result.answer == {"queue": "billing"}
    weights = [n.score for n in near]
    assert result.confidence == pytest.approx((weights[0] + weights[1] - weights[2]) / sum(weights) * weights[0])
    kept, repeats = load_examples(app / "examples.jsonl", "ticket")
    assert ([e.id for e in kept], [(e.id, e.line) for e in repeats]) == (
        [i for i, _, _ in EXAMPLES],
        [("e2-again", 10)],
    )


def test_a_text_under_two_labels_is_a_problem_of_the_examples_file_naming_both_lines(app: Path) -> None:
    from localllm.embed.examples import load_examples

    path = app / "examples.jsonl"
    # e2's text labelled bug (case and spacing aside): before, loaded, and a near input was voted for both
    write_examples(path, [*EXAMPLES, ("e2-bug", " Charged  TWICE refund", "bug")])
    with pytest.raises(ConfigError) as info:
        load_config(app / "app.yaml")
    (problem,) = info.value.problems
    assert problem.key == "gates.queue.examples.cases"
    assert f"{path} line 10.expect" in problem.message and "line 2" in problem.message
    assert "line 2 or line 10" in problem.hint
    with pytest.raises(ConfigError) as info:
        load_examples(path, "ticket")
    assert [(p.file, p.key) for p in info.value.problems] == [(str(path), "line 10.expect")]
    # an unlabelled case (trace cases' recorded answer) is not an example: it contradicts none
    path.write_text(path.read_text().replace('"id": "e2-bug"', '"id": "e2-bug", "labelled": false'))
    kept, repeats = load_examples(path, "ticket")
    assert (len(kept), repeats) == (9, [])
    load_config(app / "app.yaml")


def test_eval_reports_the_repeated_examples(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli.eval import _print_table

    write_examples(
        app / "examples.jsonl",
        [
            *EXAMPLES,
            ("e2-again", " Charged  TWICE refund", "billing"),
            ("e9-again", "feature REQUEST add tags", "feature"),
        ],
    )
    latest = evidence(app, WordsEmbedder())
    report = json.loads(latest.read_text())
    assert report["examples"] == {
        "file": "examples.jsonl",
        "examples": 9,
        "duplicate_examples": 2,
        "duplicate_lines": [10, 11],
    }
    _print_table(report)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "examples repeat an earlier one" in x]
    assert line.startswith("2 of examples.jsonl's examples") and "lines 10, 11" in line
    assert "repeating an example, lines 10, 11" in (latest.parent / "latest.html").read_text()
    write_examples(app / "examples.jsonl", EXAMPLES)
    assert json.loads(evidence(app, WordsEmbedder()).read_text())["examples"]["duplicate_examples"] == 0
