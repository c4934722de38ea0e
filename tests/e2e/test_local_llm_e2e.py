"""builtin.local_llm end to end: the real source-built llama-server and the real gemma-3-270m GGUF."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from localllm.cli import main
from localllm.errors import AgentError, ErrorKind
from localllm.loading import load_config
from localllm.managed.server import ManagedServer
from localllm.runtime import Runtime
from localllm.trace import read_trace
from tests.conftest import REPO
from tests.unit.fakes.fake_claude import install

pytestmark = pytest.mark.e2e

DEMO = REPO / "examples" / "demo"


@pytest.fixture
def demo(tmp_path: Path, managed_env: Path) -> Path:
    """A copy of the demo config (managed gemma-3-270m through the mirror)."""
    target = tmp_path / "demo"
    shutil.copytree(DEMO, target, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return target / "config.yaml"


def sidecar_pids() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True) if p.name().startswith("llama-server")]


def test_decide_gate_is_schema_valid_and_grammar_constrained(demo: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with Runtime(load_config(demo), trace=trace) as rt:
        result = rt.run_gate("triage", {"ticket": "The app crashes when I click save."})
    assert result.submission["queue"] in ("billing", "bug", "feature", "other")
    assert 1 <= result.submission["priority"] <= 5
    assert 1 <= len(result.submission["summary"]) <= 80
    assert result.meta["grammar_source"] == "compiled" and result.agent == "agent.local"
    assert result.meta["grammar_enforced"] is True  # the real server passed the start-up canary
    assert result.meta["completion_tokens"] > 0
    assert result.meta["prompt_n"] + result.meta["cache_n"] >= result.meta["prompt_tokens"] - 1
    assert main(["trace", "verify", str(trace)]) == 0
    done = read_trace(trace).events[-1]
    transcript = tmp_path / done.payload["transcript_ref"]["path"]
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["request", "assistant", "result"]
    assert json.loads(lines[2]["result"]) == result.submission
    assert sidecar_pids() == []  # the sidecar is stopped with the runtime


def test_a_decide_schema_split_over_files_gets_the_compiled_grammar(demo: Path) -> None:
    """The demo's triage schema with its queue and priority in a file of shared definitions, in
    a directory with a space: the agent is sent one document and the real server decodes under
    the compiled grammar (before: refused at load as outside the grammar subset)."""
    schemas = demo.parent / "schemas"
    triage = json.loads((schemas / "triage.json").read_text())
    shared = {"$defs": {"queue": triage["properties"]["queue"], "priority": triage["properties"]["priority"]}}
    (demo.parent / "shared defs").mkdir()
    (demo.parent / "shared defs" / "ticket fields.json").write_text(json.dumps(shared))
    triage["properties"]["queue"] = {"$ref": "../shared%20defs/ticket%20fields.json#/$defs/queue"}
    triage["properties"]["priority"] = {"$ref": "../shared%20defs/ticket%20fields.json#/$defs/priority"}
    (schemas / "triage.json").write_text(json.dumps(triage))
    assert main(["check", str(demo)]) == 0
    with Runtime(load_config(demo)) as rt:
        result = rt.run_gate("triage", {"ticket": "I was charged twice this month."})
    assert result.agent == "agent.local" and result.meta["grammar_source"] == "compiled"
    assert result.submission["queue"] in ("billing", "bug", "feature", "other")
    assert 1 <= result.submission["priority"] <= 5


def test_check_rejects_out_of_subset_gate_naming_the_construct(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = demo.parent / "schemas" / "tags.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            }
        )
    )
    text = demo.read_text().replace("schema: schemas/triage.json", "schema: schemas/tags.json")
    demo.write_text(text)
    assert main(["check", str(demo)]) == 2
    err = capsys.readouterr().err
    assert 'agent "agent.local" is builtin.local_llm with grammar: true' in err
    assert '"uniqueItems"' in err and "$.properties.tags" in err


def test_forced_validation_failure_falls_back_to_claude(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step the grammar does not enforce: the answer fails validation.

    A decimal step whose digits (75) are above 32 is refused and relaxed away (the bound stays
    in the grammar); minimum + multipleOf, so that copying a number out of the schema statement
    fails too. (An integer step beside a minimum, 7 from 10000.5 until session 29, compiles now.)
    """
    claude = install(tmp_path / "bin")
    monkeypatch.setenv("LOCALLLM_CLAUDE_BIN", str(claude))
    monkeypatch.setenv("FAKE_CLAUDE_RESULT", '{"amount": 10001.25}')
    schema = {
        "type": "object",
        "properties": {"amount": {"type": "number", "minimum": 10000.6, "multipleOf": 0.75}},
        "required": ["amount"],
    }
    trace = tmp_path / "trace.jsonl"
    with Runtime(load_config(demo), trace=trace) as rt:
        result = rt.call(
            "decide",
            agent="agent.local",
            schema=schema,
            prompt="How many apples are in a bag of 7 apples? Answer with the number 7.",
        )
    assert result.agent == "agent.claude"
    assert result.submission == {"amount": 10001.25}
    assert result.meta["fallback_of"] == "agent.local"
    events = read_trace(trace).events
    assert [e.kind for e in events] == ["agent.call.start", "agent.call.complete"]
    done = events[1].payload
    assert done["substitution"] == {
        "reason": "schema_invalid",
        "original_plugin": "agent.local",
        "fallback_plugin": "agent.claude",
    }
    assert done["original_transcript_ref"]["format"] == "openai-chat"
    assert done["transcript_ref"]["format"] == "claude-stream-json"
    assert main(["trace", "verify", str(trace)]) == 0


def test_unique_strings_get_the_relaxed_grammar_on_the_real_server(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unique strings: no exact grammar and none of llama.cpp's, so the schema without
    uniqueItems constrains the answer (before: nothing did) and validation checks the rest."""
    from localllm.grammar.relax import relax
    from localllm.grammar.walk import Grammar

    claude = install(tmp_path / "bin")
    monkeypatch.setenv("LOCALLLM_CLAUDE_BIN", str(claude))
    monkeypatch.setenv("FAKE_CLAUDE_RESULT", '{"tags": ["crash"], "severity": 5}')
    tags = {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3, "uniqueItems": True}
    schema = {
        "type": "object",
        "properties": {"tags": tags, "severity": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["tags", "severity"],
    }
    trace = tmp_path / "trace.jsonl"
    with Runtime(load_config(demo), trace=trace) as rt:
        result = rt.call(
            "extract", agent="agent.local", schema=schema, prompt="Tag this ticket: the app crashes on save."
        )
        decl = rt.agent("agent.local").decl  # type: ignore[attr-defined]
    done = read_trace(trace).events[-1].payload
    local = done.get("original_transcript_ref") or done["transcript_ref"]  # fell back or not
    lines = [json.loads(line) for line in (tmp_path / local["path"]).read_text().splitlines()]
    content = lines[1]["message"]["content"]
    relaxed = relax(schema, space=not decl.compact, open_objects=decl.open_objects)
    assert relaxed is not None and Grammar.parse(relaxed.compiled.grammar or "").matches(content), content
    value = json.loads(content)  # the real engine held the answer to the relaxed schema
    assert set(value) == {"tags", "severity"} and 1 <= value["severity"] <= 5
    assert len(value["tags"]) <= 3 and all(isinstance(t, str) and len(t) <= 12 for t in value["tags"])
    if result.agent == "agent.local":  # distinct tags: valid
        assert result.meta["grammar_source"] == "relaxed"
        assert result.meta["grammar_relaxed"] == ["$.properties.tags uniqueItems"]
    else:  # a repeated tag: the validation the relaxed grammar leaves it to
        assert len(set(value["tags"])) < len(value["tags"]) and result.meta["fallback_of"] == "agent.local"


def test_killed_sidecar_is_respawned_between_calls(demo: Path) -> None:
    with Runtime(load_config(demo)) as rt:
        assert rt.run_gate("triage", {"ticket": "Please add dark mode."}).ok
        [pid] = sidecar_pids()
        psutil.Process(pid).kill()
        psutil.Process(pid).wait(5)
        result = rt.run_gate("triage", {"ticket": "Please add dark mode."})
        assert result.ok
        assert sidecar_pids() not in ([], [pid])


@pytest.fixture
def keyed_endpoint(server_bin: Path, chat_gguf: Path) -> Iterator[str]:
    sidecar = ManagedServer(server_bin, chat_gguf, parallel=1, ctx_per_slot=1024, api_key="e2e-key-42", name="keyed")
    try:
        yield sidecar.ensure_ready()
    finally:
        sidecar.stop()


def endpoint_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "endpoint.yaml"
    path.write_text(
        f"agent_plugins:\n  agent.remote: {{plugin: builtin.local_llm, endpoint: '{url}', "
        "api_key_env: E2E_KEY, max_tokens: 48}\n"
    )
    return path


def test_endpoint_mode_with_api_key(tmp_path: Path, keyed_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    monkeypatch.setenv("E2E_KEY", "e2e-key-42")
    with Runtime(load_config(endpoint_config(tmp_path, keyed_endpoint))) as rt:
        result = rt.call("decide", agent="agent.remote", prompt="Is water wet?", schema=schema)
    assert isinstance(result.submission["ok"], bool)
    # §9 in endpoint mode: grammar: true is response_format json_schema (no probe, no compiled grammar)
    assert result.meta["grammar"] is True and result.meta["grammar_source"] == "server"
    assert result.meta["structured_output"] == "json_schema"


def test_endpoint_mode_fails_cleanly_without_key(
    tmp_path: Path, keyed_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(endpoint_config(tmp_path, keyed_endpoint))
    with Runtime(config) as rt:
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.remote", prompt="hi")
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR and "E2E_KEY is not set" in info.value.detail
        monkeypatch.setenv("E2E_KEY", "not-the-key")
        started = time.monotonic()
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.remote", prompt="hi")
    assert "HTTP 401" in info.value.detail and "not-the-key" not in info.value.detail
    assert time.monotonic() - started < 30


def test_a_prompt_past_the_context_is_refused_before_the_server_tokenizes_it(demo: Path) -> None:
    """80 KB of ``"a\\n"`` (80,000 pieces at gemma-3's newline token) held the pinned server 13 s
    before its "exceeds the context" 400; the agent counts them with the model's vocabulary first."""
    with Runtime(load_config(demo)) as rt:
        with pytest.raises(AgentError) as caught:
            rt.call("ask", agent="agent.local", prompt="a\n" * 40_000, timeout=60)
        fits = rt.call("ask", agent="agent.local", prompt="a\n" * 300 + "Say hi.", timeout=60)
    meta = caught.value.meta or {}
    assert caught.value.kind == ErrorKind.TRANSPORT_ERROR
    assert meta["prompt_tokens_at_least"] > meta["context"]
    assert fits.submission
