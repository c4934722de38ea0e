"""`localllm …` — thin commands grouped by noun, each calling one library function.

Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad config. Data goes to
stdout, messages to stderr; ``--json`` wherever the output is data. Known errors become
one line plus a hint; a traceback only with ``LOCALLLM_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from localllm import settings
from localllm.errors import AgentError, ConfigError, LocalLLMError, SchemaError

#: ``localllm/cli/`` holds per-noun command modules (``localllm.cli.service``)
__path__ = [os.path.join(os.path.dirname(__file__), "cli")]

Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(LocalLLMError):
    """Bad command-line usage (exit 2)."""


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def err(message: str) -> None:
    sys.stderr.write(message + "\n")


def parse_kv(pairs: Sequence[str] | None) -> dict[str, str]:
    """``K=V`` arguments → dict (``--arg`` options)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--arg {pair!r} is not K=V")
        out[key] = value
    return out


# --------------------------------------------------------------------------- foundation
# check, call, run, trace — owned by the foundation work.


def _add_foundation(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm import cli_commands as c

    c.add_foundation(sub)


# --------------------------------------------------------------------------- artifacts
# fetch, cache, doctor — owned by the managed-artifacts work.


def _add_artifacts(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm.managed import commands

    commands.add_commands(sub)


# --------------------------------------------------------------------------- grammar


def _add_grammar(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm.grammar import commands

    commands.add_commands(sub)


# --------------------------------------------------------------------------- embeddings
# embed, search, route


def _add_embed(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm.embed import commands

    commands.add_commands(sub)


# --------------------------------------------------------------------------- plugins


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm.plugins import commands

    commands.add_commands(sub)


def _add_service(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from localllm.cli import service  # localllm/cli/service.py, found through __path__

    service.add_commands(sub)


_SECTIONS = (_add_foundation, _add_artifacts, _add_grammar, _add_embed, _add_plugins, _add_service)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localllm",
        description="Small local models as a dependable part of an agent runtime.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for section in _SECTIONS:
        section(sub)
    return parser


def _exit_code(exc: LocalLLMError) -> int:
    if isinstance(exc, (ConfigError, SchemaError, UsageError)):
        return EXIT_USAGE
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except LocalLLMError as exc:
        if settings.debug():
            raise
        prefix = "localllm: error: "
        if isinstance(exc, ConfigError):
            err(prefix + f"{len(exc.problems)} problem(s) in config:")
            for problem in exc.problems:
                err("  " + str(problem))
        elif isinstance(exc, AgentError):
            err(prefix + str(exc))
        else:
            err(prefix + str(exc))
        hint = getattr(exc, "hint", "")
        if hint and not isinstance(exc, ConfigError):
            err(f"hint: {hint}")
        return _exit_code(exc)
    except KeyboardInterrupt:
        err("localllm: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_OK


def run() -> None:
    sys.exit(main())
