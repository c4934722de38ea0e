"""Safe extraction: flat release layout with SONAME links; every escape refused by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localllm.errors import UnsafeArchive
from localllm.managed.extract import extract_archive, extract_member, install_dir, staging_dir
from tests.unit.fakes.release_archives import LINKS, make_tar, make_zip, release_members


def _check_release(dest: Path) -> None:
    assert sorted(p.name for p in dest.iterdir()) == [
        "LICENSE", "libllama.so", "libllama.so.0", "libllama.so.0.1.2", "llama-server"]
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


MALICIOUS = {
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


ZIP_MALICIOUS = {
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
    members = [
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
    archive = make_tar(tmp_path / "pkg.tar.bz2", [
        ("lib/libstdc++.so.6.0.30", "file", b"\x7fELF GLIBCXX_3.4.30", 0o644),
        ("lib/libstdc++.so.6", "symlink", "libstdc++.so.6.0.30", 0o777),
    ], mode="w:bz2")
    target = tmp_path / "libstdc++.so.6"
    extract_member(archive, "lib/libstdc++.so.6.0.30", target)
    assert target.read_bytes() == b"\x7fELF GLIBCXX_3.4.30"
    with pytest.raises(Exception, match="not a regular file"):
        extract_member(archive, "lib/libstdc++.so.6", tmp_path / "x")
