"""Fixtures shared by the unit tests: the fake llama-server binary, a loopback MCP server and a
loopback host of schemas that counts who asks."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.unit.agents_fixtures.helpers import McpHttpServer

FAKE_LLAMA_SERVER = Path(__file__).resolve().parent / "fakes" / "fake_llama_server.py"


@pytest.fixture(autouse=True)
def no_package_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip never reaches a package index from a unit test (pins shipped as wheels would):
    it sees only a local wheel directory, empty unless a test fills it."""
    wheels = tmp_path / "pip-wheels"
    wheels.mkdir(exist_ok=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", wheels.as_uri())  # pip splits a plain path at spaces


@pytest.fixture
def server_bin(tmp_path: Path) -> Path:
    """An executable ``llama-server`` in its own dir that execs the fake (same pid)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    path = bindir / "llama-server"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_LLAMA_SERVER}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def mcp_http_server() -> Iterator[McpHttpServer]:
    """The reference MCP server (official SDK) over streamable HTTP on loopback, per module."""
    server = McpHttpServer()
    server.start()
    yield server
    server.stop()


class SchemaHost:
    """A loopback HTTP server answering every GET with ``{"type": "integer"}``; ``hits`` counts them."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.hits.append(self.path)
                body = b'{"type": "integer"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/schema.json"


@pytest.fixture
def schema_host() -> Iterator[SchemaHost]:
    host = SchemaHost()
    worker = threading.Thread(target=host.server.serve_forever, daemon=True)
    worker.start()
    yield host
    host.server.shutdown()
    host.server.server_close()
    worker.join()
