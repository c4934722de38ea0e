"""Config file → typed declarations, with every load-time check.

Declarations are frozen dataclasses, one per kind; field defaults are the documented
defaults of the config file.
The file (YAML)::

    app_id: my-app                     # default: the file's stem
    agent_plugins:                     # alias (must start with "agent.") → declaration
      agent.local: {plugin: builtin.local_llm, model: gemma-3-270m}
    gates:                             # named reusable calls
      triage:
        invoke: host.agent.decide      # host.agent.<verb>
        agent: agent.local             # default agent.claude
        timeout: 60                    # hard cap, seconds (default: the agent's)
        with: {prompt: prompts/triage.md, schema: schemas/triage.json, args: {k: v}}
    embedders: {docs: {model: all-minilm-l6-v2}}
    intents: {greet: {examples: [hello, hi there]}}
    router: {embedder: docs, agent: agent.local}
    plugin_dirs: [plugins/fixer]

Every problem is collected (in file order) and raised together as one ``ConfigError``
whose problems each name the file, the key path and a fix. ``${VAR}`` is interpolated in
``env`` and ``headers`` values only, in one left-to-right pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import settings
from localllm.errors import ConfigError, ConfigProblem, ProblemList, SchemaError

if TYPE_CHECKING:
    from localllm.plugins import SpawnSpec

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
    #: re-checks containment and prepares PLUGIN_DATA right before each spawn (plugin dirs)
    spawn: Callable[[], SpawnSpec] | None = field(default=None, compare=False, repr=False)


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
    #: use a running `localllm serve` for the model: auto | required | never
    service: str = "auto"


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
    #: ``None``: llama.cpp sizes its threads to the machine
    threads: int | None = None
    #: use a running `localllm serve` for the model: auto | required | never
    service: str = "auto"


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


# ----------------------------------------------------------------------------- loading


VERBS = ("ask", "decide", "extract", "task", "converse")
_TOP_KEYS = ("app_id", "agent_plugins", "gates", "embedders", "intents", "router", "plugin_dirs")
_VAR = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROMPT_SUFFIXES = (".md", ".txt", ".prompt", ".tmpl", ".j2")

_COMMON = {"plugin": str, "timeout": float}
_PLUGIN_KEYS: dict[str, dict[str, Any]] = {
    "builtin.claude_cli": {"claude_bin": str, "model": str, "extra_args": list},
    "builtin.inprocess": {},
    "subprocess": {"command": str, "args": list, "env": dict, "cwd": str},
    "mcp_http": {"endpoint": str, "tool": str, "headers": dict},
    "builtin.local_llm": {
        "model": str, "endpoint": str, "grammar": bool, "json_schema": bool, "api_key_env": str,
        "port": int, "server_bin": str, "parallel": int, "ctx_size": int, "max_tokens": int,
        "temperature": float, "extra_args": list, "health_timeout": float, "schema_in_prompt": bool,
        "threads": int, "service": str,
    },
}
_EMBEDDER_KEYS: dict[str, Any] = {
    "model": str, "endpoint": str, "api_key_env": str, "dims": int, "port": int, "server_bin": str,
    "parallel": int, "health_timeout": float, "extra_args": list, "threads": int, "service": str,
}
_TYPE_NAMES = {str: "a string", float: "a number", int: "an integer", bool: "true or false",
               list: "a list", dict: "a mapping"}


@dataclass(frozen=True)
class Config:
    """A loaded, checked config file."""

    path: Path
    base_dir: Path
    app_id: str
    agents: dict[str, AgentDecl]
    gates: dict[str, Gate]
    embedders: dict[str, EmbedderDecl]
    intents: dict[str, Intent]
    router: RouterDecl | None
    plugin_dirs: tuple[Path, ...] = ()


def _typed(value: Any, kind: Any, key: str, problems: ProblemList) -> Any:
    """``value`` if it has type ``kind`` (ints accepted as floats), else a problem and None."""
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        problems.add(key, f"must be {_TYPE_NAMES[kind]}, got {value!r}")
        return None
    return value


def interpolate(value: str, lookup: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """Single-pass, left-to-right ``${VAR}`` expansion; returns (text, problems).

    A resolved value containing ``${`` is kept verbatim (never re-expanded). ``${}`` and
    unset variables are problems, never silent blanks.
    """
    out: list[str] = []
    problems: list[str] = []
    pos = 0
    for match in _VAR.finditer(value):
        out.append(value[pos : match.start()])
        name = match.group(1)
        if not name:
            problems.append("empty ${} reference")
        elif not _ENV_NAME.match(name):
            problems.append(f"invalid variable name ${{{name}}}")
        else:
            resolved = lookup(name)
            if resolved is None:
                problems.append(f"env var {name} not set")
            else:
                out.append(resolved)
        pos = match.end()
    out.append(value[pos:])
    return "".join(out), problems


def _string_map(raw: Any, key: str, alias: str, problems: ProblemList) -> dict[str, str]:
    """``env:``/``headers:`` → interpolated str→str map (values are secrets: never echoed)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add(f"agent_plugins.{alias}.{key}", f"must be a mapping of names to strings, got {type(raw).__name__}")
        return {}
    out: dict[str, str] = {}
    for name, val in raw.items():
        if not isinstance(val, (str, int, float)) or isinstance(val, bool):
            problems.add(f"agent_plugins.{alias}.{key}.{name}", "must be a string")
            continue
        text, issues = interpolate(str(val), settings.env_value)
        for issue in issues:
            if issue.startswith("env var "):
                var = issue.split()[2]
                problems.add(
                    f"agent_plugins.{alias}",
                    f"env var {var} referenced in {key}.{name} not set",
                    f"export {var}=… before loading, or remove the reference",
                )
            else:
                problems.add(f"agent_plugins.{alias}.{key}.{name}", issue, "write ${NAME} with a variable name")
        out[str(name)] = text
    return out


def _known_models() -> tuple[str, ...]:
    from localllm.managed.pins import load_pins

    return tuple(sorted(load_pins().models))


def _agent_decl(alias: str, raw: Any, base_dir: Path, problems: ProblemList) -> AgentDecl | None:
    key = f"agent_plugins.{alias}"
    if not alias.startswith("agent.") or alias == "agent.":
        problems.add(key, f'alias "{alias}" must start with "agent."', f'rename it to "agent.{alias}"')
    if not isinstance(raw, dict):
        problems.add(key, "must be a mapping with at least plugin:")
        return None
    plugin = raw.get("plugin")
    if plugin == "cassette":
        problems.add(key, 'plugin "cassette" cannot be declared in agent_plugins:',
                     "replay a cassette with `localllm call … --cassette FILE` or Runtime.register_agent")
        return None
    if not isinstance(plugin, str) or plugin not in _PLUGIN_KEYS:
        problems.add(key, f'unknown plugin "{plugin}" (supported: {", ".join(PLUGIN_TYPES)})')
        return None
    allowed = {**_COMMON, **_PLUGIN_KEYS[plugin]}
    vals: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in allowed:
            problems.add(f"{key}.{name}", f"unknown key for plugin {plugin}",
                         f"allowed keys: {', '.join(sorted(allowed))}")
            continue
        if name in ("env", "headers"):
            continue
        typed = _typed(value, allowed[name], f"{key}.{name}", problems)
        if typed is not None:
            vals[name] = typed
    for name in ("extra_args", "args"):
        if name in vals:
            if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in vals[name]):
                problems.add(f"{key}.{name}", "must be a list of strings")
            vals[name] = tuple(str(a) for a in vals[name])
    timeout = vals.get("timeout", DEFAULT_TIMEOUT)
    if timeout <= 0:
        problems.add(f"{key}.timeout", f"must be > 0 seconds, got {timeout}")
    common: dict[str, Any] = {"alias": alias, "plugin": plugin, "timeout": timeout}
    if plugin == "builtin.claude_cli":
        return ClaudeCliDecl(**common, claude_bin=vals.get("claude_bin"), model=vals.get("model"),
                             extra_args=vals.get("extra_args", ()))
    if plugin == "builtin.inprocess":
        return InprocessDecl(**common)
    if plugin == "subprocess":
        if not vals.get("command"):
            problems.add(key, "subprocess plugin requires command:", "command: /path/to/agent")
        env = _string_map(raw.get("env"), "env", alias, problems)
        cwd = vals.get("cwd")
        if cwd is not None and "\x00" in cwd:
            problems.add(f"{key}.cwd", "must be a directory path")
            cwd = None
        return SubprocessDecl(**common, command=vals.get("command", ""), args=vals.get("args", ()), env=env,
                              cwd=(base_dir / cwd) if cwd else None)
    if plugin == "mcp_http":
        endpoint = vals.get("endpoint", "")
        if not endpoint:
            problems.add(key, "mcp_http plugin requires endpoint:", "endpoint: http://127.0.0.1:7301/mcp")
        elif not endpoint.startswith(("http://", "https://")):
            problems.add(f"{key}.endpoint", f"must be an http(s) URL, got {endpoint!r}")
        headers = _string_map(raw.get("headers"), "headers", alias, problems)
        return McpHttpDecl(**common, endpoint=endpoint, tool=vals.get("tool", "ask"), headers=headers)
    return _local_llm_decl(common, key, vals, problems)


def _local_llm_decl(common: dict[str, Any], key: str, vals: dict[str, Any], problems: ProblemList) -> LocalLLMDecl:
    model, endpoint = vals.get("model"), vals.get("endpoint")
    if not model and not endpoint:
        problems.add(key, "builtin.local_llm plugin requires model: or endpoint:",
                     "model: gemma-3-270m (managed) or endpoint: http://127.0.0.1:8080 (attach)")
    if endpoint and not str(endpoint).startswith(("http://", "https://")):
        problems.add(f"{key}.endpoint", f"must be an http(s) URL, got {endpoint!r}")
    if model and not endpoint:  # beside endpoint:, model is just the name sent in the body
        known = () if model.endswith(".gguf") else _known_models()
        if known and model not in known:
            problems.add(f"{key}.model", f'unknown model "{model}"', f"known models: {', '.join(known)}")
    env_name = vals.get("api_key_env")
    if env_name is not None and not _ENV_NAME.match(env_name):
        problems.add(f"{key}.api_key_env", "must be the NAME of an environment variable (not the key itself)")
    checks = (("parallel", 1, 256), ("ctx_size", 64, 1 << 20), ("max_tokens", 1, 1 << 20),
              ("port", 1, 65535), ("threads", 1, 1024))
    for name, low, high in checks:
        if name in vals and not low <= vals[name] <= high:
            problems.add(f"{key}.{name}", f"must be between {low} and {high}, got {vals[name]}")
    if "temperature" in vals and not 0.0 <= vals["temperature"] <= 2.0:
        problems.add(f"{key}.temperature", f"must be between 0 and 2, got {vals['temperature']}")
    if "health_timeout" in vals and vals["health_timeout"] <= 0:
        problems.add(f"{key}.health_timeout", "must be > 0 seconds")
    _check_service(vals, key, problems)
    fields = {k: v for k, v in vals.items() if k not in ("plugin", "timeout")}
    return LocalLLMDecl(**common, **fields)


def _resolve_prompt(raw: Any, key: str, base_dir: Path, problems: ProblemList) -> tuple[str, Path | None]:
    """A prompt value is a file path (relative to the config) when one exists, else inline text."""
    if not isinstance(raw, str) or not raw.strip():
        problems.add(key, "prompt is required: inline text or a path to a prompt file")
        return "", None
    looks_like_path = "\n" not in raw and "{{" not in raw and "\x00" not in raw and len(raw) < 512
    if looks_like_path:
        candidate = (base_dir / raw).resolve()
        if candidate.is_file():
            try:
                return candidate.read_text(encoding="utf-8"), candidate
            except (OSError, UnicodeDecodeError) as exc:
                problems.add(key, f"cannot read prompt file {candidate}: {exc}")
                return "", candidate
        if raw.endswith(_PROMPT_SUFFIXES):
            problems.add(key, f"prompt file {candidate} not found", "fix the path (relative to the config file)")
            return "", None
    return raw, None


def _schema_path(raw: Any, key: str, base_dir: Path, problems: ProblemList) -> Path | None:
    from localllm.schema import read_schema_file, ref_problems

    if raw is None:
        return None
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        problems.add(key, "must be a path to a JSON Schema file relative to the config file")
        return None
    path = (base_dir / raw).resolve()
    if Path(raw).is_absolute() or not path.is_relative_to(base_dir.resolve()):
        problems.add(key, f"schema {raw!r} is outside the config directory {base_dir}",
                     "keep schemas under the config's directory")
        return None
    try:
        read_schema_file(path)
    except SchemaError as exc:
        problems.add(key, str(exc))
        return None
    for issue in ref_problems(path, base_dir):
        problems.add(key, issue)
    return path


def _gate(name: str, raw: Any, cfg: _Partial, problems: ProblemList) -> Gate | None:
    key = f"gates.{name}"
    if not isinstance(raw, dict):
        problems.add(key, "must be a mapping with invoke:, agent: and with:")
        return None
    for extra in sorted(set(map(str, raw)) - {"invoke", "agent", "with", "timeout"}):
        problems.add(f"{key}.{extra}", "unknown key", "allowed keys: agent, invoke, timeout, with")
    invoke = raw.get("invoke")
    verb = ""
    if not isinstance(invoke, str) or not invoke.startswith("host.agent."):
        problems.add(f"{key}.invoke", f"must be host.agent.<verb> ({', '.join(VERBS)}), got {invoke!r}")
    else:
        verb = invoke.removeprefix("host.agent.")
        if verb not in VERBS:
            problems.add(f"{key}.invoke", f'unknown verb "{verb}" (verbs: {", ".join(VERBS)})')
    agent = raw.get("agent", "agent.claude")
    if not isinstance(agent, str) or agent not in cfg.agents:
        declared = ", ".join(sorted(cfg.agents)) or "none"
        problems.add(f"{key}.agent", f'agent "{agent}" is not declared in agent_plugins: (declared: {declared})',
                     "declare it under agent_plugins: or fix the alias")
    with_ = raw.get("with") or {}
    if not isinstance(with_, dict):
        problems.add(f"{key}.with", "must be a mapping with prompt: (and optionally schema:, args:)")
        with_ = {}
    for extra in sorted(set(map(str, with_)) - {"prompt", "schema", "args"}):
        problems.add(f"{key}.with.{extra}", "unknown key", "allowed keys: args, prompt, schema")
    prompt, prompt_file = _resolve_prompt(with_.get("prompt"), f"{key}.with.prompt", cfg.base_dir, problems)
    schema = _schema_path(with_.get("schema"), f"{key}.with.schema", cfg.base_dir, problems)
    args = with_.get("args") or {}
    if not isinstance(args, dict):
        problems.add(f"{key}.with.args", "must be a mapping")
        args = {}
    timeout = raw.get("timeout")
    if timeout is not None:
        timeout = _typed(timeout, float, f"{key}.timeout", problems)
        if timeout is not None and timeout <= 0:
            problems.add(f"{key}.timeout", "must be > 0 seconds")
    gate = Gate(name=name, verb=verb, agent=str(agent), prompt=prompt, prompt_file=prompt_file,
                schema_path=schema, args=dict(args), timeout=timeout)
    decl = cfg.agents.get(gate.agent)
    if verb == "decide" and schema is not None and isinstance(decl, LocalLLMDecl) and decl.grammar \
            and not decl.json_schema:
        _check_grammar(gate, schema, problems)
    return gate


def _check_grammar(gate: Gate, schema_path: Path, problems: ProblemList) -> None:
    from localllm.grammar import check_subset, format_violation
    from localllm.schema import read_schema_file

    schema = read_schema_file(schema_path)
    for violation in check_subset(schema):
        if violation.severity == "error":
            problems.add(f"gates.{gate.name}.with.schema", format_violation(violation, gate.agent, str(schema_path)),
                         "simplify the schema, set json_schema: true, or route the gate to another agent")


@dataclass
class _Partial:
    base_dir: Path
    agents: dict[str, AgentDecl]


def _embedder(name: str, raw: Any, problems: ProblemList) -> EmbedderDecl | None:
    key = f"embedders.{name}"
    if not isinstance(raw, dict):
        problems.add(key, "must be a mapping with model: or endpoint:")
        return None
    vals: dict[str, Any] = {}
    for k, v in raw.items():
        if k not in _EMBEDDER_KEYS:
            problems.add(f"{key}.{k}", "unknown key", f"allowed keys: {', '.join(sorted(_EMBEDDER_KEYS))}")
            continue
        typed = _typed(v, _EMBEDDER_KEYS[k], f"{key}.{k}", problems)
        if typed is not None:
            vals[k] = tuple(str(a) for a in typed) if k == "extra_args" else typed
    if not vals.get("model") and not vals.get("endpoint"):
        problems.add(key, "embedder requires model: or endpoint:", "model: all-minilm-l6-v2")
    if "dims" in vals and vals["dims"] < 1:
        problems.add(f"{key}.dims", "must be a positive integer")
    _check_service(vals, key, problems)
    return EmbedderDecl(name=name, **vals)


def _check_service(vals: dict[str, Any], key: str, problems: ProblemList) -> None:
    if vals.get("service", "auto") not in ("auto", "required", "never"):
        problems.add(f"{key}.service", f"must be auto, required or never, got {vals['service']!r}")


def _intents(raw: Any, problems: ProblemList) -> dict[str, Intent]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("intents", "must be a mapping of intent name → {examples: [...]}")
        return {}
    out: dict[str, Intent] = {}
    for name, given in raw.items():
        body = {"examples": given} if isinstance(given, list) else given
        if not isinstance(body, dict) or not isinstance(body.get("examples"), list) or not body["examples"]:
            problems.add(f"intents.{name}", "needs examples: a non-empty list of phrases")
            continue
        if not all(isinstance(e, str) and e.strip() for e in body["examples"]):
            problems.add(f"intents.{name}.examples", "every example must be a non-empty string")
            continue
        out[str(name)] = Intent(str(name), tuple(body["examples"]), str(body.get("description", "")))
    return out


def _router(raw: Any, agents: Mapping[str, AgentDecl], embedders: Mapping[str, EmbedderDecl],
            problems: ProblemList) -> RouterDecl | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.add("router", "must be a mapping (embedder:, agent:, confident:, margin:)")
        return None
    for extra in sorted(set(map(str, raw)) - {"embedder", "agent", "confident", "margin"}):
        problems.add(f"router.{extra}", "unknown key", "allowed keys: agent, confident, embedder, margin")
    embedder, agent = raw.get("embedder"), raw.get("agent")
    for name, value in (("embedder", embedder), ("agent", agent)):
        if value is not None and not isinstance(value, str):
            problems.add(f"router.{name}", f"must be a name, got {value!r}")
    embedder = embedder if isinstance(embedder, str) else None
    agent = agent if isinstance(agent, str) else None
    if embedder is not None and embedder not in embedders:
        problems.add("router.embedder", f'embedder "{embedder}" is not declared under embedders:')
    if agent is not None and agent not in agents:
        problems.add("router.agent", f'agent "{agent}" is not declared in agent_plugins:')
    if embedder is None and agent is None and "embedder" not in raw and "agent" not in raw:
        problems.add("router", "needs embedder:, agent:, or both")
    bars: dict[str, float] = {}
    for name, default in (("confident", 0.82), ("margin", 0.08)):
        value = _typed(raw.get(name, default), float, f"router.{name}", problems)
        bars[name] = default if value is None else value
        if not 0.0 <= bars[name] <= 1.0:
            problems.add(f"router.{name}", f"must be between 0 and 1, got {bars[name]}")
    return RouterDecl(embedder=embedder, agent=agent, confident=bars["confident"], margin=bars["margin"])


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load and check a config file; raise ``ConfigError`` listing every problem."""
    import yaml

    file = Path(path)
    problems = ProblemList(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError([ConfigProblem(str(file), "", "config file not found", "check the path")]) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(str(file), "", f"cannot read config file: {exc}")]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([ConfigProblem(str(file), "", f"YAML syntax error at {where}{reason}",
                                         "fix the YAML syntax")]) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(str(file), "", f"the top level must be a mapping, got {type(data).__name__}",
                                         "start the file with keys such as agent_plugins:")])
    for key in data:
        if key not in _TOP_KEYS:
            problems.add(str(key), "unknown top-level key", f"allowed keys: {', '.join(_TOP_KEYS)}")
    base_dir = file.resolve().parent
    app_id = data.get("app_id", file.stem)
    if not isinstance(app_id, str) or not app_id:
        problems.add("app_id", "must be a non-empty string")
        app_id = file.stem

    agents: dict[str, AgentDecl] = {}
    raw_agents = data.get("agent_plugins") or {}
    if not isinstance(raw_agents, dict):
        problems.add("agent_plugins", "must be a mapping of agent alias → declaration")
        raw_agents = {}
    for alias, raw in raw_agents.items():
        decl = _agent_decl(str(alias), raw, base_dir, problems)
        if decl is not None:
            agents[str(alias)] = decl
    agents.setdefault("agent.claude", ClaudeCliDecl(alias="agent.claude", plugin="builtin.claude_cli"))

    plugin_dirs: list[Path] = []
    raw_dirs = data.get("plugin_dirs") or []
    if not isinstance(raw_dirs, list) or not all(isinstance(d, str) and "\x00" not in d for d in raw_dirs):
        problems.add("plugin_dirs", "must be a list of directory paths")
        raw_dirs = []
    for i, rel in enumerate(raw_dirs):
        plugin_dir = (base_dir / rel).resolve()
        if not plugin_dir.is_dir():
            problems.add(f"plugin_dirs[{i}]", f"directory {plugin_dir} not found")
            continue
        plugin_dirs.append(plugin_dir)
        _plugin_agents(plugin_dir, f"plugin_dirs[{i}]", agents, problems)

    embedders: dict[str, EmbedderDecl] = {}
    raw_emb = data.get("embedders") or {}
    if not isinstance(raw_emb, dict):
        problems.add("embedders", "must be a mapping of name → {model: | endpoint:}")
        raw_emb = {}
    for name, raw in raw_emb.items():
        emb = _embedder(str(name), raw, problems)
        if emb is not None:
            embedders[str(name)] = emb

    partial = _Partial(base_dir=base_dir, agents=agents)
    gates: dict[str, Gate] = {}
    raw_gates = data.get("gates") or {}
    if not isinstance(raw_gates, dict):
        problems.add("gates", "must be a mapping of gate name → gate")
        raw_gates = {}
    for name, raw in raw_gates.items():
        gate = _gate(str(name), raw, partial, problems)
        if gate is not None:
            gates[str(name)] = gate

    intents = _intents(data.get("intents"), problems)
    router = _router(data.get("router"), agents, embedders, problems)
    if router is not None and not intents:
        problems.add("router", "a router needs intents:")
    if problems.items:
        raise ConfigError(problems.items)
    return Config(path=file, base_dir=base_dir, app_id=app_id, agents=agents, gates=gates,
                  embedders=embedders, intents=intents, router=router, plugin_dirs=tuple(plugin_dirs))


def _plugin_agents(plugin_dir: Path, key: str, agents: dict[str, AgentDecl], problems: ProblemList) -> None:
    """Declare ``agent.<plugin>.<server>`` for each MCP server of an Agent Plugins directory."""
    try:
        from localllm.plugins import load_agent_plugin, mcp_agent_decls, prepare_spawn
    except ImportError:
        problems.add(key, "Agent Plugins directories are not supported by this build")
        return
    result = load_agent_plugin(plugin_dir)
    if not result.ok:
        for diag in result.diagnostics:
            problems.add(key, f"plugin rejected: {diag.message}", f"run `localllm plugins check {plugin_dir}`")
        return
    for alias, server in mcp_agent_decls(result):
        if alias in agents:
            problems.add(key, f'MCP server alias "{alias}" collides with a declared agent')
            continue
        if server.transport == "http":
            agents[alias] = McpHttpDecl(alias=alias, plugin="mcp_http", endpoint=server.url,
                                        headers=dict(server.headers))
        else:
            agents[alias] = McpStdioDecl(alias=alias, plugin="mcp_stdio", command=server.command,
                                         args=server.args, env=dict(server.env), cwd=server.cwd,
                                         spawn=partial(prepare_spawn, server, result))
