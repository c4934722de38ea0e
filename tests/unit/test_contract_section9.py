"""agent-plugin-contract §9 knobs, exactly as the contract states them (issue 24.2).

- ``json_schema: true`` sends ``response_format: {type: json_schema, strict: true}``, no probe,
  and wins over ``grammar``;
- ``grammar: true`` with a schema constrains the request (endpoint: response_format
  json_schema), ``meta.grammar`` is a boolean, ``grammar: false`` reads ``false``;
- a validation-rejected local answer: exactly one local request, then the fallback once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace
from localllm.wire import AskRequest
from tests.unit.test_structured_output import DECIDE, Fake, ignores_all, llama_server

ON_LLAMA = pytest.mark.parametrize("fake", [llama_server], indirect=True)


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Any:
    server = Fake(request.param)
    yield server
    server.server.shutdown()
    server.server.server_close()


def _runtime(tmp_path: Path, url: str, extra: str, *, trace: Path | None = None) -> Runtime:
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, endpoint: '{url}', fallback: agent.i{extra}}}\n"
        "  agent.i: {plugin: builtin.inprocess}\n",
        encoding="utf-8",
    )
    return Runtime(load_config(tmp_path / "app.yaml"), trace=trace)


@ON_LLAMA
def test_json_schema_true_sends_strict_json_schema_and_wins_over_grammar(tmp_path: Path, fake: Fake) -> None:
    with _runtime(tmp_path, fake.url, ", json_schema: true, grammar: true") as rt:
        result = rt.call("decide", agent="agent.local", prompt="pick", schema=DECIDE)
    assert fake.probes() == 0 and len(fake.bodies) == 1
    body = fake.bodies[0]
    assert "grammar" not in body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "submission", "strict": True, "schema": DECIDE},
    }
    assert result.meta["json_schema"] is True and result.meta["grammar"] is False


@ON_LLAMA
def test_grammar_true_in_subset_sends_response_format_and_meta_grammar_true(tmp_path: Path, fake: Fake) -> None:
    with _runtime(tmp_path, fake.url, ", grammar: true") as rt:
        result = rt.call("decide", agent="agent.local", prompt="pick", schema=DECIDE)
    assert fake.probes() == 0 and len(fake.bodies) == 1
    assert fake.bodies[0]["response_format"]["type"] == "json_schema"
    assert result.meta["grammar"] is True and isinstance(result.meta["grammar"], bool)
    assert result.meta["json_schema"] is False


@pytest.mark.parametrize("fake", [ignores_all], indirect=True)
def test_grammar_false_sends_nothing_and_meta_grammar_is_false(tmp_path: Path, fake: Fake) -> None:
    with _runtime(tmp_path, fake.url, ", grammar: false") as rt:
        result = rt.call("decide", agent="agent.local", prompt="pick", schema={"type": "object"})
    assert not any(k in fake.bodies[0] for k in ("response_format", "grammar"))
    assert result.meta["grammar"] is False


@pytest.mark.parametrize("fake", [ignores_all], indirect=True)
@pytest.mark.parametrize("extra", ["", ", json_schema: true", ", grammar: false"])
def test_rejected_local_answer_one_local_request_then_the_fallback_once(tmp_path: Path, fake: Fake, extra: str) -> None:
    schema = {**DECIDE, "properties": {"choice": {"type": "string", "enum": ["a"]}}}  # "b" is refused
    asked: list[AskRequest] = []

    def claude(request: AskRequest) -> Any:
        asked.append(request)
        return {"choice": "a"}

    trace = tmp_path / "t.jsonl"
    with _runtime(tmp_path, fake.url, extra, trace=trace) as rt:
        rt.register_inprocess("agent.i", claude)
        result = rt.call("decide", agent="agent.local", prompt="pick", schema=schema)
    assert len(fake.bodies) == 1  # no probe, no same-backend retry
    assert len(asked) == 1 and asked[0].call_id == result.call_id
    assert result.meta["fallback_of"] == "agent.local"
    kinds = [e.kind for e in read_trace(trace).events if e.kind.startswith("agent.call.")]
    assert kinds == ["agent.call.start", "agent.call.complete"]
    assert json.dumps(result.submission) == '{"choice": "a"}'
