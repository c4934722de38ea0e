"""ManagedServer: the one owner of a managed llama-server, for chat and for embeddings.

One object per (server build, model, role, flags): it resolves the binary and the GGUF
(fetching and verifying pinned ones through :mod:`localllm.managed.acquire`), spawns the
server, gates on ``/health``, respawns it after a crash and stops it. A process may hold
several (an agent's chat model, an embedder's model, a service's whole set).

Lifecycle (``ServerState``)::

    CREATED ─ensure_ready()→ FETCHING ─paths ready→ STARTING ─/health 200→ READY
                                │                       │                  │
                                └───error───→ FAILED ←──exit/timeout───────┘ process died
                                             (the next ensure_ready() starts again)
    any state ─stop()→ STOPPING → STOPPED    (a later ensure_ready() starts a fresh server)

Nothing is fetched or spawned before the first ``ensure_ready()``. The fetch and the start
run in the calling thread with no lock held that ``stop()`` needs: ``stop()`` sets the
attempt's cancel flag, which aborts a download between chunks (its partial file removed)
or a health wait between polls, and returns once the attempt has let go. Concurrent
callers share one attempt and its outcome, so a stampede spawns one server.

Ports never race: the server is started with ``--port 0`` and the bound port is read from
its ``listening on`` log line (or, before that line, from the process's listening socket);
a build that cannot report it falls back to a freshly allocated port, retried on a bind
failure. Every spawn also arms a watchdog process (``_watchdog.py``) so that no server
outlives this process, even when it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NamedTuple

from localllm import _fs, _head_start, _http
from localllm._process import (
    StderrTail,
    arm_watchdog,
    descendants,
    disarm_watchdog,
    exit_code,
    exited,
    kill_pids,
    kill_pipe_holders,
    pipe_ids,
    run_probe,
    spawn,
    stop_group,
)
from localllm.config.decls import MANAGED_FLAGS  # stated with the config that must not repeat them
from localllm.errors import SidecarError, SidecarExited, SidecarStartTimeout, stderr_detail
from localllm.managed.release import server_env
from localllm.redact import mask_option_values

if TYPE_CHECKING:
    import httpx

__all__ = ["MANAGED_FLAGS", "ManagedServer", "Role", "ServerKey", "ServerState"]

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


_TAIL_BYTES = 64 * 1024  # stderr kept per process, for errors
_PROBE_TIMEOUT = 30.0  # the most a `--help` probe may take, within the start's deadline
_POLL = 0.1  # longest health poll interval, seconds
_POLL_FIRST = 0.005  # the first interval: polls start fast and back off (× _POLL_BACKOFF) to _POLL
_POLL_BACKOFF = 1.5
_ABORT_GRACE = 0.5  # SIGTERM grace for a start that is abandoned (timeout or stop)
_CANARY_TIMEOUT = 10.0  # the most the grammar canary may take, within the start's deadline
_HOLDER_GRACE = 0.2  # after a stop, how long stderr may stay open before its holders are killed

#: The grammar canary: asked to say OK, a server that enforces ``grammar`` must answer
#: exactly this, which no model says unprompted (3 completion tokens, ~0.2 s on gemma-3-270m).
CANARY_ANSWER = "}{"
CANARY_BODY: dict[str, object] = {
    "messages": [{"role": "user", "content": "Say OK."}],
    "grammar": f'root ::= "{CANARY_ANSWER}"',
    "max_tokens": 4,
    "temperature": 0,
}
#: the response header by which ``localllm serve`` tells an attached agent the canary's verdict
GRAMMAR_HEADER = "X-Localllm-Grammar-Enforced"
_BIND_RETRIES = 3  # fresh ports tried when --port 0 is unsupported
_SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "-hft"})

# New builds: "srv  llama_server: listening on http://127.0.0.1:PORT"; older ones:
# "main: server is listening on http://127.0.0.1:PORT - starting the main loop" and
# "main: HTTP server is listening, hostname: 127.0.0.1, port: PORT, http threads: N".
_LISTEN_PATTERNS = (
    re.compile(r"listening on https?://(?:\[[^\]]*\]|[^\s:/]+):(\d+)"),
    re.compile(r"HTTP server is listening, hostname: \S+, port: (\d+)"),
)
_BIND_FAILED = "couldn't bind"
#: flags a managed server gets only when its build lists them in ``--help``
_OPTIONAL_FLAGS = ("--no-webui", "--no-ui", "--swa-full")


#: how long ``stop()`` waits for a cancelled fetch or start to let go
_CANCEL_WAIT = 10.0

Role = Literal["chat", "embedding"]


class ServerState(str, enum.Enum):
    """Where a managed server is in its lifecycle."""

    CREATED = "created"
    FETCHING = "fetching"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class _Cancelled(Exception):
    """stop() cancelled the start attempt (never leaves this module)."""


class _PortNotReported(Exception):
    """The build echoed port 0 and its socket cannot be inspected: use a fixed port."""


class _PortTaken(Exception):
    """Another process answers on the port the server was told to use."""


def _redact(argv: Sequence[str]) -> list[str]:
    """argv with secret values replaced, safe for errors, logs and reprs."""
    return mask_option_values(argv, _SECRET_FLAGS)


#: Why a server dies of SIGILL: it was built for instructions this CPU (or its hypervisor)
#: does not run — seen with AMX tile kernels under -march=native in a VM that hides AMX.
_SIGILL_ADVICE = (
    "the binary uses CPU instructions this machine cannot run: rebuild it here "
    "(`localllm cache rm` the release, then `localllm fetch server --from-source`)"
)


def _describe_exit(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"was killed by signal {-returncode}"
        advice = f" ({_SIGILL_ADVICE})" if -returncode == signal.SIGILL else ""
        return f"was killed by {name}{advice}"
    return f"exited with code {returncode}"


def _free_port() -> int:
    """A port that was free a moment ago (racy by nature: callers retry on bind failure)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _child_env(binary: Path, overrides: Mapping[str, str] | None) -> dict[str, str]:
    """The server's environment, built on purpose rather than inherited wholesale.

    The binary's directory goes first on LD_LIBRARY_PATH: it holds the bundled
    ``libllama``/``libggml*`` (and, for portable builds, the libstdc++ shim), and the
    loader searches LD_LIBRARY_PATH before the binary's RUNPATH, so a stale inherited value
    would otherwise load someone else's libraries. Inherited ``LLAMA_*`` variables are
    dropped: llama-server reads ``LLAMA_ARG_*``/``LLAMA_API_KEY``/``LLAMA_LOG_*`` as flags,
    and a user's shell settings for their own server must not reshape ours.

    ``GOMP_SPINCOUNT=500`` (unless the caller set an OpenMP wait policy): GNU OpenMP's
    worker threads otherwise spin for a long time at every barrier, and two servers on a
    small machine (chat + embeddings, or two processes) then starve each other. Measured
    with ``tests/bench/bench_spincount.py`` on 2 cores, gemma-3-270m, ms per decoded token
    alone / with a second server decoding: default 19.4 / 701; 10000: 19.8 / 97; 1000:
    18.8 / 43; 500: 21.1 / 39.6; 100: 32.0 / 40.5. 500 keeps the contended case as good as
    100 without making every solo decode 1.5x slower.
    """
    env = {k: v for k, v in server_env(binary.resolve().parent).items() if not k.startswith("LLAMA_")}
    if overrides:
        env.update(overrides)
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = "500"
    return env


def _launch_error(binary: Path, exc: OSError) -> SidecarError:
    return SidecarError(
        f"cannot run llama-server {binary}: {exc.strerror or exc}",
        hint="check that the file exists and is executable; `localllm fetch server` installs one, "
        "or set LOCALLLM_SERVER_BIN",
    )


#: a model's kept llama-server log is rotated (one old file kept) past this many bytes
LOG_LIMIT = 1 << 20


def log_path_for(model: str | Path) -> Path:
    """``<cache>/logs/<model>.log``: where a model's llama-server stderr is kept (``localllm logs``)."""
    from localllm.managed.cache import cache_layout

    text = str(model)
    stem = Path(text).stem if text.endswith(".gguf") else text
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem) or "model"
    return cache_layout().root / "logs" / f"{safe}.log"


class _KeptLog:
    """A model's llama-server stderr appended to its log file, bounded by :data:`LOG_LIMIT`
    (rotated to ``.log.1``); opened per line, so nothing stays open. Only a regular file
    is written; a log that cannot be written is dropped with one warning, never an error."""

    def __init__(self, path: Path, header: str) -> None:
        self.path = path
        self.ok = True
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
        self.write(header)

    def write(self, line: str) -> None:
        if not self.ok:
            return
        data = (line + "\n").encode("utf-8", errors="backslashreplace")
        try:
            fd = self._open()
            try:
                if os.fstat(fd).st_size > LOG_LIMIT:
                    os.close(fd)
                    fd = -1
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                    fd = self._open()
                os.write(fd, data)
            finally:
                if fd >= 0:
                    os.close(fd)
        except OSError as exc:
            self.ok = False
            logger.warning("not keeping the llama-server log %s: %s", self.path, exc.strerror or exc)

    def _open(self) -> int:
        return _fs.open_append(self.path)  # never through a symlink, never waiting on a FIFO nobody reads


class _Process:
    """One spawned llama-server: its stderr tail, its watchdog, and how to stop it."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str], requested_port: int, log_path: Path | None = None
    ) -> None:
        self.argv = argv
        self._kept = (
            _KeptLog(log_path, f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} llama-server {' '.join(_redact(argv))}")
            if log_path is not None
            else None
        )
        self.requested_port = requested_port
        self.reported_port: int | None = None
        self.bound_port: int | None = None  # set once /health answered 200 on it
        self.stop_requested = False  # an exit after this is ours, not a crash
        self.wake = threading.Event()  # set on a listening line
        self._discovered: int | None = None
        self._returncode: int | None = None
        self._stopped = False
        # The head start of a `localllm run`/`call` when it is this very process (argv and
        # environment), else a spawn: its own session and process group (_process.spawn),
        # so the terminal's Ctrl-C never reaches it and stopping it stops what it started.
        held = _head_start.claim(argv, env)
        self.popen = held.popen if held is not None else spawn(argv, stderr=subprocess.PIPE, env=env)
        self.pid = self.popen.pid
        assert self.popen.stderr is not None
        # Descendants that left the group (a wrapper's `setsid helper &`): noted while the
        # server runs and killed with it; an unnoted one is found by the stderr it holds.
        self._doomed: dict[int, int] = {}
        self._pipes = pipe_ids(self.popen.stderr.fileno())
        self._stderr = StderrTail(
            self.popen.stderr, name=f"llama-server-{self.pid}-stderr", limit=_TAIL_BYTES, on_line=self._on_line
        )
        self._watchdog: subprocess.Popen[bytes] | None
        if held is not None:
            self._watchdog = held.watchdog
            return
        try:
            self._watchdog = arm_watchdog(self.pid)
        except OSError:
            stop_group(self.popen, grace=0.0)
            self._stderr.join(1.0)
            raise
        _head_start.record(argv, env)

    # -- stderr -------------------------------------------------------------------
    def _on_line(self, line: str) -> None:
        if self._kept is not None:
            self._kept.write(line)
        if self.reported_port is None:
            for pattern in _LISTEN_PATTERNS:
                match = pattern.search(line)
                if match:
                    self.reported_port = int(match.group(1))
                    self.wake.set()
                    break

    def tail(self, n: int) -> str:
        return self._stderr.lines(n)

    def settle_stderr(self, timeout: float = 1.0) -> None:
        """Give the drain thread a moment to collect the last lines of an exited process."""
        self._stderr.join(timeout)

    # -- port ---------------------------------------------------------------------
    def port(self) -> int | None:
        """The bound port, once known. Raises ``_PortNotReported`` for a build that can't tell."""
        if self.requested_port:
            return self.requested_port
        reported = self.reported_port
        if reported:
            return reported
        if self._discovered is None:
            self._discovered = self._listening_socket()
        if self._discovered:
            return self._discovered
        if reported == 0:
            raise _PortNotReported
        return None

    def owns(self, port: int) -> bool:
        """Whether this process, or one it started (a wrapper without ``exec``), listens on ``port``."""
        import psutil

        try:
            leader = psutil.Process(self.pid)
            procs = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return False
        for proc in procs:
            try:
                conns = proc.net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            for conn in conns:
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr == (HOST, port):
                    return True
        return False

    def _listening_socket(self) -> int | None:
        # The server binds before it loads the model but logs the port only after; its
        # socket reveals the port early, so /health can be polled during the load.
        import psutil

        try:
            conns = psutil.Process(self.pid).net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return None
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.ip == HOST:
                port: int = conn.laddr.port
                return port
        return None

    # -- watchdog -----------------------------------------------------------------
    def _disarm_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            disarm_watchdog(watchdog)

    # -- stopping -----------------------------------------------------------------
    def alive(self) -> bool:
        return not exited(self.popen)  # never reaps: stop() signals the group, then reaps

    def note_descendants(self) -> None:
        """Remember what the server started, while it can still be traced to it."""
        if self.alive():
            self._doomed = {**self._doomed, **descendants(self.pid)}

    def stop(self, grace: float) -> int | None:
        """SIGTERM the group, wait ``grace`` seconds, then SIGKILL; reap; disarm the watchdog.

        llama-server shuts down cleanly on the first SIGTERM (exit 0); during model load it
        dies at once. A second SIGTERM would make it exit 1, so one is sent. Idempotent.
        """
        self.stop_requested = True
        if not self._stopped:
            self._stopped = True
            self.note_descendants()
            self._returncode = stop_group(self.popen, grace=grace)
            kill_pids(self._doomed)  # descendants outside the group: no orphan survives
            self._disarm_watchdog()
            if not self._stderr.join(_HOLDER_GRACE):
                kill_pipe_holders(self._pipes)  # a setsid helper, forked and orphaned unnoted
            self.settle_stderr()
        return self._returncode


class ServerKey(NamedTuple):
    """What makes two managed servers the same: a service keeps one server per key."""

    binary: str
    model: str
    role: Role
    flags: tuple[str, ...]


class _Start:
    """One start attempt: its cancel flag and its outcome, shared by every waiting caller."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.done = False
        self.error: BaseException | None = None


class ManagedServer:
    """A managed ``llama-server`` for one GGUF, fetched and started on first use.

    ``binary``: a path to run, or ``None`` for the pinned build (``LOCALLLM_SERVER_BIN``,
    then the cache, then a verified download). ``model``: a :class:`~pathlib.Path` or a
    ``*.gguf`` string (relative to ``base_dir``), or a pinned model id fetched on first use.
    ``role`` says what the server is for (an embedding server gets its flags, from the
    model registry, in ``args``).

    ``ensure_ready()`` is safe from many threads: the first caller fetches and spawns, the
    others wait and share the result. A server that dies after READY is respawned on the
    next call. ``args`` are extra flags appended verbatim (not any of ``MANAGED_FLAGS``).
    The context is ``ctx_per_slot × parallel`` because llama-server splits ``-c`` evenly
    across slots; ``ctx_per_slot=None`` leaves ``-c`` to the server (the model's training
    context). ``threads=None`` lets llama-server size its threads to the machine.
    ``api_key`` is passed through the environment (``LLAMA_API_KEY``), never on the
    command line.
    """

    def __init__(
        self,
        binary: str | Path | None,
        model: str | Path,
        *,
        role: Role = "chat",
        base_dir: Path | None = None,
        args: Sequence[str] = (),
        parallel: int = 4,
        ctx_per_slot: int | None = 2048,
        threads: int | None = None,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        health_timeout: float = 180.0,
        name: str | None = None,
        api_key: str | None = None,
    ) -> None:
        name = name or role
        if isinstance(args, str):
            raise TypeError("args must be a sequence of strings, not one string")
        clashing = sorted({a.partition("=")[0] for a in args} & MANAGED_FLAGS)
        if clashing:
            raise ValueError(
                f"server {name!r}: extra args must not set {', '.join(clashing)}; "
                "use the server's own settings (port, parallel, ctx_size, threads)"
            )
        if parallel < 1:
            raise ValueError(f"server {name!r}: parallel must be >= 1, got {parallel}")
        if ctx_per_slot is not None and ctx_per_slot < 1:
            raise ValueError(f"server {name!r}: ctx_per_slot must be >= 1, got {ctx_per_slot}")
        if threads is not None and threads < 1:
            raise ValueError(f"server {name!r}: threads must be >= 1, got {threads}")
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(f"server {name!r}: port must be 0-65535, got {port}")
        if not health_timeout > 0:
            raise ValueError(f"server {name!r}: health_timeout must be > 0, got {health_timeout}")
        self.name = name
        self.role: Role = role
        self.parallel = parallel
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads
        self.health_timeout = health_timeout
        #: the resolved binary and GGUF (None until the first fetch)
        self.binary: Path | None = None
        self.model: Path | None = None
        self._format_args: list[str] = []
        self._binary_spec = binary
        self._model_spec = model
        self._base_dir = base_dir
        self._args = list(args)
        self._port = port or None  # 0 means "pick one", the same as None
        self._env = dict(env) if env else {}
        if api_key is not None:
            self._env["LLAMA_API_KEY"] = api_key
        # _cond guards _state, _proc, _start and _stopping; it is never held across a
        # fetch, a spawn or a health poll.
        self._cond = threading.Condition()
        self._stop_lock = threading.Lock()  # one stop() at a time
        self._state = ServerState.CREATED
        self._start: _Start | None = None
        self._stopping = False
        self._proc: _Process | None = None
        self._finalizer: weakref.finalize[[float], ManagedServer] | None = None
        self._optional: frozenset[str] | None = None  # of _OPTIONAL_FLAGS, probed once from --help
        self._build: str | None = None  # the binary's build id (managed.probes), set by each fetch
        self._port_zero = True  # False once this binary proved it can't report --port 0
        self._crashes: deque[tuple[int, str]] = deque(maxlen=8)  # (pid, detail), newest last
        self._returncode: int | None = None
        #: whether this chat server enforced the grammar canary at its last start (None:
        #: not a chat server, not started, or the canary itself failed)
        self.grammar_enforced: bool | None = None

    # -- public surface -------------------------------------------------------------
    @property
    def key(self) -> ServerKey:
        """The identity of this server: build, model, role and every flag but the port."""
        flags = [f"--parallel={self.parallel}", f"-c={self.ctx_per_slot}", f"-t={self.threads}", *self._args]
        return ServerKey(str(self._binary_spec or ""), str(self._model_spec), self.role, tuple(flags))

    @property
    def state(self) -> ServerState:
        """The lifecycle state; a READY server found dead reads as FAILED."""
        state, proc = self._state, self._proc
        if state is ServerState.READY and proc is not None and not proc.alive():
            return ServerState.FAILED
        return state

    @property
    def pid(self) -> int | None:
        """The current server's pid (None before the first spawn)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT`` of the READY server, else None."""
        proc = self._proc
        if self._state is not ServerState.READY or proc is None or not proc.bound_port:
            return None
        return f"http://{HOST}:{proc.bound_port}"

    @property
    def returncode(self) -> int | None:
        """Exit code of the last stopped or crashed server (negative: killed by that signal)."""
        return self._returncode

    def is_alive(self) -> bool:
        """True while the current server process runs (it stays unreaped until stopped)."""
        proc = self._proc
        return proc is not None and proc.alive()

    def settle(self, timeout: float = 1.0) -> bool:
        """After a refused or dropped connection: wait (bounded) for a dying server's exit.

        A killed server closes its sockets before the kernel lets us collect its exit
        (a multi-threaded process is waitable only once every thread has exited), so the
        request that found it dead can race ahead of ``is_alive()``. True once it exited.
        """
        deadline = time.monotonic() + timeout
        while self.is_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def rss(self) -> int | None:
        """Resident memory of the running server in bytes (None when it is not running)."""
        proc = self._proc
        if proc is None or not proc.alive():
            return None
        import psutil

        try:
            return int(psutil.Process(proc.pid).memory_info().rss)
        except psutil.Error:
            return None

    def stderr_tail(self, n: int = 20) -> str:
        """The last ``n`` stderr lines of the current (or last) server process."""
        proc = self._proc
        return proc.tail(n) if proc is not None else ""

    def argv(self) -> list[str]:
        """The argv of the current (or last) spawn, secrets redacted."""
        proc = self._proc
        return _redact(proc.argv) if proc is not None else []

    def ensure_ready(self) -> str:
        """Fetch and start the server if needed (or respawn a dead one); return its base URL.

        Raises ``FetchError`` when the binary or model cannot be had, ``SidecarExited`` at
        once if the process exits during start-up, ``SidecarStartTimeout`` if /health is
        not 200 within ``health_timeout``, and ``SidecarError`` if ``stop()`` ran meanwhile.
        """
        url = self._live_url()
        if url is not None:
            return url
        with self._cond:
            while True:
                start = self._start
                if start is not None:  # another caller is fetching or starting: share it
                    while not start.done:
                        self._cond.wait()
                    if isinstance(start.error, Exception):
                        raise start.error
                    if start.error is not None:  # the starting thread was interrupted
                        raise SidecarError(f"server {self.name!r}: start interrupted") from start.error
                elif self._stopping:
                    self._cond.wait()
                else:
                    url = self._live_url()
                    if url is not None:
                        return url
                    crashed = self._proc if self._state is ServerState.READY else None
                    start = self._start = _Start()
                    self._state = ServerState.FETCHING
                    break
        return self._run(start, crashed)

    def crash_detail(self, pid: int | None = None) -> str | None:
        """Why the server went away, for a request that found it dead; None if it didn't.

        Without ``pid``: the current server, if it exited without being stopped. With
        ``pid`` (read from ``.pid`` when the request was made): that process's exit, even
        if a respawn has happened since. Never blocks on a start in progress.
        """
        if pid is not None:
            for crashed_pid, detail in reversed(list(self._crashes)):
                if crashed_pid == pid:
                    return detail
        proc = self._proc
        if proc is None or (pid is not None and proc.pid != pid) or proc.alive() or proc.stop_requested:
            return None
        return self._crash_text(proc)

    def stop(self, grace: float = 2.0) -> int | None:
        """Stop the server: cancel a fetch or start in progress, else SIGTERM, up to
        ``grace`` s, then SIGKILL. Idempotent.

        Returns the exit code (0 for a clean shutdown, -9 when it had to be killed).
        A later ``ensure_ready()`` fetches nothing again and starts a fresh server.
        """
        with self._stop_lock:
            with self._cond:
                self._stopping = True
                start = self._start
                if start is not None:
                    start.cancel.set()
                    self._state = ServerState.STOPPING
                    deadline = time.monotonic() + _CANCEL_WAIT
                    while not start.done and (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)
                proc = self._proc
                finalizer, self._finalizer = self._finalizer, None
                if proc is not None and finalizer is not None and finalizer.alive:
                    self._state = ServerState.STOPPING
                    finalizer.detach()
                else:
                    proc = None
            try:
                if proc is not None:
                    self._returncode = proc.stop(grace)
            finally:
                with self._cond:
                    self._state = ServerState.STOPPED
                    self._stopping = False
                    self._cond.notify_all()
            return self._returncode

    def close(self) -> None:
        """Same as ``stop()``."""
        self.stop()

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"ManagedServer(name={self.name!r}, role={self.role}, model={str(self._model_spec)!r}, "
            f"state={self._state.value}, pid={self.pid}, url={self.base_url})"
        )

    # -- the start attempt (runs in the caller's thread, no lock held) -----------------
    def _live_url(self) -> str | None:
        proc = self._proc
        if self._state is ServerState.READY and proc is not None and proc.alive():
            return self.base_url
        return None

    def _run(self, start: _Start, crashed: _Process | None) -> str:
        try:
            if crashed is not None:
                self._record_crash(crashed)
            self._fetch(start)
            with self._cond:
                if not start.cancel.is_set():
                    self._state = ServerState.STARTING
            url = self._spawn_until_ready(start, time.monotonic() + self.health_timeout)
            if start.cancel.is_set():  # healthy just as stop() came: stop() takes it down
                raise _Cancelled
        except Exception as exc:
            if not start.cancel.is_set():
                self._finish(start, exc)
                raise
            stopped = SidecarError(f"server {self.name!r} was stopped while starting")
            stopped.__cause__ = None if isinstance(exc, _Cancelled) else exc  # e.g. DownloadCancelled
            self._finish(start, stopped)
            raise stopped from stopped.__cause__
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: waiters get a SidecarError
            self._finish(start, exc)
            raise
        self._finish(start, None)
        return url

    def _finish(self, start: _Start, error: BaseException | None) -> None:
        with self._cond:
            if not start.cancel.is_set():  # a cancelled attempt leaves the state to stop()
                self._state = ServerState.FAILED if error is not None else ServerState.READY
            start.error = error
            start.done = True
            self._start = None
            self._cond.notify_all()

    def _fetch(self, start: _Start) -> None:
        """Resolve (and on first use fetch and verify) the binary and the model."""
        from localllm.managed.acquire import resolve_model, resolve_server_binary

        cancel = start.cancel
        binary = resolve_server_binary(self._binary_spec, cancel=cancel)
        model = resolve_model(self._model_spec, base_dir=self._base_dir, cancel=cancel)
        if cancel.is_set():
            raise _Cancelled
        from localllm.managed import probes

        build = probes.build_id(binary)
        if build != self._build or binary != self.binary:
            self._optional = None  # another build: what its --help lists is asked again
        self._build = build
        self.binary, self.model = binary, model
        from localllm.managed.pins import chat_format_args

        self._format_args = chat_format_args(self._model_spec, self.role, self._args)

    def _record_crash(self, proc: _Process) -> None:
        """Reap a READY server that exited and remember why, for the request that hit it."""
        self._release(proc, grace=0.0)
        self._crashes.append((proc.pid, self._crash_text(proc)))

    def _crash_text(self, proc: _Process) -> str:
        proc.settle_stderr(0.5)
        return (
            f"llama-server {self.name!r} (pid {proc.pid}) {_describe_exit(exit_code(proc.popen))}"
            f"{stderr_detail(proc.tail(20))}"
        )

    def _release(self, proc: _Process, grace: float) -> None:
        with self._cond:
            finalizer = self._finalizer if self._proc is proc else None
            if finalizer is not None:
                self._finalizer = None
        if finalizer is not None:
            finalizer.detach()
        self._returncode = proc.stop(grace)

    def _build_argv(self, binary: Path, model: Path, port: int, deadline: float) -> list[str]:
        argv = [str(binary), "-m", str(model), "--host", HOST, "--port", str(port), "--parallel", str(self.parallel)]
        if self.ctx_per_slot is not None:
            argv += ["-c", str(self.ctx_per_slot * self.parallel)]
        if self.threads is not None:
            argv += ["-t", str(self.threads)]
        ui_flag = self._probe_ui_flag(binary, deadline)
        if ui_flag:
            argv.append(ui_flag)
        if self.role == "chat" and "--swa-full" in self._known_flags(binary, deadline):
            # sliding-window models (gemma 2/3) keep a window-sized KV cache by default, and
            # llama-server then cannot reuse a cached prompt prefix: every call re-evaluated
            # the whole prompt (cache_n 1 of 440 on the demo gate; 6–8 tokens with the flag).
            # Models without SWA ignore it.
            argv.append("--swa-full")
        return argv + self._format_args + self._args  # a pinned prompt format, then the caller's flags

    def _probe_ui_flag(self, binary: Path, deadline: float) -> str:
        """``--no-webui`` (or its newer name ``--no-ui``) if this binary knows it."""
        known = self._known_flags(binary, deadline)
        return next((flag for flag in ("--no-webui", "--no-ui") if flag in known), "")

    def _known_flags(self, binary: Path, deadline: float) -> frozenset[str]:
        """Which of the optional flags (:data:`_OPTIONAL_FLAGS`) this binary's ``--help`` lists.

        The probe is bounded by the start's deadline — it may use half of what is left, so
        the server itself still gets a chance — and a binary that hangs on ``--help`` gets
        no optional flags (not cached: the next start, with a fresh deadline, asks again).
        """
        if self._optional is None:
            from localllm.managed import probes

            known = probes.recall(self._build).get("flags")
            if isinstance(known, list):  # this build's --help, read at an earlier start
                self._optional = frozenset(flag for flag in known if flag in _OPTIONAL_FLAGS)
                return self._optional
            budget = min(_PROBE_TIMEOUT, max(deadline - time.monotonic(), 0.0) / 2)
            try:
                probe = run_probe([str(binary), "--help"], timeout=budget, env=_child_env(binary, self._env))
            except OSError as exc:
                raise _launch_error(binary, exc) from exc
            if probe.timed_out:
                return frozenset()
            self._optional = frozenset(
                flag for flag in _OPTIONAL_FLAGS if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", probe.output)
            )
            if probe.returncode == 0:
                probes.remember(self._build, flags=sorted(self._optional))
        return self._optional

    def _spawn_until_ready(self, start: _Start, deadline: float) -> str:
        bind_failures = 0
        while True:
            if start.cancel.is_set():
                raise _Cancelled
            if self._port is not None:
                port = self._port
            elif self._port_zero:
                port = 0
            else:
                port = _free_port()
            proc = self._spawn(port, deadline)
            try:
                return self._await_ready(proc, start, deadline)
            except _PortNotReported:
                self._release(proc, grace=0.0)
                self._port_zero = False
            except _PortTaken:
                self._release(proc, grace=_ABORT_GRACE)
                if self._port is None:  # a port we picked ourselves: someone took it in between
                    bind_failures += 1
                    if bind_failures < _BIND_RETRIES and time.monotonic() < deadline:
                        continue
                raise SidecarError(
                    f"server {self.name!r}: port {port} is in use by another process",
                    hint="choose another port, or leave it unset so llama-server picks a free one",
                ) from None
            except SidecarExited as exc:
                # Only a port we picked ourselves is retried: someone took it in between.
                if self._port is None and port and _BIND_FAILED in exc.stderr_tail:
                    bind_failures += 1
                    if bind_failures < _BIND_RETRIES and time.monotonic() < deadline:
                        continue
                raise

    def _spawn(self, port: int, deadline: float) -> _Process:
        assert self.binary is not None and self.model is not None
        argv = self._build_argv(self.binary, self.model, port, deadline)
        env = _child_env(self.binary, self._env)
        try:
            proc = _Process(argv, env, port, log_path_for(self._model_spec))
        except OSError as exc:
            raise _launch_error(self.binary, exc) from exc
        with self._cond:
            self._proc = proc
            self._returncode = None
            # Stops the server at interpreter exit or if this object is garbage-collected;
            # holds the process, not the server object, so it never keeps that alive.
            self._finalizer = weakref.finalize(self, proc.stop, 2.0)
        return proc

    def _await_ready(self, proc: _Process, start: _Start, deadline: float) -> str:
        interval = _POLL_FIRST
        with _http.client() as client:
            while True:
                if start.cancel.is_set():
                    self._release(proc, grace=_ABORT_GRACE)
                    raise _Cancelled
                if not proc.alive():
                    self._release(proc, grace=0.0)
                    raise self._exited(proc)
                port = proc.port()
                if port and self._healthy(client, port, deadline):
                    # A port we named (fixed, or picked for a build that can't report one)
                    # may be answered by another process: ours is ready only once it listens
                    # there itself. A port it reported or bound is its own.
                    if not proc.alive():
                        self._release(proc, grace=0.0)
                        raise self._exited(proc)
                    if proc.requested_port and not proc.owns(port):
                        raise _PortTaken
                    # once, not per poll: a /proc walk on the cold-start path (stop notes again)
                    proc.note_descendants()
                    proc.bound_port = port
                    if self.role == "chat":
                        self.grammar_enforced = self._grammar_verdict(client, proc, port, deadline)
                    return f"http://{HOST}:{port}"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._release(proc, grace=_ABORT_GRACE)
                    raise self._timed_out(proc)
                # Fast at first (a small model is ready in well under a second), backing off
                # to _POLL; the "listening" log line wakes the loop at once either way.
                proc.wake.wait(min(interval, remaining))
                proc.wake.clear()
                interval = min(_POLL, interval * _POLL_BACKOFF)

    @staticmethod
    def _healthy(client: httpx.Client, port: int, deadline: float) -> bool:
        import httpx

        budget = max(0.05, min(2.0, deadline - time.monotonic()))
        try:
            response = client.get(
                f"http://{HOST}:{port}/health", timeout=httpx.Timeout(budget, connect=min(budget, 1.0))
            )
        except httpx.TransportError:
            return False  # not listening yet, or busy loading: poll again
        return response.status_code == 200

    def _grammar_verdict(self, client: httpx.Client, proc: _Process, port: int, deadline: float) -> bool | None:
        """The canary's verdict on this build: remembered from an earlier start, else asked now.

        A verdict (True or False) is kept per build (``managed.probes``), so a rebuilt or
        replaced server is asked again; an inconclusive canary (None) is not kept, nor one
        whose server died meanwhile (whoever answered, it was not surely this build).
        """
        from localllm.managed import probes

        known = probes.recall(self._build).get("grammar_enforced")
        if isinstance(known, bool):
            return known
        verdict = self._canary(client, port, deadline)
        if verdict is not None and proc.alive():
            probes.remember(self._build, grammar_enforced=verdict)
        return verdict

    def _canary(self, client: httpx.Client, port: int, deadline: float) -> bool | None:
        """Does the server enforce a request's ``grammar`` at all? (:data:`CANARY_BODY`).

        Answers are validated either way; this makes a build that silently ignores grammars
        (``meta.grammar_enforced: false``) visible instead of trusting it. A canary that
        cannot run (error, timeout) says None and never fails the start.
        """
        import httpx

        key = self._env.get("LLAMA_API_KEY")
        budget = max(0.05, min(_CANARY_TIMEOUT, deadline - time.monotonic()))
        try:
            reply = client.post(
                f"http://{HOST}:{port}/v1/chat/completions",
                json=CANARY_BODY,
                headers={"Authorization": f"Bearer {key}"} if key else {},
                timeout=budget,
            )
            content = reply.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, LookupError, TypeError, RecursionError):
            return None
        if reply.status_code != 200:
            return None
        return bool(content == CANARY_ANSWER)

    def _exited(self, proc: _Process) -> SidecarExited:
        proc.settle_stderr()
        tail = proc.tail(20)
        if proc.requested_port and _BIND_FAILED in tail:
            hint = (
                f"port {proc.requested_port} is already in use: choose another port, "
                "or leave it unset so llama-server picks a free one"
            )
        elif proc.popen.returncode == -signal.SIGILL:
            hint = _SIGILL_ADVICE
        else:
            hint = f"run it by hand to see the whole log: {' '.join(_redact(proc.argv))}"
        return SidecarExited(argv=_redact(proc.argv), returncode=proc.popen.returncode, stderr_tail=tail, hint=hint)

    def _timed_out(self, proc: _Process) -> SidecarStartTimeout:
        return SidecarStartTimeout(
            f"llama-server {self.name!r} ({self.model}) was not healthy within "
            f"{self.health_timeout:g} s{stderr_detail(proc.tail(20))}",
            hint="raise health_timeout for a large model or a slow disk, or check the log above",
        )
