"""Router: intents with example phrases, routed by embeddings first and an LLM second.

Embedding tier. The input and every example are embedded (both as ``query``: matching a
paraphrase is symmetric, so both sides get the same prefix); an intent's score is its
best example's cosine. With the best intent at ``s1`` and the runner-up at ``s2``:

* ``s1 >= confident`` and ``s1 - s2 >= margin`` → **route** (``routed_by="semantic"``,
  ``match_type="example:<the matching example>"``, ``confidence=s1``);
* ``s1 >= confident`` but within ``margin`` → **tie**: both candidates go to the decide tier;
* ``s1 < confident`` → **miss**: every intent goes to the decide tier.

Decide tier. ``decide(text, candidates)`` — in practice a schema-bound ``decide`` call whose
schema is ``{"intent": {"enum": candidates}}`` — picks one candidate (``routed_by="llm"``,
``match_type="decide"``) or returns None. Without a decide callable, a tie or miss is the
verdict, with its candidates and the best score as confidence.

Every verdict renders the ``turn.start`` payload of trace-format §3 with
:meth:`Verdict.turn_start_payload`; :func:`route_turn` routes one input as one turn of a
trace, writing ``turn.start`` before the decide tier's ``agent.call.*`` events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from localllm.config.decls import ROUTER_CONFIDENT as DEFAULT_CONFIDENT
from localllm.config.decls import ROUTER_MARGIN as DEFAULT_MARGIN
from localllm.errors import EmbedError

if TYPE_CHECKING:
    from localllm.config import Intent
    from localllm.embed.embedder import Embedder
    from localllm.trace.writer import TraceWriter
    from localllm.wire import CallResult

Decide = Callable[[str, list[str]], "str | None"]
Outcome = Literal["route", "tie", "miss"]


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
        }


class Router:
    """Route text to one of ``intents`` (each with example phrases)."""

    def __init__(
        self,
        intents: Sequence[Intent],
        embedder: Embedder,
        *,
        confident: float = DEFAULT_CONFIDENT,
        margin: float = DEFAULT_MARGIN,
        decide: Decide | None = None,
    ) -> None:
        import numpy as np

        if not intents:
            raise EmbedError("the router needs at least one intent under intents:")
        if not 0.0 <= margin <= 1.0 or not -1.0 <= confident <= 1.0:
            raise EmbedError(f"router confident must be in [-1, 1] and margin in [0, 1], got {confident} and {margin}")
        self.intents = list(intents)
        self.names = [i.name for i in self.intents]
        self.confident = confident
        self.margin = margin
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
        self._matrix = embedder.embed(texts, "query") if texts else np.zeros((0, 1), dtype=np.float32)

    def route(self, text: str) -> Verdict:
        """The verdict for ``text``: embedding tier, then the decide tier if needed."""
        first = self.semantic(text)
        return self.settle(first) if self.needs_decide(first) else first

    def needs_decide(self, verdict: Verdict) -> bool:
        """Whether the embedding tier's ``verdict`` goes on to the decide tier."""
        return verdict.outcome != "route" and self.decide is not None

    def semantic(self, text: str) -> Verdict:
        """The embedding tier alone: a route, or a tie/miss with its candidates."""
        best: dict[str, tuple[float, str]] = {}
        if self._examples:
            q = self.embedder.embed([text], "query")[0]
            sims = self._matrix @ q
            for (name, example), sim in zip(self._examples, sims.tolist(), strict=True):
                if name not in best or sim > best[name][0]:
                    best[name] = (float(sim), example)
        # stable: equal scores keep the intents' declaration order
        ranked = sorted(best.items(), key=lambda kv: -kv[1][0])
        scores = tuple((name, score) for name, (score, _) in ranked)
        top = ranked[0] if ranked else None
        s1 = top[1][0] if top else -1.0
        s2 = ranked[1][1][0] if len(ranked) > 1 else -1.0
        if top is not None and s1 >= self.confident and s1 - s2 >= self.margin:
            return Verdict(text, "route", top[0], "semantic", f"example:{top[1][1]}", s1, (top[0],), scores)
        if top is not None and s1 >= self.confident:
            outcome: Outcome = "tie"
            candidates = [top[0], ranked[1][0]]
        else:
            outcome = "miss"
            candidates = list(self.names)
        return Verdict(text, outcome, None, "semantic", None, s1 if top else None, tuple(candidates), scores)

    def settle(self, verdict: Verdict) -> Verdict:
        """The decide tier over a tie or miss's candidates (``verdict`` unchanged without one)."""
        if self.decide is None or verdict.outcome == "route":
            return verdict
        text, candidates, scores = verdict.text, list(verdict.candidates), verdict.scores
        choice = self.decide(text, candidates)
        if choice is not None and choice in candidates:
            return Verdict(text, "route", choice, "llm", "decide", None, tuple(candidates), scores)
        return Verdict(text, verdict.outcome, None, "llm", "decide", None, tuple(candidates), scores)


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
    """The JSON Schema of the decide tier's answer: one of ``candidates``."""
    return {
        "type": "object",
        "properties": {"intent": {"type": "string", "enum": list(candidates)}},
        "required": ["intent"],
        "additionalProperties": False,
    }


def decide_prompt(text: str, intents: Sequence[Intent], candidates: Sequence[str]) -> str:
    """A prompt for the decide tier naming each candidate intent with its description."""
    by_name = {i.name: i for i in intents}
    lines = ["Which intent does this user input express? Answer with one of the listed intents.", ""]
    for name in candidates:
        intent = by_name.get(name)
        about = intent.description if intent and intent.description else ""
        examples = "; ".join(intent.examples[:3]) if intent else ""
        detail = " — ".join(p for p in (about, f"e.g. {examples}" if examples else "") if p)
        lines.append(f"- {name}" + (f": {detail}" if detail else ""))
    lines += ["", f"Input: {text}"]
    return "\n".join(lines)


class Caller(Protocol):
    """What the decide tier needs of a :class:`localllm.Runtime`: its ``call``."""

    def call(self, verb: str, *, agent: str, prompt: str, schema: dict[str, Any] | None = None) -> CallResult: ...


def runtime_decide(runtime: Caller, agent: str, intents: Sequence[Intent]) -> Decide:
    """A decide-tier callable backed by ``runtime.call("decide", agent=…)`` (a localllm Runtime)."""

    def decide(text: str, candidates: list[str]) -> str | None:
        result = runtime.call(
            "decide", agent=agent, prompt=decide_prompt(text, intents, candidates), schema=decide_schema(candidates)
        )
        submission = result.submission
        choice = submission.get("intent") if isinstance(submission, dict) else None
        return choice if isinstance(choice, str) else None

    return decide
