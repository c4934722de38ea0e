"""``cache rm`` of an embedding store takes the store's own lock, so an indexer writing rows
in another process never has its store removed underneath it (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.embed.embedder import FakeEmbedder
from localllm.embed.store import Store
from localllm.errors import EmbedError, StoreUnavailable
from localllm.managed import inventory
from localllm.managed.cache import cache_layout
from localllm.managed.inventory import remove_entries
from localllm.managed.pins import load_pins
from tests.conftest import REPO

ROWS = 40

# Indexes ROWS texts in one batch; while it holds the store's lock (inside the embed step,
# the store file already created) it says so with a file and waits for a go-ahead file.
_INDEXER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from localllm.embed.embedder import FakeEmbedder
    from localllm.embed.store import Store, content_hash

    root, inside, go, n = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    emb = FakeEmbedder(16)

    def embed(batch):
        inside.touch()
        while not go.exists():
            time.sleep(0.01)
        return emb.embed(batch, "document")

    texts = {content_hash(f"t{i}"): f"t{i}" for i in range(n)}
    print(len(Store(emb.identity, root=root).vectors(texts, embed, batch=n)))
""")


class Indexer:
    """An indexing process paused inside the store's lock until :meth:`finish`."""

    def __init__(self, tmp_path: Path) -> None:
        self.inside, self.go = tmp_path / "inside", tmp_path / "go"
        script = tmp_path / "indexer.py"
        script.write_text(_INDEXER)
        self.store = Store(FakeEmbedder(16).identity, root=cache_layout().root / "embed")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(self.store.path.parent), str(self.inside), str(self.go), str(ROWS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},  # this checkout's localllm, like the test's
        )
        deadline = time.monotonic() + 60
        while not self.inside.exists():
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the indexer never reached its embed step"
            time.sleep(0.01)
        assert self.store.path.exists()

    def finish(self) -> int:
        """Let it commit; the rows it says it stored."""
        self.go.touch()
        out, errs = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, errs
        return int(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[Indexer]:
    running = Indexer(tmp_path)
    try:
        yield running
    finally:
        running.kill()


def test_cache_rm_of_a_store_being_indexed_gives_up_and_removes_nothing(indexer: Indexer) -> None:
    with pytest.raises(StoreUnavailable) as info:
        remove_entries(cache_layout(), load_pins(), indexer.store.path.name, store_wait=0.3)
    assert (info.value.reason, info.value.path) == ("locked", str(indexer.store.path))
    assert indexer.store.path.exists()
    assert indexer.finish() == ROWS
    indexer.store.verify()
    assert indexer.store.count() == ROWS  # every row the indexer committed is there


def test_cache_rm_waits_for_the_indexer_then_removes_the_whole_store(indexer: Indexer) -> None:
    notices: list[str] = []
    result: list[object] = []

    def rm() -> None:
        try:
            result.extend(remove_entries(cache_layout(), load_pins(), indexer.store.path.name, log=notices.append))
        except BaseException as exc:  # handed to the test thread
            result.append(exc)

    thread = threading.Thread(target=rm)
    thread.start()
    deadline = time.monotonic() + 30
    while not notices and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting_while_held = thread.is_alive() and indexer.store.path.exists()
    rows = indexer.finish()
    thread.join(timeout=60)
    assert (len(notices), waiting_while_held) == (1, True)
    [entry] = result
    assert isinstance(entry, inventory.Entry) and (entry.kind, entry.status) == ("store", "removed")
    assert rows == ROWS
    db = indexer.store.path
    leftovers = sorted(p.name for p in db.parent.iterdir())
    assert leftovers == [indexer.store.lock_path.name]  # the database and its journal are gone; the lock stays
    assert indexer.store.count() == 0


def test_cli_cache_rm_of_a_locked_store_exits_1_with_the_store_error(
    indexer: Indexer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(inventory, "STORE_RM_WAIT", 0.2)
    assert main(["cache", "rm", indexer.store.path.name, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["kind"]) == (False, "store_unavailable")
    assert indexer.store.path.exists()
    assert indexer.finish() == ROWS
    assert indexer.store.count() == ROWS


def test_a_second_writer_gives_up_on_the_held_store_lock_with_an_embed_error(indexer: Indexer) -> None:
    other = Store(indexer.store.identity, root=indexer.store.path.parent, lock_timeout=0.2)
    with pytest.raises(EmbedError) as info:
        other.vectors({"h": "t"}, lambda texts: pytest.fail("embedded without the lock"))
    assert info.value.hint  # says what to do
    assert indexer.finish() == ROWS
    assert other.count() == ROWS
