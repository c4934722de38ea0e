"""Child-process control: process groups, one stderr tail, bounded stops and probes."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from localllm import _process
from tests.conftest import pid_gone


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def _pids(path: Path, count: int, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) >= count:
                return pids
        time.sleep(0.02)
    raise AssertionError(f"children did not report their pids in {path}")


# -- tail ---------------------------------------------------------------------------


def test_tail_keeps_the_end_within_bytes_and_lines() -> None:
    assert _process.tail("short") == "short"
    assert _process.tail("a" * 10 + "END", limit=5) == "...aaEND"
    assert _process.tail("1\n2\n3\n4", lines=2) == "3\n4"
    assert _process.tail("1\n2\n3", lines=0) == ""
    cut = _process.tail("é" * 10, limit=5)  # never half a character
    assert cut.startswith("...") and set(cut[3:]) == {"é"} and len(cut[3:].encode()) <= 5


# -- StderrTail ---------------------------------------------------------------------


def test_stderr_tail_is_bounded_and_never_blocks_the_child() -> None:
    code = "import sys\nfor i in range(20000): sys.stderr.write(f'line {i:05d} ' + 'x' * 40 + '\\n')\n"
    proc = _process.spawn([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert proc.stderr is not None
    buf = _process.StderrTail(proc.stderr, name="t", limit=4096)
    assert proc.wait(timeout=20) == 0  # ~1 MB through a 64 KiB pipe: only a drain gets it out
    assert buf.join(5)
    text = buf.text()
    assert len(text.encode()) <= 4096 + 65536
    assert text.rstrip().endswith("line 19999 " + "x" * 40)
    assert buf.lines(2).splitlines()[-1].startswith("line 19999")
    assert len(buf.lines(3).splitlines()) == 3


def test_stderr_tail_keeps_the_full_limit_after_a_big_chunk_and_a_small_one() -> None:
    code = "import os, time\nos.write(2, b'x' * 200_000)\ntime.sleep(0.2)\nos.write(2, b'\\nend\\n')\n"
    proc = _process.spawn([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert proc.stderr is not None
    buf = _process.StderrTail(proc.stderr, name="t", limit=4096)
    proc.wait(timeout=10)
    assert buf.join(5)
    text = buf.text()
    assert len(text) == 4096 and text.endswith("x\nend\n")


def test_stderr_tail_hands_every_line_to_on_line() -> None:
    seen: list[str] = []
    proc = _process.spawn(
        [sys.executable, "-c", "import sys; sys.stderr.write('a\\r\\nb\\nlast-no-newline')"], stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    buf = _process.StderrTail(proc.stderr, name="t", on_line=seen.append)
    proc.wait(timeout=10)
    assert buf.join(5) and buf.eof.is_set()
    assert seen == ["a", "b", "last-no-newline"]
    assert proc.stderr.closed  # the drain closed it at EOF


# -- stop_group ---------------------------------------------------------------------


def test_a_wrapper_without_exec_leaves_no_orphan(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    child = f"{sys.executable} -c \"import os,time; open('{pidfile}','a').write(f'{{os.getpid()}} '); time.sleep(60)\""
    wrapper = _script(
        tmp_path / "llama-server",
        f"""
        {child} &
        {child} &
        {child}
    """,
    )
    proc = _process.spawn([str(wrapper)])
    pids = _pids(pidfile, 3)
    _process.stop_group(proc, grace=2.0)
    assert proc.returncode is not None
    for pid in pids:
        assert pid_gone(pid, within=2.0), f"pid {pid} outlived the stop"
    assert not _process.group_alive(proc.pid)


def test_a_child_ignoring_sigterm_is_killed_after_the_grace() -> None:
    code = "import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    proc = _process.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    code_ = _process.stop_group(proc, grace=0.5)
    elapsed = time.monotonic() - started
    proc.stdout.close()
    assert code_ == -9
    assert 0.4 <= elapsed < 3.0


def test_a_clean_shutdown_inside_the_grace_keeps_its_exit_code() -> None:
    code = (
        "import signal,sys,time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = _process.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert _process.stop_group(proc, grace=5.0) == 0
    proc.stdout.close()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_wait_exited_sees_the_exit_without_reaping(pidfd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of waiting (a pidfd on Linux, 20 ms polling elsewhere) report the exit
    and leave the child unreaped (its pid, and so its group id, stay ours)."""
    import os

    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    elif sys.platform != "linux":  # pidfds are Linux's (>= 5.3; CI's kernel has them: no skip there)
        pytest.skip("pidfds are Linux-only")
    code = "import sys; sys.stdin.readline(); sys.exit(7)"
    proc = _process.spawn([sys.executable, "-c", code], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    assert _process.wait_exited(proc, 0.2) is False  # still running: the timeout is kept
    assert _process.exit_code(proc) is None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert _process.wait_exited(proc, 30.0) is True
    assert proc.returncode is None  # not reaped
    assert os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    assert _process.wait_exited(proc, 0.0) is True
    assert proc.wait() == 7


def test_wait_exited_on_a_reaped_child_returns_at_once() -> None:
    proc = _process.spawn([sys.executable, "-c", "pass"])
    assert proc.wait(timeout=30) == 0
    assert _process.wait_exited(proc, 30.0) is True


def test_stragglers_of_an_exited_leader_are_stopped(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    child = f"{sys.executable} -c \"import os,time; open('{pidfile}','a').write(f'{{os.getpid()}} '); time.sleep(60)\""
    wrapper = _script(tmp_path / "w", f"{child} &\nexit 3\n")
    proc = _process.spawn([str(wrapper)])
    (pid,) = _pids(pidfile, 1)
    assert proc.wait(timeout=10) == 3
    assert not pid_gone(pid)
    assert _process.stop_group(proc, grace=1.0) == 3
    assert pid_gone(pid, within=2.0)


# -- run_probe ----------------------------------------------------------------------


def test_probe_returns_merged_output_and_exit_code(tmp_path: Path) -> None:
    probe = _script(tmp_path / "p", "echo usage: --no-webui\necho oops >&2\nexit 4\n")
    result = _process.run_probe([str(probe), "--help"], timeout=10)
    assert result.returncode == 4 and not result.timed_out
    assert "--no-webui" in result.output and "oops" in result.output


def test_a_hanging_probe_respects_the_deadline(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    probe = _script(tmp_path / "p", f"echo partial\necho $$ > {shlex.quote(str(pidfile))}\nsleep 60\n")
    started = time.monotonic()
    result = _process.run_probe([str(probe)], timeout=0.5)
    assert time.monotonic() - started < 2.0
    assert result.timed_out and result.returncode is None
    assert "partial" in result.output
    assert pid_gone(int(pidfile.read_text()), within=2.0)


def test_a_probe_is_over_when_it_exits_even_if_a_descendant_holds_the_pipe(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    probe = _script(
        tmp_path / "p", f"(sleep 60; echo never) &\necho $! > {shlex.quote(str(pidfile))}\necho version 1\nexit 0\n"
    )
    started = time.monotonic()
    result = _process.run_probe([str(probe)], timeout=10)
    assert time.monotonic() - started < 5.0
    assert result.returncode == 0 and "version 1" in result.output
    assert pid_gone(int(pidfile.read_text()), within=2.0)


def test_a_probe_leaves_no_helper_that_left_its_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    probe = _script(
        tmp_path / "p",
        f"setsid sh -c 'echo $$ > \"$1\"; exec sleep 60' sh {shlex.quote(str(pidfile))} &\n"
        f'until grep -qx "$!" {shlex.quote(str(pidfile))} 2>/dev/null; do sleep 0.01; done\necho version 1\nexit 0\n',
    )
    result = _process.run_probe([str(probe)], timeout=10)
    assert result.returncode == 0 and "version 1" in result.output
    (pid,) = _pids(pidfile, 1)
    assert pid_gone(pid, within=2.0)


def test_probe_output_is_capped(tmp_path: Path) -> None:
    result = _process.run_probe([sys.executable, "-c", "print('y' * 5_000_000)"], timeout=20, limit=1000)
    assert result.returncode == 0 and len(result.output) == 1000


def test_a_missing_probe_binary_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        _process.run_probe([str(tmp_path / "nope")], timeout=1)
