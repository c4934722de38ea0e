"""Index: an in-memory float32 matrix with exact cosine top-k.

Memory is the vectors themselves (one contiguous ``(n, d)`` float32 matrix, plus the ids);
a query is one matrix-vector product and an O(n) partial selection (``argpartition``), not
a full sort. Ties are broken by insertion order (lower position first), so results are
stable across runs and platforms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localllm.errors import DimensionMismatch

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

_UNIT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Hit:
    """One search result: the id, its cosine score and its insertion position."""

    id: str
    score: float
    position: int


class Index:
    """Exact cosine search over vectors of one dimension.

    Vectors are L2-normalised on the way in (copied only when they are not unit already),
    so scores are cosines whatever the source.
    """

    def __init__(self, dims: int) -> None:
        if dims <= 0:
            raise ValueError(f"dims must be positive, got {dims}")
        self.dims = dims
        self._ids: list[str] = []
        self._parts: list[NDArray[np.float32]] = []
        self._matrix: NDArray[np.float32] | None = None

    @classmethod
    def from_matrix(cls, ids: Sequence[str], matrix: ArrayLike) -> Index:
        """An index over ``matrix`` (rows in ``ids`` order); no copy when already unit float32."""
        import numpy as np

        arr = np.asarray(matrix)
        if arr.ndim != 2:
            raise DimensionMismatch(f"expected a 2-D matrix, got shape {arr.shape}")
        index = cls(int(arr.shape[1]))
        index.add(ids, arr)
        return index

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def add(self, ids: Sequence[str], vectors: ArrayLike) -> None:
        """Append ``vectors`` (shape ``(len(ids), dims)``) under ``ids``."""
        import numpy as np

        arr = np.asarray(vectors)
        if arr.ndim == 1:
            arr = arr.reshape(1, -1)
        if arr.ndim != 2 or arr.shape[1] != self.dims:
            raise DimensionMismatch(f"index holds {self.dims}-dimension vectors, got shape {arr.shape}")
        if arr.shape[0] != len(ids):
            raise ValueError(f"{len(ids)} ids for {arr.shape[0]} vectors")
        if arr.shape[0] == 0:
            return
        self._parts.append(_unit_rows(arr))
        self._ids.extend(ids)
        self._matrix = None

    def matrix(self) -> NDArray[np.float32]:
        """All vectors as one contiguous ``(n, dims)`` float32 matrix (built once)."""
        import numpy as np

        if self._matrix is None:
            if not self._parts:
                self._matrix = np.zeros((0, self.dims), dtype=np.float32)
            elif len(self._parts) == 1:
                self._matrix = self._parts[0]
            else:
                self._matrix = np.concatenate(self._parts, axis=0)
            self._parts = [self._matrix] if len(self._matrix) else []
        return self._matrix

    def search(self, query: ArrayLike, top_k: int = 5, min_score: float = 0.0) -> list[Hit]:
        """The ``top_k`` most similar vectors with score ≥ ``min_score``, best first."""
        scores = self.scores(query)
        return [Hit(self._ids[i], float(scores[i]), i) for i in top_positions(scores, top_k, min_score)]

    def scores(self, query: ArrayLike) -> NDArray[np.float32]:
        """The cosine of ``query`` with every vector, in insertion order."""
        import numpy as np

        q = np.asarray(query, dtype=np.float32)
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1 or q.shape[0] != self.dims:
            raise DimensionMismatch(f"index holds {self.dims}-dimension vectors, query has shape {q.shape}")
        matrix = self.matrix()
        if matrix.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        scores: NDArray[np.float32] = matrix @ _unit_rows(q.reshape(1, -1))[0]
        return scores


def _unit_rows(arr: NDArray[np.generic]) -> NDArray[np.float32]:
    import numpy as np

    out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(out).all():  # a NaN row compares false with every score: it hid others' hits
        row = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise ValueError(f"vector {row} holds NaN or infinite values")
    norms = np.linalg.norm(out, axis=1)
    if np.all(np.abs(norms - 1.0) <= _UNIT_TOLERANCE):
        return out
    if out is arr:
        out = out.copy()  # never rescale the caller's array in place
    np.divide(out, np.where(norms == 0, 1.0, norms)[:, None], out=out)
    return out


def check_top(top_k: int, min_score: float) -> None:
    """ValueError unless ``top_k`` is an integer ≥ 1 and ``min_score`` a number (before: a
    ``top_k`` of 2.5 or NaN was numpy's "Partition index must be integer", after the corpus
    was read and embedded)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer of at least 1, got {top_k!r}")
    # NaN: every score compares false, so no hit, and no error said why
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float)) or math.isnan(min_score):
        raise ValueError(f"min_score must be a number, got {min_score!r}")


def top_positions(scores: NDArray[np.float32], top_k: int, min_score: float = 0.0) -> list[int]:
    """Positions of the ``top_k`` largest ``scores`` that are ≥ ``min_score``, best first, ties
    by lower position first."""
    check_top(top_k, min_score)
    if scores.shape[0] == 0:
        return []
    return [i for i in _top_positions(scores, top_k) if scores[i] >= min_score]


def _top_positions(scores: NDArray[np.float32], k: int) -> list[int]:
    """Positions of the ``k`` largest scores, ties by lower position first."""
    import numpy as np

    n = scores.shape[0]
    if k >= n:
        candidates = np.arange(n)
    else:
        kth = np.argpartition(scores, n - k)[n - k]
        # every position tied with the k-th score competes, so a tie at the boundary is
        # resolved by position rather than by argpartition's arbitrary choice
        candidates = np.flatnonzero(scores >= scores[kth])
    picked = candidates[np.lexsort((candidates, -scores[candidates]))][:k]
    return [int(i) for i in picked]
