"""Targeted redaction (agent-plugin-contract §1 "Auth and secrets", issue 24.1).

Only *resolved secret values* are masked: what a ``${VAR}`` resolved to in ``env:`` /
``headers:`` and the ``api_key_env`` key. A plain config value is configuration; a short
secret is never masked inside another word; structural fields are never rewritten (a
secret that would land in one fails the call); every other byte of a payload is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from localllm import Runtime, load_config
from localllm.errors import AgentError, ErrorKind
from localllm.redact import MASK, MIN_SECRET, SAFE_LENGTH, Redactor
from localllm.trace import read_trace
from localllm.trace.recorder import TraceRecorder
from localllm.trace.rules import clean_text
from localllm.trace.writer import TraceWriter
from localllm.wire import AskRequest, AskResponse

PLUGIN = """
import json, os, sys
for line in sys.stdin:
    req = json.loads(line)
    p = req["params"]
    size = int(os.environ.get("BLOB", "0"))
    event = {"kind": os.environ["PLUGIN_ALIAS"] + ".tool.called", "call_id": p["call_id"],
             "ts": "2001-01-01T00:00:00Z",
             "payload": {"blob": "x" * size, "note": "token " + os.environ.get("TOKEN", "")}}
    result = {"submission": {"ok": True, "said": "missing or invalid bearer token"}, "sub_events": [event]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


def _config(tmp_path: Path, env: str) -> Path:
    (tmp_path / "plug.py").write_text(PLUGIN)
    path = tmp_path / "app.yaml"
    path.write_text(
        "agent_plugins:\n"
        f"  agent.plug: {{plugin: subprocess, command: {json.dumps(sys.executable)}, args: [{json.dumps(str(tmp_path / 'plug.py'))}], "
        f"env: {env}}}\n"
    )
    return path


def _events(trace: Path) -> list[Any]:
    return list(read_trace(trace).events)


def test_plain_env_value_is_not_a_secret(tmp_path: Path) -> None:
    """PLUGIN_ALIAS: agent.plug (no ${VAR}) lands as written: kind and a 2 MiB payload intact."""
    size = 2 * 1024 * 1024
    config = load_config(_config(tmp_path, f"{{PLUGIN_ALIAS: agent.plug, BLOB: '{size}', TOKEN: inva}}"))
    assert config.secret_values() == ()
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        result = rt.call("ask", agent="agent.plug", prompt="go")
    assert result.submission["said"] == "missing or invalid bearer token"
    kinds = [e.kind for e in _events(trace)]
    assert "agent.plug.tool.called" in kinds
    sub = next(e for e in _events(trace) if e.kind == "agent.plug.tool.called")
    assert len(sub.payload["blob"]) == size and sub.payload["note"] == "token inva"


def test_interpolated_value_is_masked_and_short_secret_not_inside_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_TOKEN", "alid")  # a short secret: masked alone, never inside "invalid"
    config = load_config(_config(tmp_path, "{PLUGIN_ALIAS: agent.plug, TOKEN: '${MY_TOKEN}'}"))
    assert config.secret_values() == ("alid",)
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt:
        result = rt.call("ask", agent="agent.plug", prompt="go")
    sub = next(e for e in _events(trace) if e.kind == "agent.plug.tool.called")
    assert sub.payload["note"] == f"token {MASK}"
    complete = next(e for e in _events(trace) if e.kind == "agent.call.complete")
    assert complete.payload["response"]["submission"]["said"] == "missing or invalid bearer token"
    assert result.submission["said"] == "missing or invalid bearer token"


def test_secret_in_a_structural_field_fails_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolved secret that would land in a sub-event kind: the call fails, nothing is rewritten."""
    monkeypatch.setenv("ALIAS_SECRET", "agent.plug")
    config = load_config(_config(tmp_path, "{PLUGIN_ALIAS: '${ALIAS_SECRET}'}"))
    trace = tmp_path / "t.jsonl"
    with Runtime(config, trace=trace) as rt, pytest.raises(Exception) as info:
        rt.call("ask", agent="agent.plug", prompt="go")
    # the alias itself is the secret: refused before anything is asked
    assert getattr(info.value, "key", None) == "agent"
    assert all(MASK not in e.kind for e in _events(trace))


def test_secret_in_a_sub_event_kind_fails_with_namespace_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALIAS_SECRET", "plugsecret-42")
    path = tmp_path / "app.yaml"
    path.write_text(
        "agent_plugins:\n"
        "  agent.i: {plugin: builtin.inprocess}\n"
        f"  agent.s: {{plugin: subprocess, command: {json.dumps(sys.executable)}, env: {{K: '${{ALIAS_SECRET}}'}}}}\n"
    )
    config = load_config(path)
    trace = tmp_path / "t.jsonl"

    def answer(request: AskRequest) -> AskResponse:
        event = {"kind": "agent.i.plugsecret-42.called", "call_id": request.call_id, "payload": {}}
        return AskResponse(submission='{"a": 1}', sub_events=[event])

    with Runtime(config, trace=trace) as rt:
        rt.register_inprocess("agent.i", answer)
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.i", prompt="go")
    assert info.value.kind is ErrorKind.SUB_EVENT_NAMESPACE_VIOLATION
    events = _events(trace)
    assert [e.kind for e in events if e.kind.startswith("agent.")][-2:] == ["agent.call.start", "agent.call.error"]
    assert "plugsecret-42" not in trace.read_text()


# ---------------------------------------------------------------- the property

_SECRET_ALPHABET = st.characters(codec="utf-8", categories=("L", "N", "P", "S"))
_PLAIN_ALPHABET = st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    secrets=st.lists(st.text(_SECRET_ALPHABET, min_size=SAFE_LENGTH, max_size=24), min_size=1, max_size=3),
    pieces=st.lists(
        st.one_of(st.text(_PLAIN_ALPHABET, max_size=40), st.integers(min_value=0, max_value=2)),
        min_size=1,
        max_size=12,
    ),
)
def test_property_no_secret_and_every_other_byte_kept(
    tmp_path_factory: pytest.TempPathFactory, secrets: list[str], pieces: list[str | int]
) -> None:
    """Random secrets spliced into random text → the trace holds no secret, and the text
    is exactly the input with each secret occurrence replaced by the mask."""
    secrets = [s for s in secrets if s.strip()]
    assume(secrets)
    plain = [p for p in pieces if isinstance(p, str)]
    # plain text must not itself contain (or, joined, form) a secret or a piece of one
    for secret in secrets:
        assume(all(secret not in other or secret == other for other in secrets))
        assume(secret not in "".join(plain) and secret not in MASK)
        assume(not any(secret[:1] in p or secret[-1:] in p for p in plain))
    text = "".join(secrets[p % len(secrets)] if isinstance(p, int) else p for p in pieces)
    expected = "".join(MASK if isinstance(p, int) else p for p in pieces)
    redact = Redactor(secrets)
    assert redact(text) == expected

    # the trace stores NFC text (trace-format's write rule): the only change besides the masks
    masked, expected = expected, clean_text(expected)
    assume(not any(secret in expected for secret in secrets))
    trace = tmp_path_factory.mktemp("prop") / "t.jsonl"
    writer = TraceWriter.open(trace)
    recorder = TraceRecorder(writer, redact=redact)
    request = AskRequest(
        session_id="s",
        turn=1,
        state_path="st",
        verb="ask",
        prompt=text,
        call_id="0123456789abcdef",
        deadline="2030-01-01T00:00:00Z",
    )
    record = recorder.call_started(request, alias="agent.x", schema_path=None, args={"a": text})
    event = {"kind": "agent.x.tool", "call_id": request.call_id, "payload": {"text": text}}
    record.leg_finished(
        "agent.x", AskResponse(submission="{}", meta={"m": text}, sub_events=[event]), None, {"v": text}
    )
    record.finished(call_id=request.call_id, duration_ms=1, meta={"m": text})
    writer.close()
    events = _events(trace)
    # every string the call put into the trace (the format's own field names, kinds and
    # timestamps are not data: a random secret may happen to spell part of them)
    written = "\n".join(_strings([e.payload for e in events]))
    for secret in secrets:
        assert secret not in written and json.dumps(secret)[1:-1] not in written
    sub = next(e for e in events if e.kind == "agent.x.tool")
    assert sub.payload["text"] == expected
    complete = next(e for e in events if e.kind == "agent.call.complete")
    assert complete.payload["meta"] == {"m": expected}
    if "response" in complete.payload:
        assert complete.payload["response"]["submission"] == {"v": expected}
    else:  # a value the trace cannot inline (not NFC) goes verbatim to its sidecar file
        sidecar = trace.parent / complete.payload["response_file"]
        assert json.loads(sidecar.read_text(encoding="utf-8"))["submission"] == {"v": masked}
    for path in trace.parent.rglob("*"):
        if path.is_file() and path != trace:  # sidecar files hold only the call's data
            for secret in secrets:
                assert secret not in path.read_text(encoding="utf-8", errors="replace")


def _strings(value: Any) -> list[str]:
    """Every string value inside ``value`` (keys are the format's, not data)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_min_secret_and_whole_word_rule() -> None:
    short = "k3y9"
    assert len(short) >= MIN_SECRET and len(short) < SAFE_LENGTH
    redact = Redactor([short, "ab"])
    assert redact(f"use {short}, not x{short} or {short}y") == f"use {MASK}, not x{short} or {short}y"
    assert redact("ab cab") == "ab cab"  # below the minimum: not a secret at all
