"""What is in the cache, checked against the pins: ``cache list``, ``verify`` and ``prune``.

Every entry is *referenced* (the current pins point at it) or *stale* (an old release, a
model whose pin changed, an unknown file). ``verify`` re-hashes every file in full and
re-fetches a corrupted referenced one (a release is re-installed from its cached archive
or build tree); ``prune`` removes stale entries and leftovers of interrupted runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from localllm._lock import hold, store_lock_path
from localllm.errors import ArtifactLocked, FetchError, StoreUnavailable
from localllm.managed import platforms, verify
from localllm.managed.cache import CacheLayout, installed, read_marker, release_manifest
from localllm.managed.pins import Artifact, Pins

# A temp file or staging dir untouched this long belongs to no running fetch
# (an active download rewrites its .part file continuously).
TEMP_GRACE_SECONDS = 15 * 60

Log = Callable[[str], None]


@dataclass(frozen=True)
class Entry:
    """One cache entry: ``kind`` release/model/download/sdist/build/temp, and its state."""

    kind: str
    name: str
    path: Path
    size: int
    status: str
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "status": self.status,
            "detail": self.detail,
        }


def _size(path: Path) -> int:
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = Path(root, name)
            if not p.is_symlink():
                with contextlib.suppress(OSError):
                    total += p.stat().st_size
    return total


def _is_temp(name: str) -> bool:
    return name.endswith((".part", ".tmp", ".resume.part.json")) or name.startswith(
        (".staging-", ".old-", ".pip-download-", ".pypi-")
    )


def _children(path: Path) -> list[Path]:
    # A symlinked directory is never walked: its files are not the cache's to list or remove.
    return sorted(path.iterdir()) if path.is_dir() and not path.is_symlink() else []


def _inside(layout: CacheLayout, path: Path) -> bool:
    """Whether removing ``path`` (a link itself, not its target) stays under the cache root."""
    try:
        return path.parent.resolve().is_relative_to(layout.root.resolve())
    except (OSError, RuntimeError):
        return False


def _remove(layout: CacheLayout, path: Path) -> None:
    if not _inside(layout, path):
        raise FetchError(
            f"refusing to remove {path}: it resolves outside the cache {layout.root}",
            hint="a symlink inside the cache points elsewhere; remove it by hand",
        )
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
        verify.stamp_path(path).unlink(missing_ok=True)


def _referenced_releases(pins: Pins) -> tuple[str, ...]:
    return (f"llama-{pins.release}-", f"llama-source-{pins.source.version}-")


def _download_artifacts(pins: Pins) -> list[Artifact]:
    return [*pins.prebuilt.values(), *(s.artifact for s in pins.shims.values())]


#: the detail of a cache entry where a file belongs but something else (a directory, a FIFO) is
NOT_REGULAR = "not a regular file"


def _file_status(path: Path, sha: str | None) -> str:
    if not path.is_file():
        return "corrupt"
    if sha is None:
        return "stale"
    return "ok" if verify.stamp_matches(path, sha) else "unverified"


def _detail(path: Path, detail: str) -> str:
    return detail if path.is_file() else NOT_REGULAR


def list_cache(layout: CacheLayout, pins: Pins) -> list[Entry]:
    """Every entry of the cache (no hashing: stamps decide ok/unverified)."""
    return list(_walk(layout, pins))


def _walk(layout: CacheLayout, pins: Pins) -> Iterator[Entry]:
    for path in _children(layout.bin_dir):
        if _is_temp(path.name):
            yield Entry("temp", path.name, path, _size(path), "temp")
            continue
        marker = read_marker(path)
        if marker is None:
            status = "incomplete"
        else:
            status = "ok" if path.name.startswith(_referenced_releases(pins)) else "stale"
        detail = str(marker.get("version", "")) if marker else "no release marker"
        yield Entry("release", path.name, path, _size(path), status, detail)
    for model_dir in _children(layout.models_dir):
        pin = pins.models.get(model_dir.name)
        for key_dir in _children(model_dir):
            for path in _children(key_dir):
                if path.name.endswith(verify.STAMP_SUFFIX):
                    continue
                name = f"{model_dir.name}/{key_dir.name}/{path.name}"
                if _is_temp(path.name):
                    yield Entry("temp", name, path, _size(path), "temp")
                    continue
                sha = pin.artifact.sha256 if pin else None
                current = bool(sha and sha[:16] == key_dir.name and path.name == pin.artifact.file) if pin else False
                status = _file_status(path, sha if current else None)
                yield Entry("model", model_dir.name, path, _size(path), status, _detail(path, name))
    wanted = {(a.sha256[:16], a.file): a for a in _download_artifacts(pins) if a.sha256}
    for key_dir in _children(layout.downloads_dir):
        for path in _children(key_dir):
            if path.name.endswith(verify.STAMP_SUFFIX):
                continue
            if _is_temp(path.name):
                yield Entry("temp", path.name, path, _size(path), "temp")
                continue
            art = wanted.get((key_dir.name, path.name))
            status = _file_status(path, art.sha256 if art else None)
            yield Entry("download", path.name, path, _size(path), status, _detail(path, art.name if art else ""))
    # Once the source build is installed, its sdist and cmake tree only speed up a rebuild
    # of the same pin: leftovers (hundreds of MiB) that `cache prune` clears.
    built = installed(layout.source_release_dir(pins.source.version, platforms.current().slug))
    sdist_dir = layout.build_dir / "sdist"
    for path in _children(sdist_dir):
        if path.name.endswith(verify.STAMP_SUFFIX):
            continue
        if _is_temp(path.name):
            yield Entry("temp", path.name, path, _size(path), "temp")
            continue
        current = path.name == pins.source.artifact.file
        status = _file_status(path, pins.source.artifact.sha256 if current else None)
        if built and status in ("ok", "unverified"):
            status = "leftover"
        yield Entry("sdist", path.name, path, _size(path), status, _detail(path, ""))
    for path in _children(layout.build_dir):
        if path.name == "sdist":
            continue
        current = path == layout.source_tree(pins.source)
        status = ("leftover" if built else "ok") if current else "stale"
        yield Entry("build", path.name, path, _size(path), status, "cmake tree + build.log")
    yield from _stores(layout)


#: files an SQLite embedding store keeps beside itself (counted with it, removed with it;
#: its lock file is counted but stays: see :func:`localllm._lock.hold`)
_STORE_SIDES = ("-journal", "-wal", "-shm", ".lock", ".corrupt")
#: how long ``cache rm`` waits for an indexer holding an embedding store's lock
STORE_RM_WAIT = 30.0
#: how long ``cache rm`` waits for a fetch holding a model's lock
MODEL_RM_WAIT = 30.0


def _stores(layout: CacheLayout) -> Iterator[Entry]:
    """The embedding stores under ``<cache>/embed`` (one SQLite file per model and settings)."""
    for path in _children(layout.root / "embed"):
        if not path.name.endswith(".sqlite"):
            continue
        sides = [path.with_name(path.name + s) for s in _STORE_SIDES]
        size = _size(path) + sum(_size(p) for p in sides if p.exists())
        yield Entry("store", path.name, path, size, "ok", "embedding store (rebuilt on demand)")


def remove_entries(
    layout: CacheLayout,
    pins: Pins,
    name: str,
    *,
    store_wait: float | None = None,
    model_wait: float | None = None,
    log: Log | None = None,
) -> list[Entry]:
    """Remove a cached model (every file under ``models/<id>/``) or an embedding store by
    its file name; :class:`FetchError` listing what can be removed when nothing matches.

    A store is removed holding its lock, the one its writers hold for each
    look-up-embed-insert step, so an indexer's transaction is never cut in half: ``cache rm``
    waits up to ``store_wait`` seconds (default :data:`STORE_RM_WAIT`; saying so through ``log``), then raises
    :class:`StoreUnavailable` (``reason="locked"``) having removed nothing of that store.

    A model is removed holding the lock its fetch holds (:meth:`CacheLayout.model_lock_path`,
    one per ``models/<id>/<key>/``), so a download or re-verification under way in another
    process finishes first: ``cache rm`` waits up to ``model_wait`` seconds (default
    :data:`MODEL_RM_WAIT`; saying so through ``log``) for every lock of the model, then raises
    :class:`ArtifactLocked` having removed nothing of it."""
    entries = list_cache(layout, pins)
    found = [e for e in entries if (e.kind == "model" and e.name == name) or (e.kind == "store" and e.name == name)]
    if not found:
        names = sorted({e.name for e in entries if e.kind in ("model", "store")})
        raise FetchError(
            f"nothing cached named {name!r}",
            hint=f"cached: {', '.join(names)}" if names else "the cache holds no models or stores",
        )
    models = [e for e in found if e.kind == "model"]
    locks: dict[Path, Entry] = {}
    for entry in models:
        lock = _artifact_lock(layout, entry.path)
        if lock is not None:
            locks.setdefault(lock, entry)
    with contextlib.ExitStack() as held:
        # every lock first (in one order, so two removals never hold one each): all or nothing
        for lock in sorted(locks):
            wait = MODEL_RM_WAIT if model_wait is None else model_wait
            held.enter_context(_hold_artifact(lock, locks[lock], wait, log))
        for entry in models:
            _remove(layout, entry.path)
    for entry in found:
        if entry.kind == "store":
            _remove_store(layout, entry.path, STORE_RM_WAIT if store_wait is None else store_wait, log)
    _remove_empty_dirs(layout, downloads=False)
    return [Entry(e.kind, e.name, e.path, e.size, "removed", e.detail) for e in found]


def _artifact_lock(layout: CacheLayout, path: Path) -> Path | None:
    """The lock a fetch holds while it writes ``path`` (a file or temp file of
    ``models/<id>/<key>/`` or ``downloads/<key>/``); ``None`` elsewhere."""
    key_dir = path.parent
    if key_dir.parent.parent == layout.models_dir:
        return layout.model_lock_path(key_dir.parent.name, key_dir.name)
    if key_dir.parent == layout.downloads_dir:
        return layout.download_lock_path(key_dir.name)
    return None


def _hold_artifact(lock: Path, entry: Entry, wait: float, log: Log | None) -> contextlib.AbstractContextManager[None]:
    """Hold ``entry``'s fetch lock, waiting up to ``wait`` seconds; :class:`ArtifactLocked` after."""
    what = f"{entry.kind} {entry.name}"

    def gave_up(waited: float) -> ArtifactLocked:
        return ArtifactLocked(
            f"{what} is being fetched: another localllm process held its lock {lock} for {waited:.0f}s; "
            f"{entry.path} was not removed",
            name=entry.name,
            path=str(entry.path),
            lock=str(lock),
            waited=waited,
            hint="run the command again when the fetch is done",
        )

    def unusable(exc: OSError) -> FetchError:
        return FetchError(
            f"cannot lock {what} ({lock}: {exc.strerror or exc}); {entry.path} was not removed",
            hint="make the cache directory writable",
        )

    waiting = None if log is None else (lambda: log(f"waiting for {lock} (another process is fetching {what})"))
    return hold(lock, timeout=wait, gave_up=gave_up, waiting=waiting, unusable=unusable)


def _remove_store(layout: CacheLayout, db: Path, wait: float, log: Log | None) -> None:
    lock = store_lock_path(db)

    def gave_up(waited: float) -> StoreUnavailable:
        return StoreUnavailable(
            f"embedding store {db} is in use: another localllm process held its lock {lock} "
            f"for {waited:.0f}s; nothing was removed",
            path=str(db),
            reason="locked",
            hint=f"run `localllm cache rm {db.name}` again when the indexing is done",
        )

    def unusable(exc: OSError) -> StoreUnavailable:
        return StoreUnavailable(
            f"cannot lock embedding store {db} ({lock}: {exc.strerror or exc}); nothing was removed",
            path=str(db),
            reason="cannot open",
            hint="make the cache directory writable",
        )

    waiting = None if log is None else (lambda: log(f"waiting for {lock} (another process is indexing {db.name})"))
    with hold(lock, timeout=wait, gave_up=gave_up, waiting=waiting, unusable=unusable):
        for target in [db, *(db.with_name(db.name + s) for s in _STORE_SIDES if s != ".lock")]:
            _remove(layout, target)


def model_rows(layout: CacheLayout, pins: Pins) -> list[dict[str, object]]:
    """One row per pinned model: id, role, file, where its pin lives, cached or not, size."""
    cached = {e.name: e for e in list_cache(layout, pins) if e.kind == "model" and e.status != "stale"}
    rows: list[dict[str, object]] = []
    for mid, pin in sorted(pins.models.items()):
        entry = cached.get(mid)
        rows.append(
            {
                "id": mid,
                "role": pin.role,
                "file": pin.artifact.file,
                "pinned": "user" if pins.user_path is not None and pin.pins_file == pins.user_path else "shipped",
                "downloadable": bool(pin.artifact.sha256 and (pin.artifact.url or pin.artifact.packages)),
                # how it arrives without a mirror: url, pypi (wheels on the package index),
                # mirror-only, or unpinned (no sha256: never fetched)
                "source": pin.artifact.kind if pin.artifact.sha256 else "unpinned",
                "cached": entry is not None,
                "status": entry.status if entry else None,
                "size": entry.size if entry else pin.artifact.size,
                "path": str(entry.path) if entry else None,
            }
        )
    return rows


def verify_cache(
    layout: CacheLayout,
    pins: Pins,
    *,
    refetch: bool,
    mirrors: Sequence[str],
    log: Log,
) -> list[Entry]:
    """Re-hash everything; re-fetch corrupted referenced files when ``refetch``."""
    out: list[Entry] = []
    for entry in list_cache(layout, pins):
        if entry.kind in ("temp", "build", "store"):  # a store checks itself when opened
            continue
        if entry.kind == "release":
            out.append(_verify_release(entry, layout, pins, refetch=refetch, mirrors=mirrors, log=log))
        else:
            out.append(_verify_file(entry, layout, pins, refetch=refetch, mirrors=mirrors, log=log))
    return out


def _expected_sha(entry: Entry, pins: Pins) -> str | None:
    if entry.kind == "model":
        pin = pins.models.get(entry.name)
        return pin.artifact.sha256 if pin else None
    if entry.kind == "sdist":
        return pins.source.artifact.sha256
    for art in _download_artifacts(pins):
        if art.sha256 and art.file == entry.path.name and art.sha256[:16] == entry.path.parent.name:
            return art.sha256
    return None


def _verify_file(
    entry: Entry, layout: CacheLayout, pins: Pins, *, refetch: bool, mirrors: Sequence[str], log: Log
) -> Entry:
    if entry.detail == NOT_REGULAR:  # a directory or FIFO is never hashed, replaced or removed here
        log(f"corrupt: {entry.path}: {NOT_REGULAR}")
        return entry
    if entry.status == "stale":
        # Keyed by a hash prefix: a stale file can still be checked against its own key.
        actual = verify.sha256_file(entry.path)
        key = entry.path.parent.name
        ok = entry.kind in ("model", "download") and actual.startswith(key)
        return Entry(
            entry.kind,
            entry.name,
            entry.path,
            entry.size,
            "stale" if ok else "corrupt",
            "not referenced by the pins; `localllm cache prune` removes it",
        )
    sha = _expected_sha(entry, pins)
    assert sha is not None
    # taken before the hash: the re-fetch removes the copy only if it is still this file
    seen = entry.path.lstat()
    if verify.is_verified(entry.path, sha, full=True):
        return Entry(entry.kind, entry.name, entry.path, entry.size, "ok", "sha256 matches the pin")
    actual = verify.sha256_file(entry.path)
    detail = f"sha256 {actual}, pin {sha}"
    log(f"corrupt: {entry.path}: {detail}")
    if not refetch:
        return Entry(entry.kind, entry.name, entry.path, entry.size, "corrupt", detail)
    try:
        # The copy is removed by the fetch, under the artifact's lock: a fetch of it in
        # another process may be writing it, or may have replaced it since it was hashed.
        _refetch_file(entry, layout, pins, seen, mirrors=mirrors, log=log)
    except FetchError as exc:
        kept = entry.path.exists()
        removed = "" if kept else "removed, "
        size = _size(entry.path) if kept else 0
        return Entry(entry.kind, entry.name, entry.path, size, "corrupt", f"{detail}; {removed}re-fetch failed: {exc}")
    return Entry(entry.kind, entry.name, entry.path, entry.path.stat().st_size, "refetched", detail)


def _refetch_file(
    entry: Entry, layout: CacheLayout, pins: Pins, seen: os.stat_result, *, mirrors: Sequence[str], log: Log
) -> None:
    from localllm import settings
    from localllm.managed.fetch import fetch_artifact
    from localllm.managed.source_build import acquire_sdist

    if entry.kind == "model":
        pin = pins.model(entry.name)
        sha = pin.artifact.require_sha256()
        fetch_artifact(
            pin.artifact,
            layout.model_path(pin),
            lock_path=layout.model_lock_path(pin.id, sha[:16]),
            mirrors=mirrors,
            offline=settings.offline(),
            prewarm=f"localllm fetch model {pin.id}",
            log=log,
            corrupt=seen,
        )
        return
    if entry.kind == "sdist":
        acquire_sdist(pins.source, layout=layout, mirrors=mirrors, offline=settings.offline(), log=log, corrupt=seen)
        return
    for art in _download_artifacts(pins):
        if art.sha256 and layout.download_path(art) == entry.path:
            fetch_artifact(
                art,
                entry.path,
                lock_path=layout.download_lock_path(art.sha256[:16]),
                mirrors=mirrors,
                offline=settings.offline(),
                prewarm="localllm fetch server",
                log=log,
                corrupt=seen,
            )
            return


def _verify_release(
    entry: Entry, layout: CacheLayout, pins: Pins, *, refetch: bool, mirrors: Sequence[str], log: Log
) -> Entry:
    marker = read_marker(entry.path)
    if marker is None:
        return Entry(
            "release",
            entry.name,
            entry.path,
            entry.size,
            "corrupt",
            "no release marker (interrupted install?); `localllm cache prune` removes it",
        )
    want_files, want_links = marker.get("files"), marker.get("links")
    if not isinstance(want_files, dict) or not isinstance(want_links, dict):
        detail = "the release marker has no files/links manifest (edited by hand?)"
        log(f"corrupt: {entry.path}: {detail}")
        return Entry("release", entry.name, entry.path, entry.size, "corrupt", detail)
    files, links = release_manifest(entry.path)
    bad = sorted(
        {n for n in set(files) | set(want_files) if files.get(n) != want_files.get(n)}
        | {n for n in set(links) | set(want_links) if links.get(n) != want_links.get(n)}
    )
    if not bad:
        return Entry(
            "release",
            entry.name,
            entry.path,
            entry.size,
            entry.status,
            f"{len(files)} files match the release manifest",
        )
    detail = f"changed since install: {', '.join(bad)}"
    log(f"corrupt: {entry.path}: {detail}")
    if not refetch or entry.status == "stale":
        return Entry("release", entry.name, entry.path, entry.size, "corrupt", detail)
    try:
        # The installer checks again and replaces the release under its own lock, in one
        # rename: an install (or another verify) in another process may be under way.
        _reinstall(marker, layout, pins, mirrors=mirrors, log=log)
    except FetchError as exc:
        return Entry("release", entry.name, entry.path, entry.size, "corrupt", f"{detail}; re-install failed: {exc}")
    return Entry("release", entry.name, entry.path, _size(entry.path), "refetched", detail)


def _reinstall(marker: dict[str, object], layout: CacheLayout, pins: Pins, *, mirrors: Sequence[str], log: Log) -> None:
    from localllm import settings
    from localllm.managed import platforms
    from localllm.managed.release import install_prebuilt
    from localllm.managed.source_build import build_from_source

    if marker.get("kind") == "source":
        build_from_source(pins=pins, layout=layout, mirrors=mirrors, offline=settings.offline(), log=log, repair=True)
    else:
        install_prebuilt(
            pins.server_for(platforms.current().key),
            pins=pins,
            layout=layout,
            mirrors=mirrors,
            offline=settings.offline(),
            repair=True,
        )


def prune_cache(layout: CacheLayout, pins: Pins, *, dry_run: bool, now: float | None = None) -> list[Entry]:
    """Remove stale entries and old temp files; return what was (or would be) removed.

    A file of ``models/<id>/<key>/`` or ``downloads/<key>/`` (a stale model or archive, a
    partial download) is removed holding the lock its fetch holds, without waiting: one
    that another process is fetching right now (with other pins, it may be current there)
    is left, with the status ``in use``."""
    now = time.time() if now is None else now
    removed: list[Entry] = []
    for entry in list_cache(layout, pins):
        if entry.kind == "temp":
            try:
                age = now - entry.path.lstat().st_mtime
            except OSError:
                continue
            if age < TEMP_GRACE_SECONDS:
                continue
        elif entry.status not in ("stale", "incomplete", "leftover"):
            continue
        status = "would remove" if dry_run else "removed"
        if not dry_run:
            lock = _artifact_lock(layout, entry.path)
            try:
                with _hold_artifact(lock, entry, 0.0, None) if lock is not None else contextlib.nullcontext():
                    _remove(layout, entry.path)
            except ArtifactLocked:
                status = "in use"
        removed.append(Entry(entry.kind, entry.name, entry.path, entry.size, status, entry.detail))
    if not dry_run:
        _remove_empty_dirs(layout, downloads=True)
    return removed


class _InUse(Exception):
    """A key directory's lock is held (or cannot be taken): the sweep leaves the directory."""


def _remove_empty_dirs(layout: CacheLayout, *, downloads: bool) -> None:
    """Remove the empty directories under ``models/`` (and ``downloads/``), and the
    ``.verified`` stamps whose file is gone.

    A fetch makes its key directory (``models/<id>/<key>/``, ``downloads/<key>/``) holding
    the artifact's lock, and it stays empty until the download's first file lands; the
    stamp is written after the file, under that lock too. So a key directory, its stamps
    and what is below it are swept only holding that lock, taken without waiting: a held
    lock means a fetch in flight, and its directory is left as it is (and, not empty, so is
    ``models/<id>/`` above it). ``models/<id>/`` has no lock of its own (every key of the
    model shares it) and is removed whenever it is empty; a fetch that loses it between
    making it and making its key directory in it makes both again
    (:func:`localllm.managed.fetch.fetch_artifact`).
    """
    for model_dir in _subdirs(layout.models_dir):
        for key_dir in _subdirs(model_dir):
            _sweep_key_dir(key_dir, layout.model_lock_path(model_dir.name, key_dir.name))
        _remove_if_empty(model_dir)
    if downloads:
        for key_dir in _subdirs(layout.downloads_dir):
            _sweep_key_dir(key_dir, layout.download_lock_path(key_dir.name))


def _sweep_key_dir(key_dir: Path, lock: Path) -> None:
    """Sweep ``key_dir`` holding its fetch lock ``lock``, or leave it when someone holds it."""
    try:
        with hold(lock, timeout=0.0, gave_up=_InUse, unusable=_InUse):
            for dirpath, _dirs, _files in sorted(os.walk(key_dir), key=lambda t: -len(t[0])):
                _remove_if_empty(Path(dirpath))
    except _InUse:
        pass  # a fetch in flight (or a lock that cannot be taken): the directory stays as it is


def _subdirs(path: Path) -> list[Path]:
    return [p for p in _children(path) if p.is_dir() and not p.is_symlink()]


def _remove_if_empty(directory: Path) -> None:
    """Remove ``directory`` if it is empty once its stamps whose file is gone are."""
    for stamp in directory.glob("*" + verify.STAMP_SUFFIX):
        if not stamp.with_name(stamp.name[: -len(verify.STAMP_SUFFIX)]).exists():
            stamp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()
