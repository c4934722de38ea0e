"""Agent transports, one module each; :func:`build_agent` maps a declaration to one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localllm.agents.base import Agent
from localllm.config import (
    AgentDecl,
    ClaudeCliDecl,
    InprocessDecl,
    LocalLLMDecl,
    McpHttpDecl,
    McpStdioDecl,
    SubprocessDecl,
)
from localllm.errors import AgentError, ErrorKind

__all__ = ["Agent", "build_agent"]


def build_agent(decl: AgentDecl, *, base_dir: Path, styles: Any = None, secrets: Any = None) -> Agent:
    """Construct (never start) the agent for a declaration; transports import lazily.

    ``styles`` (a :class:`~localllm.agents.structured.Styles`) is the Runtime's cache of
    negotiated structured-output styles, shared by its endpoint agents. ``secrets`` (the
    config's resolved secret values) is what the agent masks in its own errors and log
    lines; ``None``: every env/header value of the declaration.
    """
    if isinstance(decl, ClaudeCliDecl):
        from localllm.agents.claude_cli import ClaudeCliAgent

        return ClaudeCliAgent(decl)
    if isinstance(decl, InprocessDecl):
        from localllm.agents.inprocess import UnregisteredInprocessAgent

        return UnregisteredInprocessAgent(decl.alias)
    if isinstance(decl, SubprocessDecl):
        from localllm.agents.subprocess import SubprocessAgent

        return SubprocessAgent(decl, secrets=secrets)
    if isinstance(decl, McpHttpDecl):
        from localllm.agents.mcp_http import McpHttpAgent

        return McpHttpAgent(decl, secrets=secrets)
    if isinstance(decl, McpStdioDecl):
        from localllm.agents.mcp_stdio import McpStdioAgent

        return McpStdioAgent(decl, secrets=secrets)
    if isinstance(decl, LocalLLMDecl):
        from localllm.agents.local_llm import LocalLLMAgent

        return LocalLLMAgent(decl, base_dir=base_dir, styles=styles)
    raise AgentError(ErrorKind.PLUGIN_UNSUPPORTED, f"plugin {decl.plugin} has no transport", alias=decl.alias)
