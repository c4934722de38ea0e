"""A child process that speaks newline-delimited JSON over its stdin and stdout.

Shared by the ``subprocess`` (JSON-RPC ``agent.ask``) and ``mcp_stdio`` transports; the
protocol on top of the lines is theirs, the process lifecycle and framing are here.

Framing: a stdout line whose first non-blank byte is ``{`` is a frame and must parse as a
JSON object, otherwise the stream is desynchronised (``plugin_crash``). Any other non-empty
line is *noise* (a stray ``print``): it is logged, kept for error details, and skipped.

Every wait is bounded by a ``time.monotonic()`` deadline (``poll`` on non-blocking pipes,
no reader thread on stdout); stderr is drained by a :class:`~localllm._process.StderrTail`
so a chatty child never blocks on a full pipe, and its tail goes into ``plugin_crash``
details. The child runs in its own process group so that kill and stop reach any
grandchildren holding the pipes open.

Thread model: one owner thread at a time reads, writes and cleans up (the transports hold a
call lock); :meth:`LineChild.signal_kill` is the only method safe to call from another
thread, and it never touches file descriptors (closing an fd another thread is blocked on
could hand its number to an unrelated file).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localllm import _process, settings
from localllm.errors import AgentError, ErrorKind
from localllm.redact import Redactor

logger = logging.getLogger(__name__)

#: bytes of stderr kept for error details
_STDERR_KEEP = 16 * 1024
#: noise lines kept for error details
_NOISE_KEEP = 8
#: noise lines logged one by one per request; the rest are counted in one summary line
_NOISE_WARN = 5
#: a frame larger than this without a newline is treated as a broken stream
_MAX_FRAME = 64 * 1024 * 1024
#: bytes of stderr/noise quoted in an error detail (the *end* is kept: the last lines matter)
_TAIL_LIMIT = 256
_READ_CHUNK = 65536
#: how often a wait for output checks whether the process exited (and notes its descendants)
_EXIT_POLL = 0.1
#: noted descendants past this many are pruned of the ones that are gone
_DOOMED_KEEP = 256
#: how long stderr may stay open after the process group is stopped before the processes
#: outside it that hold the pipes are looked for
_HOLDER_GRACE = 0.2


class ChildState(enum.Enum):
    """Lifecycle of one spawned process."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


class DeadlineReached(Exception):
    """Internal: a wait on the child ran out of time (the owner decides what to do)."""


def _poll(fd: int, events: int, timeout: float) -> bool:
    """Whether ``fd`` is ready (or hung up) for ``events`` within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(int(timeout * 1000) + 1 if timeout > 0 else 0))


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LineChild:
    """One spawned process with JSON lines on stdin/stdout; see the module docstring."""

    def __init__(
        self,
        *,
        label: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        redact: Redactor,
    ) -> None:
        self.label = label
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._redact = redact
        self.state = ChildState.CREATED
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()
        self._stderr: _process.StderrTail | None = None
        self.noise: collections.deque[str] = collections.deque(maxlen=_NOISE_KEEP)
        #: noise lines since the last request was sent: logged, and past _NOISE_WARN counted
        self._noise_seen = 0
        self._noise_unlogged = 0
        #: descendants (pid → start time) seen while the leader ran, killed with it
        self._doomed: dict[int, int] = {}
        #: the child's stdout and stderr pipes as /proc names them (see _process.kill_pipe_holders)
        self._pipes: set[str] = set()

    def __repr__(self) -> str:
        # argv may carry secrets interpolated into args; show the program only.
        program = self._argv[0] if self._argv else "?"
        return f"<LineChild {self.label} {program!r} {self.state.value}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process; a missing or unexecutable command is a ``plugin_crash``."""
        env = settings.environ()
        env.update(self._env)
        try:
            # Own process group: kill/stop reach grandchildren that inherited the pipes.
            proc = _process.spawn(
                self._argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self._cwd,
            )
        except OSError as exc:
            where = f" in {self._cwd}" if self._cwd else ""
            raise AgentError(
                ErrorKind.PLUGIN_CRASH,
                f"cannot start {self._argv[0]!r}{where}: {exc.strerror or exc}",
                hint=f"check agent_plugins.{self.label}.command and cwd",
                alias=self.label,
            ) from exc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc = proc
        self._pipes = _process.pipe_ids(proc.stdout.fileno(), proc.stderr.fileno())
        self._buf.clear()
        self.noise.clear()
        on_line = self._log_stderr if logger.isEnabledFor(logging.DEBUG) else None
        self._stderr = _process.StderrTail(
            proc.stderr, name=f"{self.label}-stderr", limit=_STDERR_KEEP, on_line=on_line
        )
        self.state = ChildState.RUNNING
        logger.debug("%s: started pid %d", self.label, proc.pid)

    def signal_kill(self) -> None:
        """SIGKILL the process group and every descendant that left it (``setsid``); safe
        from any thread (touches no file descriptor it owns)."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        doomed = self._doomed = {**self._doomed, **_process.descendants(proc.pid)}
        _process.signal_group(proc, signal.SIGKILL)
        _process.kill_pids(doomed)

    def kill(self) -> None:
        """Kill now and release everything (owner thread)."""
        self.signal_kill()
        self._reap(grace=5.0)

    def stop(self, *, stdin_grace: float = 0.5, term_grace: float = 2.0) -> None:
        """Close stdin, wait; SIGTERM the group, wait; SIGKILL; reap; release fds."""
        proc = self._proc
        if proc is None:
            self.state = ChildState.STOPPED
            return
        if not _process.exited(proc):  # its descendants, while they can still be traced to it
            self._doomed = {**self._doomed, **_process.descendants(proc.pid)}
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if not _process.wait_exited(proc, stdin_grace):
            _process.stop_group(proc, grace=term_grace)
        self._reap(grace=5.0)

    def _reap(self, *, grace: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if not _process.wait_exited(proc, grace):
            self.signal_kill()
        # The group may outlive its leader (a grandchild); make sure nothing keeps the pipes.
        # The leader is reaped only here, after the group's last signal (_process.exited).
        _process.stop_group(proc, grace=0.0)
        _process.kill_pids(self._doomed)  # descendants outside the group: no orphan survives
        stderr = self._stderr
        if stderr is not None and not stderr.join(_HOLDER_GRACE):
            _process.kill_pipe_holders(self._pipes)  # a setsid helper, forked and orphaned unnoted
        if stderr is not None and not stderr.join(grace):
            # Something outside our process group still holds stderr open; the drain
            # thread closes it at EOF (closing it under the blocked reader is unsafe).
            logger.warning("%s: stderr still open after the process exited", self.label)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.state = ChildState.STOPPED

    @property
    def alive(self) -> bool:
        return self.state is ChildState.RUNNING and self._proc is not None and not _process.exited(self._proc)

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    # -- stderr ----------------------------------------------------------------------

    def _log_stderr(self, line: str) -> None:
        logger.debug("%s stderr: %s", self.label, self._redact(line).rstrip())

    def stderr_tail(self) -> str:
        """The last stderr bytes (redacted), stripped."""
        stderr = self._stderr
        return self._redact(stderr.text()).strip() if stderr is not None else ""

    def crash_detail(self, what: str, *, exit_code: bool = True) -> str:
        """``what`` plus exit code, stderr tail and stdout noise, for a ``plugin_crash``."""
        parts = [what]
        code = self.returncode
        if exit_code and code is not None:
            parts.append(f"exit code {code}" if code >= 0 else f"killed by signal {-code}")
        tail = self.stderr_tail()
        if tail:
            parts.append(f"stderr: {_process.tail(tail, limit=_TAIL_LIMIT)}")
        if self.noise:
            parts.append(f"stdout noise: {_process.tail(' | '.join(self.noise), limit=_TAIL_LIMIT)}")
        return "; ".join(parts)

    def crash(self, what: str) -> AgentError:
        """Kill and reap the child, then build the ``plugin_crash`` error for ``what``."""
        # An exit code we caused by killing a live process says nothing about the plugin.
        self._log_unlogged_noise()
        exited_on_its_own = self._proc is not None and _process.exited(self._proc)
        self.kill()
        what = what if exited_on_its_own else f"{what}; process killed"
        detail = self.crash_detail(what, exit_code=exited_on_its_own)
        return AgentError(ErrorKind.PLUGIN_CRASH, detail, alias=self.label)

    # -- frames ----------------------------------------------------------------------

    def send(self, message: Mapping[str, Any], *, deadline: float) -> None:
        """Write one frame; a closed pipe is a ``plugin_crash`` (the child is reaped).

        stdout is read meanwhile (:meth:`_absorb`): a child that writes before it reads
        (a start-up banner, progress lines, MCP notifications) would otherwise block on its
        full stdout while this blocks on its full stdin, until the deadline."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        self._noise_seen = 0
        fd = proc.stdin.fileno()
        out: int | None = proc.stdout.fileno()
        view = memoryview(data)
        while view:
            try:
                writable, out = self._wait_writable(fd, out, deadline)
                if not writable:
                    continue
                written = os.write(fd, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError, ValueError, OSError) as exc:
                _process.wait_exited(proc, 1.0)
                raise self.crash("process closed its stdin before reading the request") from exc
            view = view[written:]

    def _wait_writable(self, fd: int, out: int | None, deadline: float) -> tuple[bool, int | None]:
        """Wait until stdin ``fd`` takes bytes (or :class:`DeadlineReached`), reading what
        stdout ``out`` has meanwhile; (whether stdin is writable, ``out`` or ``None`` once
        stdout reached its end)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineReached
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if out is not None:
            poller.register(out, select.POLLIN)
        ready = dict(poller.poll(int(remaining * 1000) + 1))
        if out is not None and out in ready:
            try:
                chunk = os.read(out, _READ_CHUNK)
            except BlockingIOError:
                chunk = None
            except (ValueError, OSError):
                chunk = b""  # read_frame meets the same failure and reports it
            if chunk == b"":
                out = None  # EOF: read_frame sees it too
            elif chunk:
                self._absorb(chunk)
        return fd in ready, out

    def _absorb(self, chunk: bytes) -> None:
        """Keep stdout read while a request is written: frames stay buffered, in order, for
        :meth:`read_frame`; noise lines ahead of them are skipped now, so what waits is
        bounded by :data:`_MAX_FRAME`."""
        self._buf.extend(chunk)
        while (newline := self._buf.find(b"\n")) >= 0:
            line = bytes(self._buf[:newline]).strip()
            if line.startswith(b"{"):
                break
            del self._buf[: newline + 1]
            if line:
                self._note_noise(line)
        if len(self._buf) > _MAX_FRAME:
            raise self.crash(f"more than {_MAX_FRAME} bytes of output while the request was being written")

    def read_frame(self, *, deadline: float) -> dict[str, Any]:
        """The next frame as a JSON object; noise is skipped, EOF and garbage crash."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            newline = self._buf.find(b"\n")
            if newline >= 0:
                line = bytes(self._buf[:newline]).strip()
                del self._buf[: newline + 1]
                if not line:
                    continue
                if not line.startswith(b"{"):
                    self._note_noise(line)
                    continue
                self._log_unlogged_noise()
                return self._parse(line)
            if len(self._buf) > _MAX_FRAME:
                raise self.crash(f"frame larger than {_MAX_FRAME} bytes without a newline")
            try:
                # Nothing ready after the process exited is the end of its output, even
                # while a descendant it left behind holds stdout open.
                chunk = os.read(fd, _READ_CHUNK) if self._output_ready(proc, fd, deadline) else b""
            except BlockingIOError:
                continue
            except (ValueError, OSError) as exc:
                raise self.crash(f"cannot read stdout: {exc}") from exc
            if not chunk:
                # EOF: the child exited (or closed stdout). Reap it for its exit code.
                _process.wait_exited(proc, 1.0)
                if self._buf.strip():
                    partial = self._redact(bytes(self._buf).decode("utf-8", "replace"))
                    raise self.crash(f"partial frame at end of output: {_process.tail(partial, limit=_TAIL_LIMIT)!r}")
                raise self.crash("process exited before answering")
            self._buf.extend(chunk)

    def _output_ready(self, proc: subprocess.Popen[bytes], fd: int, deadline: float) -> bool:
        """Wait until stdout has bytes (or EOF): True; or until the process has exited and
        stdout has nothing ready: False (:class:`DeadlineReached` at ``deadline``).

        Waits in :data:`_EXIT_POLL` slices, noting the process's descendants while it runs:
        one that left its process group (``setsid``) is untraceable once the process exits,
        and is killed with it (it may hold the pipes open)."""
        while True:
            if _poll(fd, select.POLLIN, 0):  # output waiting: no /proc walk on a busy stream
                return True
            if _process.exited(proc):
                return _poll(fd, select.POLLIN, 0)  # what it wrote just before it exited
            self._note_descendants(proc.pid)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineReached
            if _poll(fd, select.POLLIN, min(remaining, _EXIT_POLL)):
                return True

    def _note_descendants(self, pid: int) -> None:
        # Replaced, never changed in place: signal_kill reads it from another thread.
        doomed = dict(self._doomed)
        if len(doomed) > _DOOMED_KEEP:  # a long-lived server's short-lived children
            doomed = {p: t for p, t in doomed.items() if _pid_exists(p)}
        self._doomed = {**doomed, **_process.descendants(pid)}

    def _note_noise(self, line: bytes) -> None:
        text = self._redact(line.decode("utf-8", errors="replace"))
        self.noise.append(_process.tail(text, limit=120))
        self._noise_seen += 1
        if self._noise_seen > _NOISE_WARN:  # 200k stray lines made 200k warnings
            self._noise_unlogged += 1
            return
        logger.warning("%s: ignoring non-frame stdout line: %s", self.label, _process.tail(text, limit=200))

    def _log_unlogged_noise(self) -> None:
        if self._noise_unlogged:
            logger.warning("%s: ignored %d more non-frame stdout lines", self.label, self._noise_unlogged)
            self._noise_unlogged = 0

    def _parse(self, line: bytes) -> dict[str, Any]:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json decodes
            text = self._redact(line.decode("utf-8", errors="replace"))
            raise self.crash(f"malformed frame {_process.tail(text, limit=_TAIL_LIMIT)!r}: {exc}") from exc
        if not isinstance(value, dict):
            raise self.crash("frame is not a JSON object")
        return value
