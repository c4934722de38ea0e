"""Safe extraction: flat release layout with SONAME links; every escape refused by name."""

from __future__ import annotations

import io
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from localllm.errors import ArchiveTooLarge, FetchError, UnsafeArchive
from localllm.managed.extract import (
    MIN_MAX_BYTES,
    extract_archive,
    extract_member,
    install_dir,
    staging_dir,
)
from tests.unit.fakes.release_archives import LINKS, Member, make_tar, make_zip, release_members


def _check_release(dest: Path) -> None:
    assert sorted(p.name for p in dest.iterdir()) == [
        "LICENSE",
        "libllama.so",
        "libllama.so.0",
        "libllama.so.0.1.2",
        "llama-server",
    ]
    for link, target in LINKS.items():
        assert (dest / link).is_symlink()
        assert os.readlink(dest / link) == target
    assert (dest / "libllama.so").resolve() == (dest / "libllama.so.0.1.2").resolve()
    assert os.access(dest / "llama-server", os.X_OK)
    assert not os.access(dest / "LICENSE", os.X_OK)


@pytest.mark.parametrize("fmt", ["tar.gz", "zip", "tar.bz2"])
def test_release_is_extracted_flat_with_soname_links(tmp_path: Path, fmt: str) -> None:
    archive = tmp_path / f"llama.{fmt}"
    if fmt == "zip":
        make_zip(archive, release_members())
    else:
        make_tar(archive, release_members(), mode="w:gz" if fmt == "tar.gz" else "w:bz2")
    dest = tmp_path / "out"
    written = extract_archive(archive, dest)
    assert "llama-server" in written
    _check_release(dest)


def test_build_bin_prefix_is_flattened(tmp_path: Path) -> None:
    members = [(n.replace("llama-b9999/", "build/bin/"), k, d, m) for n, k, d, m in release_members()]
    archive = make_tar(tmp_path / "old-style.tar.gz", members)
    dest = tmp_path / "out"
    extract_archive(archive, dest)
    _check_release(dest)


def test_flatten_off_keeps_the_top_directory(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar.gz", release_members())
    extract_archive(archive, tmp_path / "out", flatten=False)
    assert (tmp_path / "out" / "llama-b9999" / "llama-server").is_file()


def _outside_sentinel(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    return outside


MALICIOUS: dict[str, Member] = {
    "dotdot": ("llama-b1/../../outside/evil", "file", b"x", 0o644),
    "absolute": ("{abs}/evil", "file", b"x", 0o644),
    "link-out": ("llama-b1/libevil.so", "symlink", "../../outside", 0o777),
    "link-abs": ("llama-b1/libevil.so", "symlink", "/etc/passwd", 0o777),
    "hardlink": ("llama-b1/hard", "hardlink", "/etc/passwd", 0o644),
    "device": ("llama-b1/null", "chardev", b"", 0o644),
    "fifo": ("llama-b1/pipe", "fifo", b"", 0o644),
}


@pytest.mark.parametrize("kind", sorted(MALICIOUS))
def test_malicious_tar_is_refused_naming_the_member(tmp_path: Path, kind: str) -> None:
    outside = _outside_sentinel(tmp_path)
    name, mkind, data, mode = MALICIOUS[kind]
    name = name.replace("{abs}", str(outside))
    members = [*release_members("llama-b1"), (name, mkind, data, mode)]
    archive = make_tar(tmp_path / "evil.tar.gz", members)
    with staging_dir(tmp_path / "bin", "llama-b1") as staging:
        with pytest.raises(UnsafeArchive) as info:
            extract_archive(archive, staging)
        assert repr(name) in str(info.value)
        assert list(staging.iterdir()) == []  # checked before the first byte is written
    assert list(outside.iterdir()) == []
    assert list((tmp_path / "bin").iterdir()) == []  # staging removed


ZIP_MALICIOUS: dict[str, Member] = {
    "dotdot": ("llama-b1/../../outside/evil", "file", b"x", 0o644),
    "absolute": ("{abs}/evil", "file", b"x", 0o644),
    "backslash-dotdot": ("llama-b1\\..\\..\\outside\\evil", "file", b"x", 0o644),
    "link-out": ("llama-b1/libevil.so", "symlink", "../../outside/x", 0o777),
    "device": ("llama-b1/null", "chardev", b"", 0o644),
}


@pytest.mark.parametrize("kind", sorted(ZIP_MALICIOUS))
def test_malicious_zip_is_refused_naming_the_member(tmp_path: Path, kind: str) -> None:
    outside = _outside_sentinel(tmp_path)
    name, mkind, data, mode = ZIP_MALICIOUS[kind]
    name = name.replace("{abs}", str(outside))
    archive = make_zip(tmp_path / "evil.zip", [*release_members("llama-b1"), (name, mkind, data, mode)])
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchive) as info:
        extract_archive(archive, dest)
    assert repr(name) in str(info.value)
    assert list(outside.iterdir()) == []
    assert not dest.exists() or list(dest.iterdir()) == []


def test_inside_links_between_subdirectories_are_allowed(tmp_path: Path) -> None:
    members: list[Member] = [
        ("r/lib/libx.so.1", "file", b"x", 0o644),
        ("r/bin/libx.so.1", "symlink", "../lib/libx.so.1", 0o777),
    ]
    archive = make_tar(tmp_path / "ok.tar.gz", members)
    extract_archive(archive, tmp_path / "out")
    assert (tmp_path / "out" / "bin" / "libx.so.1").read_bytes() == b"x"


def test_install_dir_replaces_atomically(tmp_path: Path) -> None:
    dest = tmp_path / "bin" / "rel"
    for content in (b"old", b"new"):
        with staging_dir(tmp_path / "bin", "rel") as staging:
            (staging / "f").write_bytes(content)
            install_dir(staging, dest)
    assert (dest / "f").read_bytes() == b"new"
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["rel"]


def test_extract_member_copies_one_regular_file(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "pkg.tar.bz2",
        [
            ("lib/libstdc++.so.6.0.30", "file", b"\x7fELF GLIBCXX_3.4.30", 0o644),
            ("lib/libstdc++.so.6", "symlink", "libstdc++.so.6.0.30", 0o777),
        ],
        mode="w:bz2",
    )
    target = tmp_path / "libstdc++.so.6"
    extract_member(archive, "lib/libstdc++.so.6.0.30", target)
    assert target.read_bytes() == b"\x7fELF GLIBCXX_3.4.30"
    with pytest.raises(Exception, match="not a regular file"):
        extract_member(archive, "lib/libstdc++.so.6", tmp_path / "x")


# --- link chains (issue 11 item 5) -------------------------------------------------------

CHAINS: dict[str, list[Member]] = {
    # d/up → .. is inside alone; e1 → d/up/.. then names the parent of the extraction dir.
    "updir-chain": [
        ("llama-b1/d/", "dir", b"", 0o755),
        ("llama-b1/d/up", "symlink", "..", 0o777),
        ("llama-b1/e1", "symlink", "d/up/..", 0o777),
    ],
    "chain-of-three": [
        ("llama-b1/a", "symlink", ".", 0o777),
        ("llama-b1/b", "symlink", "a/a/a", 0o777),
        ("llama-b1/e1", "symlink", "b/../..", 0o777),
    ],
    "through-dir-link": [
        ("llama-b1/lib/", "dir", b"", 0o755),
        ("llama-b1/lib/l", "symlink", "..", 0o777),
        ("llama-b1/e1", "symlink", "lib/l/lib/l/..", 0o777),
    ],
    "loop": [("llama-b1/e1", "symlink", "e2", 0o777), ("llama-b1/e2", "symlink", "e1", 0o777)],
}


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
@pytest.mark.parametrize("case", sorted(CHAINS))
def test_symlink_chains_that_resolve_outside_are_refused(tmp_path: Path, case: str, fmt: str) -> None:
    members = [*release_members("llama-b1"), *CHAINS[case]]
    archive = tmp_path / f"chain.{fmt}"
    make_zip(archive, members) if fmt == "zip" else make_tar(archive, members)
    with staging_dir(tmp_path / "bin", "llama-b1") as staging:
        with pytest.raises(UnsafeArchive) as info:
            extract_archive(archive, staging)
        assert repr("llama-b1/e1") in str(info.value)
        assert list(staging.iterdir()) == []
    assert list((tmp_path / "bin").iterdir()) == []


def test_shim_install_through_a_link_chain_writes_nothing_outside(tmp_path: Path) -> None:
    """The attack of item 5: release links aim ``libstdc++.so.6`` above the cache root."""
    members = [
        *release_members("llama-b1"),
        *CHAINS["updir-chain"],
        ("llama-b1/libstdc++.so.6", "symlink", "e1/escaped", 0o777),
    ]
    release = make_tar(tmp_path / "release.tar.gz", members)
    shim = make_tar(
        tmp_path / "shim.tar.bz2", [("lib/libstdc++.so.6.0.30", "file", b"\x7fELF shim", 0o644)], mode="w:bz2"
    )
    bindir = tmp_path / "bin"
    with staging_dir(bindir, "llama-b1") as staging, pytest.raises(UnsafeArchive):
        extract_archive(release, staging)
        extract_member(shim, "lib/libstdc++.so.6.0.30", staging / "libstdc++.so.6")
    assert not (bindir / "escaped").exists()
    assert list(bindir.iterdir()) == []


def test_extract_member_replaces_a_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    outside = _outside_sentinel(tmp_path)
    victim = outside / "victim"
    victim.write_bytes(b"keep")
    release = tmp_path / "release"
    release.mkdir()
    (release / "libstdc++.so.6").symlink_to(victim)
    shim = make_tar(
        tmp_path / "shim.tar.bz2", [("lib/libstdc++.so.6.0.30", "file", b"\x7fELF shim", 0o644)], mode="w:bz2"
    )
    extract_member(shim, "lib/libstdc++.so.6.0.30", release / "libstdc++.so.6")
    assert victim.read_bytes() == b"keep"
    assert not (release / "libstdc++.so.6").is_symlink()
    assert (release / "libstdc++.so.6").read_bytes() == b"\x7fELF shim"
    assert sorted(p.name for p in release.iterdir()) == ["libstdc++.so.6"]


def test_a_member_below_a_link_is_refused(tmp_path: Path) -> None:
    members = [
        *release_members("llama-b1"),
        ("llama-b1/d", "symlink", ".", 0o777),
        ("llama-b1/d/x", "file", b"x", 0o644),
    ]
    archive = make_tar(tmp_path / "below.tar.gz", members)
    with pytest.raises(UnsafeArchive) as info:
        extract_archive(archive, tmp_path / "out")
    assert repr("llama-b1/d/x") in str(info.value)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_inside_chains_are_kept(tmp_path: Path) -> None:
    members = [
        *release_members("llama-b1"),
        ("llama-b1/lib/", "dir", b"", 0o755),
        ("llama-b1/lib/up", "symlink", "..", 0o777),
        ("llama-b1/lib/server", "symlink", "up/llama-server", 0o777),
    ]
    dest = tmp_path / "out"
    extract_archive(make_tar(tmp_path / "ok.tar.gz", members), dest)
    assert (dest / "lib" / "server").resolve() == (dest / "llama-server").resolve()


# --- zipfile.writestr members (item 6) ---------------------------------------------------


def test_zip_from_writestr_without_type_bits_is_regular_files(tmp_path: Path) -> None:
    archive = tmp_path / "plain.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # external_attr = 0o600 << 16, no S_IFREG
        zf.writestr("llama-b1/llama-server", b"#!/bin/sh\n")
        zf.writestr("llama-b1/LICENSE", "MIT\n")
        info = zipfile.ZipInfo("llama-b1/other")
        info.external_attr = 0o755 << 16
        zf.writestr(info, b"x")
        dos = zipfile.ZipInfo("llama-b1/dos.txt")
        dos.create_system = 0
        dos.external_attr = 0x20  # MS-DOS archive bit only
        zf.writestr(dos, b"d")
    dest = tmp_path / "out"
    assert sorted(extract_archive(archive, dest)) == ["LICENSE", "dos.txt", "llama-server", "other"]
    assert (dest / "llama-server").read_bytes() == b"#!/bin/sh\n"
    assert os.access(dest / "other", os.X_OK)


# --- size caps (item 7) ------------------------------------------------------------------


def _zip_of(path: Path, members: list[tuple[str, int]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llama-b1/llama-server", b"#!/bin/sh\n")
        for name, size in members:
            zf.writestr(name, bytes(size))
    return path


def test_zip_bomb_member_ratio_is_refused_before_writing(tmp_path: Path) -> None:
    archive = _zip_of(tmp_path / "bomb.zip", [("llama-b1/bomb", 16 << 20)])
    assert archive.stat().st_size < 100_000
    with staging_dir(tmp_path / "bin", "llama-b1") as staging:
        with pytest.raises(ArchiveTooLarge) as info:
            extract_archive(archive, staging)
        assert info.value.member == "llama-b1/bomb"
        assert info.value.size == 16 << 20
        assert list(staging.iterdir()) == []
    assert list((tmp_path / "bin").iterdir()) == []


def test_many_small_members_stop_at_the_total_cap(tmp_path: Path) -> None:
    members = [(f"llama-b1/part{i:03d}", 1023 << 10) for i in range(80)]  # 80 MiB, under the ratio floor
    archive = _zip_of(tmp_path / "many.zip", members)
    with staging_dir(tmp_path / "bin", "llama-b1") as staging:
        with pytest.raises(ArchiveTooLarge) as info:
            extract_archive(archive, staging)
        assert info.value.limit == MIN_MAX_BYTES
        assert info.value.member == f"llama-b1/part{MIN_MAX_BYTES // (1023 << 10):03d}"
        assert list(staging.iterdir()) == []
    assert list((tmp_path / "bin").iterdir()) == []


def test_tar_bomb_fails_at_its_header(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("llama-b1/bomb")
        info.size = 80 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    with staging_dir(tmp_path / "bin", "llama-b1") as staging:
        with pytest.raises(ArchiveTooLarge) as info_exc:
            extract_archive(archive, staging)
        assert info_exc.value.member == "llama-b1/bomb"
        assert list(staging.iterdir()) == []
    assert list((tmp_path / "bin").iterdir()) == []


def test_explicit_cap_applies_and_an_honest_archive_fits(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar.gz", release_members())
    total = sum(len(d) for _, k, d, _ in release_members() if k == "file")
    extract_archive(archive, tmp_path / "ok", max_bytes=total)
    with pytest.raises(ArchiveTooLarge) as info:
        extract_archive(archive, tmp_path / "no", max_bytes=total - 1)
    assert info.value.limit == total - 1


def test_extract_member_is_capped(tmp_path: Path) -> None:
    archive = _zip_of(tmp_path / "shim.zip", [("lib/libstdc++.so.6", 4 << 20)])
    with pytest.raises(ArchiveTooLarge):
        extract_member(archive, "lib/libstdc++.so.6", tmp_path / "libstdc++.so.6")
    assert not (tmp_path / "libstdc++.so.6").exists()


def _patched_zip(path: Path, local: dict[int, int], central: dict[int, int]) -> Path:
    """A one-member stored zip with bytes of its local and central headers OR-ed or set."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("llama-server", b"hello")
    data = bytearray(path.read_bytes())
    cd = data.rfind(b"PK\x01\x02")
    for base, fields in ((0, local), (cd, central)):
        for off, value in fields.items():
            data[base + off] = value
    path.write_bytes(bytes(data))
    return path


def _undecodable(tmp_path: Path, case: str) -> Path:
    if case == "deflate":
        path = tmp_path / "a.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("llama-server", os.urandom(1000) * 50)
        data = bytearray(path.read_bytes())
        for i in range(30 + len("llama-server") + 5, 30 + len("llama-server") + 60):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        return path
    if case == "method":  # 97 (WavPack): zipfile has no decompressor
        return _patched_zip(tmp_path / "a.zip", {8: 97}, {10: 97})
    if case == "xz":
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo("llama-server")
            info.size = 200_000
            tf.addfile(info, io.BytesIO(os.urandom(info.size)))
        xz = bytearray(lzma.compress(buf.getvalue()))
        for i in range(2000, 2100):
            xz[i] ^= 0x55
        (tmp_path / "a.tar.xz").write_bytes(bytes(xz))
        return tmp_path / "a.tar.xz"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["deflate", "method", "xz"])
def test_undecodable_member_data_is_a_fetch_error(tmp_path: Path, case: str) -> None:
    archive = _undecodable(tmp_path, case)  # zlib.error, NotImplementedError, LZMAError before
    with pytest.raises(FetchError) as info:
        extract_archive(archive, tmp_path / "out")
    assert type(info.value) is FetchError
    if case != "xz":
        with pytest.raises(FetchError) as info:
            extract_member(archive, "llama-server", tmp_path / "llama-server")
        assert type(info.value) is FetchError and not (tmp_path / "llama-server").exists()


def _nul_archive(tmp_path: Path, case: str) -> Path:
    if case == "zip-link":
        path = tmp_path / "a.zip"
        with zipfile.ZipFile(path, "w") as zf:
            link = zipfile.ZipInfo("lib.so")
            link.create_system = 3
            link.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(link, b"a\x00b")
            zf.writestr("llama-server", b"x")
        return path
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("x")
        if case == "pax-path":
            info.pax_headers = {"path": "ab\x00cd"}
            info.size = 1
            tf.addfile(info, io.BytesIO(b"z"))
        else:
            info.type = tarfile.SYMTYPE
            info.pax_headers = {"linkpath": "ab\x00cd"}
            tf.addfile(info)
    return path


@pytest.mark.parametrize("case", ["zip-link", "pax-path", "pax-linkpath", "encrypted"])
def test_nul_bytes_and_encrypted_members_are_refused(tmp_path: Path, case: str) -> None:
    # RuntimeError from zipfile, ValueError (embedded null byte) from os.symlink / os.open before
    encrypted = case == "encrypted"
    archive = _patched_zip(tmp_path / "a.zip", {6: 1}, {8: 1}) if encrypted else _nul_archive(tmp_path, case)
    with pytest.raises(UnsafeArchive):
        extract_archive(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    if case == "encrypted":
        with pytest.raises(UnsafeArchive):
            extract_member(archive, "llama-server", tmp_path / "llama-server")


@pytest.mark.parametrize("typeflag", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_huge_pax_or_long_name_record_fails_before_it_is_read(tmp_path: Path, typeflag: bytes) -> None:
    declared = 64 << 20  # tarfile read such a record whole: 2 GB of RSS from a 2 MB .tar.gz
    info = tarfile.TarInfo("././@PaxHeader" if typeflag == tarfile.XHDTYPE else "././@LongLink")
    info.type = typeflag
    info.size = declared
    header = info.tobuf(format=tarfile.GNU_FORMAT if typeflag == tarfile.GNUTYPE_LONGNAME else tarfile.USTAR_FORMAT)
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    archive = tmp_path / "bomb.tar.gz"
    with archive.open("wb") as fh:
        fh.write(co.compress(header))
        for _ in range(declared >> 20):
            fh.write(co.compress(bytes(1 << 20)))
        fh.write(co.compress(bytes(1024)) + co.flush())
    for call in (
        lambda: extract_archive(archive, tmp_path / "out", max_bytes=1 << 20),
        lambda: extract_member(archive, "x", tmp_path / "x", max_bytes=1 << 20),
    ):
        with pytest.raises(ArchiveTooLarge) as exc:
            call()
        assert exc.value.size > exc.value.limit and exc.value.limit < declared
