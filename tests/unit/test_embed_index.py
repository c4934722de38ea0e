"""Index: exact cosine top-k against brute force, ties, min_score, dimensions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localllm.embed.index import Index
from localllm.errors import DimensionMismatch


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    m = rng.standard_normal((n, d)).astype(np.float32)
    out: np.ndarray = m / np.linalg.norm(m, axis=1, keepdims=True)
    return out


def _brute(matrix: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    scores = matrix @ (q / np.linalg.norm(q))
    # full stable sort: best score first, lower position first among equals
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


@pytest.mark.parametrize("n,k", [(1, 5), (7, 5), (1000, 10), (1000, 1000), (5000, 1)])
def test_top_k_equals_brute_force(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    m = _unit(rng, n, 32)
    index = Index.from_matrix([f"v{i}" for i in range(n)], m)
    for _ in range(5):
        q = rng.standard_normal(32).astype(np.float32)
        hits = index.search(q, top_k=k, min_score=-1.0)
        assert [h.position for h in hits] == _brute(m, q, k)
        assert [h.id for h in hits] == [f"v{p}" for p in _brute(m, q, k)]
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-3, max_value=3), min_size=1, max_size=40), st.integers(1, 12))
def test_ties_break_by_insertion_order(levels: list[int], k: int) -> None:
    # few distinct score levels → many ties, including at the top-k boundary
    d = 2
    rows = np.array([[np.cos(lv / 4), np.sin(lv / 4)] for lv in levels], dtype=np.float32)
    index = Index(d)
    index.add([str(i) for i in range(len(levels))], rows)
    q = np.array([1.0, 0.0], dtype=np.float32)
    got = [h.position for h in index.search(q, top_k=k, min_score=-1.0)]
    scores = (index.matrix() @ q).tolist()
    want = sorted(range(len(levels)), key=lambda i: (-scores[i], i))[:k]
    assert got == want


def test_min_score_filters_and_default_is_zero() -> None:
    index = Index.from_matrix(["a", "b", "c"], np.array([[1, 0], [0, 1], [-1, 0]], dtype=np.float32))
    assert [h.id for h in index.search([1, 0])] == ["a", "b"]  # min_score 0.0 drops "c" (-1)
    assert [h.id for h in index.search([1, 0], min_score=0.5)] == ["a"]
    assert [h.id for h in index.search([1, 0], min_score=-1)] == ["a", "b", "c"]


def test_vectors_are_normalised_without_touching_the_callers_array() -> None:
    raw = np.array([[3.0, 4.0], [0.0, 2.0]], dtype=np.float32)
    index = Index.from_matrix(["x", "y"], raw)
    assert raw.tolist() == [[3.0, 4.0], [0.0, 2.0]]
    hit = index.search([6.0, 8.0], top_k=1)[0]
    assert hit.id == "x" and hit.score == pytest.approx(1.0, abs=1e-6)


def test_unit_float32_input_is_not_copied() -> None:
    m = _unit(np.random.default_rng(0), 100, 16)
    index = Index.from_matrix([str(i) for i in range(100)], m)
    assert np.shares_memory(index.matrix(), m)
    assert index.matrix().nbytes == m.nbytes


def test_add_after_search_extends_the_index() -> None:
    index = Index(2)
    index.add(["a"], [[1.0, 0.0]])
    assert [h.id for h in index.search([0, 1], min_score=-1)] == ["a"]
    index.add(["b"], [[0.0, 1.0]])
    assert [h.id for h in index.search([0, 1])] == ["b", "a"]
    assert len(index) == 2 and index.ids == ["a", "b"]


def test_dimension_mismatch_is_an_error() -> None:
    index = Index(3)
    with pytest.raises(DimensionMismatch):
        index.add(["a"], np.zeros((1, 4), dtype=np.float32))
    index.add(["a"], [[1, 0, 0]])
    with pytest.raises(DimensionMismatch, match="3-dimension"):
        index.search([1, 0])
    with pytest.raises(ValueError):
        index.add(["a", "b"], [[1, 0, 0]])


def test_empty_index_returns_nothing() -> None:
    assert Index(4).search([1, 0, 0, 0]) == []


def test_a_vector_with_nan_is_refused_as_a_row_or_a_query() -> None:
    m = np.eye(4, dtype=np.float32)
    m[2] = np.nan
    with pytest.raises(ValueError, match="vector 2"):
        Index.from_matrix(["a", "b", "nan", "d"], m)  # before: accepted, and top_k=1 found nothing
    index = Index.from_matrix(["a", "b"], np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError):
        index.search([np.nan, 0.0])
