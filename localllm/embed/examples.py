"""The examples tier: labelled cases as a nearest-neighbour answer and as dynamic few-shot.

A gate's ``examples:`` names a cases file (the eval cases format: ``args.<input>`` the
text, ``expect.<field>`` its label) and an embedder. The examples are embedded once (as
``query`` texts, so example and question are embedded alike) and the vectors cached in
the :class:`~localllm.embed.store.Store` under their content hash: an edited examples file
re-embeds only the changed lines, an unchanged one embeds nothing. Then, per call:

- :func:`vote`: the ``k`` nearest examples vote for each voted field, each with its cosine
  similarity (clipped at 0) as its weight. The answer is the heaviest label; the field's
  confidence is the *vote margin* ``(w_first − w_second) / Σw`` (1.0 when all agree, 0.0
  on a tie) times the similarity of the nearest example with that label, so that a
  question far from every example (out of scope) is not confident just because its
  distant neighbours agree; the answer's confidence is the smallest over its fields.
  ``meta.confidence_method`` is :data:`CONFIDENCE_METHOD`. No LLM is started.
- :func:`render_shots`: the nearest examples rendered as few-shot pairs
  (``<Input>: <text>`` then the labels as one line of JSON), for the prompt's
  ``{{ examples }}``.

Out of scope (:meth:`ExampleSet.novelty`, :meth:`ExampleSet.novelty_bar`): an input's
*novelty score* is its cosine similarity to the nearest in-scope example minus its
similarity to the nearest out-of-scope example (examples labelled ``out_of_scope:``; 0
when there are none). The bar it must clear is calibrated from the examples themselves
(:func:`localllm.calibrate.novelty_bar`): the highest score any out-of-scope example gets
against the others (leave-one-out); without out-of-scope examples, each example scored
against the *other* labels' examples only, as if its own label were an intent never seen.
An input at or below the bar is out of scope: no local tier answers it.

An example repeated in the file (its text as an embedder sees it, under the same labels:
:func:`~localllm.eval.cases.distinct_examples`) is one example, read once: a near input would
otherwise find it twice among its ``k`` and give it two votes. The same text under other
labels is a problem of the file naming both lines.

``leave_one_out`` (what ``localllm eval`` uses) skips any example whose text is the
question's — compared NFKC-normalised, case-folded, white space collapsed, as an embedder
sees them alike — so a case that is also an example is never answered from its own label.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.agents.base import Agent
from localllm.calibrate import same_text
from localllm.embed.embedder import Embedder
from localllm.errors import AgentError, ErrorKind, StoreUnavailable
from localllm.wire import AskRequest, AskResponse

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from localllm.calibrate import NoveltyBar
    from localllm.eval.cases import Case

__all__ = [
    "CONFIDENCE_METHOD",
    "TIER",
    "Example",
    "ExampleSet",
    "ExamplesAgent",
    "Neighbour",
    "Vote",
    "load_examples",
    "render_shots",
    "vote",
]

log = logging.getLogger(__name__)

#: ``meta.tier`` and the alias the examples tier answers as (not a config alias: those start with ``agent.``)
TIER = "examples"
CONFIDENCE_METHOD = "knn_vote_margin_x_similarity"
#: question vectors an ExampleSet keeps (a call asks for the same question up to three times)
_QUERY_CACHE = 16
#: similarities computed at once by the novelty bar (rows × examples): bounds its memory
_SIMILARITY_CELLS = 1 << 22
#: the store's chunking key for example vectors (one store per embedder identity and this)
_STORE_KEY = {"examples": 1, "role": "query"}


@dataclass(frozen=True)
class Example:
    """One labelled example: its text and the single expected value of each labelled field
    (``line``: its line in the examples file, 0 when it was not read from one)."""

    id: str
    text: str
    labels: dict[str, Any]
    line: int = 0


@dataclass(frozen=True)
class Neighbour:
    example: Example
    score: float


@dataclass(frozen=True)
class Vote:
    """The k-NN answer: voted fields → label, the answer's confidence and each field's."""

    answer: dict[str, Any]
    confidence: float
    fields: dict[str, float]
    neighbours: list[Neighbour] = field(default_factory=list)


def load_examples(path: Path, input_arg: str) -> tuple[list[Example], list[Example]]:
    """The labelled cases of ``path`` as examples, and the repeats left out of them.

    Cases marked ``"labelled": false`` and cases without text ``args.<input_arg>`` are
    skipped; a case repeating an earlier example (the same text as an embedder sees it, the
    same labels) is one example (:func:`~localllm.eval.cases.distinct_examples`). A
    ConfigError for a bad file, as ``load_cases``, and for one text under two labels."""
    from localllm.eval.cases import distinct_examples, load_cases

    kept, repeats = distinct_examples(load_cases(path, regular=True), input_arg, path)

    def example(case: Case) -> Example:
        return Example(case.id, case.args[input_arg], case.expect.labels(), case.line)

    return [example(c) for c in kept], [example(c) for c in repeats]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def vote(neighbours: Sequence[Neighbour], fields: Sequence[str]) -> Vote:
    """Similarity-weighted vote of ``neighbours`` (best first) on each of ``fields``.

    Ties go to the label whose best neighbour ranks first. No neighbours (or none labelling
    a field) gives that field confidence 0.0 and no answer for it.
    """
    answer: dict[str, Any] = {}
    confidences: dict[str, float] = {}
    for name in fields:
        weights: dict[str, float] = {}
        values: dict[str, Any] = {}
        for n in neighbours:
            if name not in n.example.labels:
                continue
            label = n.example.labels[name]
            k = _key(label)
            values.setdefault(k, label)
            weights[k] = weights.get(k, 0.0) + max(n.score, 0.0)
        if not weights:
            confidences[name] = 0.0
            continue
        ranked = sorted(weights, key=lambda k: -weights[k])  # stable: first-seen wins a tie
        total = sum(weights.values())
        second = weights[ranked[1]] if len(ranked) > 1 else 0.0
        answer[name] = values[ranked[0]]
        nearest = max(
            n.score for n in neighbours if name in n.example.labels and _key(n.example.labels[name]) == ranked[0]
        )
        margin = (weights[ranked[0]] - second) / total if total > 0 else 0.0
        confidences[name] = margin * min(max(nearest, 0.0), 1.0)
    overall = min(confidences.values()) if confidences else 0.0
    return Vote(answer, overall, confidences, list(neighbours))


def _novelty(similarities: Sequence[float], outside: Sequence[bool]) -> float:
    """max similarity over in-scope examples − max over out-of-scope ones (0 when none)."""
    inside = [v for v, o in zip(similarities, outside, strict=True) if not o]
    beyond = [v for v, o in zip(similarities, outside, strict=True) if o and math.isfinite(v)]
    nearest = max(inside, default=-math.inf)
    return nearest - (max(beyond) if beyond else 0.0)


def _similarity_blocks(
    matrix: NDArray[np.float32], rows: NDArray[np.intp]
) -> Iterator[tuple[NDArray[np.intp], NDArray[np.float64]]]:
    """``(rows, matrix[rows] @ matrix.T)`` a block of rows at a time, each block at most
    :data:`_SIMILARITY_CELLS` cells: the whole n × n matrix (and its masks) took 4.7 GiB at
    20,000 examples and grows with n²; a block is ~60 MiB whatever n is."""
    step = max(1, _SIMILARITY_CELLS // max(1, len(matrix)))
    for start in range(0, len(rows), step):
        block = rows[start : start + step]
        yield block, (matrix[block] @ matrix.T).astype("float64")


def render_shots(neighbours: Sequence[Neighbour], input_arg: str, fields: Sequence[str] | None = None) -> str:
    """The neighbours as few-shot pairs, the nearest *last* (closest to the question):
    ``<Input>: <text>`` then ``{"field": label, …}``, separated by blank lines."""
    label = input_arg.replace("_", " ").capitalize()
    blocks = []
    for n in reversed(list(neighbours)):
        shown = {k: v for k, v in n.example.labels.items() if fields is None or k in fields}
        blocks.append(f"{label}: {n.example.text}\n{json.dumps(shown, ensure_ascii=False, separators=(',', ':'))}")
    return "\n\n".join(blocks)


class ExampleSet:
    """Examples with their vectors (embedded on first use, cached in the store)."""

    def __init__(
        self,
        examples: Sequence[Example],
        embedder: Embedder,
        *,
        store_root: Path | None = None,
        leave_one_out: bool = False,
    ) -> None:
        self.examples = list(examples)
        #: each example's text as leave-one-out compares it (:func:`~localllm.calibrate.same_text`)
        self._texts = [same_text(e.text) for e in self.examples]
        self.embedder = embedder
        self.store_root = store_root
        self.leave_one_out = leave_one_out
        self._matrix: NDArray[np.float32] | None = None
        self._bars: dict[tuple[tuple[str, ...], str], NoveltyBar] = {}
        self._queries: dict[str, NDArray[np.float32]] = {}
        self._lock = threading.Lock()

    def _embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        from localllm.embed.embedder import embed_rows

        return embed_rows(self.embedder, list(texts), "query")

    def matrix(self) -> NDArray[np.float32]:
        """One unit row per example, in order; embedded (or read from the store) once."""
        with self._lock:
            if self._matrix is None:
                self._matrix = self._load()
            return self._matrix

    def _load(self) -> NDArray[np.float32]:
        import numpy as np

        from localllm.embed.store import Store, content_hash

        if not self.examples:
            return np.zeros((0, 1), dtype=np.float32)
        texts = {content_hash(e.text): e.text for e in self.examples}
        if self.embedder.identity.dims is None:
            # an unknown model's dims are known once it has answered: key the store by them, so
            # vectors of another width (the server now runs another GGUF) are never read back
            self._embed([self.examples[0].text])
        try:
            found = Store(self.embedder.identity, _STORE_KEY, root=self.store_root).vectors(texts, self._embed)
            rows = np.stack([found[content_hash(e.text)] for e in self.examples])
        except StoreUnavailable as exc:  # the cache is a saving, not a requirement
            log.warning("embedding store unavailable (%s); embedding the examples without it", exc.reason)
            rows = self._embed([e.text for e in self.examples])
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return np.asarray(rows / np.where(norms == 0, 1.0, norms), dtype=np.float32)

    def _query(self, text: str) -> NDArray[np.float32]:
        """``text``'s unit vector; the last few are kept, so one call's vote, out-of-scope
        rule and few-shot embed its question once."""
        import numpy as np

        with self._lock:
            found = self._queries.get(text)
        if found is not None:
            return found
        query = np.asarray(self._embed([text]), dtype=np.float32)[0]
        norm = float(np.linalg.norm(query))
        unit = np.asarray(query / norm if norm else query, dtype=np.float32)
        with self._lock:
            if len(self._queries) >= _QUERY_CACHE:
                self._queries.pop(next(iter(self._queries)))
            self._queries[text] = unit
        return unit

    def similarities(self, text: str) -> list[float]:
        """The cosine similarity of ``text`` to every example, in order (``-inf`` for an
        example skipped by ``leave_one_out``)."""

        matrix = self.matrix()
        if not self.examples:
            return []
        scores = [float(v) for v in matrix @ self._query(text)]
        if self.leave_one_out:
            own = same_text(text)
            scores = [-math.inf if mine == own else v for mine, v in zip(self._texts, scores, strict=True)]
        return scores

    def scope(self, fields: Sequence[str], out_of_scope: Any = None) -> list[bool]:
        """Per example: whether it is out of scope (a voted field labelled ``out_of_scope``)."""
        if out_of_scope is None:
            return [False] * len(self.examples)
        want = _key(out_of_scope)
        return [any(name in e.labels and _key(e.labels[name]) == want for name in fields) for e in self.examples]

    def novelty(self, text: str, fields: Sequence[str], out_of_scope: Any = None) -> float:
        """How in-scope ``text`` looks: nearest in-scope similarity − nearest out-of-scope one."""
        return _novelty(self.similarities(text), self.scope(fields, out_of_scope))

    def novelty_bar(self, fields: Sequence[str], out_of_scope: Any = None) -> NoveltyBar:
        """The bar :meth:`novelty` must clear, from the examples (leave-one-out), cached."""
        from localllm.calibrate import novelty_bar

        cache_key = (tuple(fields), _key(out_of_scope))
        with self._lock:
            if cache_key in self._bars:
                return self._bars[cache_key]
        import numpy as np

        matrix = self.matrix()
        outside = np.asarray(self.scope(fields, out_of_scope), dtype=bool)
        text_ids: dict[str, int] = {}
        same = np.asarray([text_ids.setdefault(t, len(text_ids)) for t in self._texts])
        negatives: list[float] = []
        if outside.any():  # each out-of-scope example scored against all the others
            for rows, sims in _similarity_blocks(matrix, np.flatnonzero(outside)):
                sims[same[rows][:, None] == same[None, :]] = -np.inf  # itself (and its duplicates)
                inside = sims[:, ~outside].max(axis=1) if (~outside).any() else np.full(len(rows), -np.inf)
                beyond = sims[:, outside].max(axis=1)
                negatives += [float(a - (b if np.isfinite(b) else 0.0)) for a, b in zip(inside, beyond, strict=True)]
        else:  # held-out label: each example scored against the other labels' examples only
            keys: dict[str, int] = {}
            label = np.asarray(
                [keys.setdefault(_key({n: e.labels.get(n) for n in fields}), len(keys)) for e in self.examples]
            )
            if len(keys) > 1:
                for rows, sims in _similarity_blocks(matrix, np.arange(len(self.examples))):
                    sims[(label[rows][:, None] == label[None, :]) | (same[rows][:, None] == same[None, :])] = -np.inf
                    negatives += [float(v) for v in sims.max(axis=1)]
        bar = novelty_bar([v for v in negatives if math.isfinite(v)])
        with self._lock:
            return self._bars.setdefault(cache_key, bar)

    def neighbours(self, text: str, k: int) -> list[Neighbour]:
        """The ``k`` most similar examples to ``text``, best first (ties: file order)."""

        matrix = self.matrix()
        if not self.examples:
            return []
        scores = matrix @ self._query(text)
        order = sorted(range(len(self.examples)), key=lambda i: (-float(scores[i]), i))
        if self.leave_one_out:
            own = same_text(text)
            order = [i for i in order if self._texts[i] != own]
        return [Neighbour(self.examples[i], float(scores[i])) for i in order[:k]]


class ExamplesAgent(Agent):
    """The examples tier as an agent: answers the voted fields from the k nearest examples.

    The question is the request's ``with.args.<input>``; the answer's meta carries
    ``tier: "examples"``, ``confidence``, ``confidence_method``, the neighbours (id,
    score) that voted and, when the examples calibrate an out-of-scope bar, ``novelty``,
    ``novelty_bar`` and ``in_scope``.
    """

    plugin = "builtin.examples"
    is_local_model = True

    def __init__(
        self,
        alias: str,
        examples: ExampleSet,
        *,
        input_arg: str,
        fields: Sequence[str],
        k: int,
        out_of_scope: Any = None,
    ) -> None:
        super().__init__(alias)
        self.examples = examples
        self.input_arg = input_arg
        self.fields = tuple(fields)
        self.k = k
        self.out_of_scope = out_of_scope

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        args = request.with_.get("args") if isinstance(request.with_, Mapping) else None
        text = args.get(self.input_arg) if isinstance(args, Mapping) else None
        if not isinstance(text, str):
            raise AgentError(
                ErrorKind.PLUGIN_UNSUPPORTED,
                f"the examples tier needs the text argument args.{self.input_arg}",
                hint=f"pass --arg {self.input_arg}=…",
            )
        result = vote(self.examples.neighbours(text, self.k), self.fields)
        meta = {
            "tier": TIER,
            "confidence": round(result.confidence, 6),
            "confidence_method": CONFIDENCE_METHOD,
            "confidence_fields": {k: round(v, 6) for k, v in result.fields.items()},
            "neighbours": [{"id": n.example.id, "score": round(n.score, 6)} for n in result.neighbours],
        }
        bar = self.examples.novelty_bar(self.fields, self.out_of_scope)
        if bar.measured:  # the out-of-scope rule's view of this input (eval records it per case)
            novelty = self.examples.novelty(text, self.fields, self.out_of_scope)
            meta.update(novelty=round(novelty, 6), novelty_bar=round(bar.value, 6), in_scope=bar.admits(novelty))
        if set(result.answer) != set(self.fields):
            raise AgentError(ErrorKind.SCHEMA_INVALID, "no example labels every voted field", meta=meta)
        return AskResponse.of(result.answer, meta=meta)
