"""Answers no well-behaved server or plugin gives: a redirect from an endpoint, JSON nested
deeper than Python's decoder goes (from an endpoint, an MCP tool, the claude CLI). Each was a
traceback or a misleading error before.

The redirect matters beyond wording: localllm never follows one (the bearer key would go with
it), and now says so instead of "unusable response (JSONDecodeError)".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.embed.local import LocalEmbedder
from localllm.embed.registry import ModelInfo
from localllm.errors import AgentError, EmbedServerError
from localllm.loading import load_config
from localllm.runtime import Runtime
from tests.unit.test_structured_output import Fake

#: (status, body, headers) for one request
Reply = tuple[int, bytes, dict[str, str]]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
DEEP = b"[" * 100_000


def chat(content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()


@pytest.fixture
def serve() -> Iterator[Callable[[Reply], Fake]]:
    """A loopback endpoint answering every POST with one reply; ``bodies`` counts what reached it."""
    started: list[Fake] = []

    def start(reply: Reply) -> Fake:
        started.append(Fake(lambda _body: reply))
        return started[-1]

    yield start
    for server in started:
        server.close()


def ask(tmp_path: Path, url: str) -> AgentError:
    # a key, so that following the redirect would hand it to the other host
    text = (
        "agent_plugins:\n"
        f"  agent.ep: {{plugin: builtin.local_llm, endpoint: '{url}', model: m, fallback: none,"
        " api_key_env: HOSTILE_KEY, response_format: json_object}\n"
    )
    (tmp_path / "app.yaml").write_text(text, encoding="utf-8")
    with Runtime(load_config(tmp_path / "app.yaml")) as rt, pytest.raises(AgentError) as caught:
        rt.call("extract", agent="agent.ep", prompt="hi", schema=SCHEMA)
    return caught.value


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTILE_KEY", "sk-secret")


def test_a_redirect_is_not_followed_and_says_where_it_points(serve: Any, tmp_path: Path) -> None:
    elsewhere = serve((200, chat('{"answer": "stolen"}'), {}))
    endpoint = serve((302, b"", {"Location": elsewhere.url + "/v1/chat/completions"}))
    error = ask(tmp_path, endpoint.url)
    assert error.kind.value == "transport_error"
    assert f"HTTP 302 from {endpoint.url}/v1/chat/completions redirects to {elsewhere.url}" in error.detail
    assert "endpoint:" in error.hint
    assert elsewhere.bodies == []  # the key never went there


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ((200, chat(DEEP.decode()), {}), "schema_invalid"),  # the model's answer: the fallback's to answer
        ((200, DEEP, {}), "transport_error"),  # the reply itself
        ((500, DEEP, {}), "transport_error"),  # an error reply
    ],
)
def test_json_nested_deeper_than_the_decoder_is_an_agent_error(
    serve: Any, tmp_path: Path, reply: Reply, kind: str
) -> None:
    error = ask(tmp_path, serve(reply).url)  # was RecursionError: "a bug in localllm"
    assert error.kind.value == kind


@pytest.mark.parametrize(
    "reply",
    [(307, b"", {"location": "http://elsewhere.test/v1/embeddings"}), (200, DEEP, {})],
)
def test_an_embedding_endpoint_that_redirects_or_nests_too_deep_is_an_embed_error(reply: Reply) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        status, body, headers = reply
        return httpx.Response(status, headers=headers, content=body)

    info = ModelInfo(id="t", dims=8, context=64, max_input_tokens=64, query_prefix="", document_prefix="")
    embedder = LocalEmbedder("http://embed.test", "t", model_info=info, transport=httpx.MockTransport(handler))
    with pytest.raises(EmbedServerError) as caught:
        embedder.embed(["x"], "document")
    if reply[0] == 307:
        assert "redirects to http://elsewhere.test/v1/embeddings" in str(caught.value)


def test_an_mcp_tool_text_nested_too_deep_is_its_text_submission() -> None:
    from localllm.agents._mcp import answer_from_tool_result

    text = DEEP.decode()
    answer = answer_from_tool_result({"content": [{"type": "text", "text": text}]}, alias="agent.m", tool="t")
    assert answer.submission == text  # validated later: schema_invalid, not a RecursionError here


def test_a_claude_cli_line_nested_too_deep_is_no_event() -> None:
    from localllm.agents import claude_cli

    assert claude_cli._event(DEEP.decode()) is None
    assert claude_cli._parses(DEEP.decode()) is False


# -- files: a schema, the user's pins, evidence, cases, a registry, nested as deep -----------------
def _deep_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(DEEP)
    return path


@pytest.mark.parametrize("reader", ["schema", "user pins", "evidence", "cases", "registry"])
def test_files_nested_deeper_than_the_decoder_are_the_readers_own_errors(tmp_path: Path, reader: str) -> None:
    from localllm.embed.registry import _read as read_registry
    from localllm.errors import ConfigError, EmbedError, FetchError, SchemaError
    from localllm.eval.cases import load_cases
    from localllm.managed.pins import _user_models
    from localllm.schema import read_schema_file
    from localllm.selection import EvidenceError, read_evidence

    # each was a RecursionError: "this is a bug in localllm" from `grammar check`, `models`, …
    readers: dict[str, tuple[Callable[[Path], Any], type[Exception]]] = {
        "schema": (read_schema_file, SchemaError),
        "user pins": (lambda p: _user_models(p, {}), FetchError),
        "evidence": (read_evidence, EvidenceError),
        "cases": (load_cases, ConfigError),
        "registry": (read_registry, EmbedError),
    }
    read, error = readers[reader]
    with pytest.raises(error):
        read(_deep_file(tmp_path, "deep.json"))


def test_a_deep_submission_stays_text_on_the_wire_and_in_the_service() -> None:
    from localllm.service.chat import Invalid, finish, prepare
    from localllm.wire import AskResponse

    text = DEEP.decode()
    assert AskResponse(submission=text).to_json()["submission"] == text
    schema = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {"type": "array"}}}
    asked = {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": schema}
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}]}
    with pytest.raises(Invalid):  # a 502, not the service's internal-error 500
        finish(prepare(asked, "m"), answer)
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": text}}]},
        {"role": "tool", "tool_call_id": "1", "content": "ok"},
    ]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert prepare({"model": "m", "messages": history, "tools": [tool]}, "m").body["messages"]


def _answer(content: str, **extra: Any) -> bytes:
    message = {"role": "assistant", "content": content}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
    if "logprobs" in extra:
        choice["logprobs"] = extra.pop("logprobs")
    return json.dumps({"choices": [choice], **extra}).encode()


DECIDE = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
YES = '{"answer": "yes"}'


@pytest.mark.parametrize(
    "body",
    [
        _answer(YES, logprobs={"content": [{"token": YES, "logprob": 1000.0, "top_logprobs": []}]}),  # OverflowError
        _answer(YES, logprobs={"content": [{"token": YES, "logprob": -0.1, "top_logprobs": 5}]}),  # TypeError
        _answer(YES, usage="n/a"),  # AttributeError
    ],
    ids=["logprob-1000", "top-logprobs-int", "usage-string"],
)
def test_odd_reply_fields_of_a_valid_answer_are_ignored_not_a_crash(serve: Any, tmp_path: Path, body: bytes) -> None:
    url = serve((200, body, {})).url
    (tmp_path / "app.yaml").write_text(
        f"agent_plugins:\n  agent.ep: {{plugin: builtin.local_llm, endpoint: '{url}', model: m, fallback: none}}\n"
    )
    with Runtime(load_config(tmp_path / "app.yaml")) as rt:
        result = rt.call("decide", agent="agent.ep", prompt="hi", schema=DECIDE)  # before: plugin_crash
    assert result.submission == {"answer": "yes"}
