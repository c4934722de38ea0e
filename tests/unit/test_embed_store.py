"""Store: zero re-embedding, per-file re-embedding, corruption detection, two processes at once."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from localllm.embed.corpus import Chunking, load_corpus, search
from localllm.embed.embedder import EmbedderIdentity, FakeEmbedder
from localllm.embed.registry import Role
from localllm.embed.store import Store, content_hash, store_key
from localllm.errors import DimensionMismatch, EmbedError, StoreCorrupt, StoreUnavailable
from tests.conftest import REPO


def _corpus(root: Path) -> None:
    (root / "docs" / "deep").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("# Alpha\nabout apples\n\n## Beta\nabout bananas\n")
    (root / "docs" / "deep" / "b.txt").write_text("cherries " * 400)  # several windows
    (root / "docs" / "c.md").write_text("# Gamma\ngrapes\n")


class CountingFake(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__(16)
        self.documents = 0

    def embed(self, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
        if role == "document":
            self.documents += len(texts)
        return super().embed(texts, role)


def _search(root: Path, emb: FakeEmbedder, query: str = "about apples") -> tuple[int, list[str]]:
    report = search(query, emb, ["docs/**/*"], base_dir=root, store_root=root / "store", top_k=3)
    return report.embedded, [h.id for h in report.hits]


def test_second_search_makes_zero_embedding_calls(tmp_path: Path) -> None:
    _corpus(tmp_path)
    first = CountingFake()
    n_embedded, hits = _search(tmp_path, first)
    chunks = len(load_corpus(["docs/**/*"], tmp_path).chunks)
    assert n_embedded == first.documents == chunks > 4
    second = CountingFake()  # a new process would start from nothing but the store
    again, hits2 = _search(tmp_path, second)
    assert again == 0 and second.documents == 0
    assert second.calls == 1  # the query only
    assert hits2 == hits


def test_editing_one_file_re_embeds_only_its_chunks(tmp_path: Path) -> None:
    _corpus(tmp_path)
    _search(tmp_path, CountingFake())
    (tmp_path / "docs" / "a.md").write_text("# Alpha\nabout apricots\n\n## Beta\nabout bananas\n")
    emb = CountingFake()
    n, hits = _search(tmp_path, emb, "# Alpha\nabout apricots\n\n")
    assert n == emb.documents == 1  # the "Alpha" section changed; "Beta" and the other files did not
    assert hits[0] == "docs/a.md#0"


def test_truncated_store_file_is_detected_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _corpus(tmp_path)
    _search(tmp_path, CountingFake())
    (db,) = (tmp_path / "store").glob("*.sqlite")
    size = db.stat().st_size
    with db.open("r+b") as fh:
        fh.truncate(size // 2)
    emb = CountingFake()
    n, _ = _search(tmp_path, emb)
    chunks = len(load_corpus(["docs/**/*"], tmp_path).chunks)
    assert n == emb.documents == chunks  # everything re-embedded, nothing trusted
    assert "corrupt" in caplog.text
    assert (db.parent / (db.name + ".corrupt")).exists()
    assert _search(tmp_path, CountingFake())[0] == 0  # and the rebuilt store is good


def test_a_flipped_vector_byte_is_caught_by_the_checksum(tmp_path: Path) -> None:
    ident = FakeEmbedder(4).identity
    store = Store(ident, {"w": 1}, root=tmp_path)
    emb = FakeEmbedder(4)
    texts = {content_hash(t): t for t in ("one", "two")}
    good = store.vectors(texts, lambda ts: emb.embed(ts, "document"))
    conn = sqlite3.connect(store.path)
    with conn:
        blob = bytearray(conn.execute("SELECT vector FROM vectors LIMIT 1").fetchone()[0])
        blob[0] ^= 0xFF
        conn.execute("UPDATE vectors SET vector = ? WHERE rowid = 1", (bytes(blob),))
    conn.close()
    with pytest.raises(StoreCorrupt, match="checksum"):
        store.verify()
    again = store.vectors(texts, lambda ts: emb.embed(ts, "document"))
    assert store.rebuilds == 1
    assert all(np.array_equal(good[h], again[h]) for h in texts)


def test_garbage_file_and_wrong_key_are_rebuilt(tmp_path: Path) -> None:
    ident = FakeEmbedder(4).identity
    store = Store(ident, root=tmp_path)
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(b"not a database at all" * 100)
    emb = FakeEmbedder(4)
    store.vectors({content_hash("x"): "x"}, lambda ts: emb.embed(ts, "document"))
    assert store.rebuilds == 1 and store.count() == 1
    other = Store(ident, {"window": 5}, root=tmp_path)
    other.path.parent.mkdir(exist_ok=True)
    other.path.write_bytes(store.path.read_bytes())  # a store written for another key
    other.vectors({content_hash("x"): "x"}, lambda ts: emb.embed(ts, "document"))
    assert other.rebuilds == 1


@pytest.mark.parametrize("target", ["empty", "database"])
def test_a_store_path_that_is_a_link_is_never_written_through(tmp_path: Path, target: str) -> None:
    """A link where the store goes (to a user's empty file, or to another store) is moved
    aside like a corrupt store: SQLite would have created or extended its target."""
    ident = FakeEmbedder(4).identity
    emb = FakeEmbedder(4)
    victim = tmp_path / "user" / "notes.db"
    victim.parent.mkdir()
    if target == "database":
        Store(ident, root=victim.parent).vectors({content_hash("y"): "y"}, lambda ts: emb.embed(ts, "document"))
        Store(ident, root=victim.parent).path.rename(victim)
    else:
        victim.write_bytes(b"")
    before = victim.read_bytes()
    store = Store(ident, root=tmp_path / "store")
    store.path.parent.mkdir(parents=True)
    store.path.symlink_to(victim)
    store.vectors({content_hash("x"): "x"}, lambda ts: emb.embed(ts, "document"))
    assert victim.read_bytes() == before
    assert not store.path.is_symlink() and store.count() == 1 and store.rebuilds == 1


def test_store_is_keyed_by_identity_and_chunking() -> None:
    a = EmbedderIdentity("m", 384, "mean", "", "")
    assert store_key(a, {"window": 2000}) != store_key(a, {"window": 1000})
    assert store_key(a) != store_key(EmbedderIdentity("m", 256, "mean", "", ""))
    assert store_key(a) != store_key(EmbedderIdentity("m", 384, "mean", "q: ", ""))
    assert store_key(a) != store_key(EmbedderIdentity("m", 384, "cls", "", ""))
    assert store_key(a, {"window": 2000}) == store_key(a, {"window": 2000})
    assert Store(a, Chunking().as_dict()).key != Store(a, Chunking(window=1000).as_dict()).key


def test_wrong_dims_from_the_embedder_are_refused(tmp_path: Path) -> None:
    store = Store(FakeEmbedder(4).identity, root=tmp_path)
    with pytest.raises(DimensionMismatch):
        store.vectors({content_hash("x"): "x"}, lambda ts: FakeEmbedder(8).embed(ts, "document"))
    assert store.count() == 0


def test_prune_keeps_only_the_given_hashes(tmp_path: Path) -> None:
    store = Store(FakeEmbedder(4).identity, root=tmp_path)
    emb = FakeEmbedder(4)
    texts = {content_hash(t): t for t in ("a", "b", "c")}
    store.vectors(texts, lambda ts: emb.embed(ts, "document"))
    assert store.prune({content_hash("a")}) == 2
    assert store.count() == 1


_WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from localllm.embed.corpus import search
    from localllm.embed.embedder import FakeEmbedder

    class Slow(FakeEmbedder):
        def embed(self, texts, role):
            if role == "document":
                time.sleep(0.05 * len(texts))
            return super().embed(texts, role)

    root = Path(sys.argv[1])
    Path(sys.argv[2]).touch()
    while not all((root / f"ready{i}").exists() for i in (0, 1)):
        time.sleep(0.01)
    r = search("apples", Slow(16), ["docs/**/*"], base_dir=root, store_root=root / "store")
    print(json.dumps({"embedded": r.embedded, "hits": [h.id for h in r.hits]}))
""")


def test_two_processes_indexing_at_once_share_one_consistent_store(tmp_path: Path) -> None:
    _corpus(tmp_path)
    for i in range(5):
        (tmp_path / "docs" / f"extra{i}.txt").write_text(f"extra document number {i}\n" * 50)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), str(tmp_path / f"ready{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
        )
        for i in range(2)
    ]
    results = []
    for p in procs:
        out, errs = p.communicate(timeout=120)
        assert p.returncode == 0, errs
        results.append(json.loads(out))
    chunks = load_corpus(["docs/**/*"], tmp_path).chunks
    unique = {c.hash for c in chunks}
    # one process embedded everything, the other waited for the lock and embedded nothing
    assert sorted(r["embedded"] for r in results) == [0, len(unique)]
    assert results[0]["hits"] == results[1]["hits"]
    store = Store(FakeEmbedder(16).identity, Chunking().as_dict(), root=tmp_path / "store")
    store.verify()
    assert store.count() == len(unique)


# --- temporary errors are errors, never corruption (issue 11 item 18) --------------------


def _filled(tmp_path: Path, n: int = 300) -> tuple[Store, FakeEmbedder]:
    emb = FakeEmbedder(32)
    store = Store(emb.identity, root=tmp_path / "store")
    store.vectors({content_hash(f"t{i}"): f"t{i}" for i in range(n)}, lambda ts: emb.embed(ts, "document"))
    assert store.count() == n
    return store, emb


def _more(n: int = 400) -> dict[str, str]:
    return {content_hash(f"u{i}"): f"u{i}" for i in range(n)}


def _no_rebuild(store: Store) -> None:
    assert store.rebuilds == 0
    assert sorted(p.name for p in store.path.parent.iterdir()) == [store.path.name, store.lock_path.name]


def test_disk_full_raises_and_keeps_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, emb = _filled(tmp_path)
    real_connect = sqlite3.connect

    def full_disk(*args, **kwargs):  # type: ignore[no-untyped-def]
        conn = real_connect(*args, **kwargs)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {max(pages, 1)}")  # SQLITE_FULL on the next page
        return conn

    monkeypatch.setattr(sqlite3, "connect", full_disk)
    with pytest.raises(StoreUnavailable) as info:
        store.vectors(_more(), lambda ts: emb.embed(ts, "document"), batch=100)
    assert info.value.reason == "disk full"
    assert isinstance(info.value, EmbedError) and isinstance(info.value, OSError)
    monkeypatch.undo()
    _no_rebuild(store)
    assert store.count() == 300
    store.verify()
    counter = CountingFake()
    counter_store = Store(emb.identity, root=tmp_path / "store")
    counter_store.vectors(
        {content_hash(f"t{i}"): f"t{i}" for i in range(300)}, lambda ts: counter.embed(ts, "document")
    )
    assert counter.documents == 0  # nothing needed re-embedding


def test_database_locked_past_the_busy_timeout_raises_and_keeps_every_row(tmp_path: Path) -> None:
    store, emb = _filled(tmp_path)
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another program (sqlite3 shell, backup tool) holds it
    try:
        impatient = Store(emb.identity, root=tmp_path / "store", busy_timeout=0.2)
        with pytest.raises(StoreUnavailable) as info:
            impatient.vectors(_more(), lambda ts: emb.embed(ts, "document"))
        assert info.value.reason == "locked"
        with pytest.raises(StoreUnavailable):
            impatient.count()
        assert impatient.rebuilds == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    _no_rebuild(store)
    assert store.count() == 300
    store.vectors(_more(), lambda ts: emb.embed(ts, "document"))
    assert store.count() == 700


_FSIZE_WORKER = textwrap.dedent("""
    import json, resource, signal, sys
    from pathlib import Path
    from localllm.embed.embedder import FakeEmbedder
    from localllm.embed.store import Store, content_hash
    from localllm.errors import StoreUnavailable
    emb = FakeEmbedder(64)
    store = Store(emb.identity, root=Path(sys.argv[1]))
    store.vectors({content_hash(f"t{i}"): f"t{i}" for i in range(300)}, lambda ts: emb.embed(ts, "document"))
    before = store.count()
    size = store.path.stat().st_size
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), like ENOSPC
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, hard))
    reason = None
    try:
        store.vectors({content_hash(f"u{i}"): f"u{i}" for i in range(400)},
                      lambda ts: emb.embed(ts, "document"), batch=100)
    except StoreUnavailable as exc:
        reason = exc.reason
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    print(json.dumps({"before": before, "after": store.count(), "reason": reason,
                      "rebuilds": store.rebuilds, "files": sorted(p.name for p in Path(sys.argv[1]).iterdir())}))
""")


def test_a_write_error_from_the_os_raises_and_keeps_every_row(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FSIZE_WORKER, str(tmp_path / "store")],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["reason"] in ("io error", "disk full")
    assert result["before"] == 300 and result["after"] >= 300  # batches committed before the error stay
    assert result["rebuilds"] == 0
    assert not any(name.endswith(".corrupt") for name in result["files"])


def test_unopenable_store_directory_is_unavailable_not_corrupt(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("a file where the directory should be")
    emb = FakeEmbedder(4)
    store = Store(emb.identity, root=tmp_path / "store")
    with pytest.raises(StoreUnavailable) as info:
        store.vectors({content_hash("x"): "x"}, lambda ts: emb.embed(ts, "document"))
    assert info.value.reason == "cannot open"
    assert (tmp_path / "store").read_text() == "a file where the directory should be"


class PoisonFake(FakeEmbedder):
    """Gives NaN for any text about bananas (an embedding server with a broken kernel)."""

    def embed(self, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
        out: NDArray[np.float32] = super().embed(texts, role).copy()
        for i, text in enumerate(texts):
            if "bananas" in text:
                out[i] = np.nan
        return out


def test_a_nan_vector_is_refused_and_never_stored(tmp_path: Path) -> None:
    _corpus(tmp_path)
    with pytest.raises(EmbedError, match="NaN"):
        _search(tmp_path, PoisonFake(16))  # before: stored for good, and search lost hits
    embedded, hits = _search(tmp_path, CountingFake())
    assert embedded > 0 and hits  # what a later good run embeds is not shadowed by a stored NaN
    with contextlib.closing(
        sqlite3.connect(next((tmp_path / "store").rglob("*.sqlite")))
    ) as conn:  # `with conn` only commits
        blobs = [row[0] for row in conn.execute("SELECT vector FROM vectors")]
    assert blobs and all(np.isfinite(np.frombuffer(b, dtype="<f4")).all() for b in blobs)
