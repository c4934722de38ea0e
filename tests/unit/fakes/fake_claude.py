"""A fake ``claude`` CLI (stdlib only) for tests: ``claude -p --output-format stream-json --verbose``.

Install it with :func:`install` (writes an executable ``claude`` shim into a directory
that the test prepends to PATH). It reads the prompt from stdin and prints the stream the
real CLI prints, one JSON event per line: ``system`` (init, with the model), ``assistant``
(the answer as a text block), ``result`` (the answer, usage, cost). It behaves according
to environment variables:

FAKE_CLAUDE_MODE
    ``ok`` (default)   the stream, whose result event's ``result`` is the answer
    ``fenced``         the answer inside a ```json fence
    ``prose``          the answer with a sentence of prose before and after
    ``exit2``          lines on stderr, exit code 2, nothing on stdout
    ``error_envelope`` an ``is_error: true`` result event, exit code 0
    ``garbage``        non-JSON text on stdout, exit code 0
    ``hang``           start a sleeping child, record both pids, sleep forever
    ``linger``         the stream, then exit 0 leaving a sleeping grandchild that holds
                       stdout open; both pids recorded
    ``result_then_hang`` the stream, then sleep forever (with a sleeping child) instead of
                       exiting; both pids recorded
FAKE_CLAUDE_RESULT
    the answer text. Without it, the answer is JSON built from the schema stated in
    the prompt (the last ```json fenced block), see :func:`sample`; with no schema in
    the prompt it is ``{"answer": "ok"}``.
FAKE_CLAUDE_NO_CACHE
    ``1``: the envelope's usage has no cache keys.
FAKE_CLAUDE_RECORD
    a file: the argv and the prompt of each run are appended to it as one JSON line.
FAKE_CLAUDE_PIDFILE
    ``hang``, ``linger`` and ``result_then_hang`` write ``"<own pid> <child pid>"`` there
    once the child runs.

:func:`sample` answers a *simple* schema: ``const``, first ``enum`` value, first of
``anyOf``/``oneOf``, first non-null type of a type list; objects get their required
properties (all listed properties when ``required`` is absent); strings ``"ok"`` padded
or cut to ``minLength``/``maxLength``; numbers at ``minimum`` (one above an exclusive
minimum) else 0 clipped to ``maximum``; arrays ``minItems`` samples of ``items``.
``pattern``, ``format``, ``multipleOf`` and ``$ref`` are not honoured.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL = "claude-sonnet-4-5-20250929"
_FENCE = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


def install(bin_dir: Path, python: str = sys.executable) -> Path:
    """Write an executable ``claude`` shim running this script into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "claude"
    shim.write_text(f'#!/bin/sh\nexec "{python}" "{Path(__file__).resolve()}" "$@"\n')
    shim.chmod(0o755)
    return shim


def sample(schema: Any) -> Any:
    """A value satisfying a simple JSON Schema (see the module docstring)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return sample(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties", {})
        names = schema.get("required", list(props))
        return {name: sample(props.get(name, {"type": "string"})) for name in names}
    if kind == "array":
        return [sample(schema.get("items", {"type": "string"})) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        text = "ok"
        if "minLength" in schema:
            text = text.ljust(schema["minLength"], "k")
        if "maxLength" in schema:
            text = text[: schema["maxLength"]]
        return text
    if kind in ("integer", "number"):
        value: float = 0
        if "minimum" in schema:
            value = schema["minimum"]
        elif "exclusiveMinimum" in schema:
            value = schema["exclusiveMinimum"] + 1
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            value = schema["exclusiveMaximum"] - 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    return None


def _answer(prompt: str) -> str:
    given = os.environ.get("FAKE_CLAUDE_RESULT")
    if given is not None:
        return given
    blocks = _FENCE.findall(prompt)
    if not blocks:
        return json.dumps({"answer": "ok"})
    try:
        schema = json.loads(blocks[-1])
    except ValueError:
        return json.dumps({"answer": "ok"})
    return json.dumps(sample(schema))


def _model(argv: list[str]) -> str:
    if "--model" in argv:
        i = argv.index("--model")
        if i + 1 < len(argv):
            return argv[i + 1]
    return MODEL


def _envelope(result: str, argv: list[str], *, is_error: bool = False) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": 12, "output_tokens": 7}
    if os.environ.get("FAKE_CLAUDE_NO_CACHE") != "1":
        usage.update(cache_creation_input_tokens=0, cache_read_input_tokens=2048)
    usage["server_tool_use"] = {"web_search_requests": 0}
    usage["service_tier"] = "standard"
    return {
        "type": "result",
        "subtype": "error_during_execution" if is_error else "success",
        "is_error": is_error,
        "duration_ms": 1234,
        "duration_api_ms": 1100,
        "num_turns": 1,
        "result": result,
        "session_id": "00000000-0000-4000-8000-000000000001",
        "total_cost_usd": 0.0123,
        "usage": usage,
        "modelUsage": {
            _model(argv): {"inputTokens": 12, "outputTokens": 7, "costUSD": 0.0123},
            "claude-3-5-haiku-20241022": {"inputTokens": 3, "outputTokens": 1, "costUSD": 0.0001},
        },
        "permission_denials": [],
        "uuid": "00000000-0000-4000-8000-000000000002",
    }


def _stream(result: str, argv: list[str], *, is_error: bool = False) -> list[dict[str, Any]]:
    """The stream-json events of one run: init, the assistant's text, the result."""
    session = "00000000-0000-4000-8000-000000000001"
    init = {
        "type": "system",
        "subtype": "init",
        "cwd": os.getcwd(),
        "session_id": session,
        "tools": ["Bash", "Read"],
        "mcp_servers": [],
        "model": _model(argv),
        "permissionMode": "default",
        "apiKeySource": "none",
        "output_style": "default",
        "uuid": "00000000-0000-4000-8000-000000000003",
    }
    assistant = {
        "type": "assistant",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": _model(argv),
            "content": [{"type": "text", "text": result}],
            "stop_reason": None,
            "usage": {"input_tokens": 12, "output_tokens": 7},
        },
        "parent_tool_use_id": None,
        "session_id": session,
        "uuid": "00000000-0000-4000-8000-000000000004",
    }
    return [init, assistant, _envelope(result, argv, is_error=is_error)]


def _print_stream(events: list[dict[str, Any]]) -> None:
    for event in events:
        sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _sleeper(pidfile: str | None) -> None:
    """Start a child sleeping an hour (it inherits stdout) and record both pids."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if pidfile:
        Path(pidfile).write_text(f"{os.getpid()} {child.pid}")


def main(argv: list[str]) -> int:
    prompt = sys.stdin.read()
    record = os.environ.get("FAKE_CLAUDE_RECORD")
    if record:
        with open(record, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"argv": argv, "prompt": prompt}) + "\n")
    mode = os.environ.get("FAKE_CLAUDE_MODE", "ok")
    if mode == "exit2":
        sys.stderr.write("starting\nloading config\nError: invalid API key · Please run /login\n")
        return 2
    if mode == "garbage":
        sys.stdout.write("Welcome to Claude! This is not JSON.\n")
        return 0
    if mode == "error_envelope":
        _print_stream(_stream("Credit balance is too low", argv, is_error=True))
        return 0
    pidfile = os.environ.get("FAKE_CLAUDE_PIDFILE")
    if mode == "hang":
        _sleeper(pidfile)
        time.sleep(3600)
        return 0
    answer = _answer(prompt)
    if mode == "fenced":
        answer = f"```json\n{answer}\n```"
    elif mode == "prose":
        answer = f"Here is the answer you asked for:\n{answer}\nLet me know if you need more."
    _print_stream(_stream(answer, argv))
    if mode == "linger":
        _sleeper(pidfile)
    elif mode == "result_then_hang":
        _sleeper(pidfile)
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
