"""Source build orchestration with a fake cmake on PATH (the real build is an e2e test)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from localllm import _process, cli
from localllm.errors import BuildError, ChecksumMismatch, OfflineArtifactMissing
from localllm.managed import cache_layout, platforms
from localllm.managed import source_build as sb
from localllm.managed.cache import read_marker
from localllm.managed.pins import Artifact, Pins, load_pins
from tests.unit.fakes.release_archives import SERVER_SCRIPT, make_tar

FAKE_CMAKE = r"""
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_CMAKE_CALLS"], "a") as fh:
    fh.write(json.dumps(args) + "\n")
if args[0] == "-S":
    src, build, flags = args[1], Path(args[3]), args[4:]
    build.mkdir(parents=True, exist_ok=True)
    lines = [f"CMAKE_HOME_DIRECTORY:INTERNAL={src}"]
    lines += [f"{f[2:].split('=', 1)[0]}:STRING={f[2:].split('=', 1)[1]}" for f in flags]
    (build / "CMakeCache.txt").write_text("\n".join(lines) + "\n")
    print("-- Configuring done")
elif args[0] == "--build":
    if os.environ.get("FAKE_CMAKE_FAIL"):
        print("src/llama.cpp:1: error: boom")
        sys.exit(2)
    out = Path(args[1]) / "bin"
    out.mkdir(parents=True, exist_ok=True)
    (out / "llama-server").write_bytes(SERVER)
    (out / "llama-server").chmod(0o755)
    (out / "libllama.so.0.5.0").write_bytes(b"lib")
    for link, target in (("libllama.so.0", "libllama.so.0.5.0"), ("libllama.so", "libllama.so.0")):
        if not (out / link).is_symlink():
            (out / link).symlink_to(target)
    (out / "llama-cli").write_text("not installed")
    print("[100%] Built target llama-server")
"""

VERSION = load_pins().source.version
TOP = f"llama_cpp_python-{VERSION}"


@pytest.fixture
def fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    script = bindir / "cmake"
    script.write_text(f"#!{sys.executable}\nSERVER = {SERVER_SCRIPT!r}\n{FAKE_CMAKE}")
    script.chmod(0o755)
    calls = tmp_path / "cmake-calls.jsonl"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CMAKE_CALLS", str(calls))
    return calls


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def sdist(tmp_path: Path) -> tuple[Path, Pins]:
    """A fake sdist in a mirror dir, and pins whose source entry points at it."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    archive = make_tar(
        mirror / f"{TOP}.tar.gz",
        [
            (f"{TOP}/pyproject.toml", "file", b"[project]\n", 0o644),
            (f"{TOP}/vendor/llama.cpp/CMakeLists.txt", "file", b"project(llama.cpp)\n", 0o644),
            (f"{TOP}/vendor/llama.cpp/tools/server/server.cpp", "file", b"int main(){}\n", 0o644),
        ],
    )
    base = load_pins()
    art = Artifact(
        name="llama-cpp-python sdist",
        file=archive.name,
        sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
        pin_key="source",
    )
    return mirror, dataclasses.replace(base, source=dataclasses.replace(base.source, artifact=art))


def _build(pins: Pins, mirror: Path, **kw: Any) -> Path:
    return sb.build_from_source(
        pins=pins, layout=cache_layout(), mirrors=[str(mirror)], offline=False, log=lambda m: None, **kw
    )


def test_build_installs_the_release_layout_and_reruns_incrementally(fake_cmake: Path, sdist: tuple[Path, Pins]) -> None:
    mirror, pins = sdist
    layout = cache_layout()
    dest = _build(pins, mirror)
    assert dest == layout.source_release_dir(VERSION, platforms.current().slug)
    assert sorted(p.name for p in dest.iterdir()) == [
        ".localllm-release.json",
        "libllama.so",
        "libllama.so.0",
        "libllama.so.0.5.0",
        "llama-server",
    ]
    assert os.readlink(dest / "libllama.so") == "libllama.so.0"
    marker = read_marker(dest)
    assert marker is not None and marker["kind"] == "source" and marker["version"] == "version: 9999 (fake)"
    paths = sb.source_paths(layout, pins.source)
    configure, build = _calls(fake_cmake)
    assert configure == ["-S", str(paths["llama_cpp"]), "-B", str(paths["build"]), *sb.CMAKE_FLAGS]
    assert build[:4] == ["--build", str(paths["build"]), "--target", "llama-server"]
    assert "-DCMAKE_INSTALL_RPATH=$ORIGIN" in configure and "-DLLAMA_CURL=OFF" in configure
    log = paths["log"].read_text()
    assert log.count("EXIT 0") == 2 and "Built target llama-server" in log
    # Installed: nothing runs again.
    assert _build(pins, mirror) == dest
    assert len(_calls(fake_cmake)) == 2
    # Install dir gone, build tree kept: configure is skipped, the build re-run (a no-op for cmake).
    import shutil

    shutil.rmtree(dest)
    _build(pins, mirror)
    assert [c[0] for c in _calls(fake_cmake)] == ["-S", "--build", "--build"]


def test_failed_build_reports_the_log_and_installs_nothing(
    fake_cmake: Path, sdist: tuple[Path, Pins], monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, pins = sdist
    monkeypatch.setenv("FAKE_CMAKE_FAIL", "1")
    with pytest.raises(BuildError) as info:
        _build(pins, mirror)
    log = sb.source_paths(cache_layout(), pins.source)["log"]
    assert str(log) in str(info.value) and "error: boom" in str(info.value)
    assert "EXIT 2" in log.read_text()
    bin_dir = cache_layout().bin_dir
    assert not bin_dir.exists() or list(bin_dir.iterdir()) == []


def test_missing_tools_name_the_packages(monkeypatch: pytest.MonkeyPatch, sdist: tuple[Path, Pins]) -> None:
    mirror, pins = sdist
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BuildError) as info:
        _build(pins, mirror)
    assert "cmake" in str(info.value) and "C++ compiler" in str(info.value)
    for words in ("apt-get install cmake build-essential", "dnf install cmake gcc gcc-c++ make", "brew install cmake"):
        assert words in info.value.hint


def test_sdist_falls_back_to_pip_download_and_is_verified(
    sdist: tuple[Path, Pins], monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, pins = sdist
    good = (mirror / f"{TOP}.tar.gz").read_bytes()
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **kw: object) -> _process.ProbeResult:
        seen.append(argv)
        dest = Path(argv[argv.index("--dest") + 1])
        (dest / f"{TOP}.tar.gz").write_bytes(payload)
        return _process.ProbeResult(returncode=0, output="Saved")

    monkeypatch.setattr(_process, "run_probe", fake_run)
    layout = cache_layout()
    payload = b"tampered"
    with pytest.raises(ChecksumMismatch):
        sb.acquire_sdist(pins.source, layout=layout, mirrors=[], offline=False, log=lambda m: None)
    assert not layout.sdist_path(pins.source).exists()
    assert [p.name for p in layout.sdist_path(pins.source).parent.iterdir()] == []
    payload = good
    path = sb.acquire_sdist(pins.source, layout=layout, mirrors=[], offline=False, log=lambda m: None)
    assert path.read_bytes() == good
    argv = seen[-1]
    assert argv[:3] == [sys.executable, "-m", "pip"]
    assert argv[4] == "--no-deps" and argv[argv.index("--no-binary") + 1] == ":all:"
    assert argv[-1] == f"llama-cpp-python=={VERSION}"


def test_offline_source_build_without_sdist_names_the_prewarm(
    sdist: tuple[Path, Pins], monkeypatch: pytest.MonkeyPatch
) -> None:
    _mirror, pins = sdist
    monkeypatch.setattr(_process, "run_probe", lambda *a, **k: pytest.fail("pip must not run offline"))
    with pytest.raises(OfflineArtifactMissing) as info:
        sb.acquire_sdist(pins.source, layout=cache_layout(), mirrors=[], offline=True, log=lambda m: None)
    assert "localllm fetch server --from-source" in info.value.hint


def test_cli_fetch_server_from_source(
    fake_cmake: Path,
    sdist: tuple[Path, Pins],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mirror, pins = sdist
    data = json.loads((Path(__file__).resolve().parents[2] / "pins" / "artifacts.json").read_text())
    data["source"]["sha256"] = pins.source.artifact.sha256
    custom = tmp_path / "pins.json"
    custom.write_text(json.dumps(data))
    monkeypatch.setattr("localllm.managed.pins.default_pins_path", lambda: custom)
    assert cli.main(["fetch", "server", "--from-source", "--mirror", str(mirror), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "source" and out["release"] == f"source-{VERSION}"
    assert Path(out["binary"]).is_file()
    # Without --from-source the cached source build is found (no prebuilt fetch attempted).
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    assert cli.main(["fetch", "server"]) == 0
    assert capsys.readouterr().out.strip() == out["binary"]


def test_configured_reads_the_cmake_cache(tmp_path: Path) -> None:
    build = tmp_path / "b"
    build.mkdir()
    src = tmp_path / "src"
    lines = [f"CMAKE_HOME_DIRECTORY:INTERNAL={src}"] + [
        f"{f[2:].split('=')[0]}:BOOL={f[2:].split('=', 1)[1]}" for f in sb.CMAKE_FLAGS
    ]
    (build / "CMakeCache.txt").write_text("// comment\n" + "\n".join(lines) + "\n")
    assert sb._configured(build, src)
    assert not sb._configured(build, tmp_path / "other")
    (build / "CMakeCache.txt").write_text("\n".join(lines).replace("LLAMA_CURL:BOOL=OFF", "LLAMA_CURL:BOOL=ON"))
    assert not sb._configured(build, src)


def test_a_build_step_past_its_timeout_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    from tests.conftest import pid_gone

    pidfile = tmp_path / "pids"
    step = tmp_path / "make"
    step.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {shlex.quote(str(pidfile))}\nsleep 60\n")
    step.chmod(0o755)
    log_path = tmp_path / "build.log"
    with pytest.raises(BuildError, match="timed out"):
        sb._run_logged([str(step)], log_path, cwd=tmp_path, timeout=0.5)
    assert pid_gone(int(pidfile.read_text()), within=2.0)
    assert log_path.read_text().rstrip().endswith("EXIT killed")


def test_x86_builds_never_use_amx() -> None:
    # -march=native on a CPU that reports AMX inside a VM that does not enable it built a
    # server that died of SIGILL on its first matmul; the flags keep AMX out of every build.
    import platform

    from localllm.managed import source_build

    flags = dict(f[2:].partition("=")[::2] for f in source_build.CMAKE_FLAGS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        for key in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
            assert set(flags[key].split()) >= {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"}
    else:
        assert "CMAKE_C_FLAGS" not in flags


def test_the_build_logs_numbered_stages_with_elapsed_time(fake_cmake: Path, sdist: tuple[Path, Pins]) -> None:
    """issue 10 item 26: a 15-minute build says where it is and how long each stage took."""
    mirror, pins = sdist
    lines: list[str] = []
    sb.build_from_source(pins=pins, layout=cache_layout(), mirrors=[str(mirror)], offline=False, log=lines.append)
    starts = [line.split(" ", 1)[0] for line in lines if line.startswith("[") and " done in " not in line]
    dones = [line for line in lines if " done in " in line]
    assert starts == [f"[{n}/5]" for n in range(1, 6)]
    assert [d.split(" ", 1)[0] for d in dones] == starts
    assert all(d.endswith("s") for d in dones)


def test_a_long_build_step_reports_elapsed_time_and_cmake_percent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beats = _beats_until(tmp_path, monkeypatch, "[ 42%] Building CXX object", "42%")
    assert beats and all("elapsed" in b for b in beats)
    assert "42%" in beats[-1]


def _beats_until(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, seen: str) -> list[str]:
    """The heartbeats of a build step that prints ``line``, then runs until a beat shows
    ``seen`` (at most 30 s): on a loaded machine a fixed sleep ended before any beat had read
    the line."""
    done = tmp_path / "seen"
    step = tmp_path / "step"
    step.write_text(
        f"#!{sys.executable}\nimport os, time\nprint({line!r}, flush=True)\n"
        f"end = time.monotonic() + 30\nwhile not os.path.exists({str(done)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.05)\n"
    )
    step.chmod(0o755)
    monkeypatch.setattr(sb, "_HEARTBEAT", 0.3)
    beats: list[str] = []

    def beat(text: str) -> None:
        beats.append(text)
        if seen in text:
            done.touch()

    sb._run_logged([str(step)], tmp_path / "build.log", cwd=tmp_path, progress=beat)
    return beats


def test_the_heartbeat_extrapolates_an_eta_from_cmakes_percentage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sb._with_eta(", 25%", 60.0) == ", 25%, about 3m00s left"
    assert sb._with_eta(", 2%", 60.0) == ", 2%"  # too early to extrapolate
    assert sb._with_eta("", 60.0) == ""
    beats = _beats_until(tmp_path, monkeypatch, "[ 50%] Building", "left")
    assert "left" in beats[-1]


def test_fetch_server_builds_from_source_when_no_prebuilt_is_reachable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from localllm.errors import DownloadFailed
    from localllm.managed import acquire
    from localllm.managed.release import ServerInstall

    asked: list[bool] = []

    def ensure(*, from_source: bool = False, mirror: str | None = None) -> ServerInstall:
        asked.append(from_source)
        if not from_source:
            raise DownloadFailed("download of llama-b9444.tar.gz from https://x: host name not resolved")
        return ServerInstall(binary=tmp_path / "llama-server", release_dir=tmp_path, release="s", source="source")

    monkeypatch.setattr(acquire, "ensure_server", ensure)
    assert cli.main(["fetch", "server"]) == 0
    captured = capsys.readouterr()
    assert asked == [False, True]
    assert captured.out.strip() == str(tmp_path / "llama-server")
    assert "error" not in captured.err  # progress, not an error line
    assert "building llama-server from the pinned source" in captured.err
    asked.clear()
    assert cli.main(["fetch", "server", "--prebuilt-only"]) == 1
    assert asked == [False]
