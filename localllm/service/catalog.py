"""What a service can serve: the pinned models and the config's managed models, by id.

Each :class:`ModelSpec` says how its llama-server is started: a chat model with the
agent's slots and context, an embedding model with the flags of the embedding registry
(pooling, micro-batch = context). A config model overrides the pin of the same id; a
``*.gguf`` path model is listed under its file stem.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.managed.spec import CHAT_CTX_PER_SLOT, CHAT_PARALLEL, Role, ServerSpec

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.managed.cache import CacheLayout
    from localllm.managed.pins import Pins

__all__ = ["CHAT_CTX_PER_SLOT", "CHAT_PARALLEL", "ModelSpec", "Role", "build_catalog", "is_cached"]

#: a servable model is a :class:`~localllm.managed.spec.ServerSpec` named by its model id:
#: the service builds its servers from the same specs as the agents and embedders
ModelSpec = ServerSpec


def _embedding_spec(model_id: str, source: str) -> ModelSpec:
    """A pinned embedding model with the embedding registry's defaults (one slot)."""
    from localllm.config import EmbedderDecl
    from localllm.embed.local import embedding_spec

    return replace(embedding_spec(EmbedderDecl(name=model_id, model=source)), id=model_id)


def build_catalog(
    pins: Pins, config: Config | None = None, *, chat_parallel: int = CHAT_PARALLEL
) -> dict[str, ModelSpec]:
    """Every model a service started with ``config`` can serve, keyed by id (sorted).

    A config's models are built by the same functions as its agents' and embedders' own
    servers (:meth:`ServerSpec.from_chat_decl`, :func:`~localllm.embed.local.embedding_spec`).
    """
    from localllm.config import LocalLLMDecl
    from localllm.embed.local import embedding_spec

    specs: dict[str, ModelSpec] = {}
    if config is not None:
        for decl in config.agents.values():
            if not isinstance(decl, LocalLLMDecl) or decl.endpoint is not None or not decl.model:
                continue
            model_id = Path(decl.model).stem if decl.model.endswith(".gguf") else decl.model
            if model_id in specs:
                continue
            spec = ServerSpec.from_chat_decl(decl, base_dir=config.base_dir)
            specs[model_id] = replace(spec, id=model_id, port=None)  # the service picks its ports
        for emb in config.embedders.values():
            if emb.endpoint or not emb.model:
                continue
            model_id = Path(emb.model).stem if emb.model.endswith(".gguf") else emb.model
            if model_id in specs:
                continue
            from localllm.embed.local import embedding_spec

            spec = embedding_spec(emb, base_dir=config.base_dir)
            specs[model_id] = replace(spec, id=model_id, port=None)
    for model_id, pin in pins.models.items():
        if not pin.artifact.sha256:
            continue  # never served: it could never be verified
        if model_id in specs:
            spec = specs[model_id]
            specs[model_id] = _with_pin(spec, pin.artifact.sha256, pin.artifact.size, pin.stop)
            continue
        if pin.role == "embedding":
            spec = _embedding_spec(model_id, model_id)
            specs[model_id] = replace(spec, sha256=pin.artifact.sha256, size=pin.artifact.size)
        else:
            specs[model_id] = ModelSpec(
                id=model_id,
                role="chat",
                source=model_id,
                parallel=chat_parallel,
                sha256=pin.artifact.sha256,
                size=pin.artifact.size,
                stop=pin.stop,
            )
    return dict(sorted(specs.items()))


def _with_pin(spec: ModelSpec, sha256: str, size: int | None, stop: tuple[str, ...] = ()) -> ModelSpec:
    if not spec.pinned:
        return spec
    return replace(spec, sha256=sha256, size=size, stop=stop if spec.role == "chat" else ())


def is_cached(spec: ModelSpec, pins: Pins, layout: CacheLayout) -> bool:
    """True when the model's GGUF is on disk (a pinned one in the cache, a path model at its path)."""
    path = spec.gguf_path()
    if path is not None:
        return path.is_file()
    return layout.model_path(pins.model(spec.source)).is_file()
