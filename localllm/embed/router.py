"""Router: intents with example phrases, routed by embeddings first and an LLM second.

Embedding tier. The input and every example are embedded (both as ``query``: matching a
paraphrase is symmetric, so both sides get the same prefix); an intent's score is its
best example's cosine. With the best intent at ``s1`` and the runner-up at ``s2``:

* ``s1 >= confident`` and ``s1 - s2 >= margin`` → **route** (``routed_by="semantic"``,
  ``match_type="example:<the matching example>"``);
* ``s1 >= confident`` but within ``margin`` → **tie**: both candidates go to the decide tier;
* ``s1 < confident`` → **miss**: every intent goes to the decide tier.

A semantic verdict's ``confidence`` is the similarity margin ``s1 - s2`` (clamped to
[0, 1]; ``s1`` itself with one intent): how clearly the best intent beat the next one.

The bars fit their embedder: cosines of one model are not comparable with another's
(all-MiniLM scores clear paraphrases around 0.4–0.6, where nomic scores 0.8). They come,
in order, from the ``router:`` keys, from :func:`calibrate` over the intents' own examples
(``router: {calibrate: true}`` / ``localllm route --calibrate``), from the embedding
model's measured defaults in the registry (``router:`` in ``embed/models.json``), or from
:data:`DEFAULT_CONFIDENT` / :data:`DEFAULT_MARGIN`.

Decide tier. ``decide(text, candidates)`` — in practice a schema-bound ``decide`` call whose
schema is ``{"intent": {"enum": candidates + ["none_of_these"]}}`` — picks one candidate
(``routed_by="llm"``, ``match_type="decide"``) or says **none of these**
(:data:`NONE_OF_THESE`; outcome ``none``, no intent). It may return the choice alone or
``(choice, confidence)``; :func:`runtime_decide` passes the local answer's
``meta.confidence`` (the model's probability of its choice among the alternatives).
Without a decide callable, a tie or miss is the verdict, with its candidates.

Every verdict says why its tier decided (``reason``) and renders the ``turn.start`` payload
of trace-format §3 with :meth:`Verdict.turn_start_payload`; :func:`route_turn` routes one
input as one turn of a trace, writing ``turn.start`` before the decide tier's
``agent.call.*`` events.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from localllm.config.decls import NONE_OF_THESE as NONE_OF_THESE  # noqa: PLC0414 (re-exported: the decide tier's)
from localllm.config.decls import ROUTER_CONFIDENT as DEFAULT_CONFIDENT
from localllm.config.decls import ROUTER_MARGIN as DEFAULT_MARGIN
from localllm.errors import EmbedError

if TYPE_CHECKING:
    from pathlib import Path

    from localllm.config import Intent
    from localllm.embed.embedder import Embedder
    from localllm.trace.writer import TraceWriter
    from localllm.wire import CallResult

Decide = Callable[[str, list[str]], "str | tuple[str | None, float | None] | None"]
Outcome = Literal["route", "tie", "miss", "none"]


#: how far a float32 cosine may fall short of the bar it meets: a text with itself scores
#: 0.9999988–1.0000001, so a bar of 1.0 (calibrated on examples that support no lower one)
#: still routes an input that is one of the examples word for word
_ROUNDING = 1e-5


@dataclass(frozen=True)
class Verdict:
    """How an input was routed, and why."""

    text: str
    outcome: Outcome
    intent: str | None
    routed_by: str
    match_type: str | None
    confidence: float | None
    #: the intents still in play when the embedding tier could not decide alone
    candidates: tuple[str, ...] = ()
    #: best cosine per intent, best first
    scores: tuple[tuple[str, float], ...] = ()
    #: the best intent's cosine (s1) and its lead over the runner-up (s1 - s2)
    similarity: float | None = None
    margin: float | None = None
    #: why the deciding tier decided as it did, in a few words
    reason: str = ""
    #: the bars the embedding tier used and where they came from
    bars: dict[str, Any] = field(default_factory=dict)

    def turn_start_payload(self) -> dict[str, Any]:
        """The ``turn.start`` payload (trace-format §3) the caller appends to its trace."""
        payload: dict[str, Any] = {"input": self.text, "intent": self.intent or ""}
        if self.intent is not None and self.routed_by != "llm":
            payload["direct"] = True
        payload["routed_by"] = self.routed_by
        if self.match_type is not None:
            payload["match_type"] = self.match_type
        if self.confidence is not None:
            payload["confidence"] = round(self.confidence, 4)
        return payload

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "outcome": self.outcome,
            "intent": self.intent,
            "routed_by": self.routed_by,
            "match_type": self.match_type,
            "confidence": self.confidence,
            "candidates": list(self.candidates),
            "scores": [{"intent": i, "score": s} for i, s in self.scores],
            "similarity": self.similarity,
            "margin": self.margin,
            "reason": self.reason,
            "bars": dict(self.bars),
        }


class Router:
    """Route text to one of ``intents`` (each with example phrases)."""

    def __init__(
        self,
        intents: Sequence[Intent],
        embedder: Embedder,
        *,
        confident: float | None = None,
        margin: float | None = None,
        decide: Decide | None = None,
        source: str = "given",
    ) -> None:
        import numpy as np

        from localllm.config import Intent
        from localllm.embed.embedder import embed_rows

        # a mapping (config.intents) iterates its names: before, AttributeError 'str' … 'name'
        if isinstance(intents, (str, Mapping)) or not all(isinstance(i, Intent) for i in intents):
            raise TypeError(f"intents is a list of Intent, e.g. list(config.intents.values()); got {intents!r:.80}")
        if confident is None or margin is None:  # the embedding model's measured bars, else the defaults
            from localllm.embed.registry import lookup

            identity = getattr(embedder, "identity", None)
            model = lookup(identity.model, warn=False) if identity is not None else None
            bars = default_bars(model)
            source = bars[2] if confident is None and margin is None else "given+" + bars[2]
            confident = bars[0] if confident is None else confident
            margin = bars[1] if margin is None else margin
        if not intents:
            raise EmbedError("the router needs at least one intent under intents:")
        if not 0.0 <= margin <= 1.0 or not -1.0 <= confident <= 1.0:
            raise EmbedError(f"router confident must be in [-1, 1] and margin in [0, 1], got {confident} and {margin}")
        self.intents = list(intents)
        self.names = [i.name for i in self.intents]
        if NONE_OF_THESE in {i.name for i in intents}:
            raise EmbedError(f"{NONE_OF_THESE!r} is reserved for the decide tier's no-match; rename that intent")
        self.confident = confident
        self.margin = margin
        #: where the bars came from: given | calibrated | registry:<model> | default (given+…: one of each)
        self.source = source
        self.decide = decide
        self.embedder = embedder
        self._examples: list[tuple[str, str]] = [
            (intent.name, example) for intent in self.intents for example in intent.examples
        ]
        missing = [i.name for i in self.intents if not i.examples]
        if missing and decide is None:
            raise EmbedError(
                f"intents {missing} have no examples: and the router has no decide agent; "
                "add examples or set router.agent"
            )
        texts = [e for _, e in self._examples]
        self._matrix = embed_rows(embedder, texts, "query") if texts else np.zeros((0, 1), dtype=np.float32)

    def route(self, text: str) -> Verdict:
        """The verdict for ``text``: embedding tier, then the decide tier if needed."""
        first = self.semantic(text)
        return self.settle(first) if self.needs_decide(first) else first

    def apply(self, calibration: Calibration) -> None:
        """Use ``calibration``'s bars from now on."""
        if not isinstance(calibration, Calibration):
            raise TypeError(f"apply takes a Calibration (calibrate(router, ...)), got {type(calibration).__name__}")
        self.confident, self.margin, self.source = calibration.confident, calibration.margin, "calibrated"

    def needs_decide(self, verdict: Verdict) -> bool:
        """Whether the embedding tier's ``verdict`` goes on to the decide tier."""
        return verdict.outcome != "route" and self.decide is not None

    def semantic(self, text: str) -> Verdict:
        """The embedding tier alone: a route, or a tie/miss with its candidates."""
        from localllm.embed.embedder import embed_rows

        best: dict[str, tuple[float, str]] = {}
        if self._examples:
            q = embed_rows(self.embedder, [text], "query")[0]
            sims = self._matrix @ q
            for (name, example), sim in zip(self._examples, sims.tolist(), strict=True):
                if name not in best or sim > best[name][0]:
                    best[name] = (float(sim), example)
        # stable: equal scores keep the intents' declaration order
        ranked = sorted(best.items(), key=lambda kv: -kv[1][0])
        scores = tuple((name, score) for name, (score, _) in ranked)
        bars = {"confident": self.confident, "margin": self.margin, "source": self.source}
        if not ranked:
            return Verdict(text, "miss", None, "semantic", None, None, tuple(self.names), scores, reason="no examples")
        top = ranked[0]
        s1 = top[1][0]
        s2 = ranked[1][1][0] if len(ranked) > 1 else None
        lead = s1 - s2 if s2 is not None else s1
        conf = min(max(lead, 0.0), 1.0)
        extra: dict[str, Any] = {"similarity": s1, "margin": lead, "bars": bars}
        sure = s1 >= self.confident - _ROUNDING
        if sure and lead >= self.margin - _ROUNDING:
            why = f"similarity {s1:.3f} >= {self.confident:.3f} and margin {lead:.3f} >= {self.margin:.3f}"
            return Verdict(
                text, "route", top[0], "semantic", f"example:{top[1][1]}", conf, (top[0],), scores, reason=why, **extra
            )
        # without a decide tier (router: has no agent:) a tie or a miss is the answer
        goes = "go to the decide tier" if self.decide is not None else "tie (no decide tier: router.agent is unset)"
        if sure:
            why = f"margin {lead:.3f} < {self.margin:.3f}: {top[0]} and {ranked[1][0]} {goes}"
            return Verdict(
                text, "tie", None, "semantic", None, conf, (top[0], ranked[1][0]), scores, reason=why, **extra
            )
        why = f"similarity {s1:.3f} < {self.confident:.3f}: " + (
            "every intent goes to the decide tier"
            if self.decide is not None
            else "a miss (no decide tier: router.agent is unset)"
        )
        return Verdict(text, "miss", None, "semantic", None, conf, tuple(self.names), scores, reason=why, **extra)

    def settle(self, verdict: Verdict) -> Verdict:
        """The decide tier over a tie or miss's candidates (``verdict`` unchanged without one)."""
        if self.decide is None or verdict.outcome == "route":
            return verdict
        text, candidates = verdict.text, list(verdict.candidates)
        answer = self.decide(text, candidates)
        choice, conf = answer if isinstance(answer, tuple) else (answer, None)
        shown = "unmeasured" if conf is None else f"{conf:.3f}"
        llm: dict[str, Any] = {"routed_by": "llm", "match_type": "decide", "candidates": tuple(candidates)}
        if choice is not None and choice in candidates:
            why = f"{verdict.reason}; the decide tier chose {choice} (probability {shown})"
            return replace(verdict, outcome="route", intent=choice, confidence=conf, reason=why, **llm)
        if choice == NONE_OF_THESE:
            why = f"{verdict.reason}; the decide tier said none of these (probability {shown})"
            return replace(verdict, outcome="none", intent=None, confidence=conf, reason=why, **llm)
        why = f"{verdict.reason}; the decide tier gave no candidate"
        return replace(verdict, intent=None, confidence=None, reason=why, **llm)


def route_turn(
    router: Router, text: str, trace: TraceWriter | None, *, turn: int, state_path: str = "route"
) -> Verdict:
    """Route ``text`` as one turn of ``trace``: ``turn.start`` first, then the decide tier's calls.

    A semantic route's ``turn.start`` carries the whole provenance (``direct``, match,
    confidence); when the decide tier runs, ``turn.start`` says ``routed_by: llm`` and the
    chosen intent is in the decide call's ``agent.call.complete`` that follows it.
    """
    first = router.semantic(text)
    if not router.needs_decide(first):
        if trace is not None:
            trace.append("turn.start", first.turn_start_payload(), turn=turn, state_path=state_path)
        return first
    if trace is not None:
        pending = {"input": text, "intent": "", "routed_by": "llm", "match_type": "decide"}
        trace.append("turn.start", pending, turn=turn, state_path=state_path)
    return router.settle(first)


def decide_schema(candidates: Sequence[str]) -> dict[str, Any]:
    """The JSON Schema of the decide tier's answer: one of ``candidates`` or :data:`NONE_OF_THESE`."""
    return {
        "type": "object",
        "properties": {"intent": {"type": "string", "enum": [*candidates, NONE_OF_THESE]}},
        "required": ["intent"],
        "additionalProperties": False,
    }


#: inputs about none of the intents, shown to the decide tier as ``none_of_these`` shots
OFF_TOPIC_SHOTS = ("What is the weather in Paris?", "Tell me a fun fact", "Who won the match yesterday?")


def decide_prompt(text: str, intents: Sequence[Intent], candidates: Sequence[str]) -> str:
    """A few-shot prompt for the decide tier: each candidate's description, then its examples
    (up to 3, interleaved) and generic off-topic inputs as labelled shots, then the input.

    Shots, not a list of names: measured with gemma-3-270m on three intents (three examples
    each) and six inputs, a prompt that only lists the intents answered the first intent for
    all six (three of them off-topic); this one answered 4 of 6 right and all three
    off-topic inputs ``none_of_these``.
    """
    by_name = {i.name: i for i in intents}
    names = ", ".join(candidates)
    lines = [f"Sort each user input into one intent: {names}; or {NONE_OF_THESE} when it is about none of them."]
    for name in candidates:
        intent = by_name.get(name)
        if intent is not None and intent.description:
            lines.append(f"{name}: {intent.description}")
    lines.append("")
    for k in range(3):
        for name in candidates:
            intent = by_name.get(name)
            if intent is not None and k < len(intent.examples):
                lines += [f"Input: {intent.examples[k]}", f'{{"intent":"{name}"}}', ""]
        lines += [f"Input: {OFF_TOPIC_SHOTS[k]}", f'{{"intent":"{NONE_OF_THESE}"}}', ""]
    lines.append(f"Input: {text}")
    return "\n".join(lines)


class Caller(Protocol):
    """What the decide tier needs of a :class:`localllm.Runtime`: its ``call``."""

    def call(self, verb: str, *, agent: str, prompt: str, schema: dict[str, Any] | None = None) -> CallResult: ...


def runtime_decide(runtime: Caller, agent: str, intents: Sequence[Intent]) -> Decide:
    """A decide-tier callable backed by ``runtime.call("decide", agent=…)`` (a localllm Runtime)."""

    def decide(text: str, candidates: list[str]) -> tuple[str | None, float | None]:
        result = runtime.call(
            "decide", agent=agent, prompt=decide_prompt(text, intents, candidates), schema=decide_schema(candidates)
        )
        submission = result.submission
        choice = submission.get("intent") if isinstance(submission, dict) else None
        meta = getattr(result, "meta", None)
        conf = meta.get("confidence") if isinstance(meta, dict) else None
        conf = float(conf) if isinstance(conf, (int, float)) and not isinstance(conf, bool) else None
        return (choice if isinstance(choice, str) else None), conf

    return decide


@dataclass(frozen=True)
class Calibration:
    """Bars calibrated on the intents' own examples or on held-out cases (see :func:`calibrate`)."""

    confident: float
    margin: float
    target_precision: float
    #: the level of the precision lower bounds (one-sided Clopper–Pearson)
    level: float
    #: whether the accepted decisions' precision *lower bound* meets the target; False: no bar
    #: met it (too few examples, or intents too alike), so the bars were chosen on the observed
    #: precision and promise nothing
    bound_met: bool
    #: leave-one-out decisions: in-scope (an example routed among the intents, itself left
    #: out) and out-of-scope (an example routed with its own intent left out: any route is wrong)
    in_scope: int
    out_of_scope: int
    #: the accepted decisions at these bars: how many, how many right, the share of in-scope
    #: decisions accepted, and the precision's lower bound
    accepted: int
    right: int
    coverage: float
    lower_bound: float
    #: all-correct decisions a bound at ``target_precision`` needs (``ln(1 - level) / ln(target)``)
    needed: int
    #: examples left out as another example of their intent over again (the same text but for
    #: case, spacing or Unicode form): each text is one example, held out with all its copies
    duplicates: int = 0
    #: what certified the bars: ``leave-one-out`` (the examples; a guide) or ``cases`` (held-out
    #: labelled inputs, fixed-sequence testing: the bound holds at ``level``)
    source: Literal["leave-one-out", "cases"] = "leave-one-out"
    #: held-out cases used, and those dropped for being one of the examples (not held out)
    cases: int = 0
    dropped_cases: int = 0
    #: held-out cases left out as another case over again (the same text but for case, spacing
    #: or Unicode form, the same intent): each text is one answer of evidence
    duplicate_cases: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "confident": round(self.confident, 4),
            "margin": round(self.margin, 4),
            "target_precision": self.target_precision,
            "level": self.level,
            "bound_met": self.bound_met,
            "in_scope": self.in_scope,
            "out_of_scope": self.out_of_scope,
            "accepted": self.accepted,
            "right": self.right,
            "coverage": round(self.coverage, 4),
            "precision": round(self.right / self.accepted, 4) if self.accepted else None,
            "lower_bound": round(self.lower_bound, 4),
            "needed": self.needed,
            "duplicates": self.duplicates,
            "source": self.source,
            "cases": self.cases,
            "dropped_cases": self.dropped_cases,
            "duplicate_cases": self.duplicate_cases,
        }


@dataclass(frozen=True)
class _Decision:
    similarity: float
    margin: float
    correct: bool
    in_scope: bool


#: similarities computed at a time by :func:`_leave_one_out` (rows × examples): bounded memory
_LOO_BLOCK = 1 << 22


def _leave_one_out(names: Sequence[str], labels: Sequence[str], matrix: Any) -> list[_Decision]:
    """Every example routed among the other examples, with and without its own intent.

    Row blocks of the similarity matrix at a time, each intent's best by numpy: the whole
    matrix as Python floats and a loop over every pair took 1.6 GB and 7 s for 6,000
    examples, growing with the square (CLINC150's 15,000 training examples: ~10 GB).
    """
    import numpy as np

    # float32 as the router's own cosines at route time (float64 scored a text with itself
    # 1.0000000019 and moved a bar); a row block may round a similarity by an ulp of float32
    # otherwise than the whole matrix did, no more
    unit = np.asarray(matrix, dtype=np.float32)
    n = len(labels)
    groups = [name for name in dict.fromkeys(names) if name in set(labels)]  # intents with examples
    column = {name: g for g, name in enumerate(groups)}
    own_group = np.asarray([column[label] for label in labels], dtype=np.intp)
    members = [np.flatnonzero(own_group == g) for g in range(len(groups))]
    out: list[_Decision] = []
    step = max(1, _LOO_BLOCK // max(n, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        sims = (unit[lo:hi] @ unit.T).astype(np.float64)
        sims[np.arange(hi - lo), np.arange(lo, hi)] = -np.inf  # the example itself is left out
        best = np.stack([sims[:, cols].max(axis=1) for cols in members], axis=1)
        for row in range(hi - lo):
            own = int(own_group[lo + row])
            scores = best[row]
            if np.isfinite(scores[own]):  # its intent has another example
                out.append(_routed(scores, own))
            others = scores.copy()
            others[own] = -np.inf
            if np.isfinite(others).any():  # the same example as an input none of the rest covers
                decision = _routed(others, own)
                out.append(_Decision(decision.similarity, decision.margin, False, False))
    return out


def _routed(scores: Any, own: int) -> _Decision:
    """The decision over per-intent best ``scores`` (-inf: absent); ties go to the first intent."""
    import numpy as np

    top = int(np.argmax(scores))
    first = float(scores[top])
    rest = np.delete(scores, top)
    second = float(rest.max()) if rest.size and np.isfinite(rest.max()) else None
    return _Decision(first, first - second if second is not None else first, top == own, True)


def _held_out(router: Router, cases: Sequence[tuple[str, str]]) -> list[_Decision]:
    """Every case routed by the embedding tier over all the examples (nothing left out).

    Right when its labelled intent wins; a case labelled :data:`NONE_OF_THESE` is out of
    scope (any route is wrong), as is, for the bars, a case of an intent with no examples.
    """
    import numpy as np

    from localllm.embed.embedder import embed_rows

    labels = [name for name, _ in router._examples]
    groups = [name for name in dict.fromkeys(router.names) if name in set(labels)]
    own_group = np.asarray([groups.index(label) for label in labels], dtype=np.intp)
    members = [np.flatnonzero(own_group == g) for g in range(len(groups))]
    queries = embed_rows(router.embedder, [text for text, _ in cases], "query")
    unit = np.asarray(router._matrix, dtype=np.float32)
    sims = (np.asarray(queries, dtype=np.float32) @ unit.T).astype(np.float64)
    best = np.stack([sims[:, cols].max(axis=1) for cols in members], axis=1)
    out: list[_Decision] = []
    for row, (_, intent) in enumerate(cases):
        own = groups.index(intent) if intent in groups else -1
        decision = _routed(best[row], own)
        out.append(replace(decision, in_scope=intent != NONE_OF_THESE))
    return out


def _bar(
    scores: list[float], correct: list[bool], target: float, level: float, *, held_out: bool = False
) -> tuple[float, bool]:
    """The lowest bar meeting ``target`` by its lower bound, else by observed precision (1.0: none).

    ``held_out``: decisions on independent cases, so the bar is the one fixed-sequence testing
    reaches (:func:`localllm.calibrate.fixed_sequence_threshold`: its bound holds).
    """
    from localllm.calibrate import choose_threshold, fixed_sequence_threshold, risk_coverage

    clamped = [min(max(s, 0.0), 1.0) for s in scores]
    pick = fixed_sequence_threshold if held_out else choose_threshold
    chosen = pick(clamped, correct, target, level)
    if not chosen.accepts_nothing:
        return chosen.value, True
    passing = [p.threshold for p in risk_coverage(clamped, correct) if p.precision >= target]
    return (min(passing), False) if passing else (1.0, False)


def calibrate(
    router: Router,
    target_precision: float = 0.9,
    level: float = 0.95,
    *,
    cases: Sequence[tuple[str, str]] | None = None,
) -> Calibration:
    """The router's bars chosen on leave-one-out routing of its intents' examples, or
    certified on held-out labelled ``cases``.

    With ``cases`` — ``(text, intent)`` pairs that are not the examples; ``intent`` a declared
    intent, or :data:`NONE_OF_THESE` for an input none of them covers (any route is wrong) —
    each text is routed by the embedding tier over all the examples; ``confident`` is the
    lowest bar certified testing from the strictest down, in sequences that end at their first
    failure (:func:`localllm.calibrate.fixed_sequence_threshold`), and ``margin`` is 0: what was
    certified is every decision above ``confident``, and a margin bar would keep a subset
    whose precision was never tested. Independent cases drawn from the inputs the router will
    see make the bound the promise it states (``bound_met``: precision at least
    ``target_precision`` with probability ``level``), where leave-one-out's is a guide;
    ``tests/bench/bench_bar_guarantee.py`` (``router-cases``) measures it. A case whose text
    is one of the examples (:func:`localllm.calibrate.same_text`) is not held out: it is
    dropped and counted (``dropped_cases``); a case whose text is an earlier case's is one
    answer, counted once (``duplicate_cases``), and under another intent an ``EmbedError``
    naming both (one label is wrong); an undeclared intent is an ``EmbedError``, as is no
    case left.

    Every example is routed (1) among all intents with itself left out — right when its own
    intent wins — and (2) with its whole intent left out, as an input none of the intents
    covers — wrong whenever it routes. ``confident`` is the lowest similarity bar whose
    accepted decisions meet ``target_precision``; ``margin`` the lowest margin bar that
    keeps the decisions above ``confident`` at the target. Each is chosen by the
    precision's lower bound (:func:`localllm.calibrate.choose_threshold`) when some bar meets
    it, else by the observed precision (``bound_met`` says which).

    The bound is a guide, not a 95 % guarantee: leave-one-out decisions share examples (an
    example is the query of two and a neighbour in the others') and the bar is the lowest of
    many that pass. On synthetic intents (``tests/bench/bench_bar_guarantee.py``: 4 × 30 and
    8 × 20 examples, target 0.9) fresh inputs' precision fell below the target in 13 % and
    20 % of draws; on CLINC150 held-out splits, 3–5 %. Check the bars on held-out inputs.

    An example repeated under its intent (:func:`localllm.calibrate.same_text`) is one
    example: held out, it would find its own copy and count as a sure, right decision
    (twice), and the bars would promise a precision new inputs do not get. Under two intents
    it is refused (an ``EmbedError``: it can only ever tie).
    """

    from localllm.calibrate import precision_lower_bound, same_text

    owner: dict[str, tuple[str, int]] = {}  # same text → (its intent, its first row)
    for row, (name, example) in enumerate(router._examples):
        first, _ = owner.setdefault(same_text(example), (name, row))
        if first != name:
            raise EmbedError(
                f"example {_shown(example)} is under both intents {first!r} and {name!r}: every "
                "decision on it is wrong, so the bars would be meaningless",
                hint=f"keep the example under one intent only (remove it from {first!r} or {name!r})",
            )
    rows = sorted(row for _, row in owner.values())
    labels = [router._examples[row][0] for row in rows]
    held_out = cases is not None
    kept: list[tuple[str, str]] = []
    duplicate_cases = 0
    if cases is not None:
        known = set(router.names)
        label: dict[str, tuple[str, int]] = {}  # same text → (its intent, its first case)
        for i, (text, intent) in enumerate(cases):
            if intent not in known and intent != NONE_OF_THESE:
                raise EmbedError(
                    f"case {i} ({_shown(text)}) is labelled {intent!r}, which is not a declared intent",
                    hint=f"label it with one of {sorted(known)}, or {NONE_OF_THESE!r} for an input none covers",
                )
            first, at = label.setdefault(same_text(text), (intent, i))
            if first != intent:
                raise EmbedError(
                    f"case {i} ({_shown(text)}) is labelled {intent!r} and case {at} ({_shown(cases[at][0])}), "
                    f"the same text, {first!r}: one of the labels is wrong",
                    hint=f"label the text with its one intent (case {at} or case {i})",
                )
            if at != i:  # the same answer again: no new evidence
                duplicate_cases += 1
            elif same_text(text) not in owner:  # one of the examples is not held out
                kept.append((text, intent))
        if not kept or not router._examples:
            again = f", {duplicate_cases} repeat another" if duplicate_cases else ""
            raise EmbedError(
                f"no held-out case to calibrate on ({len(cases)} given, "
                f"{len(cases) - len(kept) - duplicate_cases} are examples{again})"
                if router._examples
                else "calibrating the router needs examples under intents:",
                hint="give labelled inputs that are not the intents' examples",
            )
        decisions = _held_out(router, kept)
    elif len(labels) < 2:
        raise EmbedError("calibrating the router needs at least two distinct examples under intents:")
    else:
        decisions = _leave_one_out(router.names, labels, router._matrix[rows])
    confident, first_met = _bar(
        [d.similarity for d in decisions], [d.correct for d in decisions], target_precision, level, held_out=held_out
    )
    above = [d for d in decisions if d.similarity >= confident]
    if held_out:  # what was certified is every decision above `confident`: a margin bar would keep an untested subset
        margin, second_met = 0.0, first_met
    elif above:
        margin, second_met = _bar(
            [d.margin for d in above], [d.correct for d in above], target_precision, level, held_out=held_out
        )
    else:
        margin, second_met = 0.0, first_met
    accepted = [d for d in above if min(max(d.margin, 0.0), 1.0) >= margin]
    right = sum(d.correct for d in accepted)
    in_scope = sum(d.in_scope for d in decisions)
    taken = sum(d.in_scope for d in accepted)
    return Calibration(
        confident=confident,
        margin=margin,
        target_precision=target_precision,
        level=level,
        bound_met=first_met and second_met,
        in_scope=in_scope,
        out_of_scope=len(decisions) - in_scope,
        accepted=len(accepted),
        right=right,
        coverage=taken / in_scope if in_scope else 0.0,
        lower_bound=precision_lower_bound(right, len(accepted), level) if accepted else 0.0,
        needed=math.ceil(math.log(1.0 - level) / math.log(target_precision)) if target_precision < 1.0 else 0,
        duplicates=len(router._examples) - len(rows),
        source="cases" if held_out else "leave-one-out",
        cases=len(kept),
        dropped_cases=len(cases) - len(kept) - duplicate_cases if cases is not None else 0,
        duplicate_cases=duplicate_cases,
    )


def load_route_cases(path: Path, names: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``(text, intent)`` pairs from a JSONL file for :func:`calibrate`'s ``cases``
    (:func:`localllm.eval.cases.load_intent_cases`); with ``names``, an intent must be one of
    them or :data:`NONE_OF_THESE`."""
    from localllm.eval.cases import load_intent_cases

    return load_intent_cases(path, [*names, NONE_OF_THESE] if names else ())


def _shown(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def default_bars(model: Any) -> tuple[float, float, str]:
    """(confident, margin, source) for an embedding model's :class:`~localllm.embed.registry.ModelInfo`."""
    confident = getattr(model, "router_confident", None)
    margin = getattr(model, "router_margin", None)
    if confident is not None and margin is not None:
        return float(confident), float(margin), f"registry:{model.id}"
    return DEFAULT_CONFIDENT, DEFAULT_MARGIN, "default"
