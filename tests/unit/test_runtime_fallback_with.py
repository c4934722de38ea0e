"""Runtime honours ``fallback:`` (issue 10 item 6) and sends the gate's ``with:`` block as
written as ``AskRequest.with`` (item 14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.base import Agent
from localllm.errors import AgentError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace
from localllm.wire import AskRequest, AskResponse

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _config(tmp_path: Path, agent_fallback: str = "", gate_fallback: str = "") -> Path:
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "n.json").write_text(json.dumps(SCHEMA))
    cfg = tmp_path / "app.yaml"
    cfg.write_text(
        "agent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9'{agent_fallback}}}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
        "  agent.backup: {plugin: builtin.inprocess}\n"
        "gates:\n"
        "  count:\n"
        "    invoke: host.agent.decide\n"
        "    agent: agent.local\n"
        f"{gate_fallback}"
        "    with:\n"
        "      prompt: 'Count {{ args.what }}'\n"
        "      schema: schemas/n.json\n"
        "      args: {what: '{{ args.thing }}', limit: 3}\n"
    )
    return cfg


def _run(cfg: Path, trace: Path | None = None) -> tuple[list[str], Any]:
    """Run gate ``count`` with a local answer that fails the schema; who answered, and how."""
    asked: list[str] = []

    def answer(alias: str) -> Any:
        def fn(_: AskRequest) -> dict[str, Any]:
            asked.append(alias)
            return {"n": 1}

        return fn

    with Runtime(load_config(cfg), trace=trace) as rt:
        rt.register_inprocess("agent.claude", answer("agent.claude"))
        rt.register_inprocess("agent.backup", answer("agent.backup"))
        local = rt.agent("agent.local")  # a real local_llm agent (a local model), answering off the wire
        local.ask = lambda request, *, deadline: AskResponse(submission='{"n": "many"}')  # type: ignore[method-assign]
        try:
            result: Any = rt.run_gate("count", {"thing": "sheep"})
        except AgentError as exc:
            result = exc
    return asked, result


def test_default_fallback_is_agent_claude(tmp_path: Path) -> None:
    asked, result = _run(_config(tmp_path))
    assert asked == ["agent.claude"] and result.agent == "agent.claude"


def test_agent_fallback_none_raises_the_local_error(tmp_path: Path) -> None:
    asked, result = _run(_config(tmp_path, agent_fallback=", fallback: none"))
    assert asked == []
    assert isinstance(result, AgentError) and (result.kind, result.alias) == (ErrorKind.SCHEMA_INVALID, "agent.local")


def test_agent_fallback_names_another_alias(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    asked, result = _run(_config(tmp_path, agent_fallback=", fallback: agent.backup"), trace)
    assert asked == ["agent.backup"]
    assert (result.agent, result.meta["fallback_of"]) == ("agent.backup", "agent.local")
    done = read_trace(trace).events[-1].payload
    assert done["substitution"]["fallback_plugin"] == "agent.backup"


@pytest.mark.parametrize(
    ("agent_fallback", "gate_fallback", "expected"),
    [
        ("", "    fallback: none\n", []),
        (", fallback: none", "    fallback: agent.backup\n", ["agent.backup"]),
        (", fallback: agent.backup", "    fallback: agent.claude\n", ["agent.claude"]),
    ],
)
def test_gate_fallback_overrides_the_agents(
    tmp_path: Path, agent_fallback: str, gate_fallback: str, expected: list[str]
) -> None:
    asked, _ = _run(_config(tmp_path, agent_fallback, gate_fallback))
    assert asked == expected


def test_ask_request_with_is_the_gates_with_block_as_written(tmp_path: Path) -> None:
    seen: list[AskRequest] = []
    cfg = _config(tmp_path)
    with Runtime(load_config(cfg)) as rt:
        rt.register_agent("agent.local", _Capture(seen))
        rt.run_gate("count", {"thing": "sheep", "extra": 1})
        rt.call("decide", agent="agent.local", prompt="Direct {{ args.x }}", schema="schemas/n.json", args={"x": 2})
        rt.call("decide", agent="agent.local", prompt="Inline", schema=SCHEMA)
    gate, direct, inline = (r.with_ for r in seen)
    assert gate == {
        "prompt": "Count {{ args.what }}",
        "schema": "schemas/n.json",
        "args": {"what": "sheep", "limit": 3, "thing": "sheep", "extra": 1},
    }
    assert direct == {"prompt": "Direct {{ args.x }}", "schema": "schemas/n.json", "args": {"x": 2}}
    assert inline == {"prompt": "Inline", "args": {}}
    assert str(tmp_path) not in json.dumps([gate, direct, inline])  # never a host path


class _Capture(Agent):
    """An agent recording each request and answering ``{"n": 1}``."""

    def __init__(self, seen: list[AskRequest]) -> None:
        super().__init__("agent.local")
        self.seen = seen

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        self.seen.append(request)
        return AskResponse(submission='{"n": 1}')


def test_a_cassette_matches_the_alias_it_is_registered_under_and_the_written_schema(tmp_path: Path) -> None:
    from localllm.agents.cassette import CassetteAgent

    cassette = tmp_path / "c.yaml"
    cassette.write_text(
        "kind: host_cassette\nepisodes:\n"
        "  - id: ep-1\n    match: {handler: agent.local, schema_name: n, what: sheep}\n"
        "    agent: {verb: decide, response: '{\"n\": 3}'}\n"
    )
    with Runtime(load_config(_config(tmp_path))) as rt:
        rt.register_agent("agent.local", CassetteAgent(cassette))  # no alias given: it answers as agent.local
        assert rt.run_gate("count", {"thing": "sheep"}).submission == {"n": 3}
