"""Hostile embedding answers and search inputs: a clear error and nothing stored, or the right hits."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from localllm.cli import main
from localllm.config import Intent
from localllm.embed import corpus as corpus_module
from localllm.embed import router as router_module
from localllm.embed.corpus import Chunking, load_corpus, search
from localllm.embed.embedder import FakeEmbedder
from localllm.embed.index import Index
from localllm.embed.local import LocalEmbedder
from localllm.embed.router import Router, calibrate
from localllm.errors import EmbedServerError
from tests.unit.test_embed_local import FakeServer, _info


def _every(embedding: Callable[[int], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mutate(out: dict[str, Any]) -> dict[str, Any]:
        for item in out["data"]:
            item["embedding"] = embedding(item["index"])
        return out

    return mutate


def _b64(vec: np.ndarray[Any, Any]) -> str:
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha beta")
    (corpus / "b.txt").write_text("gamma delta")
    return corpus


def _endpoint(server: FakeServer, *, registry: bool) -> LocalEmbedder:
    # registry=False: a model the registry does not know (its dims learnt from the first answer)
    return LocalEmbedder(
        "http://embed.test",
        "not-in-registry",
        transport=httpx.MockTransport(server.handler),
        model_info=_info(dims=server.dims) if registry else None,
    )


@pytest.mark.filterwarnings("ignore::UserWarning")  # the unknown model's "no prefixes" warning
@pytest.mark.parametrize("registry", [True, False], ids=["known-model", "unknown-model"])
@pytest.mark.parametrize(
    "embedding",
    [
        lambda i: _b64(np.zeros(8)),  # stored for good: every chunk then scored 0.0 and listed as a hit
        lambda i: [0.0] * 8,
        lambda i: [],  # unknown model: a bare ValueError ("dims must be positive") out of search
        lambda i: [[]],
    ],
    ids=["zero-b64", "zero-floats", "empty", "empty-rows"],
)
def test_a_vector_with_no_direction_is_a_server_error_and_nothing_is_stored(
    tmp_path: Path, registry: bool, embedding: Callable[[int], Any]
) -> None:
    server = FakeServer(shuffle=False)
    server.mutate = _every(embedding)
    embedder = _endpoint(server, registry=registry)
    corpus, store = _corpus(tmp_path), tmp_path / "store"
    with pytest.raises(EmbedServerError):
        search("alpha", embedder, ["*"], base_dir=corpus, store_root=store)
    assert _rows(store) == 0
    # the server fixed: the same search ranks the matching chunk first, nothing stale reused
    server.mutate = None
    report = search("alpha beta", embedder, ["*"], base_dir=corpus, store_root=store)
    assert report.embedded == 2 and report.hits[0].path == "a.txt"
    assert report.hits[0].score == pytest.approx(1.0, abs=1e-5)


def _rows(store: Path) -> int:
    total = 0
    for db in store.glob("*.sqlite"):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            total += conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
    return total


def test_tiny_but_nonzero_vectors_are_normalised_not_zeroed() -> None:
    # float32 components of 1e-30: their squares underflow, the norm came out 0, the vector stayed 0
    server = FakeServer(shuffle=False)
    server.mutate = _every(lambda i: [1e-30 * (k + 1 + i) for k in range(8)])
    out = _endpoint(server, registry=True).embed(["a", "b"], "query")
    assert np.linalg.norm(out, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert float(out[0] @ out[1]) < 0.9999  # two directions, not two zero rows


def test_fake_embedder_search_sanity(tmp_path: Path) -> None:
    report = search("alpha beta", FakeEmbedder(16), ["*"], base_dir=_corpus(tmp_path), store=False)
    assert report.hits[0].path == "a.txt" and report.hits[0].score == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("value", ["nan", "1.5"])
def test_search_min_score_outside_the_cosine_range_is_a_usage_error(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # nan answered 0 hits with exit 0 (every score compares false with it): a silent empty result
    cfg = tmp_path / "localllm.yaml"
    cfg.write_text("embedders:\n  docs: {endpoint: 'http://127.0.0.1:9', model: all-minilm-l6-v2}\n")
    _corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["search", "alpha", "--config", str(cfg), "--embedder", "docs", "--corpus", "corpus", "--min-score"]
    assert main([*argv, value, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "usage_error"  # before the embedder is reached


def test_index_refuses_a_nan_min_score() -> None:
    index = Index.from_matrix(["a"], [[1.0, 0.0]])
    assert [h.id for h in index.search([1.0, 0.0], min_score=-1.0)] == ["a"]
    with pytest.raises(ValueError, match="min_score"):
        index.search([1.0, 0.0], min_score=float("nan"))


@pytest.mark.parametrize(("window", "overlap"), [(1, 0), (2, 1), (3, 0), (4, 2)])
def test_a_window_narrower_than_a_character_takes_the_whole_character(
    tmp_path: Path, window: int, overlap: int
) -> None:
    # the windows cut 😀 and 中 into bytes: chunks of U+FFFD, the characters never searchable
    (tmp_path / "t.txt").write_text("a😀b中c", encoding="utf-8")
    corpus = load_corpus(["t.txt"], tmp_path, Chunking(window=window, overlap=overlap))
    data = (tmp_path / "t.txt").read_bytes()
    for chunk in corpus.chunks:
        assert data[chunk.start : chunk.end].decode("utf-8") == chunk.text  # strict: whole characters
    assert {"😀", "中"} <= {c.text for c in corpus.chunks} | {ch for c in corpus.chunks for ch in c.text}
    assert "\ufffd" not in "".join(c.text for c in corpus.chunks)


def test_a_run_of_utf8_continuation_bytes_is_chunked_in_windows(tmp_path: Path) -> None:
    # each window walked back through the whole run: 1-byte chunks, quadratic (40 KB: 110 s, 38,001 chunks)
    (tmp_path / "latin.txt").write_bytes(b"\xbf" * 12_000)
    corpus = load_corpus(["latin.txt"], tmp_path, Chunking(window=2000, overlap=200))
    assert [(c.start, c.end) for c in corpus.chunks][:2] == [(0, 2000), (1800, 3800)]
    assert len(corpus.chunks) == 7


def test_equal_chunks_share_one_index_row_and_rank_as_brute_force_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 1 MiB markdown file of "#" lines is 524,287 equal chunks: one stacked row each took 1.8 GB
    (tmp_path / "h.md").write_bytes(b"#\n" * 20_000)
    words = ["alpha", "beta", "gamma", "alpha", "delta", "beta", "alpha"]
    for i, word in enumerate(words):  # equal chunks across files too
        (tmp_path / f"f{i}.txt").write_text(word)
    shapes: list[tuple[int, ...]] = []
    real = Index.from_matrix.__func__  # type: ignore[attr-defined]

    def spy(cls: type[Index], ids: list[str], matrix: Any) -> Index:
        shapes.append(np.asarray(matrix).shape)
        return real(cls, ids, matrix)  # type: ignore[no-any-return]

    monkeypatch.setattr(Index, "from_matrix", classmethod(spy))
    embedder = FakeEmbedder(16)
    report = search("alpha", embedder, ["*"], base_dir=tmp_path, store=False, top_k=5, min_score=-1.0)
    assert report.chunks == 20_000 + len(words) and shapes == [(5, 16)]  # "#\n" and four words
    # brute force over every chunk: the same ids, scores and tie order (lower position first)
    corpus = load_corpus(["*"], tmp_path)
    query = embedder.embed(["alpha"], "query")[0]
    scored = [(-float(embedder.embed([c.text], "document")[0] @ query), k) for k, c in enumerate(corpus.chunks)]
    best = sorted(scored)[:5]
    assert [h.id for h in report.hits] == [corpus.chunks[k].id for _, k in best]
    assert [h.score for h in report.hits] == pytest.approx([-s for s, _ in best], abs=1e-6)
    assert [h.id for h in report.hits][:3] == ["f0.txt#0", "f3.txt#0", "f6.txt#0"]


def _loo_by_hand(names: list[str], labels: list[str], matrix: Any) -> list[tuple[float, float, bool, bool]]:
    """The leave-one-out decisions the slow way: every pair, in Python."""
    sims = (np.asarray(matrix) @ np.asarray(matrix).T).tolist()
    out: list[tuple[float, float, bool, bool]] = []
    for i, own in enumerate(labels):
        best: dict[str, float] = {}
        for j, label in enumerate(labels):
            if j != i:
                best[label] = max(best.get(label, -2.0), sims[i][j])
        ranked = sorted(((best[n], n) for n in names if n in best), key=lambda p: -p[0])
        for inside, pool in ((True, ranked), (False, [p for p in ranked if p[1] != own])):
            if pool and (not inside or own in best):
                lead = pool[0][0] - pool[1][0] if len(pool) > 1 else pool[0][0]
                out.append((pool[0][0], lead, inside and pool[0][1] == own, inside))
    return out


@pytest.mark.parametrize("block", [7, 1 << 22])
def test_router_calibration_is_bounded_and_decides_as_by_hand(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    # the whole similarity matrix as Python floats and a loop over every pair: 6,000 examples
    # took 1.6 GB (CLINC150's 15,000: ~10 GB); now row blocks of the matrix, each intent's best by numpy
    monkeypatch.setattr(router_module, "_LOO_BLOCK", block)
    words = ["rain", "sun", "bill", "card", "bug", "crash", "hello"]
    intents = [
        Intent(name="weather", examples=("rain", "sun", "rain sun", "rain")),  # a duplicate: exact ties
        Intent(name="billing", examples=("bill", "card bill", "sun")),  # shared with weather
        Intent(name="bug", examples=("crash",)),  # one example: no in-scope decision
        Intent(name="greet", examples=tuple(f"hello {w}" for w in words)),
    ]
    router = Router(intents, FakeEmbedder(8), confident=0.5, margin=0.1)
    labels = [name for name, _ in router._examples]
    got = router_module._leave_one_out(router.names, labels, router._matrix)
    want = _loo_by_hand(router.names, labels, router._matrix)
    assert [(d.correct, d.in_scope) for d in got] == [w[2:] for w in want]
    flat = [x for d in got for x in (d.similarity, d.margin)]
    if block == 1 << 22:  # one block: the very products of the whole matrix
        assert flat == [x for w in want for x in w[:2]]
    else:  # other shapes of product may round an ulp of float32 apart
        assert flat == pytest.approx([x for w in want for x in w[:2]], abs=1e-6)


def test_router_calibration_memory_grows_with_the_block_not_the_square() -> None:
    intents = [Intent(name=f"i{j}", examples=tuple(f"example {j} {m}" for m in range(100))) for j in range(30)]
    router = Router(intents, FakeEmbedder(16), confident=0.5, margin=0.1)  # 3,000 examples
    tracemalloc.start()
    try:
        calibrate(router)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 120 << 20  # the 3,000² matrix as a list of floats: ~290 MB


def test_a_file_swapped_for_a_fifo_after_the_glob_is_skipped_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "big.txt").write_bytes(b"x" * 3000)
    real = corpus_module.expand_globs

    def swapped(patterns: Any, base: Path) -> tuple[list[Path], list[str]]:
        found = real(patterns, base)
        (tmp_path / "a.txt").unlink()
        os.mkfifo(tmp_path / "a.txt")  # replaced between the glob and the read: the open waited for ever
        return found

    monkeypatch.setattr(corpus_module, "expand_globs", swapped)
    done: list[Any] = []
    worker = threading.Thread(
        target=lambda: done.append(load_corpus(["*.txt"], tmp_path, Chunking(max_file_bytes=2000))), daemon=True
    )
    worker.start()
    worker.join(10)
    if not done:  # unblock the reader so the thread ends
        with open(tmp_path / "a.txt", "wb"):
            pass
        worker.join(5)
    assert done, "load_corpus waited on the FIFO"
    assert {(s.path, s.reason) for s in done[0].skipped} == {
        ("a.txt", "not a regular file"),
        ("big.txt", "larger than 2000 bytes"),
    }


class _Miscounting:
    """A custom Embedder (not ours) answering ``extra`` rows more (or fewer) for a batch of ``sizes`` texts."""

    def __init__(self, extra: int, sizes: tuple[int, ...] = (3,)) -> None:
        self.inner = FakeEmbedder(8)
        self.extra = extra
        self.sizes = sizes

    @property
    def identity(self) -> Any:
        return self.inner.identity

    def embed(self, texts: Any, role: Any) -> Any:
        rows = self.inner.embed(texts, role)
        if len(texts) not in self.sizes:
            return rows
        return rows[: len(texts) + self.extra] if self.extra < 0 else np.concatenate([rows, rows[: self.extra]])


@pytest.mark.parametrize("extra", [-1, 1])
@pytest.mark.parametrize("store", [False, True])
def test_a_custom_embedder_answering_the_wrong_row_count_is_an_embed_server_error(
    tmp_path: Path, extra: int, store: bool
) -> None:
    # store=False zipped the rows with strict=True: a bare ValueError; the router an IndexError
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.txt").write_text(f"text {name}\n")
    with pytest.raises(EmbedServerError) as info:
        search("q", _Miscounting(extra), ["*.txt"], base_dir=tmp_path, store=store, store_root=tmp_path / "s")
    message = str(info.value)
    assert "_Miscounting" in message and f"{3 + extra} vectors" in message and "for 3 " in message
    with pytest.raises(EmbedServerError):
        Router([Intent("a", ("x", "y")), Intent("b", ("z",))], _Miscounting(extra), confident=0.5, margin=0.1)
    router = Router([Intent("a", ("x", "y")), Intent("b", ("z",))], _Miscounting(extra, sizes=(1,)))
    with pytest.raises(EmbedServerError):  # the query's own row
        router.route("x")
