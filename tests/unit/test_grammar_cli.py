"""``localllm grammar check``: verdicts, findings, exit codes 0/1/2, --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main


def write(tmp_path: Path, name: str, schema: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(schema) if not isinstance(schema, str) else schema)
    return path


OK = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}
WARN = {"type": "object", "properties": {"s": {"type": "number", "maximum": 1}}, "required": ["s"]}
BAD: dict[str, Any] = {
    "type": "object",
    "properties": {"t": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
}


def test_all_in_subset_exits_0_and_prints_each_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok, warn = write(tmp_path, "ok.json", OK), write(tmp_path, "warn.json", WARN)
    assert main(["grammar", "check", "--server", str(ok), str(warn)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{ok}: ok"
    assert out[1] == f"{warn}: warning-only (0 error(s), 1 warning(s))"
    assert out[2].split()[:3] == ["warning", "$.properties.s", "[maximum]"]
    assert '"maximum" is not enforced' in out[2]


def test_any_error_exits_1_and_names_path_and_construct(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok, bad = write(tmp_path, "ok.json", OK), write(tmp_path, "bad.json", BAD)
    assert main(["grammar", "check", "--server", str(ok), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: error (1 error(s), 0 warning(s))" in out
    assert (
        'error   $.properties.t  [uniqueItems]  $.properties.t: unsupported construct "uniqueItems" '
        "is outside the llama.cpp grammar subset"
    ) in out


def test_by_default_the_exit_code_judges_the_compiled_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # \\d: llama.cpp's converter accepts any string; localllm's compiler expresses it exactly
    digits = write(tmp_path, "digits.json", {"type": "string", "pattern": "^\\d{3}$"})
    bad = write(tmp_path, "bad.json", BAD)  # uniqueItems: neither path enforces it
    assert main(["grammar", "check", "--json", str(digits)]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert (result["verdict"], result["compiled"], result["enforced"]) == (
        "error",
        {"exact": True, "refusals": []},
        True,
    )
    assert main(["grammar", "check", "--server", str(digits)]) == 1
    capsys.readouterr()
    assert main(["grammar", "check", str(digits), str(bad)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{digits}: enforced (compiled: exact; llama.cpp's converter: error")
    assert lines[2].startswith(f"{bad}: NOT enforced (compiled: refused;")
    assert lines[-2].split()[:3] == ["refused", "$.properties.t", "[uniqueItems]"]
    # what the agent sends instead: the rest of the schema as its grammar
    assert lines[-1] == "  relaxed the rest is the grammar; left to validation: $.properties.t [uniqueItems]"


def test_json_output_says_what_is_relaxed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.json", BAD)
    under_one_of = write(tmp_path, "one.json", {"oneOf": [{"type": "array", "maxItems": 1}, BAD["properties"]["t"]]})
    unevaluated = write(tmp_path, "uneval.json", {**BAD, "unevaluatedProperties": False})
    files = [bad, under_one_of, unevaluated, write(tmp_path, "ok.json", OK)]
    assert main(["grammar", "check", "--json", *map(str, files)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [r["path"] for r in data[0]["compiled"]["relaxed"]] == ["$.properties.t"]
    # under a oneOf of two arrays: the oneOf is read as an anyOf first
    assert [(r["path"], r["construct"]) for r in data[1]["compiled"]["relaxed"]] == [
        ("$", "oneOf"),
        ("$[1]", "uniqueItems"),
    ]
    assert data[2]["compiled"]["relaxed"] is None  # which keys count as evaluated depends on what goes
    assert "relaxed" not in data[3]["compiled"]  # enforced: nothing to relax


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warn, bad = write(tmp_path, "warn.json", WARN), write(tmp_path, "bad.json", BAD)
    assert main(["grammar", "check", "--json", str(warn), str(bad)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["verdict"] for d in data] == ["warning-only", "error"]
    assert data[1]["file"] == str(bad)
    assert data[1]["findings"] == [
        {
            "path": "$.properties.t",
            "construct": "uniqueItems",
            "severity": "error",
            "message": '$.properties.t: unsupported construct "uniqueItems" is outside the llama.cpp grammar subset',
            "runaway": False,
        }
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (None, "not found"),
    ],
)
def test_unreadable_schema_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, needle: str
) -> None:
    ok = write(tmp_path, "ok.json", OK)
    broken = tmp_path / "broken.json"
    if content is not None:
        broken.write_text(content)
    assert main(["grammar", "check", str(broken), str(ok)]) == 2
    captured = capsys.readouterr()
    # the unreadable file is named; the readable one still gets its verdict
    assert captured.out.startswith(f"{ok}: enforced")
    assert str(broken) in captured.err and needle in captured.err


def test_runs_as_a_real_command(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.json", {"type": "string", "pattern": "^\\d{3}$"})
    proc = subprocess.run(
        [sys.executable, "-m", "localllm", "grammar", "check", "--server", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert '$.pattern: "^\\\\d{3}$" uses "\\d"' in proc.stdout


def test_a_corpus_entry_is_checked_by_its_inner_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The wrapper itself is an object with no JSON Schema keywords: checked as-is it would be "ok".
    entry = write(
        tmp_path,
        "entry.json",
        {"description": "unique tags", "schema": BAD, "verdict": "error", "findings": [], "llama": "ignores"},
    )
    assert main(["grammar", "check", "--json", str(entry)]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert (result["verdict"], result["corpus_verdict"]) == ("error", "error")
    assert [f["construct"] for f in result["findings"]] == ["uniqueItems"]
    assert main(["grammar", "check", "--server", str(entry)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{entry}: error (1 error(s), 0 warning(s))  [corpus entry; recorded verdict: error]"
    )


def test_the_shipped_corpus_gets_its_recorded_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    corpus = sorted((Path(__file__).resolve().parents[2] / "grammar" / "corpus").glob("*.json"))
    assert len(corpus) > 10
    main(["grammar", "check", "--json", *map(str, corpus)])
    results = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in results] == [r["corpus_verdict"] for r in results]
    assert {r["verdict"] for r in results} == {"ok", "warning-only", "error"}


def test_a_corpus_entry_whose_schema_is_not_an_object_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = write(tmp_path, "entry.json", {"description": "broken", "schema": ["not", "a", "schema"], "verdict": "ok"})
    assert main(["grammar", "check", "--json", str(entry)]) == 2
    [doc] = json.loads(capsys.readouterr().out)
    assert (doc["file"], doc["ok"], doc["kind"]) == (str(entry), False, "schema_error")
    assert str(entry) in doc["detail"]


# ---------------------------------------------------------------------------- grammar compile


def test_compile_prints_the_grammar_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.grammar.walk import Grammar

    path = write(tmp_path, "ok.json", OK)
    assert main(["grammar", "compile", str(path)]) == 0
    text = capsys.readouterr().out
    g = Grammar.parse(text)  # what is printed is the grammar itself
    assert g.matches('{"a":7}') and not g.matches('{"a":10}')


def test_compile_notes_a_narrowed_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "uri.json", {"type": "string", "format": "hostname"})
    assert main(["grammar", "compile", "--json", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["exact"] and result["grammar"].startswith("root ::=")
    assert len(result["notes"]) == 1 and result["notes"][0].startswith("$:")


def test_compile_explain_lists_every_refusal_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^(?=a)a$"},
            "b": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "c": {"type": "integer", "minimum": 1},
        },
    }
    path = write(tmp_path, "bad.json", schema)
    assert main(["grammar", "compile", str(path)]) == 1
    plain = capsys.readouterr().out
    assert plain.count("refused $.") == 1
    assert main(["grammar", "compile", "--explain", "--json", str(path)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["grammar"] is None
    assert [(r["path"], r["construct"]) for r in result["refusals"]] == [
        ("$.properties.a", "pattern"),
        ("$.properties.b", "uniqueItems"),
    ]
    assert all(r["hint"] for r in result["refusals"])


def test_compile_unreadable_file_exits_2(tmp_path: Path) -> None:
    assert main(["grammar", "compile", str(tmp_path / "missing.json")]) == 2
