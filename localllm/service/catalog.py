"""What a service can serve: the pinned models and the config's managed models, by id.

Each :class:`ModelSpec` says how its llama-server is started: a chat model with the
agent's slots and context, an embedding model with the flags of the embedding registry
(pooling, micro-batch = context). A config model overrides the pin of the same id; a
``*.gguf`` path model is listed under its file stem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.managed.cache import CacheLayout
    from localllm.managed.pins import Pins

Role = Literal["chat", "embedding"]

#: chat defaults, the same as a ``builtin.local_llm`` declaration's
CHAT_PARALLEL = 4
CHAT_CTX_PER_SLOT = 2048


@dataclass(frozen=True)
class ModelSpec:
    """One servable model and how its llama-server is started."""

    id: str
    role: Role
    #: a pinned id (fetched and verified through the pins) or a GGUF path
    source: str
    parallel: int = CHAT_PARALLEL
    ctx_per_slot: int | None = CHAT_CTX_PER_SLOT
    threads: int | None = None
    args: tuple[str, ...] = ()
    server_bin: str | None = None
    health_timeout: float = 180.0
    #: the pinned sha256 (None for a path model until it is hashed)
    sha256: str | None = None
    #: bytes on disk when known (the memory budget's estimate before the first load)
    size: int | None = None
    base_dir: Path | None = None
    #: stop strings added to every chat request (the pin's, for a dialogue-template model)
    stop: tuple[str, ...] = ()

    @property
    def pinned(self) -> bool:
        return not self.source.endswith(".gguf")

    def gguf_path(self) -> Path | None:
        """The path of a path model (None for a pinned id)."""
        if self.pinned:
            return None
        path = Path(self.source).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path


def _embedding_spec(
    model_id: str,
    source: str,
    *,
    parallel: int = 1,
    args: tuple[str, ...] = (),
    threads: int | None = None,
    server_bin: str | None = None,
    health_timeout: float = 180.0,
    base_dir: Path | None = None,
    sha256: str | None = None,
    size: int | None = None,
) -> ModelSpec:
    from localllm.embed.local import embedding_server_args
    from localllm.embed.registry import lookup

    info = lookup(Path(source).name if source.endswith(".gguf") else source)
    return ModelSpec(
        id=model_id,
        role="embedding",
        source=source,
        parallel=parallel,
        ctx_per_slot=info.context,
        args=(*embedding_server_args(info, parallel), *args),
        threads=threads,
        server_bin=server_bin,
        health_timeout=health_timeout,
        base_dir=base_dir,
        sha256=sha256,
        size=size,
    )


def build_catalog(
    pins: Pins, config: Config | None = None, *, chat_parallel: int = CHAT_PARALLEL
) -> dict[str, ModelSpec]:
    """Every model a service started with ``config`` can serve, keyed by id (sorted)."""
    from localllm.config import LocalLLMDecl

    specs: dict[str, ModelSpec] = {}
    if config is not None:
        for decl in config.agents.values():
            if not isinstance(decl, LocalLLMDecl) or decl.endpoint is not None or not decl.model:
                continue
            model_id = Path(decl.model).stem if decl.model.endswith(".gguf") else decl.model
            if model_id in specs:
                continue
            specs[model_id] = ModelSpec(
                id=model_id,
                role="chat",
                source=decl.model,
                parallel=decl.parallel,
                ctx_per_slot=decl.ctx_size,
                threads=decl.threads,
                args=tuple(decl.extra_args),
                server_bin=decl.server_bin,
                health_timeout=decl.health_timeout,
                base_dir=config.base_dir,
            )
        for emb in config.embedders.values():
            if emb.endpoint or not emb.model:
                continue
            model_id = Path(emb.model).stem if emb.model.endswith(".gguf") else emb.model
            if model_id in specs:
                continue
            specs[model_id] = _embedding_spec(
                model_id,
                emb.model,
                parallel=emb.parallel,
                threads=emb.threads,
                args=tuple(emb.extra_args),
                server_bin=emb.server_bin,
                health_timeout=emb.health_timeout,
                base_dir=config.base_dir,
            )
    for model_id, pin in pins.models.items():
        if not pin.artifact.sha256:
            continue  # never served: it could never be verified
        if model_id in specs:
            spec = specs[model_id]
            specs[model_id] = _with_pin(spec, pin.artifact.sha256, pin.artifact.size, pin.stop)
            continue
        if pin.role == "embedding":
            specs[model_id] = _embedding_spec(model_id, model_id, sha256=pin.artifact.sha256, size=pin.artifact.size)
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
    from dataclasses import replace

    return replace(spec, sha256=sha256, size=size, stop=stop if spec.role == "chat" else ())


def is_cached(spec: ModelSpec, pins: Pins, layout: CacheLayout) -> bool:
    """True when the model's GGUF is on disk (a pinned one in the cache, a path model at its path)."""
    path = spec.gguf_path()
    if path is not None:
        return path.is_file()
    return layout.model_path(pins.model(spec.source)).is_file()
