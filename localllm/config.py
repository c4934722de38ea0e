"""Config file → typed declarations, with every load-time check.

Declarations are frozen dataclasses, one per kind; field defaults are the documented
defaults of the config file. LOADER-DOC
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: plugin types declarable under ``agent_plugins:`` (contract §1), in the spec's order
PLUGIN_TYPES = ("builtin.claude_cli", "builtin.inprocess", "subprocess", "mcp_http", "builtin.local_llm")

#: hard deadline (seconds) when neither the call nor the declaration sets ``timeout``
DEFAULT_TIMEOUT = 300.0


@dataclass(frozen=True)
class AgentDecl:
    """Fields every agent declaration has."""

    alias: str
    plugin: str
    #: hard cap in seconds enforced by the runtime (``deadline_exceeded`` after it)
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class ClaudeCliDecl(AgentDecl):
    claude_bin: str | None = None
    model: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class InprocessDecl(AgentDecl):
    pass


@dataclass(frozen=True)
class SubprocessDecl(AgentDecl):
    command: str = ""
    args: tuple[str, ...] = ()
    #: already interpolated (``${VAR}`` resolved at load); values are secrets
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


@dataclass(frozen=True)
class McpHttpDecl(AgentDecl):
    endpoint: str = ""
    tool: str = "ask"
    #: already interpolated; values are secrets
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class McpStdioDecl(AgentDecl):
    """An MCP server over stdio (from an Agent Plugins directory)."""

    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    tool: str = "ask"


@dataclass(frozen=True)
class LocalLLMDecl(AgentDecl):
    """``builtin.local_llm``: managed (``model``) or endpoint (``endpoint``) mode."""

    model: str | None = None
    endpoint: str | None = None
    grammar: bool = True
    json_schema: bool = False
    api_key_env: str | None = None
    port: int | None = None
    server_bin: str | None = None
    parallel: int = 4
    #: context tokens per slot; the server gets ``ctx_size * parallel``
    ctx_size: int = 2048
    max_tokens: int = 512
    #: ``None``: 0 for decide, the server default otherwise
    temperature: float | None = None
    extra_args: tuple[str, ...] = ()
    health_timeout: float = 180.0
    schema_in_prompt: bool = True
    threads: int | None = None


@dataclass(frozen=True)
class EmbedderDecl:
    """An embedding sidecar under ``embedders:``."""

    name: str
    model: str | None = None
    endpoint: str | None = None
    api_key_env: str | None = None
    #: output dims (Matryoshka truncation when below the model's native dims)
    dims: int | None = None
    port: int | None = None
    server_bin: str | None = None
    parallel: int = 1
    health_timeout: float = 180.0
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gate:
    """A named, reusable agent call under ``gates:``."""

    name: str
    verb: str
    agent: str
    #: inline prompt text or the contents of the prompt file
    prompt: str
    prompt_file: Path | None = None
    schema_path: Path | None = None
    args: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None


@dataclass(frozen=True)
class Intent:
    """A routing intent with example phrases (``intents:``)."""

    name: str
    examples: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class RouterDecl:
    """``router:`` — the routing tiers over ``intents:``."""

    embedder: str | None = None
    agent: str | None = None
    confident: float = 0.82
    margin: float = 0.08
