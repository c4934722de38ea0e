"""Turn order as the reference engine reads it (trace-format §3, §7), under concurrency.

Calls that outlive their turn, concurrent calls, fallbacks, sub-events and background
work: whatever the schedule, the trace written must pass the strict reader and the
reference reader's own rules (``oracle`` below restates them from the reference's
``loadAndValidate``), and every call keeps exactly one start and one end, contiguous.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm import Runtime, load_config
from localllm.config import Config
from localllm.errors import AgentError
from localllm.trace import Event, TraceWriter, read_trace
from localllm.trace.callid import derive_call_id, live_call_key
from localllm.trace.stats import trace_stats
from localllm.wire import AskRequest, AskResponse

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"enum": ["yes", "no"]}},
    "required": ["verdict"],
}


def make_config(tmp: Path) -> Config:
    (tmp / "app.yaml").write_text(
        "app_id: my-app\n"
        "agent_plugins:\n"
        "  agent.local: {plugin: builtin.inprocess}\n"
        "  agent.claude: {plugin: builtin.inprocess}\n"
    )
    return load_config(tmp / "app.yaml")


def oracle(path: Path) -> None:
    """The reference reader's read-time rules (store.loadAndValidate), restated."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert json.loads(lines[0])["kind"] == "session.header"
    seq_by_turn: dict[int, int] = {}
    max_turn = 0
    for raw in lines[1:]:
        assert not raw.endswith(b"\r") and b"\x00" not in raw
        obj = json.loads(raw)
        assert obj["kind"] != "session.header"
        turn, seq = obj["turn"], obj["seq"]
        assert turn >= max_turn, f"turn={turn} arrives after turn={max_turn}"
        max_turn = max(max_turn, turn)
        assert seq == seq_by_turn.get(turn, -1) + 1
        seq_by_turn[turn] = seq
        # §3: an off-path event names an earlier (or the in-flight) turn as its parent
        if "parent_turn" in obj:
            assert 0 < obj["parent_turn"] <= turn
        assert list(obj)[-1] == "payload"  # the reference writer's field order


def check_calls(events: tuple[Event, ...], expected: int) -> None:
    """Every call: one start, then its sub-events, then one end, contiguous, in one turn."""
    starts = [i for i, e in enumerate(events) if e.kind == "agent.call.start"]
    assert len(starts) == expected
    for i in starts:
        start = events[i]
        j = i + 1
        while events[j].kind not in ("agent.call.complete", "agent.call.error"):
            assert events[j].call_id == start.call_id  # a sub-event of this call
            j += 1
        group = events[i : j + 1]
        assert {e.call_id for e in group} == {start.call_id}
        assert {(e.turn, e.parent_turn, e.state_path) for e in group} == {
            (start.turn, start.parent_turn, start.state_path)
        }
    ends = [str(e.call_id) for e in events if e.kind in ("agent.call.complete", "agent.call.error")]
    assert sorted(ends) == sorted(str(events[i].call_id) for i in starts)
    assert len(set(ends)) == len(ends)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.sampled_from(["ok", "invalid", "error", "sub_events"])),
        st.tuples(st.just("turn"), st.booleans()),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.just("background"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=14,
)


def run_schedule(tmp: Path, ops: list[tuple[str, Any]]) -> None:
    path = tmp / "t.jsonl"
    config = make_config(tmp)
    gates: dict[str, threading.Event] = {}

    def local(request: AskRequest) -> AskResponse:
        gates[request.call_id].wait(120)
        kind = request.prompt
        if kind == "error":
            raise RuntimeError("boom")
        if kind == "invalid":
            return AskResponse(submission=json.dumps({"verdict": "maybe"}))
        subs = (
            [{"kind": "agent.local.step", "call_id": request.call_id, "payload": {"n": n}} for n in range(2)]
            if kind == "sub_events"
            else []
        )
        return AskResponse(submission=json.dumps({"verdict": "yes"}), sub_events=subs)

    def claude(request: AskRequest) -> AskResponse:
        return AskResponse(submission=json.dumps({"verdict": "no"}))

    pending: list[tuple[threading.Thread, threading.Event]] = []
    calls = 0
    with Runtime(config, trace=path) as rt:
        rt.register_inprocess("agent.local", local, local_model=True)
        rt.register_inprocess("agent.claude", claude)
        assert rt.trace is not None
        writer: TraceWriter = rt.trace
        for op, arg in ops:
            if op == "call":
                calls += 1
                request_turn = rt.turn
                ready = threading.Event()

                def go(kind: str = arg, ready: threading.Event = ready) -> None:
                    with contextlib.suppress(AgentError):
                        ready.set()
                        rt.call("decide", agent="agent.local", prompt=kind, schema=SCHEMA, state_path="g")

                # the call_id is known before the call runs: the next live key of this turn
                seq = rt._seq.get((request_turn, "g"), 0)
                gate = threading.Event()
                gates[derive_call_id("my-app", live_call_key(request_turn, "g", seq))] = gate
                thread = threading.Thread(target=go)
                thread.start()
                ready.wait(5)
                # wait until the request (and its seq) is taken, so call_ids stay predictable
                while rt._seq.get((request_turn, "g"), 0) == seq:
                    threading.Event().wait(0.001)
                pending.append((thread, gate))
            elif op == "turn":
                rt.turn += 1
                if arg:  # a routed turn writes its turn.start
                    writer.append("turn.start", {"input": "x", "intent": ""}, turn=rt.turn, state_path="route")
            elif op == "finish" and pending:
                thread, gate = pending.pop(arg % len(pending))
                gate.set()
                thread.join(120)
            elif op == "background":
                # background work reporting for an earlier turn (e.g. a scheduler job)
                writer.append("scheduler.completed", {"job": arg}, turn=max(1, rt.turn - arg), state_path="bg")
        for thread, gate in pending:
            gate.set()
            thread.join(120)
    trace = read_trace(path)  # strict: raises on any cross-turn disorder
    oracle(path)
    check_calls(trace.events, calls)
    stats = trace_stats(trace.events)
    assert stats["calls"]["total"] == calls
    assert stats["calls"]["late"] == sum(
        1 for e in trace.events if e.kind.startswith("agent.call.") and e.kind != "agent.call.start" and e.parent_turn
    )
    # a late event keeps its own turn as parent_turn, below the turn it was written in
    for e in trace.events:
        if e.parent_turn is not None:
            assert e.parent_turn < e.turn


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_concurrent_schedules_write_strictly_ordered_traces(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, Any]]
) -> None:
    run_schedule(tmp_path_factory.mktemp("sched"), ops)


def test_call_outliving_its_turn_is_recorded_late_in_the_turn_in_flight(tmp_path: Path) -> None:
    # the case: a turn-1 call completes after a turn-2 event
    run_schedule(tmp_path, [("call", "ok"), ("turn", True), ("finish", 0)])
    events = read_trace(tmp_path / "t.jsonl").events
    assert [(e.kind, e.turn, e.seq, e.parent_turn) for e in events] == [
        ("turn.start", 2, 0, None),
        ("agent.call.start", 2, 1, 1),
        ("agent.call.complete", 2, 2, 1),
    ]
    assert events[1].state_path == "g"  # the call's own state is kept
    assert trace_stats(events)["turns"] == 2


def test_writer_refuses_a_raw_line_below_the_latest_turn(tmp_path: Path) -> None:
    from localllm.errors import TraceWriteRejected

    with TraceWriter.open(tmp_path / "t.jsonl") as w:
        w.append("turn.start", {}, turn=2, state_path="s")
        with pytest.raises(TraceWriteRejected) as info:
            w.append_raw(b'{"turn":1,"seq":0,"ts":"2026-01-01T00:00:00Z","kind":"a.b","payload":{}}')
        assert "turn" in str(info.value)
    assert len(read_trace(tmp_path / "t.jsonl").events) == 1
