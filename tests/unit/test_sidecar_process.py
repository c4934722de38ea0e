"""The sidecar's process group: wrappers without ``exec``, the watchdog, bounded probes."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from localllm.errors import SidecarStartTimeout
from localllm.managed.server import ManagedServer
from tests.conftest import pid_gone

FAKE = Path(__file__).resolve().parent / "fakes" / "fake_llama_server.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF fake")
    return path


def _wrapper(tmp_path: Path, pidfile: Path) -> Path:
    """A ``server_bin`` that is a shell wrapper *without* exec: the server is its child."""
    path = tmp_path / "wrapped" / "llama-server"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        sleep 300 &
        echo $! >> {pidfile}
        "{sys.executable}" "{FAKE}" "$@"
    """)
    )
    path.chmod(0o755)
    return path


def _descendants(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_a_wrapper_without_exec_leaves_no_orphan_on_stop(tmp_path: Path, model: Path) -> None:
    pidfile = tmp_path / "sleepers"
    sc = ManagedServer(_wrapper(tmp_path, pidfile), model, health_timeout=30)
    try:
        sc.ensure_ready()
        assert sc.pid is not None
        pids = [sc.pid, *_descendants(sc.pid)]
        assert len(pids) >= 3  # the shell, the sleeper, the server
    finally:
        sc.stop(grace=2.0)
    for pid in pids:
        assert pid_gone(pid, within=3.0), f"pid {pid} outlived ManagedServer.stop()"


def _setsid_wrapper(tmp_path: Path, pidfile: Path) -> Path:
    """A ``server_bin`` wrapper that leaves a helper in a session of its own, then execs."""
    wrapper = tmp_path / "setsid" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        setsid sh -c 'echo $$ >> "$1"; exec sleep 300' sh {shlex.quote(str(pidfile))} &
        until grep -qx "$!" {shlex.quote(str(pidfile))} 2>/dev/null; do sleep 0.01; done
        exec "{sys.executable}" "{FAKE}" "$@"
    """)
    )
    wrapper.chmod(0o755)
    return wrapper


def test_a_helper_that_left_the_group_is_stopped_with_the_server_and_the_probe(tmp_path: Path, model: Path) -> None:
    pidfile = tmp_path / "escaped"
    sc = ManagedServer(_setsid_wrapper(tmp_path, pidfile), model, health_timeout=30)
    try:
        sc.ensure_ready()
        deadline = time.monotonic() + 10
        while len(pids := pidfile.read_text().split() if pidfile.exists() else []) < 2:
            assert time.monotonic() < deadline, "the helpers did not report their pids"
            time.sleep(0.02)
    finally:
        sc.stop(grace=2.0)
    assert len(pids) == 2  # one from the --help probe, one from the server
    for pid in pids:  # each in a session of its own: no group signal reaches it
        assert pid_gone(int(pid), within=3.0), f"pid {pid} outlived ManagedServer.stop()"


_PARENT = textwrap.dedent("""
    import sys, time, psutil
    from pathlib import Path
    from localllm.managed.server import ManagedServer
    sc = ManagedServer(Path(sys.argv[1]), Path(sys.argv[2]), health_timeout=30)
    sc.ensure_ready()
    pids = [sc.pid] + [p.pid for p in psutil.Process(sc.pid).children(recursive=True)]
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(300)
""")


@contextlib.contextmanager
def _parent(wrapper: Path, model: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """A process running a ManagedServer of ``wrapper`` (its pids printed); killed at exit."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(wrapper), str(model)],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert parent.stdout is not None
        yield parent, [int(x) for x in parent.stdout.readline().split()]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_the_watchdog_stops_the_whole_group_when_the_parent_is_killed(tmp_path: Path, model: Path) -> None:
    with _parent(_wrapper(tmp_path, tmp_path / "sleepers"), model) as (parent, pids):
        assert len(pids) >= 3
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        for pid in pids:
            assert pid_gone(pid, within=5.0), f"pid {pid} outlived its SIGKILLed parent"


def test_the_watchdog_also_kills_a_helper_that_left_the_group(tmp_path: Path, model: Path) -> None:
    """The parent SIGKILLed: the watchdog notes the server's descendants before it signals
    the group, so a wrapper's ``setsid`` helper (no group signal reaches it) dies too."""
    pidfile = tmp_path / "escaped"
    try:
        with _parent(_setsid_wrapper(tmp_path, pidfile), model) as (parent, pids):
            server = pids[0]
            helpers = [int(pid) for pid in pidfile.read_text().split()]
            assert len(helpers) == 2  # the --help probe's (already killed) and the server's
            assert psutil.Process(helpers[1]).ppid() == server  # alive, outside the server's group
            assert os.getpgid(helpers[1]) != os.getpgid(server)
            parent.send_signal(signal.SIGKILL)
            parent.wait(10)
            assert pid_gone(server, within=5.0)
            assert pid_gone(helpers[1], within=5.0), "the setsid helper outlived its SIGKILLed parent"
    finally:
        for pid in pidfile.read_text().split() if pidfile.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _hangs_on_help(tmp_path: Path) -> Path:
    path = tmp_path / "hang" / "llama-server"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in --help) sleep 300 ;; esac
        exec "{sys.executable}" "{FAKE}" "$@"
    """)
    )
    path.chmod(0o755)
    return path


@pytest.mark.slow
def test_a_binary_hanging_on_help_still_starts_within_the_health_timeout(tmp_path: Path, model: Path) -> None:
    sc = ManagedServer(_hangs_on_help(tmp_path), model, health_timeout=4)
    try:
        started = time.monotonic()
        url = sc.ensure_ready()
        elapsed = time.monotonic() - started
        assert url.startswith("http://127.0.0.1:")
        assert elapsed < 4.0
        assert "--no-webui" not in sc.argv() and "--no-ui" not in sc.argv()
    finally:
        sc.stop(grace=1.0)


@pytest.mark.slow
def test_a_hanging_help_with_a_server_that_never_gets_ready_reports_on_time(tmp_path: Path, model: Path) -> None:
    sc = ManagedServer(_hangs_on_help(tmp_path), model, health_timeout=2, env={"FAKE_LLAMA_LOAD_DELAY": "60"})
    try:
        started = time.monotonic()
        with pytest.raises(SidecarStartTimeout):
            sc.ensure_ready()
        assert time.monotonic() - started < 3.5  # was 30 s: the --help probe had its own timeout
    finally:
        sc.stop(grace=0.5)
