"""Safe extraction of release archives (``.tar.gz``, ``.tar.bz2``, ``.zip``).

Names from an archive never become paths unchecked. Every member is validated before
anything is written, and the whole archive is refused, naming the member, when one is:
an absolute path or drive, a path with a ``..`` component, a symlink whose target is
absolute or resolves outside the extraction root, a hard link, a device, FIFO or socket.
Regular files, directories and inside-pointing symlinks (``libllama.so → libllama.so.0``)
are extracted as themselves.

Extraction goes into a staging directory that the caller renames into place
(:func:`staging_dir`, :func:`install_dir`), so a release directory either exists whole
or not at all. ``flatten`` strips the directory prefix every member shares
(``llama-b9444/`` or ``build/bin/``), giving the flat upstream layout.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from localllm.errors import FetchError, UnsafeArchive

_DRIVE = re.compile(r"^[A-Za-z]:")
_CHUNK = 1 << 20

FILE, DIR, SYMLINK = "file", "dir", "symlink"


@dataclass(frozen=True)
class _Member:
    raw: str
    parts: tuple[str, ...]
    kind: str
    mode: int
    target: str | None
    opener: Callable[[], IO[bytes]] | None


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
    name = raw.replace("\\", "/")
    if name.startswith("/") or _DRIVE.match(name):
        raise _refuse(archive, raw, "absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _refuse(archive, raw, "path contains '..'")
    return parts


def _tar_members(archive: Path, tf: tarfile.TarFile) -> list[_Member]:
    out: list[_Member] = []
    for info in tf.getmembers():
        parts = _parts(archive, info.name)
        if info.islnk():
            raise _refuse(archive, info.name, f"hard link to {info.linkname!r}")
        if info.issym():
            out.append(_Member(info.name, parts, SYMLINK, 0o777, info.linkname, None))
        elif info.isdir():
            out.append(_Member(info.name, parts, DIR, info.mode, None, None))
        elif info.isreg():
            out.append(_Member(info.name, parts, FILE, info.mode, None, _tar_opener(tf, info)))
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


def _zip_members(archive: Path, zf: zipfile.ZipFile) -> list[_Member]:
    out: list[_Member] = []
    for info in zf.infolist():
        parts = _parts(archive, info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            target = zf.read(info).decode("utf-8", errors="replace")
            out.append(_Member(info.filename, parts, SYMLINK, 0o777, target, None))
        elif info.is_dir():
            out.append(_Member(info.filename, parts, DIR, mode & 0o777 or 0o755, None, None))
        elif mode and not stat.S_ISREG(mode):
            raise _refuse(archive, info.filename, "device, FIFO or other special file")
        else:
            out.append(_Member(info.filename, parts, FILE, mode & 0o777 or 0o644, None,
                               _zip_opener(zf, info)))
    return out


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


def _check_link(archive: Path, m: _Member, parts: tuple[str, ...]) -> None:
    target = m.target or ""
    if not target:
        raise _refuse(archive, m.raw, "symlink with an empty target")
    if target.startswith("/") or _DRIVE.match(target):
        raise _refuse(archive, m.raw, f"symlink to absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1] else target)
    if resolved == ".." or resolved.startswith("../"):
        raise _refuse(archive, m.raw, f"symlink {target!r} points outside the extraction directory")


def _inside(root: Path, path: Path) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root + os.sep)


def extract_archive(archive: Path, dest: Path, *, flatten: bool = True) -> list[str]:
    """Extract ``archive`` into the empty directory ``dest``; return the names written.

    Every member is checked before the first byte is written (see the module docstring).
    """
    kind = archive_kind(archive)
    try:
        if kind == "tar":
            with tarfile.open(archive, "r:*") as tf:
                return _extract(archive, _tar_members(archive, tf), dest, flatten)
        with zipfile.ZipFile(archive) as zf:
            return _extract(archive, _zip_members(archive, zf), dest, flatten)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise FetchError(f"{archive}: corrupt archive: {exc}") from exc
    except OSError as exc:
        raise FetchError(f"{archive}: extraction into {dest} failed: {exc}") from exc


def _extract(archive: Path, members: list[_Member], dest: Path, flatten: bool) -> list[str]:
    strip = len(_common_prefix(members)) if flatten else 0
    plan: list[tuple[_Member, tuple[str, ...]]] = []
    for m in members:
        parts = m.parts[strip:]
        if not parts:
            continue
        if m.kind == SYMLINK:
            _check_link(archive, m, parts)
        plan.append((m, parts))
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    # Directories and files first, links last: a link can then never redirect a later write.
    plan.sort(key=lambda mp: mp[0].kind == SYMLINK)
    for m, parts in plan:
        path = dest.joinpath(*parts)
        if not _inside(dest, path.parent):
            raise _refuse(archive, m.raw, "its directory resolves outside the extraction directory")
        if m.kind == DIR:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.is_file():
            path.unlink()
        if m.kind == SYMLINK:
            os.symlink(m.target or "", path)
        else:
            assert m.opener is not None
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         (m.mode & 0o777) | 0o600)
            with m.opener() as src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
        written.append("/".join(parts))
    return written


def extract_member(archive: Path, member: str, dest_file: Path) -> None:
    """Copy one regular-file member of ``archive`` to ``dest_file`` (mode 0755)."""
    kind = archive_kind(archive)
    try:
        if kind == "tar":
            with tarfile.open(archive, "r:*") as tf:
                try:
                    info = tf.getmember(member)
                except KeyError:
                    raise FetchError(f"{archive.name} has no member {member!r}") from None
                if not info.isreg():
                    raise FetchError(f"{archive.name}: member {member!r} is not a regular file")
                src = tf.extractfile(info)
                assert src is not None
                _write_exec(src, dest_file)
        else:
            with zipfile.ZipFile(archive) as zf:
                try:
                    zinfo = zf.getinfo(member)
                except KeyError:
                    raise FetchError(f"{archive.name} has no member {member!r}") from None
                with zf.open(zinfo) as zsrc:
                    _write_exec(zsrc, dest_file)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise FetchError(f"{archive}: corrupt archive: {exc}") from exc


def _write_exec(src: IO[bytes], dest_file: Path) -> None:
    with src, dest_file.open("wb") as out:
        shutil.copyfileobj(src, out, _CHUNK)
    dest_file.chmod(0o755)


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
