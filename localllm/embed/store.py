"""Store: a persistent, content-addressed cache of embedding vectors in SQLite.

Why SQLite (stdlib ``sqlite3``) rather than ``.npy`` + a JSON manifest:

* an update is one transaction: a crash or a kill mid-write leaves the previous
  committed state, never a half-written file, and no second file can drift from the first;
* updates are incremental: embedding one changed file inserts its few rows instead of
  rewriting a matrix of the whole corpus;
* rows are looked up by key, so several corpora embedded with the same model share vectors.
  (simonw/llm keeps its embeddings in SQLite for the same reasons.)

Layout: one database file per :func:`store_key` — the embedder identity (model, dims,
pooling, prefixes) and the chunking parameters — under ``<cache>/embed/``. Each row is
``(content_hash, vector, checksum)``: the content hash is sha256 of the chunk text, so an
unchanged chunk is never embedded twice and an edited file re-embeds only its changed
chunks. The checksum (sha256 over key, hash and vector bytes) is verified on every read.

Never trusted: a database that fails ``PRAGMA quick_check``, is not a database, has the
wrong key or format, or holds a row whose checksum or size is wrong raises
:class:`StoreCorrupt` internally and is moved aside and rebuilt (the vectors are then
re-embedded). Never thrown away: a store that cannot be used *right now* — disk full,
locked by another program past the busy timeout, an I/O error, a read-only or unopenable
file — raises :class:`StoreUnavailable` (``reason`` says which) and is left exactly as it
was; rows committed before the error stay. SQLite's result code decides which is which,
never the message text. Writers hold a cross-process file lock (``<db>.lock``) for the whole
look-up-embed-insert step, so two processes indexing the same corpus at once embed it
once and both finish with the same, consistent store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._lock import hold, store_lock_path
from localllm.embed.embedder import EmbedderIdentity
from localllm.errors import EmbedError, StoreCorrupt, StoreUnavailable

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_LOCK_TIMEOUT = 900.0
_SELECT_CHUNK = 500
_INSERT_BATCH = 256
_BUSY_TIMEOUT = 30.0

# SQLite primary result codes (sqlite3.SQLITE_* exists only from Python 3.11).
_CORRUPT_CODES = {1: "schema", 11: "corrupt", 24: "format", 26: "not a database"}
_UNAVAILABLE_CODES = {
    3: "permission denied",
    5: "locked",
    6: "locked",
    7: "out of memory",
    8: "read-only",
    9: "interrupted",
    10: "io error",
    13: "disk full",
    14: "cannot open",
    15: "locked",
}
_HINTS = {
    "disk full": "free disk space under the cache directory and run again",
    "locked": "another program holds the database; close it or run again later",
    "read-only": "make the cache directory writable",
    "permission denied": "make the cache directory writable",
}


def content_hash(text: str) -> str:
    """sha256 hex of ``text`` (UTF-8): the key a vector is stored under."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def store_key(identity: EmbedderIdentity, chunking: Mapping[str, Any] | None = None) -> str:
    """The 16-hex key of a store: identity and chunking parameters, canonical JSON, sha256."""
    doc = {"identity": identity.as_dict(), "chunking": dict(chunking or {}), "format": FORMAT_VERSION}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "-" for c in text.lower())
    return keep.strip("-.")[:48] or "model"


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One explicit transaction (the connection is in autocommit mode otherwise)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        # After SQLITE_FULL or an I/O error SQLite may have rolled back already; a failing
        # ROLLBACK must not replace the error that explains what happened.
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _classify(path: Path, exc: sqlite3.Error) -> StoreCorrupt | StoreUnavailable:
    """Corruption (rebuild) or a temporary failure (raise, keep the file) by SQLite's code."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # Python 3.10: the class is all there is
        corrupt = not isinstance(exc, sqlite3.OperationalError)
        reason = "corrupt" if corrupt else "unavailable"
    else:
        corrupt = (code & 0xFF) in _CORRUPT_CODES
        reason = _UNAVAILABLE_CODES.get(code & 0xFF, "error")
    if corrupt:
        return StoreCorrupt(f"{path}: {exc}")
    return _unavailable(path, reason, str(exc))


def _unavailable(path: Path, reason: str, detail: str) -> StoreUnavailable:
    return StoreUnavailable(
        f"embedding store {path} cannot be used now ({detail}); the rows already stored are kept",
        path=str(path),
        reason=reason,
        hint=_HINTS.get(reason, "run again once the cause is gone"),
    )


class Store:
    """Vectors of one embedder identity and chunking configuration, keyed by content hash."""

    def __init__(
        self,
        identity: EmbedderIdentity,
        chunking: Mapping[str, Any] | None = None,
        *,
        root: Path | None = None,
        lock_timeout: float = _LOCK_TIMEOUT,
        busy_timeout: float = _BUSY_TIMEOUT,
    ) -> None:
        if root is None:
            from localllm import settings

            root = settings.cache_dir() / "embed"
        self.identity = identity
        self.chunking = dict(chunking or {})
        self.key = store_key(identity, self.chunking)
        self.path = Path(root) / f"{_slug(identity.model)}-{self.key}.sqlite"
        self.lock_path = store_lock_path(self.path)
        self.lock_timeout = lock_timeout
        self.busy_timeout = busy_timeout
        #: times this store was found corrupt and rebuilt (by this object)
        self.rebuilds = 0

    # ------------------------------------------------------------------ public

    def vectors(
        self,
        texts: Mapping[str, str],
        embed: Callable[[Sequence[str]], NDArray[np.float32]],
        *,
        batch: int = 256,
    ) -> dict[str, NDArray[np.float32]]:
        """Vectors for ``texts`` (content hash → text), embedding only the missing ones.

        ``embed`` gets lists of texts and returns their vectors; new rows are committed
        after each batch, so an interrupted run keeps what it paid for.
        """
        with self._locked():
            try:
                return self._vectors(texts, embed, batch)
            except StoreCorrupt as exc:
                self._rebuild(exc)
                return self._vectors(texts, embed, batch)

    def count(self) -> int:
        """Rows stored (0 for a missing store)."""
        if not self.path.exists():
            return 0
        with self._locked(), self._connect() as conn:
            return int(conn.execute("SELECT count(*) FROM vectors").fetchone()[0])

    def verify(self) -> None:
        """Check the whole store; raise :class:`StoreCorrupt` on any problem."""
        with self._locked(), self._connect() as conn:
            for row in conn.execute("SELECT hash, vector, checksum FROM vectors"):
                self._check_row(row[0], row[1], row[2])

    def prune(self, keep: set[str]) -> int:
        """Delete rows whose content hash is not in ``keep``; the number deleted."""
        with self._locked(), self._connect() as conn:
            stored = [r[0] for r in conn.execute("SELECT hash FROM vectors")]
            gone = [h for h in stored if h not in keep]
            with _transaction(conn):
                conn.executemany("DELETE FROM vectors WHERE hash = ?", [(h,) for h in gone])
            return len(gone)

    # ------------------------------------------------------------------ internals

    def _vectors(
        self,
        texts: Mapping[str, str],
        embed: Callable[[Sequence[str]], NDArray[np.float32]],
        batch: int,
    ) -> dict[str, NDArray[np.float32]]:
        import numpy as np

        with self._connect() as conn:
            found = self._select(conn, list(texts))
            missing = [h for h in texts if h not in found]
            for start in range(0, len(missing), batch):
                hashes = missing[start : start + batch]
                matrix = np.asarray(embed([texts[h] for h in hashes]), dtype=np.float32)
                if matrix.shape[0] != len(hashes):
                    raise EmbedError(f"embedder returned {matrix.shape[0]} vectors for {len(hashes)} texts")
                self._check_dims(matrix.shape[1])
                if not np.isfinite(matrix).all():  # stored, it would be reused for good
                    row = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
                    raise EmbedError(f"embedder returned a vector with NaN or infinite values for text {start + row}")
                rows = []
                for h, vec in zip(hashes, matrix, strict=True):
                    blob = np.ascontiguousarray(vec, dtype="<f4").tobytes()
                    rows.append((h, blob, self._checksum(h, blob)))
                    found[h] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
                with _transaction(conn):
                    conn.executemany("INSERT OR REPLACE INTO vectors (hash, vector, checksum) VALUES (?,?,?)", rows)
            return found

    def _select(self, conn: sqlite3.Connection, hashes: list[str]) -> dict[str, NDArray[np.float32]]:
        import numpy as np

        out: dict[str, NDArray[np.float32]] = {}
        for start in range(0, len(hashes), _SELECT_CHUNK):
            part = hashes[start : start + _SELECT_CHUNK]
            marks = ",".join("?" * len(part))
            try:
                rows = conn.execute(
                    f"SELECT hash, vector, checksum FROM vectors WHERE hash IN ({marks})", part
                ).fetchall()
            except sqlite3.Error as exc:
                raise _classify(self.path, exc) from exc
            for h, blob, checksum in rows:
                self._check_row(h, blob, checksum)
                out[h] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        return out

    def _check_row(self, h: str, blob: Any, checksum: str) -> None:
        dims = self.identity.dims
        if not isinstance(blob, bytes) or len(blob) % 4 or (dims is not None and len(blob) != 4 * dims):
            raise StoreCorrupt(f"{self.path}: vector of {h[:12]} has the wrong size")
        if checksum != self._checksum(h, blob):
            raise StoreCorrupt(f"{self.path}: checksum mismatch for {h[:12]}")

    def _check_dims(self, dims: int) -> None:
        want = self.identity.dims
        if want is not None and dims != want:
            from localllm.errors import DimensionMismatch

            raise DimensionMismatch(f"store {self.path.name} holds {want}-dimension vectors, got {dims}")

    def _checksum(self, h: str, blob: bytes) -> str:
        digest = hashlib.sha256(self.key.encode() + h.encode() + blob)
        return digest.hexdigest()[:32]

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """An open, verified connection.

        StoreCorrupt if the file cannot be trusted, StoreUnavailable if it cannot be used now.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise _unavailable(self.path, "cannot open", str(exc)) from exc
        if st is not None and not stat.S_ISREG(st.st_mode):
            # a link (SQLite would write through it), a FIFO or a directory: moved aside
            raise StoreCorrupt(f"{self.path}: not a regular file")
        fresh = st is None or st.st_size == 0
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise _classify(self.path, exc) from exc
        try:
            conn.execute("PRAGMA synchronous = FULL")
            if fresh:
                self._create(conn)
            else:
                self._validate(conn)
            yield conn
        except sqlite3.Error as exc:
            raise _classify(self.path, exc) from exc
        finally:
            conn.close()

    def _create(self, conn: sqlite3.Connection) -> None:
        meta = {
            "format": str(FORMAT_VERSION),
            "key": self.key,
            "identity": json.dumps(self.identity.as_dict(), sort_keys=True),
            "chunking": json.dumps(self.chunking, sort_keys=True),
        }
        with _transaction(conn):
            conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("CREATE TABLE vectors (hash TEXT PRIMARY KEY, vector BLOB NOT NULL, checksum TEXT NOT NULL)")
            conn.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))

    def _validate(self, conn: sqlite3.Connection) -> None:
        result = conn.execute("PRAGMA quick_check").fetchall()
        if result != [("ok",)]:
            raise StoreCorrupt(f"{self.path}: integrity check failed: {result[:3]}")
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        if meta.get("format") != str(FORMAT_VERSION) or meta.get("key") != self.key:
            raise StoreCorrupt(f"{self.path}: written for another format or key")

    def _rebuild(self, cause: StoreCorrupt) -> None:
        """Move the untrusted file aside (kept for inspection) and start empty. Lock held."""
        self.rebuilds += 1
        aside = self.path.with_name(self.path.name + ".corrupt")
        log.warning("embedding store %s is corrupt (%s); rebuilding it", self.path, cause)
        try:
            for suffix in ("-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(str(self.path) + suffix)
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, aside)
        except OSError as exc:
            raise _unavailable(self.path, "cannot open", f"cannot move the corrupt store aside: {exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with hold(
            self.lock_path,
            timeout=self.lock_timeout,
            waiting=lambda: log.warning(
                "waiting for the embedding store lock %s (another process is indexing)", self.lock_path
            ),
            gave_up=lambda waited: EmbedError(
                f"gave up after {waited:.0f}s waiting for {self.lock_path}: another localllm process is indexing",
                # flock: a holder that died has let go already; removing the file would let
                # the next process lock a new file while a waiter holds the old one
                hint="run again when it is done",
            ),
            unusable=lambda exc: _unavailable(self.path, "cannot open", f"lock {self.lock_path}: {exc}"),
        ):
            yield
