"""``POST /v1/completions`` end to end: real llama-server, gemma-3-270m, the clients that use it by default.

The official ``openai`` client's ``completions.create`` (plain, batched, logprobs, streamed
with and without logprobs, token ids, and the 400s for what llama-server would ignore or
refuse without naming it), LangChain's
``langchain_openai.OpenAI`` (``invoke``, ``stream``, a batched ``generate``) and litellm's
``text_completion``. llama-index's default ``OpenAILike`` is in ``test_llama_index_e2e.py``.
Every call is bounded by client timeouts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pydantic
import pytest

from tests.e2e.test_service_e2e import CHAT, Served, serve

__all__ = ["serve"]  # the fixture

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"


def test_openai_client_completions(serve: Callable[..., Served]) -> None:
    served = serve()
    client: Any = served.client()
    try:
        plain = client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=8, temperature=0)
        assert plain.object == "text_completion" and plain.model == CHAT
        (choice,) = plain.choices
        assert choice.index == 0 and choice.text.strip() and choice.finish_reason in ("stop", "length")
        assert plain.usage is not None and 0 < plain.usage.completion_tokens <= 8

        # no max_tokens: OpenAI's default of 16, not llama-server's (until the context ends)
        default = client.completions.create(model=CHAT, prompt="Count: 1, 2, 3,", temperature=0)
        assert default.usage is not None and 0 < default.usage.completion_tokens <= 16

        batch = client.completions.create(model=CHAT, prompt=[PROMPT, "One, two,"], max_tokens=4, temperature=0)
        assert [c.index for c in batch.choices] == [0, 1] and all(c.text for c in batch.choices)

        scored = client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
        logprobs = scored.choices[0].logprobs
        assert "".join(logprobs.tokens) == scored.choices[0].text
        assert logprobs.text_offset[0] == len(PROMPT)
        assert all(lp <= 0 for lp in logprobs.token_logprobs)
        for token, own, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
            assert 1 <= len(top) <= 2 and all(v <= 0 for v in top.values())
            if token in top:  # greedy: the chosen token is the most likely one
                assert math.isclose(top[token], own, abs_tol=1e-4) and top[token] == max(top.values())

        chunks = list(
            client.completions.create(
                model=CHAT,
                prompt=PROMPT,
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text.strip() and chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 8
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")

        # a batch's stream: the pinned llama-server starts it with "data: null", which the openai
        # SDK yielded as None (each chunk.choices failed); left out
        streamed_batch = list(
            client.completions.create(model=CHAT, prompt=[PROMPT, "One, two,"], max_tokens=3, stream=True)
        )
        assert None not in streamed_batch and {c.choices[0].index for c in streamed_batch} == {0, 1}

        # logprobs in a stream: each event's in OpenAI's legacy shape, the offsets carried on
        events = list(
            client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=6, temperature=0, stream=True, logprobs=1)
        )
        scored_text = "".join(e.choices[0].text for e in events if e.choices)
        streamed = [e.choices[0].logprobs for e in events if e.choices and e.choices[0].logprobs is not None]
        tokens = [t for lp in streamed for t in lp.tokens]
        assert tokens and "".join(tokens) == scored_text
        offsets = [o for lp in streamed for o in lp.text_offset]
        assert offsets == [len(PROMPT) + len("".join(tokens[:k])) for k in range(len(tokens))]
        assert all(len(top) == 1 for lp in streamed for top in lp.top_logprobs)

        for extra, param in (
            ({"echo": True}, "echo"),
            ({"best_of": 2}, "best_of"),
            ({"suffix": " Paris."}, "suffix"),
            ({"extra_body": {"response_format": {"type": "json_object"}}}, "response_format"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=4, **extra)
            assert caught.value.code == "unsupported_parameter", param
            assert caught.value.param == param

        # token ids: gemma-3's vocabulary has 262,144 (its server's meta.n_vocab); the last
        # is answered, one past it is a 400 naming it (llama-server's own 400 named none)
        ids = client.completions.create(model=CHAT, prompt=[[2, 262143]], max_tokens=2, temperature=0)
        assert ids.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.BadRequestError) as outside:
            client.completions.create(model=CHAT, prompt=[[2, 5], [2, 262144]], max_tokens=2)
        assert (outside.value.code, outside.value.param) == ("invalid_token", "prompt[1][1]")
    finally:
        client.close()


def test_langchain_openai_llm(serve: Callable[..., Served]) -> None:
    from langchain_openai import OpenAI

    served = serve()
    # our own HTTP client, closed when done: langchain's default one is cached for the process
    with httpx.Client(trust_env=False, timeout=120) as http_client:
        llm = OpenAI(
            model=CHAT,
            base_url=served.found.url + "/v1",
            api_key=pydantic.SecretStr(served.token or ""),
            max_tokens=12,
            temperature=0,
            timeout=120,
            max_retries=0,
            http_client=http_client,
        )
        answer = llm.invoke(PROMPT)
        assert isinstance(answer, str) and answer.strip()
        pieces = list(llm.stream(PROMPT))
        assert len(pieces) > 1 and "".join(pieces).strip()
        # llm.batch sends the prompts in one request (prompt: [...]), one choice each, in order
        result = llm.generate([PROMPT, "One, two, three,", "Red, green,"])
        assert len(result.generations) == 3
        assert all(len(g) == 1 and g[0].text.strip() for g in result.generations)
        assert result.llm_output is not None and result.llm_output["token_usage"]["completion_tokens"] > 0


def test_litellm_text_completion(serve: Callable[..., Served]) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    import litellm

    served = serve()
    answer: Any = litellm.text_completion(
        model=f"text-completion-openai/{CHAT}",
        api_base=served.found.url + "/v1",
        api_key=served.token,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        timeout=120,
        max_retries=0,
    )
    assert answer.object == "text_completion"
    (choice,) = answer.choices
    assert choice.text.strip() and choice.finish_reason in ("stop", "length")
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8
    # it went to the legacy route, not to chat (litellm may map one onto the other)
    with httpx.Client(base_url=served.found.url, trust_env=False, timeout=30) as http:
        metrics = http.get("/metrics", headers={"Authorization": f"Bearer {served.token}"}).text
    assert 'localllm_requests_total{path="/v1/completions",status="200"} 1' in metrics
    assert 'path="/v1/chat/completions"' not in metrics
