"""``TraceRecorder``: turns what the runtime reports about a call into trace events.

The runtime notifies; the recorder builds every payload (trace-format §5)::

    record = recorder.call_started(request, alias=..., schema_path=..., args=...)
    record.leg_finished(alias, response, error, value)     # once per agent asked
    record.fallback(reason="schema_invalid", ...)          # the local leg is kept as the original
    record.finished(call_id=..., duration_ms=...)          # writes the call's group

Nothing is written until ``finished``: ``agent.call.start`` follows the agent's answer
(so replayed ``episode_id``/``match_idx`` are known), then the sub-events, then exactly one
``agent.call.complete`` or ``agent.call.error``, as one contiguous group. Every payload,
sidecar file and transcript line is built (and checked) before the first line is
appended, so a call never leaves a start without an end.

Payloads follow the reference engine's (trace-format §Agent event kinds):
``agent.call.start.input`` is ``{schema_present: true, schema_path, args}`` with the schema
path relative to the config's directory as written (never a host path; an inline schema
has ``schema_present`` only); ``agent.call.complete.response`` is
``{"submission": …, "meta": …}`` (``meta`` also beside it, as the reference writes both).

Sidecar files are never overwritten: when ``<call_id>`` is taken in the trace directory
(another trace there, or a file left behind) the call's files get the first free
``-N`` suffix and the event points at them. Every known secret is redacted (``***``) in
payloads, prompt/response sidecars and transcript lines. Plugin-supplied audit text
(meta, args, error text, sub-event payloads) is normalised to be writable inline (CRLF,
NUL, non-NFC, NaN), since losing the call's events would be worse.

The recorder reads the history of the trace it continues: :meth:`TraceRecorder.next_turn`
and :meth:`TraceRecorder.episode_plays` let a new Runtime continue the session.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm.errors import AgentError, TraceError
from localllm.redact import Redactor
from localllm.trace import sidecars
from localllm.trace.rules import INT_LIMIT, INT_MIN, MAX_DEPTH, clean_text
from localllm.trace.writer import TraceWriter
from localllm.wire import AskRequest, AskResponse, Transcript

__all__ = ["CallRecord", "TraceRecorder"]

#: how many ``-N`` suffixes are tried for a free sidecar name
_MAX_SUFFIX = 1000


#: how deep :func:`scrub` keeps plugin data: room under the trace's MAX_DEPTH for the
#: payload's own keys above it (``payload.response.meta.…``)
SCRUB_DEPTH = MAX_DEPTH - 4
TOO_DEEP = f"<nested deeper than {SCRUB_DEPTH} levels>"


def scrub(value: Any, depth: int = 0) -> Any:
    """Plugin-supplied data made writable inline in the trace: CRLF, NUL, non-NFC and lone
    surrogates cleaned, NaN and infinities null, an integer past 64 bits its decimal text,
    anything nested deeper than ``SCRUB_DEPTH`` (a cycle too) :data:`TOO_DEEP`. A call's
    outcome never depends on whether its plugin's meta can be traced."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if INT_MIN <= value < INT_LIMIT else _big_int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (Mapping, list, tuple)):
        if depth >= SCRUB_DEPTH:
            return TOO_DEEP
        if isinstance(value, Mapping):
            return {clean_text(str(k)): scrub(v, depth + 1) for k, v in value.items()}
        return [scrub(v, depth + 1) for v in value]
    return clean_text(str(value))


def _big_int(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # past Python's int → str digit limit
        return f"<integer of {value.bit_length()} bits>"


@dataclass(frozen=True)
class _Leg:
    alias: str
    response: AskResponse | None
    error: AgentError | None
    value: Any


@dataclass(frozen=True)
class _Files:
    """Where one call's sidecar files go; ``enabled`` is false once writing them failed."""

    dir: Path
    call_id: str
    suffix: str
    enabled: bool
    #: the sidecar files written so far (removed when a name turns out taken)
    written: list[Path] = field(default_factory=list)

    def wrote(self, rel: str) -> str:
        """Note the sidecar at ``rel`` (relative to ``dir``) as written; returns ``rel``."""
        self.written.append(self.dir / rel)
        return rel


@dataclass
class CallRecord:
    """One call in flight: what the runtime has reported so far."""

    recorder: TraceRecorder
    request: AskRequest
    alias: str
    schema_path: Path | None
    args: dict[str, Any]
    legs: list[_Leg] = field(default_factory=list)
    substitution: dict[str, Any] | None = None

    def leg_finished(self, alias: str, response: AskResponse | None, error: AgentError | None, value: Any) -> None:
        """An agent answered (``response``, validated ``value``) or failed (``error``)."""
        self.legs.append(_Leg(alias, response, error, value))

    def fallback(self, *, reason: str, original_plugin: str, fallback_plugin: str) -> None:
        """The first leg's failure sent the call to ``fallback_plugin``."""
        self.substitution = {"reason": reason, "original_plugin": original_plugin, "fallback_plugin": fallback_plugin}

    def finished(self, *, call_id: str, duration_ms: int, meta: Mapping[str, Any]) -> None:
        """Write the call's group: start, sub-events, complete | error."""
        self.recorder._write(self, call_id=call_id, duration_ms=duration_ms, meta=dict(meta))


class TraceRecorder:
    """Builds and appends the agent-call events of one trace; see the module docstring."""

    def __init__(self, writer: TraceWriter, *, redact: Redactor | None = None, base_dir: Path | None = None) -> None:
        self.writer = writer
        self._redact = redact or Redactor()
        #: schema paths are recorded relative to this (the config's directory), never as host paths
        self._base_dir = base_dir
        self._lock = threading.Lock()
        sidecars.sweep_stale_temps(writer.dir)  # what a killed writer of this directory left

    # ---------------------------------------------------------------- the session so far

    def next_turn(self) -> int:
        """The turn a continuing session starts: one past the last recorded (1 for a new trace)."""
        turns = [event.turn for event in self.writer.history()]
        turns += [event.parent_turn for event in self.writer.history() if event.parent_turn is not None]
        return max(turns) + 1 if turns else 1

    def episode_plays(self) -> dict[str, int]:
        """``episode_id`` → how many matches of it this trace already holds (the next ``match_idx``)."""
        plays: dict[str, int] = {}
        for event in self.writer.history():
            if event.kind == "agent.call.start" and event.episode_id is not None:
                plays[event.episode_id] = max(plays.get(event.episode_id, 0), (event.match_idx or 0) + 1)
        return plays

    # ---------------------------------------------------------------- one call

    def call_started(
        self, request: AskRequest, *, alias: str, schema_path: Path | None, args: Mapping[str, Any]
    ) -> CallRecord:
        """Begin recording a call (nothing is written yet)."""
        return CallRecord(self, request, alias, schema_path, dict(args))

    def _clean(self, value: Any) -> Any:
        # masked before the trace's NFC/CRLF normalisation (which could split a secret from
        # its neighbour) and after it (which could form one, or the NFC form of one)
        return self._redact.value(scrub(self._redact.value(value)))

    def _write(self, record: CallRecord, *, call_id: str, duration_ms: int, meta: dict[str, Any]) -> None:
        with self._lock:
            events = self._group(record, call_id, duration_ms, meta)
            # one group: contiguous, and (when the call outlived its turn) written late as a whole
            self.writer.append_group(
                [
                    {
                        "kind": kind,
                        "payload": payload,
                        "turn": record.request.turn,
                        "state_path": record.request.state_path,
                        **ids,
                    }
                    for kind, payload, ids in events
                ]
            )

    def _group(
        self, record: CallRecord, call_id: str, duration_ms: int, meta: dict[str, Any]
    ) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The call's group, its sidecar files written under the first free suffix: one that
        another writer in the directory takes meanwhile is given up (what this attempt wrote
        removed) for the next."""
        n = 0
        while True:
            n, suffix = _free_suffix(self.writer.dir, call_id, n)
            files = _Files(self.writer.dir, call_id, suffix, enabled=True)
            try:
                return self._events(record, call_id, duration_ms, meta, files)
            except sidecars.SidecarTaken:
                for path in files.written:
                    path.unlink(missing_ok=True)
                n += 1
            except TraceError as exc:
                # A payload that cannot be written (a sidecar on a full disk, a value no
                # sidecar can hold): the call still gets its start and its end.
                files = _Files(self.writer.dir, call_id, suffix, enabled=False)
                return self._events(record, call_id, duration_ms, meta, files, failure=exc)

    def _events(
        self,
        record: CallRecord,
        call_id: str,
        duration_ms: int,
        meta: dict[str, Any],
        files: _Files,
        *,
        failure: TraceError | None = None,
    ) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """The call's group as (kind, payload, ids), sidecar files written (none when ``files``
        is disabled)."""
        leg = record.legs[-1]
        original = record.legs[0] if len(record.legs) > 1 else None
        common: dict[str, Any] = {"verb": record.request.verb, "agent": record.alias}
        if meta.get("model"):
            common["model"] = self._clean(meta["model"])
        ids: dict[str, Any] = {"call_id": call_id}
        replay = leg.response if leg.response is not None else leg.error
        if replay is not None and replay.episode_id is not None and replay.match_idx is not None:
            ids.update(episode_id=replay.episode_id, match_idx=replay.match_idx)
        events = [("agent.call.start", {**common, **self._start(record, files)}, ids)]
        end: dict[str, Any] = {**common, "duration_ms": duration_ms}
        if original is not None and original.response is not None and original.response.meta:
            end["original_meta"] = self._clean(original.response.meta)
        if leg.error is None:
            events.extend(self._sub_events(leg, call_id))
            end.update(self._complete(leg, meta, files))
            kind = "agent.call.complete"
        else:
            # this leg's own error; the local leg's is original_error
            end.update(error=self._clean(str(leg.error.replace(original=None))), kind=leg.error.kind.value)
            if original is not None and original.error is not None:
                end["original_error"] = self._clean(str(original.error))
            kind = "agent.call.error"
        if record.substitution is not None:
            end["substitution"] = record.substitution
        end.update(self._transcripts(leg, original, files))
        if failure is not None:
            end["trace_error"] = self._clean(str(failure))
        events.append((kind, end, {"call_id": call_id}))
        return events

    def _start(self, record: CallRecord, files: _Files) -> dict[str, Any]:
        start: dict[str, Any] = {}
        prompt = self._redact(record.request.prompt)
        if not sidecars.needs_sidecar(prompt):
            start["prompt"] = prompt
        elif files.enabled:
            start["prompt_file"] = files.wrote(
                sidecars.write_prompt(files.dir, files.call_id, prompt, suffix=files.suffix, exclusive=True)
            )
        start["input"] = self._clean(self._input(record))
        return start

    def _input(self, record: CallRecord) -> dict[str, Any]:
        """``{schema_present, schema_path, args}``: no host path (see the module docstring)."""
        given: dict[str, Any] = {}
        if record.schema_path is not None or record.request.schema is not None:
            given["schema_present"] = True
        if record.schema_path is not None:
            given["schema_path"] = _relative(record.schema_path, self._base_dir)
        given["args"] = record.args
        return given

    def _sub_events(self, leg: _Leg, call_id: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        assert leg.response is not None
        return [
            (self._clean(str(event["kind"])), self._clean(dict(event.get("payload") or {})), {"call_id": call_id})
            for event in leg.response.sub_events
        ]

    def _complete(self, leg: _Leg, meta: dict[str, Any], files: _Files) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        # the reference's shape: {"submission": …, "meta": …} (meta also beside it)
        response: dict[str, Any] = {"submission": self._redact.value(leg.value)}
        if meta:
            response["meta"] = self._clean(meta)
        if not sidecars.needs_sidecar(response):
            fields["response"] = response
        elif files.enabled:
            fields["response_file"] = files.wrote(
                sidecars.write_response(files.dir, files.call_id, response, suffix=files.suffix, exclusive=True)
            )
        if meta:
            fields["meta"] = self._clean(meta)
        return fields

    def _transcripts(self, leg: _Leg, original: _Leg | None, files: _Files) -> dict[str, Any]:
        refs: dict[str, Any] = {}
        if not files.enabled:
            return refs
        for key, part, extra in (("transcript_ref", leg, ""), ("original_transcript_ref", original, "-original")):
            if part is not None and part.response is not None and part.response.transcript is not None:
                transcript = self._redacted_transcript(part.response.transcript)
                ref = sidecars.write_transcript(
                    files.dir, files.call_id, transcript, suffix=files.suffix + extra, exclusive=True
                )
                files.wrote(ref["path"])
                files.written.append((files.dir / ref["path"]).with_suffix(".timings"))
                refs[key] = ref
        return refs

    def _redacted_transcript(self, transcript: Transcript) -> Transcript:
        if not self._redact:
            return transcript
        return Transcript(
            transcript.format, [self._redact(line) for line in transcript.lines], list(transcript.offsets_ms)
        )


def _relative(path: Path, base: Path | None) -> str:
    """``path`` relative to ``base`` (POSIX separators); only the file name without a base."""
    if base is not None:
        try:
            return Path(os.path.relpath(path, base.resolve())).as_posix()
        except ValueError:  # another drive
            pass
    return path.name


def _free_suffix(trace_dir: Path, call_id: str, start: int = 0) -> tuple[int, str]:
    """The first suffix from the ``start``-th on ("" then "-1", "-2", …) under which no
    sidecar of ``call_id`` exists, with its number."""
    for n in range(start, _MAX_SUFFIX):
        suffix = f"-{n}" if n else ""
        stem = call_id + suffix
        taken = (
            trace_dir / sidecars.PROMPTS_DIR / f"{stem}.txt",
            trace_dir / sidecars.PROMPTS_DIR / f"{stem}-response.json",
            *(
                trace_dir / sidecars.TRANSCRIPTS_DIR / f"{stem}{extra}{ext}"
                for extra in ("", "-original")
                for ext in (".jsonl", ".timings")
            ),
        )
        if not any(path.exists() for path in taken):
            return n, suffix
    raise TraceError(
        f"{trace_dir}: every sidecar name for call {call_id} is taken", hint="use a fresh directory for the trace"
    )
