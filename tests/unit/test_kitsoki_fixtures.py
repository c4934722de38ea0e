"""Held against the reference engine's own published material (tests/unit/fixtures/kitsoki,
copied as data; origin and licence in its README): its trace-corruption catalogue, the
traces of its Go tests and traces its writer wrote, its call_id vectors and its cassettes.

The ``reference_*`` values in the fixtures were recorded by running Kitsoki's own
``internal/store`` JSONL reader/writer (built with Go, outside this repository); no Go runs
here.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from localllm import Runtime, load_config
from localllm.agents import cassette as cassette_module
from localllm.agents.cassette import CassetteAgent, load_cassette
from localllm.errors import AgentError, ConfigError, ErrorKind, TraceCorrupted
from localllm.trace import TraceWriter, derive_call_id, parse_trace, read_trace
from localllm.trace.event import canonical_ts, dumps
from localllm.wire import AskRequest
from tests.conftest import in_child

FIXTURES = Path(__file__).parent / "fixtures" / "kitsoki"
CASSETTES = FIXTURES / "cassettes"
TRACES = FIXTURES / "traces"
CATALOGUE = json.loads((FIXTURES / "corruption_catalogue.json").read_text(encoding="utf-8"))

# ----------------------------------------------------------------------------- traces


@pytest.mark.parametrize("case", CATALOGUE, ids=[c["name"] for c in CATALOGUE])
def test_corruption_catalogue_is_judged_as_the_reference_judges_it(case: dict[str, Any]) -> None:
    data = case["content"].encode("utf-8")
    reference_ok = case["reference_verdict"] == "ok"
    assert reference_ok == case["must_succeed"]
    try:
        parse_trace(data)
    except TraceCorrupted as exc:
        assert not reference_ok, f"refused what the reference opens: {exc}"
        # the spec's message for the rule the reference names (the BOM's text the spec leaves open)
        if case["name"] != "bom_at_start":
            assert case["want_err"] in str(exc)
    else:
        assert reference_ok, f"accepted what the reference refuses: {case['reference_verdict']}"


def test_the_catalogue_covers_the_cross_turn_case() -> None:
    (case,) = [c for c in CATALOGUE if c["name"] == "out_of_order_cross_turn"]
    assert "cross-turn ordering violation" in case["reference_verdict"]
    with pytest.raises(TraceCorrupted, match="cross-turn ordering violation"):
        parse_trace(case["content"].encode())
    # the documented lenient mode reads it (traces from earlier localllm versions)
    assert len(parse_trace(case["content"].encode(), lenient=True).events) == 3


def test_trace_verify_is_strict_and_lenient_on_request(tmp_path: Path) -> None:
    from localllm.cli import main

    (case,) = [c for c in CATALOGUE if c["name"] == "out_of_order_cross_turn"]
    (tmp_path / "t.jsonl").write_text(case["content"])
    assert main(["trace", "verify", str(tmp_path / "t.jsonl")]) == 1
    assert main(["trace", "verify", "--lenient", str(tmp_path / "t.jsonl")]) == 0


def test_call_id_vectors_match_the_reference() -> None:
    vectors = json.loads((FIXTURES / "call_id_vectors.json").read_text())
    assert len(vectors) == 18
    for vector in vectors:
        assert derive_call_id(vector["app_id"], vector["key"]) == vector["call_id"]


VALID = sorted(p.name for p in TRACES.glob("*.jsonl") if ".reference-rewrite" not in p.name)


def _rewrite(src: Path, dst: Path) -> bytes:
    """localllm's read → rewrite: every event re-encoded (append_event), header as Go writes it."""
    trace = read_trace(src)
    header = json.loads(trace.header_line)
    header["written_at"] = canonical_ts(header["written_at"])
    with TraceWriter.open(dst, header=dumps(header).encode()) as writer:
        for event in trace.events:
            writer.append_event(event)
    return dst.read_bytes()


@pytest.mark.parametrize("name", VALID)
def test_valid_traces_read_and_rewrite_as_the_reference_does(name: str, tmp_path: Path) -> None:
    src = TRACES / name
    reference = TRACES / name.replace(".jsonl", ".reference-rewrite.jsonl")
    expected = (reference if reference.exists() else src).read_bytes()  # Kitsoki's read → rewrite
    assert _rewrite(src, tmp_path / "rewrite.jsonl") == expected
    # the raw copy keeps every byte
    trace = read_trace(src)
    with TraceWriter.open(tmp_path / "copy.jsonl", header=trace.header_line) as writer:
        for raw in trace.raw_lines:
            writer.append_raw(raw)
    assert (tmp_path / "copy.jsonl").read_bytes() == src.read_bytes()


def test_a_localllm_trace_with_calls_spanning_turns_is_what_the_reference_accepts() -> None:
    # written by localllm (concurrent calls outliving their turns, a fallback, sub-events,
    # background work); the reference's reader opened it and rewrote it byte for byte
    trace = read_trace(TRACES / "localllm_concurrent.jsonl")
    late = [e for e in trace.events if e.parent_turn is not None]
    assert late and all(e.parent_turn is not None and e.parent_turn < e.turn for e in late)
    turns = [e.turn for e in trace.events]
    assert turns == sorted(turns)
    starts = {str(e.call_id) for e in trace.events if e.kind == "agent.call.start"}
    ends = [str(e.call_id) for e in trace.events if e.kind in ("agent.call.complete", "agent.call.error")]
    assert sorted(starts) == sorted(ends)


def test_go_written_trace_holds_the_encoding_corners() -> None:
    raw = (TRACES / "go_written.jsonl").read_bytes()
    for needle in (
        b"\\u003c",
        b"\\u0026",
        b"\\u2028",
        b"1e-7",
        b"2.5e+21",
        b"100000000000000000000",
        b"-0,",
        b'"match_idx":2',
    ):
        assert needle in raw
    events = read_trace(TRACES / "go_written.jsonl").events
    assert events[5].match_idx == 0  # omitted beside its episode_id: reads back as 0


# ----------------------------------------------------------------------------- cassettes

ALL_CASSETTES = sorted(p.name for p in CASSETTES.glob("*.yaml"))


def test_all_nine_reference_cassettes_with_agent_episodes_load() -> None:
    assert len(ALL_CASSETTES) == 9
    for name in ALL_CASSETTES:
        cassette = load_cassette(CASSETTES / name)
        assert cassette.app_id and cassette.episodes, name


def request(verb: str, *, with_: dict[str, Any] | None = None, state_path: str = "s", call_id: str = "c") -> AskRequest:
    return AskRequest(
        session_id="s",
        turn=1,
        state_path=state_path,
        verb=verb,
        prompt="p",
        call_id=call_id,
        deadline="2999-01-01T00:00:00Z",
        schema=None,
        world={},
        with_=with_ or {},
    )


def meta_of(meta: dict[str, Any] | None) -> dict[str, Any]:
    assert meta is not None
    return meta


def test_local_llm_decide_cassette_replays_byte_for_byte() -> None:
    agent = CassetteAgent(CASSETTES / "local_llm_decide.cassette.yaml", alias="agent.local")
    decide = agent.ask(request("decide"), deadline=1e12)
    assert (
        decide.submission
        == '{"verdict":"pass","intent":"accept","reason":"the change is correct and tested","confidence":0.88}'
    )
    extract = agent.ask(request("extract"), deadline=1e12)
    assert extract.submission == '{"ticket":"CLOUD-42","priority":"high"}'
    assert agent.unplayed() == []
    # the recorded metadata, replayed into meta as the reference does
    assert meta_of(decide.meta)["model"] == "qwen2.5-1.5b"
    assert meta_of(decide.meta)["usage"] == {"input_tokens": 120, "output_tokens": 24}
    assert meta_of(decide.meta)["call_id"] == derive_call_id("local_llm_conformance", "decide_verdict:0")


def test_conformance_cassettes_replay_the_echo_submission_byte_for_byte() -> None:
    reference = '{"echo_prompt_head":"which is the best option for this context?","echo_verb":"decide"}'
    for name in ("conformance.yaml", "conformance_dispatch.yaml"):
        agent = CassetteAgent(CASSETTES / name, alias="agent.echo")
        answer = agent.ask(request("decide"), deadline=1e12)
        assert answer.submission == reference
        assert (meta_of(answer.meta)["transport"], meta_of(answer.meta)["match_idx"]) == ("cassette", 0)


def test_replay_any_gives_distinct_call_ids_sharing_the_episode() -> None:
    agent = CassetteAgent(CASSETTES / "conformance_replay_any.yaml", alias="agent.conform")
    metas = [meta_of(agent.ask(request("ask"), deadline=1e12).meta) for _ in range(4)]
    assert [m["match_idx"] for m in metas] == [0, 1, 2, 3]
    assert {m["episode_id"] for m in metas} == {"any_ep"}
    assert [m["call_id"] for m in metas] == [derive_call_id("conform_app", f"any_ep:{i}") for i in range(4)]


def test_plain_text_responses_replay_as_json_strings() -> None:
    agent = CassetteAgent(CASSETTES / "agent_probe_who_are_you.cassette.yaml", alias="host.agent.ask")
    answers = [agent.ask(request("ask"), deadline=1e12) for _ in range(3)]
    assert [json.loads(a.submission or "") for a in answers] == [
        "I am Claude (Anthropic), reachable.",
        "I am GLM-5.1, served via synthetic.new, reachable.",
        "I am Codex (GPT-5, OpenAI), reachable.",
    ]
    assert meta_of(answers[0].meta)["duration_ms"] == 720


def test_reference_transcripts_replay_verbatim() -> None:
    cassette = load_cassette(CASSETTES / "bugfix_demo.cassette.yaml")
    with_transcript = [e for e in cassette.episodes if e.transcript is not None]
    assert with_transcript
    transcript = with_transcript[0].transcript
    assert transcript is not None and transcript.format == "claude-stream-json"
    assert transcript.lines[-1].startswith('{"type":"result","subtype":"success"')
    assert len(transcript.offsets_ms) == len(transcript.lines)


def test_a_cassette_of_another_app_is_refused_when_registered(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text("app_id: my-app\nagent_plugins:\n  agent.local: {plugin: builtin.inprocess}\n")
    config = load_config(tmp_path / "app.yaml")
    with Runtime(config) as rt, pytest.raises(ConfigError) as info:
        rt.register_agent("agent.local", CassetteAgent(CASSETTES / "local_llm_decide.cassette.yaml"))
    (problem,) = info.value.problems
    assert problem.key == "app_id" and "local_llm_conformance" in problem.message


def test_the_local_llm_cassette_replays_through_the_runtime_into_a_trace(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        "app_id: local_llm_conformance\nagent_plugins:\n  agent.local: {plugin: builtin.inprocess}\n"
    )
    (tmp_path / "judge_verdict.json").write_text((FIXTURES / "schemas" / "judge_verdict.json").read_text())
    config = load_config(tmp_path / "app.yaml")
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        rt.register_agent("agent.local", CassetteAgent(CASSETTES / "local_llm_decide.cassette.yaml"))
        result = rt.call("decide", agent="agent.local", prompt="judge", schema="judge_verdict.json")
    assert result.call_id == derive_call_id("local_llm_conformance", "decide_verdict:0")
    start, done = read_trace(trace).events
    assert start.payload["input"] == {"schema_present": True, "schema_path": "judge_verdict.json", "args": {}}
    raw = (trace.read_bytes().split(b"\n"))[2]
    # the submission's bytes in the trace are the cassette's, byte for byte
    assert (
        b'"submission":{"verdict":"pass","intent":"accept","reason":"the change is correct and tested","confidence":0.88}'
        in raw
    )
    assert done.payload["response"]["meta"]["model"] == "qwen2.5-1.5b"


def test_match_on_verb_phase_and_schema_base_name(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "kind: host_cassette\napp_id: a\nphase_from: '^review\\.(\\w+)'\nepisodes:\n"
        "  - {id: e1, match: {verb: decide, phase: judge, schema_name: verdict.json}, agent: {verb: decide, response: '{\"a\":1}'}}\n"
        "  - {id: e2, match: {verb: decide, schema_name: verdict}, agent: {verb: decide, response: '{\"a\":2}'}}\n"
    )
    agent = CassetteAgent(path, alias="agent.x")
    given = {"schema": "schemas/verdict.json"}
    first = agent.ask(request("decide", with_=given, state_path="review.judge.x"), deadline=1e12)
    assert first.episode_id == "e1"
    second = agent.ask(request("decide", with_=given, state_path="review.judge.x"), deadline=1e12)
    assert second.episode_id == "e2"  # localllm's stem form matches too
    with pytest.raises(AgentError) as miss:
        agent.ask(request("extract", with_=given), deadline=1e12)
    assert miss.value.kind is ErrorKind.TRANSPORT_ERROR


def test_include_is_resolved_relative_to_the_cassette(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "answer.json").write_text('{\n  "z": 1, "a": "<b>"\n}\n')
    (tmp_path / "inc" / "prompt.txt").write_text("line one\nline two\n")
    path = tmp_path / "c.yaml"
    path.write_text(
        "kind: host_cassette\napp_id: a\nepisodes:\n  - id: e1\n    match: {handler: agent.x}\n    agent:\n"
        "      verb: decide\n      prompt: !include inc/prompt.txt\n      response: !include inc/answer.json\n"
    )
    (episode,) = load_cassette(path).episodes
    assert episode.response is not None and json.loads(episode.response) == {"a": "<b>", "z": 1}
    for bad, fragment in (("/etc/passwd", "absolute"), ("../outside.json", "outside")):
        (tmp_path / "outside.json").write_text("{}")
        path.write_text(
            f"kind: host_cassette\napp_id: a\nepisodes:\n  - id: e1\n    match: {{}}\n    agent:\n      response: !include {bad}\n"
        )
        with pytest.raises(ConfigError, match=fragment):
            load_cassette(path)


def test_hostile_includes_are_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "deep.json").write_text("[" * 980 + "]" * 980)  # json decodes it; a walk over it cannot
    # deeper than a trace holds, shallow enough for any walk: before, a "YAML syntax error"
    # at a column of the line the include was pasted into (3.13 gave that for deep.json too)
    (tmp_path / "mid.json").write_text("[" * 150 + "]" * 150)
    (tmp_path / "page.txt").write_text("x" * 300_000)
    (tmp_path / "nan.json").write_text('{"verdict": NaN}')  # json.loads reads it; no JSON reader does
    monkeypatch.setattr(cassette_module, "DATA_LIMIT", 1 << 20)
    head = "kind: host_cassette\napp_id: a\nepisodes:\n  - id: e1\n    match: {}\n    agent:\n"
    for body, fragment in (
        ("      response: !include deep.json\n", "!include 'deep.json': the JSON nests too deeply"),
        ("      response: !include mid.json\n", "!include 'mid.json': the JSON nests too deeply"),
        # before: the encoder's "Out of range float values are not JSON compliant", naming no file
        ("      response: !include nan.json\n", "!include 'nan.json': parse JSON: NaN is not a JSON number"),
        # one file included again and again: the whole is bounded as one cassette is
        ("".join(f"      k{i}: !include page.txt\n" for i in range(5)) + "      response: '1'\n", "grows past 1 MiB"),
    ):
        (tmp_path / "c.yaml").write_text(head + body)
        raised: list[BaseException] = []
        # in a thread of its own: a fresh stack, so how deep the JSON may go does not depend
        # on how deep pytest's own stack is here
        worker = threading.Thread(target=_raised, args=(raised, load_cassette, tmp_path / "c.yaml"))
        worker.start()
        worker.join()
        assert [type(e) for e in raised] == [ConfigError], raised
        problems = raised[0].problems  # type: ignore[attr-defined]
        assert [(p.key, fragment in p.message) for p in problems] == [("", True)], problems


def _phases(path: Path, phase_from: str, state_paths: list[str]) -> Any:
    """The phase a cassette with ``phase_from`` gives each state path, in a child with a deadline."""
    path.write_text(
        f"kind: host_cassette\nphase_from: '{phase_from}'\nepisodes:\n"
        "  - {id: e1, match: {handler: agent.x, phase: aaa}, agent: {verb: ask, response: '{}'}}\n"
    )
    return in_child(
        f"""
        import json
        from localllm.agents.cassette import CassetteAgent
        agent = CassetteAgent({str(path)!r}, alias="agent.x")
        print(json.dumps([agent._phase(p) for p in {state_paths!r}]))
        """
    )


def test_phase_from_is_matched_without_backtracking(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    # with re alone, a 26-character near miss took 4 s, doubling per character
    phases = _phases(path, "^((a+)+)$", ["a" * 40 + "!", "aaa", "a" * 5000])
    assert phases == ["", "aaa", "a" * 5000]
    # a construct Go's regexp (the reference's) has not either: refused when the cassette loads
    path.write_text(path.read_text().replace("^((a+)+)$", "^(a)\\1$"))
    with pytest.raises(ConfigError) as info:
        load_cassette(path)
    assert [p.key for p in info.value.problems] == ["phase_from"]


def test_phase_from_s_group_is_found_without_backtracking(tmp_path: Path) -> None:
    # the path matches, but only by the second alternative: re first backtracks through
    # (?:a+)+b about 2**len(path) times (30 characters: 30 s, 40: hours); "c" matches without the group
    phases = _phases(tmp_path / "c.yaml", "^(?:(?:a+)+b|(a+)|c)$", ["a" * 40, "aaa", "c", "b"])
    assert phases == ["a" * 40, "aaa", "", ""]


def _raised(into: list[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # the test inspects whatever it was
        into.append(exc)


def test_reference_errors_record_mode_and_delays(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "kind: host_cassette\napp_id: a\nrecord_mode: new_episodes\nmatch_on: [handler]\nepisodes:\n"
        "  - {id: e1, match: {handler: agent.x}, delay: 10ms, agent: {verb: ask, error: 'tool exploded'}}\n"
        "  - {id: e2, match: {handler: agent.x}, agent: {verb: ask, response: '{}'}, response: {infra_error: 'net down'}}\n"
    )
    cassette = load_cassette(path)
    assert (cassette.record_mode, cassette.match_on, cassette.episodes[0].delay) == ("new_episodes", ("handler",), 0.01)
    agent = CassetteAgent(path, alias="agent.x")
    kinds = []
    for _ in range(2):
        with pytest.raises(AgentError) as info:
            agent.ask(request("ask"), deadline=1e12)
        kinds.append((info.value.kind, info.value.detail))
    assert kinds == [(ErrorKind.PLUGIN_CRASH, "tool exploded"), (ErrorKind.TRANSPORT_ERROR, "net down")]
    path.write_text(
        "kind: host_cassette\napp_id: a\nrecord_mode: all\nepisodes:\n  - {id: e, match: {}, agent: {response: '{}'}}\n"
    )
    with pytest.raises(ConfigError) as bad:
        load_cassette(path)
    assert [p.key for p in bad.value.problems] == ["record_mode"]


def test_floats_are_written_as_go_writes_them() -> None:
    # 3,013 floats (random bit patterns, every magnitude, the 1e-6 / 1e21 edges, -0, the
    # extremes), each with the text Go's encoding/json wrote for it
    vectors = json.loads((FIXTURES / "go_floats.json").read_text())
    assert len(vectors) > 3000
    values = [float.fromhex(v["hex"]) for v in vectors]
    assert dumps(values) == "[" + ",".join(v["go"] for v in vectors) + "]"
    # and read back to the very same floats
    assert [float(x) for x in json.loads(dumps(values))] == values


def test_each_float_alone_is_written_as_go_writes_it() -> None:
    # dumps skips its float pass when the text holds no literal Go writes differently: every
    # vector alone, at the top level, in a list, before and after other fields, inside a
    # payload beside a timestamp, must still come out as Go wrote it
    vectors = json.loads((FIXTURES / "go_floats.json").read_text())
    for v in vectors:
        value, go = float.fromhex(v["hex"]), v["go"]
        assert dumps(value) == go, v
        assert dumps([value]) == f"[{go}]", v
        assert dumps({"x": value, "y": 1}) == f'{{"x":{go},"y":1}}', v
        line = {"turn": 1, "seq": 0, "ts": "2026-12-02T01:59:27.0123Z", "payload": {"s": "v1.0", "f": value}}
        assert dumps(line).endswith(f'"payload":{{"s":"v1.0","f":{go}}}}}'), v


def test_the_readme_cassette_example_loads_and_replays(tmp_path: Path) -> None:
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Cassettes: the format and how to record one", 1)[1]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example is not None
    (tmp_path / "c.yaml").write_text(example.group(1))
    (episode,) = load_cassette(tmp_path / "c.yaml").episodes
    assert episode.delay == 0.5 and episode.replay_any
    agent = CassetteAgent(tmp_path / "c.yaml", alias="agent.local")
    asked = request("decide", with_={"schema": "schemas/triage.json", "args": {"ticket": "charged twice"}})
    answer = agent.ask(asked, deadline=1e12)
    assert json.loads(answer.submission or "")["queue"] == "billing"
    assert meta_of(answer.meta)["usage"] == {"input_tokens": 183, "output_tokens": 24}


LOADER_CASES = json.loads((FIXTURES / "loader_cases.json").read_text())
#: where localllm's config deliberately differs from the reference loader: claude_cli takes
#: no env:/headers: (the CLI runs with the process environment), and a managed model is a
#: pinned id (qwen2.5-1.5b-instruct), not a free name
LOADER_DIFFERENCES = {
    "TestAgentPlugins_EnvVarSubstitution",
    "TestAgentPlugins_UnsetEnvVar",
    "TestAgentPlugins_HeadersSubstitution",
    "TestAgentPlugins_EnvVarWithLiteralDollarInValue",
    "TestAgentPlugins_LocalLLMModelAccepted",
}


def test_reference_loader_cases_agree_but_for_the_stated_differences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(LOADER_CASES) == 15
    differ = set()
    for case in LOADER_CASES:
        with monkeypatch.context() as env:
            for key, value in case["env"].items():
                env.setenv(key, value)
            (tmp_path / "app.yaml").write_text("app_id: test-agent-plugins\n" + case["yaml"])
            try:
                load_config(tmp_path / "app.yaml")
                error = None
            except ConfigError as exc:
                error = str(exc)
        agrees = (error is not None) == case["expect_error"] and all(w in (error or "") for w in case["contains"])
        if not agrees:
            differ.add(case["name"])
    assert differ == LOADER_DIFFERENCES  # 10 of 15 agree


def test_trace_cassette_writes_the_reference_format_and_replays_the_transcript(tmp_path: Path) -> None:
    import yaml

    from localllm.cli import main
    from localllm.wire import AskResponse, Transcript

    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "verdict.json").write_text('{"type":"object","required":["verdict"]}')
    (tmp_path / "app.yaml").write_text(
        "app_id: rec-app\nagent_plugins:\n  agent.local: {plugin: builtin.inprocess}\n"
        "gates:\n  judge:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with: {prompt: 'Judge {{ args.ticket }}', schema: schemas/verdict.json, args: {ticket: '{{ args.ticket }}'}}\n"
    )
    config = load_config(tmp_path / "app.yaml")
    lines = ['{"type":"request","n":1.50}', '{"type":"result","result":"<ok>"}']

    def answer(_: AskRequest) -> AskResponse:
        return AskResponse(
            submission='{"verdict":"yes"}',
            meta={"model": "gemma-3-270m", "prompt_tokens": 50, "completion_tokens": 7},
            transcript=Transcript("openai-chat", lines, [0, 12]),
        )

    with Runtime(config, trace=tmp_path / "live.jsonl") as rt:
        rt.register_inprocess("agent.local", answer)
        live = rt.run_gate("judge", {"ticket": "charged twice"})
    out = tmp_path / "rec.cassette.yaml"
    assert (
        main(["trace", "cassette", str(tmp_path / "live.jsonl"), "-c", str(tmp_path / "app.yaml"), "-o", str(out)]) == 0
    )
    doc = yaml.safe_load(out.read_text())
    assert (doc["app_id"], doc["record_mode"]) == ("rec-app", "none")
    (episode,) = doc["episodes"]
    assert episode["match"] == {"verb": "decide", "schema_name": "verdict.json", "ticket": "charged twice"}
    body = episode["agent"]
    assert (body["model"], body["prompt_tokens"], body["response_tokens"]) == ("gemma-3-270m", 50, 7)
    assert body["response"] == '{"verdict":"yes"}'
    assert body["transcript"] == {"format": "openai-chat", "events": lines, "timings": [0, 12]}
    # replayed: the same submission, call_id from the episode, the transcript byte for byte
    replay_dir = tmp_path / "replay"
    replay_dir.mkdir()
    with Runtime(config, trace=replay_dir / "t.jsonl") as rt:
        rt.register_agent("agent.local", CassetteAgent(out))
        again = rt.run_gate("judge", {"ticket": "charged twice"})
    assert again.submission == live.submission
    assert again.call_id == derive_call_id("rec-app", f"{live.call_id}:0")
    (done,) = [e for e in read_trace(replay_dir / "t.jsonl").events if e.kind == "agent.call.complete"]
    sidecar = replay_dir / done.payload["transcript_ref"]["path"]
    assert sidecar.read_text().splitlines() == lines
    assert sidecar.with_suffix(".timings").read_text() == "0 0\n1 12\n"
