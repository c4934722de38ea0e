"""``POST /v1/responses`` and ``/v1/messages`` through the service, against fake llama-server
processes: each is the chat route underneath (its grammar, its validation, its headers), its
answers, streams and every error in its own API's shape."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from localllm.service import messages
from tests.unit.test_service import Factory, client, env, make_service
from tests.unit.test_service_front import SCHEMA, _behave, upstream_chats

__all__ = ["env", "make_service"]  # fixtures used here

TEXT_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
OUTPUT_CONFIG = {"format": {"type": "json_schema", "schema": SCHEMA}}


# -- chat answers and streams as llama-server sends them, shared by the two routes' unit tests --
#: an assistant message with two calls, as the chat route answers it
TWO_CALLS: dict[str, Any] = {
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
    ],
}


def chat_reply(message: dict[str, Any], reason: str = "stop", **choice: Any) -> dict[str, Any]:
    """A chat answer (7 prompt tokens, 3 completion tokens) of one choice holding ``message``."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": reason, **choice}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }


def chat_chunks(*deltas: dict[str, Any], reason: str = "stop") -> bytes:
    """A chat stream as llama-server sends it: a role delta, the deltas, the finish, the usage, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}
    ]
    events += [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    events.append({**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(deltas)}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


#: reasoning, then text, cut by max_tokens: what the live-stream tests feed in pieces
THINK_THEN_TEXT = chat_chunks(
    {"reasoning_content": "Think"},
    {"reasoning_content": "ing."},
    {"content": "Hel"},
    {"content": "lo"},
    reason="length",
)


#: a Messages request to the fake chat model (with max_tokens as the tests need)
HI = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_both_routes_compile_the_schema_and_answer_in_their_shape(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        response = http.post(
            "/v1/responses", json={"model": "chat", "instructions": "Be brief.", "input": "hi", "text": TEXT_FORMAT}
        )
        message = http.post(
            "/v1/messages",
            json={
                **HI,
                "max_tokens": 64,
                "output_config": OUTPUT_CONFIG,
            },
        )
    for reply in (response, message):
        assert reply.status_code == 200, reply.text
        assert (reply.headers["x-localllm-structured"], reply.headers["x-localllm-validated"]) == ("compiled", "true")
    value = json.loads(response.json()["output"][0]["content"][0]["text"])
    assert set(value) == {"city", "days"} and response.json()["object"] == "response"
    assert set(json.loads(message.json()["content"][0]["text"])) == {"city", "days"}
    assert message.json()["type"] == "message" and message.json()["stop_reason"] == "end_turn"
    sent = upstream_chats(env)
    assert [m["role"] for m in sent[0]["messages"]] == ["system", "user"] and sent[0]["grammar"].startswith("root ::=")
    assert sent[1]["max_tokens"] == 64 and "response_format" not in sent[1] and "grammar" in sent[1]


def test_both_routes_stream_their_own_events(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        response = http.post(
            "/v1/responses", json={"model": "chat", "input": "hi", "text": TEXT_FORMAT, "stream": True}
        )
        body = {**HI, "max_tokens": 64, "stream": True}
        message = http.post("/v1/messages", json={**body, "output_config": OUTPUT_CONFIG})
    assert response.headers["content-type"].startswith("text/event-stream")
    kinds = [e["type"] for e in _events(response.text)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e["delta"] for e in _events(response.text) if e["type"] == "response.output_text.delta")
    assert set(json.loads(deltas)) == {"city", "days"}
    read = _events(message.text)
    assert [e["type"] for e in read] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(json.loads(read[2]["delta"]["text"])) == {"city", "days"}


def test_messages_errors_are_anthropic_shaped_from_every_layer(
    make_service: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the canary's answer, then llama-server's own 400 (relayed as bytes), then a good one
    _behave(tmp_path, monkeypatch, {}, {"status": 400, "message": "the prompt is too long"}, {"content": "hello"})
    service = make_service()
    ask = {**HI, "max_tokens": 16}
    with client(service, token=None) as stranger:
        unauthorized = stranger.post("/v1/messages", json=ask)
    with client(service) as http:
        relayed = http.post("/v1/messages", json=ask)
        keyed = http.post("/v1/messages", json=ask, headers={"Authorization": "", "x-api-key": service.token or ""})
        refused = http.post(
            "/v1/messages", json={**ask, "messages": [{"role": "user", "content": [{"type": "image"}]}]}
        )
        missing = http.post("/v1/messages", json={**ask, "model": "nope"})
        openai_shaped = http.post("/v1/responses", json={"model": "chat", "input": "hi", "previous_response_id": "r"})
    assert unauthorized.status_code == 401
    assert unauthorized.json() == {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": "missing or wrong bearer token",
            "code": "invalid_api_key",
        },
    }
    assert relayed.status_code == 400 and relayed.json()["type"] == "error"
    assert "too long" in relayed.json()["error"]["message"]
    assert keyed.status_code == 200 and keyed.json()["content"] == [{"type": "text", "text": "hello"}]
    assert refused.json()["error"]["param"] == "messages[0].content[0]"
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert openai_shaped.status_code == 400
    assert openai_shaped.json()["error"]["param"] == "previous_response_id"


def test_a_strict_answer_that_fails_is_a_502_the_sdks_do_not_retry(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"city": "Paris"}')  # the model ignores the grammar
    service = make_service()
    with client(service) as http:
        response = http.post("/v1/responses", json={"model": "chat", "input": "hi", "text": TEXT_FORMAT})
        message = http.post(
            "/v1/messages",
            json={
                **HI,
                "max_tokens": 16,
                "output_config": OUTPUT_CONFIG,
            },
        )
    for reply in (response, message):
        assert reply.status_code == 502 and reply.headers["x-should-retry"] == "false"
    assert response.json()["error"]["code"] == "structured_output_invalid"
    assert (
        message.json()["error"]["type"] == "api_error"
        and message.json()["error"]["code"] == "structured_output_invalid"
    )


def test_routes_count_in_metrics_and_take_only_post(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        http.post("/v1/responses", json={"model": "chat", "input": "hi"})
        http.post("/v1/messages", json={**HI, "max_tokens": 8})
        put = http.put("/v1/messages")
        metrics = http.get("/metrics").text
    assert put.status_code == 405 and put.headers["allow"] == "POST"
    assert put.json()["type"] == "error"  # the Messages route's errors are Anthropic's, a 405 too
    assert 'path="/v1/responses",status="200"' in metrics and 'path="/v1/messages",status="200"' in metrics


def test_a_large_body_is_turned_into_chat_off_the_event_loop(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body past 1 MiB is read as chat on a worker thread, as a chat body is read: 16 MiB of
    tool_use input numbers took 0.5 s to turn into chat, every other client waiting."""
    threads: list[str] = []
    real = messages.to_chat

    def spy(data: dict[str, Any]) -> Any:
        threads.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(messages, "to_chat", spy)
    service = make_service()
    used = {"type": "tool_use", "id": "t", "name": "f", "input": {"x": [2] * 600_000}}
    turns = [{"role": "assistant", "content": [used]}, {"role": "user", "content": "hi"}]
    with client(service) as http:
        small = http.post("/v1/messages", json={"model": "chat", "max_tokens": 8, "messages": turns[1:]})
        large = http.post("/v1/messages", json={"model": "chat", "max_tokens": 8, "messages": turns})
    assert small.status_code == 200 and large.status_code in (200, 400), large.text
    assert threads[0] != threads[1] and threads[1].startswith("localllm-prepare")


def test_text_streams_live_and_an_error_before_it_is_in_the_routes_shape(
    make_service: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the canary's answer, llama-server's 400 for the first stream, then answers
    _behave(tmp_path, monkeypatch, {}, {"status": 400, "message": "the prompt is too long"}, {"content": "hello there"})
    service = make_service()
    ask = {**HI, "max_tokens": 16, "stream": True}
    with client(service) as http:
        refused = http.post("/v1/messages", json=ask)
        message = http.post("/v1/messages", json=ask)
        response = http.post("/v1/responses", json={"model": "chat", "input": "hi", "stream": True})
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert message.headers["x-localllm-validated"] == "false"  # streamed as it came: nothing to validate
    read = _events(message.text)
    texts = [e["delta"]["text"] for e in read if e["type"] == "content_block_delta"]
    assert "".join(texts) == "hello there" and read[-1]["type"] == "message_stop"
    assert read[-2]["usage"]["output_tokens"] > 0
    kinds = [e["type"] for e in _events(response.text)]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    deltas = [e["delta"] for e in _events(response.text) if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "hello there"
