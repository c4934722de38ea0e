"""The fake llama-server's request log, which the service and agent tests read right after an answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.fakes import fake_llama_server as fake


@pytest.fixture
def slow_logging_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """The fake in this process, on a free port, taking 0.2 s to write each log line."""
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_REQUEST_LOG", str(log))
    record = fake.Handler.record

    def slow_record(self: Any, *args: Any) -> None:
        time.sleep(0.2)
        record(self, *args)

    monkeypatch.setattr(fake.Handler, "record", slow_record)
    state = fake.State(fake.parse_args(["-m", "model.gguf"]))
    state.ready.set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Bound", (fake.Handler,), {"state": state}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


def test_a_request_is_in_the_log_by_the_time_its_answer_arrives(slow_logging_fake: tuple[str, Path]) -> None:
    # before: logged after the answer was sent, so a test reading the log at once raced the
    # fake's thread (CI failed on it once in 3,638 tests)
    base, log = slow_logging_fake
    with httpx.Client(base_url=base) as http:
        answers = [
            http.post("/tokenize", json={"content": "x"}),
            http.get("/health"),
            http.post("/nowhere", json={}),
            http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ]
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert [(r["method"], r["path"], r["status"]) for r in rows] == [
        (a.request.method, a.request.url.path, a.status_code) for a in answers
    ]
