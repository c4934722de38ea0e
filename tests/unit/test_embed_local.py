"""LocalEmbedder client logic over httpx.MockTransport: prefixes, batching, order, limits, norms."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from localllm.config import EmbedderDecl
from localllm.embed.embedder import fake_vector
from localllm.embed.local import LocalEmbedder, embedder_from_decl
from localllm.embed.registry import ModelInfo, lookup
from localllm.errors import DimensionMismatch, EmbedServerError, FetchError, InputTooLong
from localllm.managed.server import ServerState
from localllm.managed.vocab import MAX_TOKENIZE_BYTES
from tests.conftest import pid_gone

CLS, SEP = 101, 102


class FakeServer:
    """Enough of llama-server: whitespace tokens, [CLS]/[SEP] specials, fake vectors."""

    def __init__(self, dims: int = 8, *, shuffle: bool = True, ubatch: int = 64) -> None:
        self.dims = dims
        self.shuffle = shuffle
        self.ubatch = ubatch
        self.requests: list[dict[str, Any]] = []
        self.tokenize_calls = 0
        self.tokenized_bytes: list[int] = []
        self.vocab: dict[str, int] = {}
        self.mutate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.status = 200

    def ids(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, 1000 + len(self.vocab)) for w in text.split()]

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            self.tokenize_calls += 1
            self.tokenized_bytes.append(len(body["content"].encode()))
            ids = self.ids(body["content"])
            return httpx.Response(200, json={"tokens": [CLS, *ids, SEP] if body.get("add_special") else ids})
        assert request.url.path == "/v1/embeddings"
        self.requests.append(body)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "boom"}})
        data = []
        for i, item in enumerate(body["input"]):
            n = len(item) if isinstance(item, list) else len(self.ids(item)) + 2
            if n > self.ubatch:
                return httpx.Response(500, json={"error": {"message": f"input ({n} tokens) is too large"}})
            vec = np.asarray(fake_vector(json.dumps(item), self.dims), dtype="<f4")
            value: Any = (
                base64.b64encode(vec.tobytes()).decode() if body.get("encoding_format") == "base64" else vec.tolist()
            )
            data.append({"index": i, "embedding": value, "object": "embedding"})
        if self.shuffle:
            data.reverse()
        out = {"data": data, "model": body.get("model")}
        return httpx.Response(200, json=self.mutate(out) if self.mutate else out)


def _info(**kw: Any) -> ModelInfo:
    base: dict[str, Any] = dict(
        id="t", dims=8, context=64, max_input_tokens=64, query_prefix="q: ", document_prefix="d: "
    )
    base.update(kw)
    return ModelInfo(**base)


def _embedder(server: FakeServer, **kw: Any) -> LocalEmbedder:
    kw.setdefault("model_info", _info(dims=server.dims))
    return LocalEmbedder("http://embed.test", "t", transport=httpx.MockTransport(server.handler), **kw)


def test_prefixes_order_and_shape() -> None:
    server = FakeServer()
    emb = _embedder(server)
    out = emb.embed(["alpha", "beta", "gamma"], "query")
    assert out.dtype == np.float32 and out.shape == (3, 8)
    assert server.requests[0]["input"] == ["q: alpha", "q: beta", "q: gamma"]
    # the server answered in reverse; rows are back in input order
    for row, text in zip(out, ["q: alpha", "q: beta", "q: gamma"], strict=True):
        assert row.tolist() == pytest.approx(fake_vector(json.dumps(text), 8), abs=1e-6)
    emb.embed(["alpha"], "document")
    assert server.requests[1]["input"] == ["d: alpha"]


def test_batches_respect_count_and_token_budgets() -> None:
    server = FakeServer()
    emb = _embedder(server, batch_size=4, batch_tokens=40)
    texts = [f"t{i}" for i in range(10)]  # each costs len("q: tN")+4 ≤ 10 bytes-bound tokens
    out = emb.embed(texts, "query")
    assert out.shape == (10, 8)
    sizes = [len(r["input"]) for r in server.requests]
    assert sum(sizes) == 10 and max(sizes) <= 4
    assert server.tokenize_calls == 0  # short texts never need a /tokenize round trip
    server.requests.clear()
    emb2 = _embedder(server, batch_size=100, batch_tokens=25)
    emb2.embed(texts, "query")
    assert all(len(r["input"]) <= 2 for r in server.requests)


def test_long_input_is_truncated_by_tokens_keeping_specials(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer(ubatch=64)
    emb = _embedder(server, model_info=_info(max_input_tokens=10, query_prefix="", document_prefix=""))
    words = " ".join(f"w{i}" for i in range(30))
    with caplog.at_level(logging.WARNING):
        out = emb.embed(["short", words], "document")
    assert out.shape == (2, 8)
    sent = server.requests[0]["input"]
    assert sent[0] == "short"
    assert sent[1] == [CLS, *server.ids(" ".join(f"w{i}" for i in range(8))), SEP]
    assert emb.truncated == 1 and "1 of 2 embedding inputs truncated to 10 tokens (longest 32)" in caplog.text


def test_long_input_rejected_when_asked() -> None:
    server = FakeServer()
    emb = _embedder(server, model_info=_info(max_input_tokens=10), on_too_long="error")
    with pytest.raises(InputTooLong, match=r"input 1 has 33 tokens.*at most 10"):
        emb.embed(["ok", " ".join(["w"] * 30)], "document")
    assert server.requests == []  # nothing was sent, no 500 possible


def test_a_text_past_what_a_server_tokenizes_at_once_is_counted_and_cut_by_its_head() -> None:
    # the service refuses /tokenize past MAX_TOKENIZE_BYTES (llama-server built a 15 MB text's
    # answer whole: 2 GB); far more tokens than any embedder takes remain in that head
    server = FakeServer(ubatch=64)
    emb = _embedder(server, model_info=_info(max_input_tokens=10, document_prefix=""))
    huge = "é " * (MAX_TOKENIZE_BYTES // 3 + 1000)  # 3 bytes a word
    emb.embed([huge], "document")
    assert max(server.tokenized_bytes) <= MAX_TOKENIZE_BYTES
    assert server.requests[0]["input"] == [[CLS, *server.ids("é " * 8), SEP]] and emb.truncated == 1
    strict = _embedder(server, model_info=_info(max_input_tokens=10, document_prefix=""), on_too_long="error")
    with pytest.raises(InputTooLong, match=r"input 0 has more than \d+ tokens.*at most 10"):
        strict.embed([huge], "document")


def test_text_over_the_byte_bound_but_within_tokens_is_sent_as_text() -> None:
    server = FakeServer()
    emb = _embedder(server, model_info=_info(max_input_tokens=10, document_prefix=""))
    emb.embed(["aaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbb"], "document")  # 34 bytes, 4 tokens
    assert server.requests[0]["input"] == ["aaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbb"]
    assert server.tokenize_calls == 3  # the specials probe (2) and the text (1)


def test_count_and_index_checks() -> None:
    server = FakeServer()
    emb = _embedder(server)
    server.mutate = lambda out: {**out, "data": out["data"][:-1]}
    with pytest.raises(EmbedServerError, match="returned 1 vectors for 2 inputs"):
        emb.embed(["a", "b"], "query")
    server.mutate = lambda out: {**out, "data": [{**d, "index": 0} for d in out["data"]]}
    with pytest.raises(EmbedServerError, match="repeated index"):
        emb.embed(["a", "b"], "query")


def test_dims_mismatch_with_the_registry_is_an_error() -> None:
    server = FakeServer(dims=8)
    emb = _embedder(server, model_info=_info(dims=16))
    with pytest.raises(DimensionMismatch, match="should give 16-dimension vectors"):
        emb.embed(["a"], "query")


def _scale(out: dict[str, Any]) -> dict[str, Any]:
    for d in out["data"]:
        v = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") * 3
        d["embedding"] = base64.b64encode(v.astype("<f4").tobytes()).decode()
    return out


def test_unnormalised_server_output_is_refused_with_normalize_false() -> None:
    server = FakeServer()
    emb = _embedder(server, normalize=False)
    server.mutate = _scale
    with pytest.raises(EmbedServerError, match=r"L2 norm 3\.0") as info:
        emb.embed(["a"], "query")
    # an attached server of unknown kind: the fix is ours to name, not a llama-server flag
    assert "llama-server" not in str(info.value) and "normalize" in str(info.value)


def test_unnormalised_server_output_is_normalised_here_by_default_and_noted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakeServer()
    plain = _embedder(server).embed(["a", "b"], "query")
    server.mutate = _scale
    emb = _embedder(server)
    with caplog.at_level("INFO", logger="localllm.embed.local"):
        first = emb.embed(["a", "b"], "query")
        emb.embed(["c"], "query")
    assert emb.normalized_here is True
    assert np.linalg.norm(first, axis=1).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    assert np.allclose(first, plain, atol=1e-6)
    assert sum("normalising them here" in r.getMessage() for r in caplog.records) == 1


def test_normalize_true_normalises_even_unit_answers_and_says_nothing() -> None:
    server = FakeServer()
    emb = _embedder(server, normalize=True)
    out = emb.embed(["a"], "query")
    assert np.linalg.norm(out[0]) == pytest.approx(1.0, abs=1e-6)
    assert emb.normalized_here is False


def test_float_encoding_is_accepted() -> None:
    server = FakeServer()

    def as_float(out: dict[str, Any]) -> dict[str, Any]:
        for d in out["data"]:
            d["embedding"] = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist()
        return out

    server.mutate = as_float
    assert _embedder(server).embed(["a"], "query").shape == (1, 8)


def _poison(embedding: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mutate(out: dict[str, Any]) -> dict[str, Any]:
        out["data"][0]["embedding"] = embedding
        return out

    return mutate


@pytest.mark.parametrize(
    "embedding",
    [
        base64.b64encode(np.full(8, np.nan, dtype="<f4").tobytes()).decode(),  # NaN: stored for good before
        [1e39] * 8,  # past float32: inf
        [10**400] * 8,  # OverflowError before
        ["a"] * 8,  # numpy's bare ValueError before
        "not base64!",  # binascii.Error before
    ],
    ids=["nan", "inf", "bigint", "strings", "not-base64"],
)
def test_a_vector_that_is_not_finite_numbers_is_a_server_error(embedding: Any) -> None:
    server = FakeServer(shuffle=False)
    server.mutate = _poison(embedding)
    with pytest.raises(EmbedServerError):
        _embedder(server).embed(["a", "b"], "query")


def test_matryoshka_truncates_and_renormalises() -> None:
    server = FakeServer(dims=16)
    info = _info(dims=16, matryoshka_dims=(16, 8, 4))
    full = _embedder(server, model_info=info).embed(["x"], "query")[0]
    small = _embedder(server, model_info=info, dims=4).embed(["x"], "query")[0]
    assert small.shape == (4,)
    assert np.linalg.norm(small) == pytest.approx(1.0, abs=1e-6)
    assert small.tolist() == pytest.approx((full[:4] / np.linalg.norm(full[:4])).tolist(), abs=1e-6)
    assert _embedder(server, model_info=info, dims=4).identity.dims == 4


def test_matryoshka_layer_norm_recipe() -> None:
    server = FakeServer(dims=16)
    info = _info(dims=16, matryoshka_dims=(16, 8), matryoshka_layer_norm=True)
    full = _embedder(server, model_info=info).embed(["x"], "query")[0].astype(np.float64)
    small = _embedder(server, model_info=info, dims=8).embed(["x"], "query")[0]
    ln = (full - full.mean()) / np.sqrt(full.var() + 1e-5)
    assert small.tolist() == pytest.approx((ln[:8] / np.linalg.norm(ln[:8])).tolist(), abs=1e-5)


def test_server_errors_become_embed_server_errors_not_tracebacks() -> None:
    server = FakeServer()
    server.status = 500
    with pytest.raises(EmbedServerError, match="HTTP 500"):
        _embedder(server).embed(["a"], "query")
    server.status = 501
    with pytest.raises(EmbedServerError, match="HTTP 501") as info:
        _embedder(server).embed(["a"], "query")
    assert info.value.hint == ""  # an attached server: no llama-server advice


def test_refused_key_names_api_key_env() -> None:
    server = FakeServer()
    server.status = 401
    with pytest.raises(EmbedServerError, match="HTTP 401") as info:
        _embedder(server, api_key_env="EMBED_KEY").embed(["a"], "query")
    assert "check api_key_env EMBED_KEY" in info.value.hint


def test_callable_base_url_is_resolved_lazily_and_again_after_a_connection_failure() -> None:
    server = FakeServer()
    urls: list[str] = []
    state = {"fail": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dead.test":
            raise httpx.ConnectError("refused", request=request)
        return server.handler(request)

    def base_url() -> str:
        urls.append("x")
        if state.pop("fail", False):
            return "http://dead.test/v1"
        return "http://alive.test/v1"

    emb = LocalEmbedder(base_url, "t", model_info=_info(), transport=httpx.MockTransport(handler))
    assert urls == []  # nothing started at construction
    assert emb.embed(["a"], "query").shape == (1, 8)
    assert len(urls) == 2  # the retry asked for the sidecar again (a respawn)
    emb.embed(["b"], "query")
    assert len(urls) == 2


def test_connection_failure_with_a_fixed_url() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    emb = LocalEmbedder("http://dead.test", "t", model_info=_info(), transport=httpx.MockTransport(handler))
    with pytest.raises(EmbedServerError) as info:
        emb.embed(["a"], "query")
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_api_key_is_sent_but_never_shown() -> None:
    seen: list[str] = []
    server = FakeServer()

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return server.handler(request)

    emb = LocalEmbedder(
        "http://e.test", "t", model_info=_info(), api_key="sekrit", transport=httpx.MockTransport(handler)
    )
    emb.embed(["a"], "query")
    assert seen == ["Bearer sekrit"]
    assert "sekrit" not in repr(emb)


def test_empty_input_and_bad_role() -> None:
    server = FakeServer()
    emb = _embedder(server)
    assert emb.embed([], "query").shape == (0, 8)
    assert server.requests == []
    with pytest.raises(ValueError, match="role"):
        emb.embed(["a"], "passage")  # type: ignore[arg-type]


def test_identity_carries_the_registry_facts() -> None:
    emb = LocalEmbedder("http://e.test", "nomic-ai/nomic-embed-text-v1.5", dims=256)
    ident = emb.identity
    assert (ident.model, ident.dims, ident.pooling) == ("nomic-embed-text-v1.5", 256, "mean")
    assert ident.document_prefix == "search_document: " and ident.query_prefix == "search_query: "
    assert lookup("all-minilm-l6-v2").max_input_tokens == LocalEmbedder("http://e", "all-minilm-l6-v2").max_input_tokens


def test_managed_embedder_owns_one_server_respawned_after_a_crash_and_stopped_on_close(
    tmp_path: Path, server_bin: Path
) -> None:
    gguf = tmp_path / "all-minilm-l6-v2-f16.gguf"
    gguf.write_bytes(b"GGUF")
    decl = EmbedderDecl(name="docs", model=str(gguf), server_bin=str(server_bin), parallel=2, health_timeout=30)
    emb = embedder_from_decl(decl)
    server = emb.server
    assert server is not None and server.state is ServerState.CREATED  # nothing started yet
    assert server.role == "embedding" and "--embeddings" in server.key.flags
    first = emb.embed(["apple", "pear"], "document")
    pid = server.pid
    assert pid is not None and first.shape == (2, 384)
    os.kill(pid, signal.SIGKILL)
    assert pid_gone(pid, within=5.0)
    again = emb.embed(["apple", "pear"], "document")  # connection refused → respawn → retried
    assert server.pid != pid and np.array_equal(first, again)
    emb.close()
    assert server.state is ServerState.STOPPED and not server.is_alive()


def test_managed_embedder_with_the_cache_dir_under_a_file_is_a_fetch_error(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(blocker / "cache"))
    emb = embedder_from_decl(EmbedderDecl(name="docs", model="all-minilm-l6-v2", server_bin=str(server_bin)))
    with pytest.raises(FetchError) as info:
        emb.embed(["a"], "query")
    assert isinstance(info.value.__cause__, NotADirectoryError)
    assert f"{blocker} is a regular file" in str(info.value) and "LOCALLLM_CACHE_DIR" in info.value.hint
    emb.close()
