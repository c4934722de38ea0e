"""``TraceWriter``: the one writer of a trace file (trace-format §8, ``JSONLSink``).

- ``open`` creates the file with its ``session.header`` (parent directories too), or
  validates an existing file with the reader's rules and continues its per-turn ``seq``.
- ``seq`` is dense per turn and continues across reopenings.
- Turns never go down in file order (trace-format §7 as the reference reader enforces it).
  An event for a turn below the file's latest — a call that outlived its turn, a
  background job finishing late — is a *late* event: it is written in the latest turn
  (the turn in flight), with ``parent_turn`` naming its own turn, as the spec's off-path
  events do (§3); its ``state_path`` and ``call_id`` are kept, so pairing holds.
  :meth:`TraceWriter.append_group` decides that once for a whole group, so a call's
  start, sub-events and end stay contiguous and in one turn.
- An exclusive ``flock`` is held while open; a second writer, in this process or another,
  gets ``TraceLocked`` at once, or after waiting up to ``wait`` seconds for the lock.
- ``append`` assigns ``ts`` (now, never going backwards) and the dense per-turn ``seq``,
  checks every write-time rule before touching the file, and writes one line with one
  ``write`` on a descriptor opened ``O_DSYNC``: the call returns only once the line's bytes
  and the new file size (all an appended line needs to be read back after a crash or power
  loss — what ``fdatasync`` flushes) are on stable storage. One syscall, no buffering.
- Before each write the open file is compared (device, inode) with what the path names
  now; a replaced or deleted file raises ``TraceReplaced``.
- A torn last line found at open (a crash mid-write) is moved to ``<trace>.torn``
  (appended, one fragment per line), cut from the trace, and logged — never dropped.

Appending is serialised by a lock, so one writer may be shared between threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from localllm import _fs
from localllm.errors import TraceCorrupted, TraceError, TraceLocked, TraceReplaced
from localllm.trace import rules
from localllm.trace.event import (
    HEADER_KIND,
    SCHEMA_VERSION,
    Event,
    canonical_ts,
    dumps,
    format_ts,
    go_escape,
    header_line,
    is_rfc3339_utc,
)
from localllm.trace.reader import event_problem, load_object, parse_trace, raw_payload

__all__ = ["TORN_SUFFIX", "TraceWriter"]

TORN_SUFFIX = ".torn"
_INT63 = 2**63
#: how often a waiting open retries the lock
_LOCK_POLL = 0.05
#: the fields of an event its writer checks (all but ``seq`` and ``ts``, which it assigns)
_FIELDS = ("kind", "payload", "turn", "state_path", "parent_turn", "call_id", "episode_id", "match_idx")
_log = logging.getLogger("localllm.trace")
_GO_ESCAPED_BYTES = (b"<", b">", b"&", "\u2028".encode(), "\u2029".encode())


class TraceWriter:
    """Append-only writer of one JSONL trace file. Use :meth:`open`, not the constructor."""

    def __init__(self, path: Path, fd: int, size: int, events: list[Event], lines: list[bytes]) -> None:
        self._path = path
        self._path_str = str(path)  # stat()ed before every write: no Path conversion each time
        self._fd: int | None = fd
        mine = os.fstat(fd)
        self._identity = (mine.st_dev, mine.st_ino)  # an open descriptor's file never changes
        self._size = size
        self._events = events
        self._lines = lines
        self._next_seq: dict[int, int] = {}
        for ev in events:
            self._next_seq[ev.turn] = ev.seq + 1
        #: the highest turn in the file: an event for a lower one is late (see the module doc)
        self._max_turn = max((ev.turn for ev in events), default=-1)
        self._last_ns = 0
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, header: bytes | None = None, wait: float = 0.0, lenient: bool = False
    ) -> TraceWriter:
        """Create or reopen the trace at ``path`` for appending.

        ``header`` is the line 1 to write when the file is created (without the newline;
        default: a fresh ``session.header``) — pass ``Trace.header_line`` to copy a trace
        byte for byte. It is ignored when the file already has content. ``wait`` is how many
        seconds to wait for another writer to let go of the file (default: not at all).
        ``lenient=True`` continues a trace written by an earlier localllm whose turns
        interleave (``read_trace(..., lenient=True)``); by default it is refused like any
        other read-time violation, so that every file written here reads strictly.

        Raises ``TraceLocked`` when another writer holds the file (past ``wait``), ``TraceCorrupted`` when
        the existing file breaks a read-time rule (the file is left as it was), and
        ``TraceError`` when the file cannot be opened.
        """
        p = Path(os.path.abspath(os.fspath(path)))
        if header is not None:
            _check_header(header)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_DSYNC, 0o644)
        except OSError as exc:
            raise _os_error("cannot open trace", p, exc) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # /dev/zero: read back until memory ran out
                raise TraceError(
                    f"cannot open trace {p}: not a regular file",
                    hint="a trace is a file it appends to, fsyncs and reads back: name a file path",
                )
            _lock(fd, p, wait)
            _check_same_file(fd, p)
            return cls._load(p, fd, header, lenient)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _load(cls, path: Path, fd: int, header: bytes | None, lenient: bool) -> TraceWriter:
        try:
            data = _read_all(fd)
            if not data or _is_torn_header(data):
                if data:
                    _move_torn(path, fd, data, keep=0)
                line = header if header is not None else header_line()
                _write_all(fd, line + b"\n")
                os.fsync(fd)
                _fs.fsync_dir(path.parent)
                return cls(path, fd, len(line) + 1, [], [])
            trace = parse_trace(data, allow_torn=True, path=path, lenient=lenient)
            size = len(data)
            if trace.torn_tail is not None:
                size -= len(trace.torn_tail)
                _move_torn(path, fd, trace.torn_tail, keep=size)
        except OSError as exc:
            raise _os_error("cannot read trace", path, exc) from exc
        return cls(path, fd, size, list(trace.events), list(trace.raw_lines))

    # ----------------------------------------------------------------- appending

    def append(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        turn: int,
        state_path: str | None = None,
        parent_turn: int | None = None,
        call_id: str | None = None,
        episode_id: str | None = None,
        match_idx: int | None = None,
    ) -> Event:
        """Append one event; the writer assigns ``ts`` (now) and ``seq``. Returns the event written.

        A ``turn`` below the file's latest is written late (in the latest turn, with
        ``parent_turn=turn``; see the module docstring). Raises ``TraceWriteRejected``
        (naming the field) when a write-time rule is broken, leaving the file unmodified.
        """
        fields = _check_fields(
            kind=kind,
            payload=payload,
            turn=turn,
            state_path=state_path,
            parent_turn=parent_turn,
            call_id=call_id,
            episode_id=episode_id,
            match_idx=match_idx,
        )
        with self._lock:
            fd = self._require_open()
            fields = self._rehome(fields)
            ev = Event(seq=self._next_seq.get(fields["turn"], 0), ts=self._now(), **fields)
            return self._write(fd, ev, ev.to_line())

    def append_group(self, events: list[dict[str, Any]]) -> list[Event]:
        """Append several events as one contiguous group (one write, one fsync).

        Each item holds :meth:`append`'s arguments (``kind``, ``turn``, and optionally
        ``payload``, ``state_path``, ``parent_turn``, ``call_id``, ``episode_id``,
        ``match_idx``). Every item is checked before anything is written. Items for a turn
        below the file's latest are written late, all in the latest turn at the moment of
        writing (decided once, under the writer's lock, so no other thread can slip a
        higher turn between them). Returns the events as written.
        """
        checked = [_check_fields(**{name: item.get(name) for name in _FIELDS}) for item in events]
        with self._lock:
            fd = self._require_open()
            ts = self._now()
            written: list[Event] = []
            next_seq: dict[int, int] = {}
            for item in checked:
                fields = self._rehome(item)
                turn = fields["turn"]
                seq = next_seq.get(turn, self._next_seq.get(turn, 0))
                next_seq[turn] = seq + 1
                written.append(Event(seq=seq, ts=ts, **fields))
            return self._write_group(fd, written, [ev.to_line() for ev in written])

    def append_event(self, event: Event) -> Event:
        """Re-emit ``event`` keeping its ``ts``; ``seq`` is reassigned (dense per turn).

        The ``ts`` is written as Go's writer re-marshals it (trailing fractional zeros
        trimmed), so re-emitting a trace event by event gives what the reference engine's
        read → rewrite gives: byte-identical for a trace written by either writer.
        """
        if not is_rfc3339_utc(event.ts):
            raise rules.reject("ts", f"{event.ts!r} is not an RFC3339 UTC timestamp ending in Z")
        fields = _check_fields(**{name: getattr(event, name) for name in _FIELDS})
        with self._lock:
            fd = self._require_open()
            fields = self._rehome(fields)
            ev = Event(seq=self._next_seq.get(fields["turn"], 0), ts=canonical_ts(event.ts), **fields)
            return self._write(fd, ev, _line_of(ev, event.raw_line))

    def append_raw(self, line: bytes | str) -> Event:
        """Append an event line verbatim (e.g. ``Trace.raw_lines[i]``: unknown kinds/fields kept).

        The line must be one JSON object obeying every read-time and write-time rule, its
        ``(turn, seq)`` must be the next of its turn, and its turn not below the file's
        latest (a raw line is never re-homed). The reference writer's escapes are applied
        (``<``, ``>``, ``&``, U+2028, U+2029 → ``\\u003c``…, as Go does inside raw
        payloads too); everything else is kept byte for byte. Returns the parsed event.
        """
        raw = line.encode("utf-8") if isinstance(line, str) else bytes(line)
        if any(ch in raw for ch in _GO_ESCAPED_BYTES):
            raw = go_escape(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
        if b"\n" in raw:
            raise rules.reject("line", "contains a newline; pass exactly one line")
        if raw.endswith(b"\r"):
            raise rules.reject("line", "ends with CR (CRLF line ending)")
        if b"\x00" in raw:
            raise rules.reject("line", "contains a NUL byte")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise rules.reject("line", "is not valid UTF-8") from None
        obj, problem = load_object(text)
        if obj is None:
            raise rules.reject("line", problem)
        bad = event_problem(obj)
        if bad:
            raise rules.reject("line", bad)
        if obj["kind"] == HEADER_KIND:
            raise rules.reject("kind", f'"{HEADER_KIND}" is reserved for line 1')
        for key, value in obj.items():
            rules.check_string(key, rules.field_path("line", key) + " (key)")
            rules.check_value(value, key)
        ev = Event.from_json(obj)
        with self._lock:
            fd = self._require_open()
            if ev.turn < self._max_turn:
                raise rules.reject(
                    "turn",
                    f"{ev.turn} is below the trace's latest turn {self._max_turn} (cross-turn ordering "
                    "violation); append it with append_event, which records it late in the latest turn",
                )
            want = self._next_seq.get(ev.turn, 0)
            if ev.seq != want:
                raise rules.reject("seq", f"{ev.seq} is not the next seq of turn {ev.turn} (expected {want})")
            return self._write(fd, ev, raw)

    def next_seq(self, turn: int) -> int:
        """The seq the next event of ``turn`` will get (a peek; another thread may take it)."""
        with self._lock:
            return self._next_seq.get(turn, 0)

    # ----------------------------------------------------------------- reading back

    @property
    def path(self) -> Path:
        """The trace file (absolute)."""
        return self._path

    @property
    def dir(self) -> Path:
        """The trace's directory: sidecar paths in events are relative to it."""
        return self._path.parent

    @property
    def closed(self) -> bool:
        return self._fd is None

    def history(self) -> list[Event]:
        """Every event of the file: those found at open, then those appended (a copy)."""
        with self._lock:
            return list(self._events)

    def lines(self) -> list[bytes]:
        """The raw bytes of each event line (no ``\\n``), parallel to :meth:`history`."""
        with self._lock:
            return list(self._lines)

    # ----------------------------------------------------------------- closing

    def close(self) -> None:
        """Release the lock and close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten writer must not keep the lock for the life of the process.
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else f"{len(self._events)} events"
        return f"<TraceWriter {self._path} ({state})>"

    # ----------------------------------------------------------------- internals

    def _require_open(self) -> int:
        if self._fd is None:
            raise TraceError(f"trace writer for {self._path} is closed")
        return self._fd

    def _now(self) -> str:
        # Wall-clock stamps, but never earlier than the previous one, so ts order follows
        # file order even if the clock steps back.
        self._last_ns = max(time.time_ns(), self._last_ns)
        return format_ts(self._last_ns)

    def _rehome(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A late event's fields moved into the latest turn, ``parent_turn`` naming its own."""
        turn = fields["turn"]
        if turn >= self._max_turn:
            return fields
        parent = fields["parent_turn"] if fields["parent_turn"] is not None else turn
        return {**fields, "turn": self._max_turn, "parent_turn": parent or None}

    def _write(self, fd: int, ev: Event, raw: bytes) -> Event:
        return self._write_group(fd, [ev], [raw])[0]

    def _write_group(self, fd: int, evs: list[Event], raws: list[bytes]) -> list[Event]:
        try:
            now = os.stat(self._path_str)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != self._identity:
            raise _replaced(self._path)
        data = raws[0] + b"\n" if len(raws) == 1 else b"\n".join(raws) + b"\n"
        try:
            # The durability contract: an event is acknowledged only once it is on disk. The
            # file is open with O_DSYNC: each write returns only after its bytes and the file
            # size (all an appended line needs to be read back) are on stable storage.
            _write_all(fd, data)
        except OSError as exc:
            # Never leave half a line behind: cut back to the last complete event.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            raise _os_error("cannot write trace", self._path, exc) from exc
        self._size += len(data)
        for ev in evs:
            self._next_seq[ev.turn] = ev.seq + 1
            self._max_turn = max(self._max_turn, ev.turn)
        self._events.extend(evs)
        self._lines.extend(raws)
        return evs


def _line_of(ev: Event, read_from: bytes | None) -> bytes:
    """``ev``'s line; when it was read from ``read_from`` and its payload is still what that
    line holds, with the payload's bytes as read (Go-compacted and escaped), as the reference
    writer rewrites a read event (its payload is a ``json.RawMessage``: ``1.0``, ``1E+2``,
    ``"\\u00e9"`` are written back as they were, not re-encoded)."""
    line = ev.to_line()
    if read_from is None:
        return line
    found = raw_payload(read_from)
    if found is None:
        return line
    text, value = found
    payload = dumps(ev.payload)
    if dumps(value) != payload:  # changed since it was read, or cleaned by the write-time rules
        return line
    head = line[: len(line) - len(payload.encode("utf-8")) - 1]  # `…,"payload":` + payload + `}`
    return head + go_escape(text).encode("utf-8") + b"}"


def _check_fields(
    *,
    kind: Any,
    payload: Any,
    turn: Any,
    state_path: Any,
    parent_turn: Any,
    call_id: Any,
    episode_id: Any,
    match_idx: Any,
) -> dict[str, Any]:
    """Validate the ``_FIELDS`` of an event-to-be; returns Event kwargs (without seq/ts)."""
    if not isinstance(kind, str) or not kind:
        raise rules.reject("kind", "must be a non-empty string")
    rules.check_string(kind, "kind")
    if kind == HEADER_KIND:
        raise rules.reject("kind", f'"{HEADER_KIND}" is reserved for line 1')
    _check_count("turn", turn)
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        raise rules.reject("payload", f"must be a JSON object (dict), got {type(payload).__name__}")
    clean = rules.check_value(payload, "payload")
    # What Go's omitempty leaves out reads back as absent (``""``, a parent_turn of 0, a
    # match_idx of 0 without an episode_id): keep memory equal to the file.
    if state_path is not None:
        state_path = _check_text("state_path", state_path)
    if call_id is not None:
        call_id = _check_text("call_id", call_id)
    if episode_id is not None:
        episode_id = _check_text("episode_id", episode_id)
    if parent_turn is not None:
        _check_count("parent_turn", parent_turn)
        parent_turn = parent_turn or None
    if match_idx is not None:
        _check_count("match_idx", match_idx)
        if match_idx == 0 and episode_id is None:
            match_idx = None
    return {
        "kind": kind,
        "payload": clean,
        "turn": turn,
        "state_path": state_path,
        "parent_turn": parent_turn,
        "call_id": call_id,
        "episode_id": episode_id,
        "match_idx": match_idx,
    }


def _check_text(name: str, value: object) -> str | None:
    """An optional string field checked; ``""`` (omitted on the wire) becomes ``None``."""
    if not isinstance(value, str):
        raise rules.reject(name, f"must be a string, got {type(value).__name__}")
    rules.check_string(value, name)
    return value or None


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _INT63:
        raise rules.reject(name, f"must be a non-negative 64-bit integer, got {value!r}")


def _check_header(line: bytes) -> None:
    try:
        trace = parse_trace(line + b"\n")
    except TraceCorrupted as exc:
        raise rules.reject("header", str(exc)) from None
    if trace.header.get("schema_version") != SCHEMA_VERSION:
        raise rules.reject("header", f"schema_version must be {SCHEMA_VERSION}")
    for key, value in trace.header.items():
        rules.check_string(key, rules.field_path("header", key) + " (key)")
        rules.check_value(value, rules.field_path("header", key))


def _lock(fd: int, path: Path, wait: float) -> None:
    """Take the exclusive lock, polling for up to ``wait`` seconds; ``TraceLocked`` after."""
    deadline = time.monotonic() + max(0.0, wait)
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            if not announced:
                _log.info("trace %s is locked by another writer; waiting up to %gs", path, wait)
                announced = True
            time.sleep(min(_LOCK_POLL, max(0.0, deadline - time.monotonic())))
    # The message is the spec's (trace-format §7); what to do goes in the hint.
    waited = f"still locked after waiting {wait:g}s; " if wait > 0 else ""
    raise TraceLocked(
        "trace file is locked by another writer",
        path=str(path),
        waited=wait,
        hint=f"{waited}{path} is open in another localllm process or writer: give each process its own "
        "trace file (`--trace F` on the command line), or, from Python, wait for the lock with "
        "Runtime(..., trace_wait=SECONDS)",
    )


def _check_same_file(fd: int, path: Path) -> None:
    """Raise ``TraceReplaced`` unless ``path`` still names the open file."""
    mine = os.fstat(fd)
    try:
        now = os.stat(path)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
        raise _replaced(path)


def _replaced(path: Path) -> TraceReplaced:
    return TraceReplaced(
        "trace file replaced under us", hint=f"{path} was replaced or deleted while open; nothing was written to it"
    )


def _is_torn_header(data: bytes) -> bool:
    """A file whose only content is the start of a header line (a crash while creating it)."""
    if b"\n" in data:
        return False
    prefix = b'{"kind":"session.header"'
    return data.startswith(prefix) or prefix.startswith(data)


def _move_torn(path: Path, fd: int, torn: bytes, *, keep: int) -> None:
    """Append ``torn`` (+ newline) to ``<path>.torn``, fsync it, then cut the trace to ``keep`` bytes."""
    side = path.with_name(path.name + TORN_SUFFIX)
    # Never through a symlink (it would append to the link's target), never waiting on a
    # FIFO (the open blocked for ever, the trace's lock held): only a regular file is kept.
    try:
        sfd = _fs.open_append(side)
    except _fs.NotRegular as exc:
        raise _torn_unusable(path, side) from exc
    try:
        _write_all(sfd, torn + b"\n")
        os.fsync(sfd)
    finally:
        os.close(sfd)
    # Only after the bytes are safe in .torn is the trace cut.
    os.ftruncate(fd, keep)
    os.fsync(fd)
    _log.warning("trace %s: torn last line (%d bytes) moved to %s", path, len(torn), side)


def _torn_unusable(path: Path, side: Path) -> TraceError:
    return TraceError(
        f"cannot open trace {path}: its torn last line goes to {side}, which is not a regular file",
        hint=f"remove {side} (a symlink, FIFO or directory there is never written to); the trace is unchanged",
    )


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written == len(data):  # the usual case: one write, no view
        return
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _os_error(what: str, path: Path, exc: OSError) -> TraceError:
    return TraceError(f"{what} {path}: {exc.strerror or exc}", hint="check the path and its permissions")
