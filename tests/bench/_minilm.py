"""all-MiniLM embeddings for the benches that route real text (bench_router, bench_bar_guarantee).

:func:`embed` starts the managed llama-server on the pinned binary and the shared GGUF, embeds
the texts once as queries, and stops it; every arm of a bench then reads the same vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GGUF = REPO.parent / "shared" / "models" / "all-minilm-l6-v2-f16.gguf"
MODEL = "all-minilm-l6-v2"


def embed(texts: Sequence[str], name: str) -> tuple[Any, Any]:
    """The ``texts`` embedded by all-MiniLM (a float32 matrix, a row per text) and the
    embedder's identity; ``name`` names the server's process."""
    from localllm.embed.local import LocalEmbedder, embedding_server_args
    from localllm.embed.registry import lookup
    from localllm.managed import ensure_server
    from localllm.managed.server import ManagedServer

    info = lookup(MODEL)
    with ManagedServer(
        ensure_server().binary,
        GGUF,
        args=embedding_server_args(info, 2),
        parallel=2,
        ctx_per_slot=info.context,
        name=name,
        health_timeout=120,
    ) as sidecar:
        embedder = LocalEmbedder(sidecar.ensure_ready(), MODEL, batch_size=64)
        return embedder.embed(texts, "query"), embedder.identity
