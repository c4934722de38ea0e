"""One exit-code rule for every command, proven on each kind of bad input (``cli/output.py``).

2: the command was given something it cannot use — a flag or value, a named path that does
not exist, cannot be read or is the wrong kind of node, a config/schema/cases/cassette/prompt
file that fails its checks. 1: the command ran and failed, or its verdict is no — including
a malformed trace or plugin, the data the command examines. Each row runs the real entry
point (``localllm.cli.main``) in a workspace with one good file of every kind, swaps one
input for a bad one, and asserts the code, that the message names the input, and that no
traceback is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localllm import cli

SCHEMA = {"type": "object", "properties": {"q": {"enum": ["a", "b"]}}, "required": ["q"]}
CONFIG = (
    "app_id: t\n"
    "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n"
    "embedders:\n  docs: {model: all-minilm-l6-v2}\n"
    "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.stub\n    with: {prompt: p.md, schema: s.json}\n"
)
CASSETTE = (
    "kind: host_cassette\nepisodes:\n  - id: e\n    match: {}\n    replay: any\n"
    '    agent:\n      verb: decide\n      response: \'{"q": "a"}\'\n'
)

#: bad inputs by kind; ``dir/`` is a directory, ``file.txt`` a regular file
BAD = {
    "missing.json": None,
    "missing.yaml": None,
    "missing.jsonl": None,
    "missing.md": None,
    "badjson.json": "{not json",
    "list.json": "[1, 2]",
    # json.loads reads both; no other reader does: a `maximum: NaN` bounded nothing, and the
    # lone surrogate's grammar failed the request's encoding ("cannot start llama-server")
    "nan.json": '{"type": "number", "maximum": NaN}',
    "surrogate.json": '{"enum": ["a\\ud800b", "c"]}',
    "badschema.json": json.dumps({"type": "object", "properties": [1]}),
    "bad.yaml": "agent_plugins: [\n",
    "badplugin.yaml": "agent_plugins:\n  agent.x: {plugin: builtin.nope}\n",
    "badtrace.jsonl": "{nope\n",
    "badcases.jsonl": "{nope\n",
    "file.txt": "just text\n",
}
BINARY = b"\xff\xfe\x00 not UTF-8"

CALL = ["call", "decide", "-c", "c.yaml", "--agent", "agent.stub", "--cassette", "cass.yaml"]
RUN = ["run", "g", "-c", "c.yaml", "--arg", "x=1", "--cassette", "cass.yaml"]
EVAL = ["eval", "g", "-c", "c.yaml", "--cases", "cases.jsonl", "--cassette", "agent.stub=cass.yaml"]
CONFIG_COMMANDS = {
    "check": ["check"],
    "call": ["call", "decide", "--agent", "agent.stub", "--prompt", "x"],
    "run": ["run", "g"],
    "embed": ["embed", "hi", "--embedder", "docs"],
    "search": ["search", "q", "--embedder", "docs", "--corpus", "p.md"],
    "route": ["route", "hi"],
    "eval": ["eval", "g"],
    "trace cases": ["trace", "cases", "t.jsonl", "--gate", "g"],
    "trace cassette": ["trace", "cassette", "t.jsonl"],
    "serve": ["serve", "--port", "0"],
}

# (id, argv, exit code, what the message must name, where: "err" or "out" for a verdict on stdout)
Row = tuple[str, list[str], int, str, str]
ROWS: list[Row] = []
for name, base in CONFIG_COMMANDS.items():
    ROWS += [
        (f"{name} -c missing", [*base, "-c", "missing.yaml"], 2, "missing.yaml", "err"),
        (f"{name} -c directory", [*base, "-c", "dir"], 2, "dir", "err"),
        (f"{name} -c bad YAML", [*base, "-c", "bad.yaml"], 2, "bad.yaml", "err"),
        (f"{name} -c bad content", [*base, "-c", "badplugin.yaml"], 2, "badplugin.yaml", "err"),
    ]
ROWS += [
    ("check CONFIG missing", ["check", "missing.yaml"], 2, "missing.yaml", "err"),
    ("check CONFIG not UTF-8", ["check", "binary.bin"], 2, "binary.bin", "err"),
    ("call --prompt-file not UTF-8", [*CALL, "--prompt-file", "binary.bin"], 2, "binary.bin", "err"),
    ("grammar check not UTF-8", ["grammar", "check", "binary.bin"], 2, "binary.bin", "err"),
    ("eval --cases not UTF-8", [*EVAL[:4], "--cases", "binary.bin"], 2, "binary.bin", "err"),
    ("call --prompt-file missing", [*CALL, "--prompt-file", "missing.md"], 2, "missing.md", "err"),
    ("call --prompt-file directory", [*CALL, "--prompt-file", "dir"], 2, "dir", "err"),
    ("call --schema missing", [*CALL, "--prompt", "x", "--schema", "missing.json"], 2, "missing.json", "err"),
    ("call --schema directory", [*CALL, "--prompt", "x", "--schema", "dir"], 2, "dir", "err"),
    ("call --schema bad JSON", [*CALL, "--prompt", "x", "--schema", "badjson.json"], 2, "badjson.json", "err"),
    ("call --schema not an object", [*CALL, "--prompt", "x", "--schema", "list.json"], 2, "list.json", "err"),
    ("call --schema invalid", [*CALL, "--prompt", "x", "--schema", "badschema.json"], 2, "badschema.json", "err"),
    ("call --cassette missing", [*CALL[:-2], "--prompt", "x", "--cassette", "missing.yaml"], 2, "missing.yaml", "err"),
    ("call --cassette directory", [*CALL[:-2], "--prompt", "x", "--cassette", "dir"], 2, "dir", "err"),
    ("call --cassette bad YAML", [*CALL[:-2], "--prompt", "x", "--cassette", "bad.yaml"], 2, "bad.yaml", "err"),
    ("run --cassette missing", [*RUN[:-2], "--cassette", "missing.yaml"], 2, "missing.yaml", "err"),
    ("call --trace directory", [*CALL, "--prompt", "x", "--trace", "dir"], 2, "dir", "err"),
    ("call --trace under a file", [*CALL, "--prompt", "x", "--trace", "file.txt/t.jsonl"], 2, "file.txt", "err"),
    ("run --trace directory", [*RUN, "--trace", "dir"], 2, "dir", "err"),
    ("route --trace directory", ["route", "hi", "-c", "c.yaml", "--trace", "dir"], 2, "dir", "err"),
    ("call --trace not a trace", [*CALL, "--prompt", "x", "--trace", "badtrace.jsonl"], 1, "badtrace.jsonl", "err"),
    ("call --timeout not a number", [*CALL, "--prompt", "x", "--timeout", "abc"], 2, "abc", "err"),
    ("call --timeout out of range", [*CALL, "--prompt", "x", "--timeout", "-1"], 2, "-1", "err"),
    ("call --arg not K=V", [*CALL, "--prompt", "x", "--arg", "zz"], 2, "zz", "err"),
    (
        "search --corpus missing",
        ["search", "q", "-c", "c.yaml", "--embedder", "docs", "--corpus", "missing.d"],
        2,
        "missing.d",
        "err",
    ),
    ("run GATE undeclared", ["run", "nope", "-c", "c.yaml"], 2, "nope", "err"),
    ("plugins check DIR missing", ["plugins", "check", "missing.d"], 2, "missing.d", "err"),
    ("plugins check DIR a file", ["plugins", "check", "file.txt"], 2, "file.txt", "err"),
    ("plugins check --data-root a file", ["plugins", "check", "dir", "--data-root", "file.txt"], 2, "file.txt", "err"),
    ("plugins check DIR no plugin.json", ["plugins", "check", "dir"], 1, "dir", "out"),
    ("trace cases -o directory", ["trace", "cases", "t.jsonl", "--gate", "g", "-o", "dir"], 2, "dir", "err"),
    ("trace cassette -o directory", ["trace", "cassette", "t.jsonl", "-o", "dir"], 2, "dir", "err"),
    ("trace cassette -o under a file", ["trace", "cassette", "t.jsonl", "-o", "file.txt/x"], 2, "file.txt", "err"),
    ("eval --cases missing", [*EVAL[:4], "--cases", "missing.jsonl"], 2, "missing.jsonl", "err"),
    ("eval --cases directory", [*EVAL[:4], "--cases", "dir"], 2, "dir", "err"),
    ("eval --cases bad JSON", [*EVAL[:4], "--cases", "badcases.jsonl"], 2, "badcases.jsonl", "err"),
    ("eval --cassette missing", [*EVAL[:6], "--cassette", "agent.stub=missing.yaml"], 2, "missing.yaml", "err"),
    ("eval --out a file", [*EVAL, "--out", "file.txt"], 2, "file.txt", "err"),
    ("eval --repeat 0", [*EVAL, "--repeat", "0"], 2, "--repeat", "err"),
    ("serve --port out of range", ["serve", "--port", "99999"], 2, "99999", "err"),
    ("fetch model ID not pinned", ["fetch", "model", "nope-model"], 2, "nope-model", "err"),
    (
        "fetch model --mirror missing",
        ["fetch", "model", "gemma-3-270m", "--mirror", "missing.d"],
        2,
        "missing.d",
        "err",
    ),
    ("fetch model --mirror a file", ["fetch", "model", "gemma-3-270m", "--mirror", "file.txt"], 2, "file.txt", "err"),
    ("fetch server --mirror bad URL", ["fetch", "server", "--mirror", "http://[::1"], 2, "http://[::1", "err"),
    ("cache verify --mirror not a URL", ["cache", "verify", "--mirror", "ftp://x/y"], 2, "ftp://x/y", "err"),
    ("models --unpin not pinned", ["models", "--unpin", "nope-model"], 2, "nope-model", "err"),
    ("logs -n 0", ["logs", "-n", "0"], 2, "--lines", "err"),
    ("completion SHELL unknown", ["completion", "tcsh"], 2, "tcsh", "err"),
    ("unknown flag", ["check", "--nope"], 2, "--nope", "err"),
]
SEARCH = ["search", "q", "-c", "c.yaml", "--embedder", "docs", "--corpus", "p.md"]
#: every numeric flag with a range: (id, argv, the range the message and hint must name)
RANGES: list[tuple[str, list[str], str]] = [
    ("search --top-k 0", [*SEARCH, "--top-k", "0"], "at least 1"),
    ("search --min-score nan", [*SEARCH, "--min-score", "nan"], "[-1, 1]"),
    ("search --window 0", [*SEARCH, "--window", "0"], "at least 1"),
    ("search --overlap -1", [*SEARCH, "--overlap", "-1"], "[0, 2000)"),
    ("search --overlap = --window", [*SEARCH, "--window", "100", "--overlap", "100"], "[0, 100)"),
    (
        "route --target-precision 1",
        ["route", "hi", "-c", "c.yaml", "--calibrate", "--target-precision", "1"],
        "[0.5, 1)",
    ),
    ("call --timeout -1", [*CALL, "--prompt", "x", "--timeout", "-1"], "(0, 604800]"),
    ("call --timeout nan", [*CALL, "--prompt", "x", "--timeout", "nan"], "(0, 604800]"),
    ("call --timeout 1e9", [*CALL, "--prompt", "x", "--timeout", "1e9"], "(0, 604800]"),
    ("eval --repeat 0", [*EVAL, "--repeat", "0"], "[1, 100]"),
    # a typo's 99999999999 built every job before the first call (300 MB/s until killed)
    ("eval --repeat 101", [*EVAL, "--repeat", "101"], "[1, 100]"),
    ("eval --workers 0", [*EVAL, "--workers", "0"], "[1, 256]"),
    ("eval --workers 257", [*EVAL, "--workers", "257"], "[1, 256]"),
    ("eval --fail-under 2", [*EVAL, "--fail-under", "2"], "[0, 1]"),
    ("eval --holdout 1", [*EVAL, "--holdout", "1"], "(0, 1)"),
    ("eval --holdout nan", [*EVAL, "--holdout", "nan"], "(0, 1)"),
    ("logs -n 0", ["logs", "-n", "0"], "at least 1"),
    ("serve --port 99999", ["serve", "--port", "99999"], "[0, 65535]"),
    ("serve --port -1", ["serve", "--port", "-1"], "[0, 65535]"),
    ("serve --max-models 0", ["serve", "--max-models", "0"], "at least 1"),
    ("serve --parallel 0", ["serve", "--parallel", "0"], "[1, 256]"),
    # llama.cpp's LLAMA_MAX_SEQ: before, 100,000 slots made every model's load abort (a 503 each)
    ("serve --parallel 257", ["serve", "--parallel", "257"], "[1, 256]"),
    ("serve --max-tokens 0", ["serve", "--max-tokens", "0"], "at least 1"),
    ("serve --max-queue 0", ["serve", "--max-queue", "0"], "at least 1"),
    ("serve --max-connections 0", ["serve", "--max-connections", "0"], "[1, "),
    # past the open-files hard limit: the promised 503 could not be given (accept() failed)
    ("serve --max-connections 1e11", ["serve", "--max-connections", "99999999999"], "[1, "),
    ("serve --header-timeout inf", ["serve", "--header-timeout", "inf"], "(0, 86400)"),
    ("serve --idle-timeout 0", ["serve", "--idle-timeout", "0"], "(0, 86400)"),
]
for sub in ("check", "compile"):
    ROWS += [
        (f"grammar {sub} missing", ["grammar", sub, "missing.json"], 2, "missing.json", "err"),
        (f"grammar {sub} directory", ["grammar", sub, "dir"], 2, "dir", "err"),
        (f"grammar {sub} bad JSON", ["grammar", sub, "badjson.json"], 2, "badjson.json", "err"),
        (f"grammar {sub} not an object", ["grammar", sub, "list.json"], 2, "list.json", "err"),
        (f"grammar {sub} NaN", ["grammar", sub, "nan.json"], 2, "$.maximum: nan is no JSON number", "err"),
        (f"grammar {sub} lone surrogate", ["grammar", sub, "surrogate.json"], 2, "$.enum[0]: the text", "err"),
        # a JSON Schema the validators refuse is the command's verdict: refused
        (f"grammar {sub} invalid schema", ["grammar", sub, "badschema.json"], 1, "$.properties", "out"),
    ]
for sub, extra in [("verify", []), ("show", []), ("stats", []), ("cases", ["--gate", "g"]), ("cassette", [])]:
    ROWS += [
        (f"trace {sub} missing", ["trace", sub, "missing.jsonl", *extra], 2, "missing.jsonl", "err"),
        (f"trace {sub} directory", ["trace", sub, "dir", *extra], 2, "dir", "err"),
        # the trace is the data under examination: malformed is a failed verdict, not usage
        (
            f"trace {sub} malformed",
            ["trace", sub, "badtrace.jsonl", *extra],
            1,
            "badtrace.jsonl",
            "out" if sub == "verify" else "err",
        ),
    ]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A directory with one good file of every kind, and the bad ones of :data:`BAD`."""
    work = tmp_path / "w"
    (work / "dir").mkdir(parents=True)
    (work / "s.json").write_text(json.dumps(SCHEMA))
    (work / "p.md").write_text("pick {{ args.x }}")
    (work / "c.yaml").write_text(CONFIG)
    (work / "cass.yaml").write_text(CASSETTE)
    for name, text in BAD.items():
        if text is not None:
            (work / name).write_text(text)
    (work / "binary.bin").write_bytes(BINARY)
    monkeypatch.chdir(work)
    assert cli.main([*RUN, "--trace", "t.jsonl"]) == 0  # a trace with one call of gate g
    assert cli.main(["trace", "cases", "t.jsonl", "--gate", "g", "-o", "cases.jsonl"]) == 0
    (work / "cases.jsonl").write_text(
        (work / "cases.jsonl").read_text().replace('"labelled": false', '"labelled": true')
    )
    capsys.readouterr()
    return work


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_exit_code(workspace: Path, capsys: pytest.CaptureFixture[str], row: Row) -> None:
    _, argv, code, names, where = row
    got = cli.main(argv)
    out, err = capsys.readouterr()
    assert got == code, f"exit {got}, expected {code}\nstdout: {out}\nstderr: {err}"
    assert names in (err if where == "err" else out), f"the message does not name {names!r}\n{out}\n{err}"
    assert "Traceback" not in out + err
    if code == 2:
        assert "error" in err and "bug in localllm" not in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["trace", "show", "missing.jsonl", "--json"], "missing.jsonl"),
        (["plugins", "check", "file.txt", "--json"], "file.txt"),
        (
            ["call", "decide", "-c", "c.yaml", "--agent", "agent.stub", "--prompt", "x", "--trace", "dir", "--json"],
            "dir",
        ),
    ],
)
def test_json_usage_error_document(
    workspace: Path, capsys: pytest.CaptureFixture[str], argv: list[str], names: str
) -> None:
    """With ``--json`` the usage error is the error document, kind ``usage_error``, same exit code."""
    assert cli.main(argv) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["kind"] == "usage_error" and names in doc["detail"]


@pytest.mark.parametrize("command", ["cases", "cassette"])
def test_trace_dash_c_failing_its_checks_writes_nothing(
    workspace: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``trace cases|cassette -c``: the config is loaded and checked like every command's
    ``-c``; one that fails its checks is the config error (exit 2), and ``-o`` is not written."""
    (workspace / "unknown-key.yaml").write_text(CONFIG + "no_such_key: 1\n")
    extra = ["--gate", "g"] if command == "cases" else []
    argv = ["trace", command, "t.jsonl", *extra, "-c", "unknown-key.yaml", "-o", "out.txt", "--json"]
    assert cli.main(argv) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["kind"]) == (False, "config_error")
    assert [(p["file"], p["key"]) for p in doc["problems"]] == [("unknown-key.yaml", "no_such_key")]
    assert not (workspace / "out.txt").exists()


def test_the_console_process_exits_2_for_a_missing_trace(workspace: Path) -> None:
    """The same code from the real process (``python -m localllm``), message on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "localllm", "trace", "verify", "missing.jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "missing.jsonl" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(("argv", "allowed"), [r[1:] for r in RANGES], ids=[r[0] for r in RANGES])
def test_a_flag_value_out_of_range_names_the_flag_the_value_and_the_range(
    workspace: Path, capsys: pytest.CaptureFixture[str], argv: list[str], allowed: str
) -> None:
    """Exit 2, and both the message and its hint name the flag and the allowed range (the
    message the value too): `--top-k 0` said "must be at least 1" with no hint; `eval
    --holdout 1` passed the CLI; `call --timeout -1` named no flag."""
    flag, value = argv[-2], argv[-1]
    assert cli.main([*argv, "--json"] if argv[0] in ("search", "eval") else argv) == 2
    out, err = capsys.readouterr()
    if argv[0] in ("search", "eval"):  # the --json form carries the same detail and hint
        doc = json.loads(out)
        message, hint = doc["detail"], doc["hint"]
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 2 and lines[1].startswith("hint: "), err
        message, hint = lines
    assert flag in message and allowed in message and value.lstrip("-").removesuffix("e9") in message
    assert flag in hint and allowed in hint
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "case",
    [
        # 3.13's decoder points at the comma ("Illegal trailing comma"), 3.12's after it
        (
            '{"type": "object",\n  "properties": {"a": 1,}\n}\n',
            2,
            24 if sys.version_info >= (3, 13) else 25,
            "trailing comma",
        ),
        ('{"enum": [1, 2,]}', 1, 15 if sys.version_info >= (3, 13) else 16, "trailing comma"),
        ("{'type': 'object'}", 1, 2, "double-quoted"),
        ('{"type": "object"}\n{}', 2, 1, "one JSON document"),
        ('{"type": "object" "x": 1}', 1, 19, "comma"),
    ],
)
def test_a_schema_file_that_is_not_json_says_where_and_how_to_fix_it(
    workspace: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, int, int, str]
) -> None:
    text, line, column, fix = case
    (workspace / "broken.json").write_text(text)
    assert cli.main([*CALL, "--prompt", "x", "--schema", "broken.json", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "broken.json" in doc["detail"] and f"line {line}, column {column}" in doc["detail"]
    assert fix in doc["hint"]
    from localllm.errors import SchemaError
    from localllm.schema import read_schema_file

    with pytest.raises(SchemaError) as info:
        read_schema_file(workspace / "broken.json")
    assert (info.value.line, info.value.column) == (line, column)


def test_the_line_shown_for_a_json_error_is_the_decoders_line(workspace: Path) -> None:
    """JSON counts lines by \\n only: a U+2028 inside a string earlier must not shift the line shown."""
    from localllm.errors import SchemaError
    from localllm.schema import read_schema_file

    (workspace / "broken.json").write_text('{"description": "a\u2028b",\n "type": "object",\n "x": 1,}\n')
    with pytest.raises(SchemaError) as info:
        read_schema_file(workspace / "broken.json")
    assert info.value.line == 3 and "'\"x\": 1,}'" in str(info.value)
