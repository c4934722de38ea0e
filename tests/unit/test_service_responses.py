"""``POST /v1/responses`` as the chat request it means, and the chat answer as a Response
(:mod:`localllm.service.responses`); shapes checked with the ``openai`` SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from localllm.service import chat
from localllm.service.responses import answer, error, stream, to_chat
from tests.unit.test_service_dialects import THINK_THEN_TEXT, TWO_CALLS, chat_reply

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER}


def test_items_become_one_chat_conversation() -> None:
    body, where = to_chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
                {"role": "developer", "content": "Answer in French."},
            ],
            "max_output_tokens": 40,
            "temperature": 0.2,
        }
    )
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "assistant", "developer"]
    calls = body["messages"][2]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]  # one turn's calls, the reasoning between left out
    assert calls[1]["function"] == {"name": "get_weather", "arguments": '{"city":"Rome"}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Weather in Paris and Rome?"}]
    assert body["max_tokens"] == 40 and body["temperature"] == 0.2 and "stream" not in body
    assert where == [["instructions"], ["input[0]"], ["input[1]", "input[3]"], ["input[4]"], ["input[5]"], ["input[6]"]]


def test_format_tools_and_choices_map_to_the_chat_fields() -> None:
    body, _ = to_chat(
        {
            "model": "m",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}},
            "tools": [TOOL, {**TOOL, "name": "other", "strict": False}],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "other"}],
            },
            "top_logprobs": 2,
            "stream": True,
        }
    )
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": WEATHER, "strict": False},
    }
    assert [t["function"]["name"] for t in body["tools"]] == ["other"] and body["tool_choice"] == "required"
    assert body["tools"][0]["function"]["strict"] is False
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}  # the stream's usage, for its last event
    named, _ = to_chat(
        {"model": "m", "input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}}
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert named["tools"][0]["function"]["strict"] is True  # the Responses API's default
    plain, _ = to_chat({"model": "m", "input": "hi", "text": {"format": {"type": "text"}}, "tools": [], "store": True})
    assert "response_format" not in plain and "tools" not in plain


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"seed": 1}, "seed"),
        ({"input": None}, "input"),
        ({"input": [{"role": "user", "content": "a"}] * 2049}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": ["input_text"]}]}]}, "input[0].content[0]"),
        ({"input": [{"type": {"a": 1}}]}, "input[0].type"),
        ({"tools": [{"type": ["function"]}]}, "tools[0].type"),
        ({"tools": [TOOL], "tool_choice": {"type": ["function"]}}, "tool_choice"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"}]}, "input[0].name"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"tools": [TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice"),
        (
            {
                "tools": [TOOL],
                "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "x"}]},
            },
            "tool_choice.tools",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"formats": {}}}, "text.formats"),
        ({"stream": "yes"}, "stream"),
        ({"instructions": 5}, "instructions"),
        ({"include": "logprobs"}, "include"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(given: dict[str, Any], param: str) -> None:
    with pytest.raises(chat.BadRequest) as caught:
        to_chat({"model": "m", "input": "hi", **given})
    assert caught.value.param == param


def test_a_lone_surrogate_is_named_where_the_client_sent_it() -> None:
    body, where = to_chat(
        {"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "\udcff"}]}
    )
    with pytest.raises(chat.BadRequest) as caught:
        chat.check_text(body, json.dumps(body).encode())
    assert error(caught.value.to_json(), where, 400)["error"]["param"] == "input[1].content"


def test_background_false_and_null_stateful_fields_are_served() -> None:
    body, _ = to_chat({"model": "m", "input": "hi", "background": False, "previous_response_id": None})
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_chat_errors_name_the_fields_the_client_sent() -> None:
    asked = {
        "model": "m",
        "instructions": "x",
        "input": [
            {"role": "user", "content": "a"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        ],
        "tools": [TOOL, {**TOOL, "name": "bad", "parameters": {"type": "integer", "minimum": 5, "maximum": 1}}],
        "max_output_tokens": 10,
    }
    body, where = to_chat(asked)
    with pytest.raises(chat.BadRequest) as caught:
        chat.prepare(body, "m")
    refused = error(caught.value.to_json(), where, 400)["error"]
    assert refused["param"] == "tools[1].parameters" and "function" not in refused["message"]
    for given, expected in [
        ("messages[2].tool_calls[1].function", "input[2].function"),
        ("messages[1].content", "input[0].content"),
        ("messages[0]", "instructions"),
        ("response_format.json_schema.schema.x", "text.format.schema.x"),
        ("max_tokens", "max_output_tokens"),
        ("messages[9]", "messages[9]"),
    ]:
        renamed = error({"error": {"message": f"{given} is wrong", "param": given}}, where, 400)["error"]
        assert (renamed["param"], renamed["message"]) == (expected, f"{expected} is wrong")


_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def _read(sent: bytes) -> list[Any]:
    """Server-sent events as the SDK's own event models, checked for order and numbering,
    and accumulated by the SDK's own stream state (which refuses a response whose id changes)."""
    lines = [e for e in sent.split(b"\n\n") if e]
    assert all(e.startswith(b"event: ") for e in lines)
    read = [_EVENT.validate_python(json.loads(e.split(b"data: ", 1)[1])) for e in lines]
    assert [e.sequence_number for e in read] == list(range(len(read)))
    assert [e.split(b"\n", 1)[0][7:].decode() for e in lines] == [e.type for e in read]
    state: Any = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in read:
        state.handle_event(event)
    return read


@pytest.mark.parametrize(
    ("message", "reason", "kinds"),
    [
        ({"content": '{"city": "Paris"}'}, "stop", ["message"]),
        ({"content": "Sunny and warm", "reasoning_content": "think"}, "length", ["reasoning", "message"]),
        (
            TWO_CALLS,
            "tool_calls",
            ["function_call", "function_call"],
        ),
    ],
)
def test_answers_and_streams_are_what_the_openai_sdk_reads(
    message: dict[str, Any], reason: str, kinds: list[str]
) -> None:
    asked = {"model": "m", "input": "hi", "tools": [TOOL], "max_output_tokens": 3}
    done = answer(asked, chat_reply(message, reason))
    parsed = Response.model_validate(done)  # the SDK's own model: every field it requires, typed
    assert [item.type for item in parsed.output] == kinds
    assert parsed.status == ("incomplete" if reason == "length" else "completed")
    assert parsed.usage is not None and (parsed.usage.input_tokens, parsed.usage.output_tokens) == (7, 3)
    if "message" in kinds:
        assert parsed.output_text == message["content"]
    else:
        calls: list[Any] = parsed.output
        assert [(i.call_id, i.arguments) for i in calls] == [
            (c["id"], c["function"]["arguments"]) for c in message["tool_calls"]
        ]

    read = _read(stream(asked).finish(chat_reply(message, reason)))  # an answer generated whole, streamed
    assert read[0].type == "response.created" and read[-1].type == f"response.{parsed.status}"
    assert read[0].response.status == "in_progress" and read[0].response.incomplete_details is None
    text = "".join(e.delta for e in read if e.type == "response.output_text.delta")
    arguments = [e.delta for e in read if e.type == "response.function_call_arguments.delta"]
    assert text == (message["content"] if "message" in kinds else "")
    assert arguments == [c["function"]["arguments"] for c in message.get("tool_calls", [])]
    assert [e.item.type for e in read if e.type == "response.output_item.done"] == kinds


def test_logprobs_are_carried_into_the_output_text() -> None:
    logprobs = {"content": [{"token": "hi", "logprob": -0.1, "bytes": [104, 105], "top_logprobs": []}]}
    done = answer({"model": "m", "input": "x", "top_logprobs": 0}, chat_reply({"content": "hi"}, logprobs=logprobs))
    item: Any = Response.model_validate(done).output[0]
    assert item.content[0].logprobs[0].token == "hi"


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_a_text_stream_is_sent_as_its_deltas_arrive(size: int) -> None:
    live = stream({"model": "m", "input": "hi", "stream": True})
    given = THINK_THEN_TEXT
    pieces = [live.feed(given[i : i + size]) for i in range(0, len(given), size)]
    sent = b"".join(pieces) + live.flush()
    read = _read(sent)
    if size == 1:  # the first delta went out before the stream ended
        first = next(i for i, p in enumerate(pieces) if b"output_text.delta" in p)
        assert first < len(pieces) - 20
    assert [e.delta for e in read if e.type == "response.output_text.delta"] == ["Hel", "lo"]
    assert [e.delta for e in read if e.type == "response.reasoning_text.delta"] == ["Think", "ing."]
    done = read[-1].response
    assert read[-1].type == "response.incomplete" and done.output_text == "Hello"
    assert [i.type for i in done.output] == ["reasoning", "message"]
    added = [e.item.id for e in read if e.type == "response.output_item.added"]
    assert added == [e.item.id for e in read if e.type == "response.output_item.done"] == [i.id for i in done.output]
    assert done.usage.input_tokens == 5 and read[0].response.id == done.id


def test_an_error_in_the_stream_ends_it_with_an_error_event() -> None:
    live = stream({"model": "m", "input": "hi", "stream": True})
    sent = live.feed(
        b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: {"error": {"message": "boom"}}\n\n'
    )
    sent += live.flush()
    kinds = [json.loads(e.split(b"data: ", 1)[1])["type"] for e in sent.split(b"\n\n") if e]
    assert kinds[-1] == "error" and "response.completed" not in kinds


def test_a_text_stream_carries_the_logprobs_asked_for() -> None:
    def token(text: str) -> dict[str, Any]:
        return {"id": 1, "token": text, "bytes": list(text.encode()), "logprob": -0.5, "top_logprobs": []}

    body, _ = to_chat({"model": "m", "input": "hi", "stream": True, "top_logprobs": 1})
    assert body["logprobs"] is True and body["stream"] is True  # llama-server streams them per chunk
    base = {"object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"content": t}, "logprobs": {"content": [token(t)]}}]}
        for t in ("Hel", "lo")
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    live = stream({"model": "m", "input": "hi", "stream": True, "top_logprobs": 1})
    given = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    read = _read(live.feed(given) + live.flush())
    assert [[p.token for p in e.logprobs] for e in read if e.type == "response.output_text.delta"] == [["Hel"], ["lo"]]
    final: Any = read[-1].response.output[0].content[0]
    assert [p.token for p in final.logprobs] == ["Hel", "lo"]
