"""Model registry data, lookups, prefixes and embedding-server arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.embed.embedder import FakeEmbedder, fake_vector
from localllm.embed.local import embedding_server_args
from localllm.embed.registry import UnknownEmbeddingModel, load_registry, lookup
from localllm.errors import EmbedError
from localllm.resources import data_path
from tests.conftest import REPO


def test_registry_file_is_shipped_and_lists_the_three_models() -> None:
    raw = json.loads((REPO / "embed" / "models.json").read_text())
    assert set(raw["models"]) == {"nomic-embed-text-v1.5", "bge-small-en-v1.5", "all-minilm-l6-v2"}
    assert data_path("embed", "models.json").read_text() == (REPO / "embed" / "models.json").read_text()


def test_nomic_facts() -> None:
    info = lookup("nomic-embed-text-v1.5")
    assert (info.dims, info.pooling, info.context) == (768, "mean", 2048)
    assert info.matryoshka_dims == (768, 512, 256, 128, 64)
    assert info.prefix("document") == "search_document: "
    assert info.prefix("query") == "search_query: "
    assert info.output_dims(256) == 256
    with pytest.raises(EmbedError, match="cannot produce 300-dimension"):
        info.output_dims(300)


def test_bge_uses_its_model_card_query_instruction_and_no_document_prefix() -> None:
    info = lookup("BAAI/bge-small-en-v1.5")
    assert info.id == "bge-small-en-v1.5"
    assert info.prefix("query") == "Represent this sentence for searching relevant passages: "
    assert info.prefix("document") == ""
    assert (info.dims, info.pooling, info.context) == (384, "cls", 512)
    with pytest.raises(EmbedError):
        info.output_dims(128)  # not Matryoshka


@pytest.mark.parametrize(
    "name",
    [
        "all-minilm-l6-v2",
        "sentence-transformers/all-MiniLM-L6-v2",
        "all-minilm-l6-v2-f16.gguf",
        "/models/all-MiniLM-L6-v2-Q8_0.gguf",
    ],
)
def test_minilm_aliases_and_gguf_names(name: str) -> None:
    info = lookup(name)
    assert info.id == "all-minilm-l6-v2"
    assert info.prefix("query") == info.prefix("document") == ""
    assert (info.dims, info.context, info.max_input_tokens) == (384, 512, 256)


def test_unknown_model_warns_and_has_no_prefix() -> None:
    with pytest.warns(UnknownEmbeddingModel, match="not in the registry"):
        info = lookup("my-own-embedder")
    assert not info.known and info.dims is None
    assert info.prefix("query") == info.prefix("document") == ""
    assert info.output_dims(100) == 100


def test_role_is_checked() -> None:
    with pytest.raises(ValueError, match="role"):
        lookup("all-minilm-l6-v2").prefix("passage")  # type: ignore[arg-type]


def test_aliases_share_one_entry() -> None:
    table = load_registry()
    assert table["nomic-ai/nomic-embed-text-v1.5"] is table["nomic-embed-text-v1.5"]


def test_server_args_size_the_microbatch_to_the_context() -> None:
    args = embedding_server_args(lookup("nomic-embed-text-v1.5"), 4, with_ctx=True)
    assert args == ["--embeddings", "--pooling", "mean", "-ub", "2048", "-b", "2048", "-c", "8192"]
    assert embedding_server_args(lookup("bge-small-en-v1.5"), 2)[:3] == ["--embeddings", "--pooling", "cls"]
    assert "-c" not in embedding_server_args(lookup("bge-small-en-v1.5"), 2)


@pytest.mark.parametrize("parallel", [3, 5, 6, 0])
def test_server_args_refuse_a_parallel_that_would_abort_bert(parallel: int) -> None:
    with pytest.raises(EmbedError, match="parallel"):
        embedding_server_args(lookup("all-minilm-l6-v2"), parallel)


def test_fake_embedder_matches_the_reference_vectors() -> None:
    fake = FakeEmbedder(4)
    got = fake.embed(["apple", ""], "query")
    assert got.dtype.name == "float32" and got.shape == (2, 4)
    assert got[0].tolist() == pytest.approx([-0.69020426, -0.20278017, 0.6922131, 0.05778659], abs=1e-7)
    assert got[1].tolist() == pytest.approx([-0.29282433, 0.6804722, 0.4718771, 0.4780622], abs=1e-7)


def test_fake_embedder_drops_task_prefixes_and_counts_work() -> None:
    fake = FakeEmbedder(8, query_prefix="search_query: ")
    assert fake_vector("search_document: apple", 8) == fake_vector("apple", 8)
    a = fake.embed(["apple"], "query")
    b = fake.embed(["apple"], "document")
    assert a.tolist() == b.tolist()
    assert fake.calls == 2 and fake.texts_embedded == 2
    with pytest.raises(TypeError):
        fake.embed("apple", "query")


# -- defaults (issue 10 item 15) ------------------------------------------------------------


def test_nomic_defaults_to_matryoshka_256_dims() -> None:
    from localllm.embed.local import LocalEmbedder

    assert lookup("nomic-embed-text-v1.5").default_dims == 256
    assert LocalEmbedder("http://e.test", "nomic-embed-text-v1.5").out_dims == 256
    assert LocalEmbedder("http://e.test", "nomic-embed-text-v1.5", dims=768).out_dims == 768  # native on request
    assert LocalEmbedder("http://e.test", "all-minilm-l6-v2").out_dims == 384  # no default_dims: native


def test_a_managed_embedder_without_model_runs_nomic(tmp_path: Path) -> None:
    from localllm.embed.local import embedder_from_decl
    from localllm.embed.registry import default_model
    from localllm.loading import load_config

    (tmp_path / "app.yaml").write_text("embedders:\n  docs: {}\n")
    decl = load_config(tmp_path / "app.yaml").embedders["docs"]
    assert decl.model is None and default_model() == "nomic-embed-text-v1.5"
    emb = embedder_from_decl(decl)  # nothing is fetched or started yet
    assert (emb.model, emb.info.id, emb.out_dims, emb.info.query_prefix) == (
        "nomic-embed-text-v1.5",
        "nomic-embed-text-v1.5",
        256,
        "search_query: ",
    )


def test_an_endpoint_embedder_without_model_is_refused_at_load(tmp_path: Path) -> None:
    from localllm.errors import ConfigError
    from localllm.loading import load_config

    (tmp_path / "app.yaml").write_text("embedders:\n  docs: {endpoint: 'http://127.0.0.1:9/v1'}\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "app.yaml")
    assert [p.key for p in info.value.problems] == ["embedders.docs.model"]
