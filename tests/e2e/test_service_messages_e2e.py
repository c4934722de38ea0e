"""``POST /v1/messages`` end to end: the real llama-server and gemma-3-270m behind ``localllm
serve``, asked through the official ``anthropic`` client (its ``x-api-key`` carrying the
service's token): text, ``messages.parse``, streams, client tools and their results, errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import anthropic
import jsonschema
import pydantic
import pytest

from tests.e2e.test_service_e2e import CHAT, DECIDE, EMBED, Served, serve
from tests.e2e.test_service_front_e2e import WEATHER_PARAMS

__all__ = ["serve"]

pytestmark = pytest.mark.e2e

WEATHER: Any = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": WEATHER_PARAMS,
    "strict": True,
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Routed(pydantic.BaseModel):
    # no maxLength: the anthropic SDK's schema transform (and pydantic-ai's) moves it into the
    # description (Anthropic's strict-schema limits): gemma-3-270m then wrote one string to
    # max_tokens, or one past the pydantic model's own bound
    queue: Literal["billing", "support", "bugs"]
    urgent: bool


def _client(served: Served, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.found.url, api_key=key or served.token, max_retries=0, timeout=120)


def test_anthropic_messages_text_parse_stream_and_tools(serve: Callable[..., Served]) -> None:
    served = serve()
    with _client(served) as client:
        plain = client.messages.create(
            model=CHAT,
            max_tokens=16,
            messages=[{"role": "user", "content": "Say hello."}],
            extra_body={"temperature": 0},
        )
        assert plain.type == "message" and plain.model == CHAT and plain.content[0].type == "text"
        assert plain.content[0].text.strip() and plain.usage.output_tokens > 0
        assert plain.stop_reason in ("end_turn", "max_tokens")
        # plain text streams as llama-server generates it: one delta a token, not one at the end
        with client.messages.stream(
            model=CHAT, max_tokens=24, messages=[{"role": "user", "content": "Count to five."}]
        ) as live:
            pieces = list(live.text_stream)
            whole: Any = live.get_final_message()
        assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text

        # output_config.format: compiled into the grammar and validated, as on the chat route
        raw = client.messages.with_raw_response.create(
            model=CHAT,
            max_tokens=64,
            system="Route the ticket.",
            messages=[{"role": "user", "content": "My invoice is wrong."}],
            output_config={"format": {"type": "json_schema", "schema": DECIDE}},
            extra_body={"temperature": 0},
        )
        assert raw.headers["x-localllm-structured"] == "compiled"
        assert raw.headers["x-localllm-validated"] == "true"
        block: Any = raw.parse().content[0]
        jsonschema.validate(json.loads(block.text), DECIDE)

        parsed = client.messages.parse(
            model=CHAT,
            max_tokens=64,
            messages=[{"role": "user", "content": "Ticket: my invoice is wrong. Route it."}],
            output_format=Routed,
            extra_body={"temperature": 0},
        )
        assert isinstance(parsed.parsed_output, Routed)

        with client.messages.stream(
            model=CHAT,
            max_tokens=64,
            messages=[{"role": "user", "content": "Ticket: my invoice is wrong. Route it."}],
            output_format=Routed,
            extra_body={"temperature": 0},
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert isinstance(final.parsed_output, Routed) and Routed.model_validate_json(text) == final.parsed_output

        # a client tool, then its result sent back in a tool_result block
        called = client.messages.create(
            model=CHAT,
            max_tokens=128,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},
        )
        uses: list[Any] = [b for b in called.content if b.type == "tool_use"]
        assert called.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
        jsonschema.validate(uses[0].input, WEATHER_PARAMS)
        turn: Any = [
            *ASK,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in called.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]},
        ]
        answered = client.messages.create(
            model=CHAT,
            max_tokens=32,
            messages=turn,
            tools=[WEATHER],
            tool_choice={"type": "none"},
            extra_body={"temperature": 0},
        )
        assert answered.content[0].type == "text" and answered.content[0].text.strip()

        with client.messages.stream(
            model=CHAT,
            max_tokens=128,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0},
        ) as stream:
            final_call = stream.get_final_message()
        streamed: list[Any] = [b for b in final_call.content if b.type == "tool_use"]
        assert streamed and final_call.stop_reason == "tool_use"
        jsonschema.validate(streamed[0].input, WEATHER_PARAMS)


def test_messages_errors_are_anthropic_shaped_and_name_the_field(serve: Callable[..., Served]) -> None:
    served = serve()
    unsat = {"type": "integer", "minimum": 5, "maximum": 1}
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0]"),
        ({"messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        (
            {
                "messages": ASK,
                "tools": [
                    {**WEATHER, "input_schema": {"type": "object", "properties": {"n": unsat}, "required": ["n"]}}
                ],
            },
            "tools[0].input_schema",
        ),
        ({"messages": ASK, "tools": [{**WEATHER, "input_schema": unsat}]}, "tools[0].input_schema"),
        (
            {"messages": ASK, "output_config": {"format": {"type": "json_schema", "schema": unsat}}},
            "output_config.format.schema",
        ),
        ({"messages": ASK, "extra_body": {"mcp_servers": []}}, "mcp_servers"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ]
    with _client(served) as client:
        for body, param in cases:
            with pytest.raises(anthropic.BadRequestError) as caught:
                client.messages.create(model=CHAT, max_tokens=16, **body)
            error: Any = caught.value.body
            assert error["type"] == "error", body
            assert (error["error"]["type"], error["error"]["param"]) == ("invalid_request_error", param), body
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=EMBED, max_tokens=16, messages=ASK)
        wrong: Any = caught.value.body
        assert wrong["error"]["code"] == "model_role_mismatch"
    with _client(served, key="wrong") as stranger, pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.create(model=CHAT, max_tokens=16, messages=ASK)
    denied: Any = refused.value.body
    assert denied["error"]["type"] == "authentication_error"


def test_pydantic_ai_anthropic_model_typed_output(serve: Callable[..., Served]) -> None:
    """pydantic-ai's ``AnthropicModel`` over ``/v1/messages``: its tool output (the default) and
    its native output (``output_config.format``, which its profile for an unknown model leaves off)."""
    import asyncio

    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    served = serve()

    async def ask() -> list[Any]:
        async with anthropic.AsyncAnthropic(base_url=served.found.url, api_key=served.token, max_retries=0) as api:
            # a model pydantic-ai does not know: its profile says what the service supports
            model = AnthropicModel(
                CHAT, provider=AnthropicProvider(anthropic_client=api), profile={"supports_json_schema_output": True}
            )
            results = []
            for output in (Routed, NativeOutput(Routed)):
                agent = Agent(model, output_type=output, retries=0)
                results.append(
                    await agent.run(
                        "Ticket: my invoice is wrong. Classify it.",
                        model_settings={"max_tokens": 128, "temperature": 0, "parallel_tool_calls": False},
                    )
                )
            return results

    assert all(isinstance(r.output, Routed) for r in asyncio.run(ask()))


def test_langchain_chat_anthropic_structured_output(serve: Callable[..., Served]) -> None:
    """LangChain's ``ChatAnthropic`` over ``/v1/messages``: ``with_structured_output`` by tool
    calling (its default) and by ``json_schema`` (``output_config.format``), and a stream."""
    from langchain_anthropic import ChatAnthropic

    served = serve()
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=CHAT,
        base_url=served.found.url,
        api_key=pydantic.SecretStr(served.token or ""),
        max_tokens=128,
        temperature=0,
        max_retries=0,
        timeout=120,
    )
    for method in ("function_calling", "json_schema"):
        routed = llm.with_structured_output(Routed, method=method).invoke("Ticket: my invoice is wrong. Classify it.")
        assert isinstance(routed, Routed), method
    pieces = [chunk.content for chunk in llm.stream("Count to five.")]
    assert len(pieces) > 1
