"""Attacks on "is the answer right": confidence, its calibration on eval evidence, and the
cascade that trusts it. Each test is a reproducer of a defect found by hunting for one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localllm import load_config
from localllm.eval import evaluate
from localllm.runtime import Runtime
from localllm.wire import AskRequest, AskResponse

SCHEMA = {"type": "object", "properties": {"queue": {"enum": ["billing", "bug"]}}, "required": ["queue"]}
CONFIG = """\
app_id: attacks
agent_plugins:
  agent.local: {plugin: builtin.inprocess}
  agent.claude: {plugin: builtin.inprocess}
gates:
  queue:
    invoke: host.agent.decide
    agent: agent.local
    with:
      prompt: "Ticket: {{ args.ticket }}"
      schema: schema.json
      args: {ticket: "{{ args.ticket }}"}
"""


def app(tmp_path: Path, cases: list[dict[str, Any]]) -> Path:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "app.yaml").write_text(CONFIG)
    (tmp_path / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    return tmp_path


def number(request: AskRequest) -> int:
    return int(str((request.with_ or {})["args"]["ticket"])[1:])


def run_eval(root: Path, local: Any, claude: Any) -> dict[str, Any]:
    def prepare(rt: Runtime) -> None:
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)

    config = load_config(root / "app.yaml")
    result = evaluate(
        config, "queue", agents=["agent.local", "agent.claude"], cases_path=root / "cases.jsonl", prepare=prepare
    )
    return result.report


def with_evidence(root: Path, report: dict[str, Any], min_precision: float) -> None:
    latest = root / "evals" / "reports" / "queue" / "latest.json"
    assert json.loads(latest.read_text())["created"] == report["created"]
    text = (root / "app.yaml").read_text()
    (root / "app.yaml").write_text(
        text + f"    selection: {{min_precision: {min_precision}, evidence: {latest.relative_to(root)}}}\n"
    )


def test_a_fallbacks_answer_is_not_calibration_evidence_of_the_local_tier(tmp_path: Path) -> None:
    """The local model answers 1 case in 10 (confidently, wrongly); the other 9 fail the schema and
    its fallback answers them, rightly and with a confidence of its own. Before: those 180 were
    counted as the local tier's right answers at 0.99 (precision 0.9 at 0.99), a min_precision
    0.8 gate accepted every local answer, and all 20 it kept were wrong."""
    root = app(
        tmp_path,
        [{"id": f"c{i:03}", "args": {"ticket": f"t{i}"}, "expect": {"queue": "bug"}} for i in range(200)],
    )

    def local(request: AskRequest) -> AskResponse:
        if number(request) % 10 == 0:
            return AskResponse.of({"queue": "billing"}, meta={"confidence": 0.99})  # valid, sure, wrong
        return AskResponse.of({"queue": "nope"}, meta={"confidence": 0.99})  # schema_invalid: falls back

    def claude(_: AskRequest) -> AskResponse:
        return AskResponse.of({"queue": "bug"}, meta={"confidence": 0.99})

    report = run_eval(root, local, claude)
    tier = report["calibration"]["tiers"]["agent.local"]
    assert tier["scored"] == 20  # only the local model's own answers
    assert tier["calibration"]["correct"] == [False] * len(tier["calibration"]["scores"])
    fell_back = [r for r in report["calls"] if r["agent"] == "agent.local" and r["fallback"]]
    assert len(fell_back) == 180 and {r["confidence"] for r in fell_back} == {None}
    assert report["agents"]["agent.local"]["accuracy"] == 0.9  # the answers themselves still count
    with_evidence(root, report, 0.8)
    with Runtime(load_config(root / "app.yaml")) as rt:
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        answers = [rt.run_gate("queue", {"ticket": f"t{i}"}) for i in range(0, 200, 10)]
    assert [a.agent for a in answers] == ["agent.claude"] * 20
    assert answers[0].meta["selected_by"]["tiers"] == ["agent.claude"]


def test_unlabelled_cases_do_not_calibrate_a_threshold(tmp_path: Path) -> None:
    """`trace cases` writes the recorded answers as `"labelled": false` cases. Before: a model
    agreeing with its own recorded answers calibrated a 0.9 threshold from 200 unchecked cases."""
    rows = [
        {"id": f"c{i:03}", "args": {"ticket": f"t{i}"}, "expect": {"queue": "bug"}, "labelled": False}
        for i in range(200)
    ]
    rows += [{"id": f"any{i}", "args": {"ticket": f"t{i}"}, "expect": {}} for i in range(3)]  # checks nothing
    root = app(tmp_path, rows)

    def local(_: AskRequest) -> AskResponse:
        return AskResponse.of({"queue": "bug"}, meta={"confidence": 0.97})

    report = run_eval(root, local, lambda _: AskResponse.of({"queue": "bug"}))
    tier = report["calibration"]["tiers"]["agent.local"]
    assert (tier["calls"], tier["scored"], tier["calibration"]["scores"]) == (0, 0, [])
    assert (report["unlabelled_cases"], report["calibration_cases"]) == (200, 0)
    assert tier["targets"]["0.9"]["threshold"]["value"] is None
    assert report["decision"]["0.9"]["cases"] == 0
    assert report["agents"]["agent.local"]["calls"] == 203  # still run and counted


def test_a_case_pasted_twice_is_one_answer_of_evidence(tmp_path: Path) -> None:
    """29 tickets, each pasted twice: 58 lines. Before: each answer counted twice, the
    calibration half held 29 of them, all right, exactly what a 0.9 bound needs (0.05 ** (1/29)
    = 0.902), and 0.97 was certified on what is ~15 independent answers (a bound of 0.82)."""
    rows = [{"args": {"ticket": f"t{i}"}, "expect": {"queue": "bug"}} for i in range(29)]
    root = app(tmp_path, rows + rows)

    def local(_: AskRequest) -> AskResponse:
        return AskResponse.of({"queue": "bug"}, meta={"confidence": 0.97})

    report = run_eval(root, local, lambda _: AskResponse.of({"queue": "bug"}))
    assert (report["cases"], report["duplicate_cases"], report["duplicate_lines"]) == (29, 29, list(range(30, 59)))
    tier = report["calibration"]["tiers"]["agent.local"]
    assert (tier["calls"], report["calibration_cases"], len(tier["calibration"]["scores"])) == (29, 29, 15)
    assert tier["targets"]["0.9"]["threshold"]["value"] is None  # 15 right answers bound nothing at 0.9


@pytest.mark.parametrize("reported", [97, 1.5, -0.2, True, 10**400])
def test_a_confidence_outside_0_1_is_not_calibrated_at_run_time(tmp_path: Path, reported: Any) -> None:
    """The evidence scores only confidences in [0, 1]. Before: a plugin reporting 97 (a percent)
    cleared a 0.97 threshold at run time, and its wrong answer was kept."""
    root = app(
        tmp_path, [{"id": f"c{i:03}", "args": {"ticket": f"t{i}"}, "expect": {"queue": "bug"}} for i in range(200)]
    )
    report = run_eval(
        root,
        lambda _: AskResponse.of({"queue": "bug"}, meta={"confidence": 0.97}),
        lambda _: AskResponse.of({"queue": "bug"}),
    )
    with_evidence(root, report, 0.9)
    with Runtime(load_config(root / "app.yaml")) as rt:
        rt.register_inprocess(
            "agent.local",
            lambda _: AskResponse.of({"queue": "billing"}, meta={"confidence": reported}),
            local_model=True,
        )
        rt.register_inprocess("agent.claude", lambda _: AskResponse.of({"queue": "bug"}))
        result = rt.run_gate("queue", {"ticket": "t1"})
    step = result.meta["cascade"][0]
    assert step["threshold"] == 0.97
    assert (step["confidence"], step["accepted"], step["reason"]) == (None, False, "no_confidence")
    assert (result.agent, result.submission) == ("agent.claude", {"queue": "bug"})


def test_cases_hold_any_text_dump_case_writes_and_a_bom_and_crlf(tmp_path: Path) -> None:
    """Before: str.splitlines() broke a case at a raw U+2028 / U+2029 / U+0085 (JSON strings hold
    them raw; dump_case, so `trace cases`, writes them raw), so cases localllm wrote could not be
    read back (6 "not JSON" problems, lines 1–6 of a 4-line file); a BOM failed line 1."""
    from localllm.errors import ConfigError
    from localllm.eval.cases import dump_case, load_cases

    texts = ["one\u2028two", "para\u2029graph", "caf\x85e", "tab\tand\x1cfs"]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(dump_case(f"c{i}", {"ticket": t}, {"queue": "bug"}) + "\n" for i, t in enumerate(texts)))
    assert [(c.id, c.args["ticket"], c.line) for c in load_cases(path)] == [
        (f"c{i}", t, i + 1) for i, t in enumerate(texts)
    ]
    rows = [json.dumps({"id": "a", "args": {"ticket": "x\u2028y"}, "expect": {"queue": "bug"}}), "{", ""]
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode("utf-8"))
    with pytest.raises(ConfigError) as info:
        load_cases(path)
    assert [p.key for p in info.value.problems] == ["line 2"]  # only the truncated line, named rightly
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join([rows[0], rows[0].replace('"a"', '"b"'), ""]).encode("utf-8"))
    assert [(c.id, c.args["ticket"]) for c in load_cases(path)] == [("a", "x\u2028y"), ("b", "x\u2028y")]


@pytest.mark.parametrize("out_of_scope", [None, "oos"])
def test_the_novelty_bar_of_a_large_examples_file_is_computed_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch, out_of_scope: str | None
) -> None:
    """Before: the bar built the whole examples × examples similarity matrix (float32, its float64
    copy and two masks): 20,000 examples peaked at 4.7 GiB, 50,000 would need ~29 GiB. Now a
    block of rows at a time, with the same bar."""
    import tracemalloc

    import numpy as np

    from localllm.embed import examples as module
    from localllm.embed.examples import Example, ExampleSet

    n = 2000
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((n, 16)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    labels = [("oos" if i % 10 == 0 and out_of_scope else f"q{i % 7}") for i in range(n)]

    def bar(cells: int) -> tuple[float, int, int]:
        monkeypatch.setattr(module, "_SIMILARITY_CELLS", cells, raising=False)
        found = ExampleSet([Example(f"e{i}", f"text {i % 1990}", {"queue": q}) for i, q in enumerate(labels)], None)  # type: ignore[arg-type]
        found._matrix = matrix  # the vectors, as the store would give them
        tracemalloc.start()
        try:
            result = found.novelty_bar(["queue"], out_of_scope)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return result.value, result.n, peak

    whole = bar(1 << 40)  # one block: the whole matrix
    value, count, peak = bar(1 << 15)
    assert (value, count) == pytest.approx(whole[:2])
    assert peak < 4 * 1024 * 1024  # the whole matrix: 2000² cells × ~14 bytes ≈ 56 MB


def test_a_choice_behind_anyof_oneof_or_allof_is_measured() -> None:
    """pydantic writes `Optional[Priority]` as `anyOf: [{$ref}, {type: null}]`, an enum with a
    description as `allOf: [{$ref}]` and an optional sub-model as `anyOf: [{$ref: Sub}, {type: null}]`.
    Before: every such field was skipped, so a 50/50 priority left the answer's confidence at the
    queue's 0.99 (and a schema of optional enums only measured nothing: `no_choice_fields`)."""
    import math

    from localllm.agents.confidence import Token, alternatives, has_choice_fields, measure

    schema: dict[str, Any] = {
        "$defs": {
            "Priority": {"enum": ["low", "high"], "type": "string"},
            "Sub": {"type": "object", "properties": {"ok": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}},
        },
        "type": "object",
        "properties": {
            "queue": {"allOf": [{"$ref": "#/$defs/Queue"}], "description": "where it goes"},
            "priority": {"anyOf": [{"$ref": "#/$defs/Priority"}, {"type": "null"}], "default": None},
            "sub": {"anyOf": [{"$ref": "#/$defs/Sub"}, {"type": "null"}]},
            "stars": {"oneOf": [{"type": ["integer", "null"], "minimum": 1, "maximum": 3}, {"const": 5}]},
        },
    }
    schema["$defs"]["Queue"] = {"enum": ["billing", "bug"]}
    props = schema["properties"]
    assert alternatives(props["priority"], schema) == ('"low"', '"high"', "null")
    assert alternatives(props["queue"], schema) == ('"billing"', '"bug"')
    assert alternatives(props["stars"], schema) == ("1", "2", "3", "null", "5")
    only_optional = {"$defs": schema["$defs"], "properties": {"priority": props["priority"]}}
    assert has_choice_fields(only_optional)

    def token(text: str, p: float, *others: tuple[str, float]) -> Token:
        return Token(text.encode(), math.log(p), tuple((o.encode(), math.log(q)) for o, q in others))

    content = '{"queue":"bug","priority":"high","sub":{"ok":true},"stars":2}'
    tokens = [
        token('{"queue":"', 1.0),
        token("bug", 0.99, ("billing", 0.01)),
        token('","priority":"', 0.5, ('","priority":null', 0.5)),  # "high", or as likely null
        token("high", 0.5, ("low", 0.5)),
        token('","sub":{"ok":', 1.0),
        token("true", 0.8, ("false", 0.2)),
        token('},"stars":', 1.0),
        token("2", 0.5, ("1", 0.25), ("3", 0.25)),
        token("}", 1.0),
    ]
    got = measure(schema, content, tokens)
    assert got.fields == pytest.approx({"queue": 0.99, "priority": 0.25, "sub.ok": 0.8, "stars": 0.5})
    assert got.value == pytest.approx(0.99 * 0.25 * 0.8 * 0.5)


def test_examples_evidence_is_stale_when_the_embedders_weights_change(tmp_path: Path) -> None:
    """The examples tier's confidences and out-of-scope bar are similarities between the
    embedder's vectors. Before: a GGUF replaced at the embedder's `model:` path left the
    evidence fresh, so thresholds measured on the old model's similarities kept answering."""
    from localllm.selection import fingerprint, staleness

    root = app(tmp_path, [{"id": "a", "args": {"ticket": "x"}, "expect": {"queue": "bug"}}])
    (root / "emb.gguf").write_bytes(b"GGUF one model")
    (root / "app.yaml").write_text(
        CONFIG.replace("gates:", "embedders:\n  e: {model: emb.gguf}\ngates:")
        + "    examples: {cases: cases.jsonl, embedder: e, input: ticket}\n"
    )
    config = load_config(root / "app.yaml")
    report = {"fingerprint": fingerprint(config, config.gates["queue"], ["agent.local"])}
    assert staleness(config, config.gates["queue"], report)[""] == []
    (root / "emb.gguf").write_bytes(b"GGUF another model")
    config = load_config(root / "app.yaml")
    assert staleness(config, config.gates["queue"], report)[""] == ["the examples (file, settings or embedder) changed"]


def test_fail_under_judges_a_local_models_own_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI gates a pin bump with `eval --cassette agent.claude=… --fail-under 0.9`. Before: an
    endpoint answering prose to every case (5 of 5 schema_invalid, the cassette answering each
    fallback) scored accuracy 1.0 and the gate passed (exit 0)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from localllm.cli import main

    class Prose(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.dumps({"choices": [{"message": {"content": "It is a bug."}, "finish_reason": "stop"}]})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Prose)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        root = app(
            tmp_path, [{"id": f"c{i}", "args": {"ticket": f"t{i}"}, "expect": {"queue": "bug"}} for i in range(5)]
        )
        endpoint = f"http://127.0.0.1:{server.server_port}/v1"
        (root / "app.yaml").write_text(
            CONFIG.replace(
                "agent.local: {plugin: builtin.inprocess}",
                f"agent.local: {{plugin: builtin.local_llm, endpoint: '{endpoint}', model: m}}",
            )
        )
        with Runtime(load_config(root / "app.yaml"), trace=root / "rec.jsonl") as rt:
            rt.register_inprocess("agent.claude", lambda _: AskResponse.of({"queue": "bug"}))
            for i in range(5):
                rt.run_gate("queue", {"ticket": f"t{i}"}, agent="agent.claude")
        cassette = root / "claude.yaml"
        assert main(["trace", "cassette", str(root / "rec.jsonl"), "--agent", "agent.claude", "-o", str(cassette)]) == 0
        monkeypatch.chdir(root)
        argv = ["eval", "queue", "-c", str(root / "app.yaml"), "--cases", str(root / "cases.jsonl")]
        argv += ["--agents", "agent.local", "--cassette", f"agent.claude={cassette}", "--json"]
        assert main([*argv, "--fail-under", "0.9"]) == 1
        report = json.loads((root / "evals" / "reports" / "queue" / "latest.json").read_text())
        local = report["agents"]["agent.local"]
        assert (local["accuracy"], local["first_try_accuracy"], local["fallbacks"]) == (1.0, 0.0, 5)
        assert main([*argv, "--fail-under", "0"]) == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_leave_one_out_skips_an_example_that_differs_only_in_case_space_or_unicode_form(tmp_path: Path) -> None:
    """Before: a cases file holding the examples capitalised, padded with spaces or in NFD was
    answered from each case's own example (the embedder sees them alike: similarity 1.0), so
    the eval measured the examples tier at confidence 1.0 on 8 of 9 cases instead of 0.47–0.82."""
    import unicodedata

    from tests.unit.test_examples_tier import CONFIG as EXAMPLES_CONFIG
    from tests.unit.test_examples_tier import EXAMPLES, WordsEmbedder, write_examples

    (tmp_path / "schema.json").write_text(
        json.dumps(
            {"type": "object", "properties": {"queue": {"enum": ["billing", "bug", "feature"]}}, "required": ["queue"]}
        )
    )
    (tmp_path / "app.yaml").write_text(EXAMPLES_CONFIG)
    write_examples(tmp_path / "examples.jsonl", EXAMPLES)

    def confidences(cases: list[tuple[str, str, str]]) -> list[float]:
        path = tmp_path / "cases.jsonl"
        path.write_text(
            "".join(json.dumps({"id": i, "args": {"ticket": t}, "expect": {"queue": q}}) + "\n" for i, t, q in cases)
        )

        def prepare(rt: Runtime) -> None:
            rt.register_embedder("words", WordsEmbedder())

        report = evaluate(
            load_config(tmp_path / "app.yaml"), "queue", agents=["examples"], cases_path=path, prepare=prepare
        ).report
        return [row["confidence"] for row in report["calls"]]

    exact = confidences(EXAMPLES)
    assert max(exact) < 0.9  # never its own label
    variants = [(i, unicodedata.normalize("NFD", f"  {t.upper()}\u00a0\t"), q) for i, t, q in EXAMPLES]
    assert confidences(variants) == exact


def test_score_refuses_tokens_that_do_not_spell_the_forced_alternative() -> None:
    """`confidence: score` forces each alternative with a `grammar`; a server that ignores the
    key (vLLM, OpenAI) continues the prefill freely. Before: those tokens' probabilities were
    summed as the alternative's: 0.5 from identical continuations, 0.99 when the `"billing"`
    request's free tokens spelled `"bug"` unlikely."""
    import math

    from localllm.agents.confidence import SCORE, UNMATCHED, Token, score_alternatives

    content = '{"queue":"bug"}'

    def forced(_: str, alt: str) -> list[Token]:
        return [Token(alt.encode(), math.log(0.9 if alt == '"bug"' else 0.1)), Token(b"}", 0.0)]

    def ignored(_: str, alt: str) -> list[Token]:
        return [Token(b'"b', math.log(0.9 if alt == '"bug"' else 0.01)), Token(b'ug"', math.log(0.5))]

    good = score_alternatives(SCHEMA, content, forced)
    assert (good.method, good.value) == (SCORE, pytest.approx(0.9))
    bad = score_alternatives(SCHEMA, content, ignored)
    assert (bad.method, bad.value, bad.fields) == (UNMATCHED, None, {})


def test_recursive_and_shared_unions_are_worked_out_once() -> None:
    """A choice behind `anyOf` is looked for through `$ref`s: `A: {anyOf: [A, A, null]}` would
    take 2**32 steps, a chain of `$defs` each naming the next twice 2**depth, without a memo
    and a guard against a node met again on its own path (in a child with a deadline)."""
    from tests.conftest import in_child

    got = in_child(
        """
        import json
        from localllm.agents.confidence import alternatives, has_choice_fields, subschema
        cycle = {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}, {"type": "null"}]}},
                 "properties": {"x": {"$ref": "#/$defs/A"}}}
        defs = {f"L{i}": {"anyOf": [{"$ref": f"#/$defs/L{i + 1}"}, {"allOf": [{"$ref": f"#/$defs/L{i + 1}"}]}]}
                for i in range(14)}
        defs["L14"] = {"properties": {"q": {"enum": ["a", "b"]}}}
        chain = {"$defs": defs, "properties": {"x": {"$ref": "#/$defs/L0"}}}
        print(json.dumps([
            has_choice_fields(cycle), alternatives(subschema(cycle, ("x",)), cycle),
            has_choice_fields(chain), alternatives(subschema(chain, ("x", "q")), chain),
        ]))
        """,
        timeout=20,
    )
    assert got == [False, None, True, ['"a"', '"b"']]


def test_a_transcript_line_holding_a_raw_line_separator_stays_one_event(tmp_path: Path) -> None:
    """`trace cassette` / `trace cases` read a call's transcript one event per line. Before: a
    claude or llama-server line holding a raw U+2028 (their JSON encoders leave it raw) became
    two broken events, and the timings, now one short, were dropped."""
    from localllm.eval.fromtrace import _transcript

    (tmp_path / "transcripts").mkdir()
    lines = [
        json.dumps({"type": "assistant", "text": "one\u2028two\x85three"}, ensure_ascii=False),
        '{"type":"result"}',
    ]
    (tmp_path / "transcripts" / "c1.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "transcripts" / "c1.timings").write_text("0 10\n1 25\n")
    got = _transcript(tmp_path, {"format": "claude-stream-json", "path": "transcripts/c1.jsonl"}, "c1")
    assert got == {"format": "claude-stream-json", "events": lines, "timings": [10, 25]}
