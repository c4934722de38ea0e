"""``localllm serve``'s front end to end: real llama-server, gemma-3-270m, and client libraries nobody here wrote.

The official ``openai`` client (models.retrieve, streaming usage, strict json_schema,
refused schema, tool calls), LangChain ``with_structured_output`` (function_calling and
json_schema), pydantic-ai's default (tool) output and litellm's tool calls; then the
attacks: DNS rebinding and a cross-origin ``text/plain`` stop under ``--no-auth``, 1,500
half-open connections, 32 clients × 8 requests, a chunked body, a 100,000-deep body, and a
client that leaves freeing its llama-server slot (read from llama-server's ``/slots``).
Every test is bounded by client timeouts.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from localllm.grammar.limits import MAX_SKIPS
from localllm.managed import vocab as vocabulary
from tests.e2e.test_service_e2e import CHAT, EMBED, Served, serve

__all__ = ["serve"]  # the fixture

pytestmark = pytest.mark.e2e

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": WEATHER_PARAMS,
        "strict": True,
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class _Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    tags: set[Annotated[str, pydantic.Field(max_length=12)]] = pydantic.Field(max_length=3)
    name: str = pydantic.Field(max_length=20)


class _Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    barks: int = pydantic.Field(ge=0, le=9)


class _Pet(pydantic.BaseModel):
    pet: Annotated[_Cat | _Dog, pydantic.Field(discriminator="kind")]


class Ticket(pydantic.BaseModel):
    queue: str = pydantic.Field(max_length=20)
    urgent: bool


def _http(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.found.url,
        headers={"Authorization": f"Bearer {served.token}"} if served.token else {},
        trust_env=False,
        timeout=60,
    )


def _args(call: Any) -> dict[str, Any]:
    value = json.loads(call.function.arguments)
    assert isinstance(value, dict)
    return value


# -- the official openai client ------------------------------------------------------------
def test_openai_client_surface_structured_output_and_tool_calls(serve: Callable[..., Served]) -> None:
    served = serve()
    client: Any = served.client()
    _openai_surface(client)
    client.close()


def _openai_surface(client: Any) -> None:
    assert client.models.retrieve(CHAT).id == CHAT
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")

    # the README's first example: no max_tokens, the pin's stop string ends the reply (greedy:
    # a sampled reply from a 270M model may ramble to the context's end, which is no defect)
    reply = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Say hello."}], temperature=0
    )
    assert reply.model == CHAT and reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens < 1024

    chunks = list(
        client.chat.completions.create(
            model=CHAT,
            messages=ASK,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT,
        messages=ASK,
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "strict": True, "schema": schema}},
    )
    assert raw.headers["x-localllm-structured"] == "compiled" and raw.headers["x-localllm-validated"] == "true"
    jsonschema.validate(json.loads(raw.parse().choices[0].message.content or ""), schema)

    refused: dict[
        str, Any
    ] = {  # uniqueItems over open strings: neither our compiler nor llama.cpp's converter enforces it
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"],
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=CHAT,
            messages=ASK,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": refused}},
        )
    assert caught.value.code == "unsupported_schema" and "uniqueItems" in str(caught.value)
    # not strict: the rest of the schema is the grammar, uniqueItems is validated
    refused["properties"]["tags"].update(maxItems=3, items={"type": "string", "maxLength": 12})
    loose = client.chat.completions.with_raw_response.create(
        model=CHAT,
        messages=ASK,
        max_tokens=128,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": refused}},
    )
    assert loose.headers["x-localllm-structured"] == "relaxed"
    tags = json.loads(loose.parse().choices[0].message.content or "")["tags"]
    assert isinstance(tags, list) and len(tags) <= 3 and all(isinstance(t, str) for t in tags)
    assert loose.headers["x-localllm-validated"] == ("true" if len(set(tags)) == len(tags) else "false")

    # pydantic's tagged union, one member with a set[str]: its oneOf of refs still picks one
    # member once uniqueItems is gone (before: llama.cpp's converter, not held to the rest)
    pet = _Pet.model_json_schema()
    tagged = client.chat.completions.with_raw_response.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        max_tokens=128,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": pet}},
    )
    assert tagged.headers["x-localllm-structured"] == "relaxed"
    value = json.loads(tagged.parse().choices[0].message.content or "")
    loosened = json.loads(json.dumps(pet).replace('"uniqueItems": true', '"uniqueItems": false'))
    jsonschema.validate(value, loosened)  # the relaxed grammar held it to all but uniqueItems
    valid = jsonschema.Draft202012Validator(pet).is_valid(value)
    assert tagged.headers["x-localllm-validated"] == ("true" if valid else "false")

    # parallel calls allowed (OpenAI's default): the base model may write several, each valid
    # greedy, as every generation below: what a sampled 270M model writes is not what is tested;
    # 512 tokens: room for 8 calls with 30-letter cities (~50 tokens each)
    answer = client.chat.completions.create(
        model=CHAT, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=512, temperature=0
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    calls = answer.choices[0].message.tool_calls or []
    assert 1 <= len(calls) <= 8 and len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(_args(call), WEATHER_PARAMS)

    one = {"parallel_tool_calls": False, "max_tokens": 128, "temperature": 0}
    named = client.chat.completions.create(
        model=CHAT,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **one,
    )
    (call,) = named.choices[0].message.tool_calls or []
    assert named.choices[0].finish_reason == "tool_calls" and call.id.startswith("call_")
    jsonschema.validate(_args(call), WEATHER_PARAMS)

    auto = client.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER], tool_choice="auto", **one)
    message = auto.choices[0].message
    if message.tool_calls:
        jsonschema.validate(_args(message.tool_calls[0]), WEATHER_PARAMS)
        assert auto.choices[0].finish_reason == "tool_calls"
    else:
        assert isinstance(message.content, str) and message.content  # at least one character
        assert auto.choices[0].finish_reason in ("stop", "length")  # "length": the text so far

    for choice in ("required", "auto"):
        stream = client.chat.completions.create(
            model=CHAT, messages=ASK, tools=[WEATHER], tool_choice=choice, stream=True, **one
        )
        names, arguments, reasons, text = set(), "", [], ""
        for chunk in stream:
            for c in chunk.choices:
                for tc in c.delta.tool_calls or []:
                    if tc.function and tc.function.name:
                        names.add(tc.function.name)
                    arguments += (tc.function.arguments or "") if tc.function else ""
                text += c.delta.content or ""
                reasons.append(c.finish_reason)
        if choice == "required" or names:
            assert names == {"get_weather"} and "tool_calls" in reasons
            jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
        else:
            assert text


# -- three more libraries --------------------------------------------------------------------
def langchain_tickets(served: Served, **options: Any) -> None:
    """LangChain's ``ChatOpenAI.with_structured_output`` (``function_calling`` and
    ``json_schema``) answers a ``Ticket``; ``options`` such as ``use_responses_api=True``."""
    from langchain_openai import ChatOpenAI

    # our own HTTP client, closed when done: langchain's default one is cached for the process
    # and leaves its keep-alive socket to interpreter exit (a ResourceWarning in CI's log)
    with httpx.Client(trust_env=False, timeout=120) as http_client:
        llm = ChatOpenAI(  # type: ignore[call-arg]
            model=CHAT,
            base_url=served.found.url + "/v1",
            api_key=pydantic.SecretStr(served.token or ""),
            max_tokens=128,
            temperature=0,
            timeout=120,
            max_retries=0,
            http_client=http_client,
            **options,
        )
        for method in ("function_calling", "json_schema"):
            ticket = llm.with_structured_output(Ticket, method=method).invoke(
                "Ticket: my invoice is wrong. Classify it."
            )
            assert isinstance(ticket, Ticket), method


def test_langchain_with_structured_output(serve: Callable[..., Served]) -> None:
    langchain_tickets(serve())


def test_pydantic_ai_default_output(serve: Callable[..., Served]) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    served = serve()

    async def ask() -> Any:
        # our own client, closed when done: run_sync's would leave its sockets to the GC
        async with openai.AsyncOpenAI(base_url=served.found.url + "/v1", api_key=served.token, max_retries=0) as api:
            model = OpenAIChatModel(CHAT, provider=OpenAIProvider(openai_client=api))
            agent = Agent(model, output_type=Ticket, retries=0)
            return await agent.run(
                "Ticket: my invoice is wrong. Classify it.",
                model_settings={"max_tokens": 128, "parallel_tool_calls": False, "temperature": 0},
            )

    result = asyncio.run(ask())
    assert isinstance(result.output, Ticket)


def test_litellm_tool_calls(serve: Callable[..., Served]) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    served = serve()
    # our own client, closed when done: litellm's default one is cached for the process and
    # leaves its keep-alive socket to interpreter exit (a ResourceWarning in CI's log)
    with served.client() as api:
        answer: Any = litellm.completion(
            model=f"openai/{CHAT}",
            api_base=served.found.url + "/v1",
            api_key=served.token,
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=128,
            temperature=0,
            timeout=120,
            client=api,
        )
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


# -- requests the pinned llama-server answered with a 500 (the openai client retries those) --
def test_requests_llama_server_fails_on_are_400s_naming_the_parameter(serve: Callable[..., Served]) -> None:
    """Each of these once reached llama-server and came back a 500 (which the openai client
    retries twice), a 501, a 400 in llama-server's own shape, or vectors of another size than
    asked for."""
    served = serve()
    # no value meets it (the converter's grammar admitted none: llama-server's 500 mid-answer); now
    # refused before the model is asked
    unsat = {"type": "integer", "minimum": 5, "maximum": 1}
    chats: list[tuple[dict[str, Any], str, str]] = [
        ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", "invalid_request_error"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
            "messages[0].content[0]",
            "unsupported_content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]},
            "messages[0].content[0].text",
            "invalid_request_error",
        ),
        (
            {"messages": ASK, "max_tokens": 64, "response_format": _schema_format(unsat)},
            "response_format.json_schema.schema",
            "unsatisfiable_schema",
        ),
        (
            {"messages": ASK, "max_tokens": 64, "extra_body": {"json_schema": unsat}},
            "json_schema",
            "unsatisfiable_schema",
        ),
        (  # never fetched: a $ref that does not resolve inside the schema is refused with the request
            {"messages": ASK, "response_format": _schema_format({"$ref": "http://169.254.169.254/x"})},
            "response_format.json_schema.schema",
            "invalid_schema",
        ),
        (  # groups nested 30,000 deep: llama-server's parser overflowed its stack (every model gone)
            {
                "messages": ASK,
                "max_tokens": 2,
                "extra_body": {"grammar": "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000},
            },
            "grammar",
            "invalid_grammar",
        ),
        (  # a repeat whose minimum passes its maximum: the parser allocated without end
            {"messages": ASK, "max_tokens": 2, "extra_body": {"grammar": 'root ::= "a"{1,0}'}},
            "grammar",
            "invalid_grammar",
        ),
        (  # a row of 160 optional "a"s: 15-26 s for each token, the server's other slots waiting
            {"messages": ASK, "max_tokens": 2, "extra_body": {"grammar": 'root ::= ("a"?){160}'}},
            "grammar",
            "invalid_grammar",
        ),
        (  # a DRY window of 10^9 tokens: 8 GB of the server's memory, kept after the request
            {"messages": ASK, "max_tokens": 2, "extra_body": {"dry_multiplier": 1, "dry_penalty_last_n": 10**9}},
            "dry_penalty_last_n",
            "invalid_request_error",
        ),
        (  # 1,000 DRY breakers, each matched against the whole vocabulary: past 60 s, the slots waiting
            {"messages": ASK, "max_tokens": 2, "extra_body": {"dry_sequence_breakers": [f"x{i}" for i in range(1000)]}},
            "dry_sequence_breakers",
            "invalid_request_error",
        ),
        (  # not strict, not compiled, not relaxable: the converter would write [0-9]{16,15} (the same)
            {"messages": ASK, "max_tokens": 2, "response_format": _schema_format(RUNAWAY, strict=False)},
            "response_format.json_schema.schema",
            "unsupported_schema",
        ),
        (
            {"messages": ASK, "extra_body": {"reasoning_format": "DeepSeek"}},
            "reasoning_format",
            "invalid_request_error",
        ),
        (  # llama-server's 400 without param ("penalty_repeat must be finite and greater than 0")
            {"messages": ASK, "extra_body": {"repeat_penalty": 0, "repeat_last_n": 64}},
            "repeat_penalty",
            "invalid_request_error",
        ),
        (  # generated past the grammar's end: llama-server's 500 "Unexpected empty grammar stack"
            {"messages": ASK, "response_format": _schema_format(WEATHER_PARAMS), "extra_body": {"ignore_eos": True}},
            "ignore_eos",
            "invalid_request_error",
        ),
        (  # the message's text and then the grammar's whole value: never the schema's (a 502)
            {
                "messages": [*ASK, {"role": "assistant", "content": '{"city": "Os'}],
                "response_format": _schema_format(WEATHER_PARAMS),
                "extra_body": {"continue_final_message": True, "add_generation_prompt": False},
            },
            "continue_final_message",
            "invalid_request_error",
        ),
    ]
    with served.client() as api:
        for kwargs, param, code in chats:
            with pytest.raises(openai.BadRequestError) as caught:
                api.chat.completions.create(model=CHAT, **kwargs)
            assert (caught.value.param, caught.value.code) == (param, code), caught.value.message
        with pytest.raises(openai.BadRequestError) as wrong_role:
            api.chat.completions.create(model=EMBED, messages=ASK, max_tokens=4)
        assert (wrong_role.value.param, wrong_role.value.code) == ("model", "model_role_mismatch")
        with pytest.raises(openai.BadRequestError) as wrong_role:
            api.embeddings.create(model=CHAT, input="x")
        assert (wrong_role.value.param, wrong_role.value.code) == ("model", "model_role_mismatch")
        with pytest.raises(openai.BadRequestError) as bad_input:
            api.embeddings.create(model=EMBED, input=5)  # type: ignore[arg-type]
        assert bad_input.value.param == "input"
        with pytest.raises(openai.BadRequestError) as shorter:
            api.embeddings.create(model=EMBED, input="x", dimensions=8)
        assert (shorter.value.param, shorter.value.code) == ("dimensions", "unsupported_dimensions")
        assert len(api.embeddings.create(model=EMBED, input="x", dimensions=384).data[0].embedding) == 384
        # llama.cpp's own json_schema field is compiled and validated like a response_format
        answer = api.chat.completions.with_raw_response.create(
            model=CHAT, messages=ASK, max_tokens=64, extra_body={"json_schema": WEATHER_PARAMS}
        )
        assert answer.headers["x-localllm-structured"] == "compiled"
        assert answer.headers["x-localllm-validated"] == "true"
        # a grammar at every limit of localllm.grammar.limits parses and answers on the real server
        at_limits = "root ::= " + "(" * 256 + " | ".join(f'"a{i}"' for i in range(513)) + ")" * 256
        api.chat.completions.create(model=CHAT, messages=ASK, max_tokens=2, extra_body={"grammar": at_limits})
        row = f'root ::= ("a"?){{{MAX_SKIPS}}} "b"'  # the longest row admitted: about 0.6 s a token here
        api.chat.completions.create(model=CHAT, messages=ASK, max_tokens=2, extra_body={"grammar": row})
        # null is the default, for llama-server's reasoning_format too (its 500 before)
        api.chat.completions.create(
            model=CHAT, messages=ASK, max_tokens=2, n=None, extra_body={"reasoning_format": None}
        )
    with _http(served) as http:
        # llama-server's own name for the input still passes, answered in OpenAI's shape (given
        # content, llama-server answers in its own: a list without data, 8 dimensions passing unread)
        named = http.post("/v1/embeddings", json={"model": EMBED, "content": "x"})
        assert len(named.json()["data"][0]["embedding"]) == 384, named.text
        cut = http.post("/v1/embeddings", json={"model": EMBED, "content": "x", "dimensions": 8})
        assert cut.status_code == 400 and cut.json()["error"]["code"] == "unsupported_dimensions"
        # null is the default (llama-server's type error, a 500, before)
        nulls = {"encoding_format": None, "embd_normalize": None}
        assert http.post("/v1/embeddings", json={"model": EMBED, "input": "x", **nulls}).status_code == 200
        # its own routes: a 500 for each of these before
        for path, body, param in (
            ("/tokenize", {"content": 5}, "content"),
            ("/detokenize", {"tokens": [-1]}, "tokens"),
            ("/detokenize", {"tokens": "x"}, "tokens"),
            ("/detokenize", {"tokens": [2, 262144]}, "tokens[1]"),  # gemma-3's vocabulary: 262,144 ids
            ("/v1/embeddings", {"input": "x", "encoding_format": 5}, "encoding_format"),
            ("/v1/embeddings", {"input": "x", "embd_normalize": "2"}, "embd_normalize"),
        ):
            model = EMBED if path == "/v1/embeddings" else CHAT
            refused = http.post(path, json={"model": model, **body})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
        assert http.post("/detokenize", json={"model": CHAT, "tokens": [2, 262143]}).status_code == 200
        # an empty prompt: the service's own 500 (IndexError) before; llama-server answers it
        assert http.post("/v1/completions", json={"model": CHAT, "prompt": "", "max_tokens": 2}).status_code == 200
        # a client's grammar that ends, with ignore_eos: llama-server's 500 once the grammar is done,
        # answered as a 400 naming ignore_eos (a grammar without end goes on: the slot test below)
        ended = {"model": CHAT, "prompt": "x", "max_tokens": 8, "grammar": 'root ::= "ab"'}
        refused = http.post("/v1/completions", json={**ended, "ignore_eos": True})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "ignore_eos", refused.text
        assert http.post("/v1/completions", json=ended).json()["choices"][0]["text"] == "ab"
        assert http.post("/v1/completions", json={**ended, "grammar": None, "ignore_eos": True}).status_code == 200


def test_texts_llama_cpp_splits_for_seconds_are_refused_at_once(
    serve: Callable[..., Served], chat_gguf: Path, embed_gguf: Path
) -> None:
    """llama.cpp splits a text at each special token, walking its list of pieces from the head
    at every split: 80 KB of ``"a\\n"`` in a message (80,000 pieces at gemma-3's newline token)
    held the server 13 s before its "exceeds the context" 400, and 16 MiB would hold it for days.
    The service counts the pieces with the model's own vocabulary first; the count is a lower
    bound of llama-server's own on random texts of its special tokens, so a refused prompt could
    never have fitted."""
    served = serve()
    with _http(served) as http:
        for path, model, body, param, code in (
            (
                "/v1/chat/completions",
                CHAT,
                {"messages": [{"role": "user", "content": "a\n" * 40_000}]},
                "messages",
                "context_length_exceeded",
            ),
            ("/v1/completions", CHAT, {"prompt": "x<start_of_turn>" * 20_000}, "prompt", "context_length_exceeded"),
            ("/tokenize", CHAT, {"content": "a\t" * 40_000}, "content", "too_many_special_tokens"),
            ("/v1/embeddings", EMBED, {"input": "x[SEP]" * 40_000}, "input", "context_length_exceeded"),
            (
                "/v1/chat/completions",
                CHAT,
                {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a\n" * 40_000}]},
                "messages",
                "context_length_exceeded",
            ),
            # llama-server sets these over the template's variables: the checked messages replaced (10 s)
            (
                "/v1/chat/completions",
                CHAT,
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "chat_template_kwargs": {"messages": [{"role": "user", "content": "a\n" * 40_000}]},
                },
                "chat_template_kwargs.messages",
                "invalid_request_error",
            ),
            # a PEG parser for the answer whose rule names itself (100 bytes): the pinned server's
            # stack overflowed, every model and request on it gone
            (
                "/v1/completions",
                CHAT,
                {
                    "prompt": "hi",
                    "chat_parser": json.dumps({"parsers": [{"type": "and", "child": 0}], "rules": {}, "root": 0}),
                },
                "chat_parser",
                "invalid_request_error",
            ),
            (
                "/v1/completions",
                CHAT,
                {"prompt": "hi", "reasoning_budget_start_tag": "a\n" * 20_000},
                "reasoning_budget_start_tag",
                "invalid_request_error",
            ),
            (
                "/v1/completions",
                CHAT,
                {"prompt": "hi", "message_delimiters": [{"role": "user", "delimiter": "a\n" * 40_000}]},
                "message_delimiters",
                "invalid_request_error",
            ),
            (
                "/v1/completions",
                CHAT,
                {"prompt": "hi", "preserved_tokens": ["a\n" * 20_000]},
                "preserved_tokens",
                "too_many_special_tokens",
            ),
            # each within the bound alone, together past it: 40 such texts took 15 s
            (
                "/v1/completions",
                CHAT,
                {"prompt": "hi", "logit_bias": [["a\n" * 6000 + str(i), 1] for i in range(3)]},
                "logit_bias",
                "too_many_special_tokens",
            ),
            # a pattern trigger is matched with std::regex at every token (past 60 s for 30); type 7: a crash
            (
                "/v1/completions",
                CHAT,
                {
                    "prompt": "a",
                    "grammar": 'root ::= "x"',
                    "grammar_lazy": True,
                    "grammar_triggers": [{"type": 2, "value": "(a*)*b"}],
                },
                "grammar_triggers[0]",
                "invalid_request_error",
            ),
            (
                "/v1/completions",
                CHAT,
                {
                    "prompt": "a",
                    "grammar": 'root ::= "x"',
                    "grammar_lazy": True,
                    "grammar_triggers": [{"type": 7, "value": "a"}],
                },
                "grammar_triggers[0]",
                "invalid_request_error",
            ),
            # each message rendered with its role markers: 40,000 empty ones took 51 s
            (
                "/v1/chat/completions",
                CHAT,
                {"messages": [{"role": "user", "content": ""}] * 2049},
                "messages",
                "invalid_request_error",
            ),
            # parts joined with a newline the texts' count cannot see: 48,000 parts of "a" took 11.8 s
            (
                "/v1/chat/completions",
                CHAT,
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 2049}]},
                "messages[0].content",
                "invalid_request_error",
            ),
            # the chain as given, at every token: "t" * 10,000 took 1.1 s a token, "d" * 100 (DRY) 10 s
            ("/v1/completions", CHAT, {"prompt": "hi", "samplers": "d" * 100}, "samplers", "invalid_request_error"),
            # the infill sampler compares each pair of candidates: past 590 s for one token
            ("/v1/completions", CHAT, {"prompt": "hi", "samplers": "i"}, "samplers", "invalid_request_error"),
            # llama-server builds its whole answer first: 15 MB of "ab " took 10 s and 2 GB
            ("/tokenize", CHAT, {"content": "ab " * 400_000}, "content", "invalid_request_error"),
            # each input a task, every vector in one answer: 40,000 one-letter inputs took 100 s, 1.2 GB
            ("/v1/embeddings", EMBED, {"input": ["a"] * 2049}, "input", "invalid_request_error"),
        ):
            refused = http.post(
                path, json={"model": model, "max_tokens": 1, **body} if model == CHAT else {"model": model, **body}
            )
            assert refused.status_code == 400, refused.text
            assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (param, code)
        # what fits is still answered, and the bound never passes llama-server's own count
        vocab = vocabulary.load(chat_gguf)
        assert vocab is not None and vocabulary.load(embed_gguf) is not None
        rng = random.Random(11)
        alphabet = [
            "a",
            "bc",
            " ",
            "  ",
            "\n",
            "\n\n",
            "\t",
            "<start_of_turn>",
            "<end_of_turn>",
            "<unused3>",
            "<unused",
            "[multimodal]",
            "<",
            "é",
            "😀",
            "x y",
            "<eos>",
            "    ",
            "\r\n",
        ]
        for _ in range(150):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
            counted = http.post("/tokenize", json={"model": CHAT, "content": text, "add_special": False})
            assert counted.status_code == 200, counted.text
            assert vocab.tokens([text], 10**9) <= len(counted.json()["tokens"]), repr(text)
        fits = http.post(
            "/v1/chat/completions",
            json={"model": CHAT, "max_tokens": 2, "messages": [{"role": "user", "content": "a\n" * 300}]},
        )
        assert fits.status_code == 200, fits.text
        parts = [{"type": "text", "text": "a"}] * 300
        fits = http.post(
            "/v1/chat/completions",
            json={"model": CHAT, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]},
        )
        assert fits.status_code == 200, fits.text
        # a word trigger is still taken (one the text never reaches: once the lazy grammar ends, the
        # pinned server answers the next token with a 500, "empty grammar stack", its own)
        lazy = {
            "grammar": 'root ::= "x"',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": 1, "value": "zebra unicorn"}],
        }
        asked = {"model": CHAT, "max_tokens": 8, "temperature": 0, "prompt": "Hello", **lazy}
        assert http.post("/v1/completions", json=asked).status_code == 200
        # every sampler once, in any order, still answers
        chain = {"model": CHAT, "max_tokens": 2, "prompt": "Hello", "samplers": "dkypsmtxea"[::-1]}
        assert http.post("/v1/completions", json=chain).status_code == 200
        # a null message field is absent (llama-server's 500 before: "type must be string, but is null")
        nulls = [{"role": "user", "content": "hi", "name": None, "tool_call_id": None, "reasoning_content": None}]
        assert (
            http.post("/v1/chat/completions", json={"model": CHAT, "max_tokens": 2, "messages": nulls}).status_code
            == 200
        )
        switch = {"enable_thinking": False}
        asked = {"model": CHAT, "max_tokens": 2, "messages": ASK, "chat_template_kwargs": switch}
        assert http.post("/v1/chat/completions", json=asked).status_code == 200


RUNAWAY = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 9_999_999_999_999_999}, "m": {"$ref": "#/properties/m"}},
}


def _schema_format(schema: dict[str, Any], strict: bool | None = None) -> Any:
    given = {"name": "answer", "schema": schema} | ({} if strict is None else {"strict": strict})
    return {"type": "json_schema", "json_schema": given}


# -- attacks -------------------------------------------------------------------------------------
def _raw(served: Served, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", served.found.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None and "Transfer-Encoding" not in headers:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if body is not None:
            conn.send(body)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_no_auth_refuses_rebinding_and_cross_origin_stop(serve: Callable[..., Served]) -> None:
    served = serve("--no-auth")
    port = served.found.port
    status, _ = _raw(served, "GET", "/v1/models", None, {"Host": f"rebind.attacker.example:{port}"})
    assert status == 421
    stop = b'{"all": true}'
    page = {"Host": f"127.0.0.1:{port}", "Origin": "https://attacker.example", "Content-Type": "text/plain"}
    assert _raw(served, "POST", "/localllm/stop", stop, page)[0] in (403, 415)
    status, _ = _raw(served, "POST", "/localllm/stop", stop, {**page, "Origin": "null"})
    assert status in (403, 415)
    status, _ = _raw(
        served, "POST", "/localllm/stop", stop, {"Host": f"127.0.0.1:{port}", "Content-Type": "text/plain"}
    )
    assert status == 415
    time.sleep(0.5)
    assert served.proc.poll() is None  # still running
    assert _raw(served, "GET", "/v1/models", None, {"Host": f"localhost:{port}"})[0] == 200


def test_chunked_and_deep_bodies(serve: Callable[..., Served]) -> None:
    served = serve()
    port = served.found.port
    body = json.dumps({"model": CHAT, "messages": ASK, "max_tokens": 4}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 9]), body[i : i + 9]) for i in range(0, len(body), 9))
    chunked += b"0\r\n\r\n"
    headers = {
        "Host": f"127.0.0.1:{port}",
        "Authorization": f"Bearer {served.token}",
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
    }
    status, answer = _raw(served, "POST", "/v1/chat/completions", chunked, headers)
    assert status == 200 and json.loads(answer)["choices"][0]["message"]["content"] is not None
    deep = b"[" * 100_000 + b"]" * 100_000
    plain = {k: v for k, v in headers.items() if k != "Transfer-Encoding"}
    status, answer = _raw(served, "POST", "/v1/embeddings", deep, plain)
    assert status == 400 and json.loads(answer)["error"]["code"] == "too_deep"


def test_half_open_connections_and_many_clients(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve()
    with _http(served) as http_client:
        assert (
            http_client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "warm"}).status_code == 200
        )
    socks: list[socket.socket] = []
    try:
        for i in range(1500):
            s = socket.create_connection(("127.0.0.1", served.found.port), timeout=10)
            if i % 2:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len")
            socks.append(s)
        with _http(served) as http_client:
            assert http_client.get("/v1/models", timeout=5).status_code == 200
    finally:
        for s in socks:
            s.close()
    with _http(served) as http_client:
        # no stall after the hang-up (5 s: below the 10-s header timeout, above a loaded box's
        # turn through 1,500 hang-ups)
        assert http_client.get("/v1/models", timeout=5).status_code == 200

    def one_client(_: int) -> int:
        failures = 0
        with _http(served) as http_client:
            for _ in range(8):
                try:
                    r = http_client.post(
                        "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "x"}, timeout=120
                    )
                    failures += r.status_code != 200
                except httpx.HTTPError:
                    failures += 1
        return failures

    with ThreadPoolExecutor(32) as pool:
        assert sum(pool.map(one_client, range(32))) == 0
    log = (tmp_path / "serve-0.log").read_text()
    assert "Traceback" not in log and "status=499" not in log.replace("status=499 client left", "")


def _slots_busy(http_client: httpx.Client) -> int:
    slots = http_client.get(f"/localllm/slots/{CHAT}").json()
    return sum(1 for s in slots if s.get("is_processing"))


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_frees_its_slot(serve: Callable[..., Served], stream: bool, tmp_path: Path) -> None:
    served = serve()
    long = {
        "model": CHAT,
        "messages": ASK,
        "max_tokens": 1000,
        "ignore_eos": True,
        "grammar": "root ::= [a-z ]+",
        "stream": stream,
    }
    with _http(served) as http_client:
        http_client.post("/v1/chat/completions", json={"model": CHAT, "messages": ASK, "max_tokens": 1})  # loaded
        assert _slots_busy(http_client) == 0
        gone = threading.Event()

        def impatient() -> None:
            # The client leaves when told (not on a timer of its own, which a loaded box could
            # run out before the slot was ever seen busy): a stream stops reading, a plain
            # request hangs up without waiting for its answer.
            if stream:
                with _http(served) as mine, mine.stream("POST", "/v1/chat/completions", json=long, timeout=60) as r:
                    for _ in r.iter_bytes():
                        if gone.is_set():
                            break
                return
            conn = http.client.HTTPConnection("127.0.0.1", served.found.port, timeout=60)
            try:
                body = json.dumps(long).encode()
                conn.request(
                    "POST",
                    "/v1/chat/completions",
                    body,
                    {"Authorization": f"Bearer {served.token}", "Content-Type": "application/json"},
                )
                gone.wait(60)
            finally:
                conn.close()

        worker = threading.Thread(target=impatient)
        worker.start()
        deadline = time.monotonic() + 10
        while _slots_busy(http_client) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _slots_busy(http_client) == 1  # it is generating
        gone.set()
        worker.join(30)
        assert not worker.is_alive()
        left = time.monotonic()
        # No polling in the first second: llama-server looks at a non-streaming request's
        # socket only after 1 s with no result for any task (server_response::recv_with_timeout
        # restarts its wait on every result, and each /slots read is one), so reading /slots
        # every 50 ms would itself keep the abandoned generation alive.
        time.sleep(1.2)
        while True:
            asked = time.monotonic() - left  # when /slots was asked, not when it answered
            if not _slots_busy(http_client) or asked > 10:
                break
            time.sleep(1.1)
        freed = asked
    log = (tmp_path / "serve-0.log").read_text()
    lines = "\n".join(line for line in log.splitlines() if "/localllm/slots/" not in line)
    # The bound tells a stopped generation from one left to run, and is no speed: the abandoned
    # 1,000 tokens (~50 tok/s on 2 idle cores) would hold the slot ~20 s. Idle, the slot is free
    # at the first look (1.2 s); on a loaded box a look or two later, since every /slots read
    # restarts llama-server's 1-s wait before it looks at the socket.
    assert freed <= 4.5, f"the slot was freed {freed:.2f} s after the client left; log:\n{lines[-3000:]}"
    assert "status=499 client left" in log and "Traceback" not in log
