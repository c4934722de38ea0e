"""Every grammar-corpus schema against the real llama-server: do the verdicts match?

One llama-server (gemma-3-270m, ``--parallel 2``) serves the whole module. For each corpus
entry we POST ``response_format: json_schema`` with a prompt that asks the model to copy the
entry's ``probe`` (an answer that breaks the schema, or a valid one the server's grammar
cannot produce) or, without a probe, to answer the schema. The corpus's ``llama`` field says what the server must be seen doing:

- ``enforces``: 200, no conversion warning, and the answer is schema-valid *although the
  model was asked to copy an invalid one* (the grammar stopped it). Verdict ``ok``.
- ``ignores`` with verdict ``warning-only``: 200, no warning, and the answer satisfies the
  schema's structural part (the schema minus the constraints we warned about); whether it
  also satisfies the warned constraints is recorded, not asserted.
- ``ignores`` with verdict ``error``: 200 and a whole JSON answer that breaks the schema:
  proof the server did not enforce what the checker called out of the subset (an answer
  cut at ``max_tokens`` proves nothing, so each such probe is one the model copies).
- ``degrades``: 200 and llama-server's ``WARNING: JSON schema conversion was incomplete``
  line on stderr (the pattern became "any string").
- ``refuses``: a 4xx/5xx error before generating.

So an error verdict is only accepted with evidence that the server does not enforce the
schema, and an ok verdict only with evidence that it does.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.grammar.paths import parse_path
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

CORPUS = sorted((REPO / "grammar" / "corpus").glob("*.json"))
MAX_TOKENS = 128
WARNING_LINE = "JSON schema conversion was incomplete"


@dataclass
class Server:
    base: str
    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self) -> int:
        with self.lock:
            return len(self.lines)

    def since(self, mark: int) -> list[str]:
        with self.lock:
            return self.lines[mark:]


def _drain(server: Server) -> None:
    assert server.proc.stderr is not None
    for raw in server.proc.stderr:
        with server.lock:
            server.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))


@contextlib.contextmanager
def serving(server_bin: Path, chat_gguf: Path, slots: int) -> Iterator[Server]:
    """A real llama-server (gemma-3-270m) with ``slots`` slots of 1,024 tokens each."""
    argv = [
        str(server_bin),
        "-m",
        str(chat_gguf),
        "--port",
        "0",
        "--host",
        "127.0.0.1",
        "-c",
        str(1024 * slots),
        "--parallel",
        str(slots),
    ]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(server_bin.parent), env.get("LD_LIBRARY_PATH")) if p)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    srv = Server(base="", proc=proc)
    drain = threading.Thread(target=_drain, args=(srv,), daemon=True)
    drain.start()
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}: {srv.since(0)[-10:]}")
            if time.monotonic() > deadline:
                pytest.fail("llama-server printed no 'listening on' line within 120 s")
            for line in srv.since(0):
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    port = int(m.group(1))
            time.sleep(0.05)
        srv.base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=httpx.Timeout(5.0)) as client:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"llama-server exited with {proc.returncode}: {srv.since(0)[-10:]}")
                try:
                    if client.get(srv.base + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail("llama-server /health never answered 200")
                time.sleep(0.1)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        drain.join(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture(scope="module")
def server(server_bin: Path, chat_gguf: Path) -> Iterator[Server]:
    # one request at a time: each test reads the stderr lines its own request caused
    with serving(server_bin, chat_gguf, slots=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Per-schema outcomes, printed as a table (and written as JSON) at module teardown."""
    results: dict[str, dict[str, Any]] = {}
    yield results
    out = tmp_path_factory.mktemp("grammar-e2e") / "outcomes.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\ngrammar corpus on llama-server ({len(results)} schemas; {out}):")
    for name, r in sorted(results.items()):
        print(f"  {name:40} {r['verdict']:13} {r['llama']:9} -> {r.get('outcome', 'test error')}")


def structural(schema: dict[str, Any], findings: list[dict[str, str]]) -> dict[str, Any]:
    """The schema minus what the checker warned about (oneOf → anyOf)."""
    out = copy.deepcopy(schema)
    for f in findings:
        if f["severity"] != "warning":
            continue
        node: Any = out
        for token in parse_path(f["path"]):
            node = node[token]
        if f["construct"] == "oneOf":
            node["anyOf"] = node.pop("oneOf")
        else:
            node.pop(f["construct"], None)
    return out


def _ask(server: Server, entry: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    if "probe" in entry:
        prompt = "Reply with exactly this JSON and nothing else:\n" + json.dumps(entry["probe"])
    else:
        prompt = "Reply with a JSON value matching this JSON Schema:\n" + json.dumps(entry["schema"])
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "submission", "strict": True, "schema": entry["schema"]},
        },
    }
    mark = server.mark()
    response = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=httpx.Timeout(10.0, read=60.0))
    # The conversion warning is printed before generation starts; give the drain a moment (up
    # to 10 s on a loaded box: only an entry that must warn waits, and only until it has)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not any(WARNING_LINE in line for line in server.since(mark)):
        if entry["llama"] != "degrades":
            break
        time.sleep(0.05)
    return response, server.since(mark)


def _is_valid(schema: dict[str, Any], value: Any) -> bool:
    """jsonschema's verdict; a pattern Python's ``re`` cannot compile (ECMA-only syntax such
    as ``(?<name>...)``) counts as invalid, as it would fail localllm's validation too."""
    import jsonschema

    try:
        return bool(jsonschema.validators.validator_for(schema)(schema).is_valid(value))
    except re.error:
        return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_schema_on_llama_server(server: Server, outcomes: dict[str, dict[str, Any]], path: Path) -> None:
    entry = json.loads(path.read_text())
    response, stderr = _ask(server, entry)
    warned = any(WARNING_LINE in line for line in stderr)
    record: dict[str, Any] = {"verdict": entry["verdict"], "llama": entry["llama"], "status": response.status_code}
    outcomes[path.stem] = record
    if response.status_code != 200:
        record["outcome"] = f"refused {response.status_code}"
        record["error"] = response.text[:300]
        assert entry["llama"] == "refuses", f"{path.name}: server refused: {response.text[:300]}"
        assert entry["verdict"] == "error"
        return
    choice = response.json()["choices"][0]
    content = choice["message"]["content"]
    record["answer"] = content
    assert entry["llama"] != "refuses", f"{path.name}: expected a refusal, got 200: {content!r}"
    try:
        value = json.loads(content)
        parsed = True
    except ValueError:
        value, parsed = None, False
    valid = parsed and _is_valid(entry["schema"], value)
    record["outcome"] = "warned" if warned else "valid" if valid else "violated"
    if entry["llama"] == "degrades":
        assert warned, f"{path.name}: no conversion warning on stderr; answer {content!r}"
        assert entry["verdict"] == "error"
    elif entry["verdict"] == "ok":
        assert not warned, f"{path.name}: unexpected conversion warning: {stderr}"
        assert choice["finish_reason"] == "stop", f"{path.name}: answer cut at max_tokens: {content!r}"
        assert valid, f"{path.name}: the grammar should have enforced the schema, got {content!r}"
    elif entry["verdict"] == "warning-only":
        assert not warned, f"{path.name}: unexpected conversion warning: {stderr}"
        shape = structural(entry["schema"], entry["findings"])
        assert parsed and _is_valid(shape, value), (
            f"{path.name}: the structural part should be enforced, got {content!r}"
        )
        record["outcome"] = "valid" if valid else "structure-valid"
    else:
        assert entry["verdict"] == "error"
        # the evidence is a whole JSON answer that breaks the schema: an answer cut at
        # max_tokens is no evidence, it would be invalid under any grammar
        assert parsed, f"{path.name}: answer cut or not JSON, no evidence either way: {content!r}"
        assert not valid, (
            f"{path.name}: the checker says out of subset, but the server produced a "
            f"schema-valid answer to a probe that breaks it: {content!r}"
        )
