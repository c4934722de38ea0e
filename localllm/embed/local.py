"""LocalEmbedder: the Embedder over a llama-server ``/v1/embeddings`` endpoint.

What it guarantees, whatever the server is:

* the registry's role prefix is applied (and only that);
* requests stay within server limits: at most ``batch_size`` inputs and about
  ``batch_tokens`` tokens per request;
* an input longer than ``max_input_tokens`` never reaches the server as text (llama-server
  would answer HTTP 500): by default it is **truncated** to its first tokens, keeping the
  model's special tokens (counted with ``/tokenize``, sent as token ids) and logged as a
  warning; with ``on_too_long="error"`` it raises :class:`InputTooLong` instead;
* rows come back in input order (by ``index``), the count and dims are checked;
* vectors are unit length: Matryoshka output dims are truncated and re-normalised here;
  otherwise ``normalize`` decides: ``auto`` L2-normalises here when the server's vectors
  are not unit (llama-cpp-python's, TEI's without ``normalize``), noted once per embedder;
  ``true`` always does; ``false`` refuses non-unit vectors.

``base_url`` is a URL, or an :class:`~localllm.managed.upstream.Upstream` (a managed
embedder's: a running service or its own server), a
:class:`~localllm.managed.server.ManagedServer` or a callable returning the URL: the server
is then found or fetched and started on the first embed call, a broken connection is retried
once on a fresh resolution (a crashed server respawned: the upstream's one failure rule,
the same as the chat agent's), and ``close()`` stops it.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from localllm import _http
from localllm._http import map_httpx_errors
from localllm._upstream import REDIRECT_HINT, read_error, redirected
from localllm.embed.embedder import EmbedderIdentity, check_texts
from localllm.embed.registry import ROLES, ModelInfo, Role, default_model, lookup
from localllm.errors import (
    DimensionMismatch,
    EmbedError,
    EmbedServerError,
    InputTooLong,
    LocalLLMError,
    truncate_detail,
)
from localllm.managed.upstream import Target, Upstream
from localllm.managed.vocab import MAX_TOKENIZE_BYTES
from localllm.wire import finite_float

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from localllm.config import EmbedderDecl
    from localllm.managed.server import ManagedServer
    from localllm.managed.spec import ServerSpec

log = logging.getLogger(__name__)

OnTooLong = Literal["truncate", "error"]

#: a token covers at least one UTF-8 byte; this allows for the special tokens and a
#: SentencePiece leading-space token, so shorter texts need no ``/tokenize`` round trip
_SPECIAL_HEADROOM = 4
_NORM_TOLERANCE = 1e-3
#: flags embedding_server_args owns
_DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=120.0, write=30.0, pool=10.0)


class LocalEmbedder:
    """Embed through llama-server (``--embeddings``) at ``base_url``.

    ``model`` names the registry entry (prefixes, dims, context); ``dims`` below the
    native size selects a Matryoshka size. ``max_input_tokens`` defaults to the registry
    value (512 for unknown models).
    """

    def __init__(
        self,
        base_url: str | Callable[[], str] | ManagedServer | Upstream,
        model: str,
        *,
        api_key: str | None = None,
        dims: int | None = None,
        model_info: ModelInfo | None = None,
        on_too_long: OnTooLong = "truncate",
        max_input_tokens: int | None = None,
        batch_size: int = 64,
        batch_tokens: int = 16384,
        timeout: float | httpx.Timeout | None = None,
        transport: httpx.BaseTransport | None = None,
        normalize: bool | Literal["auto"] = "auto",
        api_key_env: str | None = None,
    ) -> None:
        if normalize not in ("auto", True, False):
            raise ValueError(f"normalize must be 'auto', True or False, not {normalize!r}")
        if on_too_long not in ("truncate", "error"):
            raise ValueError(f"on_too_long must be 'truncate' or 'error', not {on_too_long!r}")
        if batch_size < 1 or batch_tokens < 1:
            raise ValueError("batch_size and batch_tokens must be positive")
        self.model = model
        self.info = model_info if model_info is not None else lookup(model)
        self.out_dims = self.info.output_dims(dims)
        self.on_too_long: OnTooLong = on_too_long
        self.max_input_tokens = max_input_tokens or self.info.max_input_tokens
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        #: inputs truncated so far (each also logged as a warning)
        self.truncated = 0
        #: POSTs to /v1/embeddings so far
        self.requests = 0
        #: the managed server this embedder owns (stopped by ``close()``), if any
        self.server: ManagedServer | None = None
        if isinstance(base_url, Upstream):
            self.upstream = base_url
            self.server = base_url.own_server
        elif isinstance(base_url, str):
            self.upstream = Upstream(endpoint=base_url)
        else:
            self.upstream = Upstream(server=base_url)
            if not callable(base_url):
                self.server = base_url
        #: POSTs retried after a broken connection (the upstream's one failure rule)
        self.retries = 0
        self._api_key = api_key
        self._timeout = timeout if timeout is not None else _DEFAULT_TIMEOUT
        self._transport = transport
        self._client: httpx.Client | None = None
        self._specials: tuple[list[int], list[int]] | None = None
        self._native_dims: int | None = self.info.dims
        self._cut: list[int] = []
        self.normalize = normalize
        #: set once ``normalize: auto`` has normalised a non-unit answer here
        self.normalized_here = False
        #: named in the hint when the server refuses the key
        self.api_key_env = api_key_env
        #: the ``model`` sent in request bodies; ``served_by``: "service" or "sidecar" once managed
        self.request_model = model
        self.served_by: str | None = None
        self._weights_sha256: str | None = None

    def __repr__(self) -> str:  # no api key here, ever
        target = self.upstream.current()
        url = target.root if target is not None else None
        return f"LocalEmbedder(model={self.model!r}, dims={self.out_dims!r}, url={url!r})"

    def __enter__(self) -> LocalEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client (and stop the managed server this embedder owns)."""
        self._drop_client()
        self.upstream.stop()

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity(
            model=self.info.id if self.info.known else self.model,
            dims=self.out_dims if self.out_dims is not None else self._native_dims,
            pooling=self.info.pooling,
            query_prefix=self.info.query_prefix,
            document_prefix=self.info.document_prefix,
            normalized=True,
            weights=self._weights(),
        )

    def _weights(self) -> str | None:
        """The sha256 of a managed embedder's weights (hashed once; ``None`` for an endpoint,
        or while the file is missing: the first embed reports that)."""
        spec = self.upstream.spec
        if self._weights_sha256 is None and spec is not None:
            from localllm.managed.upstream import model_sha256

            with contextlib.suppress(LocalLLMError, OSError):
                self._weights_sha256 = model_sha256(spec.source, spec.base_dir)
        return self._weights_sha256

    # ------------------------------------------------------------------ public

    def embed(self, texts: Sequence[str], role: Role) -> NDArray[np.float32]:
        """Embed ``texts`` as ``role``; float32 ``(len(texts), dims)``, unit rows, input order."""
        import numpy as np

        check_texts(texts)
        if role not in ROLES:
            raise ValueError(f"role must be 'query' or 'document', not {role!r}")
        prefix = self.info.prefix(role)
        inputs: list[str | list[int]] = []
        costs: list[int] = []
        self._cut = []
        for i, text in enumerate(texts):
            item, cost = self._fit(i, prefix + text)
            inputs.append(item)
            costs.append(cost)
        if self._cut:  # one line per call, not per input: a corpus can truncate hundreds
            log.warning(
                "%d of %d embedding inputs truncated to %d tokens (longest %d) for model %s",
                len(self._cut),
                len(texts),
                self.max_input_tokens,
                max(self._cut),
                self.info.id if self.info.known else self.model,
            )
        parts = [self._post(inputs[a:b]) for a, b in self._batches(costs)]
        if not parts:
            width = self.out_dims or self._native_dims or 0
            return np.zeros((0, width), dtype=np.float32)
        return self._finish(np.concatenate(parts, axis=0))

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """Token ids of ``text`` as the server's tokenizer sees it (``POST /tokenize``)."""
        body = {"content": text, "add_special": add_special, "parse_special": True}
        data = self._request("/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EmbedServerError(f"/tokenize answered without a token list: {truncate_detail(str(data))}")
        return tokens

    # ------------------------------------------------------------------ limits

    def _special_tokens(self) -> tuple[list[int], list[int]]:
        """The tokens the server adds around every input (e.g. [CLS] … [SEP]), found once."""
        if self._specials is None:
            probe = "a"
            plain = self.tokenize(probe)
            full = self.tokenize(probe, add_special=True)
            for start in range(len(full) - len(plain) + 1):
                if full[start : start + len(plain)] == plain:
                    self._specials = (full[:start], full[start + len(plain) :])
                    break
            else:
                self._specials = ([], [])
        return self._specials

    def _fit(self, index: int, text: str) -> tuple[str | list[int], int]:
        """The input to send for ``text`` and its token cost (exact or an upper bound)."""
        limit = self.max_input_tokens
        raw = text.encode("utf-8")
        bound = len(raw) + _SPECIAL_HEADROOM
        if bound <= limit:
            return text, bound
        head, tail = self._special_tokens()
        # a server (the service) tokenizes at most MAX_TOKENIZE_BYTES at once: far more tokens than
        # any embedder takes, so a longer text is counted and cut by its head
        clipped = len(raw) > MAX_TOKENIZE_BYTES
        ids = self.tokenize(raw[:MAX_TOKENIZE_BYTES].decode("utf-8", "ignore") if clipped else text)
        total = len(head) + len(ids) + len(tail)
        if total <= limit and not clipped:
            return text, total
        if self.on_too_long == "error":
            raise InputTooLong(
                f"input {index} has {'more than ' if clipped else ''}{total} tokens; the model {self.model!r} "
                f"takes at most {limit} (shorten it, or use on_too_long='truncate')"
            )
        keep = max(limit - len(head) - len(tail), 0)
        self.truncated += 1
        self._cut.append(total)
        return head + ids[:keep] + tail, limit

    def _batches(self, costs: Sequence[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        start, used = 0, 0
        for i, cost in enumerate(costs):
            if i > start and (i - start >= self.batch_size or used + cost > self.batch_tokens):
                out.append((start, i))
                start, used = i, 0
            used += cost
        if start < len(costs):
            out.append((start, len(costs)))
        return out

    # ------------------------------------------------------------------ wire

    def _post(self, batch: Sequence[str | list[int]]) -> NDArray[np.float32]:
        import numpy as np

        body: dict[str, Any] = {"input": list(batch), "encoding_format": "base64"}
        self.requests += 1
        data = self._request("/v1/embeddings", body)
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) != len(batch):
            got = len(items) if isinstance(items, list) else "no"
            raise EmbedServerError(f"the embedding server returned {got} vectors for {len(batch)} inputs")
        rows: list[Any] = [None] * len(batch)
        for item in items:
            idx = item.get("index") if isinstance(item, dict) else None
            if not isinstance(idx, int) or not 0 <= idx < len(batch) or rows[idx] is not None:
                raise EmbedServerError(f"the embedding server returned a bad or repeated index {idx!r}")
            rows[idx] = self._decode(item.get("embedding"))
        width = {len(r) for r in rows}
        if len(width) != 1:
            raise DimensionMismatch(f"the embedding server returned vectors of mixed sizes {sorted(width)}")
        (dims,) = width
        if dims == 0:  # an empty list per input: an unknown model's dims became 0,
            # then Index(0) a bare ValueError
            raise EmbedServerError(
                f"model {self.model!r}: the embedding server returned empty vectors for {len(batch)} inputs: "
                "nothing was stored"
            )
        if self._native_dims is None:
            self._native_dims = dims
        elif dims != self._native_dims:
            raise DimensionMismatch(
                f"model {self.model!r} should give {self._native_dims}-dimension vectors, the server "
                f"returned {dims}: is the server running a different GGUF?"
            )
        matrix = np.stack(rows).astype(np.float32, copy=False)
        finite = np.isfinite(matrix).all(axis=1)
        if not finite.all():  # a NaN row would be stored for good and rank nowhere
            index = int(np.flatnonzero(~finite)[0])
            raise EmbedServerError(
                f"model {self.model!r}: the embedding server returned a vector with NaN or infinite values "
                f"for input {index} of {len(batch)}: nothing was stored"
            )
        zero = ~matrix.any(axis=1)
        if zero.any():  # no direction: it scored 0 against everything, stored for good like a NaN
            index = int(np.flatnonzero(zero)[0])
            raise EmbedServerError(
                f"model {self.model!r}: the embedding server returned an all-zero vector for input {index} "
                f"of {len(batch)}: nothing was stored"
            )
        return matrix

    @staticmethod
    def _decode(value: Any) -> NDArray[np.float32]:
        import numpy as np

        if isinstance(value, str):
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError:  # binascii.Error
                raise EmbedServerError("the embedding server returned a vector that is not base64") from None
            if len(raw) % 4:
                raise EmbedServerError("the embedding server returned a base64 vector of odd length")
            return np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if isinstance(value, list) and value and isinstance(value[0], list):
            value = value[0]  # pooling none answers per-token rows; the first row is all we use
        if isinstance(value, list) and all(finite_float(x) is not None for x in value):
            wide = np.asarray(value, dtype=np.float64)
            if not (np.abs(wide) <= np.finfo(np.float32).max).all():
                raise EmbedServerError("the embedding server returned a vector with values past float32's range")
            return wide.astype(np.float32)
        raise EmbedServerError(
            "the embedding server returned an item without a list of finite numbers as its embedding"
        )

    def _finish(self, matrix: NDArray[np.float32]) -> NDArray[np.float32]:
        import numpy as np

        native = matrix.shape[1]
        want = self.out_dims
        if want is not None and want > native:
            raise DimensionMismatch(f"dims {want} requested but model {self.model!r} gives {native}")
        if want is not None and want < native:
            if self.info.matryoshka_layer_norm:
                centred = matrix - matrix.mean(axis=1, keepdims=True)
                matrix = centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + 1e-5)
            matrix = np.ascontiguousarray(matrix[:, :want])
            norms = np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)
            return (matrix / np.where(norms == 0, 1, norms)).astype(np.float32, copy=False)
        # float64: float32 squares of components near 1e-23 underflow to a norm of 0
        norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOLERANCE)
        if self.normalize is True or (bad.size and self.normalize == "auto"):
            if bad.size and not self.normalized_here and self.normalize == "auto":
                self.normalized_here = True
                log.info(
                    "embedder %s: the server's vectors are not unit (L2 norm %.6f); normalising them here",
                    self.model,
                    float(norms[bad[0]]),
                )
            return (matrix / np.where(norms == 0, 1, norms)[:, None]).astype(np.float32, copy=False)
        if bad.size:
            fix = (
                "start llama-server with a pooling type and without --embd-normalize (its default, 2, is "
                "Euclidean normalisation)"
                if self.server is not None
                else "set normalize: auto (or true) to normalise them here"
            )
            raise EmbedServerError(
                f"the embedding server returned a vector with L2 norm {float(norms[bad[0]]):.6f}, not 1: {fix}"
            )
        return matrix

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = _http.client(timeout=self._timeout, headers=headers, transport=self._transport)
        return self._client

    def _request(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to ``path``: the one place httpx errors become EmbedErrors."""
        attempts: list[Target] = []

        def send(target: Target) -> httpx.Response:
            attempts.append(target)
            sent = {**body, "model": target.model or self.model}  # a service names the model its way
            return self._http().post(target.url(path), json=sent, headers=target.headers())

        def failed(reason: str, exc: BaseException) -> EmbedServerError:
            url = attempts[-1].url(path) if attempts else path
            retried = "; retried once on a fresh connection" if len(attempts) > 1 else ""
            return EmbedServerError(f"cannot reach the embedding server at {url}: {reason} ({exc}){retried}")

        with map_httpx_errors(failed):
            try:  # a failed respawn raises its own FetchError/SidecarError, as a first start does
                response, target = self.upstream.call(send, reset=self._drop_client)
            finally:
                self.retries += max(len(attempts) - 1, 0)
        self.request_model = target.model or self.model
        if self.upstream.spec is not None:
            self.served_by = target.route.value
        url = target.url(path)
        moved = redirected(response.status_code, response.headers.get("location"), url)
        if moved is not None:
            raise EmbedServerError(f"embedding server {moved}", hint=REDIRECT_HINT)
        if response.status_code >= 400:
            upstream = read_error(response.status_code, response.text)
            hint = upstream.auth_hint(self.api_key_env) if upstream.auth else ""
            if response.status_code == 501 and self.server is not None:
                hint = "start llama-server with --embeddings"
            raise EmbedServerError(f"embedding server {upstream.describe(url)}", hint=hint)
        try:
            return response.json()
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than json decodes
            raise EmbedServerError(
                f"embedding server {url} answered non-JSON: {truncate_detail(response.text)}"
            ) from exc


def embedding_server_args(model_info: ModelInfo, parallel: int = 1, *, with_ctx: bool = False) -> list[str]:
    """llama-server arguments for an embedding sidecar of ``model_info``.

    The micro-batch (and batch: ``--embeddings`` forces ``-b`` = ``-ub``) is the model's
    context so that one input always fits. ``parallel`` must divide the micro-batch: BERT
    models abort at load otherwise. With a :class:`~localllm.managed.server.ManagedServer`
    pass ``ctx_per_slot=model_info.context`` and ``parallel`` to it (it owns ``-c`` and
    ``--parallel``); ``with_ctx=True`` adds ``-c context×parallel`` for a bare command line.
    """
    if parallel < 1:
        raise EmbedError(f"parallel must be at least 1, got {parallel}")
    ubatch = model_info.context
    if ubatch % parallel:
        divisors = [d for d in range(1, min(ubatch, 16) + 1) if ubatch % d == 0]
        raise EmbedError(
            f"parallel {parallel} does not divide the micro-batch {ubatch} of {model_info.id!r} "
            f"(llama-server aborts BERT models at load); use one of {divisors}"
        )
    args = ["--embeddings", "--pooling", model_info.pooling, "-ub", str(ubatch), "-b", str(ubatch)]
    if with_ctx:
        args += ["-c", str(ubatch * parallel)]
    return args


def embedding_spec(decl: EmbedderDecl, *, base_dir: Path | None = None) -> ServerSpec:
    """The :class:`~localllm.managed.spec.ServerSpec` of a managed ``embedders:`` declaration.

    ``model`` is a registry id fetched through the pins, or a path to a GGUF (relative to
    ``base_dir``); the embedding flags and the per-slot context come from the registry. The
    embedder and a service serving the declaration both start their server from this.
    """
    from localllm.config.decls import EMBEDDING_FLAGS, MANAGED_FLAGS
    from localllm.managed.spec import ServerSpec

    where = f"embedders.{decl.name}"
    model = decl.model or default_model()
    clashing = sorted({a.partition("=")[0] for a in decl.extra_args} & (MANAGED_FLAGS | EMBEDDING_FLAGS))
    if clashing:
        raise EmbedError(
            f"{where}.extra_args: must not set {', '.join(clashing)}; localllm sets them "
            "(use port:, parallel: and the model registry instead)"
        )
    info = _model_info(model)
    try:
        args = embedding_server_args(info, decl.parallel)
    except EmbedError as exc:
        raise EmbedError(f"{where}: {exc}") from exc
    return ServerSpec(
        id=f"embed:{decl.name}",
        role="embedding",
        source=model,
        parallel=decl.parallel,
        ctx_per_slot=info.context,
        args=(*args, *decl.extra_args),
        threads=decl.threads,
        server_bin=decl.server_bin,
        health_timeout=decl.health_timeout,
        port=decl.port,
        base_dir=base_dir,
    )


def embedder_from_decl(decl: EmbedderDecl, *, base_dir: Path | None = None, **options: Any) -> LocalEmbedder:
    """A LocalEmbedder for an ``embedders:`` declaration.

    Endpoint mode attaches to ``endpoint``. Managed mode holds an
    :class:`~localllm.managed.upstream.Upstream` of its :func:`embedding_spec`: a running
    service serving the same model and build (``service:``), else its own server, started
    lazily on the first embed call; ``close()`` stops it. ``options`` go to
    :class:`LocalEmbedder` (e.g. ``on_too_long``).
    """
    from localllm import settings

    where = f"embedders.{decl.name}"
    normalize: Any = decl.normalize
    api_key: str | None = None
    if decl.api_key_env:
        api_key = settings.env_value(decl.api_key_env)
        if not api_key:
            raise EmbedError(
                f"{where}.api_key_env: environment variable {decl.api_key_env} is not set; "
                "export it or remove api_key_env"
            )
        issue = _http.token_issue(api_key)
        if issue:
            raise EmbedError(
                f"{where}.api_key_env: the value of {decl.api_key_env} {issue}",
                hint=f"export {decl.api_key_env} again with the key alone",
            )
    if decl.endpoint:
        model = decl.model or decl.name
        return LocalEmbedder(
            decl.endpoint,
            model,
            api_key=api_key,
            dims=decl.dims,
            api_key_env=decl.api_key_env,
            normalize=normalize,
            **options,
        )
    upstream = Upstream(embedding_spec(decl, base_dir=base_dir), policy=decl.service)
    try:
        upstream.server  # noqa: B018 - built now (no I/O): a bad flag is an error here, not at the first embed
    except ValueError as exc:
        raise EmbedError(f"{where}: {exc}") from exc
    model = decl.model or default_model()
    return LocalEmbedder(upstream, model, model_info=_model_info(model), dims=decl.dims, normalize=normalize, **options)


def _model_info(model: str) -> ModelInfo:
    """The registry entry of a model id, or of a GGUF path by its file name."""
    return lookup(Path(model).name if model.endswith(".gguf") else model)
