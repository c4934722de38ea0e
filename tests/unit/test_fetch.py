"""Verified, resumable, lock-safe downloads against a real loopback HTTP server."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localllm.errors import (
    ChecksumMismatch,
    DownloadFailed,
    FetchError,
    InsufficientSpace,
    OfflineArtifactMissing,
    PinNotConfigured,
)
from localllm.managed import verify
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact
from tests.unit.fakes.http_server import ArchiveServer
from tests.unit.fakes.release_archives import make_tar, release_members

REPO = Path(__file__).resolve().parents[2]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def archive_bytes(tmp_path: Path) -> bytes:
    # A real release archive with SONAME symlinks, padded so cuts land mid-body.
    members = [*release_members(), ("llama-b9999/libggml.so.0.9.0", "file", os.urandom(600_000), 0o755)]
    return make_tar(tmp_path / "src.tar.gz", members).read_bytes()


def _artifact(data: bytes, url: str | None, file: str = "llama-test.tar.gz") -> Artifact:
    return Artifact(name="llama-server test", file=file, sha256=_sha(data), url=url)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


def _fetch(art: Artifact, dest: Path, log: Log, **kw: object) -> Path:
    return fetch_artifact(art, dest, lock_path=dest.parent / "x.lock", log=log, backoff=0.01, progress=False, **kw)  # type: ignore[arg-type]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_happy_path_downloads_verifies_and_stamps(tmp_path: Path, archive_bytes: bytes) -> None:
    log = Log()
    dest = tmp_path / "cache" / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv:
        art = _artifact(archive_bytes, srv.url("llama-test.tar.gz"))
        assert _fetch(art, dest, log) == dest
        assert dest.read_bytes() == archive_bytes
        assert verify.stamp_matches(dest, art.sha256 or "")
        assert "downloading llama-server test (" in log.text()
        assert f"from {srv.url('llama-test.tar.gz')}" in log.text()
        # Cached: no second request, no second announcement.
        _fetch(art, dest, log)
        assert len(srv.gets("llama-test.tar.gz")) == 1
    assert log.text().count("downloading") == 1
    assert _leftovers(dest.parent) == []


def test_sha_mismatch_leaves_cache_untouched(tmp_path: Path, archive_bytes: bytes) -> None:
    log = Log()
    cache = tmp_path / "cache"
    cache.mkdir()
    dest = cache / "llama-test.tar.gz"
    wrong = "0" * 64
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv:
        art = Artifact(name="x", file="llama-test.tar.gz", sha256=wrong, url=srv.url("llama-test.tar.gz"))
        with pytest.raises(ChecksumMismatch) as info:
            fetch_artifact(art, dest, lock_path=tmp_path / "x.lock", log=log, progress=False)
    assert info.value.expected == wrong
    assert info.value.actual == _sha(archive_bytes)
    assert wrong in str(info.value) and _sha(archive_bytes) in str(info.value)
    assert list(cache.iterdir()) == []


def test_cli_prints_expected_and_actual_hash(
    tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localllm import cli

    pins = json.loads((REPO / "pins" / "artifacts.json").read_text())
    wrong = "ab" * 32
    pins["models"]["entries"]["gemma-3-270m"]["sha256"] = wrong
    pins["models"]["entries"]["gemma-3-270m"]["size"] = len(archive_bytes)  # right size, wrong bytes
    custom = tmp_path / "pins.json"
    custom.write_text(json.dumps(pins))
    monkeypatch.setattr("localllm.managed.pins.default_pins_path", lambda: custom)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "gemma-3-270m-q4_k_m.gguf").write_bytes(archive_bytes)
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # the mirror is a directory: no network at all
    code = cli.main(["fetch", "model", "gemma-3-270m", "--mirror", str(mirror)])
    err = capsys.readouterr().err
    assert code == 1
    assert wrong in err and _sha(archive_bytes) in err
    models = Path(os.environ["LOCALLLM_CACHE_DIR"]) / "models"
    assert [p for p in models.rglob("*") if p.is_file()] == []


def test_cut_mid_body_resumes_from_the_offset(tmp_path: Path, archive_bytes: bytes) -> None:
    log = Log()
    dest = tmp_path / "llama-test.tar.gz"
    cut = 300_000
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, cut_after=cut) as srv:
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), dest, log)
        reqs = srv.gets("llama-test.tar.gz")
    assert dest.read_bytes() == archive_bytes
    assert [(r.range, r.status) for r in reqs] == [(None, 200), (f"bytes={cut}-", 206)]
    assert f"retrying from byte {cut}" in log.text()


def test_server_ignoring_range_restarts_from_zero(tmp_path: Path, archive_bytes: bytes) -> None:
    log = Log()
    dest = tmp_path / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, cut_after=250_000, ignore_range=True) as srv:
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), dest, log)
        reqs = srv.gets("llama-test.tar.gz")
    assert dest.read_bytes() == archive_bytes
    assert [(r.range, r.status) for r in reqs] == [(None, 200), ("bytes=250000-", 200)]
    assert "ignored the Range request; restarting" in log.text()


def test_repeated_cuts_with_progress_still_finish(tmp_path: Path, archive_bytes: bytes) -> None:
    dest = tmp_path / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, cut_after=100_000, cuts=6) as srv:
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), dest, Log(), retries=2)
        assert len(srv.gets("llama-test.tar.gz")) >= 7
    assert dest.read_bytes() == archive_bytes


def test_transient_errors_are_retried_with_a_bound(tmp_path: Path, archive_bytes: bytes) -> None:
    dest = tmp_path / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, fail_first=2) as srv:
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), dest, Log(), retries=3)
        assert [r.status for r in srv.requests] == [503, 503, 200]
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, fail_first=100) as srv:
        with pytest.raises(DownloadFailed, match="after 3 attempts"):
            _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), tmp_path / "b.tar.gz", Log(), retries=2)
        assert len(srv.requests) == 3
    assert _leftovers(tmp_path) == []


def test_http_404_is_not_retried(tmp_path: Path, archive_bytes: bytes) -> None:
    with ArchiveServer({}) as srv:
        with pytest.raises(DownloadFailed, match="HTTP 404"):
            _fetch(_artifact(archive_bytes, srv.url("missing.tar.gz")), tmp_path / "m.tar.gz", Log())
        assert len(srv.requests) == 1


def test_connection_refused_fails_after_bounded_retries(tmp_path: Path, archive_bytes: bytes) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Log()
    with pytest.raises(DownloadFailed, match="ConnectError"):
        _fetch(_artifact(archive_bytes, f"http://127.0.0.1:{port}/x.tar.gz"), tmp_path / "x.tar.gz", log, retries=2)
    assert log.text().count("retrying") == 2


def test_mirror_directory_is_tried_before_the_url(tmp_path: Path, archive_bytes: bytes) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "llama-test.tar.gz").write_bytes(archive_bytes)
    dest = tmp_path / "cache" / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv:
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), dest, Log(), mirrors=[str(mirror)])
        assert srv.requests == []
    assert dest.read_bytes() == archive_bytes


def test_mirror_url_by_file_name_then_pinned_url_on_bad_mirror(tmp_path: Path, archive_bytes: bytes) -> None:
    log = Log()
    dest = tmp_path / "llama-test.tar.gz"
    with (
        ArchiveServer({"llama-test.tar.gz": archive_bytes}) as good,
        ArchiveServer({"llama-test.tar.gz": b"tampered"}) as bad,
    ):
        _fetch(
            _artifact(archive_bytes, good.url("llama-test.tar.gz")), dest, log, mirrors=[bad.base_url + "/some/dir/"]
        )
        assert [r.name for r in bad.requests] == ["llama-test.tar.gz"]
        assert len(good.requests) == 1
    assert "sha256 mismatch" in log.text()
    assert dest.read_bytes() == archive_bytes


def test_offline_opens_no_socket(tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[object] = []

    def no_connect(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise AssertionError(f"socket connect attempted to {address}")

    with ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv:
        monkeypatch.setattr(socket.socket, "connect", no_connect)
        monkeypatch.setattr(socket.socket, "connect_ex", no_connect)
        art = _artifact(archive_bytes, srv.url("llama-test.tar.gz"))
        with pytest.raises(OfflineArtifactMissing) as info:
            _fetch(
                art,
                tmp_path / "llama-test.tar.gz",
                Log(),
                offline=True,
                mirrors=[srv.base_url, str(tmp_path / "empty-mirror")],
                prewarm="localllm fetch server",
            )
        monkeypatch.undo()
        assert srv.requests == []
    assert attempts == []
    assert "localllm fetch server" in info.value.hint
    assert "LOCALLLM_OFFLINE=1" in str(info.value)


def test_offline_still_uses_a_directory_mirror(
    tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "llama-test.tar.gz").write_bytes(archive_bytes)
    monkeypatch.setattr(socket.socket, "connect", lambda *a: pytest.fail("socket opened"))
    dest = tmp_path / "c" / "llama-test.tar.gz"
    _fetch(
        _artifact(archive_bytes, "https://example.invalid/x"), dest, Log(), offline=True, mirrors=[f"file://{mirror}"]
    )
    assert dest.read_bytes() == archive_bytes


def test_free_space_is_checked_against_content_length(
    tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=len(archive_bytes) // 2))
    with (
        ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv,
        pytest.raises(InsufficientSpace, match="not enough free space"),
    ):
        _fetch(_artifact(archive_bytes, srv.url("llama-test.tar.gz")), tmp_path / "l.tar.gz", Log())
    assert _leftovers(tmp_path) == []
    assert not (tmp_path / "l.tar.gz").exists()


def test_no_sha_never_downloads(tmp_path: Path) -> None:
    with ArchiveServer({"bge.gguf": b"x"}) as srv:
        art = Artifact(
            name="model bge", file="bge.gguf", sha256=None, url=srv.url("bge.gguf"), pin_key="models.entries.bge"
        )
        with pytest.raises(PinNotConfigured, match=r"models\.entries\.bge\.sha256"):
            _fetch(art, tmp_path / "bge.gguf", Log())
        assert srv.requests == []


def test_mirror_only_without_mirror_says_how_to_provide_one(tmp_path: Path) -> None:
    art = Artifact(name="model m", file="m.gguf", sha256="a" * 64, url=None)
    with pytest.raises(DownloadFailed, match="mirror only") as info:
        _fetch(art, tmp_path / "m.gguf", Log())
    assert "LOCALLLM_MIRROR" in info.value.hint


def test_corrupt_cached_file_is_replaced(tmp_path: Path, archive_bytes: bytes) -> None:
    dest = tmp_path / "llama-test.tar.gz"
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}) as srv:
        art = _artifact(archive_bytes, srv.url("llama-test.tar.gz"))
        _fetch(art, dest, Log())
        dest.write_bytes(b"corrupted")  # mtime and size change: the stamp no longer matches
        _fetch(art, dest, Log())
        assert len(srv.requests) == 2
    assert dest.read_bytes() == archive_bytes


_WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from localllm.managed.fetch import fetch_artifact
    from localllm.managed.pins import Artifact
    url, sha, dest, lock = sys.argv[1:5]
    art = Artifact(name="shared artifact", file=Path(dest).name, sha256=sha, url=url)
    path = fetch_artifact(art, Path(dest), lock_path=Path(lock), progress=False)
    print(path)
""")


@pytest.mark.slow
def test_eight_processes_download_once_and_all_succeed(tmp_path: Path, archive_bytes: bytes) -> None:
    dest = tmp_path / "cache" / "llama-test.tar.gz"
    # Slow enough (~2 s) that the eight processes overlap with the one downloading.
    with ArchiveServer({"llama-test.tar.gz": archive_bytes}, delay=0.2) as srv:
        argv = [
            sys.executable,
            "-c",
            _WORKER,
            srv.url("llama-test.tar.gz"),
            _sha(archive_bytes),
            str(dest),
            str(tmp_path / "locks" / "a.lock"),
        ]
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
        results = [p.communicate(timeout=120) for p in procs]
        gets = srv.gets("llama-test.tar.gz")
    assert [p.returncode for p in procs] == [0] * 8, [e for _o, e in results]
    assert {o.strip() for o, _e in results} == {str(dest)}
    assert len(gets) == 1
    stderr = "".join(e for _o, e in results)
    assert stderr.count("downloading shared artifact") == 1
    assert "waiting for lock on shared artifact" in stderr
    assert dest.read_bytes() == archive_bytes
    assert _leftovers(dest.parent) == []


def test_a_cached_artifact_is_found_without_importing_httpx(tmp_path: Path) -> None:
    # every start after the first finds its server and model cached: that must not wait
    # for httpx (~50 ms of imports) before the server is spawned
    import subprocess
    import sys

    code = """
import hashlib, sys
from pathlib import Path
from localllm.managed import verify
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact
dest = Path(sys.argv[1]) / "m.gguf"
dest.write_bytes(b"weights")
sha = hashlib.sha256(b"weights").hexdigest()
verify.write_stamp(dest, sha)
art = Artifact(name="m", file="m.gguf", sha256=sha, url="https://example.invalid/m.gguf")
assert fetch_artifact(art, dest, lock_path=Path(sys.argv[1]) / "lock") == dest
print("httpx" in sys.modules)
"""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


@pytest.mark.parametrize("mirror", ["http://[::1", "https://[zz]/x"])
@pytest.mark.parametrize("from_env", [False, True])
def test_an_unparsable_mirror_url_is_a_fetch_error(
    tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch, mirror: str, from_env: bool
) -> None:
    if from_env:
        monkeypatch.setenv("LOCALLLM_MIRROR", mirror)
    with pytest.raises(FetchError) as info:  # a bare ValueError from urlparse before
        _fetch(_artifact(archive_bytes, None), tmp_path / "x.tar.gz", Log(), mirrors=[mirror])
    assert type(info.value) is FetchError
    assert ("LOCALLLM_MIRROR" if from_env else "--mirror") in (info.value.hint or "")


@pytest.mark.parametrize("failure", ["sha256", "404"])
def test_a_redirected_download_that_fails_names_the_final_url_too(
    tmp_path: Path, archive_bytes: bytes, failure: str
) -> None:
    # the error named only the URL asked for: a mirror redirecting to a stale or wrong host
    # looked like the mirror's own fault
    files = {"llama-test.tar.gz": archive_bytes} if failure == "sha256" else {}
    with ArchiveServer(files) as final, ArchiveServer({}, redirect_to=final.base_url + "/files") as mirror:
        art = _artifact(archive_bytes, mirror.url("llama-test.tar.gz"))
        if failure == "sha256":
            art = Artifact(name=art.name, file=art.file, sha256="0" * 64, url=art.url)
        with pytest.raises(FetchError) as info:
            _fetch(art, tmp_path / "m.tar.gz", Log())
        assert [r.status for r in mirror.requests] == [302]
        assert [r.status for r in final.requests] == [200 if failure == "sha256" else 404]
    error = info.value
    assert isinstance(error, ChecksumMismatch if failure == "sha256" else DownloadFailed)
    message = str(error)
    assert mirror.url("llama-test.tar.gz") in message
    assert final.base_url + "/files/llama-test.tar.gz" in message
    assert "SECRET" not in message  # a signed URL's query is not shown
    if isinstance(error, ChecksumMismatch):
        assert error.url == mirror.url("llama-test.tar.gz")
        assert error.final_url is not None and error.final_url.startswith(final.base_url + "/files/")
    assert _leftovers(tmp_path) == []
