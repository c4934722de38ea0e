"""Config file → typed declarations: data only.

The file (YAML)::

    app_id: my-app                     # default: the file's stem
    agent_plugins:                     # alias (must start with "agent.") → declaration
      agent.local: {plugin: builtin.local_llm, model: gemma-3-270m}
    gates:                             # named reusable calls
      triage:
        invoke: host.agent.decide      # host.agent.<verb>
        agent: agent.local             # default agent.claude (or with: {agent: …})
        timeout: 60                    # hard cap, seconds (default: the agent's)
        fallback: none                 # default: the agent's fallback (agent.claude)
        with: {prompt: prompts/triage.md, schema: schemas/triage.json, args: {k: v}}
    embedders: {docs: {model: all-minilm-l6-v2}}
    intents: {greet: {examples: [hello, hi there]}}
    router: {embedder: docs, agent: agent.local}
    plugin_dirs: [plugins/fixer]

This package holds the declarations (:mod:`~localllm.config.decls`, one source of truth
per plugin type), reads and checks each section (:mod:`~localllm.config.parse`) and
answers the runtime's questions (:class:`Config`). It imports nothing above the pins:
the checks that need the schema validator, the grammar subset or the Agent Plugins
loader run in :func:`localllm.loading.load_config`, which composes the whole load.
Every problem is collected and raised together as one ``ConfigError`` whose problems
each name the file, the key path and a fix, in file order. ``${VAR}`` is interpolated in
``env`` and ``headers`` values only, in one left-to-right pass.
"""

from __future__ import annotations

from localllm.config.decls import (
    DEFAULT_FALLBACK,
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    PLUGIN_TYPES,
    PLUGINS,
    ROUTER_CONFIDENT,
    ROUTER_MARGIN,
    AgentDecl,
    ClaudeCliDecl,
    EmbedderDecl,
    Examples,
    Gate,
    GateKeys,
    InprocessDecl,
    Intent,
    LocalLLMDecl,
    McpHttpDecl,
    McpStdioDecl,
    RouterDecl,
    Selection,
    SubprocessDecl,
)
from localllm.config.fields import interpolate, reference_table
from localllm.config.model import Config
from localllm.wire import VERBS

__all__ = [
    "DEFAULT_FALLBACK",
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "PLUGINS",
    "PLUGIN_TYPES",
    "REFERENCE_SECTIONS",
    "ROUTER_CONFIDENT",
    "ROUTER_MARGIN",
    "VERBS",
    "AgentDecl",
    "ClaudeCliDecl",
    "Config",
    "EmbedderDecl",
    "Examples",
    "Gate",
    "GateKeys",
    "InprocessDecl",
    "Intent",
    "LocalLLMDecl",
    "McpHttpDecl",
    "McpStdioDecl",
    "RouterDecl",
    "Selection",
    "SubprocessDecl",
    "interpolate",
    "reference_table",
]

#: the declarations the README's configuration table documents, in its order
REFERENCE_SECTIONS: dict[str, type] = {
    "every plugin": AgentDecl,
    **{k: v for k, v in PLUGINS.items()},
    "embedders.NAME": EmbedderDecl,
    "router": RouterDecl,
    "gates.NAME": GateKeys,
    "gates.NAME.selection": Selection,
    "gates.NAME.examples": Examples,
}
