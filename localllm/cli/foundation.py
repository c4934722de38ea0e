"""``localllm check | call | run``: load a config, then ask an agent or run a gate."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._fs import TEXT_LIMIT, read_capped
from localllm.cli.output import EXIT_OK, UsageError, check_range, emit_json, err, out, output_path, parse_kv, warn
from localllm.errors import ConfigError, ConfigProblem, LocalLLMError

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.config.parse import Draft
    from localllm.runtime import Runtime
    from localllm.wire import CallResult


#: the config file a command finds in the current directory when no -c is given
DEFAULT_CONFIG = "localllm.yaml"


def add_config_option(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``-c/--config FILE``: the one spelling every command that reads a config accepts.

    Never required on the command line: without it :func:`discover_config` looks for
    ``./localllm.yaml``, then ``LOCALLLM_CONFIG`` (``required`` is kept for callers).
    """
    del required
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FILE",
        help=f"the config file (default: ./{DEFAULT_CONFIG}, then $LOCALLLM_CONFIG)",
    )


def discover_config(given: Path | None) -> Path:
    """``given``, else ``./localllm.yaml``, else ``LOCALLLM_CONFIG``; a usage error naming all three."""
    from localllm import settings

    if given is not None:
        return given
    local = Path(DEFAULT_CONFIG)
    if local.is_file():
        return local
    env = settings.config_file()
    if env is not None and not env.is_file():  # set once in a shell profile, then forgotten
        what = "is a directory, not a config file" if env.is_dir() else "names no file"
        raise UsageError(
            f"LOCALLLM_CONFIG={env} {what} (used because no -c was given and {Path.cwd()} has no {DEFAULT_CONFIG})",
            hint="fix or unset LOCALLLM_CONFIG, or pass -c FILE",
        )
    if env is not None:
        return env
    near = Path(DEFAULT_CONFIG).with_suffix(".yml")  # found by name only: .yml is not looked for
    raise UsageError(
        f"no config file: none given with -c, no {DEFAULT_CONFIG} in {Path.cwd()}, and LOCALLLM_CONFIG is not set",
        hint=f"pass -c {near} (or rename it {DEFAULT_CONFIG})"
        if near.is_file()
        else f"pass -c FILE, run it where {DEFAULT_CONFIG} is, or set LOCALLLM_CONFIG=FILE",
    )


def _setup_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config_file", nargs="?", type=Path, metavar="CONFIG", help="the config file")
    add_config_option(parser, required=False)
    parser.add_argument("--json", action="store_true", help="print the loaded summary as JSON")
    parser.set_defaults(handler=_check)


def _setup_call(parser: argparse.ArgumentParser) -> None:
    from localllm.wire import VERBS

    parser.add_argument("verb", choices=VERBS, metavar="VERB", help=f"one of {', '.join(VERBS)}")
    add_config_option(parser)
    parser.add_argument("--agent", required=True, metavar="ALIAS", help="agent alias, e.g. agent.local")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt", metavar="TEXT", help="prompt text ({{ args.NAME }} / {{ world.NAME }} templates allowed)"
    )
    prompt.add_argument("--prompt-file", type=Path, metavar="F", help="read the prompt from this file")
    parser.add_argument("--schema", type=Path, metavar="F", help="JSON Schema file the answer must satisfy")
    parser.add_argument("--timeout", type=float, metavar="S", help="hard cap in seconds")
    _common_call_args(parser)
    parser.set_defaults(handler=_call)


def _setup_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gate", metavar="GATE", help="a name under gates:")
    add_config_option(parser)
    _common_call_args(parser)
    parser.set_defaults(handler=_run)


def _common_call_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arg", action="append", metavar="K=V", help="template argument (repeatable)")
    parser.add_argument("--world", action="append", metavar="K=V", help="world value for {{ world.K }} (repeatable)")
    parser.add_argument("--cassette", type=Path, metavar="F", help="replay this cassette instead of the agent")
    parser.add_argument("--trace", type=Path, metavar="F", help="append the call's events to this JSONL trace")
    parser.add_argument("--json", action="store_true", help="print submission, meta and call_id as JSON")


SETUP = {"check": _setup_check, "call": _setup_call, "run": _setup_run}


def load(path: Path | None, early: EarlyStart | None = None) -> Config:
    """``load_config`` of ``path`` or the discovered config (ConfigError lists every problem;
    the CLI exits 2); its secrets are masked in all the command's output from here on.

    ``early``: its agent's model starts loading as soon as the file is parsed, while the
    rest of the checks run (and is stopped if they fail)."""
    from localllm import _head_start
    from localllm.cli.output import protect
    from localllm.loading import load_config

    try:
        found = discover_config(path)
        _head_start.note_config(found)
        config = load_config(found, parsed=early)
    except BaseException:
        if early is not None:
            early.close()
        raise
    finally:
        _head_start.release()  # the early start has claimed the head start's server, or never will
    protect(config.secret_values())
    return config


class EarlyStart:
    """The managed local model a ``run``/``call`` is sure to ask, started at parse time.

    Called by ``load_config`` once the file parses cleanly (``parsed=``): when ``alias_of``
    names a managed ``builtin.local_llm`` agent, that agent is built from its declaration and
    its server starts loading (``Agent.prepare(wait=False)``) while the config's remaining
    checks and the call's preparation run. The Runtime then adopts it (:meth:`hand_to`);
    until then :meth:`close` stops it — a config that fails a later check exits with the
    same error as without this, and no server is left behind.
    """

    def __init__(self, alias_of: Callable[[Draft], str | None]) -> None:
        self._alias_of = alias_of
        self.alias: str | None = None
        self.agent: Any = None

    def __call__(self, draft: Draft) -> None:
        from localllm.config import LocalLLMDecl

        alias = self._alias_of(draft)
        decl = draft.agents.get(alias) if alias is not None else None
        if not isinstance(decl, LocalLLMDecl) or decl.endpoint is not None:
            return
        from localllm.agents.local_llm import LocalLLMAgent

        try:
            agent = LocalLLMAgent(decl, base_dir=draft.ctx.base_dir)
        except LocalLLMError:
            return  # left for the call to report, with its own error
        self.alias, self.agent = alias, agent
        agent.prepare(wait=False)

    def hand_to(self, runtime: Runtime) -> None:
        """The Runtime takes the agent over (and closes it); nothing is left to stop here."""
        agent, self.agent = self.agent, None
        if agent is None or self.alias is None:
            return
        try:
            runtime.adopt_agent(self.alias, agent)
        except BaseException:
            agent.close()
            raise

    def close(self) -> None:
        """Stop the early agent's server unless a Runtime took it over (idempotent)."""
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close()


def _check(args: argparse.Namespace) -> int:
    given = {p for p in (args.config_file, args.config) if p is not None}
    if len(given) > 1:
        raise UsageError(
            f"two different configs given: {args.config_file} and {args.config}",
            hint="localllm check CONFIG  (or: localllm check -c CONFIG)",
        )
    config = load(given.pop() if given else None)
    try:
        return _check_loaded(config, args)
    except (ConfigError, UsageError):
        raise
    except LocalLLMError as exc:  # one rule: whatever check finds wrong in a config exits 2
        raise ConfigError([ConfigProblem(str(config.path), "", str(exc), exc.hint)]) from exc


def _check_loaded(config: Config, args: argparse.Namespace) -> int:
    summary: dict[str, Any] = {
        "config": str(config.path),
        "app_id": config.app_id,
        "agents": {alias: decl.plugin for alias, decl in config.agents.items()},
        "gates": {
            name: {"verb": g.verb, "agent": g.agent, "fallback": config.fallback_for(g.agent, name)}
            for name, g in config.gates.items()
        },
        "embedders": sorted(config.embedders),
        "intents": sorted(config.intents),
        "warnings": _template_warnings(config) + _evidence_warnings(config) + _plugin_warnings(config),
    }
    stale = _stale_evidence(config)
    if stale:
        summary["stale_evidence"] = stale
    if args.json:
        emit_json(summary)
    else:
        out(
            f"{config.path}: ok ({len(config.agents)} agents, {len(config.gates)} gates, "
            f"{len(config.embedders)} embedders)"
        )
        for name, target in config.fallbacks().items():
            out(f"  gate {name}: {'falls back to ' + target if target else 'no fallback'}")
        for name, reasons in stale.items():
            for who, why in reasons.items():
                warn(
                    f"gate {name}: evidence is stale{' for ' + who if who else ''}: {'; '.join(why)} "
                    f"(re-run `localllm eval {name} -c {config.path}`)"
                )
        for line in summary["warnings"]:
            warn(line)
    return EXIT_OK


def _stale_evidence(config: Config) -> dict[str, dict[str, list[str]]]:
    """gate → {"" (gate-wide) | alias → what changed since its ``selection.evidence`` was measured}."""
    from localllm.selection import read_evidence, staleness

    found: dict[str, dict[str, list[str]]] = {}
    for name, gate in config.gates.items():
        if gate.selection is None or gate.selection.evidence is None or not gate.selection.evidence.exists():
            continue
        reasons = staleness(config, gate, read_evidence(gate.selection.evidence))
        reasons = {who: why for who, why in reasons.items() if why}
        if reasons:
            found[name] = reasons
    return found


def _plugin_warnings(config: Config) -> list[str]:
    """The plugin loader's diagnostics for the config's plugin_dirs (skipped parts first)."""
    return [
        f"{d['key']}: {d['severity']}: {d['origin']}: {d['message']} [§{d['section']} {d['rule']}]"
        for d in config.diagnostics
    ]


def _evidence_warnings(config: Config) -> list[str]:
    """Gates whose ``selection.evidence`` does not exist yet (metadata first, §2)."""
    from localllm.selection import eval_command

    return [
        f"gates.{name}.selection.evidence: {gate.selection.evidence} does not exist yet; until "
        f"`{eval_command(name, config.path, gate.selection.evidence)}` writes it, calls stay on {gate.agent}"
        for name, gate in config.gates.items()
        if gate.selection is not None and gate.selection.evidence is not None and not gate.selection.evidence.exists()
    ]


def _template_warnings(config: Config) -> list[str]:
    """Managed chat agents whose GGUF has no chat template and none is configured."""
    from localllm.config import LocalLLMDecl
    from localllm.managed.gguf import template_warning

    found = []
    for alias, decl in config.agents.items():
        if isinstance(decl, LocalLLMDecl) and decl.endpoint is None and decl.model:
            why = template_warning(decl.model, base_dir=config.base_dir, extra_args=decl.extra_args)
            if why:
                found.append(f"agent_plugins.{alias}.model: {why}")
    return found


def _relative_hint(flag: str, given: Path, config: Config) -> str:
    """A file named on the command line is found from the current directory, not the config's:
    say so, and name the config-relative file when that is what was meant."""
    beside = config.base_dir / given
    if not given.is_absolute() and beside.is_file():
        return f"command-line paths are relative to the current directory; the config's file is {flag} {beside}"
    return f"command-line paths are relative to the current directory ({Path.cwd()})"


def _call(args: argparse.Namespace) -> int:
    if args.timeout is not None:
        from localllm.config.decls import MAX_TIMEOUT

        check_range("--timeout", args.timeout, low=0.0, high=MAX_TIMEOUT, low_open=True, unit="seconds")
    _check_trace(args.trace)
    early = EarlyStart(lambda draft: args.agent) if args.cassette is None else None
    try:
        return _call_loaded(args, early)
    finally:
        if early is not None:
            early.close()


def _check_trace(trace: Path | None) -> None:
    """``--trace F`` names a file to append to: a directory there is a usage error (exit 2),
    found before any config is read or server started."""
    if trace is not None:
        output_path(trace, "--trace")


def _call_loaded(args: argparse.Namespace, early: EarlyStart | None) -> int:
    config = load(args.config, early)
    if args.prompt_file is not None:
        try:
            prompt = read_capped(args.prompt_file, TEXT_LIMIT).decode("utf-8")
        except FileNotFoundError as exc:
            raise UsageError(
                f"--prompt-file {args.prompt_file}: file not found",
                hint=_relative_hint("--prompt-file", args.prompt_file, config),
            ) from exc
        except IsADirectoryError as exc:
            raise UsageError(f"--prompt-file {args.prompt_file}: is a directory", hint="name a file") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read --prompt-file {args.prompt_file}: {exc}", hint="name a readable UTF-8 text file"
            ) from exc
    else:
        prompt = args.prompt
    schema = args.schema.resolve() if args.schema is not None else None
    if schema is not None and not schema.is_file():
        if schema.exists():
            raise UsageError(f"--schema {args.schema}: not a regular file", hint="name a JSON Schema file")
        raise UsageError(
            f"--schema {args.schema}: file not found", hint=_relative_hint("--schema", args.schema, config)
        )
    call_args, world = parse_kv(args.arg), parse_kv(args.world, flag="--world")

    def ask(runtime: Runtime) -> CallResult:
        return runtime.call(
            args.verb, agent=args.agent, prompt=prompt, schema=schema, args=call_args, world=world, timeout=args.timeout
        )

    return _run_and_print(config, args, args.agent, ask, start_early=args.agent, early=early)


def _gate_agent(gates: Any, name: str) -> str | None:
    """The agent gate ``name`` is sure to ask; None when it has ``selection:`` (may be
    routed to another agent) or does not exist (run_gate's error to report)."""
    gate = gates.get(name)
    return gate.agent if gate is not None and gate.selection is None else None


def _run(args: argparse.Namespace) -> int:
    _check_trace(args.trace)
    early = EarlyStart(lambda draft: _gate_agent(draft.gates, args.gate)) if args.cassette is None else None
    try:
        return _run_loaded(args, early)
    finally:
        if early is not None:
            early.close()


def _run_loaded(args: argparse.Namespace, early: EarlyStart | None) -> int:
    config = load(args.config, early)
    gate = config.gates.get(args.gate)
    alias = gate.agent if gate is not None else None  # an unknown gate is run_gate's error to report
    call_args, world = parse_kv(args.arg), parse_kv(args.world, flag="--world")
    return _run_and_print(
        config,
        args,
        alias,
        lambda runtime: runtime.run_gate(args.gate, call_args, world),
        start_early=_gate_agent(config.gates, args.gate),
        early=early,
    )


def _run_and_print(
    config: Config,
    args: argparse.Namespace,
    alias: str | None,
    work: Callable[[Runtime], CallResult],
    *,
    start_early: str | None = None,
    early: EarlyStart | None = None,
) -> int:
    """Run one call in a fresh Runtime (``--cassette`` replaces ``alias``), print the result.

    ``start_early``: the agent sure to answer; a managed local model starts loading at once,
    while the call is prepared (``early``: already started while the config was checked).
    The answer is printed before the Runtime stops its servers. The trace path is named on
    stderr either way: a failed call's events are in it too.
    """
    from localllm.runtime import Runtime

    try:
        with Runtime(config, trace=args.trace) as runtime:
            if early is not None:
                early.hand_to(runtime)
            if args.cassette is not None and alias is not None:
                from localllm.agents.cassette import CassetteAgent

                runtime.register_agent(alias, CassetteAgent(args.cassette, alias=alias))
            elif start_early is not None:
                _start_early(runtime, start_early)
            result = work(runtime)
            _print_result(result, args.json)
    finally:
        if args.trace is not None:
            err(f"trace: {args.trace}")
    return EXIT_OK


def _start_early(runtime: Runtime, alias: str) -> None:
    """Let ``alias``'s server start loading now (``Agent.prepare(wait=False)``), if it has one.

    An alias that cannot be built is left for the call to report, with its own error.
    """
    from localllm.errors import LocalLLMError

    try:
        agent = runtime.agent(alias)
    except LocalLLMError:
        return
    prepare = getattr(agent, "prepare", None)  # a registered object may not subclass Agent
    if callable(prepare):
        prepare(wait=False)


def _print_result(result: CallResult, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "ok": result.ok,
                "submission": result.submission,
                "meta": result.meta,
                "call_id": result.call_id,
                "agent": result.agent,
                "exit_code": result.exit_code,
            }
        )
        return
    value = result.submission
    if isinstance(value, str):
        out(value)
    else:
        emit_json(value)
    original = result.meta.get("fallback_of")
    err(f"answered by: {result.agent}" + (f" (fallback from {original})" if original else ""))
    if result.meta.get("served_by") == "sidecar":
        err(
            "tip: this command started its own llama-server and stopped it again; "
            "`localllm serve --detach` keeps models loaded between commands"
        )
