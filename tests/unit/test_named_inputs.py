"""Files a config or a trace names, and the values inside them, as an attacker writes them.

Each case broke before (found by an attack hunt, 2026-12-04): a named pipe as a schema,
evidence or examples file hung `localllm check` for ever; a prompt or cases file outside
the config directory was read; a gate named like a path made `eval` write (and replace)
reports outside ``--out``; numbers past the float range, lone surrogates and sidecars
outside the trace directory ended in tracebacks, a silent ``null`` or a report never written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from localllm._fs import Unreadable, read_capped
from localllm.errors import ConfigError, TraceError
from localllm.eval import load_cases
from localllm.eval.fromtrace import recorded_calls
from localllm.loading import load_config
from localllm.trace import TraceWriter
from localllm.trace.verify import verify_trace
from tests.conftest import in_child

SCHEMA = {"type": "object", "properties": {"q": {"enum": ["a", "b"]}}, "required": ["q"]}


def _config(tmp_path: Path, gate_extra: str = "", *, gate: str = "g", prompt: str = "hi {{ args.x }}") -> Path:
    (tmp_path / "schemas").mkdir(exist_ok=True)
    if not (tmp_path / "schemas" / "s.json").exists():
        (tmp_path / "schemas" / "s.json").write_text(json.dumps(SCHEMA))
    cfg = tmp_path / "localllm.yaml"
    cfg.write_text(
        "app_id: t\n"
        "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n"
        "embedders:\n  docs: {model: all-minilm-l6-v2}\n"
        f"gates:\n  {json.dumps(gate)}:\n    invoke: host.agent.decide\n    agent: agent.stub\n"
        f"    with: {{prompt: {json.dumps(prompt)}, schema: schemas/s.json}}\n{gate_extra}"
    )
    return cfg


def _problems(cfg: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    return {p.key: p.message for p in info.value.problems}


def test_a_named_pipe_is_refused_at_once_where_a_regular_file_is_required(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Unreadable, match="not a regular file"):
        read_capped(fifo, 100, regular=True)  # before: open() waited for a writer for ever


@pytest.mark.parametrize(
    ("where", "extra", "key"),
    [
        ("schemas/s.json", "", "gates.g.with.schema"),
        ("ev.json", "    selection: {evidence: ev.json}\n", "gates.g.selection.evidence"),
        (
            "c.jsonl",
            "    examples: {cases: c.jsonl, embedder: docs, input: x, answer: false}\n",
            "gates.g.examples.cases",
        ),
    ],
)
def test_a_named_pipe_named_by_the_config_is_a_problem_not_a_hang(
    tmp_path: Path, where: str, extra: str, key: str
) -> None:
    cfg = _config(tmp_path, extra)
    (tmp_path / where).unlink(missing_ok=True)
    os.mkfifo(tmp_path / where)
    found = in_child(
        f"""
        import json
        from localllm.errors import ConfigError
        from localllm.loading import load_config
        try:
            load_config({str(cfg)!r})
        except ConfigError as exc:
            print(json.dumps([p.key for p in exc.problems]))
        """,
        timeout=30,
    )
    assert key in found


def test_files_outside_the_config_directory_are_problems(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    inner = tmp_path / "cfg"
    inner.mkdir()
    cfg = _config(inner, prompt="../outside.txt")
    assert "gates.g.with.prompt" in _problems(cfg)  # before: the file was read and sent as the prompt
    cfg = _config(inner, "    examples: {cases: ../outside.txt, embedder: docs, input: x, answer: false}\n")
    assert "gates.g.examples.cases" in _problems(cfg)  # before: read (/etc/passwd too)


@pytest.mark.parametrize("name", ["a/b", "/tmp/victim", "..", ".", "a\\b"])
def test_a_gate_name_that_is_a_path_is_refused(tmp_path: Path, name: str) -> None:
    cfg = _config(tmp_path, gate=name)
    problems = _problems(cfg)
    assert any(k.startswith("gates") for k in problems), problems  # before: eval wrote to evals/<name>/…


def _cases(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_lone_surrogate_in_a_case_is_a_problem_at_load(tmp_path: Path) -> None:
    path = _cases(tmp_path, '{"id": "\\ud800", "args": {"x": "1"}, "expect": {"q": "a"}}')
    with pytest.raises(ConfigError) as info:
        load_cases(path)  # before: loaded, then every call ran and the report could not be written
    assert [p.key for p in info.value.problems] == ["line 1"]


def test_numbers_past_the_float_range_in_cases_are_compared_not_crashed_on(tmp_path: Path) -> None:
    big = "1" + "0" * 400
    with pytest.raises(ConfigError) as info:
        load_cases(_cases(tmp_path, f'{{"args": {{}}, "expect": {{"n": {{"number": {big}}}}}}}'))
    assert [p.key for p in info.value.problems] == ["line 1.expect.n"]  # before: OverflowError
    (case,) = load_cases(_cases(tmp_path, f'{{"args": {{}}, "expect": {{"n": {big}}}}}'))
    matcher = case.expect.fields["n"]
    assert matcher.matches(True, int(big)) and not matcher.matches(True, 1.0)  # before: OverflowError in _same


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, 1.0),
        (0.5, 0.5),
        (10**400, None),
        (-(10**400), None),
        (float("inf"), None),
        (float("nan"), None),
        (True, None),
        ("1", None),
        (None, None),
    ],
    ids=lambda value: repr(value)[:12],
)
def test_finite_float(value: Any, expected: float | None) -> None:
    from localllm.wire import finite_float

    assert finite_float(value) == expected


def test_a_schema_bound_past_the_float_range_is_refused_not_crashed_on(tmp_path: Path) -> None:
    from localllm.grammar.compile import compile_schema

    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10**400}}, "required": ["n"]}
    compiled = compile_schema(schema)  # before: OverflowError from math.isfinite
    assert [r.construct for r in compiled.refusals] == ["maximum"]  # a refusal, as for any bound too large


def _trace_with_sidecar(tmp_path: Path, response_file: str) -> Path:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as writer:
        start = {"verb": "decide", "agent": "agent.stub", "input": {"args": {"x": "1"}}}
        writer.append("agent.call.start", start, turn=1, state_path="s", call_id="c1")
        end = {"verb": "decide", "agent": "agent.stub", "duration_ms": 1, "response_file": response_file}
        writer.append("agent.call.complete", end, turn=1, state_path="s", call_id="c1")
    return path


def test_a_response_sidecar_outside_the_trace_directory_is_an_error_not_null(tmp_path: Path) -> None:
    (tmp_path / "agent-prompts").mkdir()
    (tmp_path / "secret.json").write_text('{"q": "a"}')
    inner = tmp_path / "tr"
    inner.mkdir()
    (inner / "agent-prompts").mkdir()
    (inner / "agent-prompts" / "r.json").symlink_to(tmp_path / "secret.json")
    trace = _trace_with_sidecar(inner, "agent-prompts/r.json")
    with pytest.raises(TraceError):
        recorded_calls(trace)  # before: the call's response was a silent None
    report = verify_trace(trace)
    assert not report.ok and any("symlink out of the trace directory" in p for p in report.problems)


def test_a_sidecar_symlink_loop_or_pipe_is_a_trace_error(tmp_path: Path) -> None:
    (tmp_path / "agent-prompts").mkdir()
    (tmp_path / "agent-prompts" / "loop").symlink_to("loop")
    with pytest.raises(TraceError):
        recorded_calls(_trace_with_sidecar(tmp_path, "agent-prompts/loop"))  # before: bare RuntimeError
    os.mkfifo(tmp_path / "agent-prompts" / "p.json")
    with pytest.raises(TraceError):
        recorded_calls(_trace_with_sidecar(tmp_path, "agent-prompts/p.json"))  # before: hung reading it


def test_verify_of_a_trace_without_events_counts_zero(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    TraceWriter.open(path).close()
    assert verify_trace(path).to_json()["events"] == 0  # before: None (an empty Trace is falsy)


@pytest.mark.parametrize("properties", [[1, 2], "ab"], ids=["list", "string"])
def test_a_schema_that_is_not_json_schema_is_a_load_problem(tmp_path: Path, properties: Any) -> None:
    cfg = _config(tmp_path, "    examples: {cases: c.jsonl, embedder: docs, input: x, answer: false}\n")
    (tmp_path / "c.jsonl").write_text('{"args": {"x": "1"}, "expect": {"q": "a"}}\n')
    (tmp_path / "schemas" / "s.json").write_text(json.dumps({"type": "object", "properties": properties}))
    assert "gates.g.with.schema" in _problems(cfg)  # before: TypeError/ValueError out of the examples check


def test_a_schema_that_is_not_json_schema_is_a_schema_error_at_call_time(tmp_path: Path) -> None:
    from localllm.errors import SchemaError
    from localllm.runtime import Runtime

    config = load_config(_config(tmp_path))
    with Runtime(config) as rt:
        rt.register_inprocess("agent.stub", lambda _: {"q": "a"})
        with pytest.raises(SchemaError):  # before: jsonschema's AttributeError mid-validation
            rt.call("decide", agent="agent.stub", prompt="p", schema={"type": "object", "properties": [1, 2]})


@pytest.mark.parametrize("name", ["enum", "const", "default", "examples"])
def test_a_ref_under_a_property_named_like_a_data_keyword_is_checked_at_load(tmp_path: Path, name: str) -> None:
    cfg = _config(tmp_path)
    schema = {"type": "object", "properties": {name: {"$ref": "../../../../etc/passwd"}}}
    (tmp_path / "schemas" / "s.json").write_text(json.dumps(schema))
    assert "gates.g.with.schema" in _problems(cfg)  # before: check said ok, the call failed


def _one_call_trace(tmp_path: Path, args: dict[str, Any], submission: Any) -> Path:
    path = tmp_path / "t.jsonl"
    with TraceWriter.open(path) as writer:
        start = {"verb": "decide", "agent": "agent.x", "input": {"args": args}}
        writer.append("agent.call.start", start, turn=1, call_id="c1", state_path="g")
        end = {"agent": "agent.x", "response": {"submission": submission}}
        writer.append("agent.call.complete", end, turn=1, call_id="c1", state_path="g")
    return path


def test_a_cassette_from_a_trace_replays_a_call_whose_argument_is_named_verb(tmp_path: Path) -> None:
    from localllm.agents.cassette import CassetteAgent
    from localllm.cli import main
    from localllm.wire import AskRequest

    args = {"verb": "urgent", "ticket": "x"}
    trace = _one_call_trace(tmp_path, args, {"v": "ok"})
    assert main(["trace", "cassette", str(trace), "--app-id", "a", "-o", str(tmp_path / "c.yaml")]) == 0
    agent = CassetteAgent(tmp_path / "c.yaml", alias="agent.x")
    request = AskRequest("s", 1, "g", "decide", "p", "cid", "2030-01-01T00:00:00Z", with_={"args": args})
    answer = agent.ask(request, deadline=float("inf")).submission
    assert answer is not None and json.loads(answer) == {"v": "ok"}  # before: no episode


def test_a_cassette_too_deep_for_yaml_is_an_error_naming_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from localllm.cli import main

    deep = "[" * 400 + "]" * 400  # readable (a trace from another writer), too deep for the YAML emitter
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"kind":"session.header","schema_version":1,"written_at":"2026-01-01T00:00:00Z"}\n'
        '{"turn":1,"seq":0,"ts":"2026-01-01T00:00:00Z","kind":"agent.call.start","call_id":"c1",'
        f'"payload":{{"verb":"decide","agent":"a","input":{{"args":{{"a":{deep}}}}}}}}}\n'
        '{"turn":1,"seq":1,"ts":"2026-01-01T00:00:00Z","kind":"agent.call.complete","call_id":"c1",'
        '"payload":{"agent":"a","response":{"submission":{"v":1}}}}\n'
    )
    assert main(["trace", "cassette", str(trace), "--app-id", "a"]) == 1  # before: RecursionError, "a bug"
    assert "--json" in capsys.readouterr().err
    assert main(["trace", "cassette", str(trace), "--app-id", "a", "--json"]) == 0
