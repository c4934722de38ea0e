"""Hostile things in the cache beside a download (a loopback server, no internet): a symlink,
a FIFO or a directory where the fetcher keeps its partial file, its resume record or a
file's `.verified` stamp. The fetch never writes through a link, never waits on a pipe,
and never raises a bare ``OSError``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path

import pytest

from localllm import cli
from localllm.errors import DownloadFailed, FetchError
from localllm.managed import fetch as fetch_mod
from localllm.managed import verify
from localllm.managed.fetch import fetch_artifact, partial_path
from localllm.managed.pins import Artifact
from tests.unit.fakes.http_server import ArchiveServer

DATA = os.urandom(300_000)
NAME = "m.gguf"
SHA = hashlib.sha256(DATA).hexdigest()
#: bounds a fetch that hangs (a loopback download of 300 KB takes well under a second)
HANG = 20.0


def _artifact(url: str) -> Artifact:
    return Artifact(name="m", file=NAME, sha256=SHA, url=url, size=len(DATA))


def _fetch(art: Artifact, dest: Path) -> Path:
    return fetch_artifact(
        art, dest, lock_path=dest.parent.parent / "x.lock", log=lambda _: None, backoff=0.01, progress=False
    )


def _fetch_bounded(art: Artifact, dest: Path, fifo: Path) -> tuple[bool, object]:
    """Run the fetch in a thread; (hung, outcome). A fetch blocked opening ``fifo`` is
    released after :data:`HANG` s by a writer that opens and closes it."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(_fetch(art, dest))
        except Exception as exc:  # reported to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    hung = thread.is_alive()
    if hung:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(HANG)
    return hung, outcome[0] if outcome else None


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    path = tmp_path / "cache" / NAME
    path.parent.mkdir()
    return path


def test_a_symlink_at_the_partial_is_removed_not_written_through(tmp_path: Path, dest: Path) -> None:
    user = tmp_path / "user.txt"
    user.write_bytes(b"precious\n" * 10)
    partial = partial_path(dest, SHA)
    partial.symlink_to(user)
    with ArchiveServer({NAME: DATA}) as srv:
        assert _fetch(_artifact(srv.url(NAME)), dest) == dest
    assert user.read_bytes() == b"precious\n" * 10  # was truncated, then held the model
    assert not dest.is_symlink() and dest.read_bytes() == DATA  # was a link to the user's file
    assert sorted(os.listdir(dest.parent)) == [NAME, NAME + ".verified"]


@pytest.mark.parametrize("where", ["stamp", "resume record", "partial"])
def test_a_fifo_beside_the_download_is_not_waited_on(dest: Path, where: str) -> None:
    partial = partial_path(dest, SHA)
    fifo = {
        "stamp": verify.stamp_path(dest),
        "resume record": partial.with_name(partial.name + ".json"),
        "partial": partial,
    }[where]
    os.mkfifo(fifo)
    with ArchiveServer({NAME: DATA}) as srv:
        hung, outcome = _fetch_bounded(_artifact(srv.url(NAME)), dest, fifo)
    assert not hung
    assert outcome == dest and dest.read_bytes() == DATA
    assert sorted(os.listdir(dest.parent)) == [NAME, NAME + ".verified"]


def test_a_fifo_at_the_stamp_of_a_cached_file_is_not_trusted_or_waited_on(dest: Path) -> None:
    dest.write_bytes(DATA)
    fifo = verify.stamp_path(dest)
    os.mkfifo(fifo)
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(verify.stamp_matches(dest, SHA)), daemon=True)
    thread.start()
    thread.join(HANG)
    hung = thread.is_alive()
    if hung:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(HANG)
    assert not hung and outcome == [False]


@pytest.mark.parametrize("where", ["partial", "resume record", "stamp", "stamp of a cached file"])
def test_a_directory_beside_the_download_is_a_fetch_error_naming_it(dest: Path, where: str) -> None:
    partial = partial_path(dest, SHA)
    directory = {
        "partial": partial,
        "resume record": partial.with_name(partial.name + ".json"),
        "stamp": verify.stamp_path(dest),
        "stamp of a cached file": verify.stamp_path(dest),
    }[where]
    directory.mkdir()
    if where == "stamp of a cached file":
        dest.write_bytes(DATA)
    (directory / "keep").write_text("x")
    with ArchiveServer({NAME: DATA}) as srv:
        with pytest.raises(FetchError) as info:
            _fetch(_artifact(srv.url(NAME)), dest)
        assert srv.gets(NAME) == []  # refused before any source is tried
    assert str(directory) in str(info.value)  # was a bare IsADirectoryError
    assert (directory / "keep").read_text() == "x"
    # a stamp directory: the model was downloaded, then the source blamed and the next one tried
    assert dest.exists() == (where == "stamp of a cached file")


def test_a_symlinked_artifact_directory_is_refused_and_the_users_file_kept(tmp_path: Path) -> None:
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / NAME).write_bytes(b"my notes")
    dest = tmp_path / "cache" / "models" / "m" / SHA[:16] / NAME
    dest.parent.parent.mkdir(parents=True)
    dest.parent.symlink_to(user_dir)
    with ArchiveServer({NAME: DATA}) as srv:
        with pytest.raises(FetchError) as info:
            _fetch(_artifact(srv.url(NAME)), dest)
        assert srv.gets(NAME) == []
    assert str(dest.parent) in str(info.value)
    assert (user_dir / NAME).read_bytes() == b"my notes"  # was replaced by the model
    assert sorted(os.listdir(user_dir)) == [NAME]


def test_a_symlinked_artifact_directory_holding_the_right_file_is_used(tmp_path: Path) -> None:
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / NAME).write_bytes(DATA)
    dest = tmp_path / "cache" / "models" / "m" / SHA[:16] / NAME
    dest.parent.parent.mkdir(parents=True)
    dest.parent.symlink_to(user_dir)
    assert _fetch(_artifact("http://127.0.0.1:9/never"), dest) == dest
    assert (user_dir / NAME).read_bytes() == DATA


PASSWORD = "s3cr3t-Pw-9"


def test_a_mirror_password_is_never_shown(
    tmp_path: Path, dest: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[str] = []
    wrong = os.urandom(len(DATA))  # the mirror serves other bytes: a sha256 mismatch names its URL
    with ArchiveServer({NAME: wrong}) as srv:
        mirror = srv.base_url.replace("http://", f"http://user:{PASSWORD}@")
        art = _artifact("http://127.0.0.1:9/" + NAME)  # nothing listens there
        with pytest.raises(DownloadFailed) as info:
            fetch_artifact(art, dest, lock_path=tmp_path / "x.lock", mirrors=[mirror], log=lines.append, backoff=0.01)
        assert srv.gets(NAME)  # the mirror was asked
        # a download cut short keeps its resume record, which names where the bytes came from
        real = fetch_mod._FileDownload._write

        def write(self: fetch_mod._FileDownload, block: bytes) -> None:
            real(self, block)
            raise KeyboardInterrupt

        monkeypatch.setattr(fetch_mod._FileDownload, "_write", write)
        with pytest.raises(KeyboardInterrupt):
            fetch_artifact(art, dest, lock_path=tmp_path / "x.lock", mirrors=[mirror], log=lines.append, backoff=0.01)
    record = partial_path(dest, SHA).with_name(partial_path(dest, SHA).name + ".json")
    monkeypatch.setenv("LOCALLLM_MIRROR", mirror)
    assert cli.main(["doctor", "--json"]) == 0
    shown = [str(info.value), info.value.hint, *lines, record.read_text(), capsys.readouterr().out]
    assert [text for text in shown if PASSWORD in text] == []  # was in 5 log lines, the error and doctor
    assert any("user:***@" in text for text in shown)
