"""llama-server release directories: find the cached one, install the prebuilt pin, run it.

A release directory (drawn in :func:`localllm.managed.cache.cache_layout`) holds one
``llama-server`` with its shared libraries and a marker written last. This module knows
how to pick a cached one for this platform, install the pinned prebuilt archive into one,
and the environment and ``--version`` smoke test every binary is run with. It sits below
:mod:`localllm.managed.acquire` (the resolution policy) and beside the source build, so
the inventory, the doctor and the server can use it without reaching up.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from localllm import settings
from localllm._process import run_probe
from localllm.errors import FetchError
from localllm.managed import platforms
from localllm.managed.cache import SERVER_BINARY, CacheLayout, installed, release_changed, write_marker
from localllm.managed.pins import Artifact, Pins

SourceKind = Literal["prebuilt", "source", "override"]


@dataclass(frozen=True)
class ServerInstall:
    """A runnable llama-server: the binary, its release directory and where it came from."""

    binary: Path
    release_dir: Path
    release: str
    source: SourceKind


def log_stderr(message: str) -> None:
    """The default progress log of fetches and installs: one line on stderr."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def server_env(release_dir: Path | str) -> dict[str, str]:
    """The environment to run a release's llama-server in: its directory leads the
    library path (a stale inherited ``LD_LIBRARY_PATH`` would otherwise win over RUNPATH)."""
    env = settings.environ()
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    first = str(Path(release_dir).resolve())
    rest = [p for p in env.get(var, "").split(os.pathsep) if p and p != first]
    env[var] = os.pathsep.join([first, *rest])
    return env


def smoke_version(release_dir: Path, *, error: type[FetchError] = FetchError) -> str:
    """Run ``llama-server --version`` from ``release_dir``; its output, or ``error``."""
    argv = [str(release_dir / SERVER_BINARY), "--version"]
    try:
        proc = run_probe(argv, env=server_env(release_dir), timeout=60)
    except OSError as exc:
        raise error(f"cannot run {argv[0]} --version: {exc}") from exc
    output = proc.output.strip()
    if proc.timed_out:
        raise error(f"{argv[0]} --version did not finish within 60 s")
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise error(f"{argv[0]} --version exited with code {proc.returncode}:\n{tail}")
    return output


def install_for(path: Path, release: str, source: SourceKind) -> ServerInstall:
    """The :class:`ServerInstall` of the release directory ``path``."""
    return ServerInstall(binary=path / SERVER_BINARY, release_dir=path, release=release, source=source)


def cached_server(pins: Pins, layout: CacheLayout) -> ServerInstall | None:
    """A cached prebuilt release for this platform, else a cached source build, else None."""
    plat = platforms.current()
    prebuilt = layout.prebuilt_release_dir(pins.release, plat.slug)
    if installed(prebuilt):
        return install_for(prebuilt, pins.release, "prebuilt")
    source = layout.source_release_dir(pins.source.version, plat.slug)
    if installed(source):
        return install_for(source, f"source-{pins.source.version}", "source")
    return None


def install_prebuilt(
    artifact: Artifact,
    *,
    pins: Pins,
    layout: CacheLayout,
    mirrors: Sequence[str],
    offline: bool,
    cancel: threading.Event | None = None,
    repair: bool = False,
) -> Path:
    """Fetch, verify, extract (and shim) the prebuilt release into its cache directory.

    ``cancel`` set from another thread aborts a download in progress (``DownloadCancelled``).
    ``repair`` (``cache verify``): an installed release whose files no longer match its
    manifest, checked again under the lock, is installed again; the new one replaces it in
    one rename, and it is left as it was if that fails.
    """
    from localllm.managed.cxxshim import ensure_shim, probe_system
    from localllm.managed.extract import extract_archive, install_dir, staging_dir
    from localllm.managed.fetch import artifact_lock, fetch_artifact
    from localllm.managed.pins import ShimPin

    plat = platforms.current()
    dest = layout.prebuilt_release_dir(pins.release, plat.slug)
    with artifact_lock(
        layout.lock_path("release", dest.name), f"llama-server {pins.release}", log_stderr, cancel=cancel
    ):
        if installed(dest) and not (repair and release_changed(dest)):
            return dest

        def fetch(art: Artifact) -> Path:
            sha = art.require_sha256()
            return fetch_artifact(
                art,
                layout.download_path(art),
                lock_path=layout.download_lock_path(sha[:16]),
                mirrors=mirrors,
                offline=offline,
                prewarm="localllm fetch server",
                log=log_stderr,
                cancel=cancel,
            )

        def fetch_shim(shim: ShimPin) -> Path:
            return fetch(shim.artifact)

        archive = fetch(artifact)
        with staging_dir(layout.bin_dir, dest.name) as staging:
            extract_archive(archive, staging, flatten=True)
            if not (staging / SERVER_BINARY).is_file():
                raise FetchError(f"{archive.name} has no {SERVER_BINARY} at its top level")
            shim = False
            if plat.is_linux:
                shim = ensure_shim(
                    staging,
                    pinned_required=pins.requires_glibcxx,
                    shim=pins.shim_for(plat.key),
                    fetch_shim=fetch_shim,
                    probe=probe_system(),
                    log=log_stderr,
                )
            version = smoke_version(staging)
            write_marker(
                staging,
                {
                    "kind": "prebuilt",
                    "release": pins.release,
                    "platform": plat.key,
                    "archive": artifact.file,
                    "sha256": artifact.sha256,
                    "url": artifact.url,
                    "libstdcxx_shim": shim,
                    "version": version.splitlines()[0] if version else "",
                    "installed": datetime.now(UTC).isoformat(timespec="seconds"),
                },
            )
            install_dir(staging, dest)
    return dest
