"""``POST /v1/responses`` end to end: the real llama-server and gemma-3-270m behind ``localllm
serve``, asked through the official ``openai`` client's Responses API and the libraries that
speak it (pydantic-ai's ``OpenAIResponsesModel``, LangChain's ``use_responses_api``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.test_service_e2e import CHAT, DECIDE, EMBED, Served, serve
from tests.e2e.test_service_front_e2e import WEATHER_PARAMS, Ticket, langchain_tickets

__all__ = ["serve"]

pytestmark = pytest.mark.e2e

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}


class Decide(pydantic.BaseModel):
    route: str = pydantic.Field(max_length=20)
    confident: bool


def test_openai_responses_text_parse_stream_and_tools(serve: Callable[..., Served]) -> None:
    served = serve()
    client = served.client()

    plain = client.responses.create(model=CHAT, input="Say hello.", max_output_tokens=16, temperature=0)
    assert plain.object == "response" and plain.model == CHAT
    assert plain.output_text.strip() and plain.usage is not None and plain.usage.output_tokens > 0
    assert plain.output[0].type == "message"
    # plain text streams as llama-server generates it: one delta a token, not one at the end
    live = list(client.responses.create(model=CHAT, input="Count to five.", max_output_tokens=24, stream=True))
    pieces = [e.delta for e in live if e.type == "response.output_text.delta"]
    assert len(pieces) > 1 and live[-1].type in ("response.completed", "response.incomplete")
    assert "".join(pieces) == live[-1].response.output_text
    probed = list(
        client.responses.create(model=CHAT, input="Say hi.", max_output_tokens=8, top_logprobs=2, stream=True)
    )
    tokens = [e.logprobs for e in probed if e.type == "response.output_text.delta"]
    assert tokens and all(t and len(t[0].top_logprobs or []) == 2 for t in tokens)

    # text.format: compiled into the grammar, the answer validated, as on the chat route
    raw = client.responses.with_raw_response.create(
        model=CHAT,
        instructions="Route the ticket.",
        input="My invoice is wrong.",
        text={"format": {"type": "json_schema", "name": "decide", "schema": DECIDE, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    assert raw.headers["x-localllm-structured"] == "compiled"
    assert raw.headers["x-localllm-validated"] == "true"
    jsonschema.validate(json.loads(raw.parse().output_text), DECIDE)

    parsed = client.responses.parse(
        model=CHAT,
        input="Ticket: my invoice is wrong. Route it.",
        text_format=Decide,
        max_output_tokens=64,
        temperature=0,
    )
    assert isinstance(parsed.output_parsed, Decide)

    with client.responses.stream(
        model=CHAT,
        input="Ticket: my invoice is wrong. Route it.",
        text_format=Decide,
        max_output_tokens=64,
        temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert isinstance(final.output_parsed, Decide)

    # a function tool, then its result sent back as a function_call_output item
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced: Any = {
        "model": CHAT,
        "input": ask,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 128,
        "temperature": 0,
    }
    called = client.responses.create(**forced)
    calls: list[Any] = [item for item in called.output if item.type == "function_call"]
    assert calls and {c.name for c in calls} == {"get_weather"}
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 degrees"}
    turn: Any = [*ask, *(c.model_dump(exclude_none=True) for c in calls), result]
    answered = client.responses.create(
        model=CHAT,
        input=turn,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=32,
        temperature=0,
    )
    assert answered.output_text.strip()

    streamed = list(client.responses.create(**forced, stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert done and streamed[-1].type == "response.completed"
    jsonschema.validate(json.loads(done[0].arguments), WEATHER_PARAMS)
    assert [e.sequence_number for e in streamed] == list(range(len(streamed)))


def test_responses_refusals_name_the_field_sent(serve: Callable[..., Served]) -> None:
    """What this service cannot serve is a 400 naming the Responses field, never a chat one."""
    served = serve()
    client = served.client()
    unsat = {"type": "integer", "minimum": 5, "maximum": 1}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "input[0].content[0]",
        ),
        ({"input": "hi", "tools": [{**WEATHER, "parameters": unsat}]}, "tools[0].parameters"),
        (
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": unsat}}},
            "text.format.schema",
        ),
        ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "hi", "extra_body": {"seed": 1}}, "seed"),
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=CHAT, **body)
        assert caught.value.param == param, (body, caught.value.message)
    # an embedding model: pointed at its route
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=EMBED, input="hi")
    assert caught.value.code == "model_role_mismatch"


def test_pydantic_ai_and_langchain_over_responses(serve: Callable[..., Served]) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    served = serve()

    async def ask() -> Any:
        async with openai.AsyncOpenAI(base_url=served.found.url + "/v1", api_key=served.token, max_retries=0) as api:
            model = OpenAIResponsesModel(CHAT, provider=OpenAIProvider(openai_client=api))
            agent = Agent(model, output_type=Ticket, retries=0)
            return await agent.run(
                "Ticket: my invoice is wrong. Classify it.",
                model_settings={"max_tokens": 128, "parallel_tool_calls": False, "temperature": 0},
            )

    assert isinstance(asyncio.run(ask()).output, Ticket)

    langchain_tickets(served, use_responses_api=True)


def test_openai_agents_sdk_tool_and_typed_output(serve: Callable[..., Served]) -> None:
    """The OpenAI Agents SDK, which speaks the Responses API by default: a function tool it
    runs itself, and a typed final output, streamed too."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

    served = serve()
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        ran.append(city)
        return f"sunny in {city}"

    async def ask() -> tuple[Any, Any, Any]:
        async with openai.AsyncOpenAI(base_url=served.found.url + "/v1", api_key=served.token, max_retries=0) as api:
            model = OpenAIResponsesModel(CHAT, openai_client=api)
            settings = ModelSettings(max_tokens=128, temperature=0, parallel_tool_calls=False)
            # tracing off: the SDK would otherwise export each run to api.openai.com
            config = RunConfig(tracing_disabled=True)
            weather = Agent(
                name="weather",
                model=model,
                tools=[get_weather],
                tool_use_behavior="stop_on_first_tool",
                model_settings=ModelSettings(
                    max_tokens=128, temperature=0, tool_choice="required", parallel_tool_calls=False
                ),
            )
            triage = Agent(name="triage", model=model, output_type=Ticket, model_settings=settings)
            called = await Runner.run(weather, "What is the weather in Paris?", run_config=config)
            typed = await Runner.run(triage, "Ticket: my invoice is wrong. Classify it.", run_config=config)
            streamed = Runner.run_streamed(triage, "Ticket: the app crashes at login. Classify it.", run_config=config)
            async for _ in streamed.stream_events():
                pass
            return called, typed, streamed

    called, typed, streamed = asyncio.run(ask())
    assert len(ran) == 1 and called.final_output == f"sunny in {ran[0]}"
    assert isinstance(typed.final_output, Ticket) and isinstance(streamed.final_output, Ticket)
