"""Child processes: one process group per child, one stderr tail, one way to stop, bounded probes.

Every child localllm starts runs in its own session (``start_new_session=True``), so it
leads a process group holding everything it starts. Stopping signals the *group*: a
``server_bin`` that is a shell wrapper without ``exec``, a CLI that forks workers, a build
driving compilers — none of their descendants survives the stop. A descendant that left
the group (``setsid``) is noted with :func:`descendants` while its ancestor runs and killed
with :func:`kill_pids`; one forked and orphaned unnoted is found by the pipe it still holds
(:func:`kill_pipe_holders`).

:class:`StderrTail` drains a child's stream on a daemon thread (a chatty child never blocks
on a full pipe) and keeps the last bytes for error details; :func:`tail` cuts a text for a
message. :func:`run_probe` runs ``--help``/``--version`` style probes within the caller's
deadline. :func:`arm_watchdog` starts ``managed/_watchdog.py`` beside a child, which stops its
group (and the descendants that left it) if this process dies first; it loads this module by
path, so this module stays a leaf on the standard library.

A leaf module: it imports nothing from localllm and raises only ``OSError``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

__all__ = [
    "ProbeResult",
    "StderrTail",
    "arm_watchdog",
    "descendants",
    "disarm_watchdog",
    "exit_code",
    "exited",
    "group_alive",
    "kill_pids",
    "kill_pipe_holders",
    "pipe_ids",
    "run_probe",
    "signal_group",
    "spawn",
    "stop_group",
    "tail",
    "wait_exited",
]

_READ_CHUNK = 65536
#: a line longer than this is handed to ``on_line`` in pieces rather than buffered whole
_MAX_LINE = 64 * 1024
_POLL = 0.02


def tail(text: str, *, limit: int = 256, lines: int | None = None) -> str:
    """The end of ``text``: at most ``lines`` lines and ``limit`` UTF-8 bytes, ``...`` when cut."""
    if lines is not None:
        text = "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""
    raw = text.encode("utf-8", errors="surrogatepass")
    if len(raw) <= limit:
        return text
    return "..." + raw[-limit:].decode("utf-8", errors="ignore")


class StderrTail:
    """The last ``limit`` bytes of a child's stream, read to EOF by a daemon thread.

    ``on_line`` (optional) sees every decoded line as it arrives (the sidecar reads its
    port from one). The thread closes the stream at EOF and nobody else does: closing a
    descriptor another thread is blocked on could hand its number to an unrelated file.
    """

    def __init__(
        self,
        stream: IO[bytes],
        *,
        name: str,
        limit: int = 16 * 1024,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self._stream = stream
        self._limit = limit
        self._on_line = on_line
        self._kept = bytearray()
        self._lock = threading.Lock()
        self._partial = bytearray()
        #: set when the stream reached EOF (the child and every holder of the pipe are gone)
        self.eof = threading.Event()
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            fd = self._stream.fileno()
            while chunk := os.read(fd, _READ_CHUNK):
                with self._lock:
                    self._kept += chunk
                    if len(self._kept) > self._limit:
                        del self._kept[: len(self._kept) - self._limit]
                if self._on_line is not None:
                    self._lines(chunk)
        except (OSError, ValueError):
            pass  # the stream went away under us: nothing more to read
        finally:
            if self._on_line is not None and self._partial:
                self._emit(bytes(self._partial))
            with contextlib.suppress(OSError):
                self._stream.close()
            self.eof.set()

    def _lines(self, chunk: bytes) -> None:
        self._partial.extend(chunk)
        while True:
            newline = self._partial.find(b"\n")
            if newline < 0:
                if len(self._partial) > _MAX_LINE:
                    self._emit(bytes(self._partial[:_MAX_LINE]))
                    del self._partial[:_MAX_LINE]
                    continue
                return
            self._emit(bytes(self._partial[:newline]))
            del self._partial[: newline + 1]

    def _emit(self, line: bytes) -> None:
        assert self._on_line is not None
        self._on_line(line.decode("utf-8", "replace").rstrip("\r"))

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for EOF; True when everything was read."""
        self._thread.join(max(timeout, 0.0))
        return not self._thread.is_alive()

    def text(self) -> str:
        """Everything kept (the last ``limit`` bytes), decoded."""
        with self._lock:
            raw = bytes(self._kept)
        return raw.decode("utf-8", errors="replace")

    def lines(self, n: int) -> str:
        """The last ``n`` lines kept."""
        return tail(self.text().rstrip("\n"), limit=self._limit, lines=n)


def spawn(
    argv: Sequence[str],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    stderr: int | IO[Any] | None = subprocess.DEVNULL,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (a list, never a shell string) as the leader of a new session.

    The new session keeps the terminal's Ctrl-C away from the child (its owner stops it in
    order) and makes its process group the unit :func:`stop_group` signals.
    """
    return subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        start_new_session=True,
    )


def signal_group(proc: subprocess.Popen[Any], sig: int) -> bool:
    """Send ``sig`` to the child's process group; False when the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether any running (not zombie) process is left in group ``pgid``.

    The group id cannot be reused while a member lives (the kernel keeps the number), so
    probing it after the leader was reaped is safe. Zombies do not count: an orphan that
    exited waits for init to reap it, and some container inits never do.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _running_member(pgid)


def _running_member(pgid: int) -> bool:
    """Linux: scan /proc for a member of ``pgid`` that is not a zombie (elsewhere: assume one)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after ``(comm)``: state, ppid, pgrp, …; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def descendants(pid: int) -> dict[int, int]:
    """Every living descendant of ``pid`` → its start time (Linux: the /proc parent links;
    elsewhere: none).

    A descendant that left the process group (``setsid``, ``start_new_session``) is not
    reached by :func:`signal_group`; its owner snapshots it here while ``pid`` still runs
    (once ``pid`` exits, its orphans are re-parented and no longer traceable) and kills it
    with :func:`kill_pids`.
    """
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is not None and len(fields) >= 20 and fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
    found: dict[int, int] = {}
    todo = list(children.get(pid, ()))
    while todo:
        child, started = todo.pop()
        if child not in found:
            found[child] = started
            todo.extend(children.get(child, ()))
    return found


def kill_pids(pids: Mapping[int, int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each pid of ``pids`` (pid → start time, from :func:`descendants`)
    that is still the same process: a gone one, or a reused pid, is skipped."""
    for pid, started in pids.items():
        fields = _stat(pid)
        if fields is None or len(fields) < 20 or int(fields[19]) != started or fields[0] in (b"Z", b"X"):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def pipe_ids(*fds: int) -> set[str]:
    """What ``/proc`` calls the pipes behind ``fds`` (``pipe:[inode]``); none off Linux."""
    ids = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            ids.add(os.readlink(f"/proc/self/fd/{fd}"))
    return ids


def _holds(pid: str, pipes: set[str]) -> bool:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") in pipes:
                return True
    return False


def kill_pipe_holders(pipes: set[str]) -> None:
    """SIGKILL each process outside our session that holds one of ``pipes`` (from
    :func:`pipe_ids`): what a child left behind holding its output, in a session of its own
    (``setsid``) so that no group kill reaches it, forked and orphaned too quickly to be
    noted by :func:`descendants`. A child's pipes reach no other process (``close_fds``);
    a process of ours forked later shares our session and is spared."""
    if not pipes or not hasattr(os, "pidfd_open"):
        return
    me, session = os.getpid(), os.getsid(0)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit() or int(entry) == me or not _holds(entry, pipes):
            continue
        try:
            pidfd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:  # checked again with the pid pinned by the pidfd: it is still that process
            if os.getsid(int(entry)) != session and _holds(entry, pipes):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def exit_code(proc: subprocess.Popen[Any]) -> int | None:
    """The child's exit code like ``Popen.returncode`` (negative: the signal), *without*
    reaping it (``waitid(WNOWAIT)``); None while it runs.

    An unreaped child keeps its pid, so the number of the group it leads cannot be handed
    to another process: :func:`stop_group` can signal the group safely until it reaps.
    ``Popen.poll()`` would reap, and on a busy machine with a small ``pid_max`` (32768 is
    common) the freed number can lead someone else's group by the time we signal it.
    """
    if proc.returncode is not None:
        return int(proc.returncode)
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere (e.g. a SIGCHLD handler): poll() settles it
        return proc.poll()
    if info is None:
        return None
    return int(info.si_status) if info.si_code == os.CLD_EXITED else -int(info.si_status)


def exited(proc: subprocess.Popen[Any]) -> bool:
    """Whether the child has exited, without reaping it (see :func:`exit_code`)."""
    return exit_code(proc) is not None


def wait_exited(proc: subprocess.Popen[Any], timeout: float) -> bool:
    """Wait up to ``timeout`` s for the child to exit, without reaping it (see :func:`exited`).

    On Linux it wakes the moment the child exits (a pidfd turns readable then); elsewhere,
    or when no pidfd can be had, it polls every 20 ms.
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    if exited(proc):
        return True
    pidfd = _pidfd(proc)
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(max(deadline - time.monotonic(), 0.0) * 1000.0)  # readable once it exits (EINTR retried)
            return exited(proc)
        finally:
            os.close(pidfd)
    while not exited(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def _pidfd(proc: subprocess.Popen[Any]) -> int | None:
    """A pidfd for the running, unreaped child ``proc`` (Linux >= 5.3), else None.

    Checked after opening: while the child is still ours and unreaped its pid cannot have
    been reused, so the descriptor surely names it.
    """
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        return None
    if exited(proc):  # gone (or reaped elsewhere) in between: nothing to wait for
        os.close(pidfd)
        return None
    return pidfd


def stop_group(proc: subprocess.Popen[Any], *, grace: float) -> int | None:
    """Stop the child and everything in its group: SIGTERM, ``grace`` s, SIGKILL; reap.

    One SIGTERM only (llama-server exits 1 on a second one). The grace covers the whole
    group: a wrapper shell dies at once, the server it started gets the rest of the grace
    to shut down cleanly. Whatever is left then — leader or stragglers — is SIGKILLed.
    The leader is reaped last, so while it was not reaped before the call every signal
    goes to a group id that is still ours (see :func:`exit_code`). Returns the leader's exit
    code (negative: killed by that signal).
    """
    deadline = time.monotonic() + max(grace, 0.0)
    # Sent even when the leader has exited: its descendants may still run in the group.
    signal_group(proc, signal.SIGTERM)
    wait_exited(proc, deadline - time.monotonic())
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(_POLL)
    signal_group(proc, signal.SIGKILL)
    proc.wait()
    return proc.returncode


#: kills a child's group when the process that spawned it dies (see the script's docstring)
_WATCHDOG = Path(__file__).with_name("managed") / "_watchdog.py"


def arm_watchdog(pid: int) -> subprocess.Popen[bytes]:
    """Start the watchdog of the group led by ``pid`` (our unreaped child): it stops the group
    if this process dies before :func:`disarm_watchdog`."""
    pidfd: int | None = None
    if hasattr(os, "pidfd_open"):
        try:
            # Opened while the child is our unreaped child, so it cannot name a recycled pid later.
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    argv = [sys.executable, "-I", "-S", str(_WATCHDOG), str(pid)]
    if pidfd is not None:
        argv.append(str(pidfd))
    try:
        return spawn(argv, stdin=subprocess.PIPE, pass_fds=(pidfd,) if pidfd is not None else ())
    finally:
        if pidfd is not None:
            os.close(pidfd)


def disarm_watchdog(watchdog: subprocess.Popen[bytes]) -> None:
    """Tell the watchdog we stopped the child ourselves, and reap it."""
    stdin = watchdog.stdin
    assert stdin is not None
    try:
        stdin.write(b"x")  # one byte then EOF: we stopped the child ourselves
        stdin.close()
    except OSError:
        pass  # the watchdog is already gone; reaping below is all that is left
    # It exits as soon as it reads the byte; wait_exited wakes then (Popen.wait(timeout)
    # would poll with growing sleeps).
    if not wait_exited(watchdog, 2.0):
        watchdog.kill()
    watchdog.wait()


def _wait(proc: subprocess.Popen[Any], timeout: float) -> bool:
    try:
        proc.wait(timeout=max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        return False
    return True


class ProbeResult(NamedTuple):
    """What a probe printed (stdout and stderr merged) and how it ended."""

    returncode: int | None  # None: still running at the deadline, killed
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_probe(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    limit: int = 1 << 20,
) -> ProbeResult:
    """Run a short probe (``--help``, ``--version``) for at most ``timeout`` seconds.

    stdin is closed, stdout and stderr are merged and the first ``limit`` bytes kept. The
    probe is over when its process exits — a descendant holding the pipe open does not
    extend it — or at ``timeout``, when the whole group is killed and ``returncode`` is
    ``None``. Either way nothing it started survives it: not its group, nor a descendant
    that left the group (``setsid``). Raises ``OSError`` when ``argv[0]`` cannot be run.
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pipes = pipe_ids(fd)
    os.set_blocking(fd, False)
    out = bytearray()
    exited = False
    doomed: dict[int, int] = {}  # descendants seen while it ran (see descendants())
    try:
        while True:
            if proc.returncode is None:
                doomed.update(descendants(proc.pid))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            ready = poller.poll(max(1, int(min(remaining, 0.1) * 1000)))
            if ready and not _read_into(fd, out, limit):
                exited = _wait(proc, max(deadline - time.monotonic(), 0.0))
                break
            if proc.poll() is not None:
                _read_into(fd, out, limit)  # whatever it wrote just before exiting
                exited = True
                break
    finally:
        code = proc.returncode if exited else None
        if proc.returncode is None:
            doomed.update(descendants(proc.pid))
        stop_group(proc, grace=0.0)
        kill_pids(doomed)
        if _read_into(fd, out, limit):  # no EOF yet: an escaped descendant we never saw holds it
            kill_pipe_holders(pipes)
        proc.stdout.close()
    return ProbeResult(returncode=code, output=out.decode("utf-8", "replace"))


def _read_into(fd: int, out: bytearray, limit: int) -> bool:
    """Read what is available; False at EOF."""
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        if len(out) < limit:
            out.extend(chunk[: limit - len(out)])
