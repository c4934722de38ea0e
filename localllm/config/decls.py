"""The declarations: one frozen dataclass per plugin type (and per section), data only.

A field that the config file may set carries a :class:`Key` in its metadata: its doc
line, its range, the check its value gets. The YAML key is the field name. Parsing,
unknown-key errors (with "did you mean"), required keys and the README's configuration
table all come from these classes (:mod:`localllm.config.fields`); fields without a
``Key`` (``alias``, ``name``) are filled by the loader. ``null`` for any key means "the
default".

Adding a transport: a declaration class here plus its line in :data:`PLUGINS` (and its
agent module under ``localllm/agents/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

#: hard deadline (seconds) when neither the call nor the declaration sets ``timeout``
DEFAULT_TIMEOUT = 300.0
#: the longest ``timeout`` (a week): the deadline is also a timestamp (the request's RFC3339
#: soft deadline), which 1e300 seconds overflowed
MAX_TIMEOUT = 7 * 86_400.0
#: where a local model's schema_invalid answer goes (contract §9); ``none`` disables it
DEFAULT_FALLBACK = "agent.claude"
#: llama-server flags the server owner sets itself; ``extra_args`` must not repeat them (the
#: last one would win inside llama-server and silently break port discovery or slot sizing)
MANAGED_FLAGS = frozenset(
    {"-m", "--model", "--host", "--port", "-np", "--parallel", "-c", "--ctx-size", "-t", "--threads"}
)
#: ... and for an embedding server, the flags the model registry decides
EMBEDDING_FLAGS = frozenset({"--embeddings", "--embedding", "--pooling", "-ub", "--ubatch-size", "-b", "--batch-size"})
#: a llama-server's slots at most (llama.cpp's LLAMA_MAX_SEQ: past it the server aborts at load)
MAX_PARALLEL = 256
#: router bars: route when the best intent scores ≥ confident and leads by ≥ margin
ROUTER_CONFIDENT = 0.82
ROUTER_MARGIN = 0.08
#: the decide tier's extra alternative (the input matches none of the intents), and the
#: label of such an input among the router's held-out calibration cases
NONE_OF_THESE = "none_of_these"
#: ``response_format:`` of a local_llm agent: how a schema reaches the server (agents/structured.py)
RESPONSE_FORMATS = (
    "auto",
    "probe",
    "grammar",
    "json_schema",
    "json_object",
    "structured_outputs",
    "guided_json",
    "none",
)


@dataclass(frozen=True)
class Key:
    """How one config key is checked and documented.

    ``check`` names a value rule beyond the type: ``positive``, ``env_name`` (``""``
    means none), ``url``, ``api_base`` (a URL localllm appends ``/v1/…`` to, so not an
    operation's), ``executable`` (must exist now) / ``program`` (a path resolved
    against the config directory), ``json_file`` (under the config directory, parses), ``under`` (a file
    under the config directory),
    ``env`` / ``headers`` (``${VAR}``-interpolated secret maps), ``fallback`` (an alias or
    ``none``), ``name`` (a reference to another declaration, checked across sections).
    """

    doc: str
    low: float | None = None
    high: float | None = None
    check: str = ""
    choices: tuple[str, ...] = ()
    #: shown in the hint when a required key is missing
    example: str = ""


def setting(default: Any, doc: str, **rules: Any) -> Any:
    """A dataclass field that is a config key (``default`` must be immutable)."""
    return field(default=default, metadata=key(doc, **rules))


def key(doc: str, **rules: Any) -> dict[str, Key]:
    """Field metadata marking a config key (for fields that need ``field()`` itself)."""
    return {"key": Key(doc, **rules)}


@dataclass(frozen=True)
class AgentDecl:
    """Fields every agent declaration has."""

    #: at least one key of each group must be set
    REQUIRED: ClassVar[tuple[tuple[str, ...], ...]] = ()

    alias: str
    plugin: str
    timeout: float = setting(
        DEFAULT_TIMEOUT,
        "hard cap per call, seconds (deadline_exceeded after it)",
        low=0.001,
        high=MAX_TIMEOUT,
    )


@dataclass(frozen=True)
class ClaudeCliDecl(AgentDecl):
    """``builtin.claude_cli``: the local ``claude`` binary."""

    claude_bin: str | None = setting(
        None, "the claude executable (default: LOCALLLM_CLAUDE_BIN, then PATH)", check="program"
    )
    model: str | None = setting(None, "passed as --model")
    extra_args: tuple[str, ...] = setting((), "extra claude flags")


@dataclass(frozen=True)
class InprocessDecl(AgentDecl):
    """``builtin.inprocess``: a Python callable bound with ``Runtime.register_inprocess``."""


@dataclass(frozen=True)
class SubprocessDecl(AgentDecl):
    """``subprocess``: a child process speaking JSON-RPC 2.0 over stdio."""

    REQUIRED = (("command",),)

    command: str = setting(
        "",
        "the executable (argv[0]); a relative path is under cwd (the config's directory when unset)",
        example="command: /path/to/agent",
    )
    args: tuple[str, ...] = setting((), "its arguments")
    #: already interpolated (``${VAR}`` resolved at load); values are secrets
    env: dict[str, str] = field(
        default_factory=dict,
        repr=False,
        metadata=key("added to the parent environment; ${VAR} interpolated", check="env"),
    )
    cwd: Path | None = field(default=None, metadata=key("working directory, relative to the config file"))


@dataclass(frozen=True)
class McpHttpDecl(AgentDecl):
    """``mcp_http``: an MCP server over streamable HTTP."""

    REQUIRED = (("endpoint",),)

    #: not in repr: a query string can carry a token
    endpoint: str = field(
        default="",
        repr=False,
        metadata=key("the MCP endpoint URL", check="url", example="endpoint: http://127.0.0.1:7301/mcp"),
    )
    tool: str = setting("ask", "the tool that answers")
    #: already interpolated; values are secrets
    headers: dict[str, str] = field(
        default_factory=dict, repr=False, metadata=key("sent with every request; ${VAR} interpolated", check="headers")
    )
    elicitation: str = setting(
        "decline",
        "answer to the server's elicitation/create: decline, or defaults "
        "(accept a form whose every required field has a default)",
        choices=("decline", "defaults"),
    )


@dataclass(frozen=True)
class McpStdioDecl(AgentDecl):
    """An MCP server over stdio, from an Agent Plugins directory (not declarable by hand).

    ``plugin_dir`` and ``server`` name where it came from: the spawn re-loads that
    directory and re-checks containment right before each start.
    """

    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    cwd: Path | None = None
    tool: str = "ask"
    plugin_dir: Path | None = None
    server: str = ""


@dataclass(frozen=True)
class LocalLLMDecl(AgentDecl):
    """``builtin.local_llm``: managed (``model``) or endpoint (``endpoint``) mode."""

    REQUIRED = (("model", "endpoint"),)

    model: str | None = setting(
        None,
        "managed: a pinned chat model id or a `*.gguf` path; beside endpoint: the name sent in the body",
        example="model: gemma-3-270m (managed)",
    )
    endpoint: str | None = setting(
        None,
        "attach to an OpenAI-compatible server (never fetch/spawn/kill): its root or /v1 URL",
        check="api_base",
        example="endpoint: http://127.0.0.1:8080 (attach)",
    )
    grammar: bool | str = setting(
        True,
        "true: localllm's exact compiled grammar (llama.cpp's converter for a "
        "schema it cannot compile); server: llama.cpp's converter; false: none",
        choices=("server",),
    )
    json_schema: bool = setting(False, "always send response_format json_schema, strict (wins over grammar)")
    response_format: str = setting(
        "auto",
        "how the schema is sent; auto: as grammar/json_schema say (§9); probe: endpoint mode probes once "
        "for the field the server takes",
        choices=RESPONSE_FORMATS,
    )
    api_key_env: str | None = setting(
        None, 'NAME of the env var with a bearer token, read per call; "" disables auth', check="env_name"
    )
    fallback: str = setting(
        DEFAULT_FALLBACK, "who answers after a schema_invalid local answer: an alias or none", check="fallback"
    )
    port: int | None = setting(None, "default: --port 0 (the bound port is read from the log)", low=1, high=65535)
    server_bin: str | None = setting(
        None, "a llama-server to use instead of the cached one (relative to the config)", check="executable"
    )
    parallel: int = setting(4, "--parallel N slots", low=1, high=MAX_PARALLEL)
    ctx_size: int = setting(2048, "context tokens per slot; the server gets ctx_size × parallel", low=64, high=1 << 20)
    max_tokens: int = setting(512, "answer length cap", low=1, high=1 << 20)
    temperature: float | None = setting(
        None, "default: 0 for decide, the server's default otherwise", low=0.0, high=2.0
    )
    extra_args: tuple[str, ...] = setting((), "extra llama-server flags (not the managed ones)")
    health_timeout: float = setting(180.0, "seconds for /health to turn 200", check="positive")
    schema_in_prompt: bool = setting(True, "state the JSON shape in the prompt (llama.cpp does not)")
    compact: bool = setting(True, "the compiled grammar admits no whitespace; false: one space after : and ,")
    open_objects: bool = setting(
        False,
        "the compiled grammar admits undeclared keys (after the declared ones) where additionalProperties "
        "is absent or true; false keeps such objects closed",
    )
    reproducible: bool = setting(
        False, "same input, same answer: whole prompt evaluated (no prompt cache), one call at a time, fixed seed"
    )
    threads: int | None = setting(None, "default: llama.cpp sizes its threads to the machine", low=1, high=1024)
    service: str = setting("auto", "use a running `localllm serve`", choices=("auto", "required", "never"))
    confidence: str = setting(
        "logprobs",
        "meta.confidence of enum/boolean/small-integer fields: logprobs (the answer's own token "
        "probabilities, free), score (one short forced request per alternative: more faithful, "
        "slower), off",
        choices=("logprobs", "score", "off"),
    )


#: plugin type → declaration, in the spec's order (contract §1); ``mcp_stdio`` comes only
#: from ``plugin_dirs:`` and ``cassette`` only from code
PLUGINS: dict[str, type[AgentDecl]] = {
    "builtin.claude_cli": ClaudeCliDecl,
    "builtin.inprocess": InprocessDecl,
    "subprocess": SubprocessDecl,
    "mcp_http": McpHttpDecl,
    "builtin.local_llm": LocalLLMDecl,
}
PLUGIN_TYPES = tuple(PLUGINS)


@dataclass(frozen=True)
class EmbedderDecl:
    """An embedding sidecar under ``embedders:``."""

    name: str
    model: str | None = setting(
        None,
        "managed: a pinned embedding model id or a `*.gguf` path (default "
        "nomic-embed-text-v1.5); with endpoint (required): the served model's id",
        example="model: all-minilm-l6-v2",
    )
    endpoint: str | None = setting(
        None, "attach to an OpenAI-compatible server's /v1/embeddings: its root or /v1 URL", check="api_base"
    )
    api_key_env: str | None = setting(
        None, 'NAME of the env var with a bearer token; "" disables auth', check="env_name"
    )
    dims: int | None = setting(None, "output dims (Matryoshka truncation below the native dims)", low=1, high=1 << 16)
    normalize: bool | str = setting(
        "auto",
        "L2-normalise here: auto (when the server's vectors are not unit), "
        "true (always), false (refuse non-unit vectors)",
        choices=("auto",),
    )
    port: int | None = setting(None, "default: a free port", low=1, high=65535)
    server_bin: str | None = setting(None, "a llama-server to use instead of the cached one", check="executable")
    parallel: int = setting(1, "--parallel N slots", low=1, high=MAX_PARALLEL)
    health_timeout: float = setting(180.0, "seconds for /health to turn 200", check="positive")
    extra_args: tuple[str, ...] = setting((), "extra llama-server flags")
    threads: int | None = setting(None, "default: llama.cpp sizes its threads to the machine", low=1, high=1024)
    service: str = setting("auto", "use a running `localllm serve`", choices=("auto", "required", "never"))


@dataclass(frozen=True)
class RouterDecl:
    """``router:`` — the routing tiers over ``intents:``."""

    REQUIRED: ClassVar[tuple[tuple[str, ...], ...]] = (("embedder", "agent"),)

    embedder: str | None = setting(None, "the semantic tier: an embedder name", check="name", example="embedder: docs")
    agent: str | None = setting(None, "the decide tier: an agent alias", check="name", example="agent: agent.local")
    confident: float | None = setting(
        None,
        "route when the best score is at least this (default: the embedding model's measured bar in "
        "the registry, else 0.82)",
        low=0.0,
        high=1.0,
    )
    margin: float | None = setting(
        None, "… and leads the runner-up by at least this (default: as confident; else 0.08)", low=0.0, high=1.0
    )
    calibrate: bool = setting(
        False, "choose confident and margin from the intents' own examples (leave-one-out) at start"
    )
    target_precision: float = setting(0.9, "the precision calibrate aims the semantic tier at", low=0.5, high=0.999)
    calibration_cases: Path | None = field(
        default=None,
        metadata=key(
            "held-out labelled inputs (JSONL: text, intent) calibrate certifies the bars on, under the "
            "config directory",
            check="under",
            example="calibration_cases: route_cases.jsonl",
        ),
    )


@dataclass(frozen=True)
class Selection:
    """A gate's ``selection:`` (contract §2 "Evidence-backed task selection"), validated."""

    REQUIRED: ClassVar[tuple[tuple[str, ...], ...]] = ()

    profile: str | None = setting(None, "the harness profile meant to answer")
    model: str | None = setting(None, "the model meant to answer")
    effort: str | None = setting(None, "the effort meant (low, medium, …)")
    evidence: Path | None = field(
        default=None, metadata=key("an eval report (JSON) under the config directory", check="json_file")
    )
    fallback_profile: str | None = setting(None, "the profile used when the evidence does not pass")
    policy: str | None = setting(None, "how to pick an agent from the evidence", choices=("cheapest-passing",))
    min_accuracy: float | None = setting(None, "evidence passes at this accuracy or better", low=0.0, high=1.0)
    max_fallback_rate: float | None = setting(None, "… and this fallback rate or lower", low=0.0, high=1.0)
    min_precision: float | None = setting(
        None,
        "per call: try examples → local model → the fallback, accepting an answer whose confidence "
        "clears the threshold the evidence calibrated for this precision",
        low=0.0,
        high=1.0,
    )


#: ``examples:`` defaults: nearest examples that vote, and that are rendered as few-shot
EXAMPLES_K = 5
EXAMPLES_SHOTS = 4


@dataclass(frozen=True)
class Examples:
    """A gate's ``examples:``: labelled cases for the examples tier (a k-NN vote) and for
    dynamic few-shot (the nearest examples rendered where the prompt says ``{{ examples }}``)."""

    REQUIRED: ClassVar[tuple[tuple[str, ...], ...]] = (("cases",), ("embedder",), ("input",))

    cases: Path | None = field(
        default=None,
        metadata=key(
            "labelled cases (eval cases format) under the config directory",
            check="under",
            example="cases: evals/g/cases.jsonl",
        ),
    )
    embedder: str | None = setting(None, "an embedders: name", check="name", example="embedder: minilm")
    input: str | None = setting(None, "the argument whose text is embedded (args.<input>)", example="input: ticket")
    k: int = setting(EXAMPLES_K, "nearest examples that vote", low=1, high=100)
    shots: int = setting(EXAMPLES_SHOTS, "nearest examples rendered at {{ examples }} in the prompt", low=0, high=50)
    fields: tuple[str, ...] = setting(
        (), "the fields the vote answers (default: every enum, boolean or integer field the cases label)"
    )
    answer: bool = setting(True, "answer from the vote when confident; false: few-shot only")
    out_of_scope: str | None = setting(
        None,
        "the label the examples give out-of-scope inputs (e.g. oos): calibrates the out-of-scope bar",
        example="out_of_scope: oos",
    )


@dataclass(frozen=True)
class GateKeys:
    """A gate's plain keys; ``invoke``, ``agent``, ``with`` and ``selection`` are read apart."""

    timeout: float | None = setting(
        None, "hard cap, seconds (default: the agent's timeout)", low=0.001, high=MAX_TIMEOUT
    )
    fallback: str | None = setting(None, "overrides the agent's fallback: an alias or none", check="fallback")


@dataclass(frozen=True)
class Intent:
    """A routing intent with example phrases (``intents:``)."""

    name: str
    examples: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class Gate:
    """A named, reusable agent call under ``gates:``."""

    name: str
    verb: str
    agent: str
    #: inline prompt text or the contents of the prompt file
    prompt: str
    prompt_file: Path | None = None
    #: the schema file when ``with.schema`` names one statically (``None`` when templated)
    schema_path: Path | None = None
    args: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    #: ``with.schema`` as written; a ``{{ … }}`` template is resolved per call (``Config.schema_for``)
    schema: str | None = None
    #: as written: ``None`` inherits the agent's, ``"none"`` disables, else an alias
    fallback: str | None = None
    selection: Selection | None = None
    examples: Examples | None = None
    #: the gate's ``with:`` block as written (JSON data, no host paths): ``AskRequest.with``
    with_: dict[str, Any] = field(default_factory=dict)

    @property
    def templated_schema(self) -> bool:
        return self.schema is not None and self.schema_path is None and "{{" in self.schema
