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
  unlinked in ``finally`` on every other path, so the cache never holds unverified bytes;
* a cut connection resumes with ``Range: bytes=<offset>-``; a server that answers 200
  instead of 206 restarts from zero (the hash restarts with it); transient failures are
  retried with exponential backoff, bounded by consecutive attempts without progress.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, unquote, urlparse

import httpx

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

CHUNK = 1 << 20
# Room left on the disk beyond the download itself, so a fetch never fills it to the brim.
SPACE_MARGIN = 16 << 20
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT = httpx.Timeout(connect=15.0, read=60.0, write=30.0, pool=15.0)
LOCK_TIMEOUT = 6 * 3600.0
MAX_ATTEMPTS = 100

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


@dataclass(frozen=True)
class Source:
    """Where to try a file: a local path or an http(s) URL."""

    location: str
    is_local: bool
    mirror: bool


def mirror_sources(artifact: Artifact, mirrors: Sequence[str], *, offline: bool) -> list[Source]:
    """Mirror candidates for ``artifact`` (directories, file:// or http(s) base URLs)."""
    out: list[Source] = []
    for mirror in mirrors:
        parsed = urlparse(mirror)
        if parsed.scheme in ("http", "https"):
            if not offline:
                out.append(Source(mirror.rstrip("/") + "/" + quote(artifact.file), False, True))
        elif parsed.scheme == "file":
            out.append(Source(str(Path(unquote(parsed.path)) / artifact.file), True, True))
        else:
            out.append(Source(str(Path(mirror).expanduser() / artifact.file), True, True))
    return out


def sources_for(artifact: Artifact, mirrors: Sequence[str], *, offline: bool) -> list[Source]:
    """Every source in the order tried: mirrors, then the pinned URL (never when offline)."""
    out = mirror_sources(artifact, mirrors, offline=offline)
    if artifact.url and not offline:
        out.append(Source(artifact.url, False, False))
    return out


@contextmanager
def artifact_lock(lock_path: Path, name: str, log: Log, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the cross-process lock of one artifact, saying so when another process has it."""
    import filelock

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        log(f"waiting for lock on {name} (another process is fetching it): {lock_path}")
        try:
            lock.acquire(timeout=timeout)
        except filelock.Timeout as exc:
            raise DownloadFailed(
                f"gave up waiting {timeout:.0f}s for the lock on {name}: {lock_path}"
            ) from exc
    try:
        yield
    finally:
        lock.release()


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
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    progress: bool | None = None,
    log: Log = _stderr,
    transport: httpx.BaseTransport | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Make ``dest`` a verified copy of ``artifact`` and return it.

    ``cancel``, set from another thread, stops the copy or download at the next block
    with ``DownloadCancelled``; its temp file is removed as on every failure.

    ``retries`` bounds consecutive failed attempts without progress; ``progress`` forces
    the tqdm bar on or off (default: only when stderr is a TTY). ``prewarm`` is the command
    named when ``offline`` and nothing is cached.
    """
    sha = artifact.require_sha256()
    if verify.stamp_matches(dest, sha) and dest.is_file():
        return dest
    with artifact_lock(lock_path, artifact.name, log):
        # Another process may have finished it while we waited; a full hash decides.
        if verify.is_verified(dest, sha):
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        sources = sources_for(artifact, mirrors, offline=offline)
        return _from_sources(
            artifact, dest, sha, sources,
            offline=offline, prewarm=prewarm, retries=retries, backoff=backoff,
            timeout=timeout, progress=progress, log=log, transport=transport, cancel=cancel,
        )


def _from_sources(
    artifact: Artifact,
    dest: Path,
    sha: str,
    sources: Sequence[Source],
    *,
    offline: bool,
    prewarm: str,
    retries: int,
    backoff: float,
    timeout: httpx.Timeout,
    progress: bool | None,
    log: Log,
    transport: httpx.BaseTransport | None,
    cancel: threading.Event | None,
) -> Path:
    last: FetchError | None = None
    client: httpx.Client | None = None
    tried: list[str] = []
    try:
        for source in sources:
            if source.is_local:
                if not Path(source.location).is_file():
                    tried.append(f"{source.location} (not there)")
                    continue
                try:
                    _copy_verified(Path(source.location), dest, sha=sha, artifact=artifact, log=log,
                                   progress=progress, cancel=cancel)
                    return dest
                except DownloadCancelled:
                    raise
                except FetchError as exc:
                    last = exc
                    tried.append(f"{source.location} ({exc})")
                    log(f"mirror {source.location} failed: {exc}")
                    continue
            if client is None:
                client = httpx.Client(follow_redirects=True, timeout=timeout, transport=transport)
            try:
                _download(
                    client, source.location, dest, sha, artifact,
                    retries=retries, backoff=backoff, progress=progress, log=log, cancel=cancel,
                )
                return dest
            except DownloadCancelled:
                raise
            except FetchError as exc:
                last = exc
                tried.append(f"{source.location} ({exc})")
                if source.mirror:
                    log(f"mirror {source.location} failed: {exc}; trying the next source")
    finally:
        if client is not None:
            client.close()
    if last is not None and len(tried) == 1:
        raise last
    where = "; ".join(tried) if tried else "no mirror configured"
    if offline:
        missing = OfflineArtifactMissing(
            f"{artifact.name} ({artifact.file}) is not cached and LOCALLLM_OFFLINE=1 forbids "
            f"downloading it; tried: {where}"
        )
        missing.hint = (
            f"pre-warm the cache with `{prewarm}` on a connected machine"
            if prewarm else "pre-warm the cache on a connected machine"
        ) + f", or put {artifact.file} in a directory listed in LOCALLLM_MIRROR"
        raise missing
    if not artifact.url and last is None:
        no_url = DownloadFailed(
            f"{artifact.name} has no download URL (mirror only) and no mirror has "
            f"{artifact.file}; tried: {where}"
        )
        no_url.hint = f"put {artifact.file} in a directory and pass --mirror DIR or set LOCALLLM_MIRROR"
        raise no_url
    if isinstance(last, ChecksumMismatch) and len(tried) == 1:
        raise last
    raise DownloadFailed(f"could not fetch {artifact.name} ({artifact.file}); tried: {where}") from last


def _check_space(directory: Path, needed: int | None, what: str) -> None:
    if needed is None:
        return
    free = shutil.disk_usage(directory).free
    if free < needed + SPACE_MARGIN:
        raise InsufficientSpace(
            f"not enough free space in {directory} for {what}: need {human_size(needed)} "
            f"(+{human_size(SPACE_MARGIN)} margin), have {human_size(free)}"
        )


def _tmp_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part"


def _commit(tmp: Path, fh: IO[bytes], dest: Path, *, sha: str, actual: str, origin: str) -> None:
    """fsync, compare, rename: the only way bytes enter the cache."""
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    if actual != sha:
        raise ChecksumMismatch(expected=sha, actual=actual, path=str(dest), url=origin)
    os.replace(tmp, dest)
    verify.fsync_dir(dest.parent)
    verify.write_stamp(dest, sha)


def _bar(total: int | None, name: str, progress: bool | None, initial: int = 0) -> Any:
    enabled = sys.stderr.isatty() if progress is None else progress
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
                desc=name, file=sys.stderr, leave=False)


def _check_cancel(cancel: threading.Event | None, artifact: Artifact) -> None:
    if cancel is not None and cancel.is_set():
        raise DownloadCancelled(f"download of {artifact.name} ({artifact.file}) cancelled")


def _copy_verified(
    src: Path, dest: Path, *, sha: str, artifact: Artifact, log: Log, progress: bool | None,
    cancel: threading.Event | None,
) -> None:
    size = src.stat().st_size
    _check_space(dest.parent, size, artifact.name)
    log(f"downloading {artifact.name} ({human_size(size)}) from {src}")
    tmp = _tmp_path(dest)
    bar = _bar(size, artifact.file, progress)
    try:
        digest = hashlib.sha256()
        with src.open("rb") as inp, tmp.open("wb") as out:
            while block := inp.read(CHUNK):
                _check_cancel(cancel, artifact)
                digest.update(block)
                out.write(block)
                if bar is not None:
                    bar.update(len(block))
            _commit(tmp, out, dest, sha=sha, actual=digest.hexdigest(), origin=str(src))
    except OSError as exc:
        if isinstance(exc, FetchError):
            raise
        raise DownloadFailed(f"cannot copy {src}: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()
        tmp.unlink(missing_ok=True)


class _Retry(Exception):
    """A transient failure of one attempt (HTTP status or short body)."""


class _Restart(_Retry):
    """The partial file cannot be resumed; the next attempt starts from zero."""


def _download(
    client: httpx.Client,
    url: str,
    dest: Path,
    sha: str,
    artifact: Artifact,
    *,
    retries: int,
    backoff: float,
    progress: bool | None,
    log: Log,
    cancel: threading.Event | None,
) -> None:
    tmp = _tmp_path(dest)
    bar: Any = None
    try:
        with tmp.open("wb") as fh:
            digest = hashlib.sha256()
            offset = 0
            failures = 0
            announced = False
            for _attempt in range(MAX_ATTEMPTS):
                _check_cancel(cancel, artifact)
                start = offset
                headers = {"Accept-Encoding": "identity"}
                if offset:
                    headers["Range"] = f"bytes={offset}-"
                try:
                    with client.stream("GET", url, headers=headers) as resp:
                        status = resp.status_code
                        if status in TRANSIENT_STATUS:
                            raise _Retry(f"HTTP {status}")
                        if status == 416 and offset:
                            # Our offset is past what the server has: start over.
                            raise _Restart("HTTP 416 for the resume offset")
                        if status >= 400:
                            raise DownloadFailed(f"HTTP {status} from {url}")
                        if offset and status == 206 and not _range_starts_at(resp, offset):
                            raise _Retry("Content-Range does not start at the resume offset")
                        if offset and status != 206:
                            # Server ignored Range: the body is the whole file again.
                            log(f"{url} ignored the Range request; restarting {artifact.file} from zero")
                            fh.seek(0)
                            fh.truncate()
                            digest = hashlib.sha256()
                            offset = start = 0
                            if bar is not None:
                                bar.reset()
                        length = _content_length(resp)
                        total = offset + length if length is not None else artifact.size
                        if not announced:
                            _check_space(dest.parent, None if total is None else total - offset,
                                         artifact.name)
                            log(f"downloading {artifact.name} ({human_size(total)}) from {url}")
                            bar = _bar(total, artifact.file, progress, initial=offset)
                            announced = True
                        # No chunk_size: httpx would buffer up to it and lose the partial
                        # block when the connection drops, so resume would start short.
                        for block in resp.iter_raw():
                            _check_cancel(cancel, artifact)
                            fh.write(block)
                            digest.update(block)
                            offset += len(block)
                            if bar is not None:
                                bar.update(len(block))
                        if length is not None and offset != total:
                            raise _Retry(f"short body: {offset} of {total} bytes")
                    break
                except (httpx.TransportError, _Retry) as exc:
                    if isinstance(exc, _Restart):
                        fh.seek(0)
                        fh.truncate()
                        digest = hashlib.sha256()
                        offset = 0
                    failures = 0 if offset > start else failures + 1
                    if failures > retries:
                        raise DownloadFailed(
                            f"download of {artifact.file} from {url} failed after {failures} "
                            f"attempts without progress: {_describe(exc)}"
                        ) from exc
                    delay = min(backoff * (2 ** max(failures - 1, 0)), 30.0)
                    log(f"{artifact.file}: {_describe(exc)}; retrying from byte {offset} in {delay:.1f}s")
                    time.sleep(delay)
            else:
                raise DownloadFailed(f"download of {artifact.file} from {url}: too many attempts")
            _commit(tmp, fh, dest, sha=sha, actual=digest.hexdigest(), origin=url)
    except OSError as exc:
        if isinstance(exc, FetchError):
            raise
        raise DownloadFailed(f"cannot write {tmp}: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()
        tmp.unlink(missing_ok=True)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, httpx.TransportError) else text


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
