"""``localllm …``: the command table, the parser, and the one error → exit-code wrapper.

The table names each command's module and summary (pip's ``CommandInfo``); only the
module of the command being run is imported, so ``localllm --help`` and
``localllm --version`` import no subsystem. Each command module exposes ``SETUP``:
command name → a function that adds the command's arguments and sets ``handler``.

Exit codes: 0 success, 1 the command ran and failed (or its verdict is no), 2 it was given
something it cannot use (bad usage, a named path missing or of the wrong kind, bad config),
130 interrupted; the rule in full is in :mod:`localllm.cli.output`.
A known error is one line plus a hint (or, with ``--json``, one JSON object on stdout);
a traceback only with ``LOCALLLM_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from localllm import settings
from localllm._version import __version__
from localllm.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PREFIX,
    OutputUnwritable,
    UsageError,
    emit_json,
    err,
    masked_output,
    warn,
)
from localllm.errors import AgentError, CallError, ConfigError, LocalLLMError, SchemaError, UnknownModel

Handler = Callable[[argparse.Namespace], int]
Setup = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class CommandInfo:
    """Where a command lives and the one line ``--help`` shows for it."""

    module: str
    summary: str


COMMANDS: dict[str, CommandInfo] = {
    "check": CommandInfo("localllm.cli.foundation", "run every load-time check on a config file"),
    "call": CommandInfo("localllm.cli.foundation", "ask an agent a verb and print the validated submission"),
    "run": CommandInfo("localllm.cli.foundation", "run a named gate from the config"),
    "fetch": CommandInfo("localllm.cli.artifacts", "pre-warm the cache: llama-server or a model's GGUF"),
    "cache": CommandInfo("localllm.cli.artifacts", "list, verify or prune the artifact cache"),
    "doctor": CommandInfo("localllm.cli.artifacts", "platform, glibc/GLIBCXX, pins, cache, build tools"),
    "models": CommandInfo("localllm.cli.artifacts", "pinned models: cached or not, sizes, total"),
    "grammar": CommandInfo("localllm.cli.grammar", "the llama.cpp grammar subset: check schema files"),
    "embed": CommandInfo("localllm.cli.embed", "embed texts with a declared embedder; one JSON vector per line"),
    "search": CommandInfo("localllm.cli.embed", "semantic search over files: score, path#chunk, snippet"),
    "route": CommandInfo("localllm.cli.embed", "route TEXT to one of the config's intents (embeddings, then decide)"),
    "plugins": CommandInfo("localllm.cli.plugins", "Agent Plugins directories: load one and show what survived"),
    "trace": CommandInfo("localllm.cli.trace", "verify, show, summarise a trace; turn it into cases or a cassette"),
    "eval": CommandInfo("localllm.cli.eval", "measure agents on a gate's cases; write the evidence for selection:"),
    "serve": CommandInfo("localllm.cli.service", "run the machine-wide OpenAI-compatible service"),
    "ps": CommandInfo("localllm.cli.service", "the service's loaded models"),
    "stop": CommandInfo("localllm.cli.service", "unload a model from the service, or stop it"),
    "logs": CommandInfo("localllm.cli.everyday", "the kept llama-server log of a model, or the service's log"),
    "completion": CommandInfo("localllm.cli.everyday", "print a shell completion script (bash, zsh, fish)"),
    "version": CommandInfo("localllm.cli.everyday", "print the version"),
    "help": CommandInfo("localllm.cli.everyday", "the command list, or one command's help"),
}

#: verbs users of Ollama, `llm` and huggingface_hub reach for → the localllm command
ALIASES: dict[str, str] = {
    "pull": "fetch model",
    "download": "fetch model",
    "install": "fetch model",
    "list": "models",
    "ls": "models",
    "show": "models",
    "rm": "cache rm",
    "remove": "cache rm",
    "delete": "cache rm",
    "prune": "cache prune",
    "start": "serve",
    "kill": "stop",
    "info": "doctor",
    "env": "doctor",
    "embeddings": "embed",
    "completions": "completion",
}


def suggest(word: str, rest: Sequence[str] = ()) -> str:
    """The "did you mean" hint for an unknown command ``word`` (with its arguments ``rest``)."""
    import difflib

    tail = "".join(f" {a}" for a in rest)
    if rest and rest[0] in COMMANDS:  # a noun before a command (`localllm service stop`): the command
        return f"did you mean `localllm {' '.join(rest)}`?"
    if word in ALIASES:
        return f"did you mean `localllm {ALIASES[word]}{tail}`?"
    close = difflib.get_close_matches(word, list(COMMANDS), n=2, cutoff=0.6)
    if close:
        return " or ".join(f"`localllm {c}{tail}`" for c in close).join(("did you mean ", "?"))
    return "see `localllm help` for the commands"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are ``UsageError`` (so ``--json`` can report them)."""

    #: the last (sub)parser to parse: argparse reports an unknown option on the top-level parser,
    #: after the command's own parser has run, so its help is the one to point at
    last: Parser | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        Parser.last = self
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        at = Parser.last if message.startswith("unrecognized arguments") and Parser.last is not None else self
        raise UsageError(message, hint=f"see `{at.prog} --help`", usage=at.format_usage())


def build_parser(command: str | None = None) -> Parser:
    """The parser; only ``command``'s module is imported and its arguments added."""
    parser = Parser(prog="localllm", description="Small local models as a dependable part of an agent runtime.")
    parser.add_argument("--version", action="version", version=f"localllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, info in COMMANDS.items():
        child = sub.add_parser(name, help=info.summary, description=info.summary)
        if name == command:
            setup: Setup = importlib.import_module(info.module).SETUP[name]
            setup(child)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    # the top-level parser takes no option with a value, so the first bare word is the command
    for token in argv:
        if token == "--":
            return None
        if not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it).

    Run as the program (``argv`` not given: the console script, ``python -m localllm``),
    the interpreter's exit skips its last walk over every object (see :func:`_freeze_at_exit`).
    """
    if argv is None:
        _freeze_at_exit()
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    with masked_output(), warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            _check_command(argv)
            args = _parse(argv)
            if isinstance(args, int):  # help, or a usage error argparse printed
                return _written(args)
            as_json = bool(getattr(args, "json", False))
            handler: Handler | None = getattr(args, "handler", None)
            if handler is None:
                build_parser().print_help(sys.stderr)
                err(f"{PREFIX}error: a command is required (see the list above; `localllm help COMMAND` for one)")
                return EXIT_USAGE
            return _written(handler(args))
        except OutputUnwritable as exc:  # `> /dev/full`: nothing on stdout can say so
            with contextlib.suppress(OSError):
                err(f"{PREFIX}error: {exc.strerror}")
            return EXIT_FAILED
        except KeyboardInterrupt:
            err(f"{PREFIX}interrupted")
            return 130
        except BrokenPipeError:  # `localllm … | head`: the reader has what it wanted
            return EXIT_OK
        except Exception as exc:
            # A LocalLLMError is expected; anything else is a localllm bug (Runtime is the
            # library's last boundary) and still gets one line, not a traceback.
            if settings.debug():
                raise
            return report_error(exc, as_json=as_json)


def _written(code: int) -> int:
    """``code`` once stdout holds all of the command's output: what is still buffered is
    flushed here, and a write stdout refused — even one argparse swallowed while printing
    help — is :class:`OutputUnwritable`."""
    sys.stdout.flush()
    failed = getattr(sys.stdout, "failed", None)
    if failed is not None:
        raise failed
    return code


def _freeze_at_exit() -> None:
    """At interpreter exit, ``gc.freeze()`` what is left before the final collection.

    When the process exits the command has finished: its servers are stopped and reaped,
    its traces and files closed (each command closes what it opened, as a library caller
    would). What remains is the interpreter's teardown, whose last garbage collection walks
    every object the imports made (httpx, jsonschema, the grammar compiler, the config):
    ~160 ms of a ``localllm run``'s exit on the CI machine, after the answer. Frozen, they
    are freed by reference counting alone; atexit handlers (registered earlier, so run
    after this one), non-daemon threads and the flush of stdout/stderr run as before.
    Only when ``main`` runs as the program (once per process): a caller of ``main(argv)``
    in its own process (tests) keeps its interpreter's exit as it was.
    """
    atexit.register(gc.freeze)


def _check_command(argv: Sequence[str]) -> None:
    """An unknown command is a usage error with a "did you mean" (``pull`` → ``fetch model``)."""
    for i, token in enumerate(argv):
        if token == "--":
            return
        if not token.startswith("-"):
            if token not in COMMANDS:
                rest = [a for a in argv[i + 1 :] if a != "--json"]
                raise UsageError(f"unknown command {token!r}", hint=suggest(token, rest))
            return


def _parse(argv: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code of ``--help`` / ``--version``."""
    try:
        return build_parser(_command_of(argv)).parse_args(argv)
    except SystemExit as exc:  # argparse's own exits: --help and --version print, then exit 0
        return exc.code if isinstance(exc.code, int) else EXIT_OK


# --------------------------------------------------------------------------- errors


def kind_of(exc: BaseException) -> str:
    """``schema_invalid`` … for an AgentError; else the class name in snake case (``config_error``)."""
    if isinstance(exc, AgentError):
        return exc.kind.value
    if not isinstance(exc, LocalLLMError):
        return "internal_error"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def exit_code_of(exc: BaseException) -> int:
    """2 for bad usage or bad config (a model id that is not pinned is one), 1 for everything else."""
    usage = (CallError, ConfigError, SchemaError, UsageError, UnknownModel)
    return EXIT_USAGE if isinstance(exc, usage) else EXIT_FAILED


def error_document(exc: BaseException) -> dict[str, Any]:
    """The ``--json`` form of a failure: ``{"ok": false, "kind", "detail", "hint"}`` (+ ``problems``)."""
    doc: dict[str, Any] = {
        "ok": False,
        "kind": kind_of(exc),
        "detail": exc.detail if isinstance(exc, AgentError) and exc.detail.strip() else _text(exc),
        "hint": _hint(exc),
    }
    if isinstance(exc, ConfigError):
        doc["problems"] = [{"file": p.file, "key": p.key, "message": p.message, "hint": p.hint} for p in exc.problems]
    return doc


def report_error(exc: BaseException, *, as_json: bool) -> int:
    """Print ``exc`` once — JSON on stdout with ``--json``, else a line and a hint on stderr."""
    if as_json:
        try:
            emit_json(error_document(exc))
            sys.stdout.flush()
            return exit_code_of(exc)
        except OutputUnwritable as unwritable:  # the error goes where it can be read
            err(f"{PREFIX}error: {unwritable.strerror}")
    if isinstance(exc, ConfigError):
        err(f"{PREFIX}error: {len(exc.problems)} problem(s) in config:")
        for problem in exc.problems:
            err(f"  {problem}")
    else:
        if isinstance(exc, UsageError) and exc.usage:
            sys.stderr.write(exc.usage)
        err(f"{PREFIX}error: {_text(exc)}")
        if _hint(exc):
            err(f"hint: {_hint(exc)}")
    return exit_code_of(exc)


def _text(exc: BaseException) -> str:
    """The message; never empty (a refusal always says what refused: its kind, its cause)."""
    text = str(exc) if isinstance(exc, LocalLLMError) else f"{type(exc).__name__}: {exc}"
    if text.strip() and not text.rstrip().endswith(":"):
        return text
    cause = exc.__cause__ or exc.__context__
    why = f": {_text(cause)}" if cause is not None else " (no detail was given)"
    return f"{text.strip().rstrip(':') or kind_of(exc).replace('_', ' ')}{why}"


def _hint(exc: BaseException) -> str:
    if isinstance(exc, LocalLLMError):
        return exc.hint
    return "this is a bug in localllm; run again with LOCALLLM_DEBUG=1 for the traceback and report it"


def _show_warning(message: Warning | str, *_where: Any, **_kw: Any) -> None:
    # warnings.showwarning's signature; a warning is news for the user, not a source
    # location: one line, without file:lineno or the warning's class.
    warn(" ".join(str(message).split()))
