"""Structured-output negotiation against in-process servers that behave like the real ones.

Each fake answers as its model does (tests/e2e/test_endpoint_interop_e2e.py runs the real
servers): llama-server honours ``json_schema`` and reports ``timings``; llama-cpp-python
answers 500 to ``json_schema`` and honours ``json_object`` + ``schema``; a strict gateway
rejects every constraint; a lax one ignores them all.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from localllm._upstream import read_error
from localllm.agents import structured
from localllm.errors import AgentError
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.trace import read_trace

DECIDE = {
    "type": "object",
    "properties": {"choice": {"type": "string", "enum": ["a", "b"]}},
    "required": ["choice"],
    "additionalProperties": False,
}
#: the request body → (status, payload[, headers]); a bytes payload is sent as it is
Policy = Callable[[dict[str, Any]], tuple[Any, ...]]


def _reply(content: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return 200, {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        **extra,
    }


def _constrained(body: dict[str, Any]) -> str:
    """What a constrained server answers: the probe's only value, or a valid decide."""
    schema = (
        (body.get("response_format") or {}).get("json_schema", {}).get("schema")
        or (body.get("response_format") or {}).get("schema")
        or body.get("guided_json")
        or (body.get("structured_outputs") or {}).get("json")
    )
    if schema == structured.PROBE_SCHEMA:
        return '{"v": "7"}'
    return '{"choice": "a"}'


def llama_server(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if "grammar" in body or body.get("response_format"):
        return _reply(_constrained(body), timings={"predicted_n": 2})
    return _reply("Sure! Here is some prose.", timings={"predicted_n": 5})


def llama_cpp_python(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    fmt = body.get("response_format") or {}
    if fmt and fmt.get("type") not in ("text", "json_object"):
        return 500, {
            "detail": [
                {
                    "type": "literal_error",
                    "loc": ["body", "response_format", "type"],
                    "msg": "Input should be 'text' or 'json_object'",
                    "input": fmt.get("type"),
                }
            ]
        }
    if fmt.get("type") == "json_object":
        return _reply(_constrained(body))
    return _reply("Sure! Here is some prose.")


def rejects_all(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if any(k in body for k in ("response_format", "grammar", "guided_json", "structured_outputs")):
        return 400, {"error": {"message": "unsupported parameter", "type": "invalid_request_error"}}
    return _reply('{"choice": "b"}')


def ignores_all(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return _reply('{"choice": "b"}')


class Fake:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.bodies: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                status, payload, *headers = fake.policy(body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers[0] if headers else {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def probes(self) -> int:
        return sum(1 for b in self.bodies if b.get("max_tokens") == 16 and "Reply with one word." in json.dumps(b))


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[Fake]:
    server = Fake(request.param)
    yield server
    server.close()


def config(tmp_path: Path, url: str, extra: str = "") -> Any:
    """Two agents on one endpoint; ``response_format: probe`` (negotiation) unless ``extra`` sets it."""
    (tmp_path / "decide.json").write_text(json.dumps(DECIDE), encoding="utf-8")
    if "response_format" not in extra:
        extra = ", response_format: probe" + extra
    text = (
        f"agent_plugins:\n  agent.a: {{plugin: builtin.local_llm, endpoint: '{url}', fallback: none{extra}}}\n"
        f"  agent.b: {{plugin: builtin.local_llm, endpoint: '{url}/v1/', fallback: none{extra}}}\n"
    )
    (tmp_path / "app.yaml").write_text(text, encoding="utf-8")
    return load_config(tmp_path / "app.yaml")


def decide(rt: Runtime, alias: str = "agent.a") -> Any:
    return rt.call("decide", agent=alias, prompt="pick", schema=DECIDE)


@pytest.mark.parametrize(
    ("fake", "style", "field"),
    [
        (llama_server, "grammar", "grammar"),
        (llama_cpp_python, "json_object", "response_format"),
    ],
    indirect=["fake"],
)
def test_auto_probes_once_per_runtime_and_picks_the_strongest_honoured_style(
    tmp_path: Path, fake: Fake, style: str, field: str
) -> None:
    trace = tmp_path / "t.jsonl"
    with Runtime(config(tmp_path, fake.url), trace=trace) as rt:
        first = decide(rt)
        second = decide(rt, "agent.b")  # same endpoint URL, another agent: no second probe
        third = decide(rt)
    assert fake.probes() == 1
    assert len(fake.bodies) == 4
    assert first.submission == {"choice": "a"}
    assert [r.meta["structured_output"] for r in (first, second, third)] == [style] * 3
    assert first.meta["structured_probe"]["style"] == style
    assert "structured_probe" not in second.meta and "structured_probe" not in third.meta
    assert field in fake.bodies[1]
    if style == "json_object":
        assert fake.bodies[1]["response_format"] == {"type": "json_object", "schema": DECIDE}
    metas = [e.payload["meta"] for e in read_trace(trace).events if "meta" in e.payload]
    assert [m["structured_output"] for m in metas] == [style] * 3
    assert metas[0]["structured_probe"]["style"] == style


@pytest.mark.parametrize("fake", [llama_server], indirect=True)
def test_a_new_runtime_probes_again(tmp_path: Path, fake: Fake) -> None:
    for _ in range(2):
        with Runtime(config(tmp_path, fake.url)) as rt:
            decide(rt)
    assert fake.probes() == 2


@pytest.mark.parametrize("fake", [llama_server], indirect=True)
def test_json_schema_true_maps_onto_the_servers_own_field(tmp_path: Path, fake: Fake) -> None:
    with Runtime(config(tmp_path, fake.url, ", json_schema: true")) as rt:
        result = decide(rt)
    assert result.meta["structured_output"] == "json_schema"
    assert fake.bodies[-1]["response_format"]["type"] == "json_schema" and "grammar" not in fake.bodies[-1]


@pytest.mark.parametrize("fake", [llama_cpp_python], indirect=True)
def test_json_schema_true_sends_json_schema_strict_full_stop(tmp_path: Path, fake: Fake) -> None:
    """§9: json_schema: true sends response_format json_schema strict, never a negotiated
    substitute and never a probe (a server that refuses it fails the call, transport_error)."""
    with Runtime(config(tmp_path, fake.url, ", json_schema: true")) as rt, pytest.raises(AgentError) as info:
        decide(rt)
    assert info.value.kind.value == "transport_error"
    assert len(fake.bodies) == 1 and fake.probes() == 0
    fmt = fake.bodies[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"] == DECIDE


@pytest.mark.parametrize("fake", [rejects_all], indirect=True)
def test_an_endpoint_that_rejects_every_style_still_answers_unconstrained(tmp_path: Path, fake: Fake) -> None:
    with Runtime(config(tmp_path, fake.url)) as rt:
        first = decide(rt)
        second = decide(rt)
    assert first.submission == {"choice": "b"} and second.submission == {"choice": "b"}
    assert first.meta["structured_output"] == "none" and second.meta["structured_output"] == "none"
    # probe, the guessed json_object (rejected), the unconstrained resend; then one request
    assert len(fake.bodies) == 4
    assert fake.bodies[1]["response_format"]["type"] == "json_object"
    assert not any(k in fake.bodies[2] for k in ("response_format", "grammar"))
    assert not any(k in fake.bodies[3] for k in ("response_format", "grammar"))


def upstream_down(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 500, {
        "error": {
            "message": "litellm.InternalServerError: Connection error.",
            "type": "internal_server_error",
            "code": "500",
        }
    }


@pytest.mark.parametrize("fake", [upstream_down], indirect=True)
def test_a_gateway_whose_upstream_is_down_is_not_remembered_as_styleless(tmp_path: Path, fake: Fake) -> None:
    with Runtime(config(tmp_path, fake.url)) as rt:
        for _ in range(2):
            with pytest.raises(AgentError) as info:
                decide(rt)
            assert "HTTP 500" in str(info.value) and "Connection error." in str(info.value)
        fake.policy = llama_cpp_python  # the upstream is back
        result = decide(rt)
    assert fake.probes() == 3  # each failed call left no verdict behind
    assert result.meta["structured_output"] == "json_object"


@pytest.mark.parametrize("fake", [ignores_all], indirect=True)
def test_an_endpoint_that_ignores_the_schema_gets_none(tmp_path: Path, fake: Fake) -> None:
    with Runtime(config(tmp_path, fake.url)) as rt:
        result = decide(rt)
    assert result.meta["structured_output"] == "none"
    assert result.meta["structured_probe"]["evidence"].startswith("json_schema ignored")
    assert "response_format" not in fake.bodies[-1] and "grammar" not in fake.bodies[-1]


@pytest.mark.parametrize(
    ("fake", "fmt", "expected"),
    [
        (ignores_all, "structured_outputs", {"structured_outputs": {"json": DECIDE}}),
        (ignores_all, "guided_json", {"guided_json": DECIDE}),
        (ignores_all, "json_object", {"response_format": {"type": "json_object", "schema": DECIDE}}),
    ],
    indirect=["fake"],
)
def test_an_explicit_style_is_sent_without_a_probe(
    tmp_path: Path, fake: Fake, fmt: str, expected: dict[str, Any]
) -> None:
    with Runtime(config(tmp_path, fake.url, f", response_format: {fmt}")) as rt:
        result = decide(rt)
    assert len(fake.bodies) == 1 and fake.probes() == 0
    assert {k: fake.bodies[0][k] for k in expected} == expected
    assert result.meta["structured_output"] == fmt


@pytest.mark.parametrize("fake", [ignores_all], indirect=True)
def test_a_text_call_never_probes(tmp_path: Path, fake: Fake) -> None:
    with Runtime(config(tmp_path, fake.url)) as rt:
        rt.call("ask", agent="agent.a", prompt="hi")
    assert fake.probes() == 0 and len(fake.bodies) == 1


def _unauthorised(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"message": "No connected db.", "type": "no_db_connection", "param": None, "code": "400"}}


@pytest.mark.parametrize("fake", [_unauthorised], indirect=True)
def test_a_gateway_refusing_the_key_on_the_probe_says_check_api_key_env(
    tmp_path: Path, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_KEY", "wrong")
    with Runtime(config(tmp_path, fake.url, ", api_key_env: GW_KEY")) as rt, pytest.raises(AgentError) as info:
        decide(rt)
    assert len(fake.bodies) == 1  # the probe: nothing cached, nothing resent
    assert "check api_key_env GW_KEY" in info.value.hint
    assert "HTTP 400" in str(info.value) and "No connected db." in str(info.value)


def test_read_probe_verdicts() -> None:
    ok = {"choices": [{"message": {"content": '{ "v" : "7" }'}}]}
    assert structured.read_probe(200, {**ok, "timings": {}}, compiles=True).style == "grammar"  # type: ignore[union-attr]
    assert structured.read_probe(200, {**ok, "timings": {}}, compiles=False).style == "json_schema"  # type: ignore[union-attr]
    assert structured.read_probe(200, ok, compiles=True).style == "json_schema"  # type: ignore[union-attr]
    cut = {"choices": [{"message": {"content": '{\n    "v": "'}, "finish_reason": "length"}]}
    assert structured.read_probe(200, cut, compiles=False).style == "json_schema"  # type: ignore[union-attr]
    prose = {"choices": [{"message": {"content": "{"}}]}
    assert structured.read_probe(200, prose, compiles=False).style == "none"  # type: ignore[union-attr]
    # llama-server under a custom --jinja chat template ignores response_format, yet always
    # applies `grammar`: an unconstrained reply that carries llama.cpp's timings is still it
    ignored = {"choices": [{"message": {"content": "User: Is"}}], "timings": {}}
    assert structured.read_probe(200, ignored, compiles=True).style == "grammar"  # type: ignore[union-attr]
    assert structured.read_probe(200, ignored, compiles=False).style == "none"  # type: ignore[union-attr]
    rejected = structured.read_probe(422, None, compiles=True)
    assert rejected is not None and rejected.style == "json_object" and not rejected.verified
    assert structured.read_probe(401, None, compiles=True) is None
    assert structured.read_probe(429, None, compiles=True) is None


@pytest.mark.parametrize(
    ("status", "text", "message", "auth"),
    [
        (
            401,
            '{"error":{"message":"Invalid API Key","type":"invalid_request_error"}}',
            "Invalid API Key (type invalid_request_error)",
            True,
        ),
        (403, "forbidden", "forbidden", True),
        (
            400,
            '{"error":{"message":"No connected db.","type":"no_db_connection","param":null,"code":"400"}}',
            "No connected db. (type no_db_connection, code 400)",
            True,
        ),
        (
            400,
            '{"error":{"message":"bad request","type":"invalid_request_error"}}',
            "bad request (type invalid_request_error)",
            False,
        ),
        (
            500,
            '{"detail":[{"msg":"Input should be \'text\' or \'json_object\'"}]}',
            "[{\"msg\":\"Input should be 'text' or 'json_object'\"}]",
            False,
        ),
        (502, "", "(empty body)", False),
        (500, "x" * 1000, "x" * 297 + "...", False),
    ],
)
def test_read_error(status: int, text: str, message: str, auth: bool) -> None:
    found = read_error(status, text)
    assert (found.message, found.auth) == (message, auth)


@pytest.mark.parametrize(("written", "loaded"), [("true", True), ("false", False), ("auto", "auto")])
def test_normalize_takes_yaml_booleans_and_auto(tmp_path: Path, written: str, loaded: object) -> None:
    (tmp_path / "app.yaml").write_text(
        f"embedders:\n  e: {{endpoint: 'http://127.0.0.1:9', model: m, normalize: {written}}}\n", encoding="utf-8"
    )
    assert load_config(tmp_path / "app.yaml").embedders["e"].normalize == loaded


def test_bad_normalize_and_response_format_name_the_key(tmp_path: Path) -> None:
    from localllm.errors import ConfigError

    (tmp_path / "app.yaml").write_text(
        "embedders:\n  e: {endpoint: 'http://127.0.0.1:9', model: m, normalize: yes please}\n"
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9', "
        "response_format: json}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "app.yaml")
    text = str(info.value)
    assert "embedders.e.normalize" in text and "agent_plugins.agent.x.response_format" in text
