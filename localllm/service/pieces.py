"""The service's bounds on the texts llama-server tokenizes (:mod:`localllm.managed.vocab`
counts them with the model's own vocabulary): the 16 MiB a request may be would otherwise
hold a llama-server thread for days, and a client leaving stops none of it.

* a prompt (chat messages, a completions prompt, an embeddings input) that holds more tokens
  than the model's context per slot can never be answered: it is refused at once, as
  llama-server refuses it after tokenizing (``context_length_exceeded``);
* the texts with no context to fit (``/tokenize`` ``content``, ``logit_bias`` texts, the lazy
  grammar's ``preserved_tokens`` and trigger words, ``reasoning_budget_message``, the message
  texts some template may leave out) may hold at most :data:`MAX_PIECES` pieces together, or
  the context's worth when that is more (``too_many_special_tokens``): llama.cpp's split of
  16,384 costs ~0.5 s.
"""

from __future__ import annotations

from typing import Any

from localllm.managed.vocab import SLACK, Vocab, message_texts
from localllm.service.chat import BadRequest, prompt_parts

__all__ = ["MAX_PIECES", "refusal"]

#: the pieces of a text no context bounds: llama.cpp's split of 16,384 takes ~0.5 s
MAX_PIECES = 16_384


def _texts(given: Any) -> list[list[str]]:
    """The texts of each prompt llama-server makes of ``given`` (:func:`chat.prompt_parts`)."""
    return [[x for x in part if isinstance(x, str)] for part in prompt_parts(given)]


def _free_texts(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(param, text) of each text llama-server tokenizes beside the prompt: ``logit_bias``
    texts, ``preserved_tokens``, lazy ``grammar_triggers`` words, ``reasoning_budget_message``."""
    found: list[tuple[str, str]] = []
    bias = data.get("logit_bias")
    if isinstance(bias, dict):
        found.extend(("logit_bias", k) for k in bias if isinstance(k, str) and not k.lstrip("-").isdigit())
    elif isinstance(bias, list):
        found.extend(("logit_bias", p[0]) for p in bias if isinstance(p, list) and p and isinstance(p[0], str))
    preserved = data.get("preserved_tokens")
    if isinstance(preserved, list):
        found.extend(("preserved_tokens", t) for t in preserved if isinstance(t, str))
    triggers = data.get("grammar_triggers")
    if isinstance(triggers, list):
        words = (t.get("value") if isinstance(t, dict) else t for t in triggers)
        found.extend(("grammar_triggers", w) for w in words if isinstance(w, str))
    message = data.get("reasoning_budget_message")
    if isinstance(message, str):
        found.append(("reasoning_budget_message", message))
    return found


def refusal(vocab: Vocab, route: str, data: dict[str, Any], n_ctx: int) -> BadRequest | None:
    """The 400 for a request to ``route`` (a llama-server path) whose texts hold more tokens
    than ``n_ctx`` (the model's context per slot) can, or more pieces than the texts without a
    context may hold together (:data:`MAX_PIECES`); None when every text is within its bound."""
    prompts: list[tuple[str, list[str], int]] = []
    free: list[tuple[str, str]] = []  # (param, text), one budget for them all
    if route == "/v1/chat/completions":
        sure, maybe = message_texts(data.get("messages"))
        prompts.append(("messages", sure, SLACK))
        free.extend(("messages", text) for text in maybe)
    elif route in ("/v1/completions", "/v1/embeddings"):
        field = "prompt" if route == "/v1/completions" else "input"  # content: sent as input (chat.check_embeddings)
        prompts.extend((field, texts, 0) for texts in _texts(data.get(field)))
    for param, texts, slack in prompts:
        found = vocab.tokens(texts, n_ctx, slack)
        if found > n_ctx:
            return BadRequest(
                f"{param} holds at least {found} tokens, past this model's context of {n_ctx} tokens per "
                "request (counted before the model was asked); shorten it, or serve the model with a "
                "larger ctx_size",
                param,
                "context_length_exceeded",
            )
    if route.endswith("completions"):
        free.extend(_free_texts(data))
    if route == "/tokenize":
        free.extend(("content", text) for texts in _texts(data.get("content")) for text in texts)
    limit = max(MAX_PIECES, n_ctx)
    found = 0  # together: 40 logit_bias texts of 16,000 pieces, each within the bound, took 15 s
    for param, text in free:
        found += vocab.pieces(text, limit - found)
        if found > limit:
            return BadRequest(
                f"the texts no context bounds hold more than {limit} pieces split at this model's special "
                f"tokens, passed at {param} (llama.cpp's tokenizer takes time growing with their square)",
                param,
                "too_many_special_tokens",
            )
    return None
