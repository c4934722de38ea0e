"""Talking to a running service: ``ps``, ``stop``, ``serve --detach``, and attaching to it.

:func:`attach` (in :mod:`localllm.managed.upstream`) is what a managed agent's or
embedder's ``Upstream`` asks before spawning its own sidecar: with ``service: never`` it
returns None at once; otherwise it looks for a verified service of the same cache that
serves the same llama-server build and model (``auto``: None when there is none;
``required``: :class:`ServiceUnavailable`).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localllm import _fs
from localllm.errors import ServiceError, ServiceUnavailable
from localllm.managed import discovery
from localllm.managed.upstream import POLICIES, attach, cache_root_of

__all__ = ["POLICIES", "attach", "connect", "detach", "ps", "stop"]

_TIMEOUT = 10.0


def connect(cache_root: Path | None = None) -> tuple[discovery.Discovery, str | None]:
    """The verified service of this cache and its token, or :class:`ServiceUnavailable`."""
    root = cache_root_of(cache_root)
    found = discovery.read_discovery(root)
    token = discovery.read_token(found.token_file) if found else None
    if found is None or (found.token_file and token is None) or not discovery.verify(found, token):
        raise ServiceUnavailable(
            f"no localllm service is running for cache {root}",
            hint="start one with `localllm serve` (or `localllm serve --detach`)",
        )
    return found, token


def _call(method: str, path: str, cache_root: Path | None, body: dict[str, Any] | None = None) -> Any:
    import http.client

    found, token = connect(cache_root)
    host = "127.0.0.1" if found.host in ("0.0.0.0", "::", "") else found.host
    conn = http.client.HTTPConnection(host, found.port, timeout=_TIMEOUT)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ServiceUnavailable(f"the service at {found.url} did not answer {method} {path}: {exc}") from exc
    finally:
        conn.close()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ServiceError(f"the service at {found.url} answered {method} {path} with non-JSON") from exc
    if response.status != 200:
        message = data.get("error", {}).get("message") if isinstance(data, dict) else None
        raise ServiceError(f"the service at {found.url} answered HTTP {response.status}: {message or raw[:200]!r}")
    return data


def ps(cache_root: Path | None = None) -> dict[str, Any]:
    """``{"service": {...}, "models": [loaded model rows]}`` from the running service."""
    data: dict[str, Any] = _call("GET", "/localllm/ps", cache_root)
    return data


def stop(model: str | None = None, *, cache_root: Path | None = None, wait: float = 15.0) -> dict[str, Any]:
    """Unload ``model``, or (``model=None``) stop the service and wait until its process is gone."""
    if model is not None:
        result: dict[str, Any] = _call("POST", "/localllm/stop", cache_root, {"model": model})
        return result
    found, _ = connect(cache_root)
    _call("POST", "/localllm/stop", cache_root, {"all": True})
    import psutil

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if psutil.Process(found.pid).status() == psutil.STATUS_ZOMBIE:
                break  # exited; its parent has not reaped it yet
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        raise ServiceError(
            f"the service (pid {found.pid}) did not stop within {wait:g} s",
            hint=f"kill it with `kill {found.pid}` (its llama-servers follow it)",
        )
    return {"stopped": True, "pid": found.pid}


#: the detached service's log is rotated (one old file kept) past this many bytes at start
LOG_LIMIT = 4 << 20

#: ``python -c`` this, not ``python -m localllm``: ``-m`` puts the caller's directory first on
#: ``sys.path``, and a ``localllm/`` directory there (the clone, seen from its parent) would
#: shadow the installed package in the detached child
_CHILD_MAIN = "import sys; sys.path[:1] = []; from localllm.cli import main; sys.exit(main(sys.argv[1:]))"

#: the detached service: the same, its stdout and stderr lines tagged with its pid first
_DETACHED_MAIN = _CHILD_MAIN.replace(
    "from localllm.cli import main;",
    "from localllm.service.control import tag_output; tag_output(); from localllm.cli import main;",
)


def log_tag(pid: int) -> str:
    """What starts every line a detached service writes to the shared ``service.log``."""
    return f"[pid {pid}] "


class _TaggedLines:
    """A text stream writing whole lines, each prefixed with :func:`log_tag`, to ``fd``.

    Every ``serve --detach`` appends to one ``service.log``: instances started together (one
    wins the lock, the others exit) wrote there at once, and a loser's error showed the
    winner's lines as its own. One ``os.write`` per line on an ``O_APPEND`` descriptor: lines
    of two processes never mix within a line.
    """

    def __init__(self, fd: int, tag: str) -> None:
        self.fd = fd
        self.tag = tag
        self.encoding = "utf-8"
        self.errors = "backslashreplace"
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            done, _, self._pending = self._pending.rpartition("\n")
            self._emit(done.split("\n"))
        return len(text)

    def _emit(self, lines: list[str]) -> None:
        for line in lines:
            data = (self.tag + line + "\n").encode("utf-8", "backslashreplace")
            while data:
                data = data[os.write(self.fd, data) :]

    def flush(self) -> None:
        pass  # whole lines only: a partial one waits for its end (or for close())

    def close(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, ""
            self._emit([pending])

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True


def tag_output() -> None:
    """In the detached service: every line to stdout and stderr starts with :func:`log_tag`."""
    import atexit

    tag = log_tag(os.getpid())
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = _TaggedLines(fd, tag)
        setattr(sys, name, stream)
        atexit.register(stream.close)


def child_command(argv: Sequence[str], *, tagged: bool = False) -> list[str]:
    """The argv of a ``localllm`` child process that imports localllm the way this one did
    (``tagged``: its output lines start with :func:`log_tag`, as the detached service's do)."""
    return [sys.executable, "-c", _DETACHED_MAIN if tagged else _CHILD_MAIN, *argv]


def child_pythonpath() -> dict[str, str]:
    """``PYTHONPATH`` with the directory this process imported localllm from first, so a
    child started from any directory imports the same localllm (an uninstalled clone too)."""
    import localllm

    root = str(Path(localllm.__file__).resolve().parent.parent)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {"PYTHONPATH": os.pathsep.join([root, *rest])}


def _open_log(path: Path) -> int:
    """The service log, opened to append: only a regular file, never through a symlink (it
    would append to the link's target), never waiting on a FIFO (the open blocked for ever)."""
    try:
        return _fs.open_append(path, 0o600)
    except OSError as exc:
        raise ServiceError(
            f"cannot open the service log {path}: {exc.strerror or exc}",
            hint=f"remove {path} (the service writes a new one)",
        ) from exc


#: how much of the log after a detached instance's start is read for its own lines
_OWN_LINES_READ = 1 << 20


def own_lines(log_path: Path, start: tuple[int, int], pid: int) -> list[str]:
    """The lines detached instance ``pid`` wrote to ``log_path`` after ``start`` (the log's
    inode and size when it was spawned), its tag removed: other instances append to the same
    log at the same time. A log another instance rotated meanwhile is read in ``.1``."""
    inode, offset = start
    tag = log_tag(pid)
    current = _read_log(log_path, inode, offset)
    if current is None:  # rotated: our start is in service.log.1, the rest in the new log
        old = _read_log(log_path.with_name(log_path.name + ".1"), inode, offset) or b""
        current = old + (_read_log(log_path, None, 0) or b"")
    text = current.decode("utf-8", "replace")
    return [line[len(tag) :] for line in text.splitlines() if line.startswith(tag)]


def _read_log(path: Path, inode: int | None, offset: int) -> bytes | None:
    """Up to 1 MiB of ``path`` from ``offset`` when it is a regular file (with that ``inode``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (inode is not None and st.st_ino != inode):
            return None
        fh.seek(offset)
        return fh.read(_OWN_LINES_READ)


def detach(
    serve_argv: Sequence[str], *, cache_root: Path | None = None, wait: float = 120.0
) -> tuple[discovery.Discovery, Path]:
    """Start ``localllm serve`` + ``serve_argv`` in the background, logging to ``<cache>/run/service.log``;
    return its discovery (once it answers) and the log path."""
    root = cache_root_of(cache_root)
    run = discovery.run_dir(root)
    try:
        run.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a file at <cache>/run: FileExistsError, "a bug in localllm"
        raise discovery.unusable(run, exc) from exc
    log_path = run / discovery.LOG_FILE
    if log_path.is_file() and log_path.stat().st_size > LOG_LIMIT:  # bounded: one old log kept
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    log_fd = _open_log(log_path)
    try:
        at = os.fstat(log_fd)
        start = (at.st_ino, at.st_size)  # this instance's lines are after this offset
        # posix_spawn in a new session: no Popen object to outlive, no terminal to follow
        pid = os.posix_spawn(
            sys.executable,
            child_command(["serve", *serve_argv], tagged=True),
            {**os.environ, "LOCALLLM_CACHE_DIR": str(root), **child_pythonpath()},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            tail = own_lines(log_path, start, pid)[-10:]
            raise ServiceError(
                f"localllm serve exited with code {os.waitstatus_to_exitcode(status)} (pid {pid}); "
                + ("its last log lines:\n" + "\n".join(tail) if tail else "it wrote nothing to its log"),
                hint=f"the whole log is {log_path} (each line tagged {log_tag(pid).strip()} by its process)",
            )
        found = discovery.read_discovery(root)
        if found is not None and found.pid == pid:
            token = discovery.read_token(found.token_file)
            if discovery.verify(found, token):
                return found, log_path
        time.sleep(0.1)
    os.kill(pid, signal.SIGTERM)
    raise ServiceError(f"localllm serve did not come up within {wait:g} s", hint=f"see {log_path}")
