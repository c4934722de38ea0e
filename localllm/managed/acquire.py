"""Get a runnable llama-server and verified GGUFs: the entry points the sidecar calls.

:func:`ensure_server` resolves, in order: ``LOCALLLM_SERVER_BIN``; a cached prebuilt
release for this platform; a cached source build; the prebuilt pin (mirrors first). It
never builds from source unless asked (``from_source=True``: ~15 minutes on 2 cores).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from localllm import _process, settings
from localllm.errors import FetchError, UnsupportedPlatform
from localllm.managed import platforms
from localllm.managed.cache import SERVER_BINARY, CacheLayout, cache_layout, installed, read_marker
from localllm.managed.pins import Artifact, Pins, load_pins

SourceKind = Literal["prebuilt", "source", "override"]
FROM_SOURCE_HINT = (
    "build it here with `localllm fetch server --from-source` (~15 min), pre-warm the cache "
    "with `localllm fetch server` on a connected machine, or use endpoint mode"
)


@dataclass(frozen=True)
class ServerInstall:
    """A runnable llama-server: the binary, its release directory and where it came from."""

    binary: Path
    release_dir: Path
    release: str
    source: SourceKind


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def mirrors_with(mirror: str | None) -> list[str]:
    """``--mirror`` first, then ``LOCALLLM_MIRROR``."""
    configured = settings.mirrors()
    return [mirror, *configured] if mirror else configured


def server_env(release_dir: Path | str) -> dict[str, str]:
    """The environment to run a release's llama-server in: its directory leads the
    library path (a stale inherited ``LD_LIBRARY_PATH`` would otherwise win over RUNPATH)."""
    env = settings.environ()
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    first = str(Path(release_dir).resolve())
    rest = [p for p in env.get(var, "").split(os.pathsep) if p and p != first]
    env[var] = os.pathsep.join([first, *rest])
    return env


def resolve_server_binary(server_bin: str | None = None) -> Path:
    """A declaration's ``server_bin`` when set, else :func:`ensure_server` (which honours
    ``LOCALLLM_SERVER_BIN``, then the cache, then fetches the pin)."""
    return Path(server_bin).expanduser() if server_bin else ensure_server().binary


def resolve_model(model: str, *, base_dir: Path | None = None) -> Path:
    """A ``model:`` value as a GGUF path: a ``*.gguf`` path (relative to ``base_dir``) is used
    as given and must exist; anything else is a pinned id fetched by :func:`ensure_model`."""
    if not model.endswith(".gguf"):
        return ensure_model(model)
    path = Path(model).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        exc = FetchError(f"model file {path} not found")
        exc.hint = "fix the model: path (relative to the config file), or use a pinned model id"
        raise exc
    return path


def smoke_version(release_dir: Path, *, error: type[FetchError] = FetchError) -> str:
    """Run ``llama-server --version`` from ``release_dir``; its output, or ``error``."""
    argv = [str(release_dir / SERVER_BINARY), "--version"]
    try:
        proc = _process.run_probe(argv, env=server_env(release_dir), timeout=60)
    except OSError as exc:
        raise error(f"cannot run {argv[0]} --version: {exc}") from exc
    output = proc.output.strip()
    if proc.timed_out:
        raise error(f"{argv[0]} --version did not finish within 60 s")
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-15:])
        raise error(f"{argv[0]} --version exited with code {proc.returncode}:\n{tail}")
    return output


def _install_for(path: Path, release: str, source: SourceKind) -> ServerInstall:
    return ServerInstall(binary=path / SERVER_BINARY, release_dir=path, release=release, source=source)


def cached_server(pins: Pins, layout: CacheLayout) -> ServerInstall | None:
    """A cached prebuilt release for this platform, else a cached source build, else None."""
    plat = platforms.current()
    prebuilt = layout.prebuilt_release_dir(pins.release, plat.slug)
    if installed(prebuilt):
        return _install_for(prebuilt, pins.release, "prebuilt")
    source = layout.source_release_dir(pins.source.version, plat.slug)
    if installed(source):
        return _install_for(source, f"source-{pins.source.version}", "source")
    return None


def ensure_server(
    *,
    from_source: bool = False,
    mirror: str | None = None,
    pins: Pins | None = None,
    layout: CacheLayout | None = None,
) -> ServerInstall:
    """A runnable llama-server, fetching (or, with ``from_source``, building) it if needed."""
    pins = pins or load_pins()
    layout = layout or cache_layout()
    mirrors = mirrors_with(mirror)
    if from_source:
        from localllm.managed.source_build import build_from_source

        release_dir = build_from_source(
            pins=pins, layout=layout, mirrors=mirrors, offline=settings.offline(), log=_log
        )
        return _install_for(release_dir, f"source-{pins.source.version}", "source")
    override = settings.server_bin()
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            exc = FetchError(f"LOCALLLM_SERVER_BIN={override} is not an executable file")
            exc.hint = "point LOCALLLM_SERVER_BIN at a llama-server binary, or unset it"
            raise exc
        return ServerInstall(binary=path, release_dir=path.parent, release="override", source="override")
    found = cached_server(pins, layout)
    if found is not None:
        return found
    plat = platforms.current()
    try:
        artifact = pins.server_for(plat.key)
        release_dir = install_prebuilt(
            artifact, pins=pins, layout=layout, mirrors=mirrors, offline=settings.offline()
        )
    except UnsupportedPlatform:
        raise
    except FetchError as exc:
        exc.hint = f"{exc.hint}; or {FROM_SOURCE_HINT}" if exc.hint else FROM_SOURCE_HINT
        raise
    return _install_for(release_dir, pins.release, "prebuilt")


def install_prebuilt(
    artifact: Artifact,
    *,
    pins: Pins,
    layout: CacheLayout,
    mirrors: Sequence[str],
    offline: bool,
) -> Path:
    """Fetch, verify, extract (and shim) the prebuilt release into its cache directory."""
    from localllm.managed.cxxshim import ensure_shim, probe_system
    from localllm.managed.extract import extract_archive, install_dir, staging_dir
    from localllm.managed.fetch import artifact_lock, fetch_artifact
    from localllm.managed.pins import ShimPin

    plat = platforms.current()
    dest = layout.prebuilt_release_dir(pins.release, plat.slug)
    with artifact_lock(layout.lock_path("release", dest.name), f"llama-server {pins.release}", _log):
        if installed(dest):
            return dest

        def fetch(art: Artifact) -> Path:
            sha = art.require_sha256()
            return fetch_artifact(
                art, layout.download_path(art), lock_path=layout.lock_path("download", sha[:16]),
                mirrors=mirrors, offline=offline, prewarm="localllm fetch server", log=_log,
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
                    staging, pinned_required=pins.requires_glibcxx, shim=pins.shim_for(plat.key),
                    fetch_shim=fetch_shim, probe=probe_system(), log=_log,
                )
            version = smoke_version(staging)
            from localllm.managed.cache import write_marker

            write_marker(staging, {
                "kind": "prebuilt", "release": pins.release, "platform": plat.key,
                "archive": artifact.file, "sha256": artifact.sha256, "url": artifact.url,
                "libstdcxx_shim": shim, "version": version.splitlines()[0] if version else "",
                "installed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            })
            install_dir(staging, dest)
    return dest


def ensure_model(
    model_id: str,
    *,
    mirror: str | None = None,
    pins: Pins | None = None,
    layout: CacheLayout | None = None,
) -> Path:
    """The verified GGUF of ``model_id``, fetched (mirrors first) if not cached.

    A cached file is trusted by its size+mtime stamp; anything else is re-hashed.
    """
    from localllm.managed.fetch import fetch_artifact

    pins = pins or load_pins()
    layout = layout or cache_layout()
    pin = pins.model(model_id)
    sha = pin.artifact.require_sha256(str(pins.path))
    return fetch_artifact(
        pin.artifact, layout.model_path(pin),
        lock_path=layout.lock_path("model", f"{model_id}-{sha[:16]}"),
        mirrors=mirrors_with(mirror), offline=settings.offline(),
        prewarm=f"localllm fetch model {model_id}", log=_log,
    )


def release_info(release_dir: Path) -> dict[str, object] | None:
    """The marker of an installed release (what ``cache list`` shows)."""
    return read_marker(release_dir)
