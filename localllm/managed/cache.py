"""Where managed artifacts live: the layout is drawn in :func:`cache_layout`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm import _lock, settings
from localllm._fs import atomic_write
from localllm.managed.pins import Artifact, ModelPin, SourcePin

MARKER = ".localllm-release.json"
SERVER_BINARY = "llama-server"


@dataclass(frozen=True)
class CacheLayout:
    """Paths of the cache rooted at ``root`` (see the module docstring for the drawing)."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def downloads_dir(self) -> Path:
        return self.root / "downloads"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    def prebuilt_release_dir(self, release: str, slug: str) -> Path:
        return self.bin_dir / f"llama-{release}-{slug}"

    def source_release_dir(self, version: str, slug: str) -> Path:
        return self.bin_dir / f"llama-source-{version}-{slug}"

    def model_path(self, model: ModelPin) -> Path:
        sha = model.artifact.require_sha256()
        return self.models_dir / model.id / sha[:16] / model.artifact.file

    def download_path(self, artifact: Artifact) -> Path:
        sha = artifact.require_sha256()
        return self.downloads_dir / sha[:16] / artifact.file

    def sdist_path(self, source: SourcePin) -> Path:
        return self.build_dir / "sdist" / source.artifact.file

    def source_tree(self, source: SourcePin) -> Path:
        return self.build_dir / f"{source.package}-{source.version}"

    def lock_path(self, kind: str, name: str) -> Path:
        """The cross-process lock of one artifact (see :func:`localllm._lock.lock_path`)."""
        return _lock.lock_path(self.root, kind, name)

    def model_lock_path(self, model_id: str, key: str) -> Path:
        """The lock of ``models/<model_id>/<key>/``: a fetch into it and a removal from it hold it."""
        return self.lock_path("model", f"{model_id}-{key}")

    def download_lock_path(self, key: str) -> Path:
        """The lock of ``downloads/<key>/``: a fetch into it and a removal from it hold it."""
        return self.lock_path("download", key)


def cache_layout(root: Path | None = None) -> CacheLayout:
    """The cache at ``root`` (default ``settings.cache_dir()``), laid out like this.

    The cache root is ``settings.cache_dir()``: ``LOCALLLM_CACHE_DIR`` if set, else the
    platform's user cache (``~/.cache/localllm`` on Linux, ``~/Library/Caches/localllm`` on
    macOS)::

        <root>/
        ├── bin/                                     one directory per installed llama-server
        │   ├── llama-b9444-linux-x86_64/            prebuilt release, extracted flat:
        │   │   ├── llama-server, llama-*            executables
        │   │   ├── libllama.so → libllama.so.0 → libllama.so.0.x.y   SONAME links kept
        │   │   ├── libstdc++.so.6                   only when the host's libstdc++ is too old
        │   │   └── .localllm-release.json           written last: origin + sha256 of every file
        │   └── llama-source-0.3.36-linux-x86_64/    built from the pinned sdist; same layout
        ├── models/<id>/<sha256[:16]>/<file>.gguf    keyed by the pinned hash, so a changed pin
        │                 └── <file>.gguf.verified   never reuses a stale file; size+mtime stamp
        ├── downloads/<sha256[:16]>/<file>           verified archives (server, libstdc++ shim)
        ├── build/                                   `localllm fetch server --from-source`
        │   ├── sdist/llama_cpp_python-0.3.36.tar.gz
        │   └── llama-cpp-python-0.3.36/
        │       ├── llama_cpp_python-0.3.36/         the extracted sdist (vendor/llama.cpp)
        │       ├── cmake-build/                     incremental cmake tree (bin/llama-server)
        │       └── build.log                        every configure/build run, appended
        ├── probes/<build sha256>.json               what a server build answered (--help flags, the
        │                                            grammar canary's verdict): managed.probes
        └── locks/<kind>-<name>.lock                 one cross-process lock per artifact (localllm._lock)

    Transient names, removed on failure and by ``localllm cache prune``:
    ``.<file>.<pid>.<rand>.part`` beside a download, ``.staging-<name>-<rand>/`` and
    ``.old-<name>-<rand>/`` beside a release directory.
    """
    return CacheLayout(root if root is not None else settings.cache_dir())


def release_manifest(release_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(sha256 of each regular file, target of each symlink) in a release directory."""
    from localllm.managed.verify import sha256_file

    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for path in sorted(release_dir.iterdir()):
        if path.name == MARKER:
            continue
        if path.is_symlink():
            links[path.name] = os.readlink(path)
        elif path.is_file():
            files[path.name] = sha256_file(path)
    return files, links


def write_marker(release_dir: Path, info: dict[str, Any]) -> None:
    """Write the release marker (last step before the staging dir is renamed).

    Every file it lists is fsynced first: the marker, and the rename that follows it, vouch
    for a release whose bytes are on disk (extraction and copies only reach the page cache,
    and after a power cut a file renamed before its data is flushed can come back empty).
    The marker's own write fsyncs the directory, which makes the links and names durable.
    """
    files, links = release_manifest(release_dir)
    for name in files:
        fd = os.open(release_dir / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    data = {**info, "files": files, "links": links}
    atomic_write(release_dir / MARKER, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_marker(release_dir: Path) -> dict[str, Any] | None:
    """The marker of an installed release, ``None`` when absent or unreadable."""
    try:
        data = json.loads((release_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def installed(release_dir: Path) -> bool:
    """A release dir counts as installed when its marker and binary are present."""
    return read_marker(release_dir) is not None and (release_dir / SERVER_BINARY).is_file()


def release_changed(release_dir: Path) -> bool:
    """Whether a release's files or links differ from its marker's manifest (re-hashed)."""
    marker = read_marker(release_dir) or {}
    files, links = release_manifest(release_dir)
    return (files, links) != (marker.get("files"), marker.get("links"))
