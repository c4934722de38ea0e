"""``POST /v1/messages`` as the chat request it means, and the chat answer as a Message
(:mod:`localllm.service.messages`); shapes checked with the ``anthropic`` SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent

from localllm.service import chat
from localllm.service.messages import answer, error, stream, to_chat
from tests.unit.test_service_dialects import THINK_THEN_TEXT, TWO_CALLS, chat_reply

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
UNSAT = {"type": "integer", "minimum": 5, "maximum": 1}  # no value is valid


def test_turns_become_one_chat_conversation() -> None:
    body, where = to_chat(
        {
            "model": "m",
            "max_tokens": 40,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "two calls", "signature": "x"},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Rome"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "content": [{"type": "text", "text": "no"}],
                            "is_error": True,
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            "stop_sequences": ["\n\n"],
            "top_k": 5,
        }
    )
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert body["messages"][0]["content"] == "Be brief.\n\nBe kind."
    calls = body["messages"][2]["tool_calls"]
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("t1", {"city": "Paris"}),
        ("t2", {"city": "Rome"}),
    ]
    assert body["messages"][4] == {"role": "tool", "tool_call_id": "t2", "content": "Error: no"}
    assert body["stop"] == ["\n\n"] and body["top_k"] == 5 and body["max_tokens"] == 40 and "stream" not in body
    assert where == [
        ["system"],
        ["messages[0]"],
        ["messages[1].content[1]", "messages[1].content[2]"],
        ["messages[2].content[0]"],
        ["messages[2].content[1]"],
        ["messages[2]"],
    ]


def test_format_tools_and_choices_map_to_the_chat_fields() -> None:
    body, _ = to_chat(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": ASK,
            "output_config": {"format": {"type": "json_schema", "schema": WEATHER}, "effort": "low"},
            "tools": [TOOL, {**TOOL, "name": "other", "strict": True, "type": "custom"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "thinking": {"type": "disabled"},
            "metadata": {"user_id": "u"},
        }
    )
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": WEATHER, "strict": True},
    }
    assert [t["function"]["strict"] for t in body["tools"]] == [False, True]
    assert body["tools"][0]["function"]["parameters"] == WEATHER
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    named, _ = to_chat(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": ASK,
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather"},
        }
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert named["parallel_tool_calls"] is True


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "a"}] * 2049}, "messages"),
        ({"messages": [{"role": "system", "content": "a"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": []}]}
                ]
            },
            "messages[0].content[0].input",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}],
                    }
                ]
            },
            "messages[0].content[0].content[0]",
        ),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"system": 5}, "system"),
        ({"messages": [{"role": "user", "content": [{"type": ["text"]}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": ["user"], "content": "a"}]}, "messages[0].role"),
        ({"tools": [{"type": ["custom"], "name": "x", "input_schema": {}}]}, "tools[0].type"),
        ({"tools": [TOOL], "tool_choice": {"type": ["any"]}}, "tool_choice"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"tools": [{"name": "x", "input_schema": {"type": "string"}}]}, "tools[0].input_schema"),
        ({"tools": [{"name": "x", "input_schema": {"properties": {}}}]}, "tools[0].input_schema"),
        ({"tools": [TOOL], "tool_choice": {"type": "required"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
        ({"output_config": {"task_budget": 5}}, "output_config.task_budget"),
        ({"mcp_servers": []}, "mcp_servers"),
        ({"container": "c"}, "container"),
        ({"stream": "yes"}, "stream"),
        ({"stop_sequences": "\n"}, "stop_sequences"),
        ({"stop_sequences": [1]}, "stop_sequences"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(given: dict[str, Any], param: str) -> None:
    with pytest.raises(chat.BadRequest) as caught:
        to_chat({"model": "m", "max_tokens": 10, "messages": ASK, **given})
    assert caught.value.param == param


def test_errors_are_anthropic_shaped_and_name_the_fields_sent() -> None:
    body, where = to_chat(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": ASK,
            "tools": [TOOL, {**TOOL, "name": "bad", "input_schema": {**WEATHER, "properties": {"city": UNSAT}}}],
        }
    )
    with pytest.raises(chat.BadRequest) as caught:
        chat.prepare(body, "m")
    shaped = error(caught.value.to_json(), where, 400)
    assert shaped["type"] == "error"
    assert (shaped["error"]["type"], shaped["error"]["param"]) == ("invalid_request_error", "tools[1].input_schema")
    assert shaped["error"]["code"] == "unsatisfiable_schema"
    assert "function" not in shaped["error"]["message"]
    for status, kind in [
        (401, "authentication_error"),
        (404, "not_found_error"),
        (503, "overloaded_error"),
        (502, "api_error"),
    ]:
        assert error({"error": {"message": "x", "type": "t"}}, [], status)["error"]["type"] == kind
    for given, expected in [
        ("response_format.json_schema.schema.x", "output_config.format.schema.x"),
        ("the request's stop strings", "the request's stop strings"),
        ("messages[0].content", "messages[0].content"),
    ]:
        renamed = error({"error": {"message": f"{given} is wrong", "param": given}}, where, 400)["error"]
        assert (renamed["param"], renamed["message"]) == (expected, f"{expected} is wrong")


_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)


def _read(sent: bytes) -> tuple[list[Any], Any]:
    """Server-sent events as the SDK's own event models, and the Message the SDK's own
    accumulator builds of them."""
    lines = [e for e in sent.split(b"\n\n") if e]
    read = [_EVENT.validate_python(json.loads(e.split(b"data: ", 1)[1])) for e in lines]
    assert [e.split(b"\n", 1)[0][7:].decode() for e in lines] == [e.type for e in read]
    built: Any = None
    buffers: dict[int, bytes] = {}
    for event in read:
        built = accumulate_event(event=event, current_snapshot=built, json_bufs=buffers)
    return read, built


@pytest.mark.parametrize(
    ("message", "reason", "kinds", "stop"),
    [
        ({"content": '{"city": "Paris"}'}, "stop", ["text"], "end_turn"),
        ({"content": "Sunny and", "reasoning_content": "think"}, "length", ["thinking", "text"], "max_tokens"),
        (
            TWO_CALLS,
            "tool_calls",
            ["tool_use", "tool_use"],
            "tool_use",
        ),
    ],
)
def test_answers_and_streams_are_what_the_anthropic_sdk_reads(
    message: dict[str, Any], reason: str, kinds: list[str], stop: str
) -> None:
    done = answer({"model": "m", "max_tokens": 3, "messages": ASK}, chat_reply(message, reason))
    parsed = Message.model_validate(done)  # the SDK's own model: every field it requires, typed
    assert [b.type for b in parsed.content] == kinds and parsed.stop_reason == stop
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (7, 3)
    blocks: list[Any] = parsed.content
    uses = [(b.id, b.input) for b in blocks if b.type == "tool_use"]
    assert uses == [(c["id"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]

    read, built = _read(stream({"model": "m", "max_tokens": 3, "messages": ASK}).finish(chat_reply(message, reason)))
    assert built.stop_reason == stop
    assert [b.model_dump(exclude={"parsed_output"}) for b in built.content] == [b.model_dump() for b in parsed.content]
    assert [e.type for e in read[:1] + read[-2:]] == ["message_start", "message_delta", "message_stop"]
    assert read[0].message.content == [] and read[-2].delta.stop_reason == stop
    text = "".join(e.delta.text for e in read if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == (message["content"] or "")
    given = [
        json.loads(e.delta.partial_json)
        for e in read
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert given == [json.loads(c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert [e.content_block.type for e in read if e.type == "content_block_start"] == kinds


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_a_text_stream_is_sent_as_its_deltas_arrive(size: int) -> None:
    live = stream({"model": "m", "max_tokens": 9, "messages": ASK, "stream": True})
    given = THINK_THEN_TEXT
    pieces = [live.feed(given[i : i + size]) for i in range(0, len(given), size)]
    read, built = _read(b"".join(pieces) + live.flush())
    if size == 1:  # the first delta went out before the stream ended
        first = next(i for i, p in enumerate(pieces) if b"text_delta" in p)
        assert first < len(pieces) - 20
    texts = [e.delta.text for e in read if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert texts == ["Hel", "lo"]
    assert [b.type for b in built.content] == ["thinking", "text"]
    assert (built.content[0].thinking, built.content[1].text) == ("Thinking.", "Hello")
    assert built.stop_reason == "max_tokens" and built.usage.output_tokens == 4


def test_an_error_in_the_stream_ends_it_with_an_error_event() -> None:
    live = stream({"model": "m", "max_tokens": 9, "messages": ASK, "stream": True})
    sent = live.feed(
        b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: {"error": {"message": "boom"}}\n\n'
    )
    sent += live.flush()
    kinds = [json.loads(e.split(b"data: ", 1)[1])["type"] for e in sent.split(b"\n\n") if e]
    assert kinds[-1] == "error" and "message_stop" not in kinds
