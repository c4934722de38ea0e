"""The grammar canary's verdict and the ``--help`` flags, probed once per build (``managed.probes``).

Against the fake llama-server behind a wrapper that logs every invocation, so a ``--help``
probe is visible; the canary is visible in the fake's request log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm.managed import probes
from localllm.managed.server import CANARY_BODY, ManagedServer

FAKE = Path(__file__).resolve().parent / "fakes" / "fake_llama_server.py"


@pytest.fixture
def build(tmp_path: Path) -> Path:
    """``bin/llama-server``: logs its argv to ``calls.log``, then execs the fake (same pid)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    path = bindir / "llama-server"
    write_wrapper(path, tmp_path / "calls.log")
    return path


def write_wrapper(path: Path, calls: Path, extra: str = "") -> None:
    path.write_text(f'#!/bin/sh\n{extra}echo "$*" >> "{calls}"\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF fake")
    return path


@pytest.fixture
def requests_log(tmp_path: Path) -> Path:
    return tmp_path / "requests.jsonl"


def start_once(binary: Path, model: Path, log: Path, **env: str) -> ManagedServer:
    server = ManagedServer(binary, model, env={"FAKE_LLAMA_REQUEST_LOG": str(log), **env}, health_timeout=30.0)
    server.ensure_ready()
    server.stop(grace=1.0)
    return server


def canaries(log: Path) -> int:
    if not log.exists():
        return 0
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return sum(1 for r in rows if r.get("path", "").endswith("/chat/completions") and r.get("body") == CANARY_BODY)


def help_probes(tmp_path: Path) -> int:
    calls = tmp_path / "calls.log"
    return calls.read_text().splitlines().count("--help") if calls.exists() else 0


def test_the_second_start_of_a_build_asks_nothing_again(tmp_path: Path, build: Path, model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    first = start_once(build, model, log)
    assert (first.grammar_enforced, canaries(log), help_probes(tmp_path)) == (True, 1, 1)
    second = start_once(build, model, log)
    assert (second.grammar_enforced, canaries(log), help_probes(tmp_path)) == (True, 1, 1)
    assert "--swa-full" in second.argv() and "--no-webui" in second.argv()  # the remembered flags


def test_a_changed_binary_is_probed_again(tmp_path: Path, build: Path, model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    start_once(build, model, log)
    write_wrapper(build, tmp_path / "calls.log", extra="# rebuilt\n")  # other bytes: another build
    start_once(build, model, log)
    assert (canaries(log), help_probes(tmp_path)) == (2, 2)


def test_a_changed_library_beside_it_is_another_build(tmp_path: Path, build: Path, model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lib = build.parent / "libllama.so.0.1"
    lib.write_bytes(b"old library")
    start_once(build, model, log)
    start_once(build, model, log)
    assert canaries(log) == 1
    lib.write_bytes(b"new library")
    start_once(build, model, log)
    assert canaries(log) == 2


def test_a_failed_verdict_is_remembered_too(tmp_path: Path, build: Path, model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    ignores = {"FAKE_LLAMA_CONTENT": "OK"}  # answers without the grammar: not enforced
    assert start_once(build, model, log, **ignores).grammar_enforced is False
    assert start_once(build, model, log).grammar_enforced is False  # the build's verdict, not asked again
    assert canaries(log) == 1
    probes.forget(probes.build_id(build))
    assert start_once(build, model, log).grammar_enforced is True
    assert canaries(log) == 2


def test_an_inconclusive_canary_is_asked_again(tmp_path: Path, build: Path, model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    behaviour = tmp_path / "behaviour.json"
    behaviour.write_text(json.dumps({"responses": [{"status": 500, "message": "boom"}]}))
    assert start_once(build, model, log, FAKE_LLAMA_BEHAVIOUR=str(behaviour)).grammar_enforced is None
    assert start_once(build, model, log).grammar_enforced is True
    assert canaries(log) == 2


def test_an_unwritable_cache_means_probing_every_time(
    tmp_path: Path, build: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(blocked))
    log = tmp_path / "requests.jsonl"
    assert start_once(build, model, log).grammar_enforced is True
    assert start_once(build, model, log).grammar_enforced is True
    assert (canaries(log), help_probes(tmp_path)) == (2, 2)


def test_build_id_rehashes_only_changed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"binary v1")
    (tmp_path / "libggml-base.so").write_bytes(b"ggml")
    (tmp_path / "libllama.so").symlink_to(tmp_path / "libggml-base.so")  # links are not members
    (tmp_path / "unrelated.so").write_bytes(b"other")
    hashed: list[str] = []
    real = probes._sha256

    def counting(path: Path) -> str:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(probes, "_sha256", counting)
    first = probes.build_id(binary)
    assert sorted(hashed) == ["libggml-base.so", "llama-server"]
    assert probes.build_id(binary) == first and len(hashed) == 2  # nothing changed: nothing hashed
    binary.write_bytes(b"binary v2")
    second = probes.build_id(binary)
    assert second != first and hashed[2:] == ["llama-server"]
    os.utime(binary, ns=(0, 0))  # touched, same bytes: hashed again, same build
    assert probes.build_id(binary) == second and hashed[3:] == ["llama-server"]
    assert probes.build_id(tmp_path / "missing") is None


def test_recall_and_remember_round_trip(tmp_path: Path) -> None:
    assert probes.recall(None) == {} and probes.recall("0" * 64) == {}
    probes.remember("0" * 64, flags=["--swa-full"])
    probes.remember("0" * 64, grammar_enforced=True)
    known: dict[str, Any] = probes.recall("0" * 64)
    assert known == {"flags": ["--swa-full"], "grammar_enforced": True}
    (Path(os.environ["LOCALLLM_CACHE_DIR"]) / "probes" / ("1" * 64 + ".json")).write_text("not json")
    assert probes.recall("1" * 64) == {}
