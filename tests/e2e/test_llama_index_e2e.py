"""llama-index's ``OpenAILike`` against ``localllm serve`` (real llama-server, gemma-3-270m).

llama-index-llms-openai 0.8 (``OpenAILike``'s base) pins ``openai<3`` and the project's
pydantic-ai-slim[openai] needs ``openai>=3.31``, so llama-index has a venv of its own in the
user cache, built by ``make e2e-endpoints`` (part of ``make e2e`` and ``make test``; keyed by
version, reused); the tests run ``tests/e2e/llama_index_client.py`` there as a subprocess,
which refuses any connection but loopback. A missing venv fails the test with the command
that builds it: never skipped.

Both of llama-index's ways to a pydantic model (``structured_predict`` over a json_schema
``response_format``; ``as_structured_llm`` over a forced tool call) must give an instance
of the model whose fields meet its own JSON Schema; a ``FunctionTool`` must be called with
arguments that meet the parameters llama-index sent, and the turn after (the assistant's
``tool_calls`` message, the ``tool`` result) must be answered; a streamed named call must
be assembled by llama-index into one valid call. The service must say it compiled the
constraint and validated the answer. ``OpenAILike``'s default, text completion on the legacy
``/v1/completions`` (no ``max_tokens`` sent: OpenAI's 16), must answer ``complete``,
``stream_complete`` and logprobs llama-index can read.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.e2e.conftest import E2E_HOME
from tests.e2e.test_service_e2e import CHAT, Served, serve

__all__ = ["serve"]  # the fixture

pytestmark = pytest.mark.e2e

LLAMA_INDEX_VERSION = "0.14.25"  # the Makefile's LLAMA_INDEX_VERSION
LLAMA_INDEX_LIKE_VERSION = "0.8.1"  # the Makefile's LLAMA_INDEX_LIKE_VERSION
LLAMA_INDEX_VENV = Path(
    os.environ.get("LOCALLLM_TEST_LLAMA_INDEX_VENV")
    or E2E_HOME / "venvs" / f"llama-index-{LLAMA_INDEX_VERSION}-openai-like-{LLAMA_INDEX_LIKE_VERSION}"
)
CLIENT = Path(__file__).with_name("llama_index_client.py")
COMPILED = {"x-localllm-structured": "compiled", "x-localllm-validated": "true"}


def _llama_index(served: Served, path: str, home: Path) -> dict[str, Any]:
    python = LLAMA_INDEX_VENV / "bin" / "python"
    if not (LLAMA_INDEX_VENV / ".installed").is_file():
        raise AssertionError(f"{LLAMA_INDEX_VENV} is not built: run `make e2e-endpoints` (llama-index's own venv)")
    done = subprocess.run(
        [str(python), str(CLIENT), served.found.url + "/v1", served.token or "", CHAT, path],
        # HOME: llama-index's own cache (NLTK, tiktoken) lands in the test's directory
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home), "NO_PROXY": "*"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(path, json.dumps({k: v for k, v in result.items() if k != "sent"}))
    assert result["versions"]["llama-index-core"] == LLAMA_INDEX_VERSION
    assert int(result["versions"]["openai"].split(".")[0]) < 3
    return result


def _compiled(headers: dict[str, str]) -> bool:
    return {k: headers.get(k) for k in COMPILED} == COMPILED


@pytest.mark.parametrize("path", ["json_schema", "function_calling"])
def test_llama_index_answers_a_pydantic_model(serve: Callable[..., Served], path: str, tmp_path: Path) -> None:
    served = serve()
    result = _llama_index(served, path, tmp_path)
    assert result["type"] == "Ticket"  # an instance of the model, not a dict or a string
    assert result["types"] == {"queue": "str", "urgent": "bool", "priority": "int"}
    answer = result["answer"]
    jsonschema.validate(answer, result["schema"])  # the model's own schema: maxLength 20, 1 ≤ priority ≤ 5
    assert len(answer["queue"]) <= 20 and 1 <= answer["priority"] <= 5
    (sent,) = result["sent"]
    if path == "json_schema":  # structured_predict, should_use_structured_outputs=True
        response_format = sent["response_format"]
        assert response_format["type"] == "json_schema" and response_format["json_schema"]["strict"] is True
        assert response_format["json_schema"]["schema"]["properties"]["queue"]["maxLength"] == 20
        assert "tools" not in sent
    else:  # as_structured_llm, is_function_calling_model=True: the model as a forced tool
        (tool,) = sent["tools"]
        assert tool["function"]["name"] == "Ticket" and tool["function"]["strict"] is False
        assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    (headers,) = result["headers"]
    assert _compiled(headers)


def test_llama_index_predict_and_call_then_the_tool_result(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve()
    result = _llama_index(served, "predict_and_call", tmp_path)
    asked, again, after = result["sent"]
    parameters = asked["tools"][0]["function"]["parameters"]
    assert asked["tool_choice"] == "required" and parameters["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    # the Python function ran, once per forced call, with arguments its own schema admits
    assert len(result["calls"]) == 2
    for call in result["calls"]:
        jsonschema.validate(call, parameters)
    first = result["calls"][0]
    assert result["output"] == {
        "content": f"Sunny, 21 degrees {first['unit']} in {first['city']}.",
        "is_error": False,
        "tool": "get_weather",
    }
    # the turn after, in llama-index's shapes: the call with null content, the result by id
    _, assistant, tool = after["messages"]
    assert assistant["content"] is None and assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert tool["role"] == "tool" and tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert after["tool_choice"] == "none"
    final = result["final"]
    assert final["tool_calls"] == [] and isinstance(final["content"], str) and final["content"].strip()
    assert [_compiled(h) for h in result["headers"]] == [True, True, False]  # the reply is free text
    assert again == asked


def test_llama_index_streams_a_named_tool_call(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve()
    result = _llama_index(served, "stream", tmp_path)
    (sent,) = result["sent"]
    assert sent["stream"] is True
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    (selection,) = result["selections"]  # assembled by llama-index from the deltas
    assert selection["name"] == "get_weather" and selection["id"].startswith("call_")
    jsonschema.validate(selection["kwargs"], sent["tools"][0]["function"]["parameters"])
    assert result["chunks"] >= 1
    (headers,) = result["headers"]
    assert _compiled(headers)


def test_llama_index_completes_on_the_legacy_route_by_default(serve: Callable[..., Served], tmp_path: Path) -> None:
    served = serve()
    result = _llama_index(served, "complete", tmp_path)
    plain, streamed, scored = result["sent"]
    # OpenAILike's default: the legacy route's body (a prompt, no messages), no max_tokens sent
    assert plain["prompt"] == streamed["prompt"] == "The capital of France is" and "messages" not in plain
    assert "max_tokens" not in plain and streamed["stream"] is True
    assert result["text"].strip() and "".join(result["streamed"]).strip() and len(result["streamed"]) > 1
    assert len([piece for piece in result["streamed"] if piece]) <= 16  # one per token: OpenAI's default 16
    # logprobs=True, top_logprobs=2: llama-index sends logprobs 2 and reads OpenAI's legacy shape
    assert scored["logprobs"] == 2 and scored["max_tokens"] == 8
    assert result["scored"].strip() and result["logprobs"]
    for top in result["logprobs"]:
        assert 1 <= len(top) <= 2 and all(p["logprob"] <= 0 for p in top)
    assert [h.get("x-localllm-structured") for h in result["headers"]] == ["none"] * 3
