"""Corpus: globs, chunking, limits, chunk ids, search ranking."""

from __future__ import annotations

import contextlib
import glob
import os
import random
from pathlib import Path
from typing import Any

import pytest

from localllm.embed.corpus import Chunking, chunk_bytes, expand_globs, load_corpus, search
from localllm.embed.embedder import FakeEmbedder
from localllm.errors import EmbedError
from tests.conftest import in_child


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "top.md").write_text("# T\nx\n")
    (root / "a" / "b" / "deep.txt").write_text("deep\n")
    (root / "a" / ".hidden.txt").write_text("hidden\n")
    (root / "a" / "b" / "bin.dat").write_bytes(b"abc\0def" + b"x" * 600)
    (root / "a" / "big.txt").write_bytes(b"y" * ((1 << 20) + 1))


def test_recursive_globs_relative_to_base_dir(tmp_path: Path) -> None:
    _tree(tmp_path)
    files, unmatched = expand_globs(["a/**/*.txt"], tmp_path)
    assert [f.name for f in files] == ["deep.txt", "big.txt"]  # sorted by path; ** recursive; no dot-files
    assert unmatched == []
    files, unmatched = expand_globs(["a/*.md", "nothing/*.rst"], tmp_path)
    assert [f.name for f in files] == ["top.md"] and unmatched == ["nothing/*.rst"]


def test_absolute_globs_directories_and_dedup(tmp_path: Path) -> None:
    _tree(tmp_path)
    files, _ = expand_globs([str(tmp_path / "a" / "**" / "*.md"), "a", "a/top.md"], tmp_path)
    names = [f.name for f in files]
    assert names.count("top.md") == 1 and "deep.txt" in names


def test_limits_skip_big_and_binary_files(tmp_path: Path) -> None:
    _tree(tmp_path)
    corpus = load_corpus(["a/**/*"], tmp_path)
    assert {s.path: s.reason.split()[0] for s in corpus.skipped} == {"a/big.txt": "larger", "a/b/bin.dat": "binary"}
    assert corpus.files == ("a/b/deep.txt", "a/top.md")
    assert [c.id for c in corpus.chunks] == ["a/b/deep.txt#0", "a/top.md#0"]


def test_relpath_outside_base_dir_is_absolute(tmp_path: Path) -> None:
    _tree(tmp_path)
    corpus = load_corpus([str(tmp_path / "a" / "top.md")], tmp_path / "a" / "b")
    assert corpus.chunks[0].id == f"{(tmp_path / 'a' / 'top.md').as_posix()}#0"


def test_markdown_splits_at_headings_but_not_inside_fences(tmp_path: Path) -> None:
    text = "intro\n# One\nbody 1\n```\n# not a heading\n```\n## Two\nbody 2\n   ### Three\n#nope\n"
    (tmp_path / "doc.md").write_text(text)
    chunks = load_corpus(["doc.md"], tmp_path).chunks
    assert [c.text for c in chunks] == [
        "intro\n",
        "# One\nbody 1\n```\n# not a heading\n```\n",
        "## Two\nbody 2\n",
        "   ### Three\n#nope\n",
    ]
    assert [c.n for c in chunks] == [0, 1, 2, 3]
    data = text.encode()
    assert all(data[c.start : c.end].decode() == c.text for c in chunks)


def test_windows_overlap_and_cover_everything() -> None:
    data = bytes(range(97, 123)) * 200  # 5200 bytes
    ranges = chunk_bytes(data, markdown=False, chunking=Chunking())
    assert ranges == [(0, 2000), (1800, 3800), (3600, 5200)]
    assert ranges[0][1] - ranges[1][0] == 200


def test_windows_never_split_a_utf8_character() -> None:
    data = ("é" * 3000).encode()  # 2-byte characters
    for start, end in chunk_bytes(data, markdown=False, chunking=Chunking(window=999, overlap=101)):
        data[start:end].decode("utf-8")  # raises if a character was cut
        assert end - start <= 999


def test_long_markdown_section_is_windowed(tmp_path: Path) -> None:
    (tmp_path / "long.md").write_text("# H\n" + "z" * 4500)
    chunks = load_corpus(["long.md"], tmp_path).chunks
    assert len(chunks) == 3 and chunks[0].text.startswith("# H")


def test_bad_chunking_is_refused() -> None:
    with pytest.raises(EmbedError):
        Chunking(window=100, overlap=100)


def test_search_ranks_the_matching_chunk_first_with_defaults(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# Apples\nred fruit\n# Pears\ngreen fruit\n")
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text(f"file {i}\n")
    report = search("# Pears\ngreen fruit\n", FakeEmbedder(32), ["*"], base_dir=tmp_path, store=False, min_score=-1.0)
    assert report.hits[0].id == "notes.md#1" and report.hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert len(report.hits) == 5  # default top_k
    assert report.files == 9 and report.chunks == 10 and report.embedded == 10
    default = search("# Pears\ngreen fruit\n", FakeEmbedder(32), ["*"], base_dir=tmp_path, store=False)
    assert all(h.score >= 0.0 for h in default.hits)  # default min_score 0.0


def test_search_over_nothing_is_empty(tmp_path: Path) -> None:
    report = search("q", FakeEmbedder(8), ["missing/**"], base_dir=tmp_path, store=False)
    assert report.hits == () and report.unmatched == ("missing/**",)


@pytest.mark.parametrize(
    ("given", "error"),
    [
        # one string: its characters were the patterns, and "/" walked the whole file system
        ({"patterns": "notes/*.md"}, TypeError),
        ({"patterns": [Path("notes")]}, TypeError),
        ({"top_k": 2.5}, ValueError),  # before: numpy's "Partition index must be integer", after embedding
        ({"top_k": float("nan")}, ValueError),
        ({"top_k": True}, ValueError),
        ({"top_k": 0}, ValueError),
        ({"min_score": "0.3"}, ValueError),  # before: math.isnan's TypeError, after embedding
        ({"min_score": float("nan")}, ValueError),
    ],
)
def test_search_arguments_are_checked_before_anything_is_read(
    tmp_path: Path, given: dict[str, object], error: type[Exception]
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("alpha\n")
    embedder = FakeEmbedder(8)
    kwargs: dict[str, Any] = {"base_dir": tmp_path, "store": False, **given}
    patterns = kwargs.pop("patterns", ["notes/*.md"])
    with pytest.raises(error):
        search("alpha", embedder, patterns, **kwargs)
    assert embedder.calls == 0


@pytest.mark.parametrize(
    ("texts", "error"),
    [("one text", TypeError), (["a", 5], TypeError), (["a", None], TypeError), (["a", "b \ud800"], EmbedError)],
)
def test_embed_takes_utf8_texts(texts: Any, error: type[Exception]) -> None:
    embedder = FakeEmbedder(8)
    with pytest.raises(error) as info:
        embedder.embed(texts, "query")
    assert embedder.calls == 0 and ("text 1" in str(info.value) or isinstance(texts, str))


def test_search_reports_embedding_progress_in_small_steps(tmp_path: Path) -> None:
    """issue 10 item 26: a bar can follow a 200-chunk corpus instead of 7 silent seconds."""
    from localllm.embed.corpus import PROGRESS_BATCH, search

    for i in range(100):
        (tmp_path / f"f{i}.md").write_text(f"# A{i}\nalpha {i}\n# B{i}\nbeta {i}\n")
    steps: list[int] = []
    report = search("alpha", FakeEmbedder(16), ["*.md"], base_dir=tmp_path, store=False, progress=steps.append)
    assert report.embedded == 200 and sum(steps) == 200
    assert len(steps) >= 200 // PROGRESS_BATCH and max(steps) <= PROGRESS_BATCH
    again: list[int] = []
    search("alpha", FakeEmbedder(16), ["*.md"], base_dir=tmp_path, store_root=tmp_path / "s", progress=again.append)
    assert sum(again) == 200
    cached: list[int] = []
    report = search(
        "alpha", FakeEmbedder(16), ["*.md"], base_dir=tmp_path, store_root=tmp_path / "s", progress=cached.append
    )
    assert (report.embedded, cached) == (0, [])  # nothing new: no progress to show


def _glob_files(pattern: str, base: Path) -> list[Path]:
    """What glob's own ``**`` lists (the reference for trees without a link loop)."""
    full = pattern if Path(pattern).is_absolute() else str(base / pattern)
    if Path(full).is_dir():
        full = str(Path(full) / "**" / "*")
    return sorted({Path(m).resolve() for m in glob.glob(full, recursive=True) if os.path.isfile(m)})


def test_globs_list_what_glob_lists(tmp_path: Path) -> None:
    rng = random.Random(20261204)
    names = ["a", "b", ".h", "a.md", "b.txt", ".x.md", "[c]"]
    for i in range(60):
        (tmp_path / str(i)).mkdir()
    trees = []
    for i in range(60):
        root = tmp_path / str(i)
        for _ in range(rng.randint(3, 12)):
            parts = [rng.choice(names) for _ in range(rng.randint(1, 4))]
            with contextlib.suppress(OSError):  # a name already taken by a file or a directory
                (root / Path(*parts[:-1])).mkdir(parents=True, exist_ok=True)
                (root / Path(*parts)).write_text("x\n")
        trees.append(root)
    segments = ["*", "**", "*.md", "a*", ".h", ".*", "?", "a", "[ab]", "[[]c]"]
    checked = 0
    for root in trees:
        for _ in range(40):
            pattern = "/".join(rng.choice(segments) for _ in range(rng.randint(1, 4)))
            files, unmatched = expand_globs([pattern], root)
            want = _glob_files(pattern, root)
            assert files == want, (root, pattern)
            assert unmatched == ([] if want else [pattern])
            checked += bool(want)
    assert checked > 200


def test_a_link_loop_in_the_corpus_lists_each_file_once(tmp_path: Path) -> None:
    (tmp_path / "c" / "d").mkdir(parents=True)
    (tmp_path / "c" / "a.md").write_text("a\n")
    (tmp_path / "c" / "d" / "b.md").write_text("b\n")
    for link in ("l1", "l2", "d/up"):
        (tmp_path / "c" / link).symlink_to(tmp_path / "c")
    # glob's ** followed both links at every level: 2**40 paths before the kernel's limit
    listed = in_child(
        f"""
        import json
        from pathlib import Path
        from localllm.embed.corpus import expand_globs
        base = Path({str(tmp_path)!r})
        print(json.dumps([[str(p) for p in expand_globs([g], base)[0]] for g in ("c", "c/**/*.md", "c/l1/**/b.md")]))
        """
    )
    c = tmp_path / "c"
    assert listed == [[str(c / "a.md"), str(c / "d" / "b.md")]] * 2 + [[str(c / "d" / "b.md")]]
