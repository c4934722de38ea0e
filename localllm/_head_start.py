"""The head start: ``localllm run``/``call`` spawns its last llama-server before its own imports.

A command's sidecar otherwise starts ~0.13 s after the process does: the interpreter, the
CLI, the config's declarations and parse, the managed layer — ~110 ms of module code that
runs before anything says which server to start. The model's load (≥ 1 s) is what the
command waits for, so every millisecond before the spawn is a millisecond on the answer.

- **Recorded**: when a ``run``/``call`` process spawns its first sidecar while its config
  loads (the early start, ``cli.foundation.EarlyStart``), :func:`record` keeps, under a
  digest of the working directory and the command line (the values of ``--arg``,
  ``--world`` and ``--prompt`` left out, so one gate asked about different tickets shares
  an entry), the server's argv, the environment entries it set or dropped relative to the
  process's own, and the identity (size, mtime) of the config file and of every file the
  argv names. File ``head-start.json`` in the cache (its newest :data:`_KEEP` entries);
  it holds no environment values but those localllm set itself, no template values.
- **Used**: :func:`begin`, the first thing the program does, finds the entry of its own
  command line and, when every recorded file still has its identity, spawns that server
  at once (own session, stderr piped, its watchdog armed) and holds it.
- **Claimed or stopped**: the command then runs exactly as without it — the config parsed
  and checked, the route resolved. Where it would spawn a server, :func:`claim` hands it
  the held one only when that is the very argv and environment it computed and is still
  running; otherwise the held one is stopped and the command spawns its own (and records
  it). When the config has loaded (:func:`release`, called by ``cli.foundation.load``
  whatever happened: a service attached, a check failed) a held server nobody claimed is
  stopped and its entry forgotten; the watchdog stops it if the process dies first.

So a changed config, binary, model or environment costs at most one wasted spawn, never a
different server. ``LOCALLLM_NO_HEAD_START=1`` turns it off. The plan file is used only when
owned by this user and writable by no one else: it names a program to run, like the
cache's own binaries.

Imports only the standard library, :mod:`localllm.settings` and :mod:`localllm._process`
(no dataclasses, no YAML, nothing of the CLI): the point is to run before them.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import stat
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from localllm import settings
from localllm._process import arm_watchdog, disarm_watchdog, exited, spawn, stop_group
from localllm.redact import mask_option_values

__all__ = ["Held", "begin", "claim", "note_config", "record", "release"]

PLAN_FILE = "head-start.json"
_KEEP = 8  # entries kept: one per (directory, command line) recently run
_MAX_PLAN = 1 << 20  # bytes: a larger plan is not ours (8 entries take a few KiB); not read
_COMMANDS = ("run", "call")
#: options whose value is the call's content, not its setup (left out of the digest)
_CONTENT_OPTIONS = ("--arg", "--world", "--prompt")


class Held(NamedTuple):
    """A server spawned from the plan, not yet claimed."""

    argv: list[str]
    env: dict[str, str]
    popen: subprocess.Popen[bytes]
    watchdog: subprocess.Popen[bytes]


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: str | None = None  # set by begin() for a run/call: recording is on
        self.open = False  # between begin() and release(): the config is loading
        self.config: Path | None = None
        self.held: Held | None = None
        self.recorded = False


_state = _State()


def line_key(argv: Sequence[str], cwd: str) -> str | None:
    """The digest of a command line in a directory, or ``None`` when it is not a run/call."""
    words = list(argv)
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in _COMMANDS or any(w in ("-h", "--help", "--") for w in words):
        return None
    shape = mask_option_values(words, _CONTENT_OPTIONS)
    return hashlib.sha256(json.dumps([cwd, shape]).encode()).hexdigest()


def begin(argv: Sequence[str]) -> None:
    """Spawn the server recorded for this command line, if any and still current (the program's first step)."""
    if not settings.head_start():
        return
    try:
        key = line_key(argv, os.getcwd())
    except OSError:  # the working directory is gone
        return
    if key is None:
        return
    with _state.lock:
        _state.key, _state.open = key, True
    entry = next((e for e in _read_plan() if e["key"] == key), None)
    if entry is None or not _current(entry):
        return
    env = {k: v for k, v in os.environ.items() if k not in entry["env_unset"]}
    env.update(entry["env_set"])
    argv_ = list(entry["argv"])
    try:
        popen = spawn(argv_, stderr=subprocess.PIPE, env=env)
    except (OSError, ValueError):  # ValueError: a NUL in an argument or a variable
        return
    try:
        watchdog = arm_watchdog(popen.pid)
    except OSError:
        _stop(popen)
        return
    with _state.lock:
        _state.held = Held(argv_, env, popen, watchdog)
    atexit.register(release)


def note_config(path: Path) -> None:
    """The config file this command loads (its identity goes into the record)."""
    _state.config = path


def claim(argv: Sequence[str], env: Mapping[str, str]) -> Held | None:
    """The held server when it is exactly ``argv`` with ``env`` and still running; else stop it, ``None``."""
    with _state.lock:
        held, _state.held = _state.held, None
    if held is None:
        return None
    if held.argv == list(argv) and held.env == dict(env) and not exited(held.popen):  # never reaps
        return held
    _stop(held.popen, held.watchdog)
    return None


def record(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Remember the first server this run/call spawned while its config loaded (best effort)."""
    with _state.lock:
        if _state.key is None or not _state.open or _state.recorded:
            return
        _state.recorded = True
        key, config = _state.key, _state.config
    config_identity = _identity(config) if config is not None else None
    if config_identity is None:
        return  # no config to check a later run against
    files = [Path(a) for a in argv if os.path.isabs(a)]
    entry: dict[str, Any] = {
        "key": key,
        "argv": list(argv),
        "env_set": {k: v for k, v in env.items() if os.environ.get(k) != v},
        "env_unset": sorted(k for k in os.environ if k not in env),
        "files": [config_identity, *(ident for ident in map(_identity, files) if ident is not None)],
    }
    entries = [entry] + [e for e in _read_plan() if e["key"] != key]
    _write_plan(entries[:_KEEP])


def release() -> None:
    """The config has loaded: stop a held server nobody claimed (and forget its entry); no more recording."""
    with _state.lock:
        held, _state.held = _state.held, None
        key, _state.open = _state.key, False
    if held is None:
        return
    _stop(held.popen, held.watchdog)
    if key is not None:
        _write_plan([e for e in _read_plan() if e["key"] != key])


# ------------------------------------------------------------------------ internals


def _stop(popen: subprocess.Popen[bytes], watchdog: subprocess.Popen[bytes] | None = None) -> None:
    """Stop a server spawned here, close its stderr pipe, and disarm its watchdog (if armed)."""
    stop_group(popen, grace=0.0)
    if popen.stderr is not None:
        popen.stderr.close()
    if watchdog is not None:
        disarm_watchdog(watchdog)


def _plan_path() -> Path:
    return settings.cache_dir() / PLAN_FILE


def _read_plan() -> list[dict[str, Any]]:
    """The plan's entries; none when the file is missing, unreadable, malformed or not safely ours."""
    try:
        # O_NONBLOCK: a FIFO in its place must not hang the command (it is not a regular file)
        fd = os.open(_plan_path(), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return []
            raw = fh.read(_MAX_PLAN + 1)
        if len(raw) > _MAX_PLAN:
            return []
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than json decodes
        return []
    entries = data.get("entries") if isinstance(data, dict) and data.get("version") == 1 else None
    return [e for e in entries if _well_formed(e)] if isinstance(entries, list) else []


def _well_formed(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    argv, env_set, env_unset, files = (entry.get(k) for k in ("argv", "env_set", "env_unset", "files"))
    return (
        isinstance(entry.get("key"), str)
        and isinstance(argv, list)
        and len(argv) > 0
        and all(isinstance(a, str) for a in argv)
        and isinstance(env_set, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env_set.items())
        and isinstance(env_unset, list)
        and all(isinstance(k, str) for k in env_unset)
        and isinstance(files, list)
        and len(files) > 0
        and all(
            isinstance(f, list) and len(f) == 3 and isinstance(f[0], str) and all(isinstance(n, int) for n in f[1:])
            for f in files
        )
    )


def _identity(path: Path) -> list[Any] | None:
    try:
        resolved = path.resolve()
        st = resolved.stat()
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop; ValueError: a NUL
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [str(resolved), st.st_size, st.st_mtime_ns]


def _current(entry: dict[str, Any]) -> bool:
    """Every recorded file (the config first, then the binary, the model, …) is unchanged."""
    return all(_identity(Path(f[0])) == f for f in entry["files"])


def _write_plan(entries: list[dict[str, Any]]) -> None:
    from localllm._fs import adjacent_tmp, replace_durably

    path = _plan_path()
    # a plan is an optimisation: a cache that cannot take it changes nothing else
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with adjacent_tmp(path) as fh:
            os.fchmod(fh.fileno(), 0o600)  # it names a program to run: its owner's alone, whatever the umask
            fh.write((json.dumps({"version": 1, "entries": entries}, indent=1) + "\n").encode("utf-8"))
            replace_durably(fh, path, sync_dir=False)
