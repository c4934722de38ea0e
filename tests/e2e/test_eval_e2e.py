"""`localllm eval` end to end: two real gemma agents (grammar-constrained and free decoding)
and a cassette-backed claude on the demo's triage gate; the report is recounted from the trace,
then `selection:` routes on the evidence it wrote."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from localllm.cli import main
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo"
CASES = 8  # the first cases of the demo's hand-labelled set: enough to measure, quick on 2 cores

CONFIG = """\
app_id: eval-e2e
agent_plugins:
  agent.local:
    plugin: builtin.local_llm
    model: gemma-3-270m
    grammar: true
    parallel: 2
    ctx_size: 1024
    max_tokens: 96
    timeout: 120
  agent.free:
    plugin: builtin.local_llm
    model: gemma-3-270m
    grammar: false
    parallel: 2
    ctx_size: 1024
    max_tokens: 96
    timeout: 120
  agent.claude: {plugin: builtin.claude_cli}
gates:
  triage:
    invoke: host.agent.decide
    agent: agent.local
    with:
      prompt: prompts/triage.md
      schema: schemas/triage.json
      args:
        ticket: "{{ args.ticket }}"
"""


def nearest_rank(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


def test_eval_two_local_agents_and_a_cassette_claude(
    tmp_path: Path, managed_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `localllm eval` writes evals/reports under the current directory
    shutil.copytree(DEMO / "prompts", tmp_path / "prompts")
    shutil.copytree(DEMO / "schemas", tmp_path / "schemas")
    lines = (DEMO / "evals" / "triage" / "cases.jsonl").read_text().splitlines()[:CASES]
    cases = [json.loads(line) for line in lines]
    (tmp_path / "cases.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "app.yaml").write_text(CONFIG)
    # claude's answers, as a CI run replays them: one episode per ticket (here: the labels)
    episodes = [
        {
            "id": f"claude-{c['id']}",
            "match": {"schema_name": "triage", "ticket": c["args"]["ticket"]},
            "replay": "any",
            "agent": {
                "verb": "decide",
                "response": {
                    "queue": c["expect"]["queue"],
                    "priority": c["expect"]["priority"]["number"],
                    "summary": "reference answer",
                },
                "meta": {"cost_usd": 0.002, "usage": {"input_tokens": 120, "output_tokens": 20}},
            },
        }
        for c in cases
    ]
    (tmp_path / "claude.yaml").write_text(yaml.safe_dump({"kind": "host_cassette", "episodes": episodes}))

    code = main(
        [
            "eval",
            "triage",
            "-c",
            str(tmp_path / "app.yaml"),
            "--agents",
            "agent.local,agent.free,agent.claude",
            "--cases",
            str(tmp_path / "cases.jsonl"),
            "--cassette",
            f"agent.claude={tmp_path / 'claude.yaml'}",
            "--json",
        ]
    )
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["fingerprint"]["agents"]["agent.local"]["model_sha256"].startswith("a5fd3b62")
    assert report["fingerprint"]["agents"]["agent.local"]["server_build"]["binary_sha256"]
    trace_path = tmp_path / report["trace"]
    assert main(["trace", "verify", str(trace_path)]) == 0

    # recount every number from the trace events
    full = json.loads((tmp_path / "evals" / "reports" / "triage" / "latest.json").read_text())
    case_of = {row["call_id"]: row["case"] for row in full["calls"]}
    expect = {c["id"]: c["expect"] for c in cases}
    events = read_trace(trace_path).events
    starts = {ev.call_id: ev for ev in events if ev.kind == "agent.call.start"}
    tally: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.kind not in ("agent.call.complete", "agent.call.error"):
            continue
        row = tally.setdefault(
            starts[ev.call_id].payload["agent"],
            {
                "calls": 0,
                "correct": 0,
                "fallbacks": 0,
                "errors": Counter(),
                "ms": [],
                "completion": 0,
                "queue": Counter(),
            },
        )
        row["calls"] += 1
        row["ms"].append(ev.payload["duration_ms"])
        row["fallbacks"] += "substitution" in ev.payload
        if ev.kind == "agent.call.error":
            row["errors"][ev.payload["kind"]] += 1
            continue
        meta = ev.payload["meta"]
        row["completion"] += meta.get("completion_tokens") or meta.get("usage", {}).get("output_tokens", 0)
        want, got = (
            expect[case_of[ev.call_id]],
            ev.payload["response"]["submission"],
        )  # the reference's {submission, meta}
        row["queue"][(want["queue"], got["queue"])] += 1
        row["correct"] += (
            got["queue"] == want["queue"]
            and abs(got["priority"] - want["priority"]["number"]) <= want["priority"]["tolerance"]
        )
    assert set(tally) == {"agent.local", "agent.free", "agent.claude"}
    for alias, mine in tally.items():
        row = report["agents"][alias]
        assert row["calls"] == mine["calls"] == CASES
        assert row["correct"] == mine["correct"]
        assert row["fallbacks"] == mine["fallbacks"]
        assert row["errors"] == dict(mine["errors"])
        assert row["latency_ms"]["p50"] == nearest_rank(mine["ms"], 50)
        assert row["latency_ms"]["p95"] == nearest_rank(mine["ms"], 95)
        assert row["tokens"]["completion"] == mine["completion"]
        confusion = Counter(
            {
                (want, got): n
                for want, table in row["confusion"]["queue"].items()
                for got, n in table.items()
                if got != "<error>"
            }
        )
        assert confusion == mine["queue"]
    assert report["agents"]["agent.claude"]["accuracy"] == 1.0
    assert report["agents"]["agent.claude"]["cost_usd"]["total"] == pytest.approx(0.002 * CASES)
    assert report["agents"]["agent.local"]["schema_valid_first_try"] == 1.0  # grammar-constrained
    assert report["agents"]["agent.local"]["workers"] == 2
    assert (tmp_path / "evals" / "reports" / "triage" / "latest.html").read_text().count("<circle") == 3

    for alias, row in report["agents"].items():  # shown with -s, and on failure
        print(
            f"{alias}: accuracy {row['accuracy']} first-try {row['first_try_accuracy']} "
            f"valid-1st {row['schema_valid_first_try']} fallback {row['fallback_rate']} errors {row['errors']} "
            f"p50 {row['latency_ms']['p50']} p95 {row['latency_ms']['p95']} confusion {row['confusion']}"
        )

    # selection on this evidence: a local agent only when it passes both bars, else claude (the cassette)
    text = CONFIG + (
        "    selection: {policy: cheapest-passing, evidence: evals/reports/triage/latest.json, "
        "min_accuracy: 0.9, max_fallback_rate: 0.1, fallback_profile: agent.claude}\n"
    )
    (tmp_path / "app.yaml").write_text(text)
    config = load_config(tmp_path / "app.yaml")
    passing = [
        a
        for a in ("agent.local", "agent.free")
        if report["agents"][a]["accuracy"] >= 0.9 and report["agents"][a]["fallback_rate"] <= 0.1
    ]
    with Runtime(config, trace=tmp_path / "selected.jsonl") as runtime:
        from localllm.agents.cassette import CassetteAgent

        runtime.register_agent("agent.claude", CassetteAgent(tmp_path / "claude.yaml", alias="agent.claude"))
        result = runtime.run_gate("triage", {"ticket": cases[0]["args"]["ticket"]})
    [start] = [ev for ev in read_trace(tmp_path / "selected.jsonl").events if ev.kind == "agent.call.start"]
    chosen = result.meta["selected_by"]
    cheapest = min(passing, key=lambda a: (report["agents"][a]["latency_ms"]["p50"], a)) if passing else None
    assert start.payload["agent"] == chosen["agent"] == (cheapest or "agent.claude")
    assert set(chosen["refused"]) == {"agent.local", "agent.free"} - set(passing)
