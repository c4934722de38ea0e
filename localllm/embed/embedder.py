"""The Embedder protocol, the identity that keys a store, and the deterministic FakeEmbedder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from localllm.embed.registry import Role
from localllm.errors import EmbedError
from localllm.wire import text_problem

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_LCG_MUL = 6364136223846793005
_LCG_ADD = 1442695040888963407
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class EmbedderIdentity:
    """Everything that changes the vectors an embedder produces (a store is keyed by it)."""

    model: str
    dims: int | None
    pooling: str
    query_prefix: str
    document_prefix: str
    normalized: bool = True
    #: sha256 of the weights when known (a managed embedder's pin or GGUF file): a GGUF
    #: replaced at the same path, or a pin moved to other weights, keys new stores
    weights: str | None = None

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        if doc["weights"] is None:
            del doc["weights"]  # keys stores as before weights were known (endpoints, fakes)
        return doc


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors, one row per text, in input order."""

    @property
    def identity(self) -> EmbedderIdentity: ...

    def embed(self, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
        """Embed ``texts`` as ``role`` ("query" or "document"); shape ``(len(texts), dims)``."""
        ...


def check_texts(texts: Sequence[str]) -> None:
    """What ``embed()`` takes: a sequence of str (TypeError otherwise: one string would be
    embedded as its characters), each of it UTF-8 text (EmbedError naming the text: a lone
    surrogate, Python's reading of bytes that are not UTF-8, failed the request's encoding
    as "a bug in localllm" in `localllm route`, `search` and `embed`)."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not one string")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"embed() takes texts (str): text {i} is {type(text).__name__}")
        if (why := text_problem(text)) is not None:
            raise EmbedError(f"text {i} to embed {why}", hint="pass UTF-8 text: decode bytes with their own encoding")


def embed_rows(embedder: Embedder, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
    """``embedder.embed(texts, role)``, checked to be one row per text (any embedder, ours or not).

    A custom embedder answering too few or too many rows is the
    :class:`~localllm.errors.EmbedServerError` an endpoint answering so is, naming the embedder
    and both counts, not a bare ``ValueError``/``IndexError`` from the code that zips them.
    """
    from localllm.errors import EmbedServerError

    matrix = embedder.embed(texts, role)
    shape = getattr(matrix, "shape", None)
    rows = shape[0] if isinstance(shape, tuple) and len(shape) == 2 else None
    if rows != len(texts):
        identity = getattr(embedder, "identity", None)
        model = getattr(identity, "model", None)
        name = type(embedder).__name__ + (f" (model {model!r})" if model else "")
        got = f"{rows} vectors" if rows is not None else f"an array of shape {shape}"
        raise EmbedServerError(
            f"embedder {name} returned {got} for {len(texts)} {role} texts (one row per text is the contract)",
            hint="fix the embedder's embed() to return an array of shape (len(texts), dims)",
        )
    return matrix


def _fnv1a32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


def fake_vector(text: str, dims: int) -> list[float]:
    """The FakeEmbedder vector of ``text`` (pure Python, before float32 conversion).

    Everything up to and including the first ``": "`` is dropped (so task prefixes do not
    change the vector); the seed is FNV-1a 32-bit of the UTF-8 bytes; a 64-bit LCG
    ``s = s*6364136223846793005 + 1442695040888963407`` is advanced before each component,
    whose value is the high 32 bits of ``s`` read as int32 divided by 2^31. The vector is
    L2-normalised; a zero vector becomes ``[1, 0, …]``.
    """
    _, sep, rest = text.partition(": ")
    body = rest if sep else text
    state = _fnv1a32(body.encode("utf-8"))
    out: list[float] = []
    for _ in range(dims):
        state = (state * _LCG_MUL + _LCG_ADD) & _U64
        high = state >> 32
        if high >= 1 << 31:
            high -= 1 << 32
        out.append(high / 2**31)
    norm = sum(v * v for v in out) ** 0.5
    if norm == 0.0:
        return [1.0] + [0.0] * (dims - 1)
    return [v / norm for v in out]


class FakeEmbedder:
    """A deterministic embedder for tests: equal texts give equal vectors, nothing else is similar.

    See :func:`fake_vector` for the algorithm. ``calls`` and ``texts_embedded`` count
    the work done, so tests can prove a cache made no embedding calls.
    """

    def __init__(
        self, dims: int = 384, *, model: str = "fake", query_prefix: str = "", document_prefix: str = ""
    ) -> None:
        if dims <= 0:
            raise ValueError(f"dims must be positive, got {dims}")
        self.dims = dims
        self.calls = 0
        self.texts_embedded = 0
        self._identity = EmbedderIdentity(
            model=model,
            dims=dims,
            pooling="fake",
            query_prefix=query_prefix,
            document_prefix=document_prefix,
        )

    @property
    def identity(self) -> EmbedderIdentity:
        return self._identity

    def embed(self, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
        import numpy as np

        check_texts(texts)
        prefix = self._identity.query_prefix if role == "query" else self._identity.document_prefix
        self.calls += 1
        self.texts_embedded += len(texts)
        rows = [fake_vector(prefix + t, self.dims) for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dims)
