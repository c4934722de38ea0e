"""The everyday CLI a user of Ollama, `llm` or huggingface_hub reaches for (issue 22)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm._version import __version__
from localllm.cli import main
from localllm.cli.app import COMMANDS
from localllm.cli.everyday import command_tree, completion_script

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


# -- config discovery -------------------------------------------------------------------


def test_a_config_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(QUICKSTART, tmp_path / "app")
    monkeypatch.chdir(tmp_path / "app")
    assert main(["check", "--json"]) == 0
    assert _json(capsys)["app_id"] == "quickstart"


def test_localllm_config_names_it_when_the_directory_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(QUICKSTART, tmp_path / "app")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCALLLM_CONFIG", str(tmp_path / "app" / "localllm.yaml"))
    assert main(["check", "--json"]) == 0
    assert _json(capsys)["app_id"] == "quickstart"
    # ./localllm.yaml wins over the variable
    (tmp_path / "localllm.yaml").write_text("app_id: here\n")
    assert main(["check", "--json"]) == 0
    assert _json(capsys)["app_id"] == "here"


def test_no_config_anywhere_is_a_usage_error_naming_every_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "triage", "--json"]) == 2
    doc = _json(capsys)
    assert doc["kind"] == "usage_error"
    assert "-c FILE" in doc["hint"] and "localllm.yaml" in doc["hint"] and "LOCALLLM_CONFIG" in doc["hint"]


# -- did you mean, help, version, the missing command --------------------------------------


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["pull", "gemma-3-270m"], "localllm fetch model gemma-3-270m"),
        (["list"], "localllm models"),
        (["ls"], "localllm models"),
        (["rm", "gemma-3-270m"], "localllm cache rm gemma-3-270m"),
        (["chek", "app.yaml"], "localllm check app.yaml"),
        # a noun before a command (`docker service ls` style): the command itself
        (["service", "stop"], "localllm stop"),
        (["server", "logs", "gemma-3-270m"], "localllm logs gemma-3-270m"),
    ],
)
def test_other_tools_verbs_name_the_localllm_command(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--json"]) == 2
    doc = _json(capsys)
    assert doc["kind"] == "usage_error" and f"`{meant}`" in doc["hint"]


def test_no_command_says_one_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "check" in err and "a command is required" in err


def test_version_and_help_are_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version", "--json"]) == 0
    assert _json(capsys)["version"] == __version__
    assert main(["help", "--json"]) == 0
    assert set(_json(capsys)) == set(COMMANDS)
    assert main(["help", "fetch"]) == 0
    assert "server" in capsys.readouterr().out
    assert main(["help", "pull", "--json"]) == 2
    assert "fetch model" in _json(capsys)["hint"]


# -- --json everywhere, completion ------------------------------------------------------------


def test_every_command_takes_json() -> None:
    missing = []
    for name, node in command_tree().items():
        leaves = node["subcommands"] or {"": node["options"]}
        for sub, options in leaves.items():
            if "--json" not in options:
                missing.append(f"{name} {sub}".strip())
    assert missing == []


def _complete(script: str, words: list[str]) -> list[str]:
    line = " ".join(words)
    probe = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _localllm; printf "%s\\n" "${{COMPREPLY[@]}}"'
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout.split()


def test_bash_completion_completes_commands_subcommands_and_flags() -> None:
    script = completion_script("bash", command_tree())
    assert _complete(script, ["localllm", "fe"]) == ["fetch"]
    assert _complete(script, ["localllm", "fetch", "m"]) == ["model"]
    assert "--json" in _complete(script, ["localllm", "fetch", "model", "--j"])
    assert _complete(script, ["localllm", "cache", "p"]) == ["prune"]
    assert "--detach" in _complete(script, ["localllm", "serve", "--d"])


def test_zsh_and_fish_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert zsh.startswith("autoload -U +X bashcompinit") and "complete -o default" in zsh
    assert main(["completion", "fish"]) == 0
    fish = capsys.readouterr().out
    assert "complete -c localllm -f -n __fish_use_subcommand -a 'check call run fetch" in fish
    assert "complete -c localllm -n '__fish_seen_subcommand_from fetch' -l from-source" in fish
    if shutil.which("fish"):
        subprocess.run(["fish", "--no-execute", "-c", fish], check=True, timeout=30)


# -- logs --------------------------------------------------------------------------------------


def test_logs_prints_a_models_kept_log_and_lists_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "cache" / "logs"
    logs.mkdir(parents=True)
    (logs / "gemma-3-270m.log").write_text("".join(f"line {i}\n" for i in range(10)))
    assert main(["logs", "gemma-3-270m", "-n", "2", "--json"]) == 0
    doc = _json(capsys)
    assert doc["lines"] == ["line 8", "line 9"] and doc["models"] == ["gemma-3-270m"]
    assert main(["logs", "qwen2.5-1.5b-instruct", "--json"]) == 2
    assert "gemma-3-270m" in _json(capsys)["hint"]


def test_a_managed_server_keeps_its_stderr_bounded(tmp_path: Path, server_bin: Path) -> None:
    from localllm.managed import server as server_mod

    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF fake")
    with server_mod.ManagedServer(server_bin, model, health_timeout=30.0) as sc:
        sc.ensure_ready()
    kept = tmp_path / "cache" / "logs" / "tiny.log"
    text = kept.read_text()
    assert text.startswith("== ") and "llama-server" in text and len(text.splitlines()) > 1
    log = server_mod._KeptLog(kept, "again")
    for _ in range(3):
        log.write("x" * (server_mod.LOG_LIMIT // 2))
    assert kept.stat().st_size <= server_mod.LOG_LIMIT + 1 and kept.with_name("tiny.log.1").is_file()


# -- serve --detach from any directory ---------------------------------------------------------


def test_a_detached_child_never_imports_the_callers_directory(tmp_path: Path) -> None:
    from localllm.service.control import child_command, child_pythonpath

    decoy = tmp_path / "parent-of-a-clone"
    (decoy / "localllm").mkdir(parents=True)
    (decoy / "localllm" / "__init__.py").write_text('raise SystemExit("the caller\'s localllm/ was imported")\n')
    env = {**os.environ, **child_pythonpath()}
    naive = subprocess.run(
        [sys.executable, "-m", "localllm", "--version"], cwd=decoy, env=env, capture_output=True, text=True, check=False
    )
    assert naive.returncode != 0  # what `python -m localllm` did: the decoy wins
    child = subprocess.run(
        child_command(["--version"]), cwd=decoy, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (child.returncode, child.stdout.strip()) == (0, f"localllm {__version__}")


def test_serve_detach_from_a_directory_holding_a_localllm_dir(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import pid_gone

    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    decoy = tmp_path / "parent-of-a-clone"
    (decoy / "localllm").mkdir(parents=True)
    (decoy / "localllm" / "__init__.py").write_text('raise SystemExit("the caller\'s localllm/ was imported")\n')
    monkeypatch.chdir(decoy)
    assert main(["serve", "--detach", "--port", "0", "--json"]) == 0
    doc = _json(capsys)
    assert doc["url"].startswith("http://127.0.0.1:") and Path(doc["log"]).name == "service.log"
    assert main(["stop", "--all", "--json"]) == 0
    assert _json(capsys)["what"] == "service"
    assert pid_gone(doc["pid"], within=5.0)
    os.waitpid(doc["pid"], 0)


# -- cache prune clears build leftovers --------------------------------------------------------


def test_prune_clears_the_source_builds_leftovers_once_it_is_installed(capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.managed import platforms
    from localllm.managed.cache import cache_layout, write_marker
    from localllm.managed.pins import load_pins

    layout, source = cache_layout(), load_pins().source
    tree = layout.source_tree(source)
    (tree / "cmake-build").mkdir(parents=True)
    (tree / "cmake-build" / "big.o").write_bytes(b"x" * 4096)
    sdist = layout.sdist_path(source)
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"sdist")
    assert main(["cache", "prune", "--json"]) == 0
    assert _json(capsys)["removed"] == []  # not installed yet: the tree is the build in progress
    release = layout.source_release_dir(source.version, platforms.current().slug)
    release.mkdir(parents=True)
    (release / "llama-server").write_text("#!/bin/sh\n")
    write_marker(release, {"kind": "source"})
    assert main(["cache", "list", "--json"]) == 0
    statuses = {e["kind"]: e["status"] for e in _json(capsys)["entries"] if e["kind"] in ("build", "sdist")}
    assert statuses == {"build": "leftover", "sdist": "leftover"}
    assert main(["cache", "prune", "--json"]) == 0
    removed = {e["kind"] for e in _json(capsys)["removed"]}
    assert removed == {"build", "sdist"} and not tree.exists() and not sdist.exists()
    assert (release / "llama-server").is_file()  # the installed server stays


# -- exit ---------------------------------------------------------------------------------

EXIT_PROBE = """
import atexit, gc, sys
from pathlib import Path
out = Path(sys.argv[1])
before = gc.get_freeze_count()  # 3.12.1 starts with objects of its own there (375)
def at_exit():  # registered before main: runs after main's own exit hook
    out.write_text(f"{gc.get_freeze_count() - before}")
atexit.register(at_exit)
sys.argv = ["localllm", *sys.argv[2:]]
from localllm.cli import main
code = main() if sys.argv[1:] != ["in-process"] else main(["version"])
sys.exit(code)
"""


@pytest.mark.parametrize(("argv", "frozen"), [(["version"], True), (["in-process"], False)])
def test_the_program_freezes_its_objects_at_exit(tmp_path: Path, argv: list[str], frozen: bool) -> None:
    """Run as the program, the exit skips the final walk over every object (gc.freeze in an
    atexit hook); earlier atexit handlers and the stdout flush still run. ``main(argv)``
    called by someone else's code leaves that interpreter's exit alone."""
    out = tmp_path / "count"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, str(out), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"localllm {__version__}"
    assert (int(out.read_text()) > 0) is frozen
