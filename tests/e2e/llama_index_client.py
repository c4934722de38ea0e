"""llama-index driving ``localllm serve``: run by the llama-index venv's python, not the project's.

llama-index-llms-openai 0.8 (what ``OpenAILike`` is built on) pins ``openai<3`` and the
project's pydantic-ai-slim[openai] needs ``openai>=3.31``, so it lives in its own venv (``make
e2e-endpoints`` builds ``~/.cache/localllm-e2e/venvs/llama-index-<v>-openai-like-<v>``, with the
openai 2.x release pip picks) and tests/e2e/test_llama_index_e2e.py runs this file there::

    python llama_index_client.py BASE_URL TOKEN MODEL PATH

PATH is one of llama-index's own ways to a structured answer or a tool call:

- ``json_schema``: ``structured_predict`` with ``should_use_structured_outputs=True``, a
  ``response_format`` of type ``json_schema`` built by openai from the pydantic model;
- ``function_calling``: ``as_structured_llm(...).chat`` with ``is_function_calling_model=True``,
  llama-index's ``FunctionCallingProgram``: the model as a tool, ``tool_choice="required"``;
- ``predict_and_call``: a ``FunctionTool`` over a Python function, called by
  ``predict_and_call(..., tool_required=True)``, then the tool's result sent back in a second
  turn (the assistant's ``tool_calls`` message and a ``tool`` message) with ``tool_choice="none"``;
- ``stream``: ``stream_chat_with_tools`` with the tool named in ``tool_choice``, the call
  assembled from the deltas by llama-index;
- ``complete``: text completion on the legacy ``/v1/completions``, as ``OpenAILike`` does by
  default (``is_chat_model=False``, no ``max_tokens``): ``complete``, ``stream_complete``, and
  ``complete`` with ``logprobs=True, top_logprobs=2`` (read by llama-index from OpenAI's legacy
  ``top_logprobs``).

Every request is made once (``max_retries=0``), greedy, with a bounded ``max_tokens`` (none
sent by ``complete``'s default ``OpenAILike``: the service's default, 16). It
prints one JSON line: the answer, the JSON Schema it must meet, every request body
llama-index sent, the service's ``X-Localllm-*`` headers of each answer, and the versions.
Exit status 1 (the error on stderr) when llama-index raises. No connection but to loopback is
allowed (an audit hook installed before llama-index is imported).
"""

# no `from __future__ import annotations`: FunctionTool reads the tool's annotations at run time
import functools
import ipaddress
import json
import socket
import sys
from collections.abc import Callable
from typing import Any, Literal


def _loopback_only(event: str, args: tuple[Any, ...]) -> None:
    """No test reaches the internet (llama-index fetches tokenizers and NLTK data on demand):
    no name is looked up but localhost, no address connected to but loopback."""
    if event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
        refused = host not in (None, "localhost") and not _is_loopback(host)
    elif event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6):
        host = args[1][0]
        refused = not _is_loopback(host)
    else:
        return
    if refused:
        raise ConnectionRefusedError(f"llama_index_client: no network but loopback, not {host}")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False


sys.addaudithook(_loopback_only)  # before llama-index is imported (hence the E402s)

import httpx  # noqa: E402 - what openai 2.x is built on (its http_client must be one)
import llama_index.core  # noqa: E402
import openai  # noqa: E402
import pydantic  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage, MessageRole  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.llms.openai_like import OpenAILike  # noqa: E402

ASK = "Ticket: my invoice is wrong. Classify it."
WEATHER = "What is the weather in Paris?"
PROMPT = "The capital of France is"


class Ticket(pydantic.BaseModel):
    """A support ticket, classified."""

    queue: str = pydantic.Field(max_length=20, description="the team that handles it")
    urgent: bool
    priority: int = pydantic.Field(ge=1, le=5, description="1 (low) to 5 (high)")


def main(base_url: str, token: str, model: str, path: str) -> int:
    sent: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []

    def on_request(request: httpx.Request) -> None:
        sent.append(json.loads(request.content or b"{}"))

    def on_response(response: httpx.Response) -> None:
        headers.append({k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-localllm-")})

    hooks: Any = {"request": [on_request], "response": [on_response]}
    with httpx.Client(event_hooks=hooks, trust_env=False, timeout=120) as http:
        common: dict[str, Any] = {"model": model, "api_base": base_url, "api_key": token or "none"}
        common.update(context_window=8192, temperature=0, max_retries=0, timeout=120, http_client=http)
        if path == "complete":  # OpenAILike's defaults: is_chat_model=False, max_tokens None
            llm = OpenAILike(**common)
            scored = OpenAILike(**common, max_tokens=8, logprobs=True, top_logprobs=2)
            runs: dict[str, Callable[[OpenAILike], dict[str, Any]]] = {
                "complete": functools.partial(_complete, scored=scored)
            }
        else:
            llm = OpenAILike(
                **common,
                is_chat_model=True,
                is_function_calling_model=path != "json_schema",
                should_use_structured_outputs=path == "json_schema",
                max_tokens=128,
            )
            runs = RUNS
        try:
            result = runs[path](llm)
        except Exception as exc:  # reported to the test as data
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    versions = {"llama-index-core": llama_index.core.__version__, "openai": openai.__version__}
    print(json.dumps({**result, "sent": sent, "headers": headers, "versions": versions}))
    return 0


def _json_schema(llm: OpenAILike) -> dict[str, Any]:
    ticket = llm.structured_predict(Ticket, PromptTemplate("Ticket: {text}. Classify it."), text="my invoice is wrong")
    return _ticket(ticket)


def _function_calling(llm: OpenAILike) -> dict[str, Any]:
    answer = llm.as_structured_llm(Ticket).chat([ChatMessage(role=MessageRole.USER, content=ASK)])
    return _ticket(answer.raw)


def _ticket(ticket: object) -> dict[str, Any]:
    if not isinstance(ticket, Ticket):
        raise TypeError(f"llama-index answered a {type(ticket).__name__}, not a Ticket")
    types = {name: type(value).__name__ for name, value in ticket.model_dump().items()}
    return {
        "type": type(ticket).__name__,
        "answer": ticket.model_dump(),
        "types": types,
        "schema": Ticket.model_json_schema(),
    }


def _weather_tool(calls: list[dict[str, Any]]) -> FunctionTool:
    def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
        """Current weather of a city."""
        calls.append({"city": city, "unit": unit})
        return f"Sunny, 21 degrees {unit} in {city}."

    return FunctionTool.from_defaults(fn=get_weather)


def _predict_and_call(llm: OpenAILike) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []
    tool = _weather_tool(calls)
    first = llm.predict_and_call([tool], user_msg=WEATHER, tool_required=True)
    (source,) = first.sources
    # the turn after, as llama-index's agents send it: the assistant's call (content null),
    # then its result as a tool message; tool_choice "none" asks for the text answer
    response = llm.chat_with_tools([tool], user_msg=WEATHER, tool_required=True)
    (selection,) = llm.get_tool_calls_from_response(response)
    history = [
        ChatMessage(role=MessageRole.USER, content=WEATHER),
        response.message,
        ChatMessage(
            role=MessageRole.TOOL,
            content=str(tool(**selection.tool_kwargs)),
            additional_kwargs={"tool_call_id": selection.tool_id},
        ),
    ]
    final = llm.chat_with_tools([tool], chat_history=history, tool_choice="none")
    return {
        "calls": calls,
        "output": {"content": source.content, "is_error": source.is_error, "tool": source.tool_name},
        "final": {
            "content": final.message.content,
            "tool_calls": [s.tool_name for s in llm.get_tool_calls_from_response(final, error_on_no_tool_call=False)],
        },
    }


def _stream(llm: OpenAILike) -> dict[str, Any]:
    tool = _weather_tool([])
    chunks = list(llm.stream_chat_with_tools([tool], user_msg=WEATHER, tool_choice="get_weather"))
    selections = llm.get_tool_calls_from_response(chunks[-1])
    return {
        "chunks": len(chunks),
        "selections": [{"name": s.tool_name, "kwargs": s.tool_kwargs, "id": s.tool_id} for s in selections],
    }


def _complete(llm: OpenAILike, scored: OpenAILike) -> dict[str, Any]:
    text = llm.complete(PROMPT).text
    streamed = [chunk.delta or "" for chunk in llm.stream_complete(PROMPT)]
    scored_answer = scored.complete(PROMPT)
    logprobs = [[{"token": p.token, "logprob": p.logprob} for p in top] for top in scored_answer.logprobs or []]
    return {"text": text, "streamed": streamed, "scored": scored_answer.text, "logprobs": logprobs}


RUNS: dict[str, Callable[[OpenAILike], dict[str, Any]]] = {
    "json_schema": _json_schema,
    "function_calling": _function_calling,
    "predict_and_call": _predict_and_call,
    "stream": _stream,
}


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
