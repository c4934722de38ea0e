"""`localllm embed|search|route` against the fake llama-server (a real process)."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.embed.embedder import fake_vector
from localllm.embed.local import embedding_server_args
from localllm.embed.registry import lookup

FAKE = Path(__file__).parent / "fakes" / "fake_llama_server.py"


def _wrapper(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    from localllm.managed.server import ManagedServer

    gguf = tmp_path / "all-minilm-l6-v2-f16.gguf"
    gguf.write_bytes(b"GGUF")
    info = lookup("all-minilm-l6-v2")
    with ManagedServer(_wrapper(tmp_path), gguf, args=embedding_server_args(info, 2), parallel=2,
                 ctx_per_slot=info.context, name="embed-test", health_timeout=30) as sidecar:
        yield sidecar.ensure_ready()


def _config(tmp_path: Path, url: str, extra: str = "") -> Path:
    cfg = tmp_path / "cfg" / "localllm.yaml"
    cfg.parent.mkdir(exist_ok=True)
    (cfg.parent / "all-minilm-l6-v2-f16.gguf").write_bytes(b"GGUF")
    cfg.write_text(
        "embedders:\n"
        f"  docs: {{endpoint: '{url}', model: all-minilm-l6-v2}}\n"
        f"  managed: {{model: all-minilm-l6-v2-f16.gguf, server_bin: '{_wrapper(tmp_path)}', parallel: 2}}\n"
        "intents:\n"
        "  greet: {examples: ['hello there', 'good morning']}\n"
        "  leave: {examples: ['goodbye now', 'see you later']}\n"
        "router: {embedder: docs}\n" + extra
    )
    return cfg


def test_embed_prints_one_vector_per_text(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, endpoint)
    assert main(["embed", "--config", str(cfg), "--embedder", "docs", "alpha", "beta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == pytest.approx(fake_vector("alpha", 384), abs=1e-6)


def test_embed_json_through_a_managed_sidecar(tmp_path: Path, endpoint: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, endpoint)
    assert main(["embed", "--config", str(cfg), "--embedder", "managed", "--role", "query", "--json", "x"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dims"] == 384 and doc["model"] == "all-minilm-l6-v2" and len(doc["vectors"]) == 1


def test_search_prints_score_path_chunk_and_reuses_the_store(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path, endpoint)
    docs = tmp_path / "work" / "docs"
    docs.mkdir(parents=True)
    (docs / "a.md").write_text("# One\nhello\n# Two\nworld\n")
    (docs / "b.txt").write_text("plain text file\n")
    monkeypatch.chdir(tmp_path / "work")
    argv = ["search", "# Two\nworld\n", "--config", str(cfg), "--embedder", "docs", "--corpus", "docs/**/*",
            "--min-score", "-1"]
    assert main(argv) == 0
    out = capsys.readouterr()
    first = out.out.splitlines()[0].split()
    assert first[:2] == ["1.0000", "docs/a.md#1"]
    assert "3 chunks, 3 embedded now" in out.err
    assert main([*argv, "--json", "--top-k", "2"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["results"][0]["id"] == "docs/a.md#1" and len(doc["results"]) == 2
    assert doc["results"][0]["path"] == "docs/a.md" and doc["results"][0]["chunk"] == 1
    assert doc["embedded"] == 0 and "0 embedded now" in out.err


def test_route_records_provenance_in_the_trace(tmp_path: Path, endpoint: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, endpoint)
    trace = tmp_path / "route.jsonl"
    assert main(["route", "good morning", "--config", str(cfg), "--trace", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["intent"] == "greet" and doc["routed_by"] == "semantic"
    assert doc["turn_start"]["match_type"] == "example:good morning"
    events = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    assert events[-1]["kind"] == "turn.start" and events[-1]["payload"]["intent"] == "greet"
    # no confident match and no decide agent: a miss, exit 1
    assert main(["route", "something else entirely", "--config", str(cfg)]) == 1
    assert capsys.readouterr().out.startswith("-\tmiss\trouted_by=semantic")


def test_unknown_embedder_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "http://127.0.0.1:9")
    assert main(["embed", "--config", str(cfg), "--embedder", "nope", "x"]) == 2
    assert "embedders.nope" in capsys.readouterr().err


def test_unreachable_endpoint_is_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "http://127.0.0.1:9")
    assert main(["embed", "--config", str(cfg), "--embedder", "docs", "x"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the embedding server" in err and "Traceback" not in err


def test_decl_errors_name_the_key_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.config import EmbedderDecl
    from localllm.embed.local import embedder_from_decl
    from localllm.errors import EmbedError

    with pytest.raises(EmbedError, match=r"embedders\.e\.api_key_env: environment variable EMB_KEY is not set"):
        embedder_from_decl(EmbedderDecl(name="e", endpoint="http://127.0.0.1:9", api_key_env="EMB_KEY"))
    monkeypatch.setenv("EMB_KEY", "k")
    emb = embedder_from_decl(EmbedderDecl(name="e", endpoint="http://127.0.0.1:9/v1", model="all-minilm-l6-v2",
                                          api_key_env="EMB_KEY"))
    assert "k" not in repr(emb).replace("all-minilm", "")
    with pytest.raises(EmbedError, match=r"embedders\.m\.extra_args: must not set --pooling, -ub"):
        embedder_from_decl(EmbedderDecl(name="m", model="all-minilm-l6-v2", extra_args=("-ub", "64", "--pooling")))
    with pytest.raises(EmbedError, match="parallel 3 does not divide"):
        embedder_from_decl(EmbedderDecl(name="m", model="all-minilm-l6-v2", parallel=3))


def test_managed_decl_starts_nothing_until_the_first_embed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.config import EmbedderDecl
    from localllm.embed.local import embedder_from_decl

    log = tmp_path / "spawn.jsonl"
    gguf = tmp_path / "all-minilm-l6-v2-f16.gguf"
    gguf.write_bytes(b"GGUF")
    decl = EmbedderDecl(name="m", model=str(gguf), server_bin=str(_wrapper(tmp_path)), parallel=2,
                        health_timeout=30)
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(log))
    with embedder_from_decl(decl) as emb:
        assert not log.exists()
        assert emb.embed(["a", "b"], "document").shape == (2, 384)
        starts = [json.loads(x) for x in log.read_text().splitlines() if '"start"' in x]
        argv = starts[-1]["argv"]
        assert argv[argv.index("-ub") + 1] == "512" and argv[argv.index("--parallel") + 1] == "2"
        assert "--embeddings" in argv and argv[argv.index("--pooling") + 1] == "mean"
