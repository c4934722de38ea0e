"""Release-like archives built in tests: a flat ``llama-b<N>/`` folder with an executable
``llama-server`` (a shell script printing a version), a versioned library and its SONAME
symlinks, as ``.tar.gz`` or ``.zip``. Standard library only."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

SERVER_SCRIPT = b"#!/bin/sh\necho 'version: 9999 (fake)'\necho 'built with fake for tests' >&2\n"
LIB_BYTES = b"\x7fELF fake library GLIBCXX_3.4.21\x00GLIBCXX_3.4.25\x00"
LINKS = {"libllama.so.0": "libllama.so.0.1.2", "libllama.so": "libllama.so.0"}

Member = tuple[str, str, bytes | str, int]
"""(name, kind file|dir|symlink|hardlink|chardev|fifo, data or link target, mode)."""


def release_members(top: str = "llama-b9999") -> list[Member]:
    """(name, kind file|dir|symlink, data or link target, mode) of a fake release."""
    return [
        (f"{top}/", "dir", b"", 0o755),
        (f"{top}/llama-server", "file", SERVER_SCRIPT, 0o755),
        (f"{top}/libllama.so.0.1.2", "file", LIB_BYTES, 0o755),
        (f"{top}/libllama.so.0", "symlink", LINKS["libllama.so.0"], 0o777),
        (f"{top}/libllama.so", "symlink", LINKS["libllama.so"], 0o777),
        (f"{top}/LICENSE", "file", b"MIT\n", 0o644),
    ]


def make_tar(path: Path, members: list[Member], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:  # type: ignore[call-overload]  # mode is a runtime str
        for name, kind, data, perm in members:
            info = tarfile.TarInfo(name)
            info.mode = perm
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = str(data)
                tf.addfile(info)
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = str(data)
                tf.addfile(info)
            elif kind == "chardev":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = 1, 3
                tf.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tf.addfile(info)
            else:
                raw = data if isinstance(data, bytes) else data.encode()
                info.size = len(raw)
                tf.addfile(info, io.BytesIO(raw))
    return path


def make_zip(path: Path, members: list[Member]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, kind, data, perm in members:
            info = zipfile.ZipInfo(name)
            if kind == "dir":
                info.external_attr = (stat.S_IFDIR | perm) << 16
                zf.writestr(info, b"")
            elif kind == "symlink":
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(info, str(data))
            elif kind == "chardev":
                info.external_attr = (stat.S_IFCHR | 0o644) << 16
                zf.writestr(info, b"")
            else:
                info.external_attr = (stat.S_IFREG | perm) << 16
                zf.writestr(info, data if isinstance(data, bytes) else data.encode())
    return path
