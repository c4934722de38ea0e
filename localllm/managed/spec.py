"""``ServerSpec``: how one managed llama-server is started, built once from a declaration.

A managed chat agent (``builtin.local_llm`` with ``model:``), a managed embedder and every
model a service serves describe their server the same way; this is that description, as
data. :meth:`ServerSpec.from_chat_decl` reads a chat declaration (embedding declarations
are read by :func:`localllm.embed.local.embedding_spec`, which owns the embedding flags),
and :meth:`ServerSpec.server` is the one place a :class:`ManagedServer` is built from a
spec. Nothing here fetches or spawns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from localllm.config import LocalLLMDecl
    from localllm.managed.server import ManagedServer

__all__ = ["CHAT_CTX_PER_SLOT", "CHAT_PARALLEL", "Role", "ServerSpec"]

Role = Literal["chat", "embedding"]

#: chat defaults, the same as a ``builtin.local_llm`` declaration's
CHAT_PARALLEL = 4
CHAT_CTX_PER_SLOT = 2048


@dataclass(frozen=True)
class ServerSpec:
    """One servable model and how its llama-server is started."""

    #: the name: a service's model id, an agent's alias, ``embed:NAME``
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
    #: a fixed port (None: a free one)
    port: int | None = None
    #: the pinned sha256 (None for a path model until it is hashed)
    sha256: str | None = None
    #: bytes on disk when known (the memory budget's estimate before the first load)
    size: int | None = None
    base_dir: Path | None = None
    #: stop strings added to every chat request (the pin's, for a dialogue-template model)
    stop: tuple[str, ...] = ()

    @classmethod
    def from_chat_decl(cls, decl: LocalLLMDecl, *, base_dir: Path | None = None, name: str | None = None) -> ServerSpec:
        """The server of a managed ``builtin.local_llm`` declaration (``model:``, no ``endpoint:``)."""
        return cls(
            id=name or decl.alias,
            role="chat",
            source=decl.model or "",
            parallel=decl.parallel,
            ctx_per_slot=decl.ctx_size,
            threads=decl.threads,
            args=tuple(decl.extra_args),
            server_bin=decl.server_bin,
            health_timeout=decl.health_timeout,
            port=decl.port,
            base_dir=base_dir,
        )

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

    def server(self, *, api_key: str | None = None, served_alias: bool = False) -> ManagedServer:
        """The :class:`ManagedServer` of this spec (nothing fetched or spawned yet).

        ``api_key``: the key the server demands (a service's upstream key). ``served_alias``:
        answers name ``id`` (``--alias``) instead of the GGUF's absolute path, unless ``args``
        set an alias of their own. Raises ``ValueError`` for flags that clash with the managed ones.
        """
        from localllm.managed.server import ManagedServer

        args = self.args
        if served_alias and not {"-a", "--alias"} & {a.partition("=")[0] for a in args}:
            args = (*args, "--alias", self.id)
        return ManagedServer(
            self.server_bin,
            self.source,
            role=self.role,
            base_dir=self.base_dir,
            args=args,
            parallel=self.parallel,
            ctx_per_slot=self.ctx_per_slot,
            threads=self.threads,
            port=self.port,
            health_timeout=self.health_timeout,
            name=self.id,
            api_key=api_key,
        )
