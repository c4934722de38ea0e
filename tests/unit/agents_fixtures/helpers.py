"""Shared test helpers for the transport tests: requests, leak accounting, the MCP server."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from localllm.wire import AskRequest

FIXTURES = Path(__file__).resolve().parent
JSONRPC_AGENT = FIXTURES / "jsonrpc_agent.py"
MCP_SERVER = FIXTURES / "mcp_server.py"
MCP_STDIO_FAKE = FIXTURES / "mcp_stdio_fake.py"


def ask_request(
    prompt: str, call_id: str = "0123456789abcdef", *, schema: dict[str, object] | None = None
) -> AskRequest:
    return AskRequest(
        session_id="sess-1",
        turn=1,
        state_path="room.main",
        verb="ask",
        prompt=prompt,
        call_id=call_id,
        deadline="2030-01-01T00:00:00Z",
        schema=schema,
        with_={"k": "v"},
        world={"x": 1},
    )


def deadline(seconds: float = 20.0) -> float:
    return time.monotonic() + seconds


@dataclass(frozen=True)
class Resources:
    """What a transport could leak: child processes, threads, file descriptors."""

    children: frozenset[int]
    threads: int
    fds: int

    @classmethod
    def now(cls) -> Resources:
        me = psutil.Process()
        return cls(
            children=frozenset(p.pid for p in me.children(recursive=True)),
            threads=threading.active_count(),
            fds=me.num_fds(),
        )


def assert_no_leaks(before: Resources, *, settle: float = 5.0) -> None:
    """Every process, thread and fd created since ``before`` is gone (polled briefly)."""
    end = time.monotonic() + settle
    while True:
        after = Resources.now()
        new_children = after.children - before.children
        ok = not new_children and after.threads <= before.threads and after.fds <= before.fds
        if ok or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert not new_children, f"leaked processes: {sorted(new_children)}"
    assert after.threads <= before.threads, f"leaked threads: {before.threads} -> {after.threads}"
    assert after.fds <= before.fds, f"leaked fds: {before.fds} -> {after.fds}"


class McpHttpServer:
    """The SDK MCP fixture server in a child process on a loopback port."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        proc = subprocess.Popen(
            [sys.executable, str(MCP_SERVER), "http", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.proc = proc
        assert proc.stdout is not None
        end = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                self.stop()
                raise RuntimeError("MCP fixture server did not report its port")
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                raise RuntimeError(f"MCP fixture server exited with {proc.wait()}")
            line += chunk
        self.port = int(line.split()[1])
        while True:
            try:
                if httpx.get(f"{self.base}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError("MCP fixture server never became healthy")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self) -> None:
        """SIGKILL (a crash): sessions vanish without goodbye."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def restart(self) -> None:
        """Stop and start again on the same port (every session is forgotten)."""
        self.stop()
        self.start()


def submission_of(agent: Any, prompt: str, call_id: str = "0123456789abcdef", seconds: float = 20.0) -> Any:
    """Ask ``agent`` and return its submission parsed."""
    response = agent.ask(ask_request(prompt, call_id), deadline=deadline(seconds))
    assert response.submission is not None
    return json.loads(response.submission)
