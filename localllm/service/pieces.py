"""A lower bound on the tokens of a request's texts, counted before llama-server tokenizes them.

llama.cpp splits a text at each occurrence of a *special* token (control, user-defined and
unknown ones: gemma-3's 6,414 include ``<start_of_turn>``, one to 31 newlines, tabs and runs
of spaces) before its tokenizer reads the stretches between, and each split walks the list
of pieces from its head (``tokenizer_st_partition``): the time grows with the square of the
pieces. On the pinned llama-server with gemma-3-270m, a chat message of 80 KB of ``"a\\n"``
(80,000 pieces) held a thread for 13 s before llama-server refused it for the context; the
16 MiB a request may be would hold it for days, and a client leaving stops none of it.

Each special piece is one token, and each stretch of other text between two of them at least
one more, so a text's pieces bound its tokens from below; so does its size over the longest
token's. :func:`refusal` counts them with the model's own vocabulary (its GGUF, read once):

* a prompt (chat messages, a completions prompt, an embeddings input) that holds more tokens
  than the model's context per slot can never be answered: it is refused at once, as
  llama-server refuses it after tokenizing (``context_length_exceeded``);
* a text with no context to fit (``/tokenize`` ``content``, a ``logit_bias`` text, the lazy
  grammar's ``preserved_tokens`` and trigger words, ``reasoning_budget_message``; the message
  texts some template may leave out, together) may hold
  at most :data:`MAX_PIECES` pieces, or the context's worth when that is more
  (``too_many_special_tokens``).

The pieces are found leftmost-longest, as llama.cpp finds them longest token first: the two
part only where two special tokens overlap without one holding the other. Within the bounds,
llama.cpp's split costs at most ~0.5 s (16,384 pieces).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.managed.gguf import GGUFError, read_metadata
from localllm.service.chat import BadRequest

__all__ = ["MAX_PIECES", "Vocab", "load", "refusal"]

#: the pieces of a text no context bounds: llama.cpp's split of 16,384 takes ~0.5 s
MAX_PIECES = 16_384
#: GGUF token types llama.cpp splits a text at (unknown, control, user-defined)
_SPECIAL_TYPES = frozenset({2, 3, 4})
#: a chat message's text may lose a piece at each end to the template around it
_SLACK = 2


@dataclass(frozen=True)
class Vocab:
    """What bounds a text's tokens from below: the special tokens and the longest token."""

    #: the special tokens as one pattern, the longest first at each position (None: none)
    special: re.Pattern[str] | None
    #: bytes of the longest token
    longest: int

    def pieces(self, text: str, limit: int) -> int:
        """The special tokens in ``text`` and the non-blank stretches between them (each at
        least one token); the count stops past ``limit``."""
        if self.special is None:
            return 0 if not text or text.isspace() else 1
        count = last = 0
        for match in self.special.finditer(text):
            if match.start() > last and not text[last : match.start()].isspace():
                count += 1
            count += 1
            last = match.end()
            if count > limit:
                return count
        if last < len(text) and not text[last:].isspace():
            count += 1
        return count

    def tokens(self, texts: list[str], limit: int, slack: int = 0) -> int:
        """A lower bound on the tokens of ``texts`` tokenized as one prompt, each of which may
        lose ``slack`` pieces where it joins the text around it; the count stops past ``limit``."""
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        at_least = -(-size // self.longest)
        if at_least > limit:
            return at_least
        found = 0
        for text in texts:
            found += max(0, self.pieces(text, limit - found + slack) - slack)
            if found > limit:
                break
        return max(at_least, found)


def _alternation(words: list[str]) -> str:
    """``words`` as a trie of alternatives, each ending optional after its longest continuation."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


_cache: dict[tuple[str, int, int], Vocab | None] = {}
_cache_lock = threading.Lock()


def load(path: str | Path) -> Vocab | None:
    """The :class:`Vocab` of the GGUF at ``path`` (read once per file version); None when it is
    not a readable GGUF with a vocabulary."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        try:
            meta = read_metadata(Path(path), arrays=True)
        except GGUFError:
            meta = {}
        tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
        vocab: Vocab | None = None
        if isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens):
            kinds = types if isinstance(types, list) and len(types) == len(tokens) else [1] * len(tokens)
            special = sorted({t for t, kind in zip(tokens, kinds, strict=True) if kind in _SPECIAL_TYPES and t})
            longest = max(len(t.encode()) for t in tokens) or 1
            # a trie nests one group per character: the longest special tokens are a few dozen
            vocab = Vocab(re.compile(_alternation(special)) if special else None, longest)
        _cache[key] = vocab
        return vocab


def _prompts(given: Any) -> list[list[str]]:
    """The texts of each prompt llama-server makes of a completions ``prompt`` or embeddings
    ``input``: a string; an array of strings or arrays (one prompt each); an array holding a
    token id (one prompt: its strings)."""
    if isinstance(given, str):
        return [[given]]
    if not isinstance(given, list):
        return []
    if any(isinstance(x, int) for x in given):
        return [[x for x in given if isinstance(x, str)]]
    return [
        [x] if isinstance(x, str) else [y for y in x if isinstance(y, str)] for x in given if isinstance(x, (str, list))
    ]


def _message_texts(messages: Any) -> tuple[list[str], list[str]]:
    """The texts of the messages every template renders, as it renders them (``trim``-med; an
    assistant's only after its last ``</think>``: reasoning templates leave an earlier turn's
    out), and those some template may render: that reasoning, and every other string of a
    message (``name``, ``reasoning_content``, …)."""
    sure: list[str] = []
    maybe: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                if message.get("role") == "assistant":
                    reasoning, _, text = text.rpartition("</think>")
                    maybe.append(reasoning)
                sure.append(text.strip())
        maybe.extend(v for k, v in message.items() if isinstance(v, str) and k not in ("role", "content"))
    return sure, maybe


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
    than ``n_ctx`` (the model's context per slot) can, or more pieces than a text without a
    context may (:data:`MAX_PIECES`); None when every text is within its bound."""
    prompts: list[tuple[str, list[str], int]] = []
    free: list[tuple[str, list[str]]] = []
    if route == "/v1/chat/completions":
        sure, maybe = _message_texts(data.get("messages"))
        prompts.append(("messages", sure, _SLACK))
        free.append(("messages", maybe))
    elif route in ("/v1/completions", "/v1/embeddings"):
        field = "prompt" if route == "/v1/completions" else ("input" if "input" in data else "content")
        prompts.extend((field, texts, 0) for texts in _prompts(data.get(field)))
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
        free.extend((param, [text]) for param, text in _free_texts(data))
    if route == "/tokenize":
        free.extend(("content", [text]) for texts in _prompts(data.get("content")) for text in texts)
    limit = max(MAX_PIECES, n_ctx)
    for param, texts in free:
        found = 0
        for text in texts:
            found += vocab.pieces(text, limit - found)
            if found > limit:
                break
        if found > limit:
            return BadRequest(
                f"{param} holds more than {limit} pieces split at this model's special tokens "
                "(llama.cpp's tokenizer takes time growing with their square)",
                param,
                "too_many_special_tokens",
            )
    return None
