"""Corpus search: globs → files → chunks → (stored) vectors → Index → ranked chunks.

Paths. A relative glob is resolved against ``base_dir``: the current directory for
``localllm search --corpus``, the config file's directory for globs written in a config.
Absolute globs are used as they are. ``**`` is recursive; a directory stands for every
file under it. Like the shell, ``*`` and ``**`` skip dot-files and dot-directories.
Links to directories are followed, but each directory is entered once (a link loop ends).

Chunking. ``.md``/``.markdown`` files are split before every heading line (``#`` … ``######``,
outside fenced code); other files, and sections longer than the window, into windows of
``window`` bytes overlapping by ``overlap`` bytes (never splitting a UTF-8 character).
Whitespace-only chunks are dropped. Files over ``max_file_bytes`` or with a NUL byte in
their first 512 bytes are skipped and reported. Chunk ids are ``<relpath>#<n>``, ``n``
counting from 0 within the file; ``relpath`` is relative to ``base_dir`` (absolute for a
file outside it), with ``/`` separators.
"""

from __future__ import annotations

import fnmatch
import glob
import itertools
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm._fs import Unreadable, read_capped
from localllm.embed.store import Store, content_hash
from localllm.errors import EmbedError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from localllm.embed.embedder import Embedder

DEFAULT_TOP_K = 5
DEFAULT_MIN_SCORE = 0.0
#: chunks embedded between two progress reports (when a progress callback is given)
PROGRESS_BATCH = 32
_BINARY_PROBE = 512
_MARKDOWN = (".md", ".markdown")
_HEADING = re.compile(rb"^ {0,3}#{1,6}(\s|$)")
_FENCE = re.compile(rb"^ {0,3}(```|~~~)")


@dataclass(frozen=True)
class Chunking:
    """How files become chunks (part of the store key)."""

    window: int = 2000
    overlap: int = 200
    max_file_bytes: int = 1 << 20
    markdown_headings: bool = True

    def __post_init__(self) -> None:
        if self.window <= 0 or not 0 <= self.overlap < self.window:
            raise EmbedError(f"chunking needs 0 <= overlap < window, got window={self.window} overlap={self.overlap}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Chunk:
    """A piece of one file: ``id`` is ``<relpath>#<n>``; ``start``/``end`` are byte offsets."""

    path: str
    n: int
    text: str
    start: int
    end: int

    @property
    def id(self) -> str:
        return f"{self.path}#{self.n}"

    @property
    def hash(self) -> str:
        return content_hash(self.text)


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass(frozen=True)
class Corpus:
    chunks: tuple[Chunk, ...]
    files: tuple[str, ...]
    skipped: tuple[Skipped, ...] = ()
    #: patterns that matched no file
    unmatched: tuple[str, ...] = ()


@dataclass(frozen=True)
class SearchHit:
    id: str
    path: str
    chunk: int
    score: float
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class SearchReport:
    query: str
    hits: tuple[SearchHit, ...]
    files: int
    chunks: int
    #: chunk texts embedded by this search (0 when the store had them all)
    embedded: int
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[str, ...] = ()
    store: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def expand_globs(patterns: Sequence[str], base_dir: Path) -> tuple[list[Path], list[str]]:
    """Files matched by ``patterns`` (sorted, de-duplicated) and the patterns matching none."""
    if isinstance(patterns, str):  # its characters as patterns: "/" walked the whole file system
        raise TypeError(f"patterns is a sequence of glob patterns, not one string: pass [{patterns!r}]")
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError("patterns must be glob pattern strings")
    found: dict[Path, None] = {}
    unmatched: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if os.path.isabs(expanded):
            plain, full = expanded, expanded
        else:  # the base directory's own name is no pattern, even with [ or * in it
            plain = os.path.join(str(base_dir), expanded)
            full = os.path.join(glob.escape(str(base_dir)), expanded)
        if os.path.isdir(plain):
            files = list(_walk(plain, ["**", "*"]))
        else:
            parts = full.split(os.sep)
            deep = next((i for i, part in enumerate(parts) if part == "**"), None)
            if deep is None:  # no ** : glob matches one level per part, nothing to loop over
                files = [m for m in glob.glob(full) if os.path.isfile(m)]
            else:
                tops = glob.glob(os.sep.join(parts[:deep]) or os.sep)
                files = [f for top in tops if os.path.isdir(top) for f in _walk(top, parts[deep:])]
        if not files:
            unmatched.append(pattern)
        for f in files:
            found.setdefault(Path(f).resolve(), None)
    return sorted(found), unmatched


def _walk(top: str, parts: list[str]) -> Iterator[str]:
    """The files under ``top`` whose path below it matches ``parts`` (glob's rules: ``**`` is any
    number of directories, neither it nor ``*`` matches a dot-name). Symbolic links to
    directories are followed, but every directory is entered once: a link back up the tree
    (two of them made glob's own ``**`` list paths without end) adds nothing."""
    entered: set[tuple[int, int]] = set()
    for here, dirs, names in os.walk(top, followlinks=True):
        try:
            st = os.stat(here)
        except OSError:
            dirs.clear()
            continue
        if (st.st_dev, st.st_ino) in entered:
            dirs.clear()
            continue
        entered.add((st.st_dev, st.st_ino))
        below = [] if here == top else os.path.relpath(here, top).split(os.sep)
        dirs[:] = sorted(d for d in dirs if _may_lead([*below, d], parts))
        for name in names:
            path = os.path.join(here, name)
            if _matches([*below, name], parts) and os.path.isfile(path):
                yield path


def _matches(names: list[str], parts: list[str]) -> bool:
    """Whether the path ``names`` matches the glob ``parts`` (one name per part, ``**`` any number)."""
    if parts[-1:] == ["**"]:  # as glob: a final ** lists what is below, so it takes a name at least
        below = [end for end in _ends(names, parts[:-1]) if end < len(names)]
        return any(not any(name.startswith(".") for name in names[end:]) for end in below)
    return len(names) in _ends(names, parts)


def _may_lead(names: list[str], parts: list[str]) -> bool:
    """Whether a path below the directory ``names`` may match ``parts``."""
    if parts[-1:] == ["**"] and _matches(names, parts):
        return True  # a final ** takes the names below too
    return any(len(names) in _ends(names, parts[:k]) for k in range(len(parts)))


def _ends(names: list[str], parts: list[str]) -> set[int]:
    """How many of ``names`` the glob ``parts`` can take, each way it can match them."""
    ends = {0}
    for part in parts:
        if part == "**":  # any number of names, none a dot-name
            taken: set[int] = set()
            for start in ends:
                stop = start
                while stop < len(names) and not names[stop].startswith("."):
                    stop += 1
                taken.update(range(start, stop + 1))
            ends = taken
        else:
            ends = {end + 1 for end in ends if end < len(names) and _name_matches(names[end], part)}
    return ends


def _name_matches(name: str, part: str) -> bool:
    if name.startswith(".") and not part.startswith("."):
        return False  # as glob: a wildcard never matches a dot-name
    return fnmatch.fnmatchcase(name, part)


def display_path(path: Path, base_dir: Path) -> str:
    try:
        return path.relative_to(base_dir.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def chunk_bytes(data: bytes, *, markdown: bool, chunking: Chunking) -> list[tuple[int, int]]:
    """Byte ranges of the chunks of ``data`` (before dropping whitespace-only ones)."""
    if not markdown:
        return _windows(data, 0, len(data), chunking)
    out: list[tuple[int, int]] = []
    for start, end in _sections(data):
        out.extend(_windows(data, start, end, chunking))
    return out


def _sections(data: bytes) -> list[tuple[int, int]]:
    cuts = [0]
    offset = 0
    fenced = False
    for line in data.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and offset and _HEADING.match(line):
            cuts.append(offset)
        offset += len(line)
    cuts.append(len(data))
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


#: continuation bytes a UTF-8 character has at most: a longer run is not text, and walking
#: back through all of it made chunking quadratic (40 KB of 0x80 bytes: 110 s, 38,001 chunks)
_MAX_CONTINUATION = 3


def _char_start(data: bytes, pos: int) -> int:
    """``pos`` moved back to the first byte of the UTF-8 character it falls in (at most
    :data:`_MAX_CONTINUATION` bytes: in bytes that are not UTF-8, ``pos`` itself)."""
    back = pos
    while 0 < back < len(data) and data[back] & 0xC0 == 0x80 and pos - back < _MAX_CONTINUATION:
        back -= 1
    if 0 < back < len(data) and data[back] & 0xC0 == 0x80:
        return pos  # a longer run of continuation bytes than any character has
    return back


def _char_end(data: bytes, pos: int) -> int:
    """The end of the character starting at ``pos`` (its continuation bytes, at most three)."""
    end = pos + 1
    while end < len(data) and data[end] & 0xC0 == 0x80 and end - pos <= _MAX_CONTINUATION:
        end += 1
    return end


def _windows(data: bytes, start: int, end: int, c: Chunking) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        stop = end if end - pos <= c.window else _char_start(data, pos + c.window)
        if stop <= pos:  # one character longer than the window: the whole character, never a piece of it
            stop = min(_char_end(data, pos), end)
        out.append((pos, stop))
        if stop >= end:
            break
        nxt = _char_start(data, stop - c.overlap)
        pos = nxt if nxt > pos else stop
    return out


def load_corpus(patterns: Sequence[str], base_dir: Path | None = None, chunking: Chunking | None = None) -> Corpus:
    """Read and chunk every file matched by ``patterns``."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    c = chunking or Chunking()
    paths, unmatched = expand_globs(patterns, base)
    chunks: list[Chunk] = []
    files: list[str] = []
    skipped: list[Skipped] = []
    for path in paths:
        shown = display_path(path, base)
        try:
            # bounded even if the file grows meanwhile; regular: a file swapped for a FIFO after
            # the glob blocked the open for ever
            data = read_capped(path, c.max_file_bytes, regular=True)
        except Unreadable:
            try:
                big = path.is_file() and path.stat().st_size > c.max_file_bytes
            except OSError:
                big = False
            skipped.append(Skipped(shown, f"larger than {c.max_file_bytes} bytes" if big else "not a regular file"))
            continue
        except OSError as exc:
            skipped.append(Skipped(shown, f"unreadable: {exc.strerror or exc}"))
            continue
        if b"\0" in data[:_BINARY_PROBE]:
            skipped.append(Skipped(shown, "binary (NUL byte in the first 512 bytes)"))
            continue
        markdown = c.markdown_headings and path.suffix.lower() in _MARKDOWN
        files.append(shown)
        n = 0
        for start, end in chunk_bytes(data, markdown=markdown, chunking=c):
            text = data[start:end].decode("utf-8", errors="replace")
            if not text.strip():
                continue
            chunks.append(Chunk(shown, n, text, start, end))
            n += 1
    return Corpus(tuple(chunks), tuple(files), tuple(skipped), tuple(unmatched))


def search(
    query: str,
    embedder: Embedder,
    patterns: Sequence[str],
    *,
    base_dir: Path | None = None,
    top_k: int = DEFAULT_TOP_K,
    min_score: float = DEFAULT_MIN_SCORE,
    chunking: Chunking | None = None,
    store: Store | bool = True,
    store_root: Path | None = None,
    progress: Callable[[int], None] | None = None,
) -> SearchReport:
    """Rank the chunks of the files matched by ``patterns`` against ``query``.

    ``store=True`` keeps vectors in the default :class:`Store` (only new or changed
    chunks are embedded); ``False`` embeds everything in memory; or pass a Store.
    ``progress`` is told how many chunks were just embedded, every
    :data:`PROGRESS_BATCH` or fewer (a progress bar's ``update``).
    """
    import numpy as np

    from localllm.embed.embedder import embed_rows
    from localllm.embed.index import Index, check_top, top_positions

    check_top(top_k, min_score)  # before the corpus is read and embedded
    c = chunking or Chunking()
    corpus = load_corpus(patterns, base_dir, c)
    # the query first: an unknown model's dims are then known before the store is keyed
    qvec = embed_rows(embedder, [query], "query")
    embedded = 0

    def embed_documents(texts: Sequence[str]) -> NDArray[np.float32]:
        nonlocal embedded
        if progress is None:
            embedded += len(texts)
            return embed_rows(embedder, texts, "document")
        parts = []
        for i in range(0, len(texts), PROGRESS_BATCH):
            part = texts[i : i + PROGRESS_BATCH]
            parts.append(embed_rows(embedder, part, "document"))
            embedded += len(part)
            progress(len(part))
        return np.concatenate(parts) if parts else embedder.embed(texts, "document")

    texts = {ch.hash: ch.text for ch in corpus.chunks}
    where: str | None = None
    if isinstance(store, Store):
        vectors = store.vectors(texts, embed_documents)
        where = str(store.path)
    elif store:
        st = Store(embedder.identity, c.as_dict(), root=store_root)
        vectors = st.vectors(texts, embed_documents)
        where = str(st.path)
    else:
        keys = list(texts)
        matrix = embed_documents([texts[k] for k in keys]) if keys else np.zeros((0, qvec.shape[1]))
        vectors = dict(zip(keys, matrix, strict=True))
    hits: tuple[SearchHit, ...] = ()
    if corpus.chunks:
        # one row per distinct text, not per chunk: a 1 MiB markdown file of "#" lines is
        # 524,287 equal chunks, whose stacked rows took 1.8 GB; a chunk's score is its text's
        keys = [ch.hash for ch in corpus.chunks]
        row = {h: i for i, h in enumerate(dict.fromkeys(keys))}
        matrix = np.stack([vectors[h] for h in row]).astype(np.float32, copy=False)
        index = Index.from_matrix(list(row), matrix)
        scores = index.scores(qvec[0])[np.fromiter((row[h] for h in keys), dtype=np.intp, count=len(keys))]
        hits = tuple(
            SearchHit(ch.id, ch.path, ch.n, float(scores[i]), ch.text, ch.start, ch.end)
            for i in top_positions(scores, top_k, min_score)
            for ch in (corpus.chunks[i],)
        )
    return SearchReport(
        query, hits, len(corpus.files), len(corpus.chunks), embedded, corpus.skipped, corpus.unmatched, where
    )
