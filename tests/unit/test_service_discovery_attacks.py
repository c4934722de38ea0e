"""Hostile discovery files: every reader (``discover`` for each managed agent and embedder,
``localllm ps``/``stop``, a second ``serve``) answers "no service", at once and without a
traceback, whatever sits at ``<cache>/run/service.json`` or the token file it names."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.errors import ServiceError, ServiceRunning, ServiceUnavailable
from localllm.managed import discovery
from localllm.service import control
from localllm.service.daemon import ServeOptions, Service
from tests.conftest import REPO

_GOOD: dict[str, Any] = {
    "pid": os.getpid(),
    "host": "127.0.0.1",
    "port": 1,
    "instance": "x",
    "token_file": None,
    "build": {"sha256": "b"},
    "models": {"m": {"sha256": "m", "role": "chat"}},
}


def _run_dir(cache: Path) -> Path:
    run = discovery.run_dir(cache)
    run.mkdir(parents=True, mode=0o700)
    return run


def _write(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)


def _in_child(cache: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a child with a deadline: a hang is a TimeoutExpired, not a stuck test run."""
    env = {**os.environ, "LOCALLLM_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=20, env=env, cwd=REPO
    )


_PROBE = (
    "from pathlib import Path\n"
    "from localllm.cli import main\n"
    "from localllm.managed import discovery\n"
    "print(discovery.discover(Path({cache!r}), 'b', 'm'))\n"
    "print('ps', main(['ps']))\n"
)


@pytest.mark.parametrize("where", ["service.json", "token"])
def test_a_fifo_at_the_discovery_or_token_file_is_no_service_not_a_hang(tmp_path: Path, where: str) -> None:
    cache = tmp_path / "cache"
    run = _run_dir(cache)
    if where == "token":
        _write(run / "service.json", {**_GOOD, "token_file": str(run / "token")})
    os.mkfifo(run / where, 0o600)  # private and this user's: read_text() waited for a writer for ever
    done = _in_child(cache, _PROBE.format(cache=str(cache)))
    assert done.stdout.split() == ["None", "ps", "1"], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "fields",
    [
        {"pid": 2**70},  # OverflowError from os.kill
        {"host": "a\x00b"},  # http.client.InvalidURL
        {"host": "a" * 300},  # UnicodeError from the idna codec
        {"token_file": 5},  # TypeError from Path(5)
        {"token_file": "a\x00b"},  # ValueError: embedded null byte
        {"pid": 0},  # os.kill(0, 0) signals our own group: "alive"
        {"pid": -1},
        {"pid": True},
        {"port": 99999},
        {"port": "8911"},
        {"build": "b"},
    ],
    ids=[
        "pid-2**70",
        "host-nul",
        "host-300",
        "token-int",
        "token-nul",
        "pid-0",
        "pid-minus-1",
        "pid-true",
        "port-99999",
        "port-str",
        "build-str",
    ],
)
def test_garbage_discovery_fields_are_no_service(tmp_path: Path, fields: dict[str, Any]) -> None:
    cache = tmp_path / "cache"
    _write(_run_dir(cache) / "service.json", {**_GOOD, **fields})
    assert discovery.read_discovery(cache) is None
    assert discovery.discover(cache, "b", "m") is None
    with pytest.raises(ServiceUnavailable):
        control.connect(cache)


def test_an_oversized_discovery_file_is_not_read(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = _run_dir(cache) / "service.json"
    _write(path, {**_GOOD, "started": "x" * (2 << 20)})  # a service writes a few hundred bytes
    assert discovery.read_discovery(cache) is None


def test_a_well_formed_discovery_still_reads(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run = _run_dir(cache)
    (run / "token").write_text("secret\n")
    os.chmod(run / "token", 0o600)
    _write(run / "service.json", {**_GOOD, "token_file": str(run / "token"), "host": "::1", "port": 8911})
    found = discovery.read_discovery(cache)
    assert found is not None and (found.pid, found.host, found.port) == (os.getpid(), "::1", 8911)
    assert discovery.read_token(found.token_file) == "secret"


@pytest.mark.parametrize("name", ["service.lock", "service.json", "token"])
def test_a_directory_where_the_service_writes_is_a_service_error_and_kept(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # "a bug in localllm" (IsADirectoryError) from `serve`, `serve --detach` the same via its log
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    cache = tmp_path / "cache"
    run = _run_dir(cache)
    (run / name).mkdir()
    (run / name / "keep").write_text("mine")
    with pytest.raises(ServiceError) as info:
        Service(ServeOptions(port=0), cache_root=cache).start()
    assert not isinstance(info.value, ServiceRunning)
    assert (run / name / "keep").read_text() == "mine"  # nothing removed
    assert {p.name for p in run.iterdir()} <= {name, "service.lock"}  # no token, discovery or temp file left
    (run / name / "keep").unlink()
    (run / name).rmdir()
    with Service(ServeOptions(port=0), cache_root=cache) as service:  # the lock was let go
        assert discovery.read_discovery(cache) is not None and service.port > 0


@pytest.mark.parametrize("detach", [False, True], ids=["foreground", "detach"])
def test_a_file_where_the_run_directory_goes_is_a_usable_error(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], detach: bool
) -> None:
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(cache))
    (cache / "run").write_text("mine")
    assert main(["serve", "--port", "0", "--json", *(["--detach"] if detach else [])]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] != "internal_error"  # FileExistsError: "a bug in localllm" (detached)
    assert (cache / "run").read_text() == "mine"


def test_something_else_on_the_port_trickling_its_answer_is_given_up_on(tmp_path: Path) -> None:
    # a stale discovery file whose pid is alive again (reused) and whose port another program
    # holds, answering a byte at a time: each read met the 1 s timeout, the attach waited hours
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X" * 100_000:
                if stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    conn.send(bytes([byte]))
                time.sleep(0.2)

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    cache = tmp_path / "cache"
    _write(_run_dir(cache) / "service.json", {**_GOOD, "port": listener.getsockname()[1]})
    found: list[Any] = []
    reader = threading.Thread(target=lambda: found.append(discovery.discover(cache, "b", "m")), daemon=True)
    try:
        reader.start()
        reader.join(20)  # the 5 s bound on the whole answer, with room for a loaded machine
        assert found == [None]
    finally:
        stop.set()
        listener.close()
        dripper.join(5)


def test_concurrent_detached_serves_each_report_only_their_own_log_lines(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every `serve --detach` appends to one <cache>/run/service.log; a loser's error showed the
    # log's last 10 lines: an earlier run's, and the winner's and the other losers' as its own
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(server_bin))
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(cache))
    run = _run_dir(cache)
    (run / discovery.LOG_FILE).write_text("".join(f"an earlier run's line {i}\n" for i in range(12)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "localllm", "serve", "--detach", "--port", "0", "--json"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        for _ in range(3)
    ]
    try:
        docs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        codes = [p.returncode for p in procs]
    finally:
        found = discovery.read_discovery(cache)
        if found is not None:
            assert main(["stop", "--all"]) == 0
    assert sorted(codes) == [0, 1, 1], docs
    winner = next(d for d, c in zip(docs, codes, strict=True) if c == 0)
    for doc in (d for d, c in zip(docs, codes, strict=True) if c == 1):
        assert doc["kind"] == "service_error", doc
        detail = doc["detail"]
        shown = detail.split("\n")[1:]  # the lines after the first: the instance's own log lines
        assert not any("earlier run" in line for line in shown), detail
        assert sum("already running" in line for line in shown) == 1, detail
        assert not any(f"pid {winner['pid']} at" in line for line in shown), detail
        pid = int(detail.split("(pid ")[1].split(")")[0])
        assert pid != winner["pid"] and str(pid) in doc["hint"]


def test_own_log_lines_are_found_across_a_rotation_by_another_instance(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("[pid 7] before our start\n")
    at = log.stat()
    start = (at.st_ino, at.st_size)
    with log.open("a") as fh:
        fh.write("[pid 8] mine 1\n[pid 9] theirs\n[pid 8x] not mine\n")
    assert control.own_lines(log, start, 8) == ["mine 1"]
    os.replace(log, tmp_path / "service.log.1")  # another instance rotated the log
    log.write_text("[pid 8] mine 2\n[pid 9] theirs again\n")
    assert control.own_lines(log, start, 8) == ["mine 1", "mine 2"]
