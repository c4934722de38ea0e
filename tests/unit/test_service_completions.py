"""``POST /v1/completions`` (OpenAI's legacy text completions) against fake llama-server processes.

The same guarantees as the chat route (auth, CORS, limits, role, caps), and a 400 naming
``param`` for every field this llama-server would ignore or read wrongly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.managed.server import CANARY_BODY
from localllm.service.api import FrontLimits
from localllm.service.chat import ChatLimits
from localllm.service.completion import DEFAULT_MAX_TOKENS, MAX_PROMPTS
from tests.unit.test_service import Factory, client, env, make_service, rows

__all__ = ["env", "make_service"]  # fixtures used here

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def complete(http: httpx.Client, model: str = "chat", path: str = "/v1/completions", **extra: Any) -> httpx.Response:
    return http.post(path, json={"model": model, "prompt": "Once upon a time", **extra})


def upstream(env: dict[str, Path], path: str = "/v1/completions") -> list[dict[str, Any]]:
    """The requests llama-server got on ``path`` (the grammar canary of every start left out)."""
    return [
        r for r in rows(env["requests"]) if r["method"] == "POST" and r["path"] == path and r["body"] != CANARY_BODY
    ]


def test_a_completion_is_answered_with_the_served_id_and_openais_default_max_tokens(
    make_service: Factory, env: dict[str, Path]
) -> None:
    service = make_service()
    with client(service) as http:
        answer = complete(http, keep_alive="5m", user="u1", seed=7, presence_penalty=0.5, frequency_penalty=-0.5)
        asked = complete(http, max_tokens=10**6, n=3, stop="\n", temperature=0.2, top_p=0.9, echo=False, best_of=1)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "text_completion" and data["model"] == "chat"
    assert data["choices"][0]["text"] == " Hello from the fake llama-server."
    assert answer.headers["x-localllm-structured"] == "none"
    assert asked.status_code == 200, asked.text
    first, second = (r["body"] for r in upstream(env))
    # OpenAI's default (16), not llama-server's (no limit) nor the chat route's (the ceiling)
    assert first["max_tokens"] == DEFAULT_MAX_TOKENS and "keep_alive" not in first
    assert (first["user"], first["seed"], first["presence_penalty"]) == ("u1", 7, 0.5)
    # capped as chat is: the ceiling, the model's 2 slots; defaults asked for are not sent
    assert (second["max_tokens"], second["n"]) == (ChatLimits().max_tokens, 2)
    assert second["stop"] == ["\n"] and not {"echo", "best_of"} & set(second)
    assert len(asked.json()["choices"]) == 2


def test_the_unversioned_alias_reaches_the_openai_route_not_llama_servers_native_one(
    make_service: Factory, env: dict[str, Path]
) -> None:
    service = make_service()
    with client(service) as http:
        answer = complete(http, path="/completions")
    assert answer.status_code == 200 and answer.json()["object"] == "text_completion"
    assert len(upstream(env)) == 1 and upstream(env, "/completions") == []


def test_auth_and_cors_are_the_chat_routes(make_service: Factory) -> None:
    origin = "http://localhost:3000"
    service = make_service(allow_origins=(origin,))
    with client(service, token=None) as anonymous:
        refused = complete(anonymous)
        preflight = anonymous.options(
            "/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
    with client(service) as http:
        allowed = http.post("/v1/completions", json={"model": "chat", "prompt": "hi"}, headers={"Origin": origin})
        foreign = http.post(
            "/v1/completions", json={"model": "chat", "prompt": "hi"}, headers={"Origin": "https://evil.example"}
        )
        form = http.post(
            "/v1/completions", content=b"{}", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        put = http.put("/v1/completions", json={})
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == origin
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == origin
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "origin_not_allowed")
    assert "access-control-allow-origin" not in foreign.headers
    assert (form.status_code, put.status_code, put.headers["allow"]) == (415, 405, "POST")


def test_model_is_required_and_an_embedding_model_is_sent_to_its_route(
    make_service: Factory, env: dict[str, Path]
) -> None:
    service = make_service()
    with client(service) as http:
        missing = http.post("/v1/completions", json={"prompt": "hi"})
        embedder = complete(http, model="all-minilm-l6-v2-f16")
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "model")
    error = embedder.json()["error"]
    assert (embedder.status_code, error["param"], error["code"]) == (400, "model", "model_role_mismatch")
    assert "/v1/embeddings" in error["message"]
    assert rows(env["spawn"], "start") == []  # nothing was loaded for them


def test_the_body_limit_holds(make_service: Factory) -> None:
    service = make_service(limits=FrontLimits(max_body=1 << 16))
    with client(service) as http:
        big = complete(http, suffix=None, user="x" * (1 << 17))
        fine = complete(http)
    assert (big.status_code, fine.status_code) == (413, 200)


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"prompt": None}, "prompt", "invalid_request_error"),
        ({"prompt": []}, "prompt", "invalid_request_error"),
        ({"prompt": 5}, "prompt", "invalid_request_error"),
        ({"prompt": {"text": "hi"}}, "prompt", "invalid_request_error"),
        ({"prompt": ["a", 1]}, "prompt", "invalid_request_error"),  # a mix: neither a batch nor ids
        ({"prompt": [True, 2]}, "prompt", "invalid_request_error"),
        ({"prompt": [[1, 2], []]}, "prompt[1]", "invalid_request_error"),
        ({"prompt": [[1, "a"]]}, "prompt[0]", "invalid_request_error"),
        ({"prompt": [5, -1]}, "prompt[1]", "invalid_token"),
        ({"prompt": [[5], [3, -2]]}, "prompt[1][1]", "invalid_token"),
        ({"prompt": ["a"] * (MAX_PROMPTS + 1)}, "prompt", "too_many_prompts"),
        # what this llama-server does not read: the answer would silently lack it
        ({"echo": True}, "echo", "unsupported_parameter"),
        ({"best_of": 2}, "best_of", "unsupported_parameter"),
        ({"best_of": True}, "best_of", "unsupported_parameter"),
        ({"suffix": "\n}"}, "suffix", "unsupported_parameter"),
        ({"logprobs": 6}, "logprobs", "invalid_request_error"),
        ({"logprobs": -1}, "logprobs", "invalid_request_error"),
        ({"logprobs": True}, "logprobs", "invalid_request_error"),
        # the chat route's: compiled and validated there, ignored by llama-server here
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
            "response_format",
            "unsupported_parameter",
        ),
        ({"json_schema": SCHEMA}, "json_schema", "unsupported_parameter"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]},
            "tools",
            "unsupported_parameter",
        ),
        ({"tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
        ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages", "unsupported_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
        ({"continue_final_message": True}, "continue_final_message", "unsupported_parameter"),  # no message here
        # the chat route's checks, shared
        ({"temperature": 5}, "temperature", "invalid_request_error"),
        ({"top_p": -1}, "top_p", "invalid_request_error"),
        ({"presence_penalty": 3}, "presence_penalty", "invalid_request_error"),
        ({"frequency_penalty": -3}, "frequency_penalty", "invalid_request_error"),
        ({"max_tokens": 0}, "max_tokens", "invalid_request_error"),
        ({"n": "two"}, "n", "invalid_request_error"),
        ({"n": 0}, "n", "invalid_request_error"),
        ({"stream": "yes"}, "stream", "invalid_request_error"),
        ({"stop": 3}, "stop", "invalid_request_error"),
        ({"stop": ["a", 3]}, "stop", "invalid_request_error"),
        ({"seed": 1.5}, "seed", "invalid_request_error"),
        ({"keep_alive": "soon"}, "keep_alive", "invalid_request_error"),
        ({"grammar": "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000}, "grammar", "invalid_grammar"),
        # the DRY sampler's: 8 GB of the pinned server kept; 1,000 breakers past 60 s
        ({"dry_multiplier": 1, "dry_penalty_last_n": 10**9}, "dry_penalty_last_n", "invalid_request_error"),
        ({"dry_sequence_breakers": [f"x{i}" for i in range(1000)]}, "dry_sequence_breakers", "invalid_request_error"),
        # llama-server's probabilities after its samplers (prob, top_probs): each logprob was null
        ({"logprobs": 2, "post_sampling_probs": True}, "post_sampling_probs", "invalid_request_error"),
    ],
)
def test_fields_llama_server_would_misread_or_ignore_are_400s_that_never_reach_it(
    make_service: Factory, env: dict[str, Path], extra: dict[str, Any], param: str, code: str
) -> None:
    service = make_service()
    with client(service) as http:
        refused = complete(http, **extra)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    if code == "unsupported_parameter" and param not in ("echo", "best_of", "suffix"):
        assert "/v1/chat/completions" in error["message"]  # where it is honoured
    assert upstream(env) == [] and rows(env["spawn"], "start") == []


def test_the_defaults_of_refused_fields_pass(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        answer = complete(
            http, echo=False, best_of=1, suffix="", response_format={"type": "text"}, tools=None, logprobs=None
        )
    assert answer.status_code == 200, answer.text
    sent = upstream(env)[0]["body"]
    assert not {"echo", "best_of", "suffix", "response_format", "tools", "logprobs", "n_probs"} & set(sent)


@pytest.mark.parametrize(
    ("prompt", "choices"),
    [
        ("one", 2),
        ("", 2),  # was the service's own 500 (IndexError); llama-server answers it from the start of text
        (["one", "two"], 4),
        ([1, 2, 3], 2),  # token ids: one prompt
        ([[1, 2], [3]], 4),
        (["p"] * MAX_PROMPTS, MAX_PROMPTS),  # langchain's llm.batch: up to 20 in one request; n capped to 1
    ],
)
def test_prompts_and_batches_answer_prompts_times_n_choices(
    make_service: Factory, env: dict[str, Path], prompt: Any, choices: int
) -> None:
    service = make_service()  # "chat" has 2 slots
    with client(service) as http:
        answer = complete(http, prompt=prompt, n=2)
    assert answer.status_code == 200, answer.text
    assert [c["index"] for c in answer.json()["choices"]] == list(range(choices))
    assert upstream(env)[0]["body"]["prompt"] == prompt


def test_a_batch_caps_n_so_its_choices_stay_within_the_ceiling(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        answer = complete(http, prompt=["a"] * 7, n=2)  # 14 choices: within MAX_PROMPTS
        capped = complete(http, prompt=["a"] * 11, n=2)  # 22 asked
        # llama-server's own name for n, which it reads first: 20 prompts × 2 slots went through
        aliased = complete(http, prompt=["a"] * 20, n_cmpl=2, n=1)
    assert [len(a.json()["choices"]) for a in (answer, capped, aliased)] == [14, 11, 20]
    assert [(r["body"]["n"], "n_cmpl" in r["body"]) for r in upstream(env)] == [(2, False), (1, False), (1, False)]


def test_logprobs_are_answered_in_openais_legacy_shape(
    make_service: Factory, env: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = {"sunny": {"sunny": 0.5, "rainy": 0.3, "dark": 0.2}}
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps({"responses": [{}, {"content": "It is sunny", "logprobs": table}]}))
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(path))  # the first answer goes to the start's canary
    service = make_service()
    with client(service) as http:
        two = complete(http, prompt="Weather:", logprobs=2)
        zero = complete(http, prompt="Weather:", logprobs=0)
    assert two.status_code == 200, two.text
    got = two.json()["choices"][0]["logprobs"]
    assert got["tokens"] == ["It", " ", "is", " ", "sunny"]
    assert got["text_offset"] == [8, 10, 11, 13, 14]  # after the prompt, as OpenAI counts
    assert math.isclose(got["token_logprobs"][4], math.log(0.5)) and got["token_logprobs"][0] == 0.0
    assert list(got["top_logprobs"][4]) == ["sunny", "rainy"]
    assert math.isclose(got["top_logprobs"][4]["rainy"], math.log(0.3))
    # 0: each token's own logprob, no alternatives (llama-server's n_probs 0 would give none)
    none = zero.json()["choices"][0]["logprobs"]
    assert none["tokens"][4] == "sunny" and none["top_logprobs"] == [{}] * 5
    assert [(r["body"]["n_probs"], "logprobs" in r["body"]) for r in upstream(env)] == [(2, False), (1, False)]


def test_a_stream_is_relayed_as_llama_server_writes_it(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    body = {"model": "chat", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    with client(service) as http, http.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == " Hello from the fake llama-server."
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert upstream(env)[0]["body"]["stream"] is True


@pytest.mark.parametrize("logprobs", [None, 1])
def test_a_batchs_stream_has_no_null_event_for_openais_client_to_yield(make_service: Factory, logprobs: Any) -> None:
    import openai

    service = make_service()
    api = openai.OpenAI(base_url=f"{service.url}/v1", api_key=service.token, max_retries=0)
    with client(service) as http:
        body = {"model": "chat", "prompt": ["a", "b"], "stream": True, "logprobs": logprobs}
        with http.stream("POST", "/v1/completions", json=body) as reply:
            raw = b"".join(reply.iter_raw())
    # the pinned llama-server starts a batch's stream with "data: null": the openai SDK yielded
    # None first (a client's chunk.choices failed); the event and its blank line are left out
    assert b"data: null" not in raw and raw.startswith(b"data: {") and b"\n\n\n" not in raw
    chunks = list(api.completions.create(model="chat", prompt=["a", "b"], stream=True, logprobs=logprobs))
    assert None not in chunks and {c.choices[0].index for c in chunks} == {0, 1}
    api.close()


def test_the_models_own_errors_are_relayed_as_on_the_chat_route(
    make_service: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps({"responses": [{}, {"status": 400, "message": "Prompt contains invalid tokens"}]}))
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(path))
    service = make_service()
    with client(service) as http:
        answer = complete(http, prompt=[5])
    assert answer.status_code == 400 and answer.json()["error"]["message"] == "Prompt contains invalid tokens"


def test_a_streams_logprobs_are_rewritten_event_by_event(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    body = {"model": "chat", "prompt": ["Hi:", "Hello:"], "stream": True, "logprobs": 1}
    with client(service) as http, http.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    by_index: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for event in events:
        for choice in event["choices"]:
            by_index[choice["index"]].append(choice)
    for index, prompt in ((0, "Hi:"), (1, "Hello:")):
        text = "".join(c["text"] for c in by_index[index])
        rewritten = [c["logprobs"] for c in by_index[index] if c["logprobs"] is not None]
        tokens = [t for lp in rewritten for t in lp["tokens"]]
        offsets = [o for lp in rewritten for o in lp["text_offset"]]
        assert "".join(tokens) == text == " Hello from the fake llama-server."
        # carried on across events, from the end of this choice's own prompt
        assert offsets == [len(prompt) + len("".join(tokens[:k])) for k in range(len(tokens))]
        assert all(set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"} for lp in rewritten)
        assert all(len(top) == 1 for lp in rewritten for top in lp["top_logprobs"])
    assert upstream(env)[0]["body"]["n_probs"] == 1


def test_stream_logprobs_are_rewritten_whatever_the_chunk_boundaries() -> None:
    from localllm.service.completion import CompletionStream, prepare

    prepared = prepare({"prompt": "ab", "stream": True, "logprobs": 0}, "chat")
    entry = {"token": "x\u00e9", "logprob": -0.5, "top_logprobs": [{"token": "x\u00e9", "logprob": -0.5}]}
    event = {"choices": [{"text": "x\u00e9", "index": 0, "logprobs": {"content": [entry]}}]}
    stream = ("data: null\n\n" + f"data: {json.dumps(event)}\n\n" * 2 + "data: [DONE]\n\n").encode()
    whole = CompletionStream(prepared)
    expected = whole.feed(stream) + whole.flush()
    split = CompletionStream(prepared)
    assert b"".join(split.feed(stream[i : i + 1]) for i in range(len(stream))) + split.flush() == expected
    rewritten = [json.loads(line[6:]) for line in expected.decode().splitlines() if line.startswith("data: {")]
    assert [e["choices"][0]["logprobs"] for e in rewritten] == [
        {"tokens": ["x\u00e9"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [2]},
        {"tokens": ["x\u00e9"], "token_logprobs": [-0.5], "top_logprobs": [{}], "text_offset": [4]},
    ]
    assert expected.startswith(b"data: {") and expected.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    ("logit_bias", "param"),
    [
        ("ban", "logit_bias"),
        ({"50256": "-100"}, "logit_bias.50256"),
        ({"5": 200}, "logit_bias.5"),
        ({"5": True}, "logit_bias.5"),
        ([[5]], "logit_bias[0]"),
        ([[True, 1]], "logit_bias[0]"),
        ([[5, None]], "logit_bias[0]"),
    ],
)
def test_a_logit_bias_llama_server_would_skip_without_a_word_is_a_400(
    make_service: Factory, env: dict[str, Path], path: str, logit_bias: Any, param: str
) -> None:
    # llama-server drops each entry it cannot read and generates as if it were not there
    service = make_service()
    body = {"model": "chat", "prompt": "hi"} if path == "/v1/completions" else {"model": "chat", "messages": MESSAGES}
    fine = [{"5": -100, "hello": False, "7": 2.5}, [[5, 1.5], ["hi", False]]]
    with client(service) as http:
        refused = http.post(path, json={**body, "logit_bias": logit_bias})
        passed = [http.post(path, json={**body, "logit_bias": given}) for given in fine]
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, param), refused.text
    assert [answer.status_code for answer in passed] == [200, 200]
    assert [r["body"]["logit_bias"] for r in upstream(env, path)] == fine


def test_logprobs_and_client_n_probs_are_capped_at_the_services_ceiling() -> None:
    from localllm.service.completion import prepare

    low = ChatLimits(max_logprobs=2)
    assert prepare({"prompt": "x", "logprobs": 5}, "chat", limits=low).body["n_probs"] == 2
    assert prepare({"prompt": "x", "n_probs": 50}, "chat", limits=low).body["n_probs"] == 2
    assert prepare({"prompt": "x", "logprobs": 3}, "chat").body["n_probs"] == 3
    # without logprobs, llama-server's own n_probs and post_sampling_probs pass as it reads them
    sent = prepare({"prompt": "x", "n_probs": 2, "post_sampling_probs": True}, "chat").body
    assert (sent["n_probs"], sent["post_sampling_probs"]) == (2, True)
