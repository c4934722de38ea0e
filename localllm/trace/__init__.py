"""The JSONL trace: one writer, one reader, sidecar files (trace-format spec).

    with TraceWriter.open("run.jsonl") as w:
        w.append("agent.call.start", {"verb": "decide"}, turn=1, state_path="idle", call_id=cid)
    trace = read_trace("run.jsonl")

Only the standard library is imported here.
"""

from __future__ import annotations

from localllm.trace.callid import cassette_call_key, derive_call_id, live_call_key
from localllm.trace.event import HEADER_KIND, SCHEMA_VERSION, Event, format_ts
from localllm.trace.reader import Trace, parse_trace, read_trace
from localllm.trace.rules import clean_text
from localllm.trace.sidecars import (
    SIDECAR_THRESHOLD,
    needs_sidecar,
    write_prompt,
    write_response,
    write_transcript,
)
from localllm.trace.writer import TraceWriter

__all__ = [
    "HEADER_KIND",
    "SCHEMA_VERSION",
    "SIDECAR_THRESHOLD",
    "Event",
    "Trace",
    "TraceWriter",
    "cassette_call_key",
    "clean_text",
    "derive_call_id",
    "format_ts",
    "live_call_key",
    "needs_sidecar",
    "parse_trace",
    "read_trace",
    "write_prompt",
    "write_response",
    "write_transcript",
]
