"""Managed artifacts and servers: pinned, verified llama-server releases and GGUFs.

``ensure_server()`` / ``ensure_model(id)`` return cached, sha256-verified artifacts (fetching
them on first use, mirrors first); ``server_env(release_dir)`` is the environment to run
that server in; ``cache_layout()`` documents and returns where everything lives;
``ManagedServer`` owns one running llama-server (chat or embeddings) from fetch to stop;
``ServerSpec`` says how one is started (built once from a declaration) and ``Upstream`` is
the one route to a server (a running service, the own sidecar, an endpoint) with one URL
rule and one failure and retry rule, held by chat agents, embedders and the service alike.
"""

from __future__ import annotations

from localllm.managed.acquire import ensure_model, ensure_server, resolve_model, resolve_server_binary
from localllm.managed.cache import CacheLayout, cache_layout
from localllm.managed.release import ServerInstall, server_env
from localllm.managed.server import MANAGED_FLAGS, ManagedServer, ServerKey, ServerState
from localllm.managed.spec import ServerSpec
from localllm.managed.upstream import Route, Target, Upstream

__all__ = [
    "MANAGED_FLAGS",
    "CacheLayout",
    "ManagedServer",
    "Route",
    "ServerInstall",
    "ServerKey",
    "ServerSpec",
    "ServerState",
    "Target",
    "Upstream",
    "cache_layout",
    "ensure_model",
    "ensure_server",
    "resolve_model",
    "resolve_server_binary",
    "server_env",
]
