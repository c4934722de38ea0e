"""Kill a sidecar when the process that spawned it dies, however it dies.

Run as a script (``python -I -S _watchdog.py PID [PIDFD]``; standard library only, so it
starts fast and needs no import path). Its stdin is the read end of a pipe whose write
end only the spawning process holds. When that process exits — cleanly, by an exception
or by SIGKILL — the kernel closes the write end and ``read`` returns EOF:

* EOF after the parent wrote a byte: the parent stopped the sidecar itself (disarmed);
* EOF with nothing read: the parent died; SIGTERM the server and its process group
  (a ``server_bin`` wrapper that does not ``exec`` has the real server as its child),
  then SIGKILL whatever is left after a short grace.

Why not ``prctl(PR_SET_PDEATHSIG)``: the signal fires when the *thread* that forked the
child exits, not the process, and sidecars are spawned from runtime worker threads that
come and go; it would also need ``preexec_fn``, which is unsafe in a threaded parent.
A pipe closes exactly when the last holder of its write end is gone, which is the
process, on Linux and macOS alike.

On Linux the parent passes a pidfd opened while the sidecar was still its unreaped
child, so the signal can never hit a recycled pid. Elsewhere the pid is used.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

_GRACE = 0.5  # seconds between SIGTERM and SIGKILL; an orphan serves nobody


def _send(pid: int, pidfd: int | None, sig: int) -> bool:
    """Deliver ``sig``; False when the target is already gone."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> bool:
    """Deliver ``sig`` to the server's process group; False when the group is empty.

    The group id is the server's pid (it leads its own session) and stays reserved while
    any member lives, so this cannot reach another process's group.
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _gone(pid: int, pidfd: int | None, timeout: float) -> bool:
    """Wait up to ``timeout`` for the target to exit (it is not our child: no waitpid)."""
    if pidfd is not None:
        # A pidfd becomes readable when the process exits.
        readable, _, _ = select.select([pidfd], [], [], timeout)
        return bool(readable)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.02)
    return False


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
    deadline = time.monotonic() + _GRACE
    leader = _send(pid, pidfd, signal.SIGTERM)
    _signal_group(pid, signal.SIGTERM)
    if leader and not _gone(pid, pidfd, _GRACE):
        _send(pid, pidfd, signal.SIGKILL)
    while _signal_group(pid, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_group(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
