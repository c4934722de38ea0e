"""OpenAI's legacy text completions (``POST /v1/completions``) on a chat model: passed, capped, refused.

:func:`prepare` turns a client's body into the body sent to llama-server's own
``/v1/completions``, or raises :class:`~localllm.service.chat.BadRequest` (400 naming
``param``). It shares the chat route's checks and caps (:mod:`localllm.service.chat`):
numbers finite and in OpenAI's ranges, one ceiling for ``max_tokens``, ``n`` capped at the
ceiling and the model's slots, the pin's stop strings merged in, a client's ``grammar``
bounded, ``keep_alive`` taken out. Its own rules, each for what llama-server would get wrong:

* ``prompt`` is required: a string, an array of strings (a batch), an array of token ids, or
  an array of arrays of token ids; at most :data:`MAX_PROMPTS` prompts (and ``n`` capped so
  that prompts × ``n`` stays within it), no negative token id, no empty list of ids.
* ``max_tokens`` defaults to 16, as in OpenAI's API (llama-server's default is no limit).
* ``logprobs`` is an integer 0–5 (OpenAI's): sent as llama-server's ``n_probs`` (at least 1,
  so that 0 still gets each token's own logprob) and the answer's logprobs rewritten into
  OpenAI's legacy shape (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``),
  in a stream event by event (:class:`CompletionStream`).
* A stream's ``data: null`` events are left out: the pinned llama-server starts the stream of
  a batch with one, which the ``openai`` SDK yields as ``None`` (``chunk.choices`` fails).
* ``echo: true``, ``best_of`` > 1 and a non-empty ``suffix`` are refused: this llama-server
  reads none of them (the answer would silently lack what was asked for).
* Structured output and tools are the chat route's (it compiles and validates them):
  ``response_format`` (but ``text``), ``json_schema``, ``tools``, ``functions`` and the
  other chat-only fields are 400s pointing there, never silently ignored.
"""

from __future__ import annotations

import json
from typing import Any

from localllm.service.chat import (
    BadRequest,
    ChatLimits,
    Prepared,
    cap_costs,
    check_grammar,
    check_items,
    check_numbers,
    merge_stops,
    parse_keep_alive,
)

__all__ = ["CHAT_ONLY", "DEFAULT_MAX_TOKENS", "MAX_LOGPROBS", "MAX_PROMPTS", "CompletionStream", "finish", "prepare"]

#: OpenAI's default for this API (the chat route's default is the service's ceiling)
DEFAULT_MAX_TOKENS = 16
#: the prompts (and choices: prompts × n) of one request. langchain_openai's OpenAI sends
#: up to its batch_size, 20, in one request (``llm.batch``); each is a task on the model's
#: slots, so a batch costs as many requests
MAX_PROMPTS = 20
#: OpenAI's largest ``logprobs`` on this API
MAX_LOGPROBS = 5
#: fields only the chat route honours: structured output and tools are compiled and
#: validated there; llama-server's /v1/completions ignores response_format and tools
CHAT_ONLY = (
    "messages",
    "response_format",
    "json_schema",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "top_logprobs",
    "continue_final_message",
)


_DEFAULTS = ChatLimits()


def _refuse_chat_only(body: dict[str, Any]) -> None:
    for name in CHAT_ONLY:
        value = body.get(name)
        if value is None:
            body.pop(name, None)
            continue
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            del body[name]  # the default: nothing to enforce
            continue
        raise BadRequest(
            f"{name} is not served on /v1/completions (llama-server would ignore it there): "
            "send it to POST /v1/chat/completions, where structured output and tool calls are "
            "compiled into a grammar and every answer is validated",
            name,
            "unsupported_parameter",
        )


def _prompts(prompt: Any) -> list[Any]:
    """The prompts of ``prompt`` (one, or a batch), each a string or a list of token ids."""
    shapes = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
    check_items(prompt, "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest(f"prompt must be {shapes}", "prompt")
    if all(_token(t) for t in prompt):
        _ids(prompt, "prompt")
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        for i, ids in enumerate(prompt):
            if not ids or not all(_token(t) for t in ids):
                raise BadRequest(f"prompt[{i}] must be a non-empty array of token ids", f"prompt[{i}]")
            _ids(ids, f"prompt[{i}]")
        return list(prompt)
    raise BadRequest(f"prompt must be {shapes} (not a mix)", "prompt")


def _ids(ids: list[int], param: str) -> None:
    negative = next((j for j, t in enumerate(ids) if t < 0), None)
    if negative is not None:  # never a token id
        raise BadRequest(f"{param}[{negative}] is a negative token id", f"{param}[{negative}]", "invalid_token")


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unsupported(body: dict[str, Any]) -> None:
    """OpenAI's fields this llama-server does not read: refused unless they ask for the default."""
    if body.pop("echo", None) not in (None, False):
        raise BadRequest(
            "echo is not supported: llama-server does not return the prompt with the completion (prepend it yourself)",
            "echo",
            "unsupported_parameter",
        )
    best_of = body.pop("best_of", None)
    if best_of is not None and (isinstance(best_of, bool) or best_of != 1):
        raise BadRequest(
            f"best_of must be 1 here, got {best_of!r:.40}: llama-server generates no candidates to pick "
            "the best of (use n for several completions)",
            "best_of",
            "unsupported_parameter",
        )
    suffix = body.pop("suffix", None)
    if suffix not in (None, ""):
        raise BadRequest(
            "suffix is not supported: llama-server's /v1/completions does not insert text before a suffix",
            "suffix",
            "unsupported_parameter",
        )


def _logprobs(body: dict[str, Any]) -> int | None:
    value = body.pop("logprobs", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise BadRequest(f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {value!r:.40}", "logprobs")
    return value


def prepare(
    data: dict[str, Any],
    model: str,
    *,
    limits: ChatLimits = _DEFAULTS,
    stop: tuple[str, ...] = (),
    parallel: int | None = None,
) -> Prepared:
    """The upstream body and the answer's handling for one completions request (BadRequest: 400)."""
    body = dict(data)
    _refuse_chat_only(body)
    if "prompt" not in body or body["prompt"] is None:
        raise BadRequest("prompt is required", "prompt")
    prompts = _prompts(body["prompt"])
    if len(prompts) > MAX_PROMPTS:
        raise BadRequest(
            f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS} in one request",
            "prompt",
            "too_many_prompts",
        )
    _unsupported(body)
    logprobs = _logprobs(body)
    check_numbers(body)
    check_grammar(body)
    keep_alive = parse_keep_alive(body.pop("keep_alive")) if "keep_alive" in body else None
    cap_costs(body, limits, parallel, DEFAULT_MAX_TOKENS)
    if "n" in body and len(prompts) > 1:  # the choices of a batch: prompts × n
        body["n"] = max(1, min(body["n"], MAX_PROMPTS // len(prompts)))
    if logprobs is not None:
        if body.get("post_sampling_probs") is True:
            # llama-server then gives each token's probability after its samplers (prob,
            # top_probs), which OpenAI's legacy shape has no place for: each logprob was null
            raise BadRequest(
                "post_sampling_probs cannot be used with logprobs here: OpenAI's legacy logprobs are the "
                "model's log-probabilities, not llama-server's probabilities after its samplers",
                "post_sampling_probs",
            )
        # llama-server's n_probs 0 leaves out every logprob; OpenAI's 0 still gives each token's own.
        # Capped as on chat, at ChatLimits.max_logprobs (20 by default: above OpenAI's 5)
        logprobs = min(logprobs, limits.max_logprobs)
        body["n_probs"] = max(logprobs, 1)
    stops = merge_stops(body, stop)
    options = body.get("stream_options")
    prepared = Prepared(
        body=body,
        model=model,
        stream=body.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        keep_alive=keep_alive,
        stops=stops,
        completion=True,
        logprobs=logprobs,
        prompts=prompts,
    )
    return prepared


def finish(prepared: Prepared, answer: dict[str, Any]) -> dict[str, Any]:
    """llama-server's answer for the client: the served model id, OpenAI's legacy logprobs."""
    answer["model"] = prepared.model
    choices = answer.get("choices")
    if prepared.logprobs is None or not isinstance(choices, list):
        return answer
    for i, choice in enumerate(choices):
        if isinstance(choice, dict):
            start = _prompt_end(prepared, choice.get("index", i), len(choices))
            choice["logprobs"] = _legacy_logprobs(choice.get("logprobs"), prepared.logprobs, start)
    return answer


def _prompt_end(prepared: Prepared, index: Any, choices: int) -> int:
    """The length of the prompt choice ``index`` (of ``choices``: prompts × n) completes;
    0 for a prompt of token ids (it has no text)."""
    if not isinstance(index, int) or not prepared.prompts:
        return 0
    n = max(1, choices // len(prepared.prompts))
    prompt = prepared.prompts[min(index // n, len(prepared.prompts) - 1)]
    return len(prompt) if isinstance(prompt, str) else 0


class CompletionStream:
    """A completions stream as OpenAI's clients read it: each event's logprobs (when asked
    for) in OpenAI's legacy shape, the text offsets carried on per choice, and no ``data: null``
    event. Events are rewritten as their lines complete (llama-server sends ``data: …`` lines)."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.pending = b""
        self.offsets: dict[int, int] = {}
        self.dropped = False  # the last line was a dropped event's: its blank line goes too
        body_n = prepared.body.get("n", 1)
        self.choices = len(prepared.prompts) * (body_n if isinstance(body_n, int) else 1)

    def feed(self, chunk: bytes) -> bytes:
        """The complete lines of what has arrived so far, rewritten; the rest kept for later."""
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        return b"".join(self._line(line) for line in data[:cut].splitlines(keepends=True))

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return self._line(rest) if rest else b""

    def _line(self, line: bytes) -> bytes:
        dropped, self.dropped = self.dropped, False
        if line.rstrip(b"\r\n") == b"data: null":
            self.dropped = True
            return b""
        if dropped and not line.strip():
            return b""
        if self.prepared.logprobs is None or not line.startswith(b"data: {"):
            return line
        try:
            event = json.loads(line[6:])
        except ValueError:
            return line
        choices = event.get("choices") if isinstance(event, dict) else None
        if not isinstance(choices, list):
            return line
        top = self.prepared.logprobs
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if not isinstance(index, int) or choice.get("logprobs") is None:
                continue
            if index not in self.offsets:
                self.offsets[index] = _prompt_end(self.prepared, index, self.choices)
            legacy = _legacy_logprobs(choice["logprobs"], top, self.offsets[index])
            choice["logprobs"] = legacy
            if legacy is not None:
                self.offsets[index] += sum(len(t) for t in legacy["tokens"])
        end = line[len(line.rstrip(b"\r\n")) :]
        return b"data: " + json.dumps(event, ensure_ascii=False).encode() + end


def _legacy_logprobs(given: Any, top: int, start: int) -> dict[str, Any] | None:
    """llama-server's ``{"content": [{"token", "logprob", "top_logprobs": [...]}, …]}`` in
    OpenAI's legacy shape; ``start``: the text offset of the first token (the prompt's length)."""
    content = given.get("content") if isinstance(given, dict) else None
    if not isinstance(content, list):
        return None
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, Any]] = []
    offsets: list[int] = []
    offset = start
    for entry in content:
        token = entry.get("token", "") if isinstance(entry, dict) else ""
        token = token if isinstance(token, str) else ""
        tokens.append(token)
        logprobs.append(entry.get("logprob") if isinstance(entry, dict) else None)
        ranked = entry.get("top_logprobs") if isinstance(entry, dict) else None
        tops.append(
            {
                str(t.get("token")): t.get("logprob")
                for t in (ranked if isinstance(ranked, list) else [])[:top]
                if isinstance(t, dict)
            }
        )
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
