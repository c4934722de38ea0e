"""``cache rm`` and ``cache prune`` of a model take the lock its fetch holds, so a download
in another process never has its file (or its partial) removed underneath it (real
processes: ``localllm fetch model`` from a loopback server that pauses mid-body)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.managed import inventory
from localllm.managed.cache import cache_layout
from localllm.managed.fetch import partial_path
from localllm.managed.inventory import TEMP_GRACE_SECONDS, prune_cache, remove_entries
from localllm.managed.pins import load_pins
from tests.conftest import REPO

DATA = b"GGUF" + bytes(range(256)) * 1024  # 256 KiB
SHA = hashlib.sha256(DATA).hexdigest()
FILE = "tiny.gguf"


class PausingServer:
    """A mirror serving :data:`DATA` as ``/tiny.gguf``: the first half, then nothing until :meth:`release`."""

    def __init__(self) -> None:
        self.half_sent = threading.Event()
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                half = len(DATA) // 2
                self.send_response(200)
                self.send_header("Content-Length", str(len(DATA)))
                self.end_headers()
                self.wfile.write(DATA[:half])
                self.wfile.flush()
                outer.half_sent.set()
                outer.released.wait(30)
                self.wfile.write(DATA[half:])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"  # a mirror: base URL

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Fetcher:
    """``localllm fetch model --url … --id tiny`` in another process (with pins of its own,
    so the model is unknown, stale, to this one), paused inside the model's lock."""

    def __init__(self, tmp_path: Path, server: PausingServer) -> None:
        self.server = server
        self.layout = cache_layout()
        self.dest = self.layout.models_dir / "tiny" / SHA[:16] / FILE
        self.lock = self.layout.lock_path("model", f"tiny-{SHA[:16]}")  # the lock the fetch holds
        url = f"https://example.invalid/{FILE}"  # never asked: the mirror has it
        argv = [sys.executable, "-m", "localllm", "fetch", "model", "--url", url, "--sha256", SHA, "--id", "tiny"]
        self.proc = subprocess.Popen(
            [*argv, "--mirror", server.url, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO), "LOCALLLM_CONFIG_DIR": str(tmp_path / "other-config")},
        )
        deadline = time.monotonic() + 60
        while not server.half_sent.wait(0.05):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the fetch never started its download"

    def finish(self) -> Path:
        """Let the download end; the path the fetch reports."""
        self.server.release()
        out, errs = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, errs
        return Path(json.loads(out)["path"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def fetcher(tmp_path: Path) -> Iterator[Fetcher]:
    # an earlier copy that fails its hash: the fetch takes the lock, re-hashes it, downloads again
    dest = cache_layout().models_dir / "tiny" / SHA[:16] / FILE
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"GGUF an older, damaged copy")
    server = PausingServer()
    running = Fetcher(tmp_path, server)
    try:
        yield running
    finally:
        running.kill()
        server.close()


def test_cli_cache_rm_of_a_model_being_fetched_gives_up_and_removes_nothing(
    fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(inventory, "MODEL_RM_WAIT", 0.3, raising=False)
    assert main(["cache", "rm", "tiny", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["kind"]) == (False, "artifact_locked")
    assert str(fetcher.lock) in doc["detail"] and "tiny" in doc["detail"] and doc["hint"]
    assert fetcher.dest.exists()  # nothing removed
    assert fetcher.finish() == fetcher.dest
    assert fetcher.dest.read_bytes() == DATA


def test_cache_rm_error_carries_the_model_and_its_lock(fetcher: Fetcher) -> None:
    from localllm.errors import ArtifactLocked

    with pytest.raises(ArtifactLocked) as info:
        remove_entries(fetcher.layout, load_pins(), "tiny", model_wait=0.2)
    got = info.value
    assert (got.name, got.path, got.lock) == ("tiny", str(fetcher.dest), str(fetcher.lock))
    assert fetcher.dest.exists()
    assert fetcher.finish() == fetcher.dest


def test_cache_rm_waits_for_the_fetch_then_removes_the_model(fetcher: Fetcher) -> None:
    notices: list[str] = []
    result: list[object] = []

    def rm() -> None:
        try:
            result.extend(remove_entries(fetcher.layout, load_pins(), "tiny", log=notices.append))
        except BaseException as exc:  # handed to the test thread
            result.append(exc)

    thread = threading.Thread(target=rm)
    thread.start()
    deadline = time.monotonic() + 30
    while not notices and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting_while_held = thread.is_alive() and fetcher.dest.exists()
    fetched = fetcher.finish()  # the download was never disturbed
    thread.join(timeout=60)
    assert (len(notices), waiting_while_held) == (1, True)
    assert str(fetcher.lock) in notices[0]
    [entry] = result
    assert isinstance(entry, inventory.Entry) and (entry.kind, entry.name, entry.status) == ("model", "tiny", "removed")
    assert fetched == fetcher.dest and not fetcher.dest.exists()  # removed once the fetch was done


def test_cache_prune_leaves_what_another_process_is_fetching(
    fetcher: Fetcher, capsys: pytest.CaptureFixture[str]
) -> None:
    # the model is stale here (this process's pins do not know it): prune would remove it
    assert main(["cache", "prune", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    status = {e["path"]: e["status"] for e in doc["removed"]}
    assert status[str(fetcher.dest)] == "in use" and doc["bytes"] == 0
    assert fetcher.dest.exists()
    # the download's partial, as old as a resumed one left for more than the grace period
    partial = partial_path(fetcher.dest, SHA)
    assert partial.exists()
    later = time.time() + TEMP_GRACE_SECONDS + 60
    status = {e.path: e.status for e in prune_cache(fetcher.layout, load_pins(), dry_run=False, now=later)}
    assert (status[fetcher.dest], status[partial]) == ("in use", "in use")
    assert partial.exists()
    assert fetcher.finish() == fetcher.dest
    assert fetcher.dest.read_bytes() == DATA
    # once the fetch is done, the stale model is prunable again
    status = {e.path: e.status for e in prune_cache(fetcher.layout, load_pins(), dry_run=False)}
    assert status[fetcher.dest] == "removed" and not fetcher.dest.exists()
