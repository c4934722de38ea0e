"""The foundation commands: ``check``, ``call``, ``run`` and ``trace …``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli import EXIT_OK, UsageError, emit_json, err, parse_kv
from localllm.config import VERBS, Config
from localllm.loading import load_config
from localllm.wire import CallResult

if TYPE_CHECKING:
    from localllm.runtime import Runtime


def add_foundation(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser("check", help="run every load-time check on a config file")
    check.add_argument("config", type=Path)
    check.add_argument("--json", action="store_true", help="print the loaded summary as JSON")
    check.set_defaults(handler=_check)

    call = sub.add_parser("call", help="ask an agent a verb and print the validated submission")
    call.add_argument("verb", choices=VERBS)
    call.add_argument("--config", "-c", type=Path, required=True)
    call.add_argument("--agent", required=True, help="agent alias, e.g. agent.local")
    prompt = call.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text ({{ args.NAME }} templates allowed)")
    prompt.add_argument("--prompt-file", type=Path)
    call.add_argument("--schema", type=Path, help="JSON Schema file the answer must satisfy")
    call.add_argument("--arg", action="append", metavar="K=V", help="template argument (repeatable)")
    call.add_argument("--timeout", type=float, help="hard cap in seconds")
    call.add_argument("--cassette", type=Path, help="replay this cassette instead of the agent")
    _common_call_args(call)
    call.set_defaults(handler=_call)

    run = sub.add_parser("run", help="run a named gate from the config")
    run.add_argument("gate")
    run.add_argument("--config", "-c", type=Path, required=True)
    run.add_argument("--arg", action="append", metavar="K=V")
    _common_call_args(run)
    run.set_defaults(handler=_run)

    from localllm.trace import commands as trace_commands

    trace_commands.add_commands(sub)


def _common_call_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, help="append the call's events to this JSONL trace")
    parser.add_argument("--json", action="store_true", help="print submission, meta and call_id as JSON")


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    summary: dict[str, Any] = {
        "config": str(config.path),
        "app_id": config.app_id,
        "agents": {alias: decl.plugin for alias, decl in config.agents.items()},
        "gates": {name: {"verb": g.verb, "agent": g.agent, "fallback": config.fallback_for(g.agent, name)}
                  for name, g in config.gates.items()},
        "embedders": sorted(config.embedders),
        "intents": sorted(config.intents),
    }
    if args.json:
        emit_json(summary)
    else:
        print(f"{config.path}: ok ({len(config.agents)} agents, {len(config.gates)} gates, "
              f"{len(config.embedders)} embedders)")
        for name, target in config.fallbacks().items():
            print(f"  gate {name}: {'falls back to ' + target if target else 'no fallback'}")
    return EXIT_OK


def _print_result(result: CallResult, as_json: bool) -> None:
    if as_json:
        emit_json({"submission": result.submission, "meta": result.meta, "call_id": result.call_id,
                   "agent": result.agent, "ok": result.ok, "exit_code": result.exit_code})
        return
    value = result.submission
    if isinstance(value, str):
        print(value)
    else:
        emit_json(value)
    original = result.meta.get("fallback_of")
    err(f"answered by: {result.agent}" + (f" (fallback from {original})" if original else ""))


def _call(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read --prompt-file {args.prompt_file}: {exc}") from exc
    else:
        prompt = args.prompt
    schema = args.schema.resolve() if args.schema is not None else None
    if schema is not None and not schema.is_file():
        raise UsageError(f"--schema {args.schema}: file not found")
    def ask(runtime: Runtime) -> CallResult:
        if args.cassette is not None:
            from localllm.agents.cassette import CassetteAgent

            runtime.register_agent(args.agent, CassetteAgent(args.cassette, alias=args.agent))
        return runtime.call(args.verb, agent=args.agent, prompt=prompt, schema=schema, args=parse_kv(args.arg),
                            timeout=args.timeout)

    return _run_and_print(config, args, ask)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    return _run_and_print(config, args, lambda runtime: runtime.run_gate(args.gate, parse_kv(args.arg)))


def _run_and_print(config: Config, args: argparse.Namespace, work: Callable[[Runtime], CallResult]) -> int:
    """Run one call in a fresh Runtime, print the result; the trace path is named either way."""
    from localllm.runtime import Runtime

    try:
        with Runtime(config, trace=args.trace) as runtime:
            result = work(runtime)
    finally:
        if args.trace is not None:
            sys.stderr.write(f"trace: {args.trace}\n")
    _print_result(result, args.json)
    return EXIT_OK
