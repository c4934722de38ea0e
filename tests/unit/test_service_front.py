"""The service's HTTP front: Host/Origin/Content-Type checks, limits, structured output, tool calls.

Against fake llama-server processes (tests/unit/fakes): given a GBNF ``grammar`` the fake
answers the grammar's first walk, else ``FAKE_LLAMA_CONTENT`` or a fixed greeting.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.grammar.relax import relax
from localllm.grammar.walk import Grammar
from localllm.managed.server import CANARY_BODY
from localllm.service.api import FrontLimits
from localllm.service.chat import MAX_BREAKER_CHARS, MAX_BREAKERS, ChatLimits
from localllm.service.guard import Guard
from tests.unit.conftest import SchemaHost
from tests.unit.test_agent_local_llm import TAGGED
from tests.unit.test_service import Factory, chat, client, env, eventually, make_service, rows

__all__ = ["env", "make_service"]  # fixtures used here

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA, "strict": True},
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]},
    },
}


def fmt(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def upstream_chats(env: dict[str, Path]) -> list[dict[str, Any]]:
    return [
        r["body"]
        for r in rows(env["requests"])
        if r["method"] == "POST" and r["path"] == "/v1/chat/completions" and r["body"] != CANARY_BODY
    ]


# -- Host, Origin, Content-Type ----------------------------------------------------------
def test_guard_host_rules() -> None:
    guard = Guard.build("127.0.0.1", 8911)
    for ok in ("127.0.0.1:8911", "localhost:8911", "[::1]:8911", "localhost", "LOCALHOST:8911"):
        assert guard.host_ok(ok), ok
    for bad in ("evil.example:8911", "evil.example", "127.0.0.1:80", "127.0.0.1:8911.evil", None, "", "[::1"):
        assert not guard.host_ok(bad), bad
    wild = Guard.build("0.0.0.0", 8911, allow_hosts=["box.lan"])
    assert wild.host_ok("192.168.1.7:8911") and wild.host_ok("box.lan:8911")
    assert not wild.host_ok("rebind.evil.example:8911")
    assert not guard.origin_ok("null") and not guard.origin_ok("https://evil.example")
    assert guard.origin_ok(None) and guard.origin_ok("http://localhost:8911")
    assert Guard.build("127.0.0.1", 8911, ["http://localhost:3000/"]).origin_ok("http://localhost:3000")


def test_a_request_without_host_is_refused_saying_so() -> None:
    refused = Guard.build("127.0.0.1", 8911).check("GET", None, None, None)
    assert refused is not None and refused.status == 421
    assert refused.message.startswith("a request without a Host header")  # not "Host None"


def test_head_reads_like_get_and_a_405_names_the_allowed_methods(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        heads = [http.head(path) for path in ("/health", "/v1/models")]
        gets = [http.get(path) for path in ("/health", "/v1/models")]
        put = http.put("/v1/chat/completions", json={})
        delete = http.delete("/v1/models")
    for head, get in zip(heads, gets, strict=True):
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == get.headers["content-length"]
    assert (put.status_code, put.headers["allow"]) == (405, "POST")
    assert (delete.status_code, delete.headers["allow"]) == (405, "GET, HEAD")


@pytest.mark.parametrize("no_auth", [True, False])
def test_rebinding_cross_origin_and_text_plain_are_refused(make_service: Factory, no_auth: bool) -> None:
    service = make_service(no_auth=no_auth)
    with client(service) as http:
        rebound = http.get("/v1/models", headers={"Host": f"attacker.example:{service.port}"})
        assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "misdirected_request"
        assert http.get("/health", headers={"Host": "attacker.example"}).status_code == 421
        foreign = http.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": MESSAGES},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
        # the CVE-2024-28224 shape: a page's no-preflight text/plain POST to stop the service
        stop = http.post("/localllm/stop", content=b'{"all": true}', headers={"Content-Type": "text/plain"})
        assert stop.status_code == 415
        assert http.post("/localllm/stop", json={"all": True}, headers={"Origin": "null"}).status_code == 403
        form = http.post(
            "/v1/chat/completions", content=b"{}", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert form.status_code == 415
        assert http.get("/v1/models").status_code == 200  # still serving: nothing was stopped
        assert chat(http, "chat").status_code == 200


def test_allow_origin_lets_a_web_app_in(make_service: Factory) -> None:
    service = make_service(allow_origins=("http://localhost:3000",))
    with client(service) as http:
        assert http.get("/v1/models", headers={"Origin": "http://localhost:3000"}).status_code == 200
        assert http.get("/v1/models", headers={"Origin": "http://localhost:3001"}).status_code == 403


@pytest.mark.parametrize(
    ("allowed", "origin"), [("http://localhost:3000", "http://localhost:3000"), ("*", "https://app.example")]
)
def test_an_allowed_origin_gets_cors_headers_and_its_preflight_needs_no_token(
    make_service: Factory, allowed: str, origin: str
) -> None:
    service = make_service(allow_origins=(allowed,))
    preflight_headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    with client(service, token=None) as anonymous:
        preflight = anonymous.options("/v1/chat/completions", headers=preflight_headers)
        unauthorized = anonymous.get("/v1/models", headers={"Origin": origin})
    with client(service) as http:
        listed = http.get("/v1/models", headers={"Origin": origin})
        answered = http.post(
            "/v1/chat/completions", json={"model": "chat", "messages": MESSAGES}, headers={"Origin": origin}
        )
        plain = http.get("/v1/models")
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert {m.strip() for m in preflight.headers["access-control-allow-methods"].split(",")} >= {"GET", "POST"}
    assert {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")} == {
        "authorization",
        "content-type",
    }
    assert preflight.headers["vary"] == "Origin"
    for response, status in ((unauthorized, 401), (listed, 200), (answered, 200)):
        assert response.status_code == status
        assert (response.headers["access-control-allow-origin"], response.headers["vary"]) == (origin, "Origin")
    assert "access-control-allow-origin" not in plain.headers  # no Origin, no CORS


def test_an_origin_not_allowed_gets_no_cors_headers(make_service: Factory) -> None:
    service = make_service(allow_origins=("http://localhost:3000",))
    with client(service, token=None) as anonymous:
        preflight = anonymous.options(
            "/v1/chat/completions", headers={"Origin": "http://localhost:3001", "Access-Control-Request-Method": "POST"}
        )
    with client(service) as http:
        foreign = http.get("/v1/models", headers={"Origin": "http://localhost:3001"})
    assert (preflight.status_code, foreign.status_code) == (403, 403)
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in foreign.headers


# -- structured output -----------------------------------------------------------------------
def test_json_schema_is_compiled_sent_as_grammar_and_validated(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", response_format=fmt(SCHEMA))
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-localllm-structured"] == "compiled"
        assert answer.headers["x-localllm-validated"] == "true"
        value = json.loads(answer.json()["choices"][0]["message"]["content"])
        assert set(value) == {"city", "days"} and 1 <= value["days"] <= 7
        plain = chat(http, "chat")
        assert plain.headers["x-localllm-structured"] == "none"
    sent = upstream_chats(env)[0]
    assert "response_format" not in sent and sent["grammar"].startswith("root ::=")


def test_strict_schema_the_compiler_refuses_is_a_400_naming_path_and_construct(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # uniqueItems over open strings: neither the compiler nor llama.cpp's converter enforces it
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"],
    }
    service = make_service()
    with client(service) as http:
        refused = chat(http, "chat", response_format=fmt(schema))
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "unsupported_schema" and error["param"] == "response_format.json_schema.schema"
        assert "uniqueItems" in error["message"] and "$.properties.tags" in error["message"]
        loose = chat(http, "chat", response_format=fmt(schema, strict=False))
        # not strict: the schema without uniqueItems is the grammar (before: llama.cpp's
        # converter, which drops it too but is not held to the rest), uniqueItems validated
        assert loose.status_code == 200 and loose.headers["x-localllm-structured"] == "relaxed"
    (sent,) = upstream_chats(env)  # the refused request never reached the model
    relaxed = relax(schema, open_objects=False)
    assert relaxed is not None and sent["grammar"] == relaxed.compiled.grammar and "response_format" not in sent


def test_a_non_strict_tool_the_compiler_refuses_holds_its_arguments_to_the_relaxed_parameters(
    make_service: Factory, env: dict[str, Path]
) -> None:
    tool = {"type": "function", "function": {"name": "tag", "parameters": TAGGED}}  # unique tags, n in 1..9
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", tools=[tool], tool_choice="required")
        assert answer.status_code == 200, answer.text
        (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
    (sent,) = upstream_chats(env)
    grammar = Grammar.parse(sent["grammar"])
    # before: any object as the arguments ({"n": "x"} and {} admitted)
    assert grammar.matches('{"tool_calls":[{"name":"tag","arguments":{"tags":["a"],"n":3}}]}')
    assert not grammar.matches('{"tool_calls":[{"name":"tag","arguments":{"tags":["a"],"n":10}}]}')
    assert not grammar.matches('{"tool_calls":[{"name":"tag","arguments":{}}]}')
    assert grammar.matches('{"tool_calls":[{"name":"tag","arguments":{"tags":["a","a"],"n":3}}]}')  # validated
    assert set(json.loads(call["function"]["arguments"])) == {"tags", "n"}


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "schema": SCHEMA},  # the json_schema wrapper missing
        {"type": "json_schema", "json_schema": {"schema": SCHEMA}},  # no name
        {"type": "xml"},
        "json",
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
    ],
)
def test_malformed_response_format_is_a_400(make_service: Factory, response_format: Any) -> None:
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", response_format=response_format)
    assert answer.status_code == 400 and answer.json()["error"]["param"].startswith("response_format")


@pytest.mark.parametrize("content", ['{"city": "Oslo", "days": 99}', '{"city": "Os'])
def test_a_strict_answer_that_fails_validation_is_never_a_200(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", content)  # the model ignores the grammar
    service = make_service()
    with client(service) as http:
        strict = chat(http, "chat", response_format=fmt(SCHEMA))
        assert strict.status_code == 502 and strict.json()["error"]["code"] == "structured_output_invalid"
        assert strict.headers["x-localllm-validated"] == "false"
        streamed = chat(http, "chat", response_format=fmt(SCHEMA), stream=True)
        assert streamed.status_code == 502
        loose = chat(http, "chat", response_format=fmt(SCHEMA, strict=False))
        assert loose.status_code == 200 and loose.headers["x-localllm-validated"] == "false"


def test_structured_stream_is_validated_before_the_first_byte(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        body = {"model": "chat", "messages": MESSAGES, "response_format": fmt(SCHEMA), "stream": True}
        body["stream_options"] = {"include_usage": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.headers["x-localllm-validated"] == "true"
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert set(json.loads(text)) == {"city", "days"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


# -- tool calls ------------------------------------------------------------------------------
def test_tool_choice_required_answers_openai_tool_calls(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", tools=[WEATHER, TIME], tool_choice="required")
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in ("get_weather", "get_time")
    json.loads(call["function"]["arguments"])  # a JSON string, as OpenAI sends it
    assert answer.headers["x-localllm-structured"] == "compiled" and answer.headers["x-localllm-validated"] == "true"
    sent = upstream_chats(env)[0]
    assert "tools" not in sent and "tool_choice" not in sent and "grammar" in sent
    assert sent["messages"][0]["role"] == "system" and "get_weather" in sent["messages"][0]["content"]


def test_named_tool_choice_and_schema_valid_arguments(make_service: Factory) -> None:
    service = make_service()
    named = {"type": "function", "function": {"name": "get_time"}}
    with client(service) as http:
        answer = chat(http, "chat", tools=[WEATHER, TIME], tool_choice=named)
        (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_time"
        assert json.loads(call["function"]["arguments"])["tz"] in ("UTC", "CET")
        unknown = chat(http, "chat", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"


def test_tool_choice_auto_admits_a_reply(make_service: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"content": "It is sunny."}')
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", tools=[WEATHER], tool_choice="auto")
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"] == "It is sunny." and choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]


def test_parallel_tool_calls_and_invalid_strict_arguments(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    two = {
        "tool_calls": [
            {"name": "get_time", "arguments": {"tz": "UTC"}},
            {"name": "get_time", "arguments": {"tz": "CET"}},
        ]
    }
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", json.dumps(two))
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", tools=[TIME], tool_choice="required")
        calls = answer.json()["choices"][0]["message"]["tool_calls"]
        assert [json.loads(c["function"]["arguments"])["tz"] for c in calls] == ["UTC", "CET"]
        assert len({c["id"] for c in calls}) == 2
    monkeypatch.setenv(
        "FAKE_LLAMA_CONTENT", json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": 1}}]})
    )
    service.close()
    again = make_service()
    with client(again) as http:
        bad = chat(http, "chat", tools=[WEATHER], tool_choice="required")
    assert bad.status_code == 502  # strict tool: arguments that break its schema are never a 200


def test_tool_calls_stream_as_deltas(make_service: Factory) -> None:
    service = make_service()
    body = {"model": "chat", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required", "stream": True}
    with client(service) as http, http.stream("POST", "/v1/chat/completions", json=body) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert set(json.loads("".join(tc["function"]["arguments"] for tc in calls))) == {"city", "days"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_history_is_rendered_as_text(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    history = [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo","days":1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    with client(service) as http:
        answer = http.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": history, "tools": [WEATHER], "tool_choice": "auto"},
        )
    assert answer.status_code == 200
    roles = [m["role"] for m in upstream_chats(env)[0]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert "sunny" in upstream_chats(env)[0]["messages"][-1]["content"]


# -- checks and caps ---------------------------------------------------------------------------
def test_a_pattern_validation_could_stall_on_is_a_400_before_the_model(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # a backreference has no linear-time match: re would decide it, and re can backtrack for
    # minutes on one near-miss answer, freezing the service (localllm.grammar.pattern)
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": r"^(\w+)-\1$"}}}
    service = make_service()
    with client(service) as http:
        for strict in (True, False):
            refused = chat(http, "chat", response_format=fmt(schema, strict=strict))
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_schema", "response_format.json_schema.schema")
            assert "$.properties.x.pattern" in error["message"] and "backreference" in error["message"]
        fine = chat(http, "chat", response_format=fmt({"type": "object", "properties": {"x": {"pattern": "^(a+)+$"}}}))
        assert fine.status_code == 200, fine.text
    assert len(upstream_chats(env)) == 1  # only the answerable one reached the model


def test_subschemas_that_fan_out_past_the_check_budget_are_a_400_before_the_model(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # 16 $defs that each allOf the next twice: 262,142 applications to check one wrong answer
    # (one more level doubles it: 20 levels took 34 s, every later one twice that), compiled in ms
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(16)}
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": {**defs, "d16": {}}}
    service = make_service()
    with client(service) as http:
        for extra, param in (
            ({"response_format": fmt(schema)}, "response_format.json_schema.schema"),
            (
                {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]},
                "tools[0].function.parameters",
            ),
        ):
            refused = http.post(
                "/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], **extra}
            )
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_schema", param)
            assert "at $.properties.x:" in error["message"]
    assert upstream_chats(env) == []


def _tool(i: int, properties: int = 1) -> dict[str, Any]:
    params = {"type": "object", "properties": {f"a{j}": {"type": "string"} for j in range(properties)}}
    return {"type": "function", "function": {"name": f"t{i}", "parameters": params}}


def test_schemas_past_their_size_and_tools_past_their_count_are_400s_before_the_model(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # checking and compiling schemas takes time in proportion to their size: 500 tools of
    # 200 properties (2.8 MB) took 45 s, and 65 tools got a 400 blaming response_format
    big = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12_000)}}
    service = make_service()
    with client(service) as http:
        for extra, param, code in (
            ({"response_format": fmt(big, strict=False)}, "response_format", "schema_too_large"),
            ({"json_schema": big}, "json_schema", "schema_too_large"),
            ({"tools": [_tool(i, 3_000) for i in range(4)]}, "tools", "schema_too_large"),
            ({"tools": [_tool(i) for i in range(65)]}, "tools", "too_many_tools"),
        ):
            refused = chat(http, "chat", **extra)
            assert refused.status_code == 400, (param, code, refused.text)
            assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (code, param)
        called = chat(http, "chat", tools=[_tool(i) for i in range(64)], tool_choice="required")
        assert called.status_code == 200, called.text
        assert called.json()["choices"][0]["message"]["tool_calls"]
    assert len(upstream_chats(env)) == 1  # only the 64 tools reached the model


def test_a_schema_is_prepared_off_the_event_loop(make_service: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    # a schema that takes seconds to check and compile held the event loop: every client waited
    from localllm.service import chat as chat_module

    real, entered, release = chat_module.prepare, threading.Event(), threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(20)  # stands for a schema that takes this long
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "prepare", slow)
    service = make_service()
    answered: list[httpx.Response] = []
    with client(service) as http, client(service) as other:
        worker = threading.Thread(target=lambda: answered.append(chat(http, "chat", response_format=fmt(SCHEMA))))
        worker.start()
        try:
            assert entered.wait(10)
            models = other.get("/v1/models", timeout=5)  # on a held loop: a ReadTimeout
            assert models.status_code == 200 and not answered
        finally:
            release.set()
            worker.join()
    assert answered[0].status_code == 200, answered[0].text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # the pinned llama-server: 8 GB for a window of 10^9 tokens (kept after the request)
        ({"dry_multiplier": 1, "dry_penalty_last_n": 10**9}, "dry_penalty_last_n"),
        ({"dry_penalty_last_n": (1 << 20) + 1}, "dry_penalty_last_n"),
        # each breaker matched against the whole vocabulary as the request starts: 1,000 past 60 s
        ({"dry_sequence_breakers": [f"x{i}" for i in range(1000)]}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": ["a" * (MAX_BREAKER_CHARS + 1)]}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": [5]}, "dry_sequence_breakers"),
    ],
)
def test_dry_sampler_options_that_cost_the_whole_server_are_400s(
    make_service: Factory, env: dict[str, Path], extra: dict[str, Any], param: str
) -> None:
    service = make_service()
    within = {"dry_multiplier": 1, "dry_penalty_last_n": 1 << 20, "dry_sequence_breakers": ["\n"] * MAX_BREAKERS}
    with client(service) as http:
        refused = chat(http, "chat", **extra)
        fine = chat(http, "chat", **within)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert fine.status_code == 200
    assert [body["dry_sequence_breakers"] for body in upstream_chats(env)] == [within["dry_sequence_breakers"]]


def test_a_grammar_past_the_limits_is_a_400_and_one_within_them_is_sent_as_given(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # groups nested 30,000 deep crashed llama-server (tests/e2e/test_service_front_e2e.py); a
    # repeat whose minimum passes its maximum ran it out of memory, a row of 160 optional "a"s
    # took 20 s a token (localllm.grammar.limits)
    service = make_service()
    fine = 'root ::= "yes" | "no"'
    with client(service) as http:
        for grammar in (
            "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000,
            7,
            'root ::= "a"{1,0}',
            'root ::= ("a"?){160}',
        ):
            refused = chat(http, "chat", grammar=grammar)
            assert refused.status_code == 400, refused.text
            assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("invalid_grammar", "grammar")
        assert chat(http, "chat", grammar=fine).status_code == 200
    assert [body["grammar"] for body in upstream_chats(env)] == [fine]


def test_a_schema_whose_ref_does_not_resolve_is_a_400_and_nothing_is_fetched(
    make_service: Factory, env: dict[str, Path], schema_host: SchemaHost
) -> None:
    # jsonschema would fetch a remote $ref with urllib when the answer is validated: a client
    # (or a web page) could make the service request any URL on its network
    remote = {"type": "object", "properties": {"a": {"$ref": schema_host.url}}}
    dangling = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    service = make_service()
    with client(service) as http:
        for schema, strict in ((remote, True), (remote, False), (dangling, True), (dangling, False)):
            refused = chat(http, "chat", response_format=fmt(schema, strict=strict))
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_schema", "response_format.json_schema.schema")
            assert "$.properties.a.$ref" in error["message"]
        tool = {"type": "function", "function": {"name": "f", "parameters": remote}}
        refused = chat(http, "chat", tools=[tool], tool_choice="auto")
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, "tools[0].function.parameters")
        fine = chat(http, "chat", response_format=fmt({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}))
        assert fine.status_code == 200, fine.text
    assert schema_host.hits == []
    assert len(upstream_chats(env)) == 1  # only the answerable one reached the model


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"temperature": 5}, "temperature"),
        ({"top_p": -1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": "two"}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stop": 3}, "stop"),
        ({"keep_alive": "soon"}, "keep_alive"),
        # llama-server's 500s: a type error, "Unknown reasoning format"
        ({"reasoning_format": 5}, "reasoning_format"),
        ({"reasoning_format": "DeepSeek"}, "reasoning_format"),
        # llama-server's 400 without param, after loading the model
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": 0, "logprobs": False}, "top_logprobs"),
        # the pinned llama-server's 400s without param: penalty_repeat "greater than 0", a
        # window's "0 <= value"
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": -1}, "repeat_last_n"),
        ({"dry_penalty_last_n": -1}, "dry_penalty_last_n"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_bad_fields_are_400s(make_service: Factory, extra: dict[str, Any], param: str) -> None:
    service = make_service()
    with client(service) as http:
        answer = http.post("/v1/chat/completions", json={"model": "chat", "messages": MESSAGES, **extra})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_null_options_are_the_defaults() -> None:
    from localllm.service.chat import prepare

    nulls = dict.fromkeys(("n", "n_probs", "top_logprobs", "temperature", "seed", "reasoning_format"))
    body = prepare({"messages": MESSAGES, "max_tokens": 4, **nulls}, "chat").body
    assert not set(nulls) & set(body)  # not sent: llama-server's reasoning_format null is a 500
    kept = prepare({"messages": MESSAGES, "n": 9, "reasoning_format": "none"}, "chat").body
    assert (kept["n"], kept["reasoning_format"]) == (ChatLimits().max_n, "none")


def test_null_message_fields_are_absent() -> None:
    from localllm.service.chat import prepare

    # llama-server answered each null with a 500 ("type must be string, but is null")
    nulls = {"name": None, "tool_call_id": None, "reasoning_content": None, "tool_calls": None}
    given = [{"role": "user", "content": "hi", **nulls}, {"role": "assistant", "content": None, **nulls}]
    sent = prepare({"messages": [*given, {"role": "user", "content": "go"}]}, "chat").body["messages"]
    assert [sorted(m) for m in sent] == [["content", "role"], ["content", "role"], ["content", "role"]]


def test_nan_and_overflowing_numbers_are_400s(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        for raw in (
            b'{"model": "chat", "messages": [], "temperature": NaN}',
            b'{"model": "chat", "temperature": 1e999}',
            # an integer no double holds: llama-server's parser fails on it with a 500
            b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "user": 1' + b"0" * 400 + b"}",
        ):
            answer = http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, raw


# -- client errors llama-server would answer with a 500 (clients retry those) --------------
@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ({"role": "user", "content": "hi", "name": 5}, "messages[0].name", "invalid_request_error"),
        # a role that is an array or an object was the service's own 500 (TypeError: unhashable)
        ({"role": ["user"], "content": "hi"}, "messages[0].role", "invalid_request_error"),
        ({"role": {"user": 1}, "content": "hi"}, "messages[0].role", "invalid_request_error"),
        (
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]},
            "messages[0].content[1]",
            "unsupported_content",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            "messages[0].content[0]",
            "unsupported_content",
        ),
        ({"role": "user", "content": ["hi"]}, "messages[0].content[0]", "unsupported_content"),
        (
            {"role": "user", "content": [{"type": "text", "text": 5}]},
            "messages[0].content[0].text",
            "invalid_request_error",
        ),
        # the service's own AttributeError (a 500) for a function that is not an object
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": "x"}]},
            "messages[0].tool_calls[0].function",
            "invalid_request_error",
        ),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": None}]},
            "messages[0].tool_calls[0].function",
            "invalid_request_error",
        ),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": 5}}]},
            "messages[0].tool_calls[0].function.name",
            "invalid_request_error",
        ),
        ({"role": "assistant", "tool_calls": 5}, "messages[0].tool_calls", "invalid_request_error"),
        ({"role": "user", "content": "hi", "tool_calls": 5}, "messages[0].tool_calls", "invalid_request_error"),
        (
            {"role": "assistant", "content": "x", "reasoning_content": 5},
            "messages[0].reasoning_content",
            "invalid_request_error",
        ),
        (
            {"role": "user", "content": "hi", "tool_call_id": {"a": 1}},
            "messages[0].tool_call_id",
            "invalid_request_error",
        ),
    ],
)
def test_messages_llama_server_cannot_read_are_400s_that_never_reach_it(
    make_service: Factory, env: dict[str, Path], message: dict[str, Any], param: str, code: str
) -> None:
    service = make_service()
    with client(service) as http:
        refused = http.post("/v1/chat/completions", json={"model": "chat", "messages": [message]})
        fine = chat(
            http, "chat", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"}]
        )
    assert refused.status_code == 400, refused.text
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (param, code)
    assert fine.status_code == 200
    assert len(upstream_chats(env)) == 1  # only the readable one was sent


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800 hi"}]}', "messages[0].content"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "\\udc00"]}',
            "stop[1]",
        ),
        ("/tokenize", '{"content": "\\ud800"}', "content"),
        ("/v1/embeddings", '{"input": ["ok", "\\uDFFF"]}', "input[1]"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    make_service: Factory, env: dict[str, Path], path: str, body: str, param: str
) -> None:
    service = make_service()
    raw = json.dumps({"model": "chat" if path != "/v1/embeddings" else "e", **json.loads(body)})
    with client(service) as http:
        refused = http.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})
        pair = http.post(  # an escaped pair is one character, and fine
            "/v1/chat/completions",
            content=b'{"model": "chat", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
            headers={"Content-Type": "application/json"},
        )
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, param), refused.text
    assert pair.status_code == 200
    assert len(upstream_chats(env)) == 1


def test_tokenize_ids_that_are_no_token_are_400s_naming_them(make_service: Factory) -> None:
    from localllm.service.chat import vocab_refusal

    service = make_service()
    with client(service) as http:
        negative = http.post("/tokenize", json={"model": "chat", "content": ["a", -5], "with_pieces": True})
    assert negative.status_code == 400, negative.text
    assert (negative.json()["error"]["param"], negative.json()["error"]["code"]) == ("content[1]", "invalid_token")
    # llama-server's 500 for an id past n_vocab with with_pieces becomes this 400
    models = {"data": [{"meta": {"n_vocab": 100}}]}
    refused = vocab_refusal(["a", 7, "b", 100], models, "content")
    assert refused is not None and (refused.param, refused.code) == ("content[3]", "invalid_token")
    assert vocab_refusal(["a", 99], models, "content") is None


def test_n_is_capped_at_the_model_slots(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()  # "chat" runs with parallel 2
    with client(service) as http:
        assert chat(http, "chat", n=3).status_code == 200
    assert upstream_chats(env)[0]["n"] == 2


def test_a_model_asked_for_the_other_role_is_a_400_without_loading_it(
    make_service: Factory, env: dict[str, Path]
) -> None:
    service = make_service()
    with client(service) as http:
        as_chat = chat(http, "all-minilm-l6-v2-f16")
        as_embedder = http.post("/v1/embeddings", json={"model": "chat", "input": "x"})
    for answer, route in ((as_chat, "/v1/embeddings"), (as_embedder, "/v1/chat/completions")):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["param"], error["code"]) == ("model", "model_role_mismatch") and route in error["message"]
    assert rows(env["spawn"], "start") == []  # neither model was loaded for nothing


def _behave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *responses: dict[str, Any]) -> None:
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(path))


def test_a_schema_the_converter_fails_on_is_a_400_not_its_500(
    make_service: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what the pinned llama-server answers mid-generation when its converter's grammar admits no value
    empty_stack = {"status": 500, "message": "got exception: Unexpected empty grammar stack after accepting piece: x"}
    # the first answer goes to the grammar canary sent at every server start
    _behave(tmp_path, monkeypatch, {}, empty_stack, {"status": 500, "message": "out of memory"})
    # the compiler refuses multipleOf 0.75 (digits past MAX_STEP): a strict request goes to the converter
    refused_by_ours = {"type": "number", "multipleOf": 0.75}
    service = make_service()
    with client(service) as http:
        refused = chat(http, "chat", response_format=fmt(refused_by_ours))
        other = chat(http, "chat", response_format=fmt(refused_by_ours))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("response_format.json_schema.schema", "unsupported_schema")
    assert "empty grammar stack" in error["message"] and "multipleOf" in error["message"]
    assert other.status_code == 500  # not about the schema: relayed as it is


@pytest.mark.parametrize(
    "unsat",
    [
        {"type": "integer", "minimum": 5, "maximum": 1},
        # bounds llama.cpp's converter reads as int64: -0.0 as 0 (its grammar admits no value), a
        # bound past int64 not at all (its grammar admits 1, 10, …: a strict answer failed with a 502)
        {"type": "integer", "minimum": 1, "maximum": -0.0},
        {
            "type": "object",
            "properties": {"d": {"type": "integer", "minimum": 1, "maximum": -(2**70)}},
            "required": ["d"],
        },
    ],
)
def test_a_schema_no_value_meets_is_a_400_before_any_model_is_asked(
    make_service: Factory, env: dict[str, Path], unsat: dict[str, Any]
) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": unsat}}}}
    tool["function"]["parameters"]["required"] = ["x"]  # type: ignore[index]
    service = make_service()
    with client(service) as http:
        answers = {
            "response_format.json_schema.schema": chat(http, "chat", response_format=fmt(unsat)),
            "response_format.json_schema.schema ": chat(http, "chat", response_format=fmt(unsat, strict=False)),
            "json_schema": chat(http, "chat", json_schema=unsat),
            "tools[0].function.parameters": chat(http, "chat", tools=[tool]),
        }
    for param, answer in answers.items():
        assert answer.status_code == 400, (param, answer.text)
        error = answer.json()["error"]
        assert (error["param"], error["code"]) == (param.strip(), "unsatisfiable_schema")
    assert rows(env["spawn"], "start") == []  # no model loaded to find out


@pytest.mark.parametrize(
    "bound",
    [
        {"minimum": 9_999_999_999_999_999},  # one-sided, 16 digits: the converter writes [0-9]{16,15}
        {"minimum": 2**63, "maximum": 2**63 + 9},  # past int64: read as -2^63 …
        {"minimum": 1 - 2**63, "maximum": -(2**62)},  # negated to 2^63 - 1: one-sided again
    ],
)
def test_a_schema_the_converter_would_run_llama_server_out_of_memory_with_never_reaches_it(
    make_service: Factory, env: dict[str, Path], bound: dict[str, int]
) -> None:
    # not strict, refused by the compiler (a ref that recurses in place) and not relaxable: such a
    # schema goes to llama.cpp's converter, and these bounds made the pinned llama-server allocate
    # 4.6 GB in 15 s, and on (measured in a child under RLIMIT_AS)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", **bound}, "m": {"$ref": "#/properties/m"}},
    }
    service = make_service()
    with client(service) as http:
        refused = chat(http, "chat", response_format=fmt(schema, strict=False))
        raw = chat(http, "chat", json_schema=schema)
        fine = chat(http, "chat", response_format=fmt({**schema, "properties": {"n": {"type": "integer"}}}, False))
    for answer, param in ((refused, "response_format.json_schema.schema"), (raw, "json_schema")):
        assert answer.status_code == 400, answer.text
        assert (answer.json()["error"]["param"], answer.json()["error"]["code"]) == (param, "unsupported_schema")
        assert "out of memory" in answer.json()["error"]["message"] or "memory without end" in answer.text
    assert fine.status_code == 200
    assert len(upstream_chats(env)) == 1  # only the bounded one was sent


def test_llama_cpp_json_schema_field_is_compiled_and_validated_like_response_format(
    make_service: Factory, env: dict[str, Path]
) -> None:
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", json_schema=SCHEMA)
        both = chat(http, "chat", json_schema=SCHEMA, response_format=fmt(SCHEMA))
        bad = chat(http, "chat", json_schema={"type": "objekt"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-localllm-structured"] == "compiled" and answer.headers["x-localllm-validated"] == "true"
    assert set(json.loads(answer.json()["choices"][0]["message"]["content"])) == {"city", "days"}
    assert both.status_code == 400 and both.json()["error"]["param"] == "json_schema"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "json_schema"
    (sent,) = upstream_chats(env)
    assert "json_schema" not in sent and sent["grammar"].startswith("root ::=")


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"input": 5}, "input", "invalid_request_error"),
        ({"input": {"a": 1}}, "input", "invalid_request_error"),
        ({"input": []}, "input", "invalid_request_error"),
        ({"input": [True]}, "input", "invalid_request_error"),
        ({"input": [[["x"]]]}, "input", "invalid_request_error"),
        ({"input": "x", "dimensions": "8"}, "dimensions", "invalid_request_error"),
        ({"input": "x", "dimensions": 0}, "dimensions", "invalid_request_error"),
        ({"input": "x", "dimensions": 8}, "dimensions", "unsupported_dimensions"),
        ({"input": "x", "dimensions": 8, "encoding_format": "base64"}, "dimensions", "unsupported_dimensions"),
        ({"input": "x", "encoding_format": 5}, "encoding_format", "invalid_request_error"),
        ({"input": "x", "encoding_format": "FLOAT"}, "encoding_format", "invalid_request_error"),
        ({"input": "x", "embd_normalize": "2"}, "embd_normalize", "invalid_request_error"),
        ({"input": "x", "embd_normalize": -2}, "embd_normalize", "invalid_request_error"),
        ({"input": "x", "content": "y"}, "content", "invalid_request_error"),
        ({"content": 5}, "content", "invalid_request_error"),  # the field the client sent
    ],
)
def test_embedding_inputs_and_dimensions_llama_server_cannot_honour_are_400s(
    make_service: Factory, extra: dict[str, Any], param: str, code: str
) -> None:
    service = make_service()
    with client(service) as http:
        refused = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", **extra})
    assert refused.status_code == 400, refused.text
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (param, code)


@pytest.mark.parametrize(
    "extra",
    [
        {"input": ["a", [1, 2]]},
        {"input": "x", "dimensions": 384},
        {"input": "x", "dimensions": None, "encoding_format": None, "embd_normalize": None, "user": None},
        {"input": "x", "embd_normalize": 2},
        # llama-server's own name: sent as input, which it answers in OpenAI's shape (given
        # content, in its own, whose vectors no dimensions check could read)
        {"content": ["a", "b"], "dimensions": 384},
    ],
)
def test_embedding_shapes_llama_server_takes_pass(
    make_service: Factory, env: dict[str, Path], extra: dict[str, Any]
) -> None:
    service = make_service()
    with client(service) as http:
        answer = http.post(
            "/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", "encoding_format": "base64", **extra}
        )
    assert answer.status_code == 200, answer.text
    asked = {"model": "all-minilm-l6-v2-f16", "encoding_format": "base64", **extra}
    if "content" in asked:
        asked["input"] = asked.pop("content")
    (sent,) = [r["body"] for r in rows(env["requests"]) if r["path"] == "/v1/embeddings"]
    assert sent == {k: v for k, v in asked.items() if v is not None}  # null is the default: not sent


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": [{"a": 1}]}, "content"),
        ("/tokenize", {}, "content"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [1.5]}, "tokens"),
    ],
)
def test_tokenize_bodies_llama_server_cannot_read_are_400s(
    make_service: Factory, env: dict[str, Path], path: str, extra: dict[str, Any], param: str
) -> None:
    service = make_service()
    with client(service) as http:
        refused = http.post(path, json={"model": "chat", **extra})
        fine = http.post("/tokenize", json={"model": "chat", "content": ["a", 7]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert fine.status_code == 200
    # only the well-formed one reached it
    assert [r["path"] for r in rows(env["requests"]) if r["method"] == "POST" and "tokenize" in r["path"]] == [
        "/tokenize"
    ]


def test_a_detokenize_id_outside_the_vocabulary_is_a_400_naming_it(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        refused = http.post("/detokenize", json={"model": "chat", "tokens": [5, 32000, 32001, 7]})
        fine = http.post("/detokenize", json={"model": "chat", "tokens": [5, 32000]})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("tokens[2]", "invalid_token") and "32001 tokens" in error["message"]
    assert (fine.status_code, fine.json()) == (200, {"content": "<5><32000>"})


def test_costs_are_capped_and_the_served_id_answers(make_service: Factory, env: dict[str, Path]) -> None:
    limits = FrontLimits(chat=ChatLimits(max_tokens=64, max_n=2, max_logprobs=5))
    service = make_service(limits=limits)
    with client(service) as http:
        capped = chat(
            http, "chat", n_probs=1_000_000, logprobs=True, top_logprobs=20, n=9, n_predict=2**31, max_tokens=2
        )
        assert capped.status_code == 200 and capped.json()["model"] == "chat"
        chat(http, "chat")
    first, second = upstream_chats(env)[:2]
    assert first["max_tokens"] == 2 and "n_predict" not in first
    assert (first["n_probs"], first["top_logprobs"], first["n"]) == (5, 5, 2)
    assert second["max_tokens"] == 64  # the default ceiling
    start = next(r for r in rows(env["spawn"], "start") if any(a.endswith("chat.gguf") for a in r["argv"]))
    assert start["argv"][start["argv"].index("--alias") + 1] == "chat"


def test_models_retrieve(make_service: Factory) -> None:
    service = make_service()
    with client(service) as http:
        one = http.get("/v1/models/chat")
        assert one.status_code == 200 and one.json()["id"] == "chat" and one.json()["object"] == "model"
        missing = http.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_request_keep_alive_zero_unloads_after_the_answer(make_service: Factory) -> None:
    service = make_service(keep_alive=-1)
    with client(service) as http:
        assert chat(http, "chat").status_code == 200
        assert chat(http, "other", keep_alive=0).status_code == 200
        loaded = eventually(lambda: [m["id"] for m in http.get("/localllm/ps").json()["models"]] == ["chat"])
        assert loaded
        assert chat(http, "chat", keep_alive="200ms").status_code == 200
        assert eventually(lambda: http.get("/localllm/ps").json()["models"] == [], within=4.0)


# -- the front's limits ----------------------------------------------------------------------
def test_chunked_body_is_read(make_service: Factory) -> None:
    service = make_service()
    body = json.dumps({"model": "chat", "messages": MESSAGES}).encode()

    def parts() -> Iterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    with client(service) as http:
        answer = http.post("/v1/chat/completions", content=parts(), headers={"Content-Type": "application/json"})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert http.get("/v1/models").status_code == 200  # the connection is still in step


def test_deep_and_oversized_bodies_are_4xx(make_service: Factory) -> None:
    service = make_service(limits=FrontLimits(max_body=1 << 20))
    with client(service) as http:
        deep = http.post(
            "/v1/embeddings", content=b"[" * 100_000 + b"]" * 100_000, headers={"Content-Type": "application/json"}
        )
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "too_deep"
        nested: Any = "x"
        for _ in range(300):
            nested = [nested]
        assert http.post("/v1/embeddings", json={"model": "chat", "input": nested}).status_code == 400
        big = http.post("/v1/embeddings", content=b" " * (2 << 20), headers={"Content-Type": "application/json"})
        assert big.status_code == 413
    with client(service) as http:
        assert http.get("/v1/models").status_code == 200


def test_header_timeout_and_connection_cap(make_service: Factory) -> None:
    service = make_service(limits=FrontLimits(header_timeout=0.5, max_connections=20))
    slow = socket.create_connection(("127.0.0.1", service.port))
    slow.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
    slow.settimeout(5)
    started = time.monotonic()
    assert slow.recv(1024) == b""  # closed by the service
    assert time.monotonic() - started < 3
    slow.close()
    idle = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(20)]
    try:
        extra = socket.create_connection(("127.0.0.1", service.port))
        extra.settimeout(5)
        assert extra.recv(1024).startswith(b"HTTP/1.1 503")
        extra.close()
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    with client(service) as http:
        assert http.get("/v1/models").status_code == 200


def test_a_full_queue_is_a_503_with_retry_after(make_service: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "1.5")
    service = make_service(limits=FrontLimits(max_queue=1))
    with client(service) as http:
        chat(http, "chat")  # loaded
        results: list[int] = []
        first = threading.Thread(target=lambda: results.append(chat(http, "chat").status_code))
        first.start()
        time.sleep(0.5)
        second = chat(http, "chat")
        first.join()
    assert second.status_code == 503 and second.headers["retry-after"] == "1" and results == [200]


def test_half_open_connections_hang_up_without_tracebacks(
    make_service: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    service = make_service()
    with caplog.at_level(logging.INFO):
        socks = [socket.create_connection(("127.0.0.1", service.port)) for _ in range(200)]
        for s in socks[:100]:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with client(service) as http:
            assert http.get("/v1/models").status_code == 200
        for s in socks:
            s.close()
        time.sleep(0.3)
        with client(service) as http:
            started = time.monotonic()
            assert http.get("/v1/models").status_code == 200
            assert time.monotonic() - started < 1.0
    assert not any(r.exc_info for r in caplog.records)
    assert not any("Traceback" in r.getMessage() for r in caplog.records)


def test_a_client_that_leaves_frees_its_slot(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_DELAY", "4")  # answers only; start-up is not delayed
    service = make_service()
    headers = {"Authorization": f"Bearer {service.token}"}
    with client(service) as http:  # load it (tokenize is not delayed)
        assert http.post("/tokenize", json={"model": "chat", "content": "x"}).status_code == 200
    with caplog.at_level(logging.INFO, logger="localllm.service"):
        with httpx.Client(base_url=service.url, headers=headers, trust_env=False, timeout=1.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                chat(impatient, "chat")
            left = time.monotonic()
        with client(service) as http:

            def busy() -> Any:
                models = http.get("/localllm/ps").json()["models"]
                return next((m["slots_busy"] for m in models if m["id"] == "chat"), None)

            assert eventually(lambda: busy() == 0, within=1.5)
            assert time.monotonic() - left < 2.0  # freed long before the fake's 4 s answer
        assert eventually(lambda: [r for r in caplog.records if "status=499" in r.getMessage()])
    assert not any(r.exc_info for r in caplog.records)


def test_import_and_help_do_not_load_the_http_front() -> None:
    import subprocess
    import sys

    code = (
        "import sys, contextlib, io\n"
        "import localllm\n"
        "from localllm.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['serve', '--help'])\n"
        "print(sorted(m for m in ('uvicorn', 'h11', 'asyncio', 'localllm.service.api') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "uvicorn" not in out.stdout and "h11" not in out.stdout and "localllm.service.api" not in out.stdout


def test_strict_schema_the_converter_enforces_goes_to_the_converter(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the compiler refuses multipleOf 0.75 (digits past MAX_STEP); llama.cpp's converter enforces
    # the structure (the value constraint is validation's): a strict request is served and
    # validated, not refused
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.75}}, "required": ["x"]}
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"x": 1.5}')
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", response_format=fmt(schema))
        assert answer.status_code == 200 and answer.headers["x-localllm-structured"] == "converter"
        assert answer.headers["x-localllm-validated"] == "true"
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"x": 1.3}')
    service.close()
    with client(make_service()) as http:
        assert chat(http, "chat", response_format=fmt(schema)).status_code == 502  # validation caught it


@pytest.mark.parametrize(
    ("asked", "structured"),
    [
        ({"response_format": fmt(SCHEMA)}, "compiled"),
        ({"response_format": fmt(TAGGED, strict=False)}, "relaxed"),  # unique strings: relaxed
        ({"tools": [WEATHER, {"type": "function", "function": {"name": "tag", "parameters": TAGGED}}]}, "compiled"),
    ],
)
def test_a_schema_sent_again_is_not_compiled_again(
    monkeypatch: pytest.MonkeyPatch, asked: dict[str, Any], structured: str
) -> None:
    # clients send the same response_format and tools with every request; a 56 KB GitHub
    # schema took 6.6 s to compile each time (and twice the first time, relax compiling it
    # again, past its budget: the converter instead of the relaxed grammar)
    from localllm.grammar import compile as compile_module
    from localllm.service.chat import prepare

    compiled: list[str] = []
    real = compile_module._Compiler.run

    def run(self: Any) -> Any:
        compiled.append(json.dumps([self.root, self.comma, self.open_objects]))
        return real(self)

    monkeypatch.setattr(compile_module._Compiler, "run", run)
    marker = {"description": f"{time.time_ns()}"}  # a schema no earlier test compiled
    asked = json.loads(json.dumps(asked))  # the marker added to copies only
    for schema in [asked.get("response_format", {}).get("json_schema", {}).get("schema")] + [
        t["function"]["parameters"] for t in asked.get("tools", [])
    ]:
        if schema is not None:
            schema.update(marker)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **asked}
    first = prepare(json.loads(json.dumps(body)), "chat")
    once = list(compiled)
    again = prepare(json.loads(json.dumps(body)), "chat")  # equal, not the same objects
    assert first.structured == again.structured == structured and again.body == first.body
    assert len(once) == len(set(once))  # no schema compiled twice on the first request either
    assert compiled == once  # and nothing compiled on the second


class Held:
    """Compiles of schemas whose description starts with ``held`` wait for :meth:`release`
    (a large schema's compile takes seconds); each one entered is noted in ``entered``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from localllm.grammar import compile as compile_module

        self.tag = f"held {time.time_ns()}"  # schemas no earlier test compiled
        self.entered: list[str] = []
        self._release = threading.Event()
        real = compile_module.compile_schema

        def compile_schema(schema: Any, **options: Any) -> Any:
            note = schema.get("description") if isinstance(schema, dict) else None
            if isinstance(note, str) and note.startswith(self.tag):
                self.entered.append(note)
                self._release.wait(30)
            return real(schema, **options)

        monkeypatch.setattr(compile_module, "compile_schema", compile_schema)

    def schema(self, name: str = "") -> dict[str, Any]:
        return {**SCHEMA, "description": f"{self.tag} {name}"}

    def release(self) -> None:
        self._release.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    made = Held(monkeypatch)
    yield made
    made.release()


def _post_in_thread(service: Any, body: dict[str, Any], got: list[Any], timeout: float = 30.0) -> threading.Thread:
    def post() -> None:
        with client(service) as http:
            http.timeout = httpx.Timeout(timeout)
            try:
                got.append(http.post("/v1/chat/completions", json=body).status_code)
            except httpx.TimeoutException as exc:
                got.append(type(exc).__name__)

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_a_schema_sent_before_does_not_wait_behind_other_clients_compiles(make_service: Factory, held: Held) -> None:
    # each new schema's compile held a thread of asyncio's default pool (min(32, cores + 4)
    # threads); six clients sending new large schemas held them all, and a request whose
    # schema was compiled long ago waited 50 s behind them
    service = make_service()
    kept = {"model": "chat", "messages": MESSAGES, "response_format": fmt(SCHEMA)}
    with client(service) as http:
        assert http.post("/v1/chat/completions", json=kept).status_code == 200  # compiled and kept
        got: list[Any] = []
        slow = [_post_in_thread(service, {**kept, "response_format": fmt(held.schema(str(i)))}, got) for i in range(33)]
        eventually(lambda: len(held.entered) == 33, within=10)
        http.timeout = httpx.Timeout(10.0)
        assert http.post("/v1/chat/completions", json=kept).status_code == 200
        assert got == []  # the 33 are still compiling
        held.release()
        for t in slow:
            t.join()
    assert got == [200] * 33 and len(held.entered) == 33


def test_requests_sending_one_new_schema_at_once_compile_it_once(make_service: Factory, held: Held) -> None:
    service = make_service()
    body = {"model": "chat", "messages": MESSAGES, "response_format": fmt(held.schema())}
    with client(service) as http:
        got: list[Any] = []
        threads = [_post_in_thread(service, body, got) for _ in range(6)]

        def in_flight() -> float:
            line = next(
                x for x in http.get("/metrics").text.splitlines() if x.startswith("localllm_requests_in_flight")
            )
            return float(line.split()[-1])

        assert eventually(lambda: in_flight() == 6, within=10)  # all six arrived, waiting for one compile
        held.release()
        for t in threads:
            t.join()
    assert got == [200] * 6 and len(held.entered) == 1


def test_requests_being_prepared_count_in_the_queue(make_service: Factory, held: Held) -> None:
    service = make_service(limits=FrontLimits(max_queue=1))
    with client(service) as http:
        assert chat(http, "chat").status_code == 200  # loaded
        got: list[Any] = []
        first = _post_in_thread(
            service, {"model": "chat", "messages": MESSAGES, "response_format": fmt(held.schema())}, got
        )
        assert eventually(lambda: held.entered)
        second = chat(http, "chat")
        held.release()
        first.join()
    assert second.status_code == 503 and second.json()["error"]["code"] == "queue_full" and got == [200]


def test_a_client_leaving_while_its_schema_compiles_is_not_answered_upstream(
    make_service: Factory, held: Held, env: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    service = make_service()
    body = {"model": "chat", "messages": MESSAGES, "response_format": fmt(held.schema())}
    with client(service) as http:
        assert chat(http, "chat").status_code == 200  # loaded
    before = len(upstream_chats(env))
    with caplog.at_level(logging.INFO, logger="localllm.service"):
        got: list[Any] = []
        _post_in_thread(service, body, got, timeout=1.0).join()
        assert got == ["ReadTimeout"]
        # noticed while the compile still runs (it cannot be stopped; its result is kept)
        assert eventually(lambda: [r for r in caplog.records if "status=499" in r.getMessage()], within=10)
        held.release()
        with client(service) as http:  # the same schema again: compiled, kept, answered
            assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert len(held.entered) == 1 and len(upstream_chats(env)) == before + 1


def test_a_compile_a_client_left_still_counts_in_the_queue(make_service: Factory, held: Held) -> None:
    # a client sending new large schemas and leaving at once, again and again, left compiles
    # running that nothing counted: past --max-queue of them, every request's prepare queued
    # behind them (a schema compiled long ago waited as it did before each had a thread)
    service = make_service(limits=FrontLimits(max_queue=1))
    with client(service) as http:
        assert chat(http, "chat").status_code == 200  # loaded
        got: list[Any] = []
        body = {"model": "chat", "messages": MESSAGES, "response_format": fmt(held.schema())}
        _post_in_thread(service, body, got, timeout=1.0).join()
        assert got == ["ReadTimeout"] and held.entered  # left; its compile runs on
        refused = chat(http, "chat")
        held.release()
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
        assert eventually(lambda: chat(http, "chat").status_code == 200)  # the compile ended: room again


def test_compile_shared_tells_schemas_apart_by_key_order() -> None:
    from localllm.grammar.compile import compile_schema, compile_shared

    forward = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    backward = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    grammars = [compile_shared(s, open_objects=False).grammar for s in (forward, backward, dict(forward))]
    assert grammars[0] != grammars[1]  # the declared order is the generated order
    assert grammars == [compile_schema(s, open_objects=False).grammar for s in (forward, backward, forward)]
    assert compile_shared(forward, open_objects=True).grammar == compile_schema(forward).grammar
    assert compile_shared(forward, space=True).grammar == compile_schema(forward, space=True).grammar


def test_tool_choice_auto_grammar_refuses_an_empty_reply() -> None:
    # CI (stop 27): gemma answered {"content": ""} under auto, a reply that says nothing
    from localllm.grammar.walk import Grammar
    from localllm.service.chat import prepare

    asked = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    grammar = Grammar.parse(prepare({**asked, "tool_choice": "auto"}, "chat").body["grammar"])
    assert grammar.matches('{"content":"It is sunny."}')
    assert not grammar.matches('{"content":""}')


def test_open_client_objects_are_generated_closed() -> None:
    # pydantic's schemas (LangChain, instructor, pydantic-ai) leave additionalProperties out;
    # a small model given extension keys rambled extra keys until max_tokens
    from localllm.grammar.walk import Grammar
    from localllm.service.chat import prepare

    ticket = {"type": "object", "properties": {"queue": {"type": "string"}}, "required": ["queue"]}
    asked = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    structured = prepare({**asked, "response_format": fmt(ticket, strict=False)}, "chat").body["grammar"]
    tool = {"type": "function", "function": {"name": "file", "parameters": ticket}}
    called = prepare({**asked, "tools": [tool], "tool_choice": "required"}, "chat").body["grammar"]
    for grammar, closed, extra in (
        (structured, '{"queue":"billing"}', '{"queue":"billing","x":1}'),
        (
            called,
            '{"tool_calls":[{"name":"file","arguments":{"queue":"b"}}]}',
            '{"tool_calls":[{"name":"file","arguments":{"queue":"b","x":1}}]}',
        ),
    ):
        parsed = Grammar.parse(grammar)
        assert parsed.matches(closed) and not parsed.matches(extra)


@pytest.mark.parametrize(
    ("written", "text"),
    [
        ('{"content": "It is sunny in Par', "It is sunny in Par"),
        ('{ "content" : "Done."', "Done."),  # the string ended, the brace did not
        ('{"content":"caf\\u00', "caf"),  # a cut escape
        ('{"content":"a \\', "a "),
        ('{"content":"', ""),
    ],
)
def test_tool_choice_auto_reply_cut_by_max_tokens_is_the_text_so_far(written: str, text: str) -> None:
    # A long reply under tool_choice auto, cut by max_tokens, was a 502 (not complete JSON):
    # OpenAI answers the text so far with finish_reason "length", and so do we now.
    from localllm.service.chat import finish, prepare

    asked = {"model": "chat", "messages": MESSAGES, "tools": [WEATHER], "max_tokens": 8}
    answer = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": written}, "finish_reason": "length"}]
    }
    done, _ = finish(prepare({**asked, "tool_choice": "auto"}, "chat"), answer)
    (choice,) = done["choices"]
    assert choice["message"]["content"] == text and choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls")


@pytest.mark.parametrize(
    ("choice", "written", "response_format"),
    [
        ("auto", '{"content": "It is sun', fmt(SCHEMA)),  # a structured reply cut short is no reply
        ("auto", '{"tool_calls": [{"name": "get_weather", "arguments": {"ci', None),
        ("required", '{"tool_calls": [{"name": "get_weather", "arguments": {"ci', None),
        ("auto", '{"content": "It is sunny."', None),  # not cut (stop), yet incomplete: broken
    ],
)
def test_cut_calls_and_cut_structured_replies_stay_invalid(choice: str, written: str, response_format: Any) -> None:
    from localllm.service.chat import Invalid, finish, prepare

    asked: dict[str, Any] = {"model": "chat", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": choice}
    if response_format is not None:
        asked["response_format"] = response_format
    reason = "stop" if written.endswith('."') else "length"
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": written}, "finish_reason": reason}]}
    with pytest.raises(Invalid):
        finish(prepare(asked, "chat"), answer)


def test_a_structured_answer_a_stop_string_cut_says_so() -> None:
    # stop: ["{"] with a schema: the stop string fires inside the answer, which the 502 named
    # only as "not complete JSON", leaving the client to guess
    from localllm.service.chat import Invalid, finish, prepare

    asked = {"model": "chat", "messages": MESSAGES, "response_format": fmt(SCHEMA), "stop": ['"days"']}
    answer = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": '{"city": "Paris", '}, "finish_reason": "stop"}
        ]
    }
    with pytest.raises(Invalid, match="stop strings \\['\"days\"'\\]"):
        finish(prepare(asked, "chat"), answer)
    unstopped = {**asked, "stop": None}
    with pytest.raises(Invalid) as caught:  # no stop string of the request's own: nothing to blame
        finish(prepare(unstopped, "chat"), answer)
    assert "stop string" not in str(caught.value)


# -- answers a server that ignores the grammar writes ---------------------------------------
TWO_CALLS = {"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "get_time", "arguments": {}}]}


@pytest.mark.parametrize(
    ("tool_choice", "written", "extra"),
    [
        ("required", {"content": "No tool today."}, {}),  # a reply where a call is required
        ({"type": "function", "function": {"name": "get_time"}}, {"content": "UTC."}, {}),
        (
            {"type": "function", "function": {"name": "get_time"}},
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}]},
            {},
        ),
        ("required", {"tool_calls": []}, {}),  # no call at all
        ("required", {"tool_calls": 5}, {}),  # was the service's own 500 (TypeError)
        ("required", {"tool_calls": [{"name": "get_time"}]}, {}),  # no arguments
        ("required", {**TWO_CALLS, "content": "also this"}, {}),
        ("required", {"tool_calls": TWO_CALLS["tool_calls"][:1] * 2}, {"parallel_tool_calls": False}),
        ("auto", {"content": 42}, {}),  # the reply is text
        ("auto", {"content": ""}, {}),  # of at least one character
    ],
)
def test_a_tool_answer_the_grammar_does_not_admit_is_never_a_200(
    tool_choice: Any, written: dict[str, Any], extra: dict[str, Any]
) -> None:
    # A llama-server that ignores grammars (the canary's verdict false) can write anything:
    # these were 200s with X-Localllm-Validated: true (a reply under "required", [] or two
    # calls as tool_calls, the content 42 as "42"), only the arguments of calls being checked.
    from localllm.service.chat import Invalid, finish, prepare

    asked = {"model": "chat", "messages": MESSAGES, "tools": [WEATHER, TIME], "tool_choice": tool_choice, **extra}
    content = json.dumps(written)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    with pytest.raises(Invalid):
        finish(prepare(asked, "chat"), answer)


@pytest.mark.parametrize(
    ("tool_choice", "written", "response_format"),
    [
        ("auto", {"content": "Sunny."}, None),
        ("auto", {"content": {"city": "Oslo", "days": 2}}, fmt(SCHEMA)),
        ("required", TWO_CALLS, None),  # get_time's tz is required: not strict, so not validated
        ("auto", {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}]}, None),
    ],
)
def test_tool_answers_the_grammar_admits_still_answer(
    tool_choice: str, written: dict[str, Any], response_format: Any
) -> None:
    from localllm.service.chat import finish, prepare

    asked: dict[str, Any] = {
        "model": "chat",
        "messages": MESSAGES,
        "tools": [WEATHER, TIME],
        "tool_choice": tool_choice,
    }
    if response_format is not None:
        asked["response_format"] = response_format
    content = json.dumps(written)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    done, validated = finish(prepare(asked, "chat"), answer)
    message = done["choices"][0]["message"]
    if "tool_calls" in written:
        assert [c["function"]["name"] for c in message["tool_calls"]] == [c["name"] for c in written["tool_calls"]]
        assert validated is (tool_choice == "auto")  # get_time without tz: not strict, flagged
    else:
        reply = written["content"]
        assert message["content"] == (reply if isinstance(reply, str) else json.dumps(reply))
        assert validated is True


def test_a_required_tool_call_answered_with_a_reply_is_a_502(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"content": "No tool today."}')  # the grammar ignored
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", tools=[WEATHER], tool_choice="required")
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "structured_output_invalid"
    assert answer.headers["x-localllm-validated"] == "false"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "null"},
        {"anyOf": [SCHEMA, {"type": "null"}]},
        {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
    ],
)
def test_a_null_answer_a_schema_admits_is_valid(schema: dict[str, Any]) -> None:
    # json.loads("null") is None, which was taken for "not JSON": a 502 for a valid answer
    # (strict), X-Localllm-Validated: false otherwise
    from localllm.service.chat import finish, prepare

    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "null"}, "finish_reason": "stop"}]}
    for strict in (True, False):
        done, validated = finish(
            prepare({"model": "chat", "messages": MESSAGES, "response_format": fmt(schema, strict)}, "chat"),
            json.loads(json.dumps(answer)),
        )
        assert validated is True and done["choices"][0]["message"]["content"] == "null"


def test_a_null_answer_through_the_service(make_service: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", "null")
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", response_format=fmt({"anyOf": [SCHEMA, {"type": "null"}]}))
    assert answer.status_code == 200 and answer.headers["x-localllm-validated"] == "true"
    assert answer.json()["choices"][0]["message"]["content"] == "null"


@pytest.mark.parametrize("tools", [[TIME], None])
def test_parallel_tool_results_are_one_user_turn(tools: list[dict[str, Any]] | None) -> None:
    # OpenAI's flow after two parallel calls is two tool messages in a row: rendered as two
    # user turns, which a template requiring alternating turns (gemma-2-it's, measured on the
    # pinned llama-server with --jinja) refused: llama-server's 400 "Conversation roles must
    # alternate", for every follow-up of a parallel call
    from localllm.service.chat import prepare

    def call(i: str, tz: str) -> dict[str, Any]:
        return {"id": i, "type": "function", "function": {"name": "get_time", "arguments": json.dumps({"tz": tz})}}

    history: list[dict[str, Any]] = [
        {"role": "user", "content": "time in UTC and CET?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1", "UTC"), call("call_2", "CET")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "13:00"}]},
        {"role": "user", "content": "and now?"},
    ]
    asked: dict[str, Any] = {"model": "chat", "messages": history}
    if tools is not None:
        asked["tools"] = tools
    sent = prepare(asked, "chat").body["messages"]
    roles = [m["role"] for m in sent]
    assert roles == (["system"] if tools else []) + ["user", "assistant", "user"]
    last = sent[-1]["content"]
    assert all(text in last for text in ("12:00", "13:00", "and now?"))
    assert history[2]["role"] == "tool" and history[4]["content"] == "and now?"  # the client's own untouched


def test_a_tool_result_names_the_call_it_answers() -> None:
    # OpenAI's tool message carries only the call's id (the openai SDK, llama-index,
    # pydantic-ai send no name), and the rendered assistant turn shows no ids: the model saw
    # "Result of call_1: 12:00" with nothing telling it which call that was
    from localllm.service.chat import prepare

    def call(i: str, name: str, args: dict[str, str]) -> dict[str, Any]:
        return {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    history: list[dict[str, Any]] = [
        {"role": "user", "content": "time in UTC and CET, weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("call_1", "get_time", {"tz": "UTC"}),
                call("call_2", "get_time", {"tz": "CET"}),
                call("call_3", "get_weather", {"city": "Oslo"}),
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "13:00"},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_3", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_9", "content": "?"},  # no such call: its id, as before
        {"role": "tool", "name": "get_news", "content": "none"},  # a name and no id: the name
    ]
    results = prepare({"model": "chat", "messages": history}, "chat").body["messages"][-1]["content"].split("\n\n")
    assert results == [
        'Result of get_time {"tz":"CET"}: 13:00',  # the same tool twice: told apart by arguments
        'Result of get_time {"tz":"UTC"}: 12:00',
        "Result of get_weather: sunny",
        "Result of call_9: ?",
        "Result of get_news: none",
    ]


def test_the_auto_tool_prompt_shows_no_reply_the_model_could_copy() -> None:
    # under tool_choice "auto" (llama-index's FunctionAgent, LangChain's bind_tools) the
    # prompt showed {"content": "<your reply>"}, itself an answer the grammar admits:
    # gemma-3-270m answered "<your reply>" to 3 of 6 questions (after: 0 of 6)
    from localllm.service.chat import prepare

    asked = {"model": "chat", "messages": MESSAGES, "tools": [TIME], "tool_choice": "auto"}
    prompt = prepare(asked, "chat").body["messages"][0]["content"]
    shown = [m.group(0) for m in re.finditer(r'\{"content": [^}]*\}', prompt)]
    assert shown  # the reply's shape is shown...
    for example in shown:  # ...but not as an answer: none of them is JSON holding a reply
        with pytest.raises(ValueError):
            json.loads(example)


@pytest.mark.parametrize(
    "first",
    [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "system", "content": "Be brief."},
    ],
)
def test_the_tool_prompt_joins_the_clients_system_message_in_any_form(first: dict[str, Any]) -> None:
    # a system message as text parts got the tool prompt as a second system message before
    # it: a template taking a system message only first (gemma-2-it's, --jinja, on the pinned
    # llama-server) refused every such tool request with llama-server's 400
    from localllm.service.chat import prepare

    asked = {"model": "chat", "messages": [first, *MESSAGES], "tools": [TIME], "tool_choice": "required"}
    sent = prepare(asked, "chat").body["messages"]
    assert [m["role"] for m in sent] == ["system", "user"]
    assert sent[0]["content"].startswith("Be brief.") and "get_time" in sent[0]["content"]


@pytest.mark.parametrize("extra", [{"response_format": {"type": "json_object"}}, {"tools": [TIME]}])
def test_a_buffered_stream_carries_the_logprobs_asked_for(make_service: Factory, extra: dict[str, Any]) -> None:
    # a structured or tool request generated whole and then streamed dropped the logprobs
    # llama-server gave: every chunk's were null, while the same request unstreamed had them
    service = make_service()
    body = {"model": "chat", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2, **extra}
    with client(service) as http:
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e)["choices"] for e in events[:-1]]
    streamed = [t for c in chunks if c and c[0].get("logprobs") for t in c[0]["logprobs"]["content"]]
    assert [t["token"] for t in streamed] == [t["token"] for t in whole] and whole


# -- OpenAI's deprecated functions / function_call ---------------------------------------------
def test_deprecated_functions_are_tool_calls_answered_in_their_shape(
    make_service: Factory, env: dict[str, Path]
) -> None:
    # llama-server ignores "functions": a forced function_call was answered with free text
    # (a 200, finish_reason "length", no function_call) on the real server
    service = make_service()
    asked = {"functions": [TIME["function"]], "function_call": {"name": "get_time"}}
    with client(service) as http:
        answer = chat(http, "chat", **asked)
        body = {"model": "chat", "messages": MESSAGES, **asked, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as reply:
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert answer.status_code == 200 and answer.headers["x-localllm-validated"] == "true"
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    call = choice["message"]["function_call"]
    assert call["name"] == "get_time" and json.loads(call["arguments"])["tz"] in ("UTC", "CET")
    sent = upstream_chats(env)[0]
    assert "functions" not in sent and "function_call" not in sent and "grammar" in sent
    chunks = [json.loads(e)["choices"] for e in events[:-1]]
    streamed = [c[0]["delta"]["function_call"] for c in chunks if c and c[0]["delta"].get("function_call")]
    assert [c["name"] for c in streamed] == ["get_time"] and chunks[-1][0]["finish_reason"] == "function_call"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [TIME["function"]], "function_call": {"name": "nope"}}, "function_call"),
        ({"functions": [{"name": ""}]}, "functions[0].name"),
        ({"functions": []}, "functions"),
        ({"functions": [TIME["function"]], "tools": [WEATHER]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        (
            {"messages": [{"role": "assistant", "content": None, "function_call": "get_time"}]},
            "messages[0].function_call",
        ),
    ],
)
def test_malformed_deprecated_functions_are_400s_naming_them(extra: dict[str, Any], param: str) -> None:
    from localllm.service.chat import BadRequest, prepare

    with pytest.raises(BadRequest) as refused:
        prepare({"model": "chat", "messages": MESSAGES, **extra}, "chat")
    assert refused.value.param == param


def test_deprecated_function_history_is_rendered_and_one_call_at_most() -> None:
    from localllm.service.chat import MAX_PARALLEL_CALLS, Invalid, finish, prepare

    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "function_call": {"name": "get_time", "arguments": '{"tz":"UTC"}'}},
        {"role": "function", "name": "get_time", "content": "12:00"},
    ]
    prepared = prepare({"model": "chat", "messages": history, "functions": [TIME["function"]]}, "chat")
    sent = prepared.body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert json.loads(sent[2]["content"]) == {"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}]}
    assert MAX_PARALLEL_CALLS > 1
    two = json.dumps({"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}] * 2})
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": two}, "finish_reason": "stop"}]}
    with pytest.raises(Invalid):  # function_call holds one call
        finish(prepared, answer)


@pytest.mark.parametrize(
    ("content", "extra"),
    [
        ('{"city": "Oslo", "days": 99, "days": 3}', {"response_format": fmt(SCHEMA)}),
        (
            '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 99, "days": 3}}]}',
            {"tools": [WEATHER]},
        ),
    ],
)
def test_an_answer_naming_a_key_twice_is_never_a_200(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch, content: str, extra: dict[str, Any]
) -> None:
    # validated as Python reads it (the last "days", 3), the content went out as written: a
    # 200 with X-Localllm-Validated: true whose first "days" is 99, outside the schema, and
    # which serde-based clients refuse to parse at all (a call's arguments: silently the last)
    monkeypatch.setenv("FAKE_LLAMA_CONTENT", content)  # the grammar ignored
    service = make_service()
    with client(service) as http:
        strict = chat(http, "chat", **extra)
        loose = chat(http, "chat", response_format=fmt(SCHEMA, strict=False)) if "tools" not in extra else None
    assert strict.status_code == 502 and strict.json()["error"]["code"] == "structured_output_invalid"
    if loose is not None:
        assert loose.status_code == 200 and loose.headers["x-localllm-validated"] == "false"


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}),
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/tokenize", {"content": "hello"}),
    ],
)
def test_a_body_in_another_encoding_than_utf8_is_a_400_that_never_reaches_llama_server(
    make_service: Factory, env: dict[str, Path], encoding: str, path: str, fields: dict[str, Any]
) -> None:
    # json.loads reads UTF-16 and UTF-32 too: a lone surrogate in them passed the check (its
    # UTF-8 forms are what it looks for) and reached llama-server, and /tokenize forwarded
    # the bytes as given: the pinned llama-server's 500 (a JSON parse error) both times
    service = make_service()
    raw = json.dumps({"model": "chat", **fields}, ensure_ascii=False).encode(encoding, "surrogatepass")
    with client(service) as http:
        refused = http.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    assert not [r for r in rows(env["requests"]) if r["method"] == "POST" and r["body"] != CANARY_BODY]


def test_a_utf8_byte_order_mark_is_ignored(make_service: Factory, env: dict[str, Path]) -> None:
    # read by json.loads, then forwarded as given by /tokenize: the pinned llama-server's 500
    service = make_service()
    with client(service) as http:
        for path, fields in (("/tokenize", {"content": "hello"}), ("/v1/chat/completions", {"messages": MESSAGES})):
            raw = json.dumps({"model": "chat", **fields}).encode("utf-8-sig")
            answer = http.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert answer.status_code == 200, answer.text
    sent = [r for r in rows(env["requests"]) if r["path"] == "/tokenize"]
    assert sent[0]["body"]["content"] == "hello"


def test_a_preflight_from_an_allowed_origin_allows_the_headers_it_asks_for(make_service: Factory) -> None:
    # the openai JS SDK in a browser sends X-Stainless-* headers (the Python SDK's set:
    # X-Stainless-Lang, -OS, -Arch, ...): the preflight allowed authorization and content-type
    # only, so the browser refused every request of it
    origin = "http://localhost:3000"
    service = make_service(allow_origins=(origin,))
    asked = "authorization, content-type, x-stainless-lang, X-Stainless-Retry-Count, openai-organization"
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked}
    with client(service, token=None) as anonymous:
        preflight = anonymous.options("/v1/chat/completions", headers=headers)
        hostile = anonymous.options(
            "/v1/chat/completions",
            headers={**headers, "Access-Control-Request-Headers": "x-a, bad name, (x), " + "y" * 65},
        )
        foreign = anonymous.options("/v1/chat/completions", headers={**headers, "Origin": "http://evil.example"})
    allowed = {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
    assert preflight.status_code == 204 and allowed >= {h.strip().lower() for h in asked.split(",")}
    assert {h.strip() for h in hostile.headers["access-control-allow-headers"].split(",")} == {
        "authorization",
        "content-type",
        "x-a",
    }
    assert foreign.status_code == 403 and "access-control-allow-headers" not in foreign.headers


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
def test_the_bearer_scheme_is_case_insensitive(make_service: Factory, scheme: str) -> None:
    # "Authorization: bearer <token>" was a 401: the scheme is case-insensitive (RFC 9110 11.1)
    service = make_service()
    with client(service, token=None) as http:
        listed = http.get("/v1/models", headers={"Authorization": f"{scheme} {service.token}"})
        wrong = http.get("/v1/models", headers={"Authorization": f"{scheme} not-the-token"})
    assert (listed.status_code, wrong.status_code) == (200, 401)


# pydantic's schema of a model holding another model: the inner one under $defs, by $ref
NESTED = {
    "$defs": {
        "Addr": {
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "type": "object",
        }
    },
    "properties": {
        "name": {"type": "string"},
        "home": {"$ref": "#/$defs/Addr"},
        "past": {"items": {"$ref": "#/$defs/Addr"}, "type": "array"},
    },
    "required": ["name", "home", "past"],
    "type": "object",
}


@pytest.mark.parametrize(
    ("tool_choice", "tools", "response_format"),
    [
        (
            "required",
            [{"type": "function", "function": {"name": "person", "parameters": NESTED, "strict": True}}],
            None,
        ),
        ("auto", [{"type": "function", "function": {"name": "person", "parameters": NESTED}}, TIME], None),
        ("auto", [TIME], fmt(NESTED)),  # the reply's schema holds the refs
        (  # an $id would resolve the refs against itself
            "required",
            [{"type": "function", "function": {"name": "person", "parameters": {"$id": "urn:p", **NESTED}}}],
            None,
        ),
    ],
)
def test_schemas_with_refs_are_compiled_inside_tool_answers(
    make_service: Factory, tool_choice: str, tools: list[dict[str, Any]], response_format: Any
) -> None:
    # every tool (or reply schema) of a nested pydantic model was a 400 unsupported_schema
    # blaming response_format.json_schema.schema: placed inside the answer's schema, its
    # "#/$defs/Addr" pointed at the answer's root, where there is no $defs
    service = make_service()
    extra: dict[str, Any] = {"tools": tools, "tool_choice": tool_choice}
    if response_format is not None:
        extra["response_format"] = response_format
    with client(service) as http:
        answer = chat(http, "chat", **extra)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-localllm-structured"] == "compiled" and answer.headers["x-localllm-validated"] == "true"
    (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
    if call["function"]["name"] == "person":
        assert set(json.loads(call["function"]["arguments"])) == {"name", "home", "past"}


def test_a_reply_with_refs_under_tool_choice_auto_is_validated() -> None:
    from localllm.service.chat import Invalid, finish, prepare

    asked = {"model": "chat", "messages": MESSAGES, "tools": [TIME], "response_format": fmt(NESTED)}
    good = json.dumps({"content": {"name": "Ann", "home": {"city": "Oslo"}, "past": [{"city": "Rome"}]}})
    bad = json.dumps({"content": {"name": "Ann", "home": {"city": 5}, "past": []}})
    for content, ok in ((good, True), (bad, False)):
        answer = {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        }
        if ok:
            done, validated = finish(prepare(asked, "chat"), answer)
            assert validated and json.loads(done["choices"][0]["message"]["content"])["home"] == {"city": "Oslo"}
        else:
            with pytest.raises(Invalid):
                finish(prepare(asked, "chat"), answer)


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [WEATHER], "tool_choice": "required"},
        {"tools": [WEATHER]},  # auto
        {"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}},
    ],
)
def test_a_grammar_beside_tools_is_a_400_never_silently_replaced(
    make_service: Factory, env: dict[str, Path], extra: dict[str, Any]
) -> None:
    service = make_service()
    with client(service) as http:
        answer = chat(http, "chat", grammar='root ::= "yes"', **extra)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "grammar"
        without = chat(http, "chat", tools=[WEATHER], tool_choice="none", grammar='root ::= "yes"')
    assert without.status_code == 200 and without.json()["choices"][0]["message"]["content"] == "yes"
    assert [c.get("grammar") for c in upstream_chats(env)] == ['root ::= "yes"']  # only the one without tools


def test_the_openai_client_does_not_resend_an_answer_that_broke_a_strict_guarantee(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai  # a dev dependency (pyproject), as the real client people use

    monkeypatch.setenv("FAKE_LLAMA_CONTENT", '{"city": "Oslo", "days": 99}')  # the grammar ignored
    service = make_service()
    sdk = openai.OpenAI(base_url=f"{service.url}/v1", api_key=service.token, max_retries=2)
    with sdk, pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
            },
        )
    assert caught.value.status_code == 502 and caught.value.code == "structured_output_invalid"
    assert len(upstream_chats(env)) == 1  # the SDK's retries, if any, are over once it raises


@pytest.mark.parametrize("name", ["ignore_eos", "continue_final_message"])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": fmt(SCHEMA)}, "response_format"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"json_schema": SCHEMA}, "json_schema"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tools"),
        ({"tools": [WEATHER]}, "tools"),
        ({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}}, "functions"),
    ],
)
def test_nothing_keeps_a_compiled_grammars_answer_from_ending(name: str, extra: dict[str, Any], param: str) -> None:
    # ignore_eos: the pinned llama-server generated past the grammar's end (a 500, "Unexpected
    # empty grammar stack"); a continued message is its text and then the grammar's whole value
    from localllm.service.chat import BadRequest, prepare

    asked = {"model": "chat", "messages": MESSAGES, **extra}
    with pytest.raises(BadRequest) as caught:
        prepare({**asked, name: True}, "chat")
    assert caught.value.param == name and f"with {param}:" in str(caught.value)
    assert prepare({**asked, name: False}, "chat").body[name] is False
    for free in ({}, {"grammar": "root ::= [a-z ]+"}):  # nothing to end; a client's grammar may never end
        assert prepare({"model": "chat", "messages": MESSAGES, name: True, **free}, "chat").body[name] is True
    with pytest.raises(BadRequest) as typed:
        prepare({"model": "chat", "messages": MESSAGES, name: "yes"}, "chat")
    assert typed.value.param == name


@pytest.mark.parametrize(
    ("extra", "status", "message", "refused"),
    [
        ({"ignore_eos": True}, 500, "got exception: Unexpected empty grammar stack after accepting piece: x", True),
        ({}, 500, "got exception: Unexpected empty grammar stack after accepting piece: x", False),
        ({"ignore_eos": True}, 500, "something else", False),
        ({"ignore_eos": True}, 400, "Unexpected empty grammar stack", False),
    ],
)
def test_a_clients_grammar_that_ends_under_ignore_eos_is_a_400_naming_it(
    extra: dict[str, Any], status: int, message: str, refused: bool
) -> None:
    # llama-server cannot go on past a grammar's end: its 500 named nothing, and clients retry a 500
    from localllm.service.chat import ended_failure
    from localllm.service.completion import prepare as completion_prepare

    prepared = completion_prepare({"prompt": "hi", "grammar": 'root ::= "ab"', **extra}, "chat")
    found = ended_failure(prepared, status, {"error": {"code": status, "message": message}})
    assert (found.param if found is not None else None) == ("ignore_eos" if refused else None)


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        ({}, "(cut off by max_tokens)"),
        ({"t_max_predict_ms": 50}, "(cut off by max_tokens or the request's t_max_predict_ms)"),
        ({"t_max_predict_ms": -1, "n_indent": 2}, "(cut off by max_tokens or the request's n_indent)"),
    ],
)
def test_a_cut_answer_names_what_may_have_cut_it(extra: dict[str, Any], cause: str) -> None:
    # llama-server reports each of its own limits as "length"; the message named max_tokens alone
    from localllm.service.chat import Invalid, finish, prepare

    asked = {"model": "chat", "messages": MESSAGES, "response_format": fmt(SCHEMA, strict=True), **extra}
    message = {"role": "assistant", "content": '{"city": "Os'}
    with pytest.raises(Invalid) as caught:
        finish(prepare(asked, "chat"), {"choices": [{"index": 0, "message": message, "finish_reason": "length"}]})
    assert str(caught.value).endswith(cause)
