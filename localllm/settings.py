"""Every environment variable localllm reads, read here and only here.

Values are read at call time (not import time) so tests can patch the environment.

| variable | meaning |
|---|---|
| LOCALLLM_CACHE_DIR | cache root (default: platformdirs user cache, e.g. ~/.cache/localllm) |
| LOCALLLM_CONFIG_DIR | user config dir with `pins.json` (default: platformdirs, e.g. ~/.config/localllm) |
| LOCALLLM_CONFIG | the config a command uses without `-c` when the current directory has no `localllm.yaml` |
| LOCALLLM_MIRROR | directories or base URLs tried before pinned URLs (comma-separated) |
| LOCALLLM_OFFLINE | 1/true/yes/on: never open a socket for artifacts (0/false/no/off or unset: off; else an error) |
| LOCALLLM_CLAUDE_BIN | the claude executable (default: `claude` on PATH) |
| LOCALLLM_SERVER_BIN | a llama-server to use instead of the cached one |
| LOCALLLM_DEBUG | 1/true: the CLI prints tracebacks |
| LOCALLLM_NO_HEAD_START | 1/true: `run`/`call` do not spawn their last server before loading the config |
"""

from __future__ import annotations

import os
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _text(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def cache_dir() -> Path:
    """The cache root: ``LOCALLLM_CACHE_DIR`` or the platform's user cache dir."""
    override = _text("LOCALLLM_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("localllm", appauthor=False))


def config_dir() -> Path:
    """The user config dir: ``LOCALLLM_CONFIG_DIR`` or the platform's (``~/.config/localllm``)."""
    override = _text("LOCALLLM_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("localllm", appauthor=False))


def config_file() -> Path | None:
    """``LOCALLLM_CONFIG``: the config file a command uses when none is given and the
    current directory has no ``localllm.yaml``."""
    value = _text("LOCALLLM_CONFIG")
    return Path(value).expanduser() if value else None


def mirrors() -> list[str]:
    """Mirrors from ``LOCALLLM_MIRROR`` (directories or base URLs), in order."""
    value = _text("LOCALLLM_MIRROR")
    if not value:
        return []
    return [p.strip() for p in value.split(",") if p.strip()]


def offline() -> bool:
    """``LOCALLLM_OFFLINE``; a value that is neither on nor off is a FetchError, never "off"
    (before, ``LOCALLLM_OFFLINE=enabled`` on an air-gapped machine opened sockets)."""
    raw = os.environ.get("LOCALLLM_OFFLINE", "")
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    from localllm.errors import FetchError

    raise FetchError(
        f"LOCALLLM_OFFLINE={raw!r} is neither on ({', '.join(sorted(_TRUE))}) nor off (0, false, no, off)",
        hint="set LOCALLLM_OFFLINE=1 to never open a socket for artifacts, or unset it",
    )


def claude_bin() -> str | None:
    return _text("LOCALLLM_CLAUDE_BIN")


def server_bin() -> str | None:
    return _text("LOCALLLM_SERVER_BIN")


def head_start() -> bool:
    """``run``/``call`` spawn their last server before their imports (``_head_start``);
    ``LOCALLLM_NO_HEAD_START=1`` turns that off."""
    return not _flag("LOCALLLM_NO_HEAD_START")


def debug() -> bool:
    return _flag("LOCALLLM_DEBUG")


def env_value(name: str) -> str | None:
    """An arbitrary variable (for ``${VAR}`` interpolation and ``api_key_env``)."""
    return os.environ.get(name)


def environ() -> dict[str, str]:
    """A copy of the whole environment (the base a child process's environment starts from)."""
    return dict(os.environ)
