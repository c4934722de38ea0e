"""Cache layout, `cache list | verify | prune` and `doctor` through the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from localllm import cli, settings
from localllm.errors import FetchError
from localllm.managed import cache_layout, ensure_model, platforms
from localllm.managed.cache import MARKER, write_marker
from localllm.managed.pins import load_pins
from tests.unit.fakes.http_server import ArchiveServer

REPO = Path(__file__).resolve().parents[2]
DATA = os.urandom(50_000)
FILE = "gemma-3-270m-q4_k_m.gguf"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def pins_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real pins with gemma re-pinned to DATA, installed as the default pins file."""
    data = json.loads((REPO / "pins" / "artifacts.json").read_text())
    data["models"]["entries"]["gemma-3-270m"]["sha256"] = _sha(DATA)
    data["models"]["entries"]["gemma-3-270m"]["size"] = len(DATA)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr("localllm.managed.pins.default_pins_path", lambda: path)
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_layout_follows_the_cache_dir_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_layout().root == tmp_path / "cache"
    monkeypatch.delenv("LOCALLLM_CACHE_DIR")
    assert cache_layout().root == Path(os.environ["XDG_CACHE_HOME"]) / "localllm"
    pins = load_pins()
    gemma = pins.model("gemma-3-270m")
    assert cache_layout(tmp_path).model_path(gemma) == (
        tmp_path / "models" / "gemma-3-270m" / "a5fd3b62230aa5ec" / FILE
    )


def test_cache_doc_draws_every_directory() -> None:
    from localllm.managed import cache_layout as documented

    doc = documented.__doc__ or ""
    for part in (
        "bin/",
        "models/<id>/<sha256[:16]>/",
        "downloads/",
        "build/",
        "locks/",
        "cmake-build/",
        "build.log",
        ".staging-",
        ".part",
        MARKER,
    ):
        assert part in doc, part


def test_verify_detects_corruption_and_refetches(pins_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ArchiveServer({FILE: DATA}) as srv:
        code, out, _ = _run(capsys, "fetch", "model", "gemma-3-270m", "--mirror", srv.base_url, "--json")
        assert code == 0
        path = Path(json.loads(out)["path"])
        path.write_bytes(b"\0" * len(DATA))  # bit rot, same size
        code, out, err = _run(capsys, "cache", "verify", "--mirror", srv.base_url, "--json")
        assert len(srv.requests) == 2
    assert code == 0, err
    entries = json.loads(out)["entries"]
    model = next(e for e in entries if e["kind"] == "model")
    assert model["status"] == "refetched" and _sha(DATA) in model["detail"]
    assert f"corrupt: {path}" in err
    assert path.read_bytes() == DATA


def test_verify_without_refetch_flags_and_fails(pins_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mirror = pins_file.parent / "mirror"
    mirror.mkdir()
    (mirror / FILE).write_bytes(DATA)
    path = ensure_model("gemma-3-270m", mirror=str(mirror))
    with path.open("r+b") as fh:
        fh.write(bytes([DATA[0] ^ 0xFF]))  # b"X" left DATA unchanged when it began with X (1 run in 256)
    code, out, err = _run(capsys, "cache", "verify", "--no-refetch")
    assert code == 1
    assert "corrupt" in out and "1 corrupted cache entry remain" in err


def test_verify_checks_release_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    layout = cache_layout()
    rel = layout.source_release_dir(load_pins().source.version, platforms.current().slug)
    rel.mkdir(parents=True)
    (rel / "llama-server").write_text("#!/bin/sh\n")
    (rel / "libx.so.1").write_bytes(b"lib")
    (rel / "libx.so").symlink_to("libx.so.1")
    write_marker(rel, {"kind": "source"})
    code, out, _ = _run(capsys, "cache", "verify", "--no-refetch", "--json")
    assert code == 0 and json.loads(out)["entries"][0]["status"] == "ok"
    (rel / "libx.so.1").write_bytes(b"patched")
    code, out, _ = _run(capsys, "cache", "verify", "--no-refetch", "--json")
    entry = json.loads(out)["entries"][0]
    assert code == 1 and entry["status"] == "corrupt" and "libx.so.1" in entry["detail"]


def test_list_and_prune_stale_and_temp_entries(pins_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mirror = pins_file.parent / "mirror"
    mirror.mkdir()
    (mirror / FILE).write_bytes(DATA)
    current = ensure_model("gemma-3-270m", mirror=str(mirror))
    layout = cache_layout()
    stale = layout.models_dir / "gemma-3-270m" / ("f" * 16) / FILE  # an old pin's file
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    old_part = current.parent / f".{FILE}.123.abcd.part"
    old_part.write_bytes(b"partial")
    hour_ago = time.time() - 3600
    os.utime(old_part, (hour_ago, hour_ago))
    fresh_part = current.parent / f".{FILE}.456.ef01.part"  # maybe a running download: kept
    fresh_part.write_bytes(b"partial")
    old_release = layout.bin_dir / "llama-b1000-linux-x86_64"
    old_release.mkdir(parents=True)
    (old_release / MARKER).write_text("{}")
    (old_release / "llama-server").write_text("")

    code, out, _ = _run(capsys, "cache", "list", "--json")
    statuses = {(e["kind"], e["path"]): e["status"] for e in json.loads(out)["entries"]}
    assert statuses[("model", str(current))] == "ok"
    assert statuses[("model", str(stale))] == "stale"
    assert statuses[("release", str(old_release))] == "stale"
    assert statuses[("temp", str(old_part))] == "temp"

    code, out, _ = _run(capsys, "cache", "prune", "--dry-run", "--json")
    assert code == 0 and stale.exists()
    code, out, _ = _run(capsys, "cache", "prune", "--json")
    removed = {e["path"] for e in json.loads(out)["removed"]}
    assert removed == {str(stale), str(old_part), str(old_release)}
    assert not stale.parent.exists() and not old_release.exists() and not old_part.exists()
    assert current.read_bytes() == DATA and fresh_part.exists()


def test_doctor_reports_platform_toolchain_and_pins(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "doctor", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["platform"] == platforms.current().key
    assert data["pins"]["models"]["bge-small-en-v1.5"]["pin"] == "pin not configured (no sha256)"
    assert data["pins"]["models"]["all-minilm-l6-v2"]["pin"] == "mirror only"
    assert set(data["build_tools"]) == {"cmake", "make", "C compiler", "C++ compiler"}
    if platforms.current().is_linux:
        assert data["glibc"] and data["libstdcxx"]["highest"].startswith("GLIBCXX_3.4.")
    code, out, _ = _run(capsys, "doctor")
    assert code == 0 and "platform" in out and "GLIBCXX_3.4." in out and "cmake" in out


@pytest.mark.parametrize(("value", "offline"), [("1", True), (" ON ", True), ("off", False), ("", False), ("0", False)])
def test_offline_reads_on_and_off(monkeypatch: pytest.MonkeyPatch, value: str, offline: bool) -> None:
    monkeypatch.setenv("LOCALLLM_OFFLINE", value)
    assert settings.offline() is offline


def test_an_offline_value_neither_on_nor_off_is_an_error_never_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: read as off, so an air-gapped machine's LOCALLLM_OFFLINE=enabled opened sockets
    monkeypatch.setenv("LOCALLLM_OFFLINE", "enabled")
    with pytest.raises(FetchError, match="LOCALLLM_OFFLINE='enabled' is neither on"):
        settings.offline()
    code, _, err = _run(capsys, "fetch", "model", "gemma-3-270m")
    assert code == 1 and "LOCALLLM_OFFLINE='enabled'" in err and "bug in localllm" not in err
    code, out, _ = _run(capsys, "doctor", "--json")  # doctor shows it, and goes on
    assert code == 0 and json.loads(out)["settings"]["offline"].startswith("invalid: LOCALLLM_OFFLINE='enabled'")


def test_prune_and_rm_never_follow_a_symlinked_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "user"
    (outside / "photos").mkdir(parents=True)
    (outside / "notes.txt").write_text("precious")
    (outside / "photos" / "a.jpg").write_text("pic")
    layout = cache_layout()
    key_dir = layout.model_path(load_pins().model("gemma-3-270m")).parent
    key_dir.parent.mkdir(parents=True)
    key_dir.symlink_to(outside)  # a user "links in" a directory holding the GGUF

    code, out, _ = _run(capsys, "cache", "prune", "--json")
    assert code == 0 and json.loads(out)["removed"] == []
    code, _, _ = _run(capsys, "cache", "rm", "gemma-3-270m")
    assert code != 0
    assert sorted(p.name for p in outside.rglob("*")) == ["a.jpg", "notes.txt", "photos"]


def test_directory_or_fifo_where_a_file_belongs_is_corrupt(capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.managed import verify
    from localllm.managed.inventory import NOT_REGULAR

    path = cache_layout().model_path(load_pins().model("gemma-3-270m"))
    path.mkdir(parents=True)
    code, out, _ = _run(capsys, "cache", "verify", "--no-refetch", "--json")
    [entry] = json.loads(out)["entries"]
    assert code == 1 and (entry["status"], entry["detail"]) == ("corrupt", NOT_REGULAR)
    code, out, _ = _run(capsys, "cache", "rm", "gemma-3-270m", "--json")
    assert code == 0 and not path.exists()

    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    code, out, _ = _run(capsys, "cache", "verify", "--no-refetch", "--json")  # hung before
    [entry] = json.loads(out)["entries"]
    assert code == 1 and (entry["status"], entry["detail"]) == ("corrupt", NOT_REGULAR)
    with pytest.raises(OSError):
        verify.sha256_file(path)
    with pytest.raises(OSError):
        verify.sha256_file(path.parent)


def test_verify_reports_a_marker_without_manifest_corrupt(capsys: pytest.CaptureFixture[str]) -> None:
    rel = cache_layout().bin_dir / "llama-old-linux"
    rel.mkdir(parents=True)
    (rel / "llama-server").write_text("x")
    for marker in ({"kind": "prebuilt"}, {"kind": "prebuilt", "files": [], "links": {}}):
        (rel / MARKER).write_text(json.dumps(marker))
        code, out, _ = _run(capsys, "cache", "verify", "--no-refetch", "--json")
        [entry] = json.loads(out)["entries"]
        assert code == 1 and entry["status"] == "corrupt"
