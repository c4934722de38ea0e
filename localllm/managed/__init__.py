"""Managed artifacts and sidecars: pinned, verified llama-server releases and GGUFs.

``ensure_server()`` / ``ensure_model(id)`` return cached, sha256-verified artifacts (fetching
them on first use, mirrors first); ``server_env(release_dir)`` is the environment to run
that server in; ``cache_layout()`` documents and returns where everything lives.
"""

from __future__ import annotations

from localllm.managed.acquire import (
    ServerInstall,
    ensure_model,
    ensure_server,
    resolve_model,
    resolve_server_binary,
    server_env,
)
from localllm.managed.cache import CacheLayout, cache_layout
from localllm.managed.sidecar import MANAGED_FLAGS, Sidecar, SidecarState

__all__ = [
    "MANAGED_FLAGS",
    "CacheLayout",
    "ServerInstall",
    "Sidecar",
    "SidecarState",
    "cache_layout",
    "ensure_model",
    "ensure_server",
    "resolve_model",
    "resolve_server_binary",
    "server_env",
]
