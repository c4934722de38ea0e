"""Texts llama.cpp's tokenizer would spend quadratic time on, refused before it is asked.

``localllm.service.pieces`` bounds a text's tokens from below with the model's own special
tokens (read from its GGUF); the service refuses a prompt past the context per slot, and a
text without a context past ``MAX_PIECES``. The real server and vocabulary are in
``tests/e2e/test_service_front_e2e.py`` (the bound checked against llama-server's counts).
"""

from __future__ import annotations

import json
import random
import struct
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.managed import vocab as vocabulary
from localllm.service import pieces
from localllm.service.chat import (
    INTERNAL_FIELDS,
    MAX_CONTENT_PARTS,
    MAX_EMBEDDING_INPUTS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_PRESERVED_TOKENS,
    MAX_TOKEN_IDS,
    BadRequest,
    check_embeddings,
    check_tokens,
    prepare,
)
from localllm.service.completion import prepare as completion_prepare
from localllm.wire import nesting
from tests.unit.test_service import Factory, client, env, make_service, rows

__all__ = ["env", "make_service"]  # fixtures used here

NL = ["\n" * k for k in range(1, 5)]  # a vocabulary's newline runs, up to 4
SPECIAL = ["<s>", "<start_of_turn>", *NL, "  "]
NORMAL = ["a", "b", "hello", "▁world", "longest-normal-token"]


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def vocab_gguf(path: Path, special: list[str] = SPECIAL, normal: list[str] = NORMAL) -> Path:
    """A GGUF v3 header holding a vocabulary: ``special`` as control (``<``…) and user-defined
    tokens, ``normal`` as normal ones, and no tensors."""
    tokens = [*special, *normal]
    types = [3 if t.startswith("<") else 4 for t in special] + [1] * len(normal)
    body = _string("tokenizer.ggml.model") + struct.pack("<I", 8) + _string("llama")
    body += _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(tokens))
    body += b"".join(_string(t) for t in tokens)
    body += _string("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(types))
    body += b"".join(struct.pack("<i", t) for t in types)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + body)
    return path


@pytest.fixture
def vocab(tmp_path: Path) -> vocabulary.Vocab:
    found = vocabulary.load(vocab_gguf(tmp_path / "v.gguf"))
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 0),
        ("hello world", 1),
        ("a\n" * 10, 20),  # each newline a piece, each letter a stretch
        ("\n" * 10, 3),  # runs read longest first: 4 + 4 + 2
        ("x<start_of_turn>y<s>", 4),
        ("a \n b", 3),  # a blank stretch may be stripped: not counted
        ("  \n", 2),
        ("<start_of_tur", 1),  # a near miss is text
    ],
)
def test_pieces_are_the_special_tokens_and_the_stretches_between(
    vocab: vocabulary.Vocab, text: str, count: int
) -> None:
    assert vocab.pieces(text, 10**9) == count


def test_the_count_stops_past_its_limit(vocab: vocabulary.Vocab) -> None:
    assert 100 < vocab.pieces("a\n" * 1_000_000, 100) <= 102  # each letter and newline a piece


def test_size_bounds_the_tokens_too(vocab: vocabulary.Vocab) -> None:
    # no special token in the text: its bytes over the longest token's (20) bound it
    assert vocab.longest == len("longest-normal-token")
    assert vocab.tokens(["hello world" * 100], 10**9) == -(-1100 // 20)
    assert vocab.tokens(["a\n" * 10, "b\n" * 10], 10**9, 2) == 18 + 18


def test_load_reads_a_file_once_and_refuses_what_is_no_vocabulary(tmp_path: Path) -> None:
    path = vocab_gguf(tmp_path / "v.gguf")
    assert vocabulary.load(path) is vocabulary.load(path)
    (tmp_path / "fake.gguf").write_bytes(b"GGUF chat")
    assert vocabulary.load(tmp_path / "fake.gguf") is None
    assert vocabulary.load(tmp_path / "missing.gguf") is None
    vocab_gguf(path, special=[])
    plain = vocabulary.load(path)
    assert plain is not None and plain.special is None and plain.pieces("a\n" * 10, 10**9) == 1


def _chat(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": text} for role, text in messages]}


@pytest.mark.parametrize(
    ("route", "data", "param", "code"),
    [
        ("/v1/chat/completions", _chat(("user", "a\n" * 51 + "a")), "messages", "context_length_exceeded"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\n" * 60}]}]},
            "messages",
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            _chat(("tool", "a\n" * 30), ("user", "b\n" * 30)),
            "messages",
            "context_length_exceeded",
        ),
        ("/v1/chat/completions", _chat(("system", "a\n" * 60), ("user", "hi")), "messages", "context_length_exceeded"),
        (
            "/v1/chat/completions",
            _chat(("user", "hi"), ("assistant", "<think>x</think>" + "a\n" * 60)),
            "messages",
            "context_length_exceeded",
        ),
        ("/v1/completions", {"prompt": ["ok", "a\n" * 60]}, "prompt", "context_length_exceeded"),
        ("/v1/completions", {"prompt": [1, 2, "a\n" * 60]}, "prompt", "context_length_exceeded"),
        ("/v1/embeddings", {"input": ["ok", "a\n" * 60]}, "input", "context_length_exceeded"),
        ("/v1/embeddings", {"input": [[5, "a\n" * 60]]}, "input", "context_length_exceeded"),
        ("/v1/embeddings", {"input": "hello" * 1000}, "input", "context_length_exceeded"),  # by size
        ("/tokenize", {"content": "a\n" * (pieces.MAX_PIECES // 2 + 1)}, "content", "too_many_special_tokens"),
        # what a template may render: a message's name, reasoning_content, an earlier turn's reasoning
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi", "name": "a\n" * pieces.MAX_PIECES}]},
            "messages",
            "too_many_special_tokens",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "assistant", "content": "ok", "reasoning_content": "a\n" * (pieces.MAX_PIECES // 4)},
                    {"role": "assistant", "content": "<think>" + "a\n" * (pieces.MAX_PIECES // 4) + "</think>ok"},
                    {"role": "user", "content": "hi", "name": "b\n" * 10},
                ]
            },
            "messages",
            "too_many_special_tokens",
        ),
        ("/tokenize", {"content": ["ok", 5, "a\n" * pieces.MAX_PIECES]}, "content", "too_many_special_tokens"),
        (
            "/v1/chat/completions",
            {**_chat(("user", "hi")), "logit_bias": {"a\n" * pieces.MAX_PIECES: 1}},
            "logit_bias",
            "too_many_special_tokens",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "logit_bias": [["a\n" * pieces.MAX_PIECES, False]]},
            "logit_bias",
            "too_many_special_tokens",
        ),
    ],
)
def test_texts_past_their_bound_are_refused(
    vocab: vocabulary.Vocab, route: str, data: dict[str, Any], param: str, code: str
) -> None:
    refused = pieces.refusal(vocab, route, data, 100)
    assert refused is not None and (refused.param, refused.code) == (param, code)


@pytest.mark.parametrize(
    ("route", "data"),
    [
        ("/v1/chat/completions", _chat(("user", "a\n" * 51))),  # 101 pieces, 2 of which may join the template
        # an earlier turn's reasoning may be left out by the template: not counted
        ("/v1/chat/completions", _chat(("user", "hi"), ("assistant", "<think>" + "a\n" * 60 + "</think>ok"))),
        ("/v1/chat/completions", _chat(("user", "\n\n" + "a\n" * 50 + "  \n"))),  # templates trim a message
        ("/v1/completions", {"prompt": ["a\n" * 50, "b\n" * 50]}),  # each prompt a task of its own
        ("/v1/completions", {"prompt": [[1, 2], [3]]}),
        ("/v1/embeddings", {"input": ["a\n" * 50] * 3}),
        ("/tokenize", {"content": "a\n" * (pieces.MAX_PIECES // 2)}),  # no context: MAX_PIECES
        ("/detokenize", {"tokens": [1, 2]}),
        ("/v1/chat/completions", {**_chat(("user", "hi")), "logit_bias": {"15": 1, "-3": 2, "a\n" * 60: 1}}),
    ],
)
def test_texts_within_their_bound_pass(vocab: vocabulary.Vocab, route: str, data: dict[str, Any]) -> None:
    assert pieces.refusal(vocab, route, data, 100) is None


def test_the_pieces_limit_is_the_context_when_that_is_more(vocab: vocabulary.Vocab) -> None:
    data = {"content": "a\n" * pieces.MAX_PIECES}
    assert pieces.refusal(vocab, "/tokenize", data, pieces.MAX_PIECES) is not None
    assert pieces.refusal(vocab, "/tokenize", data, 2 * pieces.MAX_PIECES) is None


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        (["x"] * MAX_EMBEDDING_INPUTS, False),
        (["x"] * (MAX_EMBEDDING_INPUTS + 1), True),
        ([[1]] * (MAX_EMBEDDING_INPUTS + 1), True),
        ([1] * 10_000, False),  # token ids: one input
        (["x", 1] * 5_000, False),  # mixed: one input
    ],
)
def test_an_embeddings_request_holds_at_most_openais_inputs(given: list[Any], refused: bool) -> None:
    if refused:
        with pytest.raises(BadRequest) as caught:
            check_embeddings({"input": given})
        assert caught.value.param == "input"
    else:
        check_embeddings({"input": given})


def test_the_service_refuses_a_prompt_past_the_context_before_llama_server_reads_it(
    make_service: Factory, env: dict[str, Path]
) -> None:
    vocab_gguf(env["chat"])
    service = make_service()
    with client(service) as http:
        fits = http.post("/v1/chat/completions", json={"model": "chat", **_chat(("user", "hello"))})
        past = http.post("/v1/chat/completions", json={"model": "chat", **_chat(("user", "a\n" * 5000))})
        tokenize = http.post("/tokenize", json={"model": "chat", "content": "a\n" * pieces.MAX_PIECES})
        other = http.post("/v1/chat/completions", json={"model": "other", **_chat(("user", "a\n" * 5000))})
        # a tool's description is rendered into the service's own tool prompt
        tool = {"type": "function", "function": {"name": "f", "description": "a\n" * 5000, "parameters": {}}}
        tools = http.post("/v1/chat/completions", json={"model": "chat", "tools": [tool], **_chat(("user", "hi"))})
    assert fits.status_code == 200, fits.text
    assert past.status_code == 400 and past.json()["error"]["code"] == "context_length_exceeded", past.text
    assert tokenize.status_code == 400 and tokenize.json()["error"]["param"] == "content", tokenize.text
    assert tools.status_code == 400 and tools.json()["error"]["code"] == "context_length_exceeded", tools.text
    assert other.status_code == 200, other.text  # a model whose file holds no vocabulary: passed on
    long = [r["path"] for r in rows(env["requests"]) if json.dumps("a\n" * 100)[1:-1] in json.dumps(r["body"])]
    assert long == ["/v1/chat/completions"]  # the other model's: llama-server read neither of the refused


def test_a_request_holds_at_most_azure_openais_messages() -> None:
    many = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    with pytest.raises(BadRequest) as caught:
        prepare({"model": "m", "messages": many}, "m")
    assert caught.value.param == "messages"
    assert prepare({"model": "m", "messages": many[:MAX_MESSAGES]}, "m").body["messages"]


@pytest.mark.parametrize(
    ("path", "param", "fits", "past"),
    [
        # llama-server builds its whole answer: 15 MB of "ab " took 10 s and 2 GB at the peak
        ("/tokenize", "content", "é" * (vocabulary.MAX_TOKENIZE_BYTES // 2), "ab " * 400_000),
        ("/tokenize", "content", ["a" * 1000, 5] * 1000, ["é" * (1 << 19), "a", 5]),
        ("/tokenize", "content", ["a", *[7] * (MAX_TOKEN_IDS - 1)], ["a", *[7] * MAX_TOKEN_IDS]),
        # 2 million of gemma-3's longest token: a 92 MB text, 540 MB at the peak
        ("/detokenize", "tokens", [80645] * MAX_TOKEN_IDS, [80645] * (MAX_TOKEN_IDS + 1)),
    ],
)
def test_what_llama_server_answers_whole_is_bounded(path: str, param: str, fits: Any, past: Any) -> None:
    check_tokens(path, {param: fits})
    with pytest.raises(BadRequest) as caught:
        check_tokens(path, {param: past})
    assert caught.value.param == param
    if isinstance(past, str):  # a text holds no ids
        assert f"{len(past.encode()):,} bytes of text;" in str(caught.value)


def test_a_request_holds_at_most_so_many_content_parts() -> None:
    # llama-server joins text parts with a newline, a piece the texts' count cannot see: 48,000
    # parts of "a" were 96,000 pieces (11.8 s) within the context by their bytes
    part = {"type": "text", "text": "a"}
    one = [{"role": "user", "content": [part] * (MAX_CONTENT_PARTS + 1)}]
    spread = [{"role": "user", "content": [part] * 1000}, {"role": "assistant", "content": "b"}] * 3
    for messages, param in ((one, "messages[0].content"), (spread, "messages[4].content")):
        with pytest.raises(BadRequest) as caught:
            prepare({"model": "m", "messages": messages}, "m")
        assert caught.value.param == param
    fits = [{"role": "user", "content": [part] * (MAX_CONTENT_PARTS // 2)}] * 2
    assert [len(m["content"]) for m in prepare({"model": "m", "messages": fits}, "m").body["messages"]] == [1024] * 2


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": [{"role": "user", "content": "a\n" * 40_000}]}, "chat_template_kwargs.messages"),
        ({"tools": "x"}, "chat_template_kwargs.tools"),
        ({"documents": [{"text": "a\n" * 100}]}, "chat_template_kwargs.documents"),
        ({"note": "x" * 257}, "chat_template_kwargs.note"),
        ({f"k{i}": True for i in range(17)}, "chat_template_kwargs"),
        ("enable_thinking", "chat_template_kwargs"),
    ],
)
def test_template_kwargs_that_would_replace_or_fill_the_prompt_are_refused(kwargs: Any, param: str) -> None:
    # llama-server sets them over the template's own variables: `messages` there replaced the
    # checked messages (80 KB held the pinned server 10 s)
    with pytest.raises(BadRequest) as caught:
        prepare({"model": "m", **_chat(("user", "hi")), "chat_template_kwargs": kwargs}, "m")
    assert caught.value.param == param


@pytest.mark.parametrize("effort", ["a\n" * 1000, 5, "HIGH"])
def test_reasoning_effort_is_one_of_openais(effort: Any) -> None:
    # llama.cpp sets it as a template variable, rendered by the templates that read it
    with pytest.raises(BadRequest) as caught:
        prepare({**_chat(("user", "hi")), "reasoning_effort": effort}, "m")
    assert caught.value.param == "reasoning_effort"
    assert prepare({**_chat(("user", "hi")), "reasoning_effort": "low"}, "m").body["reasoning_effort"] == "low"


def test_template_switches_pass() -> None:
    switches = {"enable_thinking": False, "reasoning_effort": "low", "budget": 5, "x": None}
    sent = prepare({"model": "m", **_chat(("user", "hi")), "chat_template_kwargs": switches}, "m").body
    assert sent["chat_template_kwargs"] == switches
    assert "chat_template_kwargs" not in prepare({**_chat(("user", "hi")), "chat_template_kwargs": None}, "m").body


def _refused(route: str, extra: dict[str, Any]) -> BadRequest:
    """The 400 of a chat (or completions) request holding ``extra``."""
    with pytest.raises(BadRequest) as caught:
        if route == "chat":
            prepare({"model": "m", **extra, **_chat(("user", "hi"))}, "m")
        else:
            completion_prepare({"model": "m", **extra, "prompt": "hi"}, "m")
    return caught.value


@pytest.mark.parametrize("field", INTERNAL_FIELDS)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_llama_servers_own_fields_are_refused(field: str, route: str) -> None:
    # chat_parser: a PEG parser whose rules name each other by unchecked index; one naming
    # itself (100 bytes) overflowed the pinned server's stack
    cycle = json.dumps({"parsers": [{"type": "and", "child": 0}], "rules": {}, "root": 0})
    assert _refused(route, {field: cycle}).param == field


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_each_sampler_is_named_once(route: str) -> None:
    # llama-server runs the chain as given: "t" * 10,000 took it 1.1 s a token, "d" * 100 (DRY,
    # each matching its breakers against the vocabulary) 10 s, every slot waiting
    # infill compares each pair of candidates: "i" held the pinned server past 590 s for one token
    refused: list[Any] = ["t" * 10_000, "dd", ["top_k", "Top-K"], ["temp", "temperature"], 5, ["top_k", 1], ["x" * 33]]
    for samplers in refused:
        assert _refused(route, {"samplers": samplers}).param == "samplers", samplers
    for samplers in ("i", "ki", ["top_k", "Infill"]):
        assert "infill" in str(_refused(route, {"samplers": samplers})), samplers
    taken: list[Any] = ["dkypsmtxea", ["penalties", "dry", "top_k", "nucleus", "temperature"], [], None]
    for samplers in taken:
        if route == "chat":
            prepare({"model": "m", "samplers": samplers, **_chat(("user", "hi"))}, "m")
        else:
            completion_prepare({"model": "m", "samplers": samplers, "prompt": "hi"}, "m")


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_message_delimiters_and_the_grammar_type_are_llama_servers_own(route: str) -> None:
    # each delimiter tokenized (120 KB of "a\n": 7.6 s); "tool_calls" fed the template's
    # generation prompt to the client's grammar (a 400 naming nothing)
    delimiters = [{"role": "user", "delimiter": "a\n" * 40_000}]
    assert _refused(route, {"message_delimiters": delimiters}).param == "message_delimiters"
    assert _refused(route, {"grammar": 'root ::= "x"', "grammar_type": "tool_calls"}).param == "grammar_type"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"preserved_tokens": ["<s>", "a\n" * pieces.MAX_PIECES]}, "preserved_tokens"),
        ({"grammar_triggers": [{"type": 0, "value": "a\n" * pieces.MAX_PIECES}]}, "grammar_triggers"),
        ({"reasoning_budget_message": "a\n" * pieces.MAX_PIECES}, "reasoning_budget_message"),
    ],
)
def test_texts_llama_server_tokenizes_beside_the_prompt_are_bounded(
    vocab: vocabulary.Vocab, extra: dict[str, Any], param: str
) -> None:
    refused = pieces.refusal(vocab, "/v1/completions", {"prompt": "hi", **extra}, 100)
    assert refused is not None and (refused.param, refused.code) == (param, "too_many_special_tokens")
    lazy = {
        "preserved_tokens": ["<s>"],
        "grammar_triggers": [{"type": 0, "value": "<s>"}],
        "reasoning_budget_message": "ok",
    }
    assert pieces.refusal(vocab, "/v1/completions", {"prompt": "hi", **lazy}, 100) is None


def test_the_texts_beside_the_prompt_share_one_budget(vocab: vocabulary.Vocab) -> None:
    # each within the bound alone: 40 logit_bias texts of 16,000 pieces took the pinned server 15 s
    third = "a\n" * (pieces.MAX_PIECES // 6 + 1)
    for extra, param in (
        ({"logit_bias": [[third + str(i), 1] for i in range(3)]}, "logit_bias"),
        ({"preserved_tokens": [third, third], "reasoning_budget_message": third}, "reasoning_budget_message"),
    ):
        refused = pieces.refusal(vocab, "/v1/completions", {"prompt": "hi", **extra}, 100)
        assert refused is not None and (refused.param, refused.code) == (param, "too_many_special_tokens")
    two = {"logit_bias": [[third + str(i), 1] for i in range(2)]}
    assert pieces.refusal(vocab, "/v1/completions", {"prompt": "hi", **two}, 100) is None


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_logit_bias_and_preserved_tokens_are_counted(route: str) -> None:
    # llama-server applies each bias at every token and tokenizes each text: a million tiny
    # texts took 24 s; a million preserved_tokens 37 s
    for extra, param in (
        ({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}}, "logit_bias"),
        ({"logit_bias": [["ab", 1]] * (MAX_LOGIT_BIAS + 1)}, "logit_bias"),
        ({"preserved_tokens": ["ab"] * (MAX_PRESERVED_TOKENS + 1)}, "preserved_tokens"),
        ({"preserved_tokens": [1]}, "preserved_tokens"),
        ({"preserved_tokens": "ab"}, "preserved_tokens"),
    ):
        assert _refused(route, extra).param == param
    fits: dict[str, Any] = {
        "logit_bias": [["ab", 1]] * MAX_LOGIT_BIAS,
        "preserved_tokens": ["ab"] * MAX_PRESERVED_TOKENS,
    }
    if route == "chat":
        prepare({"model": "m", **fits, **_chat(("user", "hi"))}, "m")
    else:
        completion_prepare({"model": "m", **fits, "prompt": "hi"}, "m")


@pytest.mark.parametrize(
    ("triggers", "param"),
    [
        ([{"type": 2, "value": "(a*)*b"}], "grammar_triggers[0]"),  # std::regex backtracks without end
        ([{"type": 1, "value": "ok"}, {"type": 3, "value": "(a|aa)+b"}], "grammar_triggers[1]"),
        ([{"type": 7, "value": "a"}], "grammar_triggers[0]"),  # took the pinned server down
        ([{"type": 0, "value": "a", "token": 5}], "grammar_triggers[0]"),
        ([{"type": True, "value": "a"}], "grammar_triggers[0]"),
        ([{"type": 1, "value": ""}], "grammar_triggers[0]"),
        (["word"], "grammar_triggers[0]"),
        ([{"type": 1, "value": "w"}] * 17, "grammar_triggers"),
        ("word", "grammar_triggers"),
    ],
)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_lazy_grammar_triggers_are_words(triggers: Any, param: str, route: str) -> None:
    data = {"grammar": 'root ::= "x"', "grammar_lazy": True, "grammar_triggers": triggers}
    assert _refused(route, data).param == param


def test_word_triggers_pass() -> None:
    words = [{"type": 1, "value": "answer is"}, {"type": 1, "value": "<eos>"}]
    sent = completion_prepare({"prompt": "hi", "grammar_lazy": True, "grammar_triggers": words}, "m").body
    assert sent["grammar_triggers"] == words
    assert "grammar_triggers" not in completion_prepare({"prompt": "hi", "grammar_triggers": None}, "m").body


@pytest.mark.parametrize(
    ("route", "data", "param"),
    [
        ("completions", {"prompt": [2] * (MAX_TOKEN_IDS + 1)}, "prompt"),
        ("completions", {"prompt": [[2] * (MAX_TOKEN_IDS // 2)] * 3}, "prompt"),  # a batch, together
        ("embeddings", {"input": [101] * (MAX_TOKEN_IDS + 1)}, "input"),
        ("embeddings", {"input": [[101] * 1000] * 300}, "input"),
        ("embeddings", {"content": ["a"] * (MAX_TOKEN_IDS + 1)}, "content"),  # texts count too; the field sent
    ],
)
def test_a_request_holds_at_most_so_many_token_ids(route: str, data: dict[str, Any], param: str) -> None:
    # 16 MiB of token ids is 8 million: every pass over them in Python held the service's event
    # loop (8.5 s for one request), and llama-server refused the prompt after 6 s of its own
    with pytest.raises(BadRequest) as caught:
        if route == "completions":
            completion_prepare({"model": "m", **data}, "m")
        else:
            check_embeddings(data)
    assert (caught.value.param, caught.value.code) == (param, "too_many_tokens")
    completion_prepare({"model": "m", "prompt": [2] * MAX_TOKEN_IDS}, "m")
    check_embeddings({"input": [[101] * 1000] * (MAX_TOKEN_IDS // 1000)})


def _depth(value: Any) -> int:
    """How deep a JSON value nests, by the definition (a scalar 1, a container 1 + its deepest item)."""
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
    return 1 if items is None else 1 + max(map(_depth, items), default=0)


def test_nesting_counts_as_the_definition_does() -> None:
    # level by level over containers only (an array of 8 million numbers: 3.4 s -> 0.56 s)
    rng = random.Random(7)

    def value(level: int) -> Any:
        roll = rng.random()
        if level > 9 or roll < 0.3:
            return rng.choice([1, "a", None, [], {}])
        if roll < 0.65:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {str(i): value(level + 1) for i in range(rng.randint(0, 3))}

    for _ in range(3000):
        found = value(0)
        assert nesting(found, 256) == _depth(found), found
        assert nesting(found, 3) == _depth(found) or (nesting(found, 3) > 3 and _depth(found) > 3), found
    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    assert nesting(deep, 256) == 257  # stops counting past the limit


@pytest.mark.parametrize("slowed", ["_parse", "prepare"])
def test_a_large_body_is_read_and_prepared_off_the_event_loop(
    make_service: Factory, monkeypatch: pytest.MonkeyPatch, slowed: str
) -> None:
    # 16 MiB of token ids held the loop 8.5 s: /health, and every other client, waited
    from localllm.service import api, completion

    service = make_service()
    owner, name = (api, "_parse") if slowed == "_parse" else (completion, "prepare")
    real = getattr(owner, name)
    started, answered = threading.Event(), threading.Event()
    waited: list[bool] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        if slowed == "prepare" or len(args[0]) > api._OFF_LOOP_BYTES:
            started.set()
            waited.append(answered.wait(10))  # set once the service has answered /health meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)
    big = {"model": "chat", "prompt": "word " * 250_000, "max_tokens": 1}  # 1.25 MB
    replies: list[httpx.Response] = []

    def send() -> None:
        with client(service) as http:
            replies.append(http.post("/v1/completions", json=big))

    sender = threading.Thread(target=send)
    sender.start()
    assert started.wait(10)
    with client(service) as http:
        assert http.get("/health").status_code == 200
    answered.set()
    sender.join()
    assert waited == [True]
    assert replies[0].status_code == 200, replies[0].text
