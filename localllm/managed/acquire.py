"""Get a runnable llama-server and verified GGUFs: the entry points the server owner calls.

:func:`ensure_server` resolves, in order: ``LOCALLLM_SERVER_BIN``; a cached prebuilt
release for this platform; a cached source build; the prebuilt pin (mirrors first). It
never builds from source unless asked (``from_source=True``: 13-20 minutes on 2 cores).
Every fetch takes ``cancel``: set from another thread, it aborts the download promptly
and leaves no partial file (``DownloadCancelled``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from localllm import settings
from localllm.errors import FetchError, OfflineArtifactMissing, UnsupportedPlatform
from localllm.managed import platforms
from localllm.managed.cache import CacheLayout, cache_layout
from localllm.managed.pins import Pins, load_pins
from localllm.managed.release import ServerInstall, cached_server, install_for, install_prebuilt, log_stderr

FROM_SOURCE_HINT = (
    "build it here with `localllm fetch server --from-source` (13-20 min on 2 cores), pre-warm the cache "
    "with `localllm fetch server` on a connected machine, or use endpoint mode"
)
#: the same ways out for an offline miss, whose own hint already says how to pre-warm the cache
_OFFLINE_ALTERNATIVE = (
    "build it here with `localllm fetch server --from-source` (13-20 min on 2 cores), or use endpoint mode"
)


def mirrors_with(mirror: str | None) -> list[str]:
    """``--mirror`` first, then ``LOCALLLM_MIRROR``."""
    configured = settings.mirrors()
    return [mirror, *configured] if mirror else configured


@contextlib.contextmanager
def _cache_usable(layout: CacheLayout) -> Iterator[None]:
    """Turn an OS error on the cache itself (a path component that is a regular file, no
    permission, a read-only disk) into a FetchError naming the directory and the fix."""
    try:
        yield
    except FetchError:
        raise
    except OSError as exc:
        root = layout.root
        blocker = next((p for p in [root, *root.parents] if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            problem = f"{blocker} is a regular file, not a directory"
        else:
            problem = f"{exc.strerror or exc}: {exc.filename or root}"
        raise FetchError(
            f"cannot use the cache directory {root}: {problem}",
            hint="point LOCALLLM_CACHE_DIR at a writable directory, "
            "or unset it to use the user cache (~/.cache/localllm)",
        ) from exc


def resolve_server_binary(server_bin: str | Path | None = None, *, cancel: threading.Event | None = None) -> Path:
    """A declaration's ``server_bin`` when set, else :func:`ensure_server` (which honours
    ``LOCALLLM_SERVER_BIN``, then the cache, then fetches the pin)."""
    return Path(server_bin).expanduser() if server_bin else ensure_server(cancel=cancel).binary


def resolve_model(model: str | Path, *, base_dir: Path | None = None, cancel: threading.Event | None = None) -> Path:
    """A ``model:`` value as a GGUF path: a :class:`~pathlib.Path` or a ``*.gguf`` string
    (relative to ``base_dir``) is used as given and must exist; anything else is a pinned
    id fetched by :func:`ensure_model`."""
    if not isinstance(model, Path) and not model.endswith(".gguf"):
        return ensure_model(model, cancel=cancel)
    path = Path(model).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise FetchError(
            f"model file {path} not found",
            hint="fix the model: path (relative to the config file), or use a pinned model id",
        )
    return path


def ensure_server(
    *,
    from_source: bool = False,
    mirror: str | None = None,
    pins: Pins | None = None,
    layout: CacheLayout | None = None,
    cancel: threading.Event | None = None,
) -> ServerInstall:
    """A runnable llama-server, fetching (or, with ``from_source``, building) it if needed."""
    pins = pins or load_pins()
    layout = layout or cache_layout()
    mirrors = mirrors_with(mirror)
    if from_source:
        from localllm.managed.source_build import build_from_source

        with _cache_usable(layout):
            release_dir = build_from_source(
                pins=pins, layout=layout, mirrors=mirrors, offline=settings.offline(), log=log_stderr
            )
        return install_for(release_dir, f"source-{pins.source.version}", "source")
    override = settings.server_bin()
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FetchError(
                f"LOCALLLM_SERVER_BIN={override} is not an executable file",
                hint="point LOCALLLM_SERVER_BIN at a llama-server binary, or unset it",
            )
        return ServerInstall(binary=path, release_dir=path.parent, release="override", source="override")
    found = cached_server(pins, layout)
    if found is not None:
        return found
    plat = platforms.current()
    with _cache_usable(layout):  # outside: a broken cache dir is not fixed by a source build
        try:
            artifact = pins.server_for(plat.key)
            release_dir = install_prebuilt(
                artifact,
                pins=pins,
                layout=layout,
                mirrors=mirrors,
                offline=settings.offline(),
                cancel=cancel,
            )
        except UnsupportedPlatform:
            raise
        except FetchError as exc:
            if cancel is None or not cancel.is_set():  # a cancelled fetch needs no advice
                exc.add_alternative(
                    _OFFLINE_ALTERNATIVE if isinstance(exc, OfflineArtifactMissing) else FROM_SOURCE_HINT
                )
            raise
    return install_for(release_dir, pins.release, "prebuilt")


def ensure_model(
    model_id: str,
    *,
    mirror: str | None = None,
    pins: Pins | None = None,
    layout: CacheLayout | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """The verified GGUF of ``model_id``, fetched (mirrors first) if not cached.

    A cached file is trusted by its size+mtime stamp; anything else is re-hashed.
    """
    from localllm.managed.fetch import fetch_artifact

    pins = pins or load_pins()
    layout = layout or cache_layout()
    pin = pins.model(model_id)
    sha = pin.artifact.require_sha256(str(pins.path))
    with _cache_usable(layout):
        return fetch_artifact(
            pin.artifact,
            layout.model_path(pin),
            lock_path=layout.model_lock_path(model_id, sha[:16]),
            mirrors=mirrors_with(mirror),
            offline=settings.offline(),
            prewarm=f"localllm fetch model {model_id}",
            log=log_stderr,
            cancel=cancel,
        )
