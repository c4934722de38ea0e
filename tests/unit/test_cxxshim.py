"""libstdc++ probe and shim: installed only when the host is too old; mismatches reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.errors import LibstdcxxTooOld
from localllm.managed.cxxshim import (
    SHIM_NAME,
    CxxProbe,
    ensure_shim,
    find_system_libstdcxx,
    highest_glibcxx,
    probe_system,
    required_by_release,
)
from localllm.managed.pins import Artifact, ShimPin
from tests.unit.fakes.release_archives import make_tar

SHIM_MEMBER = "lib/libstdc++.so.6.0.30"


def _elf(path: Path, *versions: int) -> Path:
    body = b"\x7fELF\x02\x01\x01" + b"".join(f"GLIBCXX_3.4.{v}\x00".encode() for v in versions)
    path.write_bytes(body + b"\x00" * 64)
    return path


def _shim_pin(tmp_path: Path, provides: int) -> tuple[ShimPin, Path]:
    lib = _elf(tmp_path / "shimlib", *range(20, provides + 1))
    package = make_tar(
        tmp_path / "libstdcxx-ng.tar.bz2",
        [
            ("info/index.json", "file", b"{}", 0o644),
            (SHIM_MEMBER, "file", lib.read_bytes(), 0o755),
            ("lib/libstdc++.so.6", "symlink", "libstdc++.so.6.0.30", 0o777),
        ],
        mode="w:bz2",
    )
    pin = ShimPin(
        artifact=Artifact(name="shim", file=package.name, sha256="0" * 64), member=SHIM_MEMBER, provides_glibcxx=30
    )
    return pin, package


def _release(tmp_path: Path, needs: int) -> Path:
    rel = tmp_path / "rel"
    rel.mkdir()
    _elf(rel / "libllama.so.0.1.2", 9, 21, needs)
    _elf(rel / "libstdc++.so.6.old", 34)  # a libstdc++ in the dir is a provider, not a consumer
    (rel / "libllama.so.0").symlink_to("libllama.so.0.1.2")
    (rel / "llama-server").write_text("#!/bin/sh\n")
    return rel


def test_highest_glibcxx_reads_the_bytes(tmp_path: Path) -> None:
    assert highest_glibcxx(_elf(tmp_path / "a", 3, 29, 9, 11)) == 29
    (tmp_path / "b").write_bytes(b"nothing here")
    assert highest_glibcxx(tmp_path / "b") is None
    assert highest_glibcxx(tmp_path / "missing") is None


def test_probe_finds_this_hosts_libstdcxx() -> None:
    probe = probe_system()
    assert probe.path is not None and probe.path.exists()
    assert probe.highest is not None and probe.highest >= 20
    assert find_system_libstdcxx() == probe.path


def test_probe_uses_the_first_existing_candidate(tmp_path: Path) -> None:
    lib = _elf(tmp_path / "libstdc++.so.6", 25, 29)
    assert probe_system([tmp_path / "nope", lib]) == CxxProbe(path=lib, highest=29)
    assert probe_system([tmp_path / "nope"]) == CxxProbe(path=None, highest=None)


def test_required_by_release_ignores_links_scripts_and_libstdcxx(tmp_path: Path) -> None:
    assert required_by_release(_release(tmp_path, 30)) == 30


def test_new_enough_host_gets_no_shim(tmp_path: Path) -> None:
    rel = _release(tmp_path, 30)
    called: list[object] = []
    installed = ensure_shim(
        rel,
        pinned_required=30,
        shim=None,
        fetch_shim=called.append,  # type: ignore[arg-type]
        probe=CxxProbe(Path("/x"), 30),
        log=called.append,
    )
    assert installed is False and called == []
    assert not (rel / SHIM_NAME).exists()


def test_old_host_gets_the_pinned_shim(tmp_path: Path) -> None:
    rel = _release(tmp_path, 30)
    pin, package = _shim_pin(tmp_path, 30)
    logs: list[str] = []
    fetched: list[ShimPin] = []

    def fetch(p: ShimPin) -> Path:
        fetched.append(p)
        return package

    assert ensure_shim(
        rel,
        pinned_required=30,
        shim=pin,
        fetch_shim=fetch,
        probe=CxxProbe(Path("/usr/lib64/libstdc++.so.6"), 29),
        log=logs.append,
    )
    assert fetched == [pin]
    assert highest_glibcxx(rel / SHIM_NAME) == 30
    assert "GLIBCXX_3.4.29" in logs[0] and "GLIBCXX_3.4.30" in logs[0]


def test_missing_system_libstdcxx_counts_as_too_old(tmp_path: Path) -> None:
    rel = _release(tmp_path, 30)
    pin, package = _shim_pin(tmp_path, 30)
    assert ensure_shim(
        rel, pinned_required=30, shim=pin, fetch_shim=lambda p: package, probe=CxxProbe(None, None), log=lambda m: None
    )
    assert (rel / SHIM_NAME).is_file()


def test_shim_older_than_the_release_needs_is_reported_and_not_installed(tmp_path: Path) -> None:
    rel = _release(tmp_path, 31)
    pin, package = _shim_pin(tmp_path, 30)
    logs: list[str] = []
    with pytest.raises(LibstdcxxTooOld) as info:
        ensure_shim(
            rel,
            pinned_required=30,
            shim=pin,
            fetch_shim=lambda p: package,
            probe=CxxProbe(Path("/lib/libstdc++.so.6"), 29),
            log=logs.append,
        )
    exc = info.value
    assert (exc.required, exc.system, exc.shim) == (31, 29, 30)
    assert "GLIBCXX_3.4.31" in str(exc) and "--from-source" in exc.hint
    assert not (rel / SHIM_NAME).exists()
    # The release needing more than the pin says is a warning naming both numbers.
    assert any(line.startswith("warning:") and "3.4.31" in line and "3.4.30" in line for line in logs)


def test_no_shim_pin_for_the_platform_is_reported(tmp_path: Path) -> None:
    rel = _release(tmp_path, 30)
    with pytest.raises(LibstdcxxTooOld, match="no libstdc\\+\\+ shim is pinned") as info:
        ensure_shim(
            rel,
            pinned_required=30,
            shim=None,
            fetch_shim=lambda p: Path("/x"),
            probe=CxxProbe(Path("/lib/libstdc++.so.6"), 28),
            log=lambda m: None,
        )
    assert info.value.system == 28 and "endpoint mode" in info.value.hint


def test_release_without_cxx_references_needs_nothing(tmp_path: Path) -> None:
    rel = tmp_path / "rel"
    rel.mkdir()
    (rel / "llama-server").write_text("#!/bin/sh\n")
    assert not ensure_shim(
        rel,
        pinned_required=30,
        shim=None,
        fetch_shim=lambda p: Path("/x"),
        probe=CxxProbe(None, None),
        log=lambda m: None,
    )
