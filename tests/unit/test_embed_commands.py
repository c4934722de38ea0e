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
    with ManagedServer(
        _wrapper(tmp_path),
        gguf,
        args=embedding_server_args(info, 2),
        parallel=2,
        ctx_per_slot=info.context,
        name="embed-test",
        health_timeout=30,
    ) as sidecar:
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


def test_embed_json_through_a_managed_sidecar(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, endpoint)
    assert main(["embed", "--config", str(cfg), "--embedder", "managed", "--role", "query", "--json", "x"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dims"] == 384 and doc["model"] == "all-minilm-l6-v2" and len(doc["vectors"]) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["route", "\udcff refund"],  # bytes 0xff on the command line, as Python decodes them
        ["search", "--embedder", "docs", "--corpus", "*.yaml", "--", "\udcff reset"],
        ["embed", "--embedder", "docs", "ok", "\udcfe"],
    ],
)
def test_text_that_is_no_utf8_is_an_error_naming_it_not_a_bug(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # before: "UnicodeEncodeError ... this is a bug in localllm" (the request's JSON encoding)
    cfg = _config(tmp_path, endpoint)
    assert main([argv[0], "--config", str(cfg), *argv[1:]]) == 1
    err = capsys.readouterr().err
    assert "lone surrogate U+DCF" in err and "to embed" in err and "bug in localllm" not in err


def test_search_prints_score_path_chunk_and_reuses_the_store(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path, endpoint)
    docs = tmp_path / "work" / "docs"
    docs.mkdir(parents=True)
    (docs / "a.md").write_text("# One\nhello\n# Two\nworld\n")
    (docs / "b.txt").write_text("plain text file\n")
    monkeypatch.chdir(tmp_path / "work")
    argv = [
        "search",
        "# Two\nworld\n",
        "--config",
        str(cfg),
        "--embedder",
        "docs",
        "--corpus",
        "docs/**/*",
        "--min-score",
        "-1",
    ]
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


def test_route_records_provenance_in_the_trace(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
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
    emb = embedder_from_decl(
        EmbedderDecl(name="e", endpoint="http://127.0.0.1:9/v1", model="all-minilm-l6-v2", api_key_env="EMB_KEY")
    )
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
    decl = EmbedderDecl(name="m", model=str(gguf), server_bin=str(_wrapper(tmp_path)), parallel=2, health_timeout=30)
    monkeypatch.setenv("FAKE_LLAMA_SPAWN_LOG", str(log))
    with embedder_from_decl(decl) as emb:
        assert not log.exists()
        assert emb.embed(["a", "b"], "document").shape == (2, 384)
        starts = [json.loads(x) for x in log.read_text().splitlines() if '"start"' in x]
        argv = starts[-1]["argv"]
        assert argv[argv.index("-ub") + 1] == "512" and argv[argv.index("--parallel") + 1] == "2"
        assert "--embeddings" in argv and argv[argv.index("--pooling") + 1] == "mean"


def test_a_gguf_replaced_at_the_same_path_keys_a_new_store(tmp_path: Path) -> None:
    """Stored vectors are the weights': a managed embedder's identity holds its GGUF's
    sha256, so other weights at the same path never read the old model's vectors."""
    from localllm.config import EmbedderDecl
    from localllm.embed.local import embedder_from_decl
    from localllm.embed.store import store_key

    gguf = tmp_path / "all-minilm-l6-v2-f16.gguf"
    decl = EmbedderDecl(name="m", model=str(gguf), server_bin=str(_wrapper(tmp_path)))

    def key() -> str:
        with embedder_from_decl(decl) as emb:  # starts nothing
            return store_key(emb.identity)

    gguf.write_bytes(b"GGUF first weights")
    first = key()
    assert key() == first  # the same weights: the same store
    gguf.write_bytes(b"GGUF other weights, a different size")  # hashes are memoised by size and mtime
    assert key() != first
    endpoint = embedder_from_decl(EmbedderDecl(name="e", endpoint="http://127.0.0.1:9", model="all-minilm-l6-v2"))
    assert "weights" not in endpoint.identity.as_dict()  # unknown: stores keyed as before


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        # the decide tier runs: turn.start opens the turn, the decide call's events follow it
        ("zzz qqq", ["turn.start", "agent.call.start", "agent.call.complete"]),
        # a semantic route: the turn is turn.start alone, with the whole provenance
        ("goodbye now", ["turn.start"]),
    ],
)
def test_route_turn_writes_turn_start_before_the_decide_call(tmp_path: Path, text: str, kinds: list[str]) -> None:
    from localllm.config import Intent
    from localllm.embed.embedder import FakeEmbedder
    from localllm.embed.router import Router, route_turn, runtime_decide
    from localllm.loading import load_config
    from localllm.runtime import Runtime
    from localllm.trace import read_trace

    cfg = tmp_path / "app.yaml"
    cfg.write_text("agent_plugins:\n  agent.decider: {plugin: builtin.inprocess}\n")
    intents = [Intent("greet", ("hello there",)), Intent("leave", ("goodbye now",))]
    trace = tmp_path / "route.jsonl"
    with Runtime(load_config(cfg), trace=trace) as runtime:
        runtime.register_inprocess("agent.decider", lambda _request: {"intent": "leave"})
        router = Router(intents, FakeEmbedder(64), decide=runtime_decide(runtime, "agent.decider", intents))
        verdict = route_turn(router, text, runtime.trace, turn=runtime.turn)
    assert verdict.intent == "leave"
    events = read_trace(trace).events
    assert [e.kind for e in events] == kinds
    assert [e.seq for e in events] == list(range(len(kinds)))
    start = events[0].payload
    assert start["input"] == text
    if len(kinds) > 1:
        assert (start["intent"], start["routed_by"], start["match_type"]) == ("", "llm", "decide")
        assert "direct" not in start
    else:
        assert (start["intent"], start["routed_by"], start["direct"]) == ("leave", "semantic", True)


def test_route_without_a_trace_records_nothing(tmp_path: Path) -> None:
    from localllm.config import Intent
    from localllm.embed.embedder import FakeEmbedder
    from localllm.embed.router import Router, route_turn

    asked: list[list[str]] = []

    def decide(_text: str, candidates: list[str]) -> str:
        asked.append(candidates)
        return "b"

    router = Router([Intent("a", ("alpha",)), Intent("b", ("beta",))], FakeEmbedder(64), decide=decide)
    assert route_turn(router, "zzz", None, turn=1).intent == "b"
    assert asked == [["a", "b"]]


def test_cli_route_opens_the_turn_before_the_decide_call(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.agents_fixtures.helpers import JSONRPC_AGENT

    cfg = _config(tmp_path, endpoint).with_name("route.yaml")
    # the decide agent echoes (not an intent): the call fails schema validation, the turn still opens first
    cfg.write_text(
        "agent_plugins:\n"
        f"  agent.decider: {{plugin: subprocess, command: '{sys.executable}', args: ['{JSONRPC_AGENT}']}}\n"
        "embedders:\n"
        f"  docs: {{endpoint: '{endpoint}', model: all-minilm-l6-v2}}\n"
        "intents:\n"
        "  greet: {examples: ['hello there']}\n"
        "  leave: {examples: ['goodbye now']}\n"
        "router: {embedder: docs, agent: agent.decider}\n"
    )
    trace = tmp_path / "route.jsonl"
    assert main(["route", "zzz qqq", "-c", str(cfg), "--trace", str(trace), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["kind"] == "schema_invalid"
    events = [json.loads(x) for x in trace.read_text().splitlines()[1:]]
    assert [e["kind"] for e in events] == ["turn.start", "agent.call.start", "agent.call.error"]
    assert events[0]["payload"] == {"input": "zzz qqq", "intent": "", "routed_by": "llm", "match_type": "decide"}


def test_search_shows_a_progress_bar_only_on_a_terminal(
    tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    cfg = _config(tmp_path, endpoint)
    docs = tmp_path / "work"
    docs.mkdir()
    for i in range(40):
        (docs / f"{i}.txt").write_text(f"text number {i}\n")
    monkeypatch.chdir(docs)
    argv = ["search", "text", "-c", str(cfg), "--embedder", "docs", "--corpus", "*.txt", "--no-store"]
    assert main(argv) == 0
    assert "embedding" not in capsys.readouterr().err  # not a TTY: no bar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(argv) == 0
    assert "localllm: embedding" in tty.getvalue() and "40" in tty.getvalue()


def test_route_calibrate_and_explain(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, endpoint)
    # --calibrate alone prints the bars chosen on the examples (leave-one-out over 4 examples)
    assert main(["route", "--calibrate", "--config", str(cfg), "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert (cal["in_scope"], cal["out_of_scope"], cal["target_precision"]) == (4, 4, 0.9)
    assert 0.0 <= cal["confident"] <= 1.0 and 0.0 <= cal["margin"] <= 1.0
    assert cal["bound_met"] is False and cal["needed"] == 29  # 4 decisions cannot bound 90%
    assert main(["route", "--calibrate", "--target-precision", "0.8", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["target_precision"] == 0.8
    # an exact example routes with the calibrated bars; --explain says why
    assert main(["route", "good morning", "--calibrate", "--explain", "--config", str(cfg)]) == 0
    text = capsys.readouterr()
    assert "router: {confident:" in text.out and "decided by: semantic" in text.out
    assert "add examples per intent" in text.err
    assert main(["route", "good morning", "--explain", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bars"]["source"] == "registry:all-minilm-l6-v2" or doc["bars"]["source"] == "default"
    assert doc["similarity"] == pytest.approx(1.0, abs=1e-4) and doc["reason"].startswith("similarity")
    # TEXT is required without --calibrate; a bad target is usage, not a traceback
    assert main(["route", "--config", str(cfg)]) == 2
    assert main(["route", "--calibrate", "--target-precision", "1.5", "--config", str(cfg)]) == 2


def test_bars_calibrated_from_the_config_warn_when_no_bound_holds(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # router: {calibrate: true} routes on the calibrated bars without --calibrate: a bar chosen on
    # the observed precision (4 decisions cannot bound 90%) is said so on every route, not only
    # when the calibration is printed
    cfg = _config(tmp_path, endpoint)
    cfg.write_text(cfg.read_text().replace("router: {embedder: docs}", "router: {embedder: docs, calibrate: true}"))
    assert main(["route", "good morning", "--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "promises nothing on new inputs" in err and "add examples per intent" in err
    assert main(["route", "good morning", "--config", str(cfg), "--json"]) == 0
    assert "promises nothing on new inputs" in capsys.readouterr().err


def test_the_unbounded_warning_does_not_blame_too_few_examples_when_there_are_enough() -> None:
    from localllm.cli.embed import _unbounded
    from localllm.embed.router import Calibration

    cal = Calibration(0.8, 0.01, 0.9, 0.95, False, 120, 120, 40, 37, 0.3, 0.81, 29)
    text = _unbounded(cal)
    assert "no bar reaches a 90% precision lower bound on 120 in-scope decisions" in text
    assert "needs about" not in text and "promises nothing on new inputs" in text
    few = _unbounded(Calibration(0.8, 0.01, 0.9, 0.95, False, 4, 4, 2, 2, 0.5, 0.22, 29))
    assert "needs about 29 correct decisions; these examples give 4" in few


def test_route_calibrate_on_held_out_cases(tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, endpoint)
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        '{"text": "hi friend", "intent": "greet"}\n'
        '{"text": "bye for now", "intent": "leave"}\n'
        '{"text": "what is the weather", "intent": "none_of_these"}\n'
        '{"text": "Good  morning", "intent": "greet"}\n'  # an example: dropped
        '{"text": "Hi friend ", "intent": "greet"}\n'  # line 1 again (case and spacing aside): counted once
    )
    argv = ["route", "--calibrate", "--cases", str(cases), "--config", str(cfg)]
    assert main([*argv, "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert (cal["source"], cal["cases"], cal["dropped_cases"], cal["duplicate_cases"]) == ("cases", 3, 1, 1)
    assert (cal["in_scope"], cal["out_of_scope"], cal["margin"]) == (2, 1, 0.0)
    assert cal["bound_met"] is False  # 3 cases cannot bound 90%
    assert main(argv) == 0
    text = capsys.readouterr()
    assert "# certified on 3 held-out cases" in text.out and "1 cases are examples" in text.out
    assert "# 1 cases repeat an earlier case" in text.out
    assert "held-out cases" in text.err and "promises nothing" in text.err
    # a bad line is a bad cases file (exit 2) named by file, line and key
    cases.write_text('{"text": "hi friend", "intent": "greet"}\n{"text": "x", "intent": "nope"}\n')
    assert main(argv) == 2
    assert f"{cases}: line 2.intent" in capsys.readouterr().err
    # as is one text under two intents, naming both lines
    cases.write_text('{"text": "hi friend", "intent": "greet"}\n{"text": "HI FRIEND", "intent": "leave"}\n')
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{cases}: line 2.intent" in err and "line 1" in err
    # a missing file is usage; --cases without --calibrate too
    assert main(["route", "--calibrate", "--cases", str(tmp_path / "none.jsonl"), "--config", str(cfg)]) == 2
    assert main(["route", "hi", "--cases", str(cases), "--config", str(cfg)]) == 2


def test_route_calibrates_on_the_configs_calibration_cases(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, endpoint)
    (cfg.parent / "cases.jsonl").write_text(
        '{"text": "hi friend", "intent": "greet"}\n{"text": "bye for now", "intent": "leave"}\n'
    )
    cfg.write_text(
        cfg.read_text().replace(
            "router: {embedder: docs}", "router: {embedder: docs, calibrate: true, calibration_cases: cases.jsonl}"
        )
    )
    assert main(["route", "hi friend", "--config", str(cfg), "--json"]) in (0, 1)
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert (cal["source"], cal["cases"], cal["in_scope"]) == ("cases", 2, 2)
