"""Attach to a running ``localllm serve`` instead of spawning a server of one's own.

A managed agent or embedder calls :func:`attach` once before it would start its own
llama-server: it finds the service of the same cache through its discovery file and uses
it only when it serves the same server build and model (compared by sha256).
"""

from __future__ import annotations

from pathlib import Path

from localllm.errors import LocalLLMError, ServiceUnavailable
from localllm.managed import discovery

__all__ = ["POLICIES", "attach", "cache_root_of"]

#: ``service:`` values of a managed agent or embedder
POLICIES = ("auto", "required", "never")


def cache_root_of(cache_root: Path | None) -> Path:
    """``cache_root``, or the configured cache directory."""
    from localllm import settings

    return Path(cache_root) if cache_root is not None else settings.cache_dir()


def attach(
    model: str,
    *,
    policy: str = "auto",
    role: str = "chat",
    server_bin: str | None = None,
    base_dir: Path | None = None,
    cache_root: Path | None = None,
) -> discovery.Attachment | None:
    """The running service to use for ``model`` (a pinned id or a GGUF path) as ``role``, or None.

    Cheap when no service runs (one failed file read). The server build is compared by
    the sha256 of the llama-server binary this process would run, the model by its sha256
    (the pin's, or the file's).
    """
    if policy == "never":
        return None
    root = cache_root_of(cache_root)
    found = None if discovery.read_discovery(root) is None else _match(model, role, server_bin, base_dir, root)
    if found is None and policy == "required":
        raise ServiceUnavailable(
            f"service: required, but no localllm service for cache {root} serves {model!r} on this server build",
            hint="start one with `localllm serve` (same LOCALLLM_CACHE_DIR), or set service: auto",
        )
    return found


def _match(
    model: str, role: str, server_bin: str | None, base_dir: Path | None, root: Path
) -> discovery.Attachment | None:
    from localllm.managed.acquire import resolve_server_binary

    try:
        build = discovery.file_sha256(resolve_server_binary(server_bin))
        model_sha = _model_sha(model, base_dir)
    except (LocalLLMError, OSError):
        return None  # this process could not run the model itself either; its own path reports why
    return discovery.discover(root, build, model_sha, role)


def _model_sha(model: str, base_dir: Path | None) -> str:
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return discovery.file_sha256(path)
    from localllm.managed.pins import load_pins

    return load_pins().model(model).artifact.require_sha256()
