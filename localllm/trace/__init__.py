"""The JSONL trace: one writer, one reader, sidecar files (trace-format spec).

    with TraceWriter.open("run.jsonl") as w:
        w.append("agent.call.start", {"verb": "decide"}, turn=1, state_path="idle", call_id=cid)
    trace = read_trace("run.jsonl")

Only the standard library is imported here, and each name's module only when the name is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562): a Runtime without a trace needs only the call_id
# functions, not the writer, reader and their checks (an import on every `localllm run`).
_WHERE = {
    "cassette_call_key": "callid",
    "derive_call_id": "callid",
    "live_call_key": "callid",
    "HEADER_KIND": "event",
    "SCHEMA_VERSION": "event",
    "Event": "event",
    "format_ts": "event",
    "Trace": "reader",
    "parse_trace": "reader",
    "read_trace": "reader",
    "clean_text": "rules",
    "SIDECAR_THRESHOLD": "sidecars",
    "needs_sidecar": "sidecars",
    "write_prompt": "sidecars",
    "write_response": "sidecars",
    "write_transcript": "sidecars",
    "TraceWriter": "writer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:
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
