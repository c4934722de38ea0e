"""localllm eval: cases and matchers, reports recounted from the trace, selection on real
evidence files, stale evidence in `check`, trace → cases / cassette round trips."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from localllm.cli import main
from localllm.config import Config
from localllm.errors import AgentError, CallError, ConfigError, ProblemList
from localllm.eval import evaluate, load_cases
from localllm.eval.cases import Case, parse_expect
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import derive_call_id, read_trace
from localllm.wire import AskRequest
from tests.conftest import in_child

SCHEMA = {
    "title": "triage",
    "type": "object",
    "properties": {
        "queue": {"enum": ["billing", "bug", "feature", "other"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "summary": {"type": "string", "minLength": 1},
    },
    "required": ["queue", "priority", "summary"],
}

TICKETS = {
    "t1": ("I was charged twice, refund please", "billing", 2),
    "t2": ("The app crashes when I upload a photo", "bug", 2),
    "t3": ("Please add a dark mode", "feature", 4),
    "t4": ("Production is down for everyone, crash loop", "bug", 1),
    "t5": ("How do I change my username?", "other", 4),
    "t6": ("Invoice shows the wrong VAT number", "billing", 3),
}

CONFIG = """\
app_id: evalapp
agent_plugins:
  agent.local: {plugin: builtin.inprocess}
  agent.small: {plugin: builtin.inprocess}
  agent.claude: {plugin: builtin.inprocess}
gates:
  triage:
    invoke: host.agent.decide
    agent: agent.small
    with:
      prompt: 'Triage: {{ args.ticket }}'
      schema: schemas/triage.json
      args: {ticket: '{{ args.ticket }}'}
"""


def write_cases(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for case_id, (ticket, queue, priority) in TICKETS.items():
            fh.write(
                json.dumps(
                    {
                        "id": case_id,
                        "args": {"ticket": ticket},
                        "expect": {
                            "queue": queue,
                            "priority": {"number": priority, "tolerance": 1},
                            "summary": {"any_valid": True},
                        },
                    }
                )
                + "\n"
            )


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "triage.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "app.yaml").write_text(CONFIG)
    write_cases(tmp_path / "evals" / "triage" / "cases.jsonl")
    return tmp_path


def ticket_of(request: AskRequest) -> str:
    assert request.with_ is not None
    return str(request.with_["args"]["ticket"])


def truth(request: AskRequest) -> dict[str, Any]:
    ticket = ticket_of(request)
    for text, queue, priority in TICKETS.values():
        if text == ticket:
            return {"queue": queue, "priority": priority, "summary": text[:20]}
    raise AssertionError(ticket)


def small(request: AskRequest) -> Any:
    """Right on most; calls every crash a feature; answers refunds outside the schema."""
    answer = truth(request)
    if "crash" in answer["summary"].lower() or "crash" in ticket_of(request):
        answer["queue"] = "feature"
    if "refund" in ticket_of(request):
        return {"queue": "money", "priority": 9, "summary": "x"}
    return answer


def claude(request: AskRequest) -> dict[str, Any]:
    from localllm.wire import AskResponse

    return AskResponse(
        submission=json.dumps(truth(request)),
        meta={
            "cost_usd": 0.01,  # type: ignore[return-value]
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    )


def prepare(runtime: Runtime) -> None:
    runtime.register_inprocess("agent.local", truth, local_model=True)
    runtime.register_inprocess("agent.small", small, local_model=True)
    runtime.register_inprocess("agent.claude", claude)


# --------------------------------------------------------------------------- matchers


@pytest.mark.parametrize(
    ("expect", "answer", "correct", "fields"),
    [
        ({"queue": "bug"}, {"queue": "bug", "priority": 1}, True, {"queue": True}),
        ({"queue": "bug"}, {"queue": "billing"}, False, {"queue": False}),
        ({"queue": {"one_of": ["bug", "feature"]}}, {"queue": "feature"}, True, {"queue": True}),
        ({"priority": {"number": 2, "tolerance": 1}}, {"priority": 3}, True, {"priority": True}),
        ({"priority": {"number": 2, "tolerance": 1}}, {"priority": 4}, False, {"priority": False}),
        ({"priority": {"number": 1}}, {"priority": True}, False, {"priority": False}),
        ({"priority": 1}, {"priority": 1.0}, True, {"priority": True}),
        ({"flag": True}, {"flag": 1}, False, {"flag": False}),
        ({"summary": {"regex": "^refund"}}, {"summary": "refund twice"}, True, {"summary": True}),
        ({"summary": {"regex": "^refund"}}, {"summary": 3}, False, {"summary": False}),
        ({"summary": {"any_valid": True}}, {"queue": "bug"}, False, {"summary": False}),
        ({"meta": {"equals": {"a": 1}}}, {"meta": {"a": 1}}, True, {"meta": True}),
        ({"meta": {"a": 1}}, {"meta": {"a": 1}}, True, {"meta": True}),
        (
            {"exact": {"queue": "bug", "priority": 1}},
            {"queue": "bug", "priority": 1},
            True,
            {"queue": True, "priority": True},
        ),
        (
            {"exact": {"queue": "bug", "priority": 1}},
            {"queue": "bug", "priority": 1, "x": 0},
            False,
            {"queue": True, "priority": True},
        ),
        ({"fields": {"queue": "bug"}}, {"queue": "bug"}, True, {"queue": True}),
        ({}, {"anything": 1}, True, {}),
        ({"queue": "bug"}, "bug", False, {"queue": False}),
    ],
)
def test_matchers(expect: Any, answer: Any, correct: bool, fields: dict[str, bool]) -> None:
    problems = ProblemList("cases.jsonl")
    parsed = parse_expect(expect, "line 1.expect", problems)
    assert problems.items == [] and parsed is not None
    assert parsed.judge(answer) == (correct, fields)


def test_a_regex_matcher_never_backtracks_on_the_model_s_answer() -> None:
    # an everyday pattern: re took over 60 s on an eight-word answer ending in a full stop
    verdicts = in_child(
        r"""
        import json
        from localllm.eval.cases import Matcher
        words = Matcher("regex", r"^(\w+\s?)+$")
        said = "the customer was charged twice for the order"
        print(json.dumps([
            words.matches(True, said + "."),
            words.matches(True, said),
            words.matches(True, "x" * 100_000 + "."),
            Matcher("regex", r"(a)\1").matches(True, "xaa"),  # a backreference: re decides, as written
        ]))
        """
    )
    assert verdicts == [False, True, False, True]


def test_cases_file_problems_are_all_reported_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "args": {}, "expect": {"q": {"one_of": []}}}),
                "not json",
                json.dumps({"id": "a", "args": {}, "expect": {}}),
                json.dumps({"args": [], "expect": {}}),
                json.dumps({"args": {}, "expect": {"p": {"number": 1, "regex": "x"}}, "colour": 1}),
                json.dumps({"args": {}}),
                json.dumps({"args": {}, "expect": {"s": {"regex": "("}}}),
            ]
        )
        + "\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_cases(path)
    keys = [p.key for p in caught.value.problems]
    assert keys == [
        "line 1.expect.q.one_of",
        "line 2",
        "line 3.id",
        "line 4.args",
        "line 5.colour",
        "line 5.expect.p",
        "line 6.expect",
        "line 7.expect.s.regex",
    ]
    assert {p.file for p in caught.value.problems} == {str(path)}


def test_the_same_input_expecting_another_answer_is_a_problem_naming_both_lines(tmp_path: Path) -> None:
    # one of the two is wrong: judged by both, the same answer would be right once and wrong once
    rows = [
        {"id": "a", "args": {"ticket": "x"}, "expect": {"queue": "bug"}},
        {"id": "b", "args": {"ticket": "y"}, "expect": {"queue": "bug", "priority": 1}},
        {"id": "c", "args": {"ticket": "x"}, "expect": {"queue": "billing"}},
        {"id": "d", "args": {"ticket": "y"}, "expect": {"fields": {"queue": {"equals": "bug"}, "priority": 1.0}}},
        {"id": "e", "args": {"ticket": "x"}, "expect": {"exact": {"queue": "bug"}}},
        {"id": "f", "args": {"ticket": "x"}, "world": {"t": 1}, "expect": {"queue": "billing"}},  # another input
        {"id": "g", "args": {"ticket": "y"}, "expect": {"queue": "bug", "priority": 2}, "labelled": False},
    ]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as caught:
        load_cases(path)
    problems = caught.value.problems
    assert [(p.file, p.key) for p in problems] == [
        (str(path), "line 3.expect"),
        (str(path), "line 5.expect"),
        (str(path), "line 7.expect"),
    ]
    # each names the earlier line of the input, the fix both
    assert [line in p.message for line, p in zip(["line 1", "line 1", "line 2"], problems, strict=True)] == [True] * 3
    assert "line 1 or line 3" in problems[0].hint
    # the same expectation however it is spelt (d is b: equals, fields:, 1.0) is a repeat, not a
    # problem; nor is one that checks nothing (it contradicts no answer, and calibrates nothing)
    anything = {"id": "h", "args": {"ticket": "x"}, "expect": {}}
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:2], rows[3], rows[5], anything]))
    assert [c.id for c in load_cases(path)] == ["a", "b", "d", "f", "h"]


def test_a_repeated_case_is_asked_once_and_counted_in_the_report(app: Path) -> None:
    # the same args (their keys in another order), world and expect as an earlier line: one
    # question asked twice, whose answer is no second piece of evidence
    path = app / "evals" / "triage" / "cases.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    again = {"expect": first["expect"], "args": first["args"], "id": "t1-again"}
    unlabelled = {**json.loads(lines[2]), "id": "t3-unchecked", "labelled": False}
    path.write_text("\n".join([*lines, json.dumps(again), lines[1].replace('"t2"', '"t2-again"')]) + "\n")
    assert [c.id for c in load_cases(path)] == ["t1", "t2", "t3", "t4", "t5", "t6", "t1-again", "t2-again"]
    report = evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare).report
    assert (report["cases"], report["duplicate_cases"], report["duplicate_lines"]) == (6, 2, [7, 8])
    assert (report["calibration_cases"], report["agents"]["agent.local"]["calls"]) == (6, 6)
    assert sorted({row["case"] for row in report["calls"]}) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    # a repeat labels the unlabelled case it repeats; a file without repeats reports none
    path.write_text("\n".join([json.dumps(unlabelled), *lines]) + "\n")
    report = evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare).report
    assert (report["cases"], report["duplicate_lines"], report["unlabelled_cases"]) == (6, [4], 0)
    assert report["calibration_cases"] == 6 and {row["case"] for row in report["calls"]} >= {"t3-unchecked"}
    path.write_text("\n".join(lines) + "\n")
    report = evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare).report
    assert (report["cases"], report["duplicate_cases"], report["duplicate_lines"]) == (6, 0, [])


def test_a_case_missing_a_template_value_is_named_before_anything_runs(app: Path) -> None:
    config = load_config(app / "app.yaml")
    bad = app / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "args": {"other": 1}, "expect": {}}) + "\n")
    with pytest.raises(ConfigError) as caught:
        evaluate(config, "triage", cases_path=bad, prepare=prepare, out_dir=app / "out")
    assert [p.key for p in caught.value.problems] == ["line 1.args.ticket"]
    assert not (app / "out" / "triage").exists() or not list((app / "out" / "triage").glob("*.json"))


def test_a_case_holding_nan_is_named_before_anything_runs(app: Path) -> None:
    # json.loads reads NaN and Infinity, which are no JSON: before, each such case ran (NaN in
    # the trace as null), and an expected NaN matched no answer, silently
    config = load_config(app / "app.yaml")
    bad = app / "bad.jsonl"
    bad.write_text(
        '{"args": {"ticket": "t", "n": NaN}, "expect": {}}\n'
        '{"args": {"ticket": "u"}, "world": {"w": -Infinity}, "expect": {}}\n'
        '{"args": {"ticket": "v"}, "expect": {"queue": NaN}}\n'
    )
    with pytest.raises(ConfigError) as caught:
        evaluate(config, "triage", cases_path=bad, prepare=prepare, out_dir=app / "out")
    assert [p.key for p in caught.value.problems] == ["line 1", "line 2", "line 3"]
    assert all("is not a JSON number" in p.message for p in caught.value.problems)
    # cases made in Python are checked as every Runtime call's args are
    expect = parse_expect({}, "line 1.expect", ProblemList(bad))
    assert expect is not None
    made = [Case("c1", {"ticket": "t", "n": float("nan")}, expect)]
    with pytest.raises(ConfigError) as caught:
        evaluate(config, "triage", cases=made, prepare=prepare, out_dir=app / "out")
    assert [p.key for p in caught.value.problems] == ["line 0.args"]
    assert not (app / "out" / "triage").exists() or not list((app / "out" / "triage").glob("*.json"))


# --------------------------------------------------------------------------- the report


def recount(trace_path: Path, case_of_call: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Numbers counted straight from the trace events, independently of localllm.eval."""
    trace = read_trace(trace_path)
    starts = {ev.call_id: ev for ev in trace.events if ev.kind == "agent.call.start"}
    tally: dict[str, dict[str, Any]] = {}
    for ev in trace.events:
        if ev.kind not in ("agent.call.complete", "agent.call.error"):
            continue
        agent = starts[ev.call_id].payload["agent"]
        row = tally.setdefault(
            agent,
            {
                "calls": 0,
                "correct": 0,
                "fallbacks": 0,
                "errors": Counter(),
                "durations": [],
                "cost": 0.0,
                "valid_first": 0,
                "queue_ok": 0,
            },
        )
        row["calls"] += 1
        row["durations"].append(ev.payload["duration_ms"])
        fell_back = "substitution" in ev.payload
        row["fallbacks"] += fell_back
        if ev.kind == "agent.call.error":
            row["errors"][ev.payload["kind"]] += 1
            continue
        row["valid_first"] += not fell_back
        row["cost"] += ev.payload.get("meta", {}).get("cost_usd", 0.0)
        _, queue, priority = TICKETS[case_of_call[str(ev.call_id)]]
        got = ev.payload["response"]["submission"]  # the reference's {submission, meta} shape
        row["queue_ok"] += got["queue"] == queue
        row["correct"] += got["queue"] == queue and abs(got["priority"] - priority) <= 1
    return tally


def nearest_rank(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def test_report_numbers_equal_a_recount_from_the_trace(app: Path) -> None:
    config = load_config(app / "app.yaml")
    result = evaluate(
        config, "triage", agents=["agent.local", "agent.small", "agent.claude"], repeat=2, prepare=prepare
    )
    report = result.report
    case_of_call = {row["call_id"]: row["case"] for row in report["calls"]}
    assert len(case_of_call) == 3 * 6 * 2  # every call has its own call_id
    counted = recount(result.trace, case_of_call)
    for alias, row in report["agents"].items():
        mine = counted[alias]
        assert row["calls"] == mine["calls"] == 12
        assert row["correct"] == mine["correct"]
        assert row["accuracy"] == pytest.approx(mine["correct"] / 12)
        assert row["fallbacks"] == mine["fallbacks"]
        assert row["schema_valid_first_try"] == pytest.approx(mine["valid_first"] / 12)
        assert row["errors"] == dict(mine["errors"])
        assert row["latency_ms"]["p50"] == nearest_rank(mine["durations"], 50)
        assert row["latency_ms"]["p95"] == nearest_rank(mine["durations"], 95)
        assert row["cost_usd"]["total"] == pytest.approx(mine["cost"])
        assert row["fields"]["queue"]["correct"] == mine["queue_ok"]
    local, small_row, claude_row = (report["agents"][a] for a in ("agent.local", "agent.small", "agent.claude"))
    assert (local["accuracy"], local["fallback_rate"], local["local"]) == (1.0, 0.0, True)
    # small: the two crash tickets are wrong, the refund falls back to claude (right)
    assert small_row["correct"] == 8 and small_row["fallbacks"] == 2 and small_row["first_try_accuracy"] == 6 / 12
    assert small_row["confusion"]["queue"]["bug"] == {"feature": 4}
    assert small_row["reproducibility"] == 1.0
    assert claude_row["local"] is False and claude_row["tokens"] == {"prompt": 120, "completion": 60}
    assert claude_row["cost_usd"]["total"] == pytest.approx(0.12)
    # evidence files: the stamped report, latest.json, and the self-contained HTML
    latest = json.loads(result.paths["latest"].read_text())
    assert latest == json.loads(result.paths["json"].read_text()) == json.loads(json.dumps(report))
    page = result.paths["html"].read_text()
    assert "<svg" in page and "<script" not in page and "agent.small: queue" in page
    assert result.paths["json"].parent == app / "evals" / "reports" / "triage"


def test_parallel_slots_run_calls_concurrently(app: Path) -> None:
    config = load_config(app / "app.yaml")
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow(request: AskRequest) -> dict[str, Any]:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return truth(request)

    def prep(runtime: Runtime) -> None:
        runtime.register_inprocess("agent.local", slow)

    one = evaluate(config, "triage", agents=["agent.local"], prepare=prep, workers=1).report
    assert peak[0] == 1
    evaluate(config, "triage", agents=["agent.local"], prepare=prep, workers=3)
    assert peak[0] == 3
    assert one["agents"]["agent.local"]["workers"] == 1


def test_reproducibility_counts_cases_whose_repeats_differ(app: Path) -> None:
    config = load_config(app / "app.yaml")
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def flaky(request: AskRequest) -> dict[str, Any]:
        answer = truth(request)
        with lock:
            seen[answer["summary"]] += 1
            second = seen[answer["summary"]] == 2
        if second and "dark mode" in ticket_of(request):
            answer["priority"] = 5
        return answer

    report = evaluate(
        config,
        "triage",
        agents=["agent.local"],
        repeat=2,
        workers=1,
        prepare=lambda rt: rt.register_inprocess("agent.local", flaky),
    ).report
    assert report["agents"]["agent.local"]["reproducibility"] == pytest.approx(5 / 6)


# --------------------------------------------------------------------------- selection


def with_selection(app: Path, **keys: Any) -> Config:
    block = {"policy": "cheapest-passing", "evidence": "evals/reports/triage/latest.json", **keys}
    text = CONFIG + "    selection: " + json.dumps(block) + "\n"
    (app / "app.yaml").write_text(text)
    return load_config(app / "app.yaml")


def run_selected(config: Config, trace: Path) -> tuple[str, dict[str, Any]]:
    with Runtime(config, trace=trace) as runtime:
        prepare(runtime)
        result = runtime.run_gate("triage", {"ticket": TICKETS["t3"][0]})
    events = [ev for ev in read_trace(trace).events if ev.kind == "agent.call.complete"]
    assert events[-1].payload["meta"]["selected_by"] == result.meta["selected_by"]
    assert events[-1].payload["agent"] == result.agent
    return result.agent, result.meta["selected_by"]


def test_selection_picks_the_local_agent_when_its_evidence_passes(app: Path) -> None:
    evaluate(
        load_config(app / "app.yaml"), "triage", agents=["agent.claude", "agent.small", "agent.local"], prepare=prepare
    )
    config = with_selection(app, min_accuracy=0.9, max_fallback_rate=0.1, fallback_profile="agent.claude")
    agent, why = run_selected(config, app / "run.jsonl")
    assert agent == "agent.local"
    assert why["passed"] is True and why["evidence"] == str(app / "evals/reports/triage/latest.json")
    assert set(why["refused"]) == {"agent.small"}  # claude passes too, but local comes first


def test_selection_picks_claude_when_no_local_evidence_passes(app: Path) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.small", "agent.claude"], prepare=prepare)
    config = with_selection(app, min_accuracy=0.9)
    agent, why = run_selected(config, app / "run.jsonl")
    assert agent == "agent.claude" and why["passed"] is True and "agent.small" in why["refused"]


def test_selection_falls_back_to_the_profile_when_nothing_passes(app: Path) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.small"], prepare=prepare)
    config = with_selection(app, min_accuracy=0.9, fallback_profile="agent.claude")
    agent, why = run_selected(config, app / "run.jsonl")
    assert agent == "agent.claude" and why["passed"] is False and why["reason"] == "no agent's evidence passes"


def test_stale_evidence_after_a_schema_change_is_flagged_and_does_not_pass(
    app: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare)
    with_selection(app, fallback_profile="agent.claude")
    assert main(["check", str(app / "app.yaml"), "--json"]) == 0
    assert "stale_evidence" not in json.loads(capsys.readouterr().out)
    changed = dict(SCHEMA, properties={**SCHEMA["properties"], "summary": {"type": "string", "maxLength": 60}})  # type: ignore[dict-item]
    (app / "schemas" / "triage.json").write_text(json.dumps(changed))
    assert main(["check", str(app / "app.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stale_evidence"] == {"triage": {"": ["the schema changed"]}}
    assert main(["check", str(app / "app.yaml")]) == 0
    assert "evidence is stale" in capsys.readouterr().err
    agent, why = run_selected(load_config(app / "app.yaml"), app / "run.jsonl")
    assert agent == "agent.claude" and why["passed"] is False and "the schema changed" in why["reason"]


def test_evidence_of_another_gate_or_not_a_report_is_a_load_error(app: Path) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare)
    report = json.loads((app / "evals/reports/triage/latest.json").read_text())
    (app / "other.json").write_text(json.dumps({**report, "gate": "route"}))
    (app / "plain.json").write_text("{}")
    for file, words in (("other.json", "route"), ("plain.json", "not an eval report")):
        (app / "app.yaml").write_text(CONFIG + f"    selection: {{policy: cheapest-passing, evidence: {file}}}\n")
        with pytest.raises(ConfigError) as caught:
            load_config(app / "app.yaml")
        assert [p.key for p in caught.value.problems] == ["gates.triage.selection.evidence"]
        assert words in caught.value.problems[0].message


# --------------------------------------------------------------------------- trace → cases / cassette


def test_trace_cases_and_cassette_round_trip(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(app / "app.yaml")
    recorded = app / "recorded.jsonl"
    with Runtime(config, trace=recorded) as runtime:
        runtime.register_inprocess("agent.claude", claude)
        first = [runtime.run_gate("triage", {"ticket": t}, agent="agent.claude") for t, _, _ in TICKETS.values()]
    # trace → cases: unlabelled, enum and number fields equal, free text any valid
    assert main(["trace", "cases", str(recorded), "--gate", "triage", "-o", str(app / "cases.jsonl")]) == 0
    cases = load_cases(app / "cases.jsonl")
    assert len(cases) == 6 and not any(c.labelled for c in cases)
    assert cases[0].expect.fields["queue"].kind == "equals" and cases[0].expect.fields["summary"].kind == "any_valid"
    # trace → cassette → replay: the same submissions; the episodes name the recorded calls
    assert main(["trace", "cassette", str(recorded), "--agent", "agent.claude", "-o", str(app / "c1.yaml")]) == 0
    doc = yaml.safe_load((app / "c1.yaml").read_text())
    assert [e["id"] for e in doc["episodes"]] == [r.call_id for r in first]
    assert doc["episodes"][0]["agent"]["meta"]["cost_usd"] == 0.01

    def replay(cassette: Path, trace: Path) -> list[Any]:
        from localllm.agents.cassette import CassetteAgent

        with Runtime(config, trace=trace) as runtime:
            runtime.register_agent("agent.claude", CassetteAgent(cassette, alias="agent.claude"))
            return [runtime.run_gate("triage", {"ticket": t}, agent="agent.claude") for t, _, _ in TICKETS.values()]

    second = replay(app / "c1.yaml", app / "replay1.jsonl")
    assert [r.submission for r in second] == [r.submission for r in first]
    assert [r.call_id for r in second] == [derive_call_id("evalapp", f"{r.call_id}:0") for r in first]
    # a replayed run turned into a cassette replays to the very same call_ids and submissions
    assert main(["trace", "cassette", str(app / "replay1.jsonl"), "-o", str(app / "c2.yaml")]) == 0
    third = replay(app / "c2.yaml", app / "replay2.jsonl")
    assert [(r.call_id, r.submission) for r in third] == [(r.call_id, r.submission) for r in second]
    assert (
        evaluate(
            config,
            "triage",
            agents=["agent.claude"],
            cassettes={"agent.claude": app / "c1.yaml"},
            cases_path=app / "cases.jsonl",
        ).report["agents"]["agent.claude"]["accuracy"]
        == 1.0
    )


def test_trace_output_to_a_fifo_or_a_link_writes_through_never_replacing_the_node(app: Path) -> None:
    # -o /dev/stdout (a link to a pipe or tty) was renamed over: as root that replaced the
    # system's /dev/stdout with a regular file; a FIFO here stands for it, safely
    import os
    import stat
    import threading

    config = load_config(app / "app.yaml")
    recorded = app / "recorded.jsonl"
    with Runtime(config, trace=recorded) as runtime:
        runtime.register_inprocess("agent.claude", claude)
        runtime.run_gate("triage", {"ticket": TICKETS["t1"][0]}, agent="agent.claude")
    fifo = app / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["trace", "cases", str(recorded), "--gate", "triage", "-o", str(fifo)]) == 0
    reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and len(got[0].splitlines()) == 1
    real = app / "real.jsonl"
    real.write_text("old\n")
    (app / "link.jsonl").symlink_to(real)
    assert main(["trace", "cases", str(recorded), "--gate", "triage", "-o", str(app / "link.jsonl")]) == 0
    assert (app / "link.jsonl").is_symlink() and len(real.read_text().splitlines()) == 1


def _claude_cassette(app: Path) -> Path:
    """Every ticket asked of agent.claude, recorded, and the trace turned into ``app/c.yaml``."""
    with Runtime(load_config(app / "app.yaml"), trace=app / "rec.jsonl") as runtime:
        runtime.register_inprocess("agent.claude", claude)
        for ticket, _, _ in TICKETS.values():
            runtime.run_gate("triage", {"ticket": ticket}, agent="agent.claude")
    assert main(["trace", "cassette", str(app / "rec.jsonl"), "-o", str(app / "c.yaml")]) == 0
    return app / "c.yaml"


def test_cli_eval_writes_reports_under_the_current_directory_not_the_config(
    app: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    _claude_cassette(app)
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)
    argv = ["eval", "triage", "-c", str(app / "app.yaml"), "--agents", "agent.claude"]
    assert main([*argv, "--cassette", f"agent.claude={app / 'c.yaml'}", "--json"]) == 0
    assert (elsewhere / "evals" / "reports" / "triage" / "latest.json").is_file()
    assert not (app / "evals" / "reports").exists()  # the config's (tracked) reports are untouched


def test_cli_eval_prints_the_table_and_fails_under_the_bar(
    app: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(app)
    config = load_config(app / "app.yaml")
    with Runtime(config, trace=app / "rec.jsonl") as runtime:
        runtime.register_inprocess("agent.small", small)
        runtime.register_inprocess("agent.claude", claude)
        for ticket, _, _ in TICKETS.values():
            runtime.run_gate("triage", {"ticket": ticket}, agent="agent.claude")
            with contextlib.suppress(AgentError):  # the refund answer is outside the schema: an error
                runtime.run_gate("triage", {"ticket": ticket}, agent="agent.small")
    for alias in ("agent.small", "agent.claude"):
        assert (
            main(["trace", "cassette", str(app / "rec.jsonl"), "--agent", alias, "-o", str(app / f"{alias}.yaml")]) == 0
        )
    argv = [
        "eval",
        "triage",
        "-c",
        str(app / "app.yaml"),
        "--agents",
        "agent.small,agent.claude",
        "--cassette",
        f"agent.small={app / 'agent.small.yaml'}",
        "--cassette",
        f"agent.claude={app / 'agent.claude.yaml'}",
    ]
    capsys.readouterr()
    assert main([*argv, "--fail-under", "0.9"]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[2].split()[:3] == ["AGENT", "CALLS", "ACCURACY"]
    assert lines[3].split()[:3] == ["agent.small", "6", "50.0%"]  # 2 crash tickets wrong, 1 replayed error
    assert lines[4].split()[:3] == ["agent.claude", "6", "100.0%"]
    assert "below --fail-under" in captured.err
    assert main([*argv, "--fail-under", "0.4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agents"]["agent.small"]["errors"] == {"schema_invalid": 1}
    assert main(["eval", "triage", "-c", str(app / "app.yaml"), "--repeat", "0"]) == 2


def test_evaluate_names_one_string_given_for_its_agents(app: Path) -> None:
    # before: each character an alias, 'agent "a" is not declared'
    with pytest.raises(TypeError, match=r"pass \['agent.local'\]"):
        evaluate(load_config(app / "app.yaml"), "triage", agents="agent.local", prepare=prepare)


@pytest.mark.parametrize(("flag", "value"), [("--repeat", "101"), ("--repeat", "99999999999"), ("--workers", "257")])
def test_cli_eval_bounds_repeat_and_workers(
    app: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    # before: --repeat 99999999999 built every (case, repeat) job first, 300 MB/s until killed
    assert main(["eval", "triage", "-c", str(app / "app.yaml"), flag, value]) == 2
    assert f"{flag} {value} is out of range" in capsys.readouterr().err
    key = flag.removeprefix("--")
    kwargs: dict[str, Any] = {key: int(value)}
    with pytest.raises(CallError) as info:
        evaluate(load_config(app / "app.yaml"), "triage", prepare=prepare, **kwargs)
    assert info.value.key == key


def test_cli_eval_says_which_lines_repeat_a_case(
    app: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(app)
    _claude_cassette(app)
    lines = (app / "evals" / "triage" / "cases.jsonl").read_text().splitlines()
    repeated = app / "repeated.jsonl"
    repeated.write_text("\n".join([*lines, lines[4].replace('"t5"', '"t5-again"')]) + "\n")
    argv = ["eval", "triage", "-c", str(app / "app.yaml"), "--agents", "agent.claude", "--cases", str(repeated)]
    capsys.readouterr()
    assert main([*argv, "--cassette", f"agent.claude={app / 'c.yaml'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gate triage: 6 cases x 1 repeat(s)")
    assert out[1].startswith("1 of the file's cases repeat") and out[1].split("line ")[-1].startswith("7)")
    assert main([*argv, "--cassette", f"agent.claude={app / 'c.yaml'}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["cases"], doc["duplicate_cases"], doc["duplicate_lines"]) == (6, 1, [7])
    assert doc["agents"]["agent.claude"]["calls"] == 6


def test_a_failed_call_names_its_call_id_and_an_explicit_agent_bypasses_selection(app: Path) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare)
    config = with_selection(app)
    trace = app / "run.jsonl"
    with Runtime(config, trace=trace) as runtime:
        runtime.register_inprocess("agent.small", small)  # no fallback: the refund answer fails
        with pytest.raises(AgentError) as caught:
            runtime.run_gate("triage", {"ticket": TICKETS["t1"][0]}, agent="agent.small")
        runtime.register_inprocess("agent.local", truth)
        chosen = runtime.run_gate("triage", {"ticket": TICKETS["t3"][0]})
    errors = [ev for ev in read_trace(trace).events if ev.kind == "agent.call.error"]
    assert [ev.call_id for ev in errors] == [caught.value.call_id] and caught.value.call_id is not None
    assert chosen.agent == "agent.local" and chosen.meta["selected_by"]["passed"] is True
    complete = [ev for ev in read_trace(trace).events if ev.kind == "agent.call.complete"]
    assert "selected_by" in complete[0].payload["meta"]


def test_staleness_names_a_changed_server_build_and_model(app: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.selection import REPORT_KIND, fingerprint, staleness

    first, second = app / "server-a", app / "server-b"
    first.write_bytes(b"build a")
    second.write_bytes(b"build b")
    (app / "tiny.gguf").write_bytes(b"GGUF one")
    text = CONFIG.replace(
        "  agent.claude: {plugin: builtin.inprocess}\n",
        "  agent.claude: {plugin: builtin.inprocess}\n  agent.gem: {plugin: builtin.local_llm, model: tiny.gguf}\n",
    )
    (app / "app.yaml").write_text(text)
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(first))
    config = load_config(app / "app.yaml")
    gate = config.gates["triage"]
    report: dict[str, Any] = {
        "kind": REPORT_KIND,
        "gate": "triage",
        "fingerprint": fingerprint(config, gate, ["agent.gem"]),
    }
    assert report["fingerprint"]["agents"]["agent.gem"]["model_sha256"] is not None
    assert staleness(config, gate, report) == {"": [], "agent.gem": []}
    # evidence from a localllm that measured confidence another way (before the version was kept)
    older = {**report, "fingerprint": {k: v for k, v in report["fingerprint"].items() if k != "measures"}}
    assert len(staleness(config, gate, older)[""]) == 1
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(second))
    assert staleness(config, gate, report) == {"": [], "agent.gem": ["the llama-server build changed"]}
    (app / "tiny.gguf").write_bytes(b"GGUF two, longer")
    assert staleness(config, gate, report)["agent.gem"] == ["the model changed", "the llama-server build changed"]
    (app / "app.yaml").write_text(text.replace("model: tiny.gguf}", "model: tiny.gguf, max_tokens: 7}"))
    assert "its declaration changed" in staleness(load_config(app / "app.yaml"), gate, report)["agent.gem"]


def test_trace_cassette_of_claude_keeps_the_fallback_answers(app: Path) -> None:
    from localllm.eval.fromtrace import cassette_from_calls, recorded_calls

    result = evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.small"], prepare=prepare)
    doc = cassette_from_calls(recorded_calls(result.trace), agent="agent.claude")
    assert [e["match"]["ticket"] for e in doc["episodes"]] == [TICKETS["t1"][0]]  # the refund fell back
    assert json.loads(doc["episodes"][0]["agent"]["response"])["queue"] == "billing"
    assert "handler" not in doc["episodes"][0]["match"]  # so it also answers the next fallback
    small_only = cassette_from_calls(recorded_calls(result.trace), agent="agent.small")
    assert len(small_only["episodes"]) == 5


def test_a_recorded_error_replays_with_its_prefix_once(app: Path) -> None:
    from localllm.eval.fromtrace import cassette_from_calls, recorded_calls

    def broken(_: Any) -> Any:
        raise RuntimeError("disk on fire")

    with Runtime(load_config(app / "app.yaml"), trace=app / "rec.jsonl") as runtime:
        runtime.register_inprocess("agent.claude", broken)
        with pytest.raises(AgentError) as live:
            runtime.run_gate("triage", {"ticket": "x"}, agent="agent.claude")
    (episode,) = cassette_from_calls(recorded_calls(app / "rec.jsonl"))["episodes"]
    # the reference's form: error is the detail string; error_kind (ignored by it) the kind
    assert (episode["agent"]["error"], episode["agent"]["error_kind"]) == (live.value.detail, "plugin_crash")


def test_the_progress_bar_is_drawn_only_on_a_tty(
    app: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.chdir(app)
    _claude_cassette(app)
    argv = [
        "eval",
        "triage",
        "-c",
        str(app / "app.yaml"),
        "--agents",
        "agent.claude",
        "--cassette",
        f"agent.claude={app / 'c.yaml'}",
        "--repeat",
        "2",
    ]
    capsys.readouterr()
    assert main(argv) == 0
    assert "/12 [" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    assert "0/12 [" in capsys.readouterr().err  # the bar knows the total: cases x repeat x agents


def test_an_unwritable_reports_directory_is_a_clear_error(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (app / "blocked").write_text("a file, not a directory")
    # --out naming a file is the command line's mistake (exit 2), found before any call
    assert main(["eval", "triage", "-c", str(app / "app.yaml"), "--out", str(app / "blocked"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "usage_error" and "blocked" in doc["detail"]
    assert not list(app.glob("evals/reports/*"))


def test_a_key_added_to_a_plugin_type_later_at_its_default_keeps_fingerprints_valid() -> None:
    import dataclasses

    from localllm.config import LocalLLMDecl
    from localllm.selection import _decl_data, canonical_sha256

    @dataclasses.dataclass(frozen=True)
    class Later(LocalLLMDecl):
        newkey: int = 3

    now = LocalLLMDecl(alias="agent.gem", plugin="builtin.local_llm", model="gemma-3-270m", max_tokens=96)
    later = Later(**{f.name: getattr(now, f.name) for f in dataclasses.fields(now)})
    assert canonical_sha256(_decl_data(later)) == canonical_sha256(_decl_data(now))
    changed = dataclasses.replace(later, newkey=4)
    assert canonical_sha256(_decl_data(changed)) != canonical_sha256(_decl_data(now))


@pytest.mark.parametrize(
    "edit",
    [
        {"cost_usd": 5},  # a number where a {mean, …} mapping belongs: AttributeError before
        {"latency_ms": "x"},
        {"accuracy": 10**400},  # OverflowError before
    ],
    ids=["cost", "latency", "accuracy"],
)
def test_hand_edited_evidence_of_odd_types_selects_without_crashing(app: Path, edit: dict[str, Any]) -> None:
    evaluate(load_config(app / "app.yaml"), "triage", agents=["agent.local"], prepare=prepare)
    latest = app / "evals/reports/triage/latest.json"
    report = json.loads(latest.read_text())
    report["agents"]["agent.local"].update(edit)
    latest.write_text(json.dumps(report))
    config = with_selection(app, min_accuracy=0.9, fallback_profile="agent.claude")
    agent, why = run_selected(config, app / "run.jsonl")
    passed = "accuracy" not in edit  # an accuracy past the float range is no accuracy
    assert (agent, why["passed"]) == (("agent.local", True) if passed else ("agent.claude", False))
