"""The README's reference facts that ``test_cli.py`` (every command and flag named) and
``test_config_readme.py`` (the config table) do not cover: the environment variables, the
choices a synopsis spells out, and the defaults it states, each against the code."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any

from localllm import settings
from localllm.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
_ENV = re.compile(r"\bLOCALLLM_[A-Z][A-Z_]*[A-Z]\b")


def _read_in_settings() -> set[str]:
    """Every ``LOCALLLM_*`` name ``settings.py`` reads (a string constant passed to a call)."""
    tree = ast.parse(Path(settings.__file__).read_text(encoding="utf-8"))
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _ENV.fullmatch(arg.value)
    }


def _paragraph(text: str, start: str) -> str:
    begin = text.index(start)
    end = text.find("\n\n", begin)
    return text[begin : end if end != -1 else len(text)]


def test_every_environment_variable_is_documented_where_it_is_read_and_in_the_readme() -> None:
    read = _read_in_settings()
    assert len(read) >= 9  # the parse found the readers
    documented = set(_ENV.findall(_paragraph(README, "Environment (read only in `localllm/settings.py`)")))
    table = set(_ENV.findall((settings.__doc__ or "").split("\n\n", 1)[1]))
    assert documented == read, "README's Environment paragraph"
    assert table == read, "settings.py's docstring table"


def _actions() -> dict[str, dict[str, argparse.Action]]:
    """``{"localllm serve": {"--port": action, …}, …}`` for every leaf command (positionals by dest)."""
    found: dict[str, dict[str, argparse.Action]] = {}

    def walk(words: str, parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs:
            for name, child in subs[0].choices.items():
                walk(f"{words} {name}", child)
            return
        found[words] = {
            (action.option_strings[-1] if action.option_strings else action.dest): action for action in parser._actions
        }
        for action in parser._actions:
            for flag in action.option_strings:
                found[words][flag] = action

    for name in app.COMMANDS:
        top = app.build_parser(name)
        [sub] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        walk(f"localllm {name}", sub.choices[name])
    return found


def _synopsis_block(marker: str) -> str:
    start = README.index(marker)
    return README[start:].split("```", 2)[1]


def test_choices_spelled_out_in_the_cli_reference_are_the_parsers() -> None:
    """``--role query|document``, ``completion bash|zsh|fish``: the alternatives are the choices."""
    block = _synopsis_block("<!-- norun: the synopsis of every command;")
    actions = _actions()
    checked = 0
    command = None
    for line in block.splitlines():
        if line.startswith("localllm "):  # else a continuation of the command above
            words = " ".join(line.split()[:3])
            command = next((c for c in sorted(actions, key=len, reverse=True) if words.startswith(c)), None)
        if command is None:
            continue
        for flag, alternatives in re.findall(r"(--[a-z-]+|\b[a-z]+) ((?:[a-z]+\|)+[a-z]+)\b", line):
            action = actions[command].get(flag) or next(
                (a for a in actions[command].values() if not a.option_strings and a.choices), None
            )
            assert action is not None and action.choices is not None, f"{command} {flag}"
            assert alternatives.split("|") == list(action.choices), f"{command} {flag}"
            checked += 1
    assert checked >= 3


def _same(documented: str, default: Any) -> bool:
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return float(documented) == float(default)
    return documented == str(default)


def test_defaults_the_serve_synopsis_states_are_the_parsers() -> None:
    """``[--port 8911]``, ``[--max-body 16MiB]``: a literal value in the synopsis is the default."""
    serve = _actions()["localllm serve"]
    stated = re.findall(r"\[(--[a-z-]+) ([^\]\s]+)\]", _synopsis_block("<!-- norun: the synopsis of `serve` -->"))
    literal = [(flag, value) for flag, value in stated if value[0].isdigit()]  # N, GiB, NAME are placeholders
    assert len(literal) >= 8
    wrong = [(flag, value, serve[flag].default) for flag, value in literal if not _same(value, serve[flag].default)]
    assert wrong == []


def test_defaults_stated_in_the_prose_are_the_parsers() -> None:
    actions = _actions()
    search = _paragraph(README, "* `localllm search`: globs")
    for flag, value in re.findall(r"`(--[a-z-]+) ([\d.]+)`", search.split("defaults", 1)[1]):
        assert _same(value, actions["localllm search"][flag].default), flag
    window, overlap = re.search(r"by (\d+)-byte windows with (\d+) overlap", search).groups()  # type: ignore[union-attr]
    assert (int(window), int(overlap)) == (
        actions["localllm search"]["--window"].default,
        actions["localllm search"]["--overlap"].default,
    )
    lines = re.search(r"`localllm logs gemma-3-270m`\s+prints the last (\d+) lines", README)
    assert lines is not None and int(lines.group(1)) == actions["localllm logs"]["--lines"].default


def test_every_flag_is_explained_not_only_listed() -> None:
    """``test_cli.py`` proves the synopsis names every flag; this, that each is explained too:
    in the prose, or in the synopsis's description column (``--unpin removes one of your pins``)."""
    start = README.index("<!-- norun: the synopsis of every command;")
    block = _synopsis_block("<!-- norun: the synopsis of every command;")
    described = []
    for line in block.splitlines():
        if line.startswith(" " * 40):  # a description continued in its column
            described.append(line.strip())
        else:  # the description after the column gap, if the line has one
            described += re.split(r"\S\s{3,}", line.strip(), maxsplit=1)[1:]
    end = README.index("```", README.index("```", start) + 3)
    explained = README[:start] + README[end:] + "\n".join(described)
    missing = set()
    for command, actions in _actions().items():
        for action in {id(a): a for a in actions.values()}.values():
            flags = [f for f in action.option_strings if f not in ("-h", "--help", "--json")]
            if flags and not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", explained) for f in flags):
                missing.add(f"{command} {'/'.join(flags)}")
    assert sorted(missing) == []


def test_the_block_counts_the_readme_states_are_the_blocks() -> None:
    """ "Today: 26 blocks, 13 run (2 unit, 11 e2e), 13 not run": counted, not remembered."""
    from tests.readme_blocks import blocks

    found = re.search(r"Today: (\d+) blocks, (\d+) run \((\d+) unit,\s+(\d+) e2e\), (\d+) not run", README)
    assert found is not None
    every = blocks()
    run = [b for b in every if b.runnable]
    counted = (len(every), len(run), sum(b.suite == "unit" for b in run), sum(b.suite == "e2e" for b in run))
    assert tuple(int(n) for n in found.groups()) == (*counted, len(every) - len(run))


def test_every_config_key_outside_the_table_is_in_the_reference_yaml() -> None:
    """The generated table covers the declarations; the keys read apart (top level, a gate's
    invoke/with/…, an intent's) must appear in the reference YAML as ``key:``."""
    from localllm.config.parse import GATE_KEYS, INTENT_KEYS, TOP_KEYS, WITH_KEYS

    section = README.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    yaml_block = section.split("```yaml", 1)[1].split("```", 1)[0]
    missing = [k for k in (*TOP_KEYS, *GATE_KEYS, *WITH_KEYS, *INTENT_KEYS) if not re.search(rf"\b{k}:", yaml_block)]
    assert missing == []
