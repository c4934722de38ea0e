"""``builtin.claude_cli``: answer a call by running the ``claude`` CLI non-interactively.

One call is one process: ``claude -p --output-format stream-json --verbose [--model M]
[extra_args…]`` with the prompt on stdin. When the request carries a schema, the prompt
gets the schema appended (pretty-printed in a ```json fence) and an instruction to answer
with only the JSON. The CLI prints one JSON event per line — ``system`` (init),
``assistant`` / ``user`` (messages, tool use and results) and finally ``result``::

    {"type": "result", "subtype": "success", "is_error": false, "result": "<text>",
     "usage": {...}, "total_cost_usd": 0.01, "modelUsage": {...}, "session_id": "..."}

Every event line is kept verbatim, in order, with its capture offset, as the transcript
(format ``claude-stream-json``, trace-format §5); the answer (see :func:`extract_json`)
and the meta come from the ``result`` event. The answer is complete at the ``result``
event or when the CLI exits, whichever comes first — not at end of file, which a
grandchild holding stdout could postpone to the deadline. The process group (the CLI and
anything it started) is then stopped, so no child outlives its call.

Binary: ``claude_bin:`` of the declaration, else ``LOCALLLM_CLAUDE_BIN``, else ``claude``
on PATH. It is looked up per call, so declaring (or injecting) ``agent.claude`` never
fails on a machine without the CLI; a missing binary is a ``transport_error`` naming the
three ways to set it. The child inherits the parent's environment (the CLI needs HOME
and its own auth); nothing from it is logged.

Errors: non-zero exit → ``plugin_crash`` with the stderr tail; ``is_error: true`` →
``plugin_crash`` with the result event's text; no result event → ``plugin_crash``
quoting the head of stdout; deadline or :meth:`ClaudeCliAgent.cancel` → the whole
process group is killed and ``deadline_exceeded`` raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from localllm import _process, settings
from localllm.agents.base import Agent
from localllm.errors import AgentError, ErrorKind, truncate_detail
from localllm.wire import AskRequest, AskResponse, Transcript, finite_float

if TYPE_CHECKING:
    from localllm.config import ClaudeCliDecl

__all__ = ["TRANSCRIPT_FORMAT", "ClaudeCliAgent", "extract_json", "schema_instruction"]

#: ``Transcript.format`` of the stream-json event transcript (trace-format §5)
TRANSCRIPT_FORMAT = "claude-stream-json"

#: SIGTERM → SIGKILL grace when a call is cut (kept short: the deadline has passed)
_KILL_GRACE = 0.25
#: how long to wait for pipes to drain after the group was killed
_REAP_TIMEOUT = 2.0
#: how long the CLI may take to exit after its result event before its group is stopped
_EXIT_GRACE = 2.0
#: how often a read wait looks at whether the CLI has exited (its stdout may stay open)
_EXIT_POLL = 0.1
#: largest stdout accepted from one run (a stream is kilobytes to megabytes; a runaway CLI is cut here)
_MAX_STDOUT = 64 * 1024 * 1024
#: stdout is read incrementally: at most this much of it is kept as transcript lines (later
#: lines are counted, not kept), and no line may be longer than :data:`_MAX_LINE`, so a
#: flood costs bounded memory however much of the cap it uses
_TRANSCRIPT_KEEP = 8 * 1024 * 1024
_MAX_LINE = 16 * 1024 * 1024
#: bytes of stderr kept (its tail goes into errors)
_STDERR_KEEP = 64 * 1024
_PIPE_CHUNK = 65536
_STDERR_TAIL_LINES = 10
_STDERR_TAIL_BYTES = 1024
_USAGE_CACHE_READ = "cache_read_input_tokens"
_USAGE_CACHE_CREATION = "cache_creation_input_tokens"


def schema_instruction(schema: dict[str, Any]) -> str:
    """The text appended to a prompt that carries a schema."""
    pretty = json.dumps(schema, indent=2, ensure_ascii=False, sort_keys=False)
    return (
        "\n\n---\n"
        "Your answer must be a single JSON value that validates against this JSON Schema:\n"
        f"```json\n{pretty}\n```\n"
        "Reply with only that JSON: no prose before or after it, no code fence, no explanation."
    )


def _strip_fence(text: str) -> str | None:
    """The body of a text that is exactly one fenced block (```json or ```), else None."""
    if not (text.startswith("```") and text.endswith("```") and len(text) >= 6):
        return None
    first_nl = text.find("\n")
    if first_nl < 0:
        return None
    info = text[3:first_nl].strip().lower()
    if info not in ("", "json"):
        return None
    return text[first_nl + 1 : -3].strip()


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json decodes
        return False
    return True


#: where a JSON object or array can start: the opener, JSON whitespace, then what may follow
#: it (a key or ``}``; a value or ``]``, Python's ``NaN``/``Infinity`` included)
_STARTS = {"{": re.compile(r'\{[ \t\n\r]*["}]'), "[": re.compile(r"\[[ \t\n\r]*[\[\]{\"\-0-9tfnNI]")}
#: starts that do not parse, tried before the scan gives up as ambiguous: each costs a pass
#: over the text before it (json's error counts the lines up to its position)
_MAX_FALSE_STARTS = 256


def _embedded_values(text: str, opener: str) -> list[str]:
    """Every top-level JSON value starting with ``opener`` found by scanning ``text``.

    None of them when one is nested deeper than ``json`` decodes: that value may be the
    answer, so which one is meant cannot be told (and rescanning inside it at every
    opener would be quadratic). Only an opener that JSON can follow is tried (a code block's
    ``{`` and a newline are not), and after :data:`_MAX_FALSE_STARTS` tries that fail the
    text counts as ambiguous (none): each try was quadratic in the answer's length."""
    decoder = json.JSONDecoder()
    start = _STARTS[opener]
    found: list[str] = []
    false_starts = 0
    match = start.search(text)
    while match is not None:
        pos = match.start()
        try:
            _, end = decoder.raw_decode(text, pos)
        except RecursionError:
            return []
        except ValueError:
            false_starts += 1
            if false_starts > _MAX_FALSE_STARTS:
                return []
            match = start.search(text, pos + 1)
            continue
        found.append(text[pos:end])
        match = start.search(text, end)
    return found


def extract_json(text: str, schema: dict[str, Any] | None = None) -> str | None:
    """The JSON answer inside a result text, or None when there is no unambiguous one.

    The rule, in order: the stripped text if it parses as JSON; the body of a text that
    is one ```json / ``` fenced block, if it parses; otherwise exactly one JSON object
    embedded in prose (an array instead when the schema's top-level type is ``array``).
    Zero or several candidates give None: the caller then passes the raw text on, so the
    runtime reports ``schema_invalid`` with the parse error.
    """
    stripped = text.strip()
    if _parses(stripped):
        return stripped
    body = _strip_fence(stripped)
    if body is not None and _parses(body):
        return body
    opener = "[" if schema is not None and schema.get("type") == "array" else "{"
    candidates = _embedded_values(stripped, opener)
    if len(candidates) == 1:
        return candidates[0]
    return None


def _meta(envelope: dict[str, Any], decl_model: str | None) -> dict[str, Any]:
    """Trace meta of a result envelope: usage, cache view, cost, model, session."""
    meta: dict[str, Any] = {}
    usage = envelope.get("usage")
    if isinstance(usage, dict):
        # Keep the integer counters only (drop nested breakdowns and tier strings).
        counters = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
        meta["usage"] = counters
        if _USAGE_CACHE_READ in counters or _USAGE_CACHE_CREATION in counters:
            read = counters.get(_USAGE_CACHE_READ, 0)
            meta["cache"] = {
                "read_tokens": read,
                "creation_tokens": counters.get(_USAGE_CACHE_CREATION, 0),
                "hit": read > 0,
            }
    # Older CLIs named it cost_usd; current ones total_cost_usd. NaN, an infinity or an
    # integer past the float range is no cost (it would reach `call --json` as NaN/Infinity).
    for key in ("total_cost_usd", "cost_usd"):
        cost = finite_float(envelope.get(key))
        if cost is not None:
            meta["cost_usd"] = cost
            break
    model = _model_of(envelope) or decl_model
    if model:
        meta["model"] = model
    for key in ("session_id", "num_turns"):
        if key in envelope and isinstance(envelope[key], (str, int)):
            meta[key] = envelope[key]
    return meta


def _model_of(envelope: dict[str, Any]) -> str | None:
    """The model that produced most output, from ``modelUsage`` (the CLI may use several)."""
    usage = envelope.get("modelUsage")
    if not isinstance(usage, dict) or not usage:
        return None

    def output_tokens(name: str) -> int:
        entry = usage.get(name)
        value = entry.get("outputTokens", 0) if isinstance(entry, dict) else 0
        return value if isinstance(value, int) else 0

    return str(max(sorted(usage), key=output_tokens))


@dataclass
class _Call:
    """One in-flight call: its process once spawned, and whether it was cancelled."""

    proc: subprocess.Popen[str] | None = None
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class ClaudeCliAgent(Agent):
    """Run the ``claude`` CLI for each call. Thread-safe; one child process per call."""

    plugin: ClassVar[str] = "builtin.claude_cli"

    def __init__(self, decl: ClaudeCliDecl) -> None:
        super().__init__(decl.alias)
        self.decl = decl
        self._lock = threading.Lock()
        self._calls: dict[str, list[_Call]] = {}
        self._closed = False

    # -- binary ---------------------------------------------------------------------

    def resolve_bin(self) -> str:
        """The claude executable to run; ``transport_error`` whose hint names the fixes if none."""
        how = (
            f"set `claude_bin:` under agent_plugins.{self.alias} in the config, "
            "set LOCALLLM_CLAUDE_BIN, or put `claude` on PATH"
        )
        for source, value in (
            (f"agent_plugins.{self.alias}.claude_bin", self.decl.claude_bin),
            ("LOCALLLM_CLAUDE_BIN", settings.claude_bin()),
        ):
            if not value:
                continue
            found = shutil.which(value) if os.sep not in value else value
            if found and os.path.isfile(found) and os.access(found, os.X_OK):
                return found
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"claude CLI not found: {source} is {value!r}, which is not an executable file",
                hint=f"fix {source} or unset it; or {how}",
                alias=self.alias,
            )
        found = shutil.which("claude")
        if found:
            return found
        raise AgentError(ErrorKind.TRANSPORT_ERROR, "claude CLI not found on PATH", hint=how, alias=self.alias)

    def argv(self, binary: str) -> list[str]:
        """The command line of one call."""
        argv = [binary, "-p", "--output-format", "stream-json", "--verbose"]
        if self.decl.model:
            argv += ["--model", self.decl.model]
        argv += list(self.decl.extra_args)
        return argv

    @staticmethod
    def render_prompt(request: AskRequest) -> str:
        """The stdin text: the prompt, plus the schema statement when there is a schema."""
        if request.schema is None:
            return request.prompt
        return request.prompt + schema_instruction(request.schema)

    # -- calls ----------------------------------------------------------------------

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        if self.remaining(deadline) <= 0:
            raise AgentError(ErrorKind.DEADLINE_EXCEEDED, "deadline passed before start", alias=self.alias)
        argv = self.argv(self.resolve_bin())
        call = self._register(request.call_id)
        try:
            output = self._run(call, argv, request, deadline)
        finally:
            self._unregister(request.call_id, call)
        return self._response(request, output)

    def _register(self, call_id: str) -> _Call:
        call = _Call()
        with self._lock:
            if self._closed:
                raise AgentError(ErrorKind.TRANSPORT_ERROR, "agent is closed", alias=self.alias)
            self._calls.setdefault(call_id, []).append(call)
        return call

    def _unregister(self, call_id: str, call: _Call) -> None:
        with self._lock:
            calls = self._calls.get(call_id, [])
            if call in calls:
                calls.remove(call)
            if not calls:
                self._calls.pop(call_id, None)

    def _run(self, call: _Call, argv: list[str], request: AskRequest, deadline: float) -> _Output:
        started = time.monotonic()
        with call.lock:
            if call.cancelled:
                raise AgentError(ErrorKind.DEADLINE_EXCEEDED, "call cancelled", alias=self.alias)
            try:
                # A new session makes the child a process-group leader, so a cut kills
                # everything it started (node workers, MCP servers) too.
                call.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    encoding="utf-8",
                    errors="replace",
                    start_new_session=True,
                )
            except OSError as exc:
                raise AgentError(ErrorKind.TRANSPORT_ERROR, f"cannot run claude CLI {argv[0]!r}: {exc}") from exc
        proc = call.proc
        try:
            output = _communicate(proc, self.render_prompt(request), deadline, started)
        except _OutputTooLarge as exc:
            _kill_group(proc)
            _let_go(proc)  # not communicate(): whatever still holds the pipe could flood it
            raise AgentError(
                ErrorKind.PLUGIN_CRASH,
                f"claude CLI printed more than {_MAX_STDOUT} bytes on stdout (or a line over {_MAX_LINE}); "
                "process group killed",
                alias=self.alias,
            ) from exc
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            _reap(proc)
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED,
                "claude CLI still running at the deadline; process group killed",
                alias=self.alias,
            ) from exc
        except BaseException:
            # Never leave the child behind, whatever interrupted us.
            _kill_group(proc)
            _reap(proc)
            raise
        if call.cancelled:
            raise AgentError(
                ErrorKind.DEADLINE_EXCEEDED,
                "cancelled at the hard deadline; process group killed",
                alias=self.alias,
            )
        return output

    def _response(self, request: AskRequest, output: _Output) -> AskResponse:
        result = output.result
        if output.returncode != 0 and not output.stopped_after_result:
            detail = f"claude CLI exited with code {output.returncode}"
            tail = _process.tail(output.stderr.strip(), limit=_STDERR_TAIL_BYTES, lines=_STDERR_TAIL_LINES)
            if tail:
                detail += f"; stderr: {tail}"
            elif result is not None and isinstance(result.get("result"), str):
                detail += f"; result: {truncate_detail(result['result'])}"
            raise AgentError(ErrorKind.PLUGIN_CRASH, detail)
        if result is None:
            head = "\n".join(line for line, _ in output.lines).strip() or "(empty)"
            raise AgentError(
                ErrorKind.PLUGIN_CRASH,
                f"claude CLI printed no result event; stdout: {truncate_detail(head)}",
            )
        text = result.get("result")
        if result.get("is_error") is True or result.get("subtype", "success") != "success":
            shown = text if isinstance(text, str) and text else str(result.get("subtype"))
            raise AgentError(ErrorKind.PLUGIN_CRASH, f"claude CLI reported an error: {truncate_detail(shown)}")
        if not isinstance(text, str):
            raise AgentError(
                ErrorKind.PLUGIN_CRASH,
                f"claude CLI result event has no result text: {truncate_detail(json.dumps(result))}",
            )
        meta = _meta(result, output.init_model or self.decl.model)
        events = [(line, ms) for line, ms in output.lines if _event(line) is not None]
        transcript = Transcript(
            format=TRANSCRIPT_FORMAT, lines=[line for line, _ in events], offsets_ms=[ms for _, ms in events]
        )
        return AskResponse(submission=_submission(text, request.schema), meta=meta or None, transcript=transcript)

    def cancel(self, call_id: str) -> None:
        with self._lock:
            calls = list(self._calls.get(call_id, []))
        _cut(calls)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            calls = [c for group in self._calls.values() for c in group]
        _cut(calls)


def _cut(calls: list[_Call]) -> None:
    """Mark ``calls`` cancelled and kill the process group of each that has started."""
    for call in calls:
        with call.lock:
            call.cancelled = True
            proc = call.proc
        if proc is not None:
            _kill_group(proc)


def _submission(result: str, schema: dict[str, Any] | None) -> str:
    """Submission text from the result text (see :func:`extract_json`).

    Without a schema a non-JSON answer becomes a JSON string, so free-text verbs still
    bind their text; with a schema it is passed on raw for the runtime to reject.
    """
    found = extract_json(result, schema)
    if found is not None:
        return found
    if schema is None:
        return json.dumps(result, ensure_ascii=False)
    return result


def _event(line: str) -> dict[str, Any] | None:
    """The stream-json event on ``line`` (a JSON object with a ``type``), else None."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json decodes
        return None
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


@dataclass
class _Output:
    """What one run printed: stdout's lines (verbatim, with capture offsets in ms), the
    result event once seen, the init event's model, stderr's tail and how it ended."""

    lines: list[tuple[str, int]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    init_model: str | None = None
    stderr: str = ""
    returncode: int | None = None
    #: the CLI was still running after its result event and its group was stopped
    stopped_after_result: bool = False
    #: bytes of the lines kept; lines (and their bytes) past :data:`_TRANSCRIPT_KEEP`, not kept
    kept: int = 0
    elided: int = 0
    elided_bytes: int = 0

    def add(self, raw: bytes, started: float) -> None:
        line = raw.decode("utf-8", errors="replace").removesuffix("\r")
        event = _event(line) if self.result is None else None
        if self.kept + len(raw) <= _TRANSCRIPT_KEEP or (event is not None and event["type"] == "result"):
            self.kept += len(raw)
            self.lines.append((line, int((time.monotonic() - started) * 1000)))
        else:
            self.elided += 1
            self.elided_bytes += len(raw)
        if event is None:
            return
        if event["type"] == "result":
            self.result = event
        elif event["type"] == "system" and isinstance(event.get("model"), str) and self.init_model is None:
            self.init_model = event["model"]


class _OutputTooLarge(Exception):
    """Internal: stdout passed :data:`_MAX_STDOUT`."""


def _communicate(proc: subprocess.Popen[str], prompt: str, deadline: float, started: float) -> _Output:
    """Write the prompt while reading the event stream, until the answer is complete: the
    result event arrived, or the CLI exited and what it left in the pipes was read (a
    grandchild may hold stdout open long after). stdout stops at :data:`_MAX_STDOUT` bytes
    (:class:`_OutputTooLarge`, checked while reading), only the last :data:`_STDERR_KEEP`
    bytes of stderr are kept, and every wait ends at ``deadline``
    (``subprocess.TimeoutExpired``). The process group is stopped before returning."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin_fd, stdout_fd = proc.stdin.fileno(), proc.stdout.fileno()
    data = memoryview(prompt.encode("utf-8"))
    output = _Output()
    pending, err = bytearray(), bytearray()
    total = 0
    with selectors.DefaultSelector() as sel:
        if data:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        sel.register(stdout_fd, selectors.EVENT_READ)
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ)
        while sel.get_map() and output.result is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            exited = proc.poll() is not None
            ready = sel.select(0 if exited else min(remaining, _EXIT_POLL))
            if exited and not ready:
                break  # the CLI is gone and its pipes hold nothing more
            for key, _ in ready:
                if key.fd == stdin_fd:
                    try:
                        data = data[os.write(stdin_fd, data[:_PIPE_CHUNK]) :]
                    except BrokenPipeError:
                        data = data[:0]  # the child stopped reading its prompt
                    if not data:
                        sel.unregister(stdin_fd)
                        with contextlib.suppress(OSError):
                            proc.stdin.close()
                    continue
                chunk = os.read(key.fd, _PIPE_CHUNK)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.fd == stdout_fd:
                    total += len(chunk)
                    if total > _MAX_STDOUT:
                        raise _OutputTooLarge
                    pending += chunk
                    while (end := pending.find(b"\n")) >= 0 and output.result is None:
                        output.add(bytes(pending[:end]), started)
                        del pending[: end + 1]
                    if len(pending) > _MAX_LINE:
                        raise _OutputTooLarge
                else:
                    err += chunk
                    del err[:-_STDERR_KEEP]
    if pending and output.result is None:
        output.add(bytes(pending), started)  # a last line without its newline
    if output.elided:
        note = {"type": "localllm.elided", "lines": output.elided, "bytes": output.elided_bytes}
        output.lines.append((json.dumps(note), int((time.monotonic() - started) * 1000)))
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    output.stderr = err.decode("utf-8", errors="replace")
    if output.result is not None:
        # The answer is in: give the CLI a moment to exit by itself, then stop what is left.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(_EXIT_GRACE, deadline - time.monotonic())))
        output.stopped_after_result = proc.returncode is None
    else:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    code = _process.stop_group(proc, grace=_KILL_GRACE)  # stragglers in the group, if any
    output.returncode = proc.returncode if not output.stopped_after_result else code
    return output


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the child's process group, SIGKILL it after a short grace."""
    # Kill the group even when the leader is gone: its children may still hold the pipes.
    _process.stop_group(proc, grace=_KILL_GRACE)


def _reap(proc: subprocess.Popen[str]) -> None:
    """Collect the killed child so no zombie stays; never wait unboundedly on pipes."""
    try:
        proc.communicate(timeout=_REAP_TIMEOUT)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        _let_go(proc)


def _let_go(proc: subprocess.Popen[str]) -> None:
    """Close our ends of the pipes and reap the child, waiting a bounded time."""
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_REAP_TIMEOUT)
