"""Hostile answers from the non-LLM transports, through the Runtime with a trace: what the
spec's sub-event rules do not name must still fail one call cleanly (an ``AgentError``), the
trace keeping that call's start and end, and the next call answering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm.agents.subprocess import SubprocessAgent
from localllm.config import SubprocessDecl
from localllm.errors import AgentError, ConfigError, ErrorKind
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace
from localllm.wire import AskRequest, AskResponse
from tests.unit.agents_fixtures.helpers import ask_request, deadline

#: a subprocess plugin answering every call with the sub-events in argv[1] ("ECHO" is the call_id)
PLUGIN = """\
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    subs = json.loads(sys.argv[1].replace("ECHO", req["params"]["call_id"]))
    if req["params"]["prompt"] == "plain":
        subs = []
    result = {"submission": '{"ok": 1}', "sub_events": subs}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""

#: sub-event payloads that are not JSON objects (the trace format's payload is an object)
NOT_OBJECTS: list[Any] = ["text", 5, [["a", "b"]], True]


def _events(trace: Path) -> list[tuple[str, str | None]]:
    return [(e.kind, e.payload.get("kind")) for e in read_trace(trace).events]


def _calls_in(trace: Path) -> list[str]:
    return [kind for kind, _ in _events(trace) if kind.startswith("agent.call.")]


@pytest.mark.parametrize("payload", NOT_OBJECTS, ids=repr)
def test_a_subprocess_sub_event_payload_that_is_not_an_object_fails_the_call_not_the_trace(
    tmp_path: Path, payload: Any
) -> None:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    subs = json.dumps([{"kind": "agent.x.tool", "call_id": "ECHO", "payload": payload}])
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n"
        f"  agent.x: {{plugin: subprocess, command: {json.dumps(sys.executable)}, "
        f"args: [{json.dumps(str(script))}, {json.dumps(subs)}]}}\n"
    )
    trace = tmp_path / "t.jsonl"
    with Runtime(load_config(config), trace=trace) as rt:
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.x", prompt="hi")
        assert info.value.kind is ErrorKind.TRANSPORT_ERROR  # was a ValueError/TypeError: "a bug in localllm"
        assert rt.call("ask", agent="agent.x", prompt="plain").submission == {"ok": 1}
    # the failed call's start and end were lost (the trace held its header alone)
    assert _calls_in(trace) == ["agent.call.start", "agent.call.error", "agent.call.start", "agent.call.complete"]


@pytest.mark.parametrize("payload", NOT_OBJECTS, ids=repr)
def test_an_inprocess_sub_event_payload_that_is_not_an_object_fails_the_call_not_the_trace(
    tmp_path: Path, payload: Any
) -> None:
    config = tmp_path / "app.yaml"
    config.write_text("agent_plugins:\n  agent.x: {plugin: builtin.inprocess}\n")
    trace = tmp_path / "t.jsonl"

    def answer(request: AskRequest) -> AskResponse:
        subs = [{"kind": "agent.x.tool", "call_id": request.call_id, "payload": payload}]
        return AskResponse(submission='{"ok": 1}', sub_events=subs if request.prompt != "plain" else [])

    with Runtime(load_config(config), trace=trace) as rt:
        rt.register_inprocess("agent.x", answer)
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.x", prompt="hi")
        assert info.value.kind is ErrorKind.PLUGIN_CRASH  # an in-process agent's misshapen answer
        assert rt.call("ask", agent="agent.x", prompt="plain").submission == {"ok": 1}
    assert _calls_in(trace) == ["agent.call.start", "agent.call.error", "agent.call.start", "agent.call.complete"]


@pytest.mark.parametrize("payload", NOT_OBJECTS, ids=repr)
def test_a_cassette_sub_event_payload_that_is_not_a_mapping_is_a_load_error_naming_it(
    tmp_path: Path, payload: Any
) -> None:
    from localllm.agents.cassette import load_cassette

    cassette = tmp_path / "c.yaml"
    episode = {
        "id": "ep-1",
        "match": {"handler": "agent.x"},
        "agent": {"verb": "ask", "response": '{"ok": 1}', "sub_events": [{"kind": "agent.x.t", "payload": payload}]},
    }
    cassette.write_text(json.dumps({"kind": "host_cassette", "episodes": [episode]}))
    with pytest.raises(ConfigError) as info:
        load_cassette(cassette)
    assert [p.key for p in info.value.problems] == ["episodes[0].agent.sub_events[0].payload"]


#: 8 threads make their first ``Runtime.call`` at once in a fresh process (only a fresh
#: process imports jsonschema for the first time); prints the failures' exception names
FIRST_CALLS = """\
import json, sys, threading
from pathlib import Path
from localllm.loading import load_config
from localllm.runtime import Runtime
config = Path(sys.argv[1])
with Runtime(load_config(config)) as rt:
    rt.register_inprocess("agent.x", lambda request: {"ok": 1})
    barrier = threading.Barrier(8)
    failed = []
    def call():
        barrier.wait()
        try:
            assert rt.call("ask", agent="agent.x", prompt="hi").submission == {"ok": 1}
        except BaseException as exc:
            failed.append(type(exc).__name__)
    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
print(json.dumps(failed))
"""


def test_concurrent_first_calls_in_a_fresh_process_all_answer(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text("agent_plugins:\n  agent.x: {plugin: builtin.inprocess}\n")
    failures = []
    for _ in range(6):  # before: 2 of 8 calls failed in about 5 processes of 8
        run = subprocess.run(
            [sys.executable, "-c", FIRST_CALLS, str(config)], capture_output=True, text=True, timeout=120, check=True
        )
        failures += json.loads(run.stdout.strip().splitlines()[-1])
    assert failures == []  # was ImportError: cannot import name 'Draft3Validator' (partially initialized)


#: a plugin that prints 256 KB of start-up lines on stdout before it reads anything
CHATTY = """\
import json, sys
for i in range(4096):
    sys.stdout.write("starting up, step %05d " % i + "." * 40 + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    result = {"submission": json.dumps({"chars": len(req["params"]["prompt"])})}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


def test_a_plugin_writing_before_it_reads_gets_a_large_request_without_a_pipe_deadlock(tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    decl = SubprocessDecl(alias="agent.x", plugin="subprocess", command=sys.executable, args=(str(script),))
    agent = SubprocessAgent(decl)
    try:
        # both pipes full: the plugin blocked writing its banner, the request blocked on its stdin
        response = agent.ask(ask_request("p" * 300_000), deadline=deadline(30))  # was deadline_exceeded
        assert json.loads(response.submission or "") == {"chars": 300_000}
        again = agent.ask(ask_request("q" * 300_000), deadline=deadline(30))
        assert json.loads(again.submission or "") == {"chars": 300_000}
    finally:
        agent.close()


#: extract_json on claude's answer: 6 MB of C code (a brace every ~13 bytes), then the JSON;
#: prints the answer found
CODE_ANSWER = """\
import json
from localllm.agents.claude_cli import extract_json
func = "int f%d(int x) {\\n    if (x > 0) {\\n        return x * 2;\\n    }\\n    return 0;\\n}\\n\\n"
code = "".join(func % i for i in range(75_000))
schema = {"type": "object"}
false_starts = ('{"a": "' + "y" * 100) * 60_000  # 6 MB of starts that look like JSON and fail
answers = [code + 'Verdict: {"verdict": "approve"}', code, false_starts + '{"verdict": "approve"}']
print(json.dumps([extract_json(text, schema) for text in answers]))
"""


def test_a_long_code_answer_from_claude_is_scanned_for_its_json_without_a_quadratic_stall() -> None:
    # each brace that does not start JSON cost a scan of everything before it (json's error
    # counts the lines up to its position): 6 MB took minutes, past any deadline
    run = subprocess.run([sys.executable, "-c", CODE_ANSWER], capture_output=True, text=True, timeout=120, check=True)
    # past 256 false starts the answer counts as ambiguous: passed on raw (schema_invalid)
    assert json.loads(run.stdout) == ['{"verdict": "approve"}', None, None]
