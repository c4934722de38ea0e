"""The config file → a :class:`Draft` of declarations, then cross-references → ``Config``.

Two passes, so that nothing cascades: :func:`parse` reads every section on its own
(types, keys, ranges, required keys, files); :func:`check_references` then checks names
across sections (gate → agent, fallback → agent, router → embedder/agent) once every
declaration is known — including those a loader added from ``plugin_dirs:`` — and stays
silent about a name whose declaration was itself reported broken. Problems are finally
put in file order (:func:`in_file_order`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localllm.config.decls import (
    EMBEDDING_FLAGS,
    MANAGED_FLAGS,
    PLUGIN_TYPES,
    PLUGINS,
    AgentDecl,
    ClaudeCliDecl,
    EmbedderDecl,
    Examples,
    Gate,
    GateKeys,
    InprocessDecl,
    Intent,
    LocalLLMDecl,
    RouterDecl,
    Selection,
    SubprocessDecl,
)
from localllm.config.fields import Context, closest, parse_decl, path_issue, show, text_issue
from localllm.config.files import gguf_issue, resolve_prompt, schema_file, template_issue
from localllm.config.model import Config
from localllm.config.source import printable, read_yaml
from localllm.errors import ConfigError, ConfigProblem, ProblemList
from localllm.wire import VERBS

TOP_KEYS = ("app_id", "agent_plugins", "gates", "embedders", "intents", "router", "plugin_dirs")
WITH_KEYS = ("agent", "args", "prompt", "schema")
#: a gate's keys besides GateKeys' (read apart), and an intent's
GATE_KEYS = ("agent", "examples", "id", "invoke", "selection", "with")
INTENT_KEYS = ("description", "examples")
#: top-level keys of a Kitsoki story (its AppDef) that have no place in a localllm config
KITSOKI_STORY_KEYS = (
    "states",
    "world",
    "root",
    "hosts",
    "include",
    "phases",
    "phase_templates",
    "decider",
    "checkpoint_intents",
    "meta_modes",
    "off_path",
    "proposals",
    "providers",
)
_NAME_MAX = 200


@dataclass
class Draft:
    """Declarations read from one file, before names are checked across sections."""

    file: Path
    data: dict[Any, Any]
    ctx: Context
    app_id: str = ""
    agents: dict[str, AgentDecl] = field(default_factory=dict)
    embedders: dict[str, EmbedderDecl] = field(default_factory=dict)
    gates: dict[str, Gate] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    router: RouterDecl | None = None
    #: ``plugin_dirs[i]`` key → the resolved directory
    plugin_dirs: dict[str, Path] = field(default_factory=dict)
    #: names declared but reported broken: referencing them is not a second problem
    broken: set[str] = field(default_factory=set)
    #: gate name → the key its agent was named at (``agent`` or ``with.agent``)
    agent_keys: dict[str, str] = field(default_factory=dict)
    #: what the plugin loader reported about parts it skipped or doubted (plugin_dirs)
    diagnostics: list[dict[str, str]] = field(default_factory=list)

    @property
    def problems(self) -> ProblemList:
        return self.ctx.problems

    def config(self) -> Config:
        """The checked ``Config``; ``ConfigError`` (in file order) if any problem was found."""
        if self.problems.items:
            raise ConfigError([printable(p) for p in in_file_order(self.problems.items, self.data)])
        return Config(
            path=self.file,
            base_dir=self.ctx.base_dir,
            app_id=self.app_id,
            agents=self.agents,
            gates=self.gates,
            embedders=self.embedders,
            intents=self.intents,
            router=self.router,
            plugin_dirs=tuple(self.plugin_dirs.values()),
            secrets=tuple(sorted(self.ctx.secrets)),
            diagnostics=tuple(self.diagnostics),
        )


def _name(raw: Any, key: str, problems: ProblemList) -> str | None:
    """A declared name (alias, gate, embedder, intent) that is safe in a trace and a path."""
    name = raw if isinstance(raw, str) else show(raw)
    issue = (
        text_issue(name)
        or ("is too long" if len(name) > _NAME_MAX else "")
        or ("must not contain control characters" if any(ord(c) < 32 for c in name) else "")
        or ("must not contain / or \\ (names become file names: evals/<gate>/…)" if "/" in name or "\\" in name else "")
        or ("must not be . or .." if name in (".", "..") else "")
    )
    if issue or not name:
        problems.add(key, f"name {show(name)} {issue or 'must not be empty'}")
        return None
    return name


def parse(path: Path) -> Draft:
    """Read and check each section of the file on its own; ``ConfigError`` if unreadable."""
    file = Path(path)
    data = read_yaml(file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    str(file),
                    "",
                    f"the top level must be a mapping, got {type(data).__name__}",
                    "start the file with keys such as agent_plugins:",
                )
            ]
        )
    try:
        base_dir = file.resolve().parent
    except (OSError, RuntimeError) as exc:
        raise ConfigError([ConfigProblem(str(file), "", f"cannot resolve the config path: {exc}")]) from exc
    draft = Draft(file=file, data=data, ctx=Context(base_dir=base_dir, problems=ProblemList(file)))
    problems = draft.problems
    for key in data:
        if key == "app":
            meta = data["app"]
            app_id = meta.get("id") if isinstance(meta, dict) else None
            problems.add(
                "app",
                "unknown top-level key: app: {id: …} is the Kitsoki story's header",
                f"the id goes at the top level here: app_id: {app_id if isinstance(app_id, str) else '<id>'} "
                "(call_ids derive from it; the version and title have no place here)",
            )
        elif key in KITSOKI_STORY_KEYS:
            problems.add(
                str(key),
                "unknown top-level key: a Kitsoki story key (localllm runs the story's agent calls, not its machine)",
                "keep agent_plugins:, and turn each agent effect into a gates: entry "
                "(invoke: host.agent.decide, agent: ALIAS, with: {prompt:, schema:}); drop the story keys",
            )
        elif key not in TOP_KEYS:
            problems.add(
                str(key), f"unknown top-level key{closest(str(key), TOP_KEYS)}", f"allowed keys: {', '.join(TOP_KEYS)}"
            )
    app_id = data.get("app_id", file.stem)
    if not isinstance(app_id, str):
        problems.add("app_id", f"must be a string, got {show(app_id)}")
    draft.app_id = (_name(app_id, "app_id", problems) if isinstance(app_id, str) else None) or file.stem
    for alias, raw in _mapping(data.get("agent_plugins"), "agent_plugins", problems, "of alias → declaration").items():
        _agent(draft, alias, raw)
    draft.agents.setdefault("agent.claude", ClaudeCliDecl(alias="agent.claude", plugin="builtin.claude_cli"))
    _plugin_dirs(draft)
    for name, raw in _mapping(data.get("embedders"), "embedders", problems, "of name → {model: | endpoint:}").items():
        _embedder(draft, name, raw)
    for name, raw in _mapping(data.get("gates"), "gates", problems, "of gate name → gate").items():
        _gate(draft, name, raw)
    _intents(draft, data.get("intents"))
    _router(draft, data.get("router"))
    return draft


def _agent(draft: Draft, raw_alias: Any, raw: Any) -> None:
    problems = draft.problems
    key = f"agent_plugins.{raw_alias}"
    alias = _name(raw_alias, key, problems)
    if alias is None:
        return
    if not alias.startswith("agent.") or alias == "agent.":
        problems.add(key, f'alias "{alias}" must start with "agent."', f'rename it to "agent.{alias}"')
    draft.broken.add(alias)  # until it parses
    if not isinstance(raw, dict):
        # `agent.local: builtin.local_llm`: the plugin type where its declaration goes
        named = isinstance(raw, str) and raw in PLUGIN_TYPES
        problems.add(key, "must be a mapping with at least plugin:", f"{alias}: {{plugin: {raw}}}" if named else "")
        return
    plugin = raw.get("plugin")
    if plugin == "cassette":
        problems.add(
            key,
            'plugin "cassette" cannot be declared in agent_plugins:',
            "replay a cassette with `localllm call … --cassette FILE` or Runtime.register_agent",
        )
        return
    cls = PLUGINS.get(plugin) if isinstance(plugin, str) else None
    if cls is None:
        supported = f"(supported: {', '.join(PLUGIN_TYPES)})"
        if plugin is None:
            problems.add(key, f"plugin: is required {supported}", "plugin: builtin.local_llm")
        else:
            hint = closest(plugin, PLUGIN_TYPES) if isinstance(plugin, str) else ""
            problems.add(f"{key}.plugin", f"unknown plugin {show(plugin)}{hint} {supported}")
        return
    values = parse_decl(cls, raw, key, draft.ctx, skip=("plugin",), what=f"{plugin} plugin")
    decl = cls(alias=alias, plugin=str(plugin), **values)
    if isinstance(decl, LocalLLMDecl) and decl.model and not decl.endpoint:
        _model(draft, decl.model, f"{key}.model", "chat")
        _server_args(draft, decl.extra_args, f"{key}.extra_args", MANAGED_FLAGS)
    if isinstance(decl, SubprocessDecl) and decl.command:
        command = _command(draft, decl, f"{key}.command")
        if command is None:
            return
        decl = replace(decl, command=command)
    draft.agents[alias] = decl
    draft.broken.discard(alias)


def _server_args(draft: Draft, args: tuple[str, ...], key: str, managed: frozenset[str]) -> None:
    """``extra_args`` the server would refuse at the first call: a flag localllm sets itself, or
    a flag and its value in one item (``"--ctx-size 4096"`` reaches llama-server as one word)."""
    for i, arg in enumerate(args):
        words = arg.partition("=")[0].split() or [arg]
        if words[0] in managed:
            draft.problems.add(
                f"{key}[{i}]",
                f"{words[0]} is set by localllm",
                "the embedding model's registry entry sets it"
                if words[0] in EMBEDDING_FLAGS
                else "use the declaration's own keys (port, parallel, ctx_size, threads; model) instead",
            )
        elif arg.startswith("-") and len(words) > 1:
            draft.problems.add(
                f"{key}[{i}]",
                f"a flag and its value in one item: {show(arg)}",
                f"one word per item: [{', '.join(json.dumps(w) for w in arg.split())}]",
            )


def _command(draft: Draft, decl: SubprocessDecl, key: str) -> str | None:
    """A subprocess ``command:`` as it is run, or ``None`` (a problem added).

    A relative path (``./agent.py``, ``bin/agent``) is the file under the agent's ``cwd:``,
    which is the config's directory when unset: the exec would otherwise look for it from
    wherever localllm happens to run; ``~/…`` is expanded (exec does not). A command line
    (``python3 agent.py``) is refused with where its arguments go: the command is one argv[0].
    """
    command = decl.command
    base = decl.cwd or draft.ctx.base_dir
    relative = "/" in command and not command.startswith(("/", "~"))
    full = base / command if relative else Path(command).expanduser()
    words = command.split()
    if len(words) > 1 and not full.exists():
        draft.problems.add(
            key,
            f"is a command line, not an executable: {show(command)}",
            f"command: {words[0]} with args: [{', '.join(words[1:])}]",
        )
        return None
    return str(full) if relative or command.startswith("~") else command  # exec expands no ~


def _model(draft: Draft, model: str, key: str, role: str) -> None:
    """A managed ``model:``: an existing ``*.gguf`` file, or a pinned id of the right role."""
    if model.endswith(".gguf"):
        _, issue = gguf_issue(model, draft.ctx.base_dir)
        if issue:
            draft.problems.add(key, issue, "fix the path (relative to the config file), or use a pinned model id")
        return
    from localllm.errors import FetchError
    from localllm.managed.pins import load_pins

    try:
        models = load_pins().models
    except FetchError as exc:
        draft.problems.add(key, f"cannot check the model id: {exc}")
        return
    pin = models.get(model)
    # a pin without a sha256 is never fetched: it is no choice to offer
    of_role = sorted(m for m, p in models.items() if p.role == role and p.artifact.sha256)
    if pin is not None and pin.role == role and not pin.artifact.sha256:
        try:
            pin.artifact.require_sha256()
        except FetchError as exc:  # PinNotConfigured: its hint says how to pin it yourself
            draft.problems.add(
                key,
                f"{show(model)} has no sha256 pin, so it is never fetched (localllm downloads no unverified bytes)",
                f"{exc.hint}; or use one of {', '.join(of_role)}",
            )
        return
    if pin is None:
        draft.problems.add(
            key,
            f"unknown model {show(model)}{closest(model, of_role)}",
            f"known {role} models: {', '.join(of_role)} (or a path to a .gguf)",
        )
    elif pin.role != role:
        use = "an embedders: entry" if pin.role == "embedding" else "a builtin.local_llm agent"
        draft.problems.add(
            key,
            f'"{model}" is {_a(pin.role)} model, not {_a(role)} model',
            f"use one of {', '.join(of_role)} here; {model} belongs in {use}",
        )


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _plugin_dirs(draft: Draft) -> None:
    raw = draft.data.get("plugin_dirs")
    if raw is None:
        return
    if not isinstance(raw, list):
        draft.problems.add("plugin_dirs", f"must be a list of directory paths, got {type(raw).__name__}")
        return
    for i, rel in enumerate(raw):
        key = f"plugin_dirs[{i}]"
        issue = path_issue(rel) if isinstance(rel, str) else "must be a directory path"
        if issue:
            draft.problems.add(key, issue)
            continue
        try:
            found = (draft.ctx.base_dir / rel).resolve()
            is_dir = found.is_dir()
        except (OSError, RuntimeError) as exc:
            draft.problems.add(key, f"cannot check {rel!r}: {exc}")
            continue
        if not is_dir:
            draft.problems.add(key, f"directory {found} not found")
            continue
        draft.plugin_dirs[key] = found


def _embedder(draft: Draft, raw_name: Any, raw: Any) -> None:
    key = f"embedders.{raw_name}"
    name = _name(raw_name, key, draft.problems)
    if name is None:
        return
    if not isinstance(raw, dict):
        draft.problems.add(key, "must be a mapping with model: or endpoint:")
        draft.broken.add(f"embedder:{name}")
        return
    values = parse_decl(EmbedderDecl, raw, key, draft.ctx, what="embedder")
    decl = EmbedderDecl(name=name, **values)
    if decl.endpoint and not decl.model and f"{key}.endpoint" not in {p.key for p in draft.problems.items}:
        # the prefixes (search_query: …) depend on the served model: never guess them
        draft.problems.add(
            f"{key}.model",
            "an endpoint embedder needs model: (the id of the model the endpoint "
            "serves: it is sent, and it picks the query/document prefixes)",
            "e.g. model: nomic-embed-text-v1.5; an id the registry does not know gets no prefixes",
        )
    if decl.model and not decl.endpoint:
        _model(draft, decl.model, f"{key}.model", "embedding")
    if not decl.endpoint:
        _server_args(draft, decl.extra_args, f"{key}.extra_args", MANAGED_FLAGS | EMBEDDING_FLAGS)
    draft.embedders[name] = decl


def _gate(draft: Draft, raw_name: Any, raw: Any) -> None:
    problems, ctx = draft.problems, draft.ctx
    key = f"gates.{raw_name}"
    name = _name(raw_name, key, problems)
    if name is None:
        return
    if not isinstance(raw, dict):
        problems.add(key, "must be a mapping with invoke:, agent: and with:")
        return
    plain = parse_decl(GateKeys, raw, key, ctx, skip=GATE_KEYS, what="gate")
    if "id" in raw and raw["id"] != name:  # the spec's invoke id: here the gate's name is the id
        problems.add(f"{key}.id", f"must be the gate's name {name!r} when given", f"write id: {name} or drop it")
    verb = _verb(raw.get("invoke"), f"{key}.invoke", problems)
    with_ = _mapping(raw.get("with"), f"{key}.with", problems, "with prompt: (and optionally schema:, args:, agent:)")
    _unknown(with_, WITH_KEYS, f"{key}.with", problems)
    agent = _gate_agent(raw, with_, key, problems)
    inner = raw.get("agent") is None and "agent" in with_
    draft.agent_keys[name] = f"{key}.with.agent" if inner else f"{key}.agent"
    prompt, prompt_file = resolve_prompt(with_.get("prompt"), f"{key}.with.prompt", ctx)
    schema = with_.get("schema")
    schema_path = schema_file(schema, f"{key}.with.schema", ctx) if schema is not None else None
    args = _mapping(with_.get("args"), f"{key}.with.args", problems, "of argument names to values")
    given = _json_data(with_, f"{key}.with", problems)
    raw_selection = _mapping(raw.get("selection"), f"{key}.selection", problems, "of selection keys")
    selection = (
        Selection(**parse_decl(Selection, raw_selection, f"{key}.selection", ctx, what="selection"))
        if raw_selection
        else None
    )
    raw_examples = _mapping(raw.get("examples"), f"{key}.examples", problems, "with cases:, embedder: and input:")
    examples = (
        Examples(**parse_decl(Examples, raw_examples, f"{key}.examples", ctx, what="examples"))
        if raw_examples
        else None
    )
    # rendered per call, where an unsupported {{ … }} fails every run of the gate: say so now
    shots = ("examples",) if examples is not None else ()
    for where, text, extra in [
        (f"{key}.with.prompt", prompt, shots),
        *((f"{key}.with.args.{k}", v, ()) for k, v in args.items()),
    ]:
        issue = template_issue(text, extra) if isinstance(text, str) else ""
        if issue:
            problems.add(where, issue)
    if selection is not None and selection.min_precision is not None and selection.policy is not None:
        problems.add(
            f"{key}.selection.min_precision",
            "min_precision (a per-call cascade) and policy (one agent per gate) cannot both be set",
            "keep one of them",
        )
    draft.gates[name] = Gate(
        name=name,
        verb=verb,
        agent=agent or "",
        prompt=prompt,
        prompt_file=prompt_file,
        schema_path=schema_path,
        args=dict(args) if given is not None else {},
        schema=schema if isinstance(schema, str) else None,
        **plain,
        selection=selection,
        examples=examples,
        with_=given or {},
    )


def _mapping(raw: Any, key: str, problems: ProblemList, what: str) -> dict[Any, Any]:
    """``raw`` if it is a mapping, ``{}`` for null; otherwise a problem and ``{}``."""
    if raw is None or isinstance(raw, dict):
        return raw or {}
    problems.add(key, f"must be a mapping {what}, got {type(raw).__name__}")
    return {}


def _unknown(raw: Mapping[Any, Any], allowed: tuple[str, ...], key: str, problems: ProblemList) -> None:
    for extra in [str(k) for k in raw if str(k) not in allowed]:
        problems.add(f"{key}.{extra}", f"unknown key{closest(extra, allowed)}", f"allowed keys: {', '.join(allowed)}")


def _verb(invoke: Any, key: str, problems: ProblemList) -> str:
    if not isinstance(invoke, str) or not invoke.startswith("host.agent."):
        problems.add(key, f"must be host.agent.<verb> ({', '.join(VERBS)}), got {show(invoke)}")
        return ""
    verb = invoke.removeprefix("host.agent.")
    if verb not in VERBS:
        problems.add(key, f"unknown verb {show(verb)}{closest(verb, VERBS)} (verbs: {', '.join(VERBS)})")
        return ""
    return verb


def _gate_agent(raw: Mapping[str, Any], with_: Mapping[str, Any], key: str, problems: ProblemList) -> str | None:
    """``agent:`` or ``with.agent:`` (the spec's selection example); both must agree."""
    outer, inner = raw.get("agent"), with_.get("agent")
    for where, value in ((f"{key}.agent", outer), (f"{key}.with.agent", inner)):
        if value is not None and (not isinstance(value, str) or not value or text_issue(value)):
            problems.add(where, f"must be an agent alias, got {show(value)}")
            return None
    if outer is not None and inner is not None and outer != inner:
        problems.add(
            f"{key}.with.agent",
            f'"{inner}" disagrees with {key}.agent "{outer}"',
            "name the agent once: agent: or with.agent:",
        )
        return None
    chosen = outer if outer is not None else inner
    return str(chosen) if chosen is not None else "agent.claude"


def _json_data(value: Any, key: str, problems: ProblemList) -> Any:
    """``value`` if it is JSON data a plugin can be sent (else a problem and ``None``)."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, UnicodeError) as exc:
        problems.add(
            key,
            f"must be plain JSON data (strings, numbers, lists, mappings): {show(str(exc), 100)}",
            "quote timestamps and binary values",
        )
        return None
    return value


def _intents(draft: Draft, raw: Any) -> None:
    problems = draft.problems
    if raw is None:
        return
    if not isinstance(raw, dict):
        problems.add("intents", "must be a mapping of intent name → {examples: [...]}")
        return
    for raw_name, given in raw.items():
        key = f"intents.{raw_name}"
        name = _name(raw_name, key, problems)
        if name is None:
            continue
        body = {"examples": given} if isinstance(given, list) else given
        if isinstance(body, dict):  # first: `example:` is a typo to name, not only a missing key
            _unknown(body, INTENT_KEYS, key, problems)
        if not isinstance(body, dict) or not isinstance(body.get("examples"), list) or not body["examples"]:
            problems.add(key, "needs examples: a non-empty list of phrases")
            continue
        examples = body["examples"]
        if not all(isinstance(e, str) and e.strip() and not text_issue(e) for e in examples):
            problems.add(f"{key}.examples", "every example must be a non-empty string of valid Unicode")
            continue
        description = body.get("description") or ""
        if not isinstance(description, str) or text_issue(description):
            problems.add(f"{key}.description", "must be a string")
            description = ""
        draft.intents[name] = Intent(name, tuple(examples), description)
    _shared_examples(draft)


def _shared_examples(draft: Draft) -> None:
    """An example under two intents routes as a tie for ever and makes calibration meaningless.

    "The same example" is leave-one-out's :func:`~localllm.calibrate.same_text` (case, spacing
    and Unicode form aside). Twice under *one* intent is harmless: calibration counts it once."""
    from localllm.calibrate import same_text

    first: dict[str, tuple[str, str]] = {}
    for name, intent in draft.intents.items():
        for k, example in enumerate(intent.examples):
            owner, text = first.setdefault(same_text(example), (f"intents.{name}.examples[{k}]", example))
            if not owner.startswith(f"intents.{name}.examples["):
                also = f" ({show(text)} there)" if text != example else ""
                draft.problems.add(
                    f"intents.{name}.examples[{k}]",
                    f"example {show(example)} is also under {owner}{also}: an input equal to it ties the two "
                    "intents, and calibrating counts each of them as wrong",
                    "keep the example under one intent only",
                )


def _router(draft: Draft, raw: Any) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        draft.problems.add("router", "must be a mapping (embedder:, agent:, confident:, margin:)")
        return
    draft.router = RouterDecl(**parse_decl(RouterDecl, raw, "router", draft.ctx, what="router"))
    router = draft.router
    if router.calibrate and (router.confident is not None or router.margin is not None):
        draft.problems.add(
            "router.calibrate",
            "calibrate: true chooses confident and margin itself; they are also set",
            "remove confident:/margin:, or set calibrate: false",
        )
    if router.calibration_cases is not None and not router.calibrate:
        draft.problems.add(
            "router.calibration_cases",
            "the held-out cases certify calibrate's bars, and calibrate is off",
            "set calibrate: true, or remove calibration_cases:",
        )


# ----------------------------------------------------------------------------- references


def check_references(draft: Draft) -> None:
    """Names across sections; a broken declaration is not reported again where it is used."""
    problems, agents = draft.problems, draft.agents
    declared = ", ".join(sorted(agents)) or "none"

    def known(alias: str, key: str, hint: str = "declare it under agent_plugins: or fix the alias") -> bool:
        if alias in agents:
            return True
        if alias not in draft.broken:
            problems.add(
                key,
                f'agent "{alias}" is not declared in agent_plugins:{closest(alias, list(agents))} '
                f"(declared: {declared})",
                hint,
            )
        return False

    for alias, decl in agents.items():
        if isinstance(decl, LocalLLMDecl) and decl.fallback == alias:
            problems.add(
                f"agent_plugins.{alias}.fallback", "an agent cannot be its own fallback", "write fallback: none"
            )
        elif isinstance(decl, LocalLLMDecl) and decl.fallback != "none":
            known(decl.fallback, f"agent_plugins.{alias}.fallback", "declare it, or write fallback: none")
    for name, gate in draft.gates.items():
        key = f"gates.{name}"
        if not gate.agent:
            continue
        where = draft.agent_keys.get(name, f"{key}.agent")
        hint = "declare it under agent_plugins: or fix the alias"
        if where.endswith(".with.agent") and gate.agent not in agents:
            # Kitsoki's with.agent names a persona; here it is the alias the call goes to
            hint = (
                f"in Kitsoki with.agent names a persona; here it is an agent alias from agent_plugins: — "
                f'route the call with agent: ALIAS (e.g. agent.claude) and put the "{gate.agent}" persona\'s '
                "instructions in with.prompt"
            )
        if not known(gate.agent, where, hint):
            continue
        if gate.fallback not in (None, "none"):
            decl = agents[gate.agent]
            if not isinstance(decl, (LocalLLMDecl, InprocessDecl)):
                problems.add(
                    f"{key}.fallback",
                    f"agent {gate.agent} is {decl.plugin}: only a local model (builtin.local_llm) falls back",
                    "remove fallback:",
                )
            elif gate.fallback == gate.agent:
                problems.add(f"{key}.fallback", "an agent cannot be its own fallback", "write fallback: none")
            else:
                known(gate.fallback, f"{key}.fallback", "declare it, or write fallback: none")
    for name, gate in draft.gates.items():
        embedder = gate.examples.embedder if gate.examples is not None else None
        if embedder is not None and embedder not in draft.embedders and f"embedder:{embedder}" not in draft.broken:
            problems.add(
                f"gates.{name}.examples.embedder",
                f'embedder "{embedder}" is not declared under embedders:{closest(embedder, list(draft.embedders))}',
                "declare it under embedders: (e.g. model: all-minilm-l6-v2)",
            )
    router = draft.router
    if router is None:
        return
    if (
        router.embedder is not None
        and router.embedder not in draft.embedders
        and f"embedder:{router.embedder}" not in draft.broken
    ):
        problems.add(
            "router.embedder",
            f'embedder "{router.embedder}" is not declared under embedders:'
            f"{closest(router.embedder, list(draft.embedders))}",
        )
    if router.agent is not None:
        known(router.agent, "router.agent")
    if not draft.intents and "intents" not in draft.data:
        problems.add("router", "a router needs intents:")


def in_file_order(items: list[ConfigProblem], data: Mapping[Any, Any]) -> list[ConfigProblem]:
    """Problems sorted by where their key first appears in the document (stable)."""
    order: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if len(order) > 20_000:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                path = f"{prefix}.{k}" if prefix else str(k)
                order.setdefault(path, len(order))
                walk(v, path)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                path = f"{prefix}[{i}]"
                order.setdefault(path, len(order))
                walk(v, path)

    walk(data, "")

    def position(problem: ConfigProblem) -> int:
        key = problem.key
        while key:
            if key in order:
                return order[key] + 1
            cut = max(key.rfind("."), key.rfind("["))
            key = key[:cut] if cut > 0 else ""
        return 0

    return sorted(items, key=position)
