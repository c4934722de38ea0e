"""Every hint that names a localllm command or flag names one that exists (issue 22: five
hints sent users to flags and files that do not exist), and the hints corrected there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from localllm.cli.everyday import command_tree

PACKAGE = Path(__file__).resolve().parents[2] / "localllm"
#: a command in backticks, or written bare where a hint tells the user to run it
_COMMAND = re.compile(r"`localllm ([^`]+)`|(?:^|with:? |run |; |: )localllm ([a-z][^;,()`]*)")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
#: flags of other programs that hints may name (llama-server, pip, cmake)
FOREIGN_FLAGS = {
    "--chat-template",
    "--chat-template-file",
    "--jinja",
    "--no-jinja",
    "--api-key",
    "--embeddings",
    "--pooling",
    "--port",
    "--no-deps",
    "--no-binary",
    "--only-binary",
    "--parallel",
    "--ctx-size",
    "--threads",
    "--install",  # xcode-select --install
}


def _text(node: ast.AST) -> str | None:
    """A string literal or an f-string (placeholders as ``{}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.IfExp):
        return " | ".join(t for t in (_text(node.body), _text(node.orelse)) if t)
    return None


def hints() -> list[tuple[str, str]]:
    """(file:line, text) of every ``hint=`` argument and ``*_HINT`` constant in the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                values += [kw.value for kw in node.keywords if kw.arg == "hint"]
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("add", "_fail", "problem") and len(node.args) == 3:  # (key|file, message, hint)
                    values.append(node.args[2])
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.endswith("HINT") for t in node.targets
            ):
                values.append(node.value)
            for value in values:
                text = _text(value)
                if text:
                    found.append((f"{path.relative_to(PACKAGE.parent)}:{getattr(value, 'lineno', 0)}", text))
    return found


def test_the_scan_finds_the_hints() -> None:
    assert len(hints()) > 80


def test_every_command_a_hint_names_exists() -> None:
    tree = command_tree()
    every_flag = {o for n in tree.values() for o in n["options"]} | {
        o for n in tree.values() for opts in n["subcommands"].values() for o in opts
    }
    wrong = []
    for where, text in hints():
        for match in _COMMAND.finditer(text):
            words = (match.group(1) or match.group(2)).split()
            command = words[0]
            if command.startswith("{") or command.startswith("-"):
                continue
            if command not in tree:
                wrong.append(f"{where}: `localllm {' '.join(words)}`: no command {command!r}")
                continue
            node = tree[command]
            options = set(node["options"])
            if node["subcommands"] and len(words) > 1 and not words[1].startswith(("-", "{")):
                if words[1] not in node["subcommands"]:
                    wrong.append(f"{where}: `localllm {' '.join(words)}`: no {command} {words[1]!r}")
                    continue
                options = set(node["subcommands"][words[1]])
            for flag in (w.split("=")[0] for w in words if w.startswith("--")):
                if flag not in options:
                    wrong.append(f"{where}: `localllm {' '.join(words)}`: {command} has no {flag}")
        for flag in _FLAG.findall(text):
            if flag not in every_flag and flag not in FOREIGN_FLAGS:
                wrong.append(f"{where}: {flag} is no localllm flag")
    assert wrong == []


# -- the hints issue 22 found wrong ----------------------------------------------------------


def test_a_non_utf8_config_says_to_save_it_as_utf8(tmp_path: Path) -> None:
    from localllm import load_config
    from localllm.errors import ConfigError

    bad = tmp_path / "app.yaml"
    bad.write_bytes("app_id: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    [problem] = info.value.problems
    assert "UTF-8" in problem.hint and "path" not in problem.hint


def test_a_schema_outside_the_grammar_is_not_sent_to_json_schema(tmp_path: Path) -> None:
    import json

    from localllm import load_config
    from localllm.errors import ConfigError

    (tmp_path / "s.json").write_text(
        json.dumps({"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}})
    )
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, model: gemma-3-270m}\n"
        "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with: {prompt: hi, schema: s.json}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "app.yaml")
    hints_given = [p.hint for p in info.value.problems]
    assert hints_given and not any("set json_schema: true" in h for h in hints_given)


def test_an_unpinned_model_points_at_the_user_pins_file() -> None:
    from localllm.errors import PinNotConfigured
    from localllm.managed.pins import load_pins, user_pins_path

    with pytest.raises(PinNotConfigured) as info:
        load_pins().models["bge-small-en-v1.5"].artifact.require_sha256()
    assert str(user_pins_path()) in info.value.hint and "_data" not in info.value.hint
    assert "localllm fetch model --url" in info.value.hint


@pytest.mark.parametrize("url", ["http://example.com/m.gguf", "file:///tmp/m.gguf"])
def test_a_user_pin_with_a_non_https_url_names_the_flag_not_a_missing_file(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from localllm.cli import main
    from localllm.managed.pins import user_pins_path

    code = main(["fetch", "model", "--url", url, "--sha256", "a" * 64, "--id", "m", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and "--url" in doc["detail"] and str(user_pins_path()) not in doc["detail"]
    assert not user_pins_path().exists()
    if url.startswith("file"):
        assert "--mirror DIR" in doc["hint"]


def test_a_missing_schema_file_has_a_hint(tmp_path: Path) -> None:
    from localllm.errors import SchemaError
    from localllm.schema import read_schema_file

    with pytest.raises(SchemaError) as info:
        read_schema_file(tmp_path / "nope.json")
    assert info.value.hint


def test_connection_refused_on_an_endpoint_says_nothing_listens(tmp_path: Path) -> None:
    import socket

    from localllm import Runtime, load_config
    from localllm.errors import AgentError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:{port}', model: m, fallback: none}}\n"
    )
    with Runtime(load_config(tmp_path / "app.yaml")) as runtime, pytest.raises(AgentError) as info:
        runtime.call("ask", agent="agent.local", prompt="hi", timeout=10)
    assert info.value.kind.value == "transport_error"
    assert f"127.0.0.1:{port}" in info.value.hint and "agent_plugins.agent.local.endpoint" in info.value.hint


def test_trace_locked_names_no_flag_that_does_not_exist(tmp_path: Path) -> None:
    from localllm.errors import TraceLocked
    from localllm.trace import TraceWriter

    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path), pytest.raises(TraceLocked) as info:
        TraceWriter.open(path)
    assert "--trace-wait" not in info.value.hint and info.value.path == str(path)
