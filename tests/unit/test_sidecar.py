"""Sidecar lifecycle against a fake llama-server *process* (tests/unit/fakes/fake_llama_server.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from localllm.errors import DownloadCancelled, FetchError, SidecarError, SidecarExited, SidecarStartTimeout
from localllm.managed import server as server_mod
from localllm.managed.server import ManagedServer, ServerState
from tests.conftest import pid_gone
from tests.unit.fakes.slow_model import MODEL_ID, SlowModel, slow_model

FAKE = Path(__file__).resolve().parent / "fakes" / "fake_llama_server.py"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF fake")
    return path


@pytest.fixture
def spawn_log(tmp_path: Path) -> Path:
    return tmp_path / "spawn.jsonl"


def events(log: Path, kind: str | None = None) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r["event"] == kind]


def make(
    server_bin: Path, model: Path | str, spawn_log: Path, *, fake: dict[str, str] | None = None, **kw: Any
) -> ManagedServer:
    env = {"FAKE_LLAMA_SPAWN_LOG": str(spawn_log), **(fake or {})}
    kw.setdefault("health_timeout", 30.0)
    return ManagedServer(server_bin, model, env=env, **kw)


@pytest.fixture
def cleanup() -> Any:
    made: list[ManagedServer] = []
    yield made.append
    for sc in made:
        sc.stop(grace=0.5)


def test_a_server_killed_by_sigill_says_to_rebuild_it_here(
    server_bin: Path, model: Path, spawn_log: Path, cleanup: Any
) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_MODE": "exit_during_start", "FAKE_LLAMA_EXIT_CODE": "-4"})
    cleanup(sc)
    with pytest.raises(SidecarExited) as info:
        sc.ensure_ready()
    assert info.value.returncode == -signal.SIGILL
    assert info.value.hint == server_mod._SIGILL_ADVICE
    assert server_mod._describe_exit(-signal.SIGILL).endswith(f"({server_mod._SIGILL_ADVICE})")


# -- readiness -----------------------------------------------------------------------------
def test_ready_only_after_health_turns_200(
    server_bin: Path, model: Path, spawn_log: Path, tmp_path: Path, cleanup: Any
) -> None:
    requests = tmp_path / "requests.jsonl"
    sc = make(
        server_bin,
        model,
        spawn_log,
        fake={"FAKE_LLAMA_LOAD_DELAY": "1.0", "FAKE_LLAMA_REQUEST_LOG": str(requests)},
    )
    cleanup(sc)
    assert sc.state is ServerState.CREATED and sc.pid is None  # nothing spawned yet
    url = sc.ensure_ready()
    assert sc.state is ServerState.READY
    assert url == sc.base_url
    assert url == f"http://127.0.0.1:{events(spawn_log, 'ready')[0]['port']}"
    health = [json.loads(line)["status"] for line in requests.read_text().splitlines()]
    # The socket was found while the model loaded: polled through 503s, ready on 200.
    assert 503 in health
    assert health[-1] == 200
    assert httpx.get(url + "/health", trust_env=False).json() == {"status": "ok"}


def test_argv_and_environment_are_deliberate(
    server_bin: Path, model: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, cleanup: Any
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/stale/lib")
    monkeypatch.setenv("LLAMA_ARG_EMBEDDINGS", "1")  # a user's setting for their own server
    sc = make(
        server_bin,
        model,
        spawn_log,
        parallel=2,
        ctx_per_slot=1024,
        threads=3,
        args=["--embeddings", "--pooling", "mean"],
        api_key="s3cret-key",
    )
    cleanup(sc)
    sc.ensure_ready()
    start = events(spawn_log, "start")[0]
    assert start["argv"] == [
        "-m", str(model), "--host", "127.0.0.1", "--port", "0", "--parallel", "2",
        "-c", "2048", "-t", "3", "--no-webui", "--swa-full", "--embeddings", "--pooling", "mean",
    ]  # fmt: skip
    assert start["ld_library_path"] == f"{server_bin.parent}{os.pathsep}/stale/lib"
    assert start["api_key_set"] is True  # through LLAMA_API_KEY, not argv
    assert "s3cret-key" not in repr(sc) and "s3cret-key" not in " ".join(sc.argv())
    proc_env = psutil.Process(sc.pid).environ()
    assert "LLAMA_ARG_EMBEDDINGS" not in proc_env
    assert proc_env["LLAMA_API_KEY"] == "s3cret-key"


def test_no_webui_only_when_the_binary_has_it(
    server_bin: Path, model: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, cleanup: Any
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_HELP", "none")  # --help also sees the sidecar's env
    sc = make(server_bin, model, spawn_log, ctx_per_slot=None)
    cleanup(sc)
    sc.ensure_ready()
    argv = events(spawn_log, "start")[0]["argv"]
    assert "--no-webui" not in argv and "--no-ui" not in argv and "--swa-full" not in argv
    assert "-c" not in argv


def test_chat_servers_keep_a_full_swa_cache_so_prompt_prefixes_are_reused(
    server_bin: Path, model: Path, spawn_log: Path, cleanup: Any
) -> None:
    # gemma-3's sliding-window cache made llama-server re-evaluate the whole prompt on every
    # call (cache_n 1 of 440 tokens on the demo gate); --swa-full lets it reuse the prefix
    chat = make(server_bin, model, spawn_log)
    embedding = make(server_bin, model, spawn_log, role="embedding", args=["--embeddings"])
    cleanup(chat)
    cleanup(embedding)
    chat.ensure_ready()
    embedding.ensure_ready()
    starts = events(spawn_log, "start")
    assert ["--swa-full" in s["argv"] for s in starts] == [True, False]


def test_extra_args_may_not_override_managed_flags(server_bin: Path, model: Path) -> None:
    with pytest.raises(ValueError, match="--port"):
        ManagedServer(server_bin, model, args=["--port", "8080"])
    with pytest.raises(ValueError, match="parallel"):
        ManagedServer(server_bin, model, parallel=0)


def test_stderr_flood_does_not_stall_start(server_bin: Path, model: Path, spawn_log: Path, cleanup: Any) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_STDERR_FLOOD": str(3 * 1024 * 1024)})
    cleanup(sc)
    sc.ensure_ready()
    tail = sc.stderr_tail(5)
    assert "listening on http://127.0.0.1:" in tail
    assert len(tail.splitlines()) == 5
    kept = sc.stderr_tail(1000)
    assert 100 < len(kept.splitlines()) < 1000  # only a bounded tail is kept:
    assert len(kept.encode()) <= server_mod._TAIL_BYTES + 3  # its bytes, "..." when cut


# -- start-up failures ------------------------------------------------------------------
def test_exit_during_start_fails_at_once_with_code_and_tail(server_bin: Path, model: Path, spawn_log: Path) -> None:
    sc = make(
        server_bin,
        model,
        spawn_log,
        health_timeout=120.0,
        args=["--api-key", "hunter2"],
        fake={"FAKE_LLAMA_MODE": "exit_during_start", "FAKE_LLAMA_EXIT_CODE": "3"},
    )
    started = time.monotonic()
    with pytest.raises(SidecarExited) as info:
        sc.ensure_ready()
    assert time.monotonic() - started < 60  # did not sit out the 120 s health timeout
    err = info.value
    assert err.returncode == 3
    assert "exiting due to model loading error" in err.stderr_tail
    assert "exiting due to model loading error" in str(err)
    assert err.argv[-2:] == ["--api-key", "***"]
    assert "hunter2" not in str(err) and "hunter2" not in err.hint
    assert sc.state is ServerState.FAILED
    assert not sc.is_alive()


def test_missing_binary_is_a_sidecar_error(tmp_path: Path, model: Path) -> None:
    sc = ManagedServer(tmp_path / "nope" / "llama-server", model)
    with pytest.raises(SidecarError, match="nope/llama-server") as info:
        sc.ensure_ready()
    assert "LOCALLLM_SERVER_BIN" in info.value.hint


def test_hang_times_out_and_the_process_is_gone(server_bin: Path, model: Path, spawn_log: Path) -> None:
    sc = make(server_bin, model, spawn_log, health_timeout=1.5, fake={"FAKE_LLAMA_MODE": "hang_start"})
    with pytest.raises(SidecarStartTimeout) as info:
        sc.ensure_ready()
    assert isinstance(info.value, TimeoutError)
    assert "loading model" in str(info.value)  # the stderr tail rides along
    pid = events(spawn_log, "start")[0]["pid"]
    assert sc.pid == pid
    assert pid_gone(pid, within=0.0)
    assert sc.state is ServerState.FAILED


@pytest.mark.slow
def test_configured_busy_port_is_a_clear_exit(server_bin: Path, model: Path, spawn_log: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sc = make(server_bin, model, spawn_log, port=port)
        with pytest.raises(SidecarExited) as info:
            sc.ensure_ready()
    assert info.value.returncode == 1
    assert "couldn't bind" in info.value.stderr_tail
    assert f"port {port} is already in use" in info.value.hint
    assert len(events(spawn_log, "start")) == 1  # a configured port is not retried


def _slow_to_bind(tmp_path: Path) -> Path:
    """A ``server_bin`` whose server waits 0.5 s before it binds (as a GPU build's init does)."""
    path = tmp_path / "slow-bind" / "llama-server"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\ncase "$1" in --help) ;; *) sleep 0.5 ;; esac\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


def test_a_fixed_port_answered_by_another_server_is_refused_and_its_canary_not_kept(
    tmp_path: Path, model: Path, spawn_log: Path, cleanup: Any
) -> None:
    from localllm.managed import probes

    requests = tmp_path / "squatter.jsonl"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    squatter = subprocess.Popen(
        [sys.executable, str(FAKE), "-m", str(model), "--port", str(port)],
        env={**os.environ, "FAKE_LLAMA_CONTENT": "no", "FAKE_LLAMA_REQUEST_LOG": str(requests)},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not requests.exists() or not requests.read_text():
            assert time.monotonic() < deadline and squatter.poll() is None
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            time.sleep(0.05)
        binary = _slow_to_bind(tmp_path)
        sc = make(binary, model, spawn_log, port=port)
        cleanup(sc)
        with pytest.raises(SidecarError) as info:
            sc.ensure_ready()
    finally:
        squatter.terminate()
        squatter.wait(10)
    assert type(info.value) is SidecarError  # refused at once: neither an exit nor a timeout
    assert sc.state is ServerState.FAILED and sc.base_url is None
    posts = [r for r in events(requests) if r["method"] == "POST"]
    assert posts == []  # the canary never asked the other server
    assert "grammar_enforced" not in probes.recall(probes.build_id(binary))
    assert sc.pid is not None and pid_gone(sc.pid, within=3.0)  # ours was stopped


@pytest.mark.slow
def test_build_without_port_zero_falls_back_to_allocated_ports(
    server_bin: Path, model: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, cleanup: Any
) -> None:
    # An old build echoes "port: 0" and (here) its socket cannot be inspected.
    monkeypatch.setattr(server_mod._Process, "_listening_socket", lambda self: None)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    ports = iter([busy_port])
    real_free_port = server_mod._free_port
    monkeypatch.setattr(server_mod, "_free_port", lambda: next(ports, None) or real_free_port())
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_LOG": "zero"})
    cleanup(sc)
    try:
        url = sc.ensure_ready()
    finally:
        busy.close()
    starts = [e["argv"][e["argv"].index("--port") + 1] for e in events(spawn_log, "start")]
    assert starts[0] == "0"  # tried --port 0 first
    assert starts[1] == str(busy_port)
    assert len(starts) == 3  # then a port someone else took (bind failed), then a free one
    assert url == f"http://127.0.0.1:{starts[2]}"
    sc.stop()
    sc.ensure_ready()  # the verdict is cached: no second --port 0 attempt
    assert [e["argv"][e["argv"].index("--port") + 1] for e in events(spawn_log, "start")][3] != "0"


def test_old_log_format_is_understood(server_bin: Path, model: Path, spawn_log: Path, cleanup: Any) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_LOG": "old"})
    cleanup(sc)
    assert sc.ensure_ready() == f"http://127.0.0.1:{events(spawn_log, 'ready')[0]['port']}"


def test_a_fifo_at_the_kept_log_path_neither_hangs_the_start_nor_is_opened_again(
    server_bin: Path, model: Path, spawn_log: Path, cleanup: Any, caplog: pytest.LogCaptureFixture
) -> None:
    log = server_mod.log_path_for(model)
    log.parent.mkdir(parents=True)
    os.mkfifo(log)
    sc = make(server_bin, model, spawn_log, health_timeout=10)
    cleanup(sc)
    outcome: dict[str, Any] = {}
    starter = threading.Thread(target=lambda: outcome.update(url=sc.ensure_ready()), daemon=True)
    starter.start()
    starter.join(20)  # generous: a blocked open of the FIFO never returns
    hung = starter.is_alive()
    if hung:  # let the blocked writer go, so that cleanup can stop the server
        reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
        starter.join(10)
        os.close(reader)
    assert not hung
    assert outcome["url"].startswith("http://127.0.0.1:")
    assert stat.S_ISFIFO(log.lstat().st_mode)
    warned = [r for r in caplog.records if r.name == server_mod.__name__ and r.levelno == logging.WARNING]
    assert len(warned) == 1  # once per server, not per stderr line


def test_a_symlink_at_the_kept_log_path_is_not_written_through(
    server_bin: Path, model: Path, spawn_log: Path, tmp_path: Path, cleanup: Any
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    log = server_mod.log_path_for(model)
    log.parent.mkdir(parents=True)
    log.symlink_to(victim)
    sc = make(server_bin, model, spawn_log)
    cleanup(sc)
    sc.ensure_ready()
    sc.stop()
    assert victim.read_text() == "the user's own file\n"
    assert log.is_symlink() and not log.with_name(log.name + ".1").exists()


def test_a_kept_log_is_still_appended_and_rotated(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "m.log"
    kept = server_mod._KeptLog(path, "header")
    kept.write("line")
    assert path.read_text().splitlines() == ["header", "line"]
    path.write_bytes(b"x" * (server_mod.LOG_LIMIT + 1))
    kept.write("after")
    assert path.read_text() == "after\n"
    assert path.with_name("m.log.1").stat().st_size == server_mod.LOG_LIMIT + 1


def test_a_server_that_prints_nothing_leaves_no_empty_stderr_section(tmp_path: Path, model: Path) -> None:
    silent = tmp_path / "silent" / "llama-server"
    silent.parent.mkdir()
    silent.write_text('#!/bin/sh\ncase "$1" in --help) exit 0 ;; esac\nexec sleep 60\n')
    silent.chmod(0o755)
    sc = ManagedServer(silent, model, health_timeout=1.0)
    with pytest.raises(SidecarStartTimeout) as info:
        sc.ensure_ready()
    assert sc.stderr_tail() == ""
    assert not str(info.value).rstrip().endswith(":")  # was "...; last stderr lines:" and nothing


# -- concurrency ---------------------------------------------------------------------------
def test_stampede_of_sixteen_threads_spawns_once(server_bin: Path, model: Path, spawn_log: Path, cleanup: Any) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_LOAD_DELAY": "0.5"})
    cleanup(sc)
    barrier = threading.Barrier(16)
    urls: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        barrier.wait()
        try:
            urls.append(sc.ensure_ready())
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(urls) == 16 and len(set(urls)) == 1
    assert len(events(spawn_log, "start")) == 1


def test_stop_while_starting_aborts_the_start(server_bin: Path, model: Path, spawn_log: Path) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_MODE": "hang_start"})
    errors: list[BaseException] = []

    def start() -> None:
        try:
            sc.ensure_ready()
        except BaseException as exc:  # asserted below
            errors.append(exc)

    t = threading.Thread(target=start)
    t.start()
    deadline = time.monotonic() + 20
    while not events(spawn_log, "start") and time.monotonic() < deadline:
        time.sleep(0.02)
    sc.stop()
    t.join(20)
    assert len(errors) == 1 and isinstance(errors[0], SidecarError)
    assert "stopped while starting" in str(errors[0])
    assert sc.state is ServerState.STOPPED
    assert pid_gone(events(spawn_log, "start")[0]["pid"], within=0.0)


# -- fetching: states, sharing, cancelling ------------------------------------------------
def _cache_root() -> Path:
    return Path(os.environ["LOCALLLM_CACHE_DIR"])


@pytest.mark.slow
def test_states_go_created_fetching_starting_ready_stopped(
    server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, cleanup: Any
) -> None:
    with slow_model(monkeypatch, size=4096, bytes_per_tick=1024, tick=0.2) as slow:  # ~0.8 s
        sc = make(server_bin, MODEL_ID, spawn_log, fake={"FAKE_LLAMA_LOAD_DELAY": "0.8"})
        cleanup(sc)
        seen = [sc.state]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if (state := sc.state) is not seen[-1]:
                    seen.append(state)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            sc.ensure_ready()
        finally:
            done.set()
            watcher.join()
    if sc.state is not seen[-1]:
        seen.append(sc.state)
    assert seen == [ServerState.CREATED, ServerState.FETCHING, ServerState.STARTING, ServerState.READY]
    assert sc.model is not None and sc.model.read_bytes() == slow.data
    assert sc.stop() == 0 and sc.state is ServerState.STOPPED


def test_failed_fetch_is_failed_and_the_next_call_fetches_again(
    server_bin: Path, tmp_path: Path, spawn_log: Path, cleanup: Any
) -> None:
    later = tmp_path / "later.gguf"
    sc = make(server_bin, later, spawn_log)
    cleanup(sc)
    with pytest.raises(FetchError) as info:
        sc.ensure_ready()
    assert str(later) in str(info.value)
    assert sc.state is ServerState.FAILED and events(spawn_log) == []
    later.write_bytes(b"GGUF")
    sc.ensure_ready()
    assert sc.state is ServerState.READY and sc.model == later


def test_stampede_during_a_first_use_download_fetches_and_spawns_once(
    server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, cleanup: Any
) -> None:
    with slow_model(monkeypatch, size=4096, bytes_per_tick=1024, tick=0.1) as slow:
        sc = make(server_bin, MODEL_ID, spawn_log)
        cleanup(sc)
        barrier = threading.Barrier(16)
        urls: list[str] = []
        errors: list[BaseException] = []

        def call() -> None:
            barrier.wait()
            try:
                urls.append(sc.ensure_ready())
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert slow.gets() == 1
    assert errors == []
    assert len(urls) == 16 and len(set(urls)) == 1
    assert len(events(spawn_log, "start")) == 1


@pytest.mark.parametrize("tick", [0.25, 30.0], ids=["trickling", "stalled"])
def test_stop_during_a_first_use_download_cancels_it_within_a_second(
    server_bin: Path, spawn_log: Path, monkeypatch: pytest.MonkeyPatch, tick: float
) -> None:
    with slow_model(monkeypatch, size=1 << 20, tick=tick) as slow:  # 1 KiB per tick: minutes to finish
        sc = make(server_bin, MODEL_ID, spawn_log)
        errors: list[BaseException] = []

        def start() -> None:
            try:
                sc.ensure_ready()
            except BaseException as exc:  # asserted below
                errors.append(exc)

        t = threading.Thread(target=start)
        t.start()
        slow.wait_for_partial(_cache_root())
        assert sc.state is ServerState.FETCHING
        started = time.monotonic()
        sc.stop()
        elapsed = time.monotonic() - started
        t.join(5)
    assert elapsed < 1.0
    assert not t.is_alive() and len(errors) == 1
    assert isinstance(errors[0], SidecarError) and isinstance(errors[0].__cause__, DownloadCancelled)
    assert SlowModel.partial_files(_cache_root()) == []
    assert not list((_cache_root() / "models").rglob("*.gguf"))
    assert sc.state is ServerState.STOPPED and events(spawn_log) == []


# -- crashes -------------------------------------------------------------------------------
def test_crash_after_ready_is_detected_and_respawned(
    server_bin: Path, model: Path, spawn_log: Path, cleanup: Any
) -> None:
    sc = make(
        server_bin,
        model,
        spawn_log,
        fake={"FAKE_LLAMA_MODE": "crash_after_ready", "FAKE_LLAMA_CRASH_AFTER": "0.3"},
    )
    cleanup(sc)
    sc.ensure_ready()
    first = sc.pid
    assert first is not None
    deadline = time.monotonic() + 20
    while sc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    detail = sc.crash_detail()
    assert detail is not None
    assert "exited with code 134" in detail and "simulated crash" in detail
    assert sc.state is ServerState.FAILED
    sc.ensure_ready()
    assert sc.pid != first
    assert len(events(spawn_log, "start")) == 2
    assert sc.crash_detail(pid=first) == detail  # still there for the request that hit it


def test_server_killed_with_sigkill_is_respawned(server_bin: Path, model: Path, spawn_log: Path, cleanup: Any) -> None:
    sc = make(server_bin, model, spawn_log)
    cleanup(sc)
    url = sc.ensure_ready()
    first = sc.pid
    assert first is not None and sc.crash_detail() is None
    os.kill(first, signal.SIGKILL)
    with pytest.raises(httpx.TransportError):
        # A request to the dead server fails at the transport; the agent asks why.
        for _ in range(200):
            httpx.get(url + "/health", trust_env=False, timeout=2.0)
            time.sleep(0.02)
    assert "killed by SIGKILL" in (sc.crash_detail(pid=first) or "")
    assert sc.state is ServerState.FAILED
    new_url = sc.ensure_ready()
    assert sc.pid != first and sc.state is ServerState.READY
    assert httpx.get(new_url + "/health", trust_env=False).status_code == 200
    assert len(events(spawn_log, "start")) == 2


# -- stopping ------------------------------------------------------------------------------
def test_well_behaved_server_gets_only_sigterm(server_bin: Path, model: Path, spawn_log: Path) -> None:
    sc = make(server_bin, model, spawn_log)
    sc.ensure_ready()
    pid = sc.pid
    assert (sc.rss() or 0) > 1 << 20  # a live process, measured
    assert sc.stop() == 0
    assert sc.rss() is None
    assert sc.state is ServerState.STOPPED
    assert sc.crash_detail() is None  # an exit we asked for is not a crash
    assert [e["signal"] for e in events(spawn_log, "signal")] == ["SIGTERM"]
    assert events(spawn_log, "exit") == [{"event": "exit", "pid": pid, "code": 0}]
    assert sc.stop() == 0  # idempotent
    assert sc.state is ServerState.STOPPED and not sc.is_alive()


def test_wedged_server_gets_sigkill_after_grace(server_bin: Path, model: Path, spawn_log: Path) -> None:
    sc = make(server_bin, model, spawn_log, fake={"FAKE_LLAMA_MODE": "ignore_sigterm"})
    sc.ensure_ready()
    assert sc.stop(grace=0.5) == -signal.SIGKILL
    assert [e["signal"] for e in events(spawn_log, "signal")] == ["SIGTERM"]
    assert events(spawn_log, "exit") == []  # it never got to exit on its own


def test_context_manager_stops_and_a_stopped_sidecar_can_start_again(
    server_bin: Path, model: Path, spawn_log: Path
) -> None:
    with make(server_bin, model, spawn_log) as sc:
        sc.ensure_ready()
        pid = sc.pid
        assert pid is not None
    assert sc.state is ServerState.STOPPED and pid_gone(pid, within=0.0)
    with sc:
        sc.ensure_ready()
        assert sc.pid != pid
    assert len(events(spawn_log, "start")) == 2


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from localllm.managed.server import ManagedServer

    sc = ManagedServer(Path(sys.argv[1]), Path(sys.argv[2]), env={"FAKE_LLAMA_SPAWN_LOG": sys.argv[3]})
    sc.ensure_ready()
    print(sc.pid, flush=True)
    if sys.argv[4] == "hang":
        time.sleep(600)
    # "exit": leave without stop(); the exit-time finalizer must stop the server.
    """
)


def _run_child(
    tmp_path: Path, server_bin: Path, model: Path, spawn_log: Path, how: str
) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(server_bin), str(model), str(spawn_log), how],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.stdout.close()
    return child, int(line)


def test_sigkilled_parent_leaves_no_orphan(tmp_path: Path, server_bin: Path, model: Path, spawn_log: Path) -> None:
    child, server_pid = _run_child(tmp_path, server_bin, model, spawn_log, "hang")
    assert psutil.Process(server_pid).is_running()
    child.kill()
    child.wait()
    assert pid_gone(server_pid, within=2.0)
    assert [e["signal"] for e in events(spawn_log, "signal")] == ["SIGTERM"]  # from the watchdog


def test_parent_exiting_without_stop_stops_the_server(
    tmp_path: Path, server_bin: Path, model: Path, spawn_log: Path
) -> None:
    child, server_pid = _run_child(tmp_path, server_bin, model, spawn_log, "exit")
    assert child.wait(30) == 0
    assert pid_gone(server_pid, within=2.0)
    assert events(spawn_log, "exit") == [{"event": "exit", "pid": server_pid, "code": 0}]


# -- the fake itself (other suites rely on it) -----------------------------------------
def test_fake_speaks_the_api_with_key_enforcement(server_bin: Path, model: Path, spawn_log: Path, cleanup: Any) -> None:
    sc = make(server_bin, model, spawn_log, api_key="k1", parallel=2)
    cleanup(sc)
    url = sc.ensure_ready()
    auth = {"Authorization": "Bearer k1"}
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        assert client.get(url + "/v1/models").status_code == 401
        assert client.get(url + "/health").status_code == 200
        assert client.get(url + "/props", headers={"X-Api-Key": "k1"}).json()["total_slots"] == 2
        schema = {
            "type": "object",
            "properties": {"verdict": {"enum": ["yes", "no"]}, "score": {"type": "number", "minimum": 2}},
            "required": ["verdict", "score"],
        }
        body = {
            "messages": [{"role": "user", "content": "Is it?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        }
        answer = client.post(url + "/v1/chat/completions", json=body, headers=auth).json()
        assert json.loads(answer["choices"][0]["message"]["content"]) == {"verdict": "yes", "score": 2.0}
        assert answer["usage"]["prompt_tokens"] == 3 and "timings" in answer
        emb = client.post(url + "/v1/embeddings", json={"input": ["a"]}, headers=auth)
        assert emb.status_code == 501  # started without --embeddings, like the real one


def test_fake_embeddings_are_deterministic_and_normalised(
    server_bin: Path, model: Path, spawn_log: Path, cleanup: Any
) -> None:
    sc = make(server_bin, model, spawn_log, parallel=1, args=["--embeddings"], fake={"FAKE_LLAMA_EMBD_DIM": "8"})
    cleanup(sc)
    url = sc.ensure_ready()
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        data = client.post(url + "/v1/embeddings", json={"input": ["apple", "pear", "apple"]}).json()["data"]
        assert [d["index"] for d in data] == [0, 1, 2]
        assert data[0]["embedding"] == data[2]["embedding"] != data[1]["embedding"]
        assert abs(sum(x * x for x in data[1]["embedding"]) - 1.0) < 1e-9
        too_long = client.post(url + "/v1/embeddings", json={"input": "w " * 600})
        assert too_long.status_code == 500 and "too large to process" in too_long.text


def test_openmp_spin_is_short_unless_the_user_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "llama-server"
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert server_mod._child_env(binary, None)["GOMP_SPINCOUNT"] == "500"
    assert "GOMP_SPINCOUNT" not in server_mod._child_env(binary, {"OMP_WAIT_POLICY": "ACTIVE"})
    monkeypatch.setenv("GOMP_SPINCOUNT", "5000")
    assert server_mod._child_env(binary, None)["GOMP_SPINCOUNT"] == "5000"


def test_an_exit_with_an_empty_stderr_says_so_once() -> None:
    quiet = SidecarExited(argv=["llama-server"], returncode=0, stderr_tail="")
    # before: "…; last stderr lines:" then the CLI appended the cause: the same line twice
    assert not str(quiet).rstrip().endswith(":") and str(quiet).count("exited with code 0") == 1
    loud = SidecarExited(argv=["llama-server"], returncode=1, stderr_tail="error: bad model")
    assert str(loud).endswith("last stderr lines:\nerror: bad model")
