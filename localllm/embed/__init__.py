"""Embeddings: the Embedder protocol, LocalEmbedder, FakeEmbedder, Index, Store, corpus search, Router.

Importing this package is cheap: numpy is imported by the functions that need it.
"""

from __future__ import annotations

from localllm.embed.corpus import Chunking, SearchReport, load_corpus, search
from localllm.embed.embedder import Embedder, EmbedderIdentity, FakeEmbedder
from localllm.embed.index import Hit, Index
from localllm.embed.local import LocalEmbedder, embedder_from_decl, embedding_server_args
from localllm.embed.registry import ModelInfo, UnknownEmbeddingModel, lookup
from localllm.embed.router import Router, Verdict
from localllm.embed.store import Store

__all__ = [
    "Chunking",
    "Embedder",
    "EmbedderIdentity",
    "FakeEmbedder",
    "Hit",
    "Index",
    "LocalEmbedder",
    "ModelInfo",
    "Router",
    "SearchReport",
    "Store",
    "UnknownEmbeddingModel",
    "Verdict",
    "embedder_from_decl",
    "embedding_server_args",
    "load_corpus",
    "lookup",
    "search",
]
