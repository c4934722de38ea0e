"""``bench_grammar.py``'s XGrammar arm: the subprocess protocol and how its answers are counted.

XGrammar itself lives in a venv of its own (``make bench-peers``), absent in CI; here a fake
peer stands in for the venv's interpreter (a script that answers the same line protocol with a
rule of its own), so what is checked is the bench's side: the skip when the venv is missing,
the version pin, and the per-subset counts (refusals by type, verdicts, no-verdicts skipped).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench import bench_grammar

#: compiles a schema unless it has "refuse"; admits a text when it contains "1"; no verdict on "?"
FAKE_PEER = """#!{python}
import json, pathlib, sys
print(json.dumps({{"version": "{version}"}}), flush=True)
seen = pathlib.Path(sys.argv[0]).parent / "texts.jsonl"
for line in sys.stdin:
    job = json.loads(line)
    with seen.open("a") as sink:
        sink.write(json.dumps(job["texts"]) + "\\n")
    if "refuse" in job["schema"]:
        print(json.dumps({{"ok": False, "error": "RuntimeError", "seconds": 0.002, "admitted": []}}))
        continue
    verdicts = [None if "?" in t else "1" in t for t in job["texts"]]
    print(json.dumps({{"ok": True, "error": None, "seconds": 0.001, "admitted": verdicts}}))
"""


def _venv(root: Path, version: str = bench_grammar.XGRAMMAR_VERSION, installed: bool = True) -> Path:
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PEER.format(python=sys.executable, version=version))
    python.chmod(0o755)
    if installed:
        (root / ".installed").touch()
    return root


ENTRIES: list[dict[str, Any]] = [
    {
        "subset": "A",
        "schema": {"type": "integer"},
        "tests": [
            {"data": 1, "valid": True},
            {"data": 2, "valid": True},
            {"data": "1", "valid": False},
            {"data": "?", "valid": False},
        ],
    },
    {"subset": "A", "schema": {"refuse": True}, "tests": [{"data": 1, "valid": True}]},
    {"subset": "B", "schema": {}, "tests": [{"data": [1], "valid": False}]},
    {"subset": "B", "schema": {}, "tests": [{"data": {"z": "é", "a": [2, 3]}, "valid": True}]},
]


def test_counts_per_subset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_grammar, "XGRAMMAR_VENV", _venv(tmp_path / "venv"))
    per = bench_grammar.run_xgrammar(ENTRIES)
    assert per is not None
    a, b = per["A"], per["B"]
    assert (a["schemas"], a["compiled"], dict(a["refusals"])) == (2, 1, {"RuntimeError": 1})
    # the "?" instance has no verdict: counted nowhere; the refused schema's instance neither
    assert (a["valid"], a["valid_admitted"], a["invalid"], a["invalid_admitted"]) == (2, 1, 1, 1)
    assert (b["schemas"], b["compiled"], b["invalid"], b["invalid_admitted"]) == (2, 2, 1, 1)
    assert (b["valid"], b["valid_admitted"]) == (1, 0)
    assert len(a["times"]) == 2


def test_instances_go_compact_in_their_own_key_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = _venv(tmp_path / "venv")
    monkeypatch.setattr(bench_grammar, "XGRAMMAR_VENV", venv)
    bench_grammar.run_xgrammar(ENTRIES)
    sent = [json.loads(line) for line in (venv / "bin" / "texts.jsonl").read_text().splitlines()]
    assert sent[-1] == ['{"z":"é","a":[2,3]}']
    assert sent[0] == ["1", "2", '"1"', '"?"']


def test_missing_venv_is_a_skip_naming_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_grammar, "XGRAMMAR_VENV", _venv(tmp_path / "venv", installed=False))
    assert bench_grammar.run_xgrammar(ENTRIES) is None
    assert "make bench-peers" in capsys.readouterr().err


def test_another_version_in_the_venv_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_grammar, "XGRAMMAR_VENV", _venv(tmp_path / "venv", version="0.1.0"))
    with pytest.raises(RuntimeError, match="bench-peers"):
        bench_grammar.run_xgrammar(ENTRIES)
