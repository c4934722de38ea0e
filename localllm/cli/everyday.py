"""``localllm version | help [COMMAND] | completion SHELL | logs [MODEL]``: the everyday commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from localllm.cli.output import EXIT_OK, UsageError, check_range, emit_json, out

SHELLS = ("bash", "zsh", "fish")


def _setup_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the version as JSON")
    parser.set_defaults(handler=_version)


def _setup_help(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "topic", nargs="*", metavar="COMMAND", help="the command to explain, e.g. run or trace verify (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="print the command table as JSON")
    parser.set_defaults(handler=_help)


def _setup_completion(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"one of {', '.join(SHELLS)}")
    parser.add_argument("--json", action="store_true", help="print the completion data (commands, options) as JSON")
    parser.set_defaults(handler=_completion)


def _setup_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="MODEL", help="a model id (default: the service's log)")
    parser.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="the last N lines (default 50)")
    parser.add_argument("--json", action="store_true", help="print the log files and lines as JSON")
    parser.set_defaults(handler=_logs)


SETUP = {"version": _setup_version, "help": _setup_help, "completion": _setup_completion, "logs": _setup_logs}


def _version(args: argparse.Namespace) -> int:
    from localllm._version import __version__

    if args.json:
        emit_json({"version": __version__, "python": sys.version.split()[0]})
    else:
        out(f"localllm {__version__}")
    return EXIT_OK


def _help(args: argparse.Namespace) -> int:
    from localllm.cli.app import COMMANDS, build_parser, suggest

    words = list(args.topic)
    if words and words[0] not in COMMANDS:
        raise UsageError(f"no command {words[0]!r}", hint=suggest(words[0]))
    parser = _subparsers(build_parser(words[0]))[words[0]] if words else build_parser()
    for depth, word in enumerate(words[1:], start=1):  # `help trace verify`, as `trace verify --help`
        choices = _subparsers(parser)
        if word not in choices:
            command = " ".join(words[:depth])
            hint = f"{command} takes: {', '.join(choices)}" if choices else f"see `localllm help {command}`"
            raise UsageError(f"no command {' '.join(words[: depth + 1])!r}", hint=hint)
        parser = choices[word]
    if args.json:
        emit_json({name: info.summary for name, info in COMMANDS.items()})
    else:
        parser.print_help(sys.stdout)
    return EXIT_OK


# --------------------------------------------------------------------------- completion


def command_tree() -> dict[str, dict[str, Any]]:
    """Every command → ``{"options": [...], "subcommands": {name: [options]}}``, from the parsers."""
    from localllm.cli.app import COMMANDS, build_parser

    tree: dict[str, dict[str, Any]] = {}
    for name in COMMANDS:
        parser = build_parser(name)
        child = _subparsers(parser)[name]
        subs = _subparsers(child)
        tree[name] = {"options": _options(child), "subcommands": {s: _options(p) for s, p in subs.items()}}
    return tree


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") or len(o) == 2)


def completion_script(shell: str, tree: dict[str, dict[str, Any]]) -> str:
    """A completion script for ``shell`` (bash; zsh through bashcompinit; fish)."""
    if shell == "fish":
        lines = ["# localllm completion for fish: localllm completion fish > ~/.config/fish/completions/localllm.fish"]
        lines.append(f"complete -c localllm -f -n __fish_use_subcommand -a '{' '.join(tree)}'")
        for cmd, node in tree.items():
            seen = f"__fish_seen_subcommand_from {cmd}"
            if node["subcommands"]:
                lines.append(f"complete -c localllm -f -n '{seen}' -a '{' '.join(node['subcommands'])}'")
            opts = sorted({*node["options"], *(o for opts in node["subcommands"].values() for o in opts)})
            for opt in opts:
                flag = f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
                lines.append(f"complete -c localllm -n '{seen}' {flag}")
        return "\n".join(lines) + "\n"
    cases = []
    for cmd, node in tree.items():
        if node["subcommands"]:
            inner = " ".join(f'{s}) opts="{" ".join(o)}";;' for s, o in node["subcommands"].items())
            subs = " ".join(node["subcommands"])
            cases.append(
                f'    {cmd}) if [ "$COMP_CWORD" -eq 2 ]; then opts="{subs}"; '
                f'else case "${{COMP_WORDS[2]}}" in {inner} esac; fi;;'
            )
        else:
            cases.append(f'    {cmd}) opts="{" ".join(node["options"])}";;')
    body = "\n".join(cases)
    script = f"""# localllm completion for {shell}: eval "$(localllm completion {shell})" in your shell's rc file
_localllm() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" opts=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{" ".join(tree)}" -- "$cur"))
    return 0
  fi
  case "${{COMP_WORDS[1]}}" in
{body}
  esac
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -o bashdefault -F _localllm localllm
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _completion(args: argparse.Namespace) -> int:
    tree = command_tree()
    if args.json:
        emit_json(tree)
    else:
        sys.stdout.write(completion_script(args.shell, tree))
    return EXIT_OK


# --------------------------------------------------------------------------- logs


def _logs(args: argparse.Namespace) -> int:
    from localllm.managed import discovery
    from localllm.managed.cache import cache_layout
    from localllm.managed.server import log_path_for

    check_range("-n/--lines", args.lines, low=1, default=50)
    root = cache_layout().root
    if args.model is None:
        path = discovery.run_dir(root) / discovery.LOG_FILE
        what = "the service"
    else:
        path = log_path_for(args.model)
        what = args.model
    kept = sorted(p.stem for p in (root / "logs").glob("*.log")) if (root / "logs").is_dir() else []
    if not path.is_file():
        known = ", ".join(kept) or "none yet"
        raise UsageError(
            f"no log for {what} at {path}",
            hint=f"models with a kept llama-server log: {known}; the service's log appears once "
            "`localllm serve --detach` has run",
        )
    lines = _tail(path, args.lines)
    if args.json:
        emit_json({"log": str(path), "lines": lines, "models": kept})
    else:
        sys.stderr.write(f"==> {path} <==\n")
        for line in lines:
            out(line)
    return EXIT_OK


def _tail(path: Path, n: int) -> list[str]:
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - 256 * 1024))
        data = fh.read()
    return data.decode("utf-8", errors="replace").splitlines()[-n:]
