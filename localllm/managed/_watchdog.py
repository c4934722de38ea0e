"""Kill a sidecar when the process that spawned it dies, however it dies.

Run as a script (``python -I -S _watchdog.py PID [PIDFD]``; standard library only, so it
starts fast and needs no import path). Its stdin is the read end of a pipe whose write
end only the spawning process holds. When that process exits — cleanly, by an exception
or by SIGKILL — the kernel closes the write end and ``read`` returns EOF:

* EOF after the parent wrote a byte: the parent stopped the sidecar itself (disarmed);
* EOF with nothing read: the parent died; SIGTERM the sidecar's process group (the
  sidecar leads its own session: a wrapper script and the server it started alike), then
  SIGKILL whatever is left after a short grace, and SIGKILL every descendant of the
  sidecar that had left its group (a wrapper's ``setsid`` helper), noted before the group
  was signalled (once its parent dies, an orphan can no longer be traced to the sidecar).

Why not ``prctl(PR_SET_PDEATHSIG)``: the signal fires when the *thread* that forked the
child exits, not the process, and sidecars are spawned from runtime worker threads that
come and go; it would also need ``preexec_fn``, which is unsafe in a threaded parent.
A pipe closes exactly when the last holder of its write end is gone, which is the
process, on Linux and macOS alike.

On Linux the parent passes a pidfd opened while the sidecar was still its unreaped
child: while it shows the leader alive, its pid is certainly still the group's id. Once
the leader is gone the group id stays reserved as long as any member lives, so
signalling the group stays safe; an empty group simply answers ESRCH.
"""

from __future__ import annotations

import importlib.util
import os
import select
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

_GRACE = 0.5  # seconds between SIGTERM and SIGKILL; an orphan serves nobody


def _send(pid: int, pidfd: int | None, sig: int) -> bool:
    """Deliver ``sig`` to the sidecar's process group; False when nothing is left."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        pass
    # Not a group leader after all (or the group is gone): the leader alone, by pidfd.
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for the whole group to exit (not our children: no waitpid)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _process() -> ModuleType | None:
    """``localllm/_process.py``, loaded by path: a leaf module (standard library only), and
    the script runs with no import path (``-I -S``) so that it starts fast. Loaded only
    once the parent died, so arming a watchdog costs nothing more."""
    path = Path(__file__).resolve().parent.parent / "_process.py"
    spec = importlib.util.spec_from_file_location("_localllm_process", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # the group kill below must happen regardless
        return None
    return module


def _leader_alive(pidfd: int | None) -> bool:
    """Whether ``pid`` still names the sidecar: its pidfd is not yet readable (a pidfd
    becomes readable when its process exits). Without one (not Linux) nothing is walked."""
    if pidfd is None:
        return False
    try:
        readable, _, _ = select.select([pidfd], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def main(argv: list[str]) -> int:
    # Signals meant for the parent's terminal (Ctrl-C, hang-up) must not take the
    # watchdog down before it has done its one job.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    pid = int(argv[1])
    pidfd = int(argv[2]) if len(argv) > 2 else None
    try:
        disarmed = bool(os.read(sys.stdin.fileno(), 1))
    except OSError:
        disarmed = False
    if disarmed:
        return 0
    process = _process() if _leader_alive(pidfd) else None
    # Walked only while the leader is certainly the sidecar: a recycled pid's children are
    # not ours to kill.
    escaped = process.descendants(pid) if process is not None else {}
    if _send(pid, pidfd, signal.SIGTERM) and not _group_gone(pid, _GRACE):
        _send(pid, pidfd, signal.SIGKILL)
    if process is not None:
        process.kill_pids(escaped)  # a gone or recycled pid is skipped
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
