"""Embedding model facts as data (``embed/models.json``): dims, pooling, context, prefixes.

A prefix mistake silently wrecks recall, so prefixes come from this one table and nowhere
else. An unknown model still works: no prefixes, dims taken from the server, and an
:class:`UnknownEmbeddingModel` warning saying so.

Defaults (the table's data): a managed embedder without ``model:`` runs
:func:`default_model` (``nomic-embed-text-v1.5``); a model's ``default_dims`` is its output
size when no ``dims:`` is given (nomic: the Matryoshka 256, not the native 768).
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from localllm.errors import EmbedError
from localllm.resources import data_path

Role = Literal["query", "document"]
ROLES: tuple[Role, ...] = ("query", "document")

#: quantisation / format suffixes stripped from GGUF file names before lookup
_QUANT_SUFFIX = re.compile(r"([-.](f16|f32|bf16|q\d(_[a-z0-9]+)*|iq\d(_[a-z0-9]+)*))+$")


class UnknownEmbeddingModel(UserWarning):
    """The model is not in the registry: no prefixes are applied."""


@dataclass(frozen=True)
class ModelInfo:
    """Facts about one embedding model.

    ``context`` is the per-slot context (and micro-batch) the embedding server is started
    with; ``max_input_tokens`` is the longest input the model is meant to see (inputs
    longer than that are truncated or rejected client-side, see ``LocalEmbedder``).
    """

    id: str
    dims: int | None
    pooling: str = "mean"
    normalized: bool = True
    context: int = 512
    max_input_tokens: int = 512
    matryoshka_dims: tuple[int, ...] = ()
    #: the output size when none is asked for (a Matryoshka size; ``None``: the native dims)
    default_dims: int | None = None
    #: layer-norm the full vector before truncating (nomic's documented Matryoshka recipe)
    matryoshka_layer_norm: bool = False
    query_prefix: str = ""
    document_prefix: str = ""
    known: bool = True
    #: the router's bars measured for this model (``router:`` in the registry), or ``None``
    router_confident: float | None = None
    router_margin: float | None = None

    def prefix(self, role: Role) -> str:
        """The text prepended to an input of ``role``."""
        if role == "query":
            return self.query_prefix
        if role == "document":
            return self.document_prefix
        raise ValueError(f"role must be 'query' or 'document', not {role!r}")

    def output_dims(self, dims: int | None) -> int | None:
        """Validate a requested output size: native dims, or a Matryoshka size."""
        if dims is None:
            return self.default_dims or self.dims
        if dims == self.dims:
            return self.dims
        if dims <= 0:
            raise EmbedError(f"dims must be positive, got {dims}")
        if self.known and dims not in self.matryoshka_dims:
            allowed = sorted(set(self.matryoshka_dims) | ({self.dims} if self.dims else set()))
            raise EmbedError(
                f"model {self.id!r} cannot produce {dims}-dimension vectors "
                f"(supported: {', '.join(map(str, allowed))}); set dims: to one of them or remove it"
            )
        return dims


def _registry_file() -> Path:
    return data_path("embed", "models.json")


def _read(path: Path | None) -> dict[str, Any]:
    file = path or _registry_file()
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise EmbedError(f"cannot read the embedding model registry {file}: {exc}") from exc
    if not isinstance(raw, dict):
        raise EmbedError(f"the embedding model registry {file} is not a JSON object")
    return raw


def default_model(path: Path | None = None) -> str:
    """The model a managed embedder without ``model:`` runs (``default_model`` in the table)."""
    return str(_read(path)["default_model"])


def load_registry(path: Path | None = None) -> dict[str, ModelInfo]:
    """Every registered model by canonical id (aliases map to the same object)."""
    raw = _read(path)
    out: dict[str, ModelInfo] = {}
    for model_id, spec in raw.get("models", {}).items():
        info = ModelInfo(
            id=model_id,
            dims=int(spec["dims"]),
            pooling=str(spec["pooling"]),
            normalized=bool(spec.get("normalized", True)),
            context=int(spec["context"]),
            max_input_tokens=int(spec.get("max_input_tokens", spec["context"])),
            matryoshka_dims=tuple(int(d) for d in spec.get("matryoshka_dims", [])),
            default_dims=int(spec["default_dims"]) if spec.get("default_dims") is not None else None,
            matryoshka_layer_norm=bool(spec.get("matryoshka_layer_norm", False)),
            query_prefix=str(spec.get("query_prefix", "")),
            document_prefix=str(spec.get("document_prefix", "")),
            router_confident=_bar(spec, "confident"),
            router_margin=_bar(spec, "margin"),
        )
        for name in (model_id, *spec.get("aliases", [])):
            out[_normal(name)] = info
    return out


def _bar(spec: dict[str, Any], name: str) -> float | None:
    router = spec.get("router")
    value = router.get(name) if isinstance(router, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _normal(name: str) -> str:
    base = name.strip().lower()
    if base.endswith(".gguf"):
        base = Path(base).name[: -len(".gguf")]
    return base


def _candidates(name: str) -> list[str]:
    base = _normal(name)
    names = [base, _QUANT_SUFFIX.sub("", base)]
    # "org/model" and a path to a GGUF file both reduce to their last part
    tail = base.rsplit("/", 1)[-1]
    names += [tail, _QUANT_SUFFIX.sub("", tail)]
    return names


def lookup(model: str, *, registry: dict[str, ModelInfo] | None = None, warn: bool = True) -> ModelInfo:
    """The registry entry for ``model`` (an id, an alias, an HF repo or a GGUF file name).

    Unknown models get no prefixes and unknown dims, with an :class:`UnknownEmbeddingModel`
    warning (``warn=False`` silences it).
    """
    table = registry if registry is not None else load_registry()
    for name in _candidates(model):
        if name in table:
            return table[name]
    if warn:
        warnings.warn(
            f"embedding model {model!r} is not in the registry (embed/models.json): no query/document "
            "prefixes will be applied; add it to the registry if the model expects prefixes",
            UnknownEmbeddingModel,
            stacklevel=2,
        )
    return ModelInfo(id=model, dims=None, known=False)
