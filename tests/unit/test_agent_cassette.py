"""Cassette replay: matching, play order, replay: any, errors, delays, malformed files."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.cassette import CassetteAgent, ReplayedAgentError, load_cassette
from localllm.errors import AgentError, ConfigError, ErrorKind
from localllm.wire import AskRequest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cassettes"
JUDGE = FIXTURES / "judge.yaml"


def request(
    handler: str | None = "agent.judge",
    schema_name: str | None = "verdict",
    args: dict[str, Any] | None = None,
    *,
    call_id: str = "0123456789abcdef",
    with_: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
) -> AskRequest:
    if with_ is None:
        with_ = {"handler": handler, "schema_name": schema_name, "args": args or {}}
    return AskRequest(
        session_id="s1",
        turn=1,
        state_path="root",
        verb="decide",
        prompt="judge it",
        call_id=call_id,
        deadline="2030-01-01T00:00:00Z",
        schema=schema,
        with_=with_,
    )


def soon(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


def answer(agent: CassetteAgent, req: AskRequest) -> tuple[Any, dict[str, Any]]:
    resp = agent.ask(req, deadline=soon())
    return json.loads(resp.submission or "null"), dict(resp.meta or {})


# -- matching and order ---------------------------------------------------------------------


def test_first_unplayed_episode_wins_in_file_order() -> None:
    agent = CassetteAgent(JUDGE)
    args = {"repo": "localllm", "pr": 42}
    first, meta1 = answer(agent, request(args=args))
    second, meta2 = answer(agent, request(args=args))
    third, meta3 = answer(agent, request(args=args))
    assert first == {"verdict": "approve", "confidence": 0.9}
    assert second == {"verdict": "reject", "confidence": 0.4}  # YAML mapping → JSON text
    assert third == {"verdict": "approve", "confidence": 1.0}
    assert [m["episode_id"] for m in (meta1, meta2, meta3)] == ["ep-approve", "ep-reject", "ep-pr42"]
    assert meta1 == {"transport": "cassette", "episode_id": "ep-approve", "match_idx": 0}


def test_string_response_is_passed_verbatim() -> None:
    resp = CassetteAgent(JUDGE).ask(request(), deadline=soon())
    assert resp.submission == '{"verdict": "approve", "confidence": 0.9}'


def test_arg_keys_must_all_equal() -> None:
    agent = CassetteAgent(JUDGE)
    answer(agent, request())
    answer(agent, request())
    # Only ep-pr42 is left for agent.judge/verdict, and it needs repo and pr.
    for args in ({}, {"repo": "localllm"}, {"repo": "other", "pr": 42}, {"repo": "localllm", "pr": 43}):
        with pytest.raises(AgentError) as info:
            agent.ask(request(args=args), deadline=soon())
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR
    # CLI --arg values are strings: "42" matches the recorded 42.
    value, meta = answer(agent, request(args={"repo": "localllm", "pr": "42"}))
    assert meta["episode_id"] == "ep-pr42"
    assert value["confidence"] == 1.0


def test_schema_name_and_handler_must_equal() -> None:
    agent = CassetteAgent(JUDGE)
    with pytest.raises(AgentError):
        agent.ask(request(schema_name="other"), deadline=soon())
    with pytest.raises(AgentError):
        agent.ask(request(handler="agent.other"), deadline=soon())
    # Nothing was consumed by the misses.
    assert answer(agent, request())[1]["episode_id"] == "ep-approve"


def test_missing_with_falls_back_to_alias_and_schema_title() -> None:
    agent = CassetteAgent(JUDGE, alias="agent.judge")
    req = request(with_={}, schema={"title": "verdict", "type": "object"})
    assert answer(agent, req)[1]["episode_id"] == "ep-approve"


def test_replay_any_counts_match_idx() -> None:
    agent = CassetteAgent(JUDGE)
    metas = [answer(agent, request(handler="agent.router", schema_name=None))[1] for _ in range(3)]
    assert [m["match_idx"] for m in metas] == [0, 1, 2]
    assert {m["episode_id"] for m in metas} == {"ep-route"}
    assert answer(agent, request(handler="agent.router"))[0] == {"intent": "search"}


def test_continue_session_counts_on_from_the_trace() -> None:
    agent = CassetteAgent(JUDGE)
    assert "ep-crash" in agent.unplayed()
    agent.continue_session({"ep-route": 5, "ep-crash": 1, "not-in-cassette": 9})
    resp = agent.ask(request(handler="agent.router", schema_name=None), deadline=soon())
    assert (resp.episode_id, resp.match_idx) == ("ep-route", 5)
    assert "ep-crash" not in agent.unplayed()  # played in the trace being continued


def test_miss_lists_every_episode_and_what_was_asked() -> None:
    agent = CassetteAgent(JUDGE)
    answer(agent, request())
    with pytest.raises(AgentError) as info:
        agent.ask(request(handler="agent.nobody", args={"x": 1}), deadline=soon())
    detail = info.value.detail
    assert (info.value.kind, info.value.alias) == (ErrorKind.TRANSPORT_ERROR, agent.alias)
    assert "replay: any" in info.value.hint
    assert str(JUDGE) in detail
    assert '"handler": "agent.nobody"' in detail and '"x": 1' in detail
    for episode in ("ep-approve", "ep-reject", "ep-pr42", "ep-route", "ep-crash", "ep-tools"):
        assert episode in detail
    assert 'ep-approve {"handler": "agent.judge", "schema_name": "verdict"} (played)' in detail
    assert "ep-reject" in detail and "(unplayed)" in detail
    assert "ep-route" in detail and "(replay: any)" in detail
    assert "host-shell" not in detail  # host-only episodes are not agent episodes


def test_unplayed_lists_play_once_episodes_left() -> None:
    agent = CassetteAgent(JUDGE)
    answer(agent, request())
    left = agent.unplayed()
    assert "ep-approve" not in left
    assert "ep-reject" in left
    assert "ep-route" not in left  # replay: any is never "left over"


def test_concurrent_calls_play_each_episode_once() -> None:
    path = FIXTURES / "my_app.yaml"
    agent = CassetteAgent(path)
    seen: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(25):
            _, meta = answer(agent, request())
            with lock:
                seen.append(meta["match_idx"])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(seen) == list(range(100))


# -- replayed content -----------------------------------------------------------------------


def test_error_episode_raises_agent_error_with_meta() -> None:
    agent = CassetteAgent(JUDGE)
    with pytest.raises(ReplayedAgentError) as info:
        agent.ask(request(handler="agent.fixer", schema_name=None), deadline=soon())
    assert info.value.kind is ErrorKind.PLUGIN_CRASH
    assert info.value.detail == "fixer exited with code 3"
    assert str(info.value) == "agent: plugin_crash: fixer exited with code 3"
    assert info.value.meta == {"transport": "cassette", "episode_id": "ep-crash", "match_idx": 0}
    assert (info.value.episode_id, info.value.match_idx) == ("ep-crash", 0)
    assert isinstance(info.value, AgentError)


def test_non_json_response_is_replayed_raw() -> None:
    resp = CassetteAgent(JUDGE).ask(request(handler="agent.local"), deadline=soon())
    assert resp.submission == "approve, I think"


def test_meta_sub_events_and_transcript_are_replayed() -> None:
    resp = CassetteAgent(JUDGE).ask(request(handler="agent.tools", call_id="feedfacefeedface"), deadline=soon())
    assert json.loads(resp.submission or "") == {"files_changed": ["main.py"], "result": "fixed"}
    assert resp.meta == {
        "model": "claude-sonnet-4-5",
        "cost_usd": 0.02,
        "transport": "cassette",
        "episode_id": "ep-tools",
        "match_idx": 0,
    }
    assert resp.sub_events == [
        {"kind": "agent.tools.bash", "payload": {"command": "pytest -q"}, "call_id": "feedfacefeedface"}
    ]
    assert resp.transcript is not None
    assert resp.transcript.format == "claude-stream-json"
    assert resp.transcript.lines == ['{"type":"system","subtype":"init"}', '{"type":"result","result":"fixed"}']
    assert resp.transcript.offsets_ms == [0, 850]


# -- delay, deadline, cancel ----------------------------------------------------------------


def test_short_delay_answers() -> None:
    value, meta = answer(CassetteAgent(JUDGE), request(handler="agent.brief"))
    assert value == "on time"
    assert meta["episode_id"] == "ep-brief-delay"


def test_delay_past_deadline_is_deadline_exceeded() -> None:
    agent = CassetteAgent(JUDGE)
    with pytest.raises(AgentError) as info:
        agent.ask(request(handler="agent.slow"), deadline=time.monotonic() + 0.3)
    assert (info.value.kind, info.value.alias) == (ErrorKind.DEADLINE_EXCEEDED, agent.alias)
    # The episode was consumed when chosen.
    assert "ep-slow" not in agent.unplayed()


def test_cancel_cuts_a_delay() -> None:
    agent = CassetteAgent(JUDGE)
    errors: list[AgentError] = []

    def worker() -> None:
        try:
            agent.ask(request(handler="agent.slow", call_id="cafecafecafecafe"), deadline=soon(600))
        except AgentError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    limit = time.monotonic() + 10
    while "ep-slow" in agent.unplayed() and time.monotonic() < limit:
        time.sleep(0.01)
    # The episode is consumed once ask() is under way, and ask() registers for cancel first.
    agent.cancel("cafecafecafecafe")
    thread.join(timeout=10)
    assert not thread.is_alive()
    [error] = errors
    assert (error.kind, error.alias) == (ErrorKind.DEADLINE_EXCEEDED, agent.alias)
    assert error.detail == "episode ep-slow cancelled"


def test_closed_cassette_refuses_calls() -> None:
    agent = CassetteAgent(JUDGE)
    agent.close()
    agent.close()  # idempotent
    with pytest.raises(AgentError) as info:
        agent.ask(request(), deadline=soon())
    assert info.value.kind is ErrorKind.TRANSPORT_ERROR


# -- through the runtime: call_id from episode_id:match_idx --------------------------------


def test_runtime_call_ids_follow_the_reference_vectors(tmp_path: Path) -> None:
    from localllm.loading import load_config
    from localllm.runtime import Runtime

    (tmp_path / "verdict.json").write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"verdict": {"enum": ["approve", "reject"]}},
                "required": ["verdict"],
            }
        )
    )
    config = tmp_path / "app.yaml"
    config.write_text("app_id: my-app\nagent_plugins:\n  agent.judge: {plugin: builtin.inprocess}\n")
    with Runtime(load_config(config)) as runtime:
        runtime.register_agent("agent.judge", CassetteAgent(FIXTURES / "my_app.yaml", alias="agent.judge"))
        first = runtime.call("decide", agent="agent.judge", prompt="judge", schema="verdict.json")
        second = runtime.call("decide", agent="agent.judge", prompt="judge", schema="verdict.json")
    assert first.submission == {"verdict": "approve"}
    assert (first.call_id, second.call_id) == ("594e8ae04f78354e", "edcfdead886d7713")
    assert second.meta["match_idx"] == 1


# -- malformed cassettes --------------------------------------------------------------------

GOOD_EPISODE = """
  - id: ep-01
    match: {handler: agent.x}
    agent: {verb: ask, response: '{}'}
"""

MALFORMED = [
    ("episodes: [\n  - id: a\n", "", "YAML syntax error at line"),
    ("- just\n- a list\n", "", "the top level must be a mapping"),
    ("episodes:" + GOOD_EPISODE, "kind", "missing"),
    ("kind: cassette\nepisodes:" + GOOD_EPISODE, "kind", "'cassette' is not 'host_cassette'"),
    ("kind: host_cassette\n", "episodes", "missing"),
    ("kind: host_cassette\nepisodes: []\n", "episodes", "must be a non-empty list"),
    ("kind: host_cassette\nepisodes: [hello]\n", "episodes[0]", "must be a mapping"),
    (
        "kind: host_cassette\nepisodes:\n  - match: {handler: agent.x}\n    agent: {response: '1'}\n",
        "episodes[0].id",
        "missing",
    ),
    (
        "kind: host_cassette\nepisodes:" + GOOD_EPISODE + GOOD_EPISODE,
        "episodes[1].id",
        'duplicate episode id "ep-01" (also episodes[0])',
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: agent.x\n    agent: {response: '1'}\n",
        "episodes[0].match",
        "not a mapping",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {handler: 3}\n    agent: {response: '1'}\n",
        "episodes[0].match.handler",
        "must be an agent alias string",
    ),
    ("kind: host_cassette\nepisodes:\n  - id: a\n    match: {handler: agent.x}\n", "episodes[0].agent", "missing"),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {verb: ask}\n",
        "episodes[0].agent",
        "needs exactly one of response: or error:",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n"
        "    agent: {response: '1', error: {kind: plugin_crash}}\n",
        "episodes[0].agent",
        "needs exactly one of response: or error:",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {response: null}\n",
        "episodes[0].agent.response",
        "is null",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {verb: shout, response: '1'}\n",
        "episodes[0].agent.verb",
        "unknown verb 'shout'",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {error: {kind: boom}}\n",
        "episodes[0].agent.error.kind",
        "'boom' is not an error kind",
    ),
    (
        # a string error is the reference's form (a plugin_crash); a list is neither form
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {error: [crash]}\n",
        "episodes[0].agent.error",
        "must be a mapping {kind, detail}",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {reply: '1', response: '1'}\n",
        "episodes[0].agent.reply",
        "unknown key",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    replay: always\n    agent: {response: '1'}\n",
        "episodes[0].replay",
        "'always' is not one of once, any",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    delay: -1\n    agent: {response: '1'}\n",
        "episodes[0].delay",
        "-1 is not a number of seconds >= 0",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    reply: any\n    agent: {response: '1'}\n",
        "episodes[0].reply",
        "unknown key",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {response: {when: 2024-01-01}}\n",
        "episodes[0].agent.response",
        "is not representable as JSON",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n"
        "    agent: {response: '1', transcript: {format: x, lines: ['{}'], offsets_ms: [1, 2]}}\n",
        "episodes[0].agent.transcript.offsets_ms",
        "one integer >= 0 per line",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {response: '1', sub_events: [x]}\n",
        "episodes[0].agent.sub_events",
        "must be a list of JSON mappings",
    ),
    (
        "kind: host_cassette\nepisodes:\n  - id: h\n    match: {handler: host.shell}\n    response: {data: {}}\n",
        "episodes",
        "has no agent episodes",
    ),
    # hostile YAML: refused as a config is, never a bare exception or an exploding parse
    (
        "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 7))
        + "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {response: *a6}\n",
        "",
        "nodes (aliases counted at every use)",
    ),
    ("kind: host_cassette\nepisodes: &e [*e]\n", "", "refers to its own anchor"),
    ("kind: host_cassette\nepisodes: " + "[" * 5000 + "]" * 5000 + "\n", "", "nested deeper than"),
    (
        "kind: host_cassette\nepisodes:\n  - id: a\n    match: {}\n    agent: {response: !!timestamp banana}\n",
        "",
        "is not a timestamp",
    ),
    (
        'kind: host_cassette\nepisodes:\n  - id: "\\U00110000"\n    match: {}\n    agent: {response: "1"}\n',
        "",
        "YAML value error",
    ),
]


@pytest.mark.parametrize(("text", "key", "message"), MALFORMED)
def test_malformed_cassette_names_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        CassetteAgent(path)
    problems = info.value.problems
    assert [p.key for p in problems] == [key], problems
    [problem] = problems
    assert problem.file == str(path)
    assert message in problem.message
    assert problem.hint
    assert str(path) in str(info.value)


def test_a_cassette_may_nest_a_response_as_deep_as_a_trace_value_and_share_anchors(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(
        "kind: host_cassette\nepisodes:\n"
        f"  - id: a\n    match: {{}}\n    agent: {{response: &r {'[' * 100}1{']' * 100}}}\n"
        "  - id: b\n    match: {}\n    agent: {response: *r}\n"
    )
    cassette = load_cassette(path)
    assert [json.loads(e.response or "") for e in cassette.episodes] == [json.loads("[" * 100 + "1" + "]" * 100)] * 2


def test_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: host_cassette\nepisode:" + GOOD_EPISODE)
    with pytest.raises(ConfigError) as info:
        load_cassette(path)
    assert [p.key for p in info.value.problems] == ["episode", "episodes"]
    assert info.value.problems[0].message == "unknown key"
    assert "did you mean 'episodes'?" in info.value.problems[0].hint


def test_every_problem_is_listed_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "kind: tape\nepisodes:\n"
        "  - id: a\n    match: {}\n    agent: {error: {kind: nope}}\n"
        "  - id: b\n    match: {}\n    delay: soon\n    agent: {response: '1'}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_cassette(path)
    assert [p.key for p in info.value.problems] == [
        "kind",
        "episodes[0].agent.error.kind",
        "episodes[1].delay",
    ]


def test_missing_cassette_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        CassetteAgent(path)
    assert str(path) in str(info.value)
    assert "cannot read cassette" in str(info.value)


def test_yaml_error_gives_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: host_cassette\nepisodes:\n  - id: a\n  match: [\n")
    with pytest.raises(ConfigError) as info:
        load_cassette(path)
    assert "line 4" in str(info.value) or "line 5" in str(info.value)


def test_sample_cassettes_load() -> None:
    for path in sorted(FIXTURES.glob("*.yaml")):
        cassette = load_cassette(path)
        assert cassette.episodes, path
    judge = load_cassette(JUDGE)
    assert [e.id for e in judge.episodes][:3] == ["ep-approve", "ep-reject", "ep-pr42"]
    assert "host-shell" not in [e.id for e in judge.episodes]
