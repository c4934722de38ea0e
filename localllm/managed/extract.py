"""Safe extraction of release archives (``.tar.gz``, ``.tar.bz2``, ``.zip``).

Names from an archive never become paths unchecked. Every member is validated before
anything is written, and the whole archive is refused, naming the member, when one is:
an absolute path or drive, a path with a ``..`` component, a path below a member that is
a link or a file, a symlink whose target is absolute or resolves outside the extraction
root, a hard link, a device, FIFO or socket. Symlink targets are resolved through the
links of the archive itself, as the kernel will resolve them after extraction, so a chain
(``d/up → ..``, ``e → d/up/..``) is refused where each link alone looks harmless.
Regular files, directories and inside-pointing symlinks (``libllama.so → libllama.so.0``)
are extracted as themselves; a zip member without file-type bits (``zipfile.writestr``)
is a regular file.

Writes never go through a link: links are created after every file and directory, files
are opened ``O_EXCL | O_NOFOLLOW``, and each parent is checked to be a real directory.

Sizes are capped before decompression and counted while copying: the members may add up
to ``max_bytes`` (default :func:`default_max_bytes`: 20× the archive, at least 64 MiB),
a zip member may not expand more than :data:`MAX_RATIO` times, and an archive may hold at
most :data:`MAX_MEMBERS` entries. Past a cap, :class:`~localllm.errors.ArchiveTooLarge`
names the member; tar headers are read one at a time, so a bomb fails at its first
oversized header without decompressing the rest, and the decompressed tar stream itself
is bounded (the members' cap plus header slack), so a huge PAX or GNU long-name record
fails before tarfile reads it into memory. A name or link target with a NUL byte and an
encrypted zip member are refused; data a decompressor cannot decode is a corrupt archive
(:class:`~localllm.errors.FetchError`), never a library's own exception.

Extraction goes into a staging directory that the caller renames into place
(:func:`staging_dir`, :func:`install_dir`), so a release directory either exists whole
or not at all. ``flatten`` strips the directory prefix every member shares
(``llama-b9444/`` or ``build/bin/``), giving the flat upstream layout.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import re
import secrets
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from localllm.errors import ArchiveTooLarge, FetchError, UnsafeArchive

_DRIVE = re.compile(r"^[A-Za-z]:")
_CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_ZIP_UNIX = 3  # ZipInfo.create_system of archives whose external_attr holds a st_mode
_MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)
# Bytes of tar headers, PAX/GNU long-name records and padding allowed past the members' sizes.
_TAR_SLACK = 16 << 20
_TAR_PER_MEMBER = 2048
# What a library raises for data it cannot decode (a broken deflate or xz stream, a zip
# compression method it lacks): the archive is corrupt, never a bug of ours.
_CORRUPT = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,  # zipfile's answer to a compression method it lacks (not a stub of ours)
)

MAX_RATIO = 200
"""A zip member of 1 MiB or more may expand at most this many times (deflate tops out near 1032)."""
MAX_MEMBERS = 100_000
"""Entries per archive (the llama.cpp sdist has about 3,900)."""
MIN_MAX_BYTES = 64 << 20
SIZE_MULTIPLE = 20

FILE, DIR, SYMLINK = "file", "dir", "symlink"


@dataclass(frozen=True)
class _Member:
    raw: str
    parts: tuple[str, ...]
    kind: str
    mode: int
    target: str | None
    opener: Callable[[], IO[bytes]] | None
    size: int = 0


class _Budget:
    """Counts entries and declared bytes against the caps, refusing at the first excess."""

    def __init__(self, archive: Path, max_bytes: int) -> None:
        self.archive = archive
        self.max_bytes = max_bytes
        self.total = 0
        self.count = 0

    def add(self, raw: str, size: int, compressed: int | None = None) -> None:
        self.count += 1
        if self.count > MAX_MEMBERS:
            raise _too_large(self.archive, raw, f"more than {MAX_MEMBERS} entries", size=self.count, limit=MAX_MEMBERS)
        self.total += size
        if self.total > self.max_bytes:
            raise _too_large(
                self.archive,
                raw,
                f"members add up to {self.total} bytes, past the {self.max_bytes}-byte cap",
                size=self.total,
                limit=self.max_bytes,
            )
        if compressed is not None and size >= 1 << 20 and size > MAX_RATIO * max(compressed, 1):
            raise _too_large(
                self.archive,
                raw,
                f"{compressed} compressed bytes expand to {size} (more than {MAX_RATIO}x)",
                size=size,
                limit=MAX_RATIO * max(compressed, 1),
            )


def _too_large(archive: Path, raw: str, why: str, *, size: int, limit: int, writing: bool = False) -> ArchiveTooLarge:
    done = "extraction stopped there" if writing else "nothing was extracted"
    return ArchiveTooLarge(
        f"{archive.name}: refusing member {raw!r}: {why}; {done}",
        member=raw,
        size=size,
        limit=limit,
        hint="the archive is not the pinned one, or pass a larger max_bytes if it really is",
    )


def default_max_bytes(archive: Path) -> int:
    """The extraction cap when the caller knows no better: 20× the archive, at least 64 MiB."""
    return max(SIZE_MULTIPLE * archive.stat().st_size, MIN_MAX_BYTES)


def archive_kind(path: Path) -> str:
    """``tar`` or ``zip`` from the file name (upstream has shipped both)."""
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".tar")):
        return "tar"
    if name.endswith(".zip"):
        return "zip"
    raise FetchError(f"{path}: unknown archive format (expected .tar.gz, .tar.bz2 or .zip)")


def _refuse(archive: Path, raw: str, why: str) -> UnsafeArchive:
    return UnsafeArchive(f"{archive.name}: refusing member {raw!r}: {why}; nothing was extracted")


def _parts(archive: Path, raw: str) -> tuple[str, ...]:
    if "\0" in raw:
        raise _refuse(archive, raw, "NUL byte in the name")
    name = raw.replace("\\", "/")
    if name.startswith("/") or _DRIVE.match(name):
        raise _refuse(archive, raw, "absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _refuse(archive, raw, "path contains '..'")
    return parts


class _Stream(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...
    def close(self) -> None: ...


class _Bounded:
    """The decompressed tar stream, refused past the members' declared sizes plus slack.

    tarfile reads a PAX or GNU long-name record whole, before the member it describes
    reaches the budget: without this bound a 2 MB ``.tar.gz`` makes it allocate gigabytes.
    """

    def __init__(self, stream: _Stream, archive: Path, budget: _Budget) -> None:
        self.stream = stream
        self.archive = archive
        self.budget = budget

    def _limit(self) -> int:
        return self.budget.max_bytes + _TAR_SLACK + _TAR_PER_MEMBER * self.budget.count

    def _check(self, end: int) -> None:
        if end > self._limit():
            raise _too_large(
                self.archive,
                "(tar headers)",
                f"the decompressed stream runs past {self._limit()} bytes",
                size=end,
                limit=self._limit(),
            )

    def read(self, size: int = -1) -> bytes:
        pos = self.stream.tell()
        self._check(pos + size if size >= 0 else pos + self._limit() + 1)
        return self.stream.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._check(offset)
        elif whence == os.SEEK_CUR:
            self._check(self.stream.tell() + offset)
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()


def _decompressed(raw: IO[bytes], magic: bytes) -> _Stream:
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


@contextmanager
def _open_tar(archive: Path, budget: _Budget) -> Iterator[tarfile.TarFile]:
    """``archive`` (plain, gzip, bzip2 or xz by its magic) read through :class:`_Bounded`."""
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(archive.open("rb"))
        magic = raw.read(6)
        raw.seek(0)
        stream = _decompressed(raw, magic)
        stack.callback(stream.close)
        bounded: Any = _Bounded(stream, archive, budget)
        yield stack.enter_context(tarfile.open(fileobj=bounded, mode="r:"))


def _tar_members(archive: Path, tf: tarfile.TarFile, budget: _Budget) -> list[_Member]:
    out: list[_Member] = []
    for info in tf:  # one header at a time: a bomb is refused before its data is inflated
        parts = _parts(archive, info.name)
        budget.add(info.name, info.size if info.isreg() else 0)
        if info.islnk():
            raise _refuse(archive, info.name, f"hard link to {info.linkname!r}")
        if info.issym():
            out.append(_Member(info.name, parts, SYMLINK, 0o777, info.linkname, None))
        elif info.isdir():
            out.append(_Member(info.name, parts, DIR, info.mode, None, None))
        elif info.isreg():
            out.append(_Member(info.name, parts, FILE, info.mode, None, _tar_opener(tf, info), info.size))
        else:
            raise _refuse(archive, info.name, "device, FIFO or other special file")
    return out


def _tar_opener(tf: tarfile.TarFile, info: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        fh = tf.extractfile(info)
        if fh is None:  # pragma: no cover - isreg() members always have data
            raise FetchError(f"cannot read member {info.name!r}")
        return fh

    return opener


def _zip_mode(info: zipfile.ZipInfo) -> int:
    """The st_mode a zip member declares; 0 when the archive was not made on Unix."""
    return info.external_attr >> 16 if info.create_system == _ZIP_UNIX else 0


def _zip_members(archive: Path, zf: zipfile.ZipFile, budget: _Budget) -> list[_Member]:
    out: list[_Member] = []
    for info in zf.infolist():
        parts = _parts(archive, info.filename)
        _refuse_encrypted(archive, info)
        mode = _zip_mode(info)
        kind = stat.S_IFMT(mode)
        if stat.S_ISLNK(mode):
            budget.add(info.filename, 0)
            if info.file_size > 4096:
                raise _refuse(archive, info.filename, f"symlink target of {info.file_size} bytes")
            target = zf.read(info).decode("utf-8", errors="replace")
            out.append(_Member(info.filename, parts, SYMLINK, 0o777, target, None))
        elif info.is_dir() or stat.S_ISDIR(mode):
            budget.add(info.filename, 0)
            out.append(_Member(info.filename, parts, DIR, mode & 0o777 or 0o755, None, None))
        elif kind and not stat.S_ISREG(mode):
            raise _refuse(archive, info.filename, "device, FIFO or other special file")
        else:  # S_IFREG, or permission bits only (zipfile.writestr): a regular file
            budget.add(info.filename, info.file_size, info.compress_size)
            out.append(
                _Member(info.filename, parts, FILE, mode & 0o777 or 0o644, None, _zip_opener(zf, info), info.file_size)
            )
    return out


def _refuse_encrypted(archive: Path, info: zipfile.ZipInfo) -> None:
    if info.flag_bits & 0x1:
        raise _refuse(archive, info.filename, "encrypted member (a release archive never is)")


def _zip_opener(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        return zf.open(info)

    return opener


def _common_prefix(members: list[_Member]) -> tuple[str, ...]:
    prefix: tuple[str, ...] | None = None
    for m in members:
        dirs = m.parts if m.kind == DIR else m.parts[:-1]
        if prefix is None:
            prefix = dirs
            continue
        n = 0
        while n < min(len(prefix), len(dirs)) and prefix[n] == dirs[n]:
            n += 1
        prefix = prefix[:n]
    return prefix or ()


_Tree = dict[tuple[str, ...], _Member]


def _check_link(archive: Path, tree: _Tree, parts: tuple[str, ...], m: _Member) -> None:
    """Resolve ``m`` through the archive's own links, as the kernel will; refuse an escape."""
    hops = 0

    def resolve(base: list[str], target: str) -> list[str]:
        nonlocal hops
        if not target:
            raise _refuse(archive, m.raw, "symlink with an empty target")
        if "\0" in target:
            raise _refuse(archive, m.raw, "NUL byte in the symlink target")
        if target.startswith("/") or _DRIVE.match(target):
            raise _refuse(archive, m.raw, f"symlink to absolute path {target!r}")
        stack = list(base)
        for comp in target.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not stack:
                    raise _refuse(archive, m.raw, f"symlink {m.target!r} points outside the extraction directory")
                stack.pop()
                continue
            stack.append(comp)
            node = tree.get(tuple(stack))
            if node is not None and node.kind == SYMLINK:
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise _refuse(archive, m.raw, "symlink loop")
                stack.pop()
                stack = resolve(stack, node.target or "")
        return stack

    resolve(list(parts[:-1]), m.target or "")


def _plan(archive: Path, members: list[_Member], flatten: bool) -> list[tuple[tuple[str, ...], _Member]]:
    strip = len(_common_prefix(members)) if flatten else 0
    tree: _Tree = {}
    for m in members:
        parts = m.parts[strip:]
        if parts:
            tree[parts] = m  # a later member replaces an earlier one of the same name
    for parts, m in tree.items():
        for i in range(1, len(parts)):
            parent = tree.get(parts[:i])
            if parent is not None and parent.kind != DIR:
                raise _refuse(archive, m.raw, f"it lies below {parent.raw!r}, a {parent.kind}")
    for parts, m in tree.items():
        if m.kind == SYMLINK:
            _check_link(archive, tree, parts, m)
    # Directories, then files, then links: a link can never redirect a later write.
    order = {DIR: 0, FILE: 1, SYMLINK: 2}
    return sorted(tree.items(), key=lambda pm: order[pm[1].kind])


def extract_archive(archive: Path, dest: Path, *, flatten: bool = True, max_bytes: int | None = None) -> list[str]:
    """Extract ``archive`` into the empty directory ``dest``; return the names written.

    Every member is checked before the first byte is written (see the module docstring);
    ``max_bytes`` caps the total size (default :func:`default_max_bytes`).
    """
    kind = archive_kind(archive)
    try:
        budget = _Budget(archive, default_max_bytes(archive) if max_bytes is None else max_bytes)
        if kind == "tar":
            with _open_tar(archive, budget) as tf:
                return _extract(archive, _tar_members(archive, tf, budget), dest, flatten)
        with zipfile.ZipFile(archive) as zf:
            return _extract(archive, _zip_members(archive, zf, budget), dest, flatten)
    except _CORRUPT as exc:
        raise FetchError(f"{archive}: corrupt archive: {exc}") from exc
    except OSError as exc:
        raise FetchError(f"{archive}: extraction into {dest} failed: {exc}") from exc


def _real_dir(archive: Path, dest: Path, parts: tuple[str, ...], raw: str, made: set[tuple[str, ...]]) -> Path:
    """``dest/parts`` as a directory made of real directories only (created as needed)."""
    path = dest
    for i, name in enumerate(parts):
        path = path / name
        if parts[: i + 1] in made:
            continue
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise _refuse(archive, raw, f"{'/'.join(parts[: i + 1])} exists and is not a directory") from None
        made.add(parts[: i + 1])
    return path


def _copy(src: IO[bytes], path: Path, mode: int, *, archive: Path, raw: str, limit: int) -> None:
    """Copy ``src`` into the new file ``path`` (never through a link), at most ``limit`` bytes."""
    written = 0
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode), "wb") as out:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > limit:
                raise _too_large(
                    archive, raw, f"more than the declared {limit} bytes", size=written, limit=limit, writing=True
                )
            out.write(chunk)


@contextmanager
def _reading(archive: Path, raw: str) -> Iterator[None]:
    """A member whose data cannot be decoded: :class:`FetchError` naming it."""
    try:
        yield
    except _CORRUPT as exc:
        raise FetchError(f"{archive}: corrupt archive: member {raw!r}: {exc}") from exc


def _extract(archive: Path, members: list[_Member], dest: Path, flatten: bool) -> list[str]:
    plan = _plan(archive, members, flatten)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    made: set[tuple[str, ...]] = set()
    for parts, m in plan:
        if m.kind == DIR:
            _real_dir(archive, dest, parts, m.raw, made)
            continue
        path = _real_dir(archive, dest, parts[:-1], m.raw, made) / parts[-1]
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)  # a leftover name (or link) is replaced, never written through
        if m.kind == SYMLINK:
            os.symlink(m.target or "", path)
        else:
            assert m.opener is not None
            with _reading(archive, m.raw), m.opener() as src:
                _copy(src, path, (m.mode & 0o777) | 0o600, archive=archive, raw=m.raw, limit=m.size)
        written.append("/".join(parts))
    return written


def extract_member(archive: Path, member: str, dest_file: Path, *, max_bytes: int | None = None) -> None:
    """Copy one regular-file member of ``archive`` to ``dest_file`` (mode 0755).

    The copy goes to a new file beside ``dest_file`` and is renamed over it, so a link
    already at ``dest_file`` is replaced, never written through.
    """
    kind = archive_kind(archive)
    try:
        budget = _Budget(archive, default_max_bytes(archive) if max_bytes is None else max_bytes)
        if kind == "tar":
            with _open_tar(archive, budget) as tf:
                try:
                    info = tf.getmember(member)
                except KeyError:
                    raise FetchError(f"{archive.name} has no member {member!r}") from None
                if not info.isreg():
                    raise FetchError(f"{archive.name}: member {member!r} is not a regular file")
                budget.add(member, info.size)
                src = tf.extractfile(info)
                assert src is not None
                _write_exec(archive, src, dest_file, member, info.size)
        else:
            with zipfile.ZipFile(archive) as zf:
                try:
                    zinfo = zf.getinfo(member)
                except KeyError:
                    raise FetchError(f"{archive.name} has no member {member!r}") from None
                _refuse_encrypted(archive, zinfo)
                mode = _zip_mode(zinfo)
                if zinfo.is_dir() or (stat.S_IFMT(mode) and not stat.S_ISREG(mode)):
                    raise FetchError(f"{archive.name}: member {member!r} is not a regular file")
                budget.add(member, zinfo.file_size, zinfo.compress_size)
                _write_exec(archive, zf.open(zinfo), dest_file, member, zinfo.file_size)
    except _CORRUPT as exc:
        raise FetchError(f"{archive}: corrupt archive: {exc}") from exc
    except OSError as exc:
        raise FetchError(f"{archive}: extracting {member!r} to {dest_file} failed: {exc}") from exc


def _write_exec(archive: Path, src: IO[bytes], dest_file: Path, member: str, limit: int) -> None:
    parent = dest_file.parent
    if not stat.S_ISDIR(os.lstat(parent).st_mode):
        raise _refuse(archive, member, f"{parent} is not a real directory")
    tmp = parent / f".{dest_file.name}.{secrets.token_hex(4)}.tmp"
    try:
        with _reading(archive, member), src:
            _copy(src, tmp, 0o755, archive=archive, raw=member, limit=limit)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest_file)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


@contextmanager
def staging_dir(parent: Path, name: str) -> Iterator[Path]:
    """A fresh ``.staging-<name>-…`` directory beside the final one, removed on exit if left."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f".staging-{name}-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        yield path
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)


def install_dir(staging: Path, dest: Path) -> None:
    """Rename a finished staging directory to ``dest`` (replacing an old one)."""
    if dest.exists() or dest.is_symlink():
        old = dest.parent / f".old-{dest.name}-{secrets.token_hex(4)}"
        os.replace(dest, old)
        os.replace(staging, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, dest)
    from localllm.managed.verify import fsync_dir

    fsync_dir(dest.parent)
