"""A ``localllm run``/``call``'s llama-server started before its config is even parsed.

Before the process knows which server its command needs it spends ~0.3 s (interpreter,
imports, YAML, the parse); the model then loads for ~1.5 s. So each run whose early agent
spawns its own server writes down how — a *plan*: the argv and what it was derived from —
and the next run of the same command reads the plan first thing and starts that server
at once, so the model loads while the rest of the process starts. A plan is a hint,
never trusted:

- it is used only when everything it was derived from is unchanged: localllm's version,
  the command's target (``run:GATE``, ``call:ALIAS``), the config file, the binary and the
  model (path, size, mtime, inode and device of each) and the environment (a hash of every
  variable); a stale, corrupt or unreadable plan is ignored, and this run's own spawn
  rewrites it (atomically: a temp file beside it, then a rename);
- the server it started is adopted only when the loaded config asks for exactly the same
  argv and environment (:func:`take`, from ``ManagedServer._spawn``); any difference and
  it is stopped, and the usual spawn follows;
- one never adopted (a config that fails a check, a gate whose agent is not that server,
  a ``localllm serve`` that appeared meanwhile) is stopped by :func:`discard` before the
  command returns, and at exit; like every spawn it has its watchdog, so not even a
  SIGKILLed ``localllm`` leaves it behind;
- a server with an environment of its own (an API key) is never planned: nothing from the
  environment is written, only its hash.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localllm.managed.server import _Process

__all__ = ["discard", "plan_file", "record", "start", "take"]

#: bumped when the plan's shape or meaning changes: an older plan is then ignored
PLAN_FORMAT = 1

_lock = threading.Lock()
_early: _Process | None = None  # started from a plan, not yet adopted
_expected: tuple[Path, dict[str, Any]] | None = None  # where this run's spawn writes its plan
_exit_hook: list[bool] = []


def plan_file(config: Path, target: str) -> Path:
    """Where the plan of ``target`` (``run:GATE``/``call:ALIAS``) under ``config`` lives."""
    from localllm.managed.cache import cache_layout

    name = hashlib.sha256(f"{os.path.abspath(config)}\0{target}".encode()).hexdigest()[:32]
    return cache_layout().root / "plans" / f"{name}.json"


def start(config: Path, target: str) -> bool:
    """Start the server of the plan for ``target`` under ``config`` if it is still valid.

    Remembers where this run's own spawn should write its plan either way. Never raises: a
    plan is only ever a head start. True when a server was started.
    """
    global _early, _expected
    try:
        path = plan_file(config, target)
        key = _key(config, target)
        with _lock:
            _expected = (path, key)
        plan = _valid_plan(path, key)
        if plan is None or _service_running():
            return False
        from localllm.managed.server import _child_env, _Process

        argv: list[str] = plan["argv"]
        binary = Path(plan["binary"]["path"])
        port = int(argv[argv.index("--port") + 1])
        proc = _Process(argv, _child_env(binary, None), port, Path(plan["log"]))
    except Exception:  # a head start that cannot be had is no error: the usual spawn follows
        return False
    with _lock:
        stale, _early = _early, proc
        if not _exit_hook:
            _exit_hook.append(True)
            atexit.register(discard)
    if stale is not None:
        stale.stop(0.0)
    return True


def take(argv: list[str], env: dict[str, str]) -> _Process | None:
    """The server started from a plan, if it runs exactly ``argv`` with ``env``; else None.

    A started server that does not match (or has exited) is stopped here: the caller then
    spawns its own.
    """
    global _early
    with _lock:
        proc, _early = _early, None
    if proc is None:
        return None
    if proc.argv == argv and proc.env == env and proc.alive():
        return proc
    proc.stop(0.5)
    return None


def record(argv: list[str], binary: Path, model: Path, log: Path) -> None:
    """Write this run's plan (once per process, for the first server it spawns). Never raises."""
    global _expected
    with _lock:
        expected, _expected = _expected, None
    if expected is None:
        return
    path, key = expected
    try:
        plan = {
            **key,
            "argv": argv,
            "binary": _identity(binary),
            "model": _identity(model),
            "log": str(log),
        }
        from localllm import _fs

        path.parent.mkdir(parents=True, exist_ok=True)
        _fs.atomic_write(path, json.dumps(plan, indent=1) + "\n", sync_dir=False)
    except (OSError, ValueError):
        return


def discard() -> None:
    """Stop a server started from a plan that nobody adopted (idempotent)."""
    global _early, _expected
    with _lock:
        proc, _early = _early, None
        _expected = None
    if proc is not None:
        proc.stop(0.5)


# -- validation ---------------------------------------------------------------------------


def _key(config: Path, target: str) -> dict[str, Any]:
    """What a plan must have been derived from to be used now."""
    from localllm._version import __version__

    environ = json.dumps(sorted(os.environ.items()), ensure_ascii=False).encode("utf-8", "surrogateescape")
    return {
        "format": PLAN_FORMAT,
        "localllm": __version__,
        "target": target,
        "config": _identity(Path(os.path.abspath(config))),
        "environ_sha256": hashlib.sha256(environ).hexdigest(),
    }


def _identity(path: Path) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def _valid_plan(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The plan at ``path`` if it parses, matches ``key`` and its binary and model are unchanged."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(plan, dict) or any(plan.get(name) != value for name, value in key.items()):
        return None
    argv, binary, model, log = plan.get("argv"), plan.get("binary"), plan.get("model"), plan.get("log")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return None
    if not (isinstance(binary, dict) and isinstance(model, dict) and isinstance(log, str)):
        return None
    with contextlib.suppress(ValueError, IndexError):
        if argv[0] == binary.get("path") and argv[argv.index("-m") + 1] == model.get("path"):
            int(argv[argv.index("--port") + 1])
            for file in (binary, model):
                try:
                    if _identity(Path(str(file.get("path")))) != file:
                        return None
                except OSError:
                    return None
            return plan
    return None


def _service_running() -> bool:
    """A ``localllm serve`` on this cache: the agent would attach to it, not spawn."""
    from localllm import settings
    from localllm.managed import discovery

    return discovery.read_discovery(settings.cache_dir()) is not None
