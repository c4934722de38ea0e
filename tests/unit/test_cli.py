"""The CLI shell: lazy command table, --version, -c/--config, --cassette/--world, JSON failures, warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from localllm._version import __version__
from localllm.cli import UsageError, app, main
from localllm.errors import AgentError, ErrorKind, TraceCorrupted

SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}}, "required": ["verdict"]}

# What `localllm --help` must not import: every subsystem and every heavy dependency.
SUBSYSTEMS = (
    "localllm.managed",
    "localllm.agents",
    "localllm.embed",
    "localllm.trace",
    "localllm.plugins",
    "localllm.grammar",
    "localllm.runtime",
    "localllm.config",
    "localllm.schema",
)
HEAVY = ("httpx", "numpy", "jsonschema", "yaml", "psutil", "filelock", "tqdm")


def _modules_after(argv: list[str]) -> tuple[int, list[str], str]:
    code = (
        "import sys\n"
        "from localllm.cli import main\n"
        f"rc = main({argv!r})\n"
        "print(rc, file=sys.stderr)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return int(done.stderr.strip().splitlines()[-1]), done.stdout.split("\n"), done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []])
def test_help_and_version_import_no_subsystem(argv: list[str]) -> None:
    rc, modules, _ = _modules_after(argv)
    assert rc == (2 if not argv else 0)
    loaded = [m for m in modules if m.startswith(SUBSYSTEMS) or m.split(".")[0] in HEAVY]
    assert loaded == []
    # only the table's own modules of localllm.cli are imported
    assert sorted(m for m in modules if m.startswith("localllm.cli.")) == ["localllm.cli.app", "localllm.cli.output"]


def test_a_command_imports_only_its_own_module() -> None:
    rc, modules, _ = _modules_after(["trace", "--help"])
    assert rc == 0
    assert "localllm.cli.trace" in modules
    assert not [
        m for m in modules if m.startswith(("localllm.cli.embed", "localllm.cli.artifacts", "localllm.managed"))
    ]


def test_every_table_entry_names_a_module_that_sets_it_up() -> None:
    import importlib

    for name, info in app.COMMANDS.items():
        setup = importlib.import_module(info.module).SETUP
        assert name in setup, f"{info.module} does not set up {name}"
    # every command a module sets up is in the table
    modules = {info.module for info in app.COMMANDS.values()}
    declared = {name for module in modules for name in importlib.import_module(module).SETUP}
    assert declared == set(app.COMMANDS)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"localllm {__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "localllm", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"localllm {__version__}")


def test_library_never_imports_the_cli() -> None:
    import ast

    root = Path(app.__file__).resolve().parents[1]
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] == "cli" or rel.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{rel}: {n}" for n in names if n == "localllm.cli" or n.startswith("localllm.cli.")]
    assert offenders == []


# --------------------------------------------------------------------------- configs


def _app(tmp_path: Path) -> Path:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "verdict.json").write_text(json.dumps(SCHEMA))
    cfg = tmp_path / "app.yaml"
    cfg.write_text(
        "app_id: my-app\n"
        "agent_plugins:\n"
        "  agent.local: {plugin: builtin.inprocess}\n"
        "gates:\n"
        "  judge:\n"
        "    invoke: host.agent.decide\n"
        "    agent: agent.local\n"
        "    with:\n"
        "      prompt: 'Judge {{ args.item }} for {{ world.user }}'\n"
        "      schema: schemas/verdict.json\n"
    )
    return cfg


def _cassette(tmp_path: Path, answer: str = '{"verdict": "yes"}') -> Path:
    cassette = tmp_path / "c.yaml"
    cassette.write_text(
        "kind: host_cassette\nepisodes:\n  - id: ep-01\n    match: {handler: agent.local}\n"
        f"    replay: any\n    agent: {{verb: decide, response: '{answer}'}}\n"
    )
    return cassette


def _prompt_file(trace: Path) -> str:
    from localllm.trace import read_trace

    start = read_trace(trace).events[0]
    assert start.kind == "agent.call.start"
    prompt_file = start.payload.get("prompt_file")
    return (trace.parent / prompt_file).read_text() if prompt_file else str(start.payload.get("prompt"))


@pytest.mark.parametrize(
    "argv",
    [["check", "{cfg}"], ["check", "-c", "{cfg}"], ["check", "--config", "{cfg}"], ["check", "{cfg}", "-c", "{cfg}"]],
)
def test_check_takes_the_config_positionally_or_as_an_option(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _app(tmp_path)
    assert main([a.format(cfg=cfg) for a in argv] + ["--json"]) == 0
    judge = json.loads(capsys.readouterr().out)["gates"]["judge"]
    assert (judge["verb"], judge["agent"]) == ("decide", "agent.local")


def test_check_needs_exactly_one_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _app(tmp_path)
    other = tmp_path / "other.yaml"
    assert main(["check", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "usage_error"
    assert main(["check", str(cfg), "-c", str(other), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "usage_error"


@pytest.mark.parametrize(
    "command",
    [
        ["call", "ask", "--agent", "agent.local", "--prompt", "x"],
        ["run", "judge"],
        ["embed", "--embedder", "e", "x"],
        ["search", "q", "--embedder", "e", "--corpus", "*"],
        ["route", "hi"],
    ],
)
def test_every_config_command_takes_dash_c(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.yaml"
    # -c is accepted (the config error proves it was parsed and read), and the failure is JSON
    assert main([*command, "-c", str(missing), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["kind"]) == (False, "config_error")
    assert doc["problems"] and doc["problems"][0]["file"] == str(missing)


def test_run_replays_a_cassette_and_passes_world_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, cassette, trace = _app(tmp_path), _cassette(tmp_path), tmp_path / "t.jsonl"
    code = main(
        [
            "run",
            "judge",
            "-c",
            str(cfg),
            "--cassette",
            str(cassette),
            "--arg",
            "item=the box",
            "--world",
            "user=ada",
            "--trace",
            str(trace),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["submission"] == {"verdict": "yes"} and doc["agent"] == "agent.local"
    assert _prompt_file(trace) == "Judge the box for ada"


def test_call_passes_world_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, cassette, trace = _app(tmp_path), _cassette(tmp_path), tmp_path / "t.jsonl"
    assert (
        main(
            [
                "call",
                "decide",
                "-c",
                str(cfg),
                "--agent",
                "agent.local",
                "--prompt",
                "hello {{ world.user }}",
                "--world",
                "user=bob",
                "--world",
                "user=eve",
                "--cassette",
                str(cassette),
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"verdict": "yes"}
    assert _prompt_file(trace) == "hello eve"  # the last value of a repeated key wins


def test_bad_world_pair_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "judge", "-c", str(_app(tmp_path)), "--world", "novalue"]) == 2
    assert "--world 'novalue' is not K=V" in capsys.readouterr().err


# --------------------------------------------------------------------------- failures


def test_agent_failure_with_json_is_a_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _app(tmp_path)
    cassette = _cassette(tmp_path, answer='{"verdict": "maybe"}')
    code = main(
        ["run", "judge", "-c", str(cfg), "--cassette", str(cassette), "--arg", "item=a", "--world", "user=b", "--json"]
    )
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 1
    assert set(doc) == {"ok", "kind", "detail", "hint"}
    assert (doc["ok"], doc["kind"]) == (False, "schema_invalid")
    assert captured.err == ""


def test_agent_failure_without_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cassette = _cassette(tmp_path, answer='{"verdict": "maybe"}')
    assert (
        main(
            [
                "run",
                "judge",
                "-c",
                str(_app(tmp_path)),
                "--cassette",
                str(cassette),
                "--arg",
                "item=a",
                "--world",
                "user=b",
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("localllm: error: agent: schema_invalid: ")
    assert "Traceback" not in captured.err


def test_usage_errors_exit_2_and_are_json_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fetch", "model", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["kind"]) == (False, "usage_error")
    assert main(["fetch", "model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: localllm fetch model")
    assert "localllm: error: the following arguments are required: ID" in err


def test_an_unknown_option_points_at_its_own_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse reports it on the top-level parser: the hint was `localllm --help`
    assert main(["cache", "verify", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: localllm cache verify ")
    assert "hint: see `localllm cache verify --help`" in err
    assert main(["--bogus"]) == 2
    assert "hint: see `localllm --help`" in capsys.readouterr().err


def test_fetch_model_without_an_id_downloads_nothing(tmp_path: Path) -> None:
    # (it used to fetch the default chat model, ~1 GB)
    assert main(["fetch", "model"]) == 2
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (AgentError(ErrorKind.TRANSPORT_ERROR, "down"), "transport_error", 1),
        (TraceCorrupted("trace corrupted: bad line"), "trace_corrupted", 1),
        (UsageError("no"), "usage_error", 2),
        (KeyError("surprise"), "internal_error", 1),
    ],
)
def test_error_kinds_and_exit_codes(
    exc: Exception, kind: str, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(_args: Any) -> int:
        raise exc

    monkeypatch.setattr("localllm.cli.trace._verify", boom)
    assert main(["trace", "verify", "x", "--json"]) == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == kind and doc["ok"] is False
    assert main(["trace", "verify", "x"]) == code
    err = capsys.readouterr().err
    assert err.startswith("localllm: error: ") and "Traceback" not in err
    if kind == "internal_error":
        assert "KeyError" in err and "LOCALLLM_DEBUG=1" in err


def _patched_trace_setup(handler: Any) -> Any:
    def setup(parser: Any) -> None:
        parser.add_argument("sub")
        parser.add_argument("file")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(handler=handler)

    return setup


def test_warnings_become_one_line_messages(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class UnknownThing(UserWarning):
        pass

    def warns(_args: Any) -> int:
        warnings.warn("model 'x' is not in the registry;\n  no prefix is sent", UnknownThing, stacklevel=1)
        return 0

    import localllm.cli.trace as trace_cli

    monkeypatch.setitem(trace_cli.SETUP, "trace", _patched_trace_setup(warns))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["trace", "verify", "x"]) == 0
    err = capsys.readouterr().err
    assert err == "localllm: warning: model 'x' is not in the registry; no prefix is sent\n"
    assert warnings.showwarning is not app._show_warning  # restored after main


def test_warnings_in_a_real_process_are_one_line(tmp_path: Path) -> None:
    # A real subprocess, the filters Python starts with: the hook decides what the user sees.
    code = (
        "import warnings, localllm.cli.trace as t\n"
        "def warns(args):\n"
        "    warnings.warn('careful', RuntimeWarning)\n"
        "    return 0\n"
        "def setup(p):\n"
        "    p.add_argument('rest', nargs='*'); p.set_defaults(handler=warns)\n"
        "t.SETUP['trace'] = setup\n"
        "from localllm.cli import main\n"
        "raise SystemExit(main(['trace', 'x']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "localllm: warning: careful\n")


# --------------------------------------------------------------------------- README


def _parsers() -> list[tuple[str, Any]]:
    """(command words, parser) for every command and subcommand."""
    import argparse

    found: list[tuple[str, Any]] = []

    def walk(words: str, parser: argparse.ArgumentParser) -> None:
        found.append((words, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(f"{words} {name}", child)

    for name in app.COMMANDS:
        top = app.build_parser(name)
        [sub] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        walk(f"localllm {name}", sub.choices[name])
    return found


def _cli_reference() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## CLI reference", 1)[1]
    return section.split("\n## ", 1)[0]


def _synopses() -> dict[str, str]:
    """Each synopsis of the README's CLI block (a ``localllm …`` line and its indented continuations)."""
    block = _cli_reference().split("```", 2)[1]
    entries: list[str] = []
    for line in block.splitlines():
        if line.startswith("localllm "):
            entries.append(line)
        elif line.startswith(" ") and entries:
            entries[-1] += " " + line.strip()
    return {" ".join(e.split()[:3]): e for e in entries}


def test_readme_cli_reference_lists_every_command_and_flag() -> None:
    import re

    synopses = list(_synopses().values())
    missing = []
    for words, parser in _parsers():
        if any(a.__class__.__name__ == "_SubParsersAction" for a in parser._actions):
            continue  # a noun: its subcommands are checked
        mine = [s for s in synopses if re.match(rf"{re.escape(words)}(?![\w-])", s)]
        if not mine:
            missing.append(words)
            continue
        for action in parser._actions:
            flags = [f for f in action.option_strings if f not in ("-h", "--help")]
            # one spelling of each option is enough (-c for -c/--config; the prose names both)
            if flags and not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", s) for f in flags for s in mine):
                missing.append(f"{words} {'/'.join(flags)}")
    assert missing == []
    assert "`-c/--config FILE`" in _cli_reference()
    assert "--version" in synopses[0] and "--help" in synopses[0]


def test_text_the_terminal_cannot_encode_is_escaped_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a directory name that is not UTF-8 decodes to a lone surrogate and reaches the output
    plugin = Path(os.fsdecode(bytes(tmp_path) + b"/p\xe9"))
    plugin.mkdir()
    (plugin / "plugin.json").write_text(
        '{"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": "p", '
        '"version": "1.0.0", "description": "d"}'
    )
    code = main(["plugins", "check", str(plugin), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc.get("kind") != "internal_error"
    assert code == (0 if doc["ok"] else 1)
    assert doc["root"].endswith("p\udce9")  # the same text, escaped on the way out
    assert main(["plugins", "check", str(plugin)]) == code
    assert "p\\udce9" in capsys.readouterr().out


def test_output_helpers_escape_what_the_stream_cannot_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from localllm.cli.output import emit_json, out

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", write_through=True))
    out("caf\xe9 \ud800")
    emit_json({"k": "caf\xe9 \ud800"})
    text = raw.getvalue().decode("ascii")
    line, document = text.split("\n", 1)
    assert line == "caf\\xe9 \\ud800"
    assert json.loads(document) == {"k": "caf\xe9 \ud800"}


def test_json_output_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    """A plugin's meta ``{"x": NaN}`` printed NaN/Infinity: not JSON. Now null, as in the trace."""
    from localllm.cli.output import emit_json

    emit_json({"meta": {"x": float("nan"), "y": [float("inf"), (float("-inf"), 1.5)]}, "ok": True})

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert doc == {"meta": {"x": None, "y": [None, [None, 1.5]]}, "ok": True}


@pytest.mark.slow
def test_generated_command_lines_never_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any argv built from the real commands and flags: exit 0/1/2, one message, never an internal error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # fetch/cache verify must not open a socket
    monkeypatch.chdir(tmp_path)
    # `serve` with valid flags runs until signalled: its own tests start and stop it
    commands = [
        (words.split()[1:], parser)
        for words, parser in _parsers()
        if not any(a.__class__.__name__ == "_SubParsersAction" for a in parser._actions)
        and words.split()[1:] != ["serve"]
    ]
    flags = sorted({f for _, p in commands for a in p._actions for f in a.option_strings if f not in ("-h", "--help")})
    values = st.one_of(
        st.sampled_from(flags),
        st.sampled_from(["1", "-1", "0.5", "k=v", "=", "", ".", "x.json", "ask", "decide"]),
        st.text(max_size=12),
    )

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.sampled_from([words for words, _ in commands]), st.lists(values, max_size=6), st.booleans())
    def check(words: list[str], rest: list[str], as_json: bool) -> None:
        import contextlib
        import io

        stdout, stderr = io.StringIO(), io.StringIO()
        argv = [*words, *rest, *(["--json"] if as_json else [])]
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
        assert code in (0, 1, 2), argv
        assert "Traceback" not in stderr.getvalue()
        assert "internal_error" not in stdout.getvalue() and "a bug in localllm" not in stderr.getvalue(), (
            argv,
            stdout.getvalue(),
            stderr.getvalue(),
        )
        if as_json and code and stdout.getvalue().lstrip().startswith("{"):
            doc = json.loads(stdout.getvalue())
            if doc.get("ok") is False and "kind" in doc:
                assert {"detail", "hint"} <= set(doc)

    check()


@pytest.mark.parametrize("argv", [["version"], ["version", "--json"], ["help"], ["--help"]])
def test_output_that_cannot_be_written_is_one_line_on_stderr(argv: list[str]) -> None:
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        done = subprocess.run(
            [sys.executable, "-m", "localllm", *argv], stdout=full, stderr=subprocess.PIPE, text=True, check=False
        )
    # before: a double traceback (--json: the error's JSON went to the same stdout), or
    # "OSError … this is a bug in localllm"; help: exit 0, argparse swallowing the error
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "cannot write to stdout" in done.stderr, done.stderr
