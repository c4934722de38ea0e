"""A lower bound on the tokens of a text, counted with the model's own vocabulary before
llama-server tokenizes it.

llama.cpp splits a text at each occurrence of a *special* token (control, user-defined and
unknown ones: gemma-3's 6,414 include ``<start_of_turn>``, one to 31 newlines, tabs and runs
of spaces) before its tokenizer reads the stretches between, and each split walks the list
of pieces from its head (``tokenizer_st_partition``): the time grows with the square of the
pieces. On the pinned llama-server with gemma-3-270m, a chat message of 80 KB of ``"a\\n"``
(80,000 pieces) held a thread for 13 s before llama-server refused it for the context.

Each special piece is one token, and each stretch of other text between two of them at least
one more, so a text's pieces bound its tokens from below; so does its size over the longest
token's. A prompt whose bound passes the context per slot can never be answered: the service
(``localllm.service.pieces``) and a managed ``builtin.local_llm`` refuse it at once.

The pieces are found leftmost-longest, as llama.cpp finds them longest token first: the two
part only where two special tokens overlap without one holding the other.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.managed.gguf import GGUFError, read_metadata

__all__ = ["MAX_TOKENIZE_BYTES", "QUICK_BYTES", "SLACK", "Vocab", "from_props", "load", "message_texts"]

#: GGUF token types llama.cpp splits a text at (unknown, control, user-defined)
_SPECIAL_TYPES = frozenset({2, 3, 4})
#: a chat message's text may lose a piece at each end to the template around it
SLACK = 2
#: texts this small are not counted: llama.cpp's split of as many pieces takes ~0.13 s (8,192),
#: less than reading a vocabulary (gemma-3's 262,144 tokens: 0.86 s, once per process)
QUICK_BYTES = 8 << 10
#: the most text one ``POST /tokenize`` is asked (UTF-8 bytes): llama-server builds its whole
#: answer, every token a JSON value, before sending it: 15 MB of ``"ab "`` (5 million tokens)
#: took the pinned server 10 s and 2 GB at the peak, 1 GB of it kept. A MiB holds far more
#: tokens than any served context (8,192 of 128 bytes): 0.9 s and 140 MB with each piece
MAX_TOKENIZE_BYTES = 1 << 20


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


def from_props(props: Any) -> tuple[Vocab, int] | None:
    """The vocabulary (the GGUF at ``model_path``) and context per slot
    (``default_generation_settings.n_ctx``) of a llama-server's ``GET /props`` answer."""
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    path = props.get("model_path") if isinstance(props, dict) else None
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx <= 0 or not isinstance(path, str):
        return None
    vocab = load(path)
    return None if vocab is None else (vocab, n_ctx)


def message_texts(messages: Any) -> tuple[list[str], list[str]]:
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
