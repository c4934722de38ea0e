"""``localllm._jsonschema.prepare``: jsonschema imported without building rfc3987-syntax's
parsers, its ``iri`` checker unchanged, and every jsonschema import in localllm behind it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_RFC3987_SYNTAX = importlib.util.find_spec("rfc3987_syntax") is not None

IRIS = ["http://example.com/ä", "http://ex ample.com", "urn:isbn:0451450523", "http://[::1]/x", "%zz", "é:x", ""]

VERDICTS = """
import json, sys
import jsonschema
checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
iris = json.loads(sys.argv[1])
print(json.dumps({"iri": "iri" in checker.checkers, "verdicts": [checker.conforms(i, "iri") for i in iris]}))
"""


def run_python(code: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(not HAS_RFC3987_SYNTAX, reason="rfc3987-syntax is not installed: nothing to defer")
def test_prepare_defers_rfc3987_syntax_and_keeps_the_iri_verdicts() -> None:
    plain = json.loads(run_python(VERDICTS, json.dumps(IRIS)))
    code = """
    import json, sys
    from localllm import _jsonschema
    _jsonschema.prepare()
    assert "jsonschema" in sys.modules
    deferred = "rfc3987_syntax" not in sys.modules and "lark" not in sys.modules
    import jsonschema
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    iris = json.loads(sys.argv[1])
    verdicts = [checker.conforms(i, "iri") for i in iris]
    import rfc3987_syntax
    print(json.dumps({"deferred": deferred, "iri": "iri" in checker.checkers, "verdicts": verdicts,
                      "real_after": hasattr(rfc3987_syntax, "syntax_parser")}))
    """
    lazy = json.loads(run_python(code, json.dumps(IRIS)))
    assert lazy["deferred"] is True
    assert lazy["real_after"] is True  # the stand-in is gone: a later import gets the real module
    assert plain["iri"] is True and lazy["iri"] is True
    assert lazy["verdicts"] == plain["verdicts"]
    assert False in plain["verdicts"] and True in plain["verdicts"]


@pytest.mark.skipif(not HAS_RFC3987_SYNTAX, reason="rfc3987-syntax is not installed: nothing to defer")
def test_prepare_leaves_a_later_import_of_rfc3987_syntax_real() -> None:
    code = """
    import sys
    from localllm import _jsonschema
    _jsonschema.prepare()
    _jsonschema.prepare()  # idempotent
    import rfc3987_syntax
    from rfc3987_syntax import is_valid_syntax
    print(type(sys.modules["rfc3987_syntax"]).__name__, is_valid_syntax("iri", "http://example.com/ä"))
    """
    assert run_python(code).split() == ["module", "True"]


def test_loading_a_grammar_config_does_not_import_rfc3987_syntax(tmp_path: Path) -> None:
    # the cold-start path: load_config (schema and grammar checks) and a validation
    (tmp_path / "s.json").write_text(
        json.dumps({"type": "object", "properties": {"u": {"type": "string", "format": "iri"}}, "required": ["u"]})
    )
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "llama-server").write_text("#!/bin/sh\n")
    (tmp_path / "llama-server").chmod(0o755)
    (tmp_path / "c.yaml").write_text(
        "agent_plugins:\n  agent.local:\n    plugin: builtin.local_llm\n    model: ./m.gguf\n"
        "    server_bin: ./llama-server\n    grammar: true\n"
        "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with: {prompt: hi, schema: s.json}\n"
    )
    code = """
    import sys
    from pathlib import Path
    from localllm import load_config
    from localllm.schema import SchemaSet
    config = load_config(sys.argv[1])
    store = SchemaSet(config.base_dir)
    v = store.validator(store.load(Path(sys.argv[1]).parent / "s.json"))
    print(v.is_valid({"u": "http://example.com/ä"}), v.is_valid({"u": "http://ex ample.com"}),
          "rfc3987_syntax" in sys.modules)
    """
    assert run_python(code, str(tmp_path / "c.yaml")).split() == ["True", "False", "False"]


def test_every_jsonschema_import_in_localllm_is_prepared() -> None:
    # a bare `import jsonschema` that runs first would pay rfc3987-syntax's parsers again
    bare = []
    for path in sorted((REPO / "localllm").rglob("*.py")):
        if path.name == "_jsonschema.py":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            prepared = any("_jsonschema.prepare()" in before for before in lines[max(0, i - 3) : i])
            if re.match(r"\s*(import jsonschema|from jsonschema[ .])", line) and not prepared:
                bare.append(f"{path.relative_to(REPO)}:{i + 1}")
    assert bare == []
