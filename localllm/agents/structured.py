"""Structured output for OpenAI-compatible endpoints: which request field constrains decoding.

Servers disagree on the field. The styles, as ``response_format:`` names them:

- ``grammar``: ``grammar: <GBNF>``, localllm's compiled grammar (llama-server, llama-cpp-python)
- ``json_schema``: ``response_format: {type: json_schema, json_schema: {name, strict, schema}}``
  (OpenAI strict, llama-server, vLLM)
- ``json_object``: ``response_format: {type: json_object, schema}`` (llama-cpp-python, Ollama,
  llama-server)
- ``structured_outputs``: ``structured_outputs: {json: schema}`` (vLLM ≥ 0.12, which removed
  ``guided_json``)
- ``guided_json``: ``guided_json: schema`` (vLLM < 0.12)
- ``none``: nothing; the runtime validates the answer (every server)

``auto`` on an attached endpoint sends one probe at the first call that has a schema
(:func:`probe`: ``max_tokens`` 16, a one-property schema whose only valid answer is
``{"v":"7"}``) and reads the outcome: answered with that (or its start, when cut) → ``json_schema`` is
honoured (``grammar`` when the reply carries llama.cpp's ``timings`` and the agent compiles
grammars); answered with something else → the field was ignored → ``none``; rejected
(any non-auth 4xx/5xx) → ``json_object`` with ``schema``, *unverified*: if the first real
request is rejected as well, the endpoint drops to ``none`` and that request is resent
unconstrained (:meth:`Styles.demote`); when that fails as well the failure was not about the
style (a gateway whose upstream is down) and nothing is kept (:meth:`Styles.forget`). The
result is cached per endpoint URL for the Runtime (:class:`Styles`), so a Runtime probes each
endpoint once (again only after a call that no style could explain).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localllm.config.decls import RESPONSE_FORMATS

__all__ = ["PROBE_SCHEMA", "STYLES", "Negotiated", "Styles", "fields", "probe_body", "read_probe"]

#: the values of ``response_format:`` (``auto`` negotiates one of the others)
STYLES = RESPONSE_FORMATS
#: the probe's schema: strict-mode legal (an object, every property required, closed)
PROBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"v": {"type": "string", "enum": ["7"]}},
    "required": ["v"],
    "additionalProperties": False,
}
_PROBE_ANSWER = '{"v":"7"}'
#: statuses that say nothing about the body (auth, rate limit, unreachable upstream): not a verdict
_NOT_A_VERDICT = frozenset({401, 403, 404, 407, 408, 429, 502, 503, 504})


def fields(style: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The body fields that ask for ``schema`` in ``style`` (``grammar`` is the caller's: it compiles)."""
    if style == "json_schema":
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "submission", "strict": True, "schema": schema},
            }
        }
    if style == "json_object":
        return {"response_format": {"type": "json_object", "schema": schema}}
    if style == "structured_outputs":
        return {"structured_outputs": {"json": schema}}
    if style == "guided_json":
        return {"guided_json": schema}
    return {}


def probe_body(model: str) -> dict[str, Any]:
    """The probe: the cheapest request whose answer tells the styles apart."""
    return {
        "model": model,
        "max_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Reply with one word."}],
        **fields("json_schema", PROBE_SCHEMA),
    }


@dataclass(frozen=True)
class Negotiated:
    """An endpoint's style, how it was found, and whether a real request confirmed it."""

    style: str
    #: what the probe saw: ``honoured``, ``ignored``, ``rejected HTTP n`` (``""`` when not probed)
    evidence: str = ""
    probe_ms: int | None = None
    #: ``json_object`` after a rejected probe is a guess until a request with it succeeds
    verified: bool = True

    def as_meta(self) -> dict[str, Any]:
        return {"style": self.style, "evidence": self.evidence, "ms": self.probe_ms}


def read_probe(status: int, data: Any, *, compiles: bool) -> Negotiated | None:
    """The verdict of a probe reply, or ``None`` when the status is no verdict (auth, 429, 5xx gateway)."""
    if status in _NOT_A_VERDICT:
        return None
    if status >= 400:
        return Negotiated("json_object", f"json_schema rejected (HTTP {status})", verified=False)
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return Negotiated("none", "no choices[0].message.content in the probe's answer")
    answer = "".join(content.split()) if isinstance(content, str) else ""
    # cut by max_tokens (a pretty-printing server spends tokens on whitespace): a prefix
    # past the property name is still only reachable under the constraint
    cut = len(answer) >= len('{"v":') and _PROBE_ANSWER.startswith(answer)
    honoured = answer == _PROBE_ANSWER or cut
    llama_cpp = isinstance(data, dict) and isinstance(data.get("timings"), dict)
    if llama_cpp and compiles:
        # llama-server always applies a request's `grammar`, even where it ignores
        # response_format (a custom --jinja chat template drops json_schema there)
        why = "honoured" if honoured else "ignored"
        return Negotiated("grammar", f"json_schema {why}; llama.cpp timings: the compiled grammar")
    if not honoured:
        return Negotiated("none", "json_schema ignored (the probe's answer was not constrained)")
    return Negotiated("json_schema", "json_schema honoured")


class Styles:
    """Per Runtime: endpoint URL → :class:`Negotiated`; the first caller probes, others wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, Negotiated] = {}
        self._probing: dict[str, threading.Lock] = {}

    def get(self, url: str, send: Callable[[], tuple[int, Any]], *, compiles: bool) -> tuple[Negotiated, bool]:
        """(the style for ``url``, whether this call sent the probe); ``send`` posts the probe.

        A reply that is no verdict (auth failure, rate limit) raises through ``send``'s
        caller or returns ``none`` for this call only, uncached.
        """
        with self._lock:
            found = self._found.get(url)
            if found is not None:
                return found, False
            gate = self._probing.setdefault(url, threading.Lock())
        with gate:
            with self._lock:
                found = self._found.get(url)
            if found is not None:
                return found, False
            started = time.monotonic()
            status, data = send()
            ms = int((time.monotonic() - started) * 1000)
            verdict = read_probe(status, data, compiles=compiles)
            if verdict is None:
                return Negotiated("none", f"probe answered HTTP {status}: no verdict", ms), True
            verdict = Negotiated(verdict.style, verdict.evidence, ms, verdict.verified)
            with self._lock:
                self._found[url] = verdict
            return verdict, True

    def confirm(self, url: str) -> None:
        """A request in the guessed style succeeded: it stays."""
        with self._lock:
            found = self._found.get(url)
            if found is not None and not found.verified:
                self._found[url] = Negotiated(found.style, found.evidence, found.probe_ms)

    def forget(self, url: str) -> None:
        """Every style failed alike, unconstrained too: no verdict; the next call probes again."""
        with self._lock:
            self._found.pop(url, None)

    def demote(self, url: str, status: int) -> Negotiated:
        """A request in the guessed style was rejected too: the endpoint gets ``none``."""
        with self._lock:
            found = self._found.get(url)
            evidence = (found.evidence + "; " if found else "") + f"json_object rejected (HTTP {status})"
            demoted = Negotiated("none", evidence, found.probe_ms if found else None)
            self._found[url] = demoted
            return demoted
