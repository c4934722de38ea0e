"""A token id outside the served model's vocabulary is a 400 naming it: a ``logit_bias``
entry, on the chat route and ``/v1/completions`` (llama-server skips it without a word, and
reads an id past 2**31 cut to 32 bits, as another token's), and a completions prompt's id
(llama-server's own 400 names no ``param``). The vocabulary size is asked of the model's
server once (``GET /v1/models``, ``meta.n_vocab``), not per request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localllm.managed.server import CANARY_BODY
from tests.unit.fakes.fake_llama_server import N_VOCAB
from tests.unit.test_service import Factory, client, env, make_service, rows

__all__ = ["env", "make_service"]  # fixtures used here

MESSAGES = [{"role": "user", "content": "hi"}]

REFUSED: list[tuple[Any, str]] = [
    ({str(N_VOCAB): -100}, f"logit_bias.{N_VOCAB}"),
    ({"5": 1, "40000": False, "hello": 2}, "logit_bias.40000"),
    ({"+40000": 1}, "logit_bias.+40000"),  # read as an id (strtol), not as text
    ([[5, 1], [2**32 + 5, False]], "logit_bias[1]"),  # llama-server would ban token 5
    ({"-1": 1}, "logit_bias.-1"),
    ([[-3, 1]], "logit_bias[0]"),
]
PASSED: list[Any] = [
    {str(N_VOCAB - 1): -100, "0": 1, "hello": False, "40000x": 1},  # the last two are texts
    [[N_VOCAB - 1, False], ["40000", 2]],
]


def _sent(env: dict[str, Path], method: str, path: str) -> list[dict[str, Any]]:
    return [r for r in rows(env["requests"]) if (r["method"], r["path"]) == (method, path) and r["body"] != CANARY_BODY]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_logit_bias_id_outside_the_vocabulary_is_a_400_naming_it(
    make_service: Factory, env: dict[str, Path], path: str
) -> None:
    service = make_service()
    body = {"model": "chat", "prompt": "hi"} if path == "/v1/completions" else {"model": "chat", "messages": MESSAGES}
    with client(service) as http:
        refused = [http.post(path, json={**body, "logit_bias": given}) for given, _ in REFUSED]
        passed = [http.post(path, json={**body, "logit_bias": given}) for given in PASSED]
        again = http.post(path, json={**body, "logit_bias": REFUSED[0][0]})
    errors = [r.json().get("error") or {} for r in [*refused, again]]
    got = [(r.status_code, e.get("param"), e.get("code")) for r, e in zip([*refused, again], errors, strict=True)]
    want = [(400, param, "invalid_token") for _, param in [*REFUSED, REFUSED[0]]]
    assert got == want
    assert [r.status_code for r in passed] == [200, 200]
    # only the two good requests reached llama-server; its vocabulary was asked for once
    assert [r["body"]["logit_bias"] for r in _sent(env, "POST", path)] == PASSED
    assert len(_sent(env, "GET", "/v1/models")) == 1


def test_a_negative_id_is_refused_before_the_model_is_loaded(make_service: Factory, env: dict[str, Path]) -> None:
    service = make_service()
    with client(service) as http:
        refused = http.post("/v1/completions", json={"model": "chat", "prompt": "hi", "logit_bias": {"-7": 5}})
    assert (refused.status_code, (refused.json().get("error") or {}).get("param")) == (400, "logit_bias.-7")
    assert rows(env["spawn"], "start") == []


def test_an_upstream_that_does_not_say_its_vocabulary_is_asked_once_and_ids_pass(
    make_service: Factory, env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from localllm.service.api import ServiceApp

    asked: list[str] = []

    async def no_meta(self: ServiceApp, url: str) -> Any:
        asked.append(url)
        return {"object": "list", "data": [{"id": "chat"}]}  # another server's listing: no meta

    monkeypatch.setattr(ServiceApp, "_upstream_json", no_meta)
    service = make_service()
    body = {"model": "chat", "prompt": "hi", "logit_bias": {str(N_VOCAB): 1}}
    with client(service) as http:
        answers = [http.post("/v1/completions", json=body) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert [url.rsplit("/", 2)[-2:] for url in asked] == [["v1", "models"]]


def test_a_prompt_token_id_outside_the_vocabulary_is_a_400_naming_it(
    make_service: Factory, env: dict[str, Path]
) -> None:
    """llama-server refuses it too, but with a 400 that names no ``param``."""
    service = make_service()
    refused_prompts = [
        ([5, 6, N_VOCAB], "prompt[2]"),
        ([[5], [7, 2**40]], "prompt[1][1]"),
        ([[N_VOCAB]], "prompt[0][0]"),
    ]
    with client(service) as http:
        refused = [http.post("/v1/completions", json={"model": "chat", "prompt": p}) for p, _ in refused_prompts]
        passed = http.post("/v1/completions", json={"model": "chat", "prompt": [[0], [N_VOCAB - 1, 3]]})
    errors = [r.json().get("error") or {} for r in refused]
    got = [(r.status_code, e.get("param"), e.get("code")) for r, e in zip(refused, errors, strict=True)]
    assert got == [(400, param, "invalid_token") for _, param in refused_prompts]
    assert passed.status_code == 200
    assert [r["body"]["prompt"] for r in _sent(env, "POST", "/v1/completions")] == [[[0], [N_VOCAB - 1, 3]]]
