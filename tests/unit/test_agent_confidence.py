"""``meta.confidence`` from builtin.local_llm against the fake llama-server (managed and endpoint mode)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localllm.config import Config
from localllm.loading import load_config
from localllm.managed.server import CANARY_BODY
from localllm.runtime import Runtime
from localllm.trace import read_trace

SCHEMA = {
    "type": "object",
    "properties": {"queue": {"enum": ["billing", "bug", "other"]}, "note": {"type": "string", "maxLength": 5}},
    "required": ["queue", "note"],
}
FREE = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}


@pytest.fixture
def requests_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_REQUEST_LOG", str(path))
    return path


def chat_bodies(path: Path) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["body"] for r in found if r["path"].endswith("/chat/completions") and r["body"] != CANARY_BODY]


def config(tmp_path: Path, server_bin: Path, extra: str = "") -> Config:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF fake weights")
    (tmp_path / "app.yaml").write_text(
        "app_id: t\nagent_plugins:\n"
        f"  agent.local: {{plugin: builtin.local_llm, model: '{model}', server_bin: '{server_bin}', "
        f"parallel: 1, ctx_size: 512, health_timeout: 30{extra}}}\n"
    )
    return load_config(tmp_path / "app.yaml")


def behaviour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *items: dict[str, Any]) -> None:
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps({"responses": list(items)}))
    monkeypatch.setenv("FAKE_LLAMA_BEHAVIOUR", str(path))


def test_confidence_is_in_meta_and_trace(
    tmp_path: Path, server_bin: Path, requests_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the grammar's first walk answers "billing"; the model's distribution there is given
    # (the first entry is the start-up grammar canary's)
    dist = {"billing": {"billing": 0.3, "bug": 0.5, "other": 0.1, "Hello": 0.1}}
    confident = {"billing": {"billing": 0.9, "bug": 0.1}}
    behaviour(tmp_path, monkeypatch, {}, {"logprobs": dist}, {"logprobs": confident})
    trace = tmp_path / "trace.jsonl"
    with Runtime(config(tmp_path, server_bin), trace=trace) as rt:
        unsure = rt.call("decide", agent="agent.local", prompt="Route: x", schema=SCHEMA)
        sure = rt.call("decide", agent="agent.local", prompt="Route: y", schema=SCHEMA)
    assert unsure.submission["queue"] == "billing"
    assert unsure.meta["confidence"] == pytest.approx(0.3 / 0.9, abs=1e-6)
    assert unsure.meta["confidence_method"] == "logprobs"
    assert unsure.meta["confidence_fields"] == {"queue": pytest.approx(0.3 / 0.9, abs=1e-6)}
    assert sure.meta["confidence"] == pytest.approx(0.9, abs=1e-6)
    body = chat_bodies(requests_log)[0]
    assert body["logprobs"] is True and body["top_logprobs"] == 20
    completes = [e for e in read_trace(trace).events if e.kind == "agent.call.complete"]
    assert [e.payload["meta"]["confidence"] for e in completes] == [
        pytest.approx(0.3 / 0.9, abs=1e-6),
        pytest.approx(0.9, abs=1e-6),
    ]


def test_no_choice_field_no_logprobs_asked(tmp_path: Path, server_bin: Path, requests_log: Path) -> None:
    with Runtime(config(tmp_path, server_bin)) as rt:
        free = rt.call("extract", agent="agent.local", prompt="p", schema=FREE)
        plain = rt.call("ask", agent="agent.local", prompt="p")
    assert (free.meta["confidence"], free.meta["confidence_method"]) == (None, "no_choice_fields")
    assert (plain.meta["confidence"], plain.meta["confidence_method"]) == (None, "no_choice_fields")
    assert all("logprobs" not in b for b in chat_bodies(requests_log))


def test_confidence_off_asks_for_nothing(tmp_path: Path, server_bin: Path, requests_log: Path) -> None:
    with Runtime(config(tmp_path, server_bin, ", confidence: 'off'")) as rt:
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert (result.meta["confidence"], result.meta["confidence_method"]) == (None, "off")
    assert "logprobs" not in chat_bodies(requests_log)[0]


def test_a_server_without_logprobs_is_unavailable(
    tmp_path: Path, server_bin: Path, requests_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_LOGPROBS", "none")
    with Runtime(config(tmp_path, server_bin)) as rt:
        result = rt.call("decide", agent="agent.local", prompt="p", schema=SCHEMA)
    assert result.ok and result.submission["queue"] == "billing"
    assert (result.meta["confidence"], result.meta["confidence_method"]) == (None, "unavailable")


@pytest.fixture
def endpoint(tmp_path: Path, server_bin: Path, requests_log: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fake llama-server started by hand that refuses ``logprobs`` with a 400."""
    monkeypatch.setenv("FAKE_LLAMA_LOGPROBS", "refuse")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    proc = subprocess.Popen(
        [str(server_bin), "-m", str(model), "--port", "0", "--host", "127.0.0.1"], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    port = None
    deadline = time.monotonic() + 20
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "listening on http://127.0.0.1:" in line:
            port = int(line.rsplit(":", 1)[1].split()[0])
    assert port is not None
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    proc.stderr.close()


def test_an_endpoint_that_refuses_logprobs_answers_without_confidence_and_is_not_asked_again(
    tmp_path: Path, endpoint: str, requests_log: Path
) -> None:
    (tmp_path / "ep.yaml").write_text(
        f"agent_plugins:\n  agent.ep: {{plugin: builtin.local_llm, endpoint: '{endpoint}', response_format: grammar}}\n"
    )
    with Runtime(load_config(tmp_path / "ep.yaml")) as rt:
        first = rt.call("decide", agent="agent.ep", prompt="p", schema=SCHEMA)
        second = rt.call("decide", agent="agent.ep", prompt="q", schema=SCHEMA)
    assert first.ok and second.ok and first.submission["queue"] == "billing"
    assert first.meta["confidence_method"] == second.meta["confidence_method"] == "unavailable"
    asked = ["logprobs" in b for b in chat_bodies(requests_log)]
    assert asked == [True, False, False]  # refused once, retried without, never asked again


def test_confidence_score_forces_each_alternative_after_the_answer(
    tmp_path: Path, server_bin: Path, requests_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # canary, the answer ({"queue":"billing",…}), then one forced request per alternative
    behaviour(
        tmp_path,
        monkeypatch,
        {},
        {},
        {"logprobs": {"billing": {"billing": 0.5}}},
        {"logprobs": {"bug": {"bug": 0.25}}},
        {"logprobs": {"other": {"other": 0.25}}},
    )
    with Runtime(config(tmp_path, server_bin, ", confidence: score")) as rt:
        result = rt.call("decide", agent="agent.local", prompt="Route: x", schema=SCHEMA)
    assert result.submission["queue"] == "billing"
    assert result.meta["confidence_method"] == "score"
    assert result.meta["confidence"] == pytest.approx(0.5, abs=1e-6)
    bodies = chat_bodies(requests_log)
    assert "logprobs" not in bodies[0]  # the answer itself asks for nothing extra
    forced = bodies[1:]
    assert [b["grammar"] for b in forced] == [
        'root ::= "\\"billing\\""',
        'root ::= "\\"bug\\""',
        'root ::= "\\"other\\""',
    ]
    assert all(b["messages"][-1] == {"role": "assistant", "content": '{"queue":'} for b in forced)
    assert all(b["logprobs"] is True for b in forced)
