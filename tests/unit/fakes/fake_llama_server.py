"""A fake ``llama-server``: a real process speaking enough of its CLI, logs and HTTP API.

Run it as ``sys.executable fake_llama_server.py <llama-server argv...>`` (standard library
only). Like the real server it binds its socket first, answers every endpoint with 503
``Loading model`` while "loading", then 200; logs only to stderr, in the real format::

    0.00.084.475 I srv  llama_server: model loaded
    0.00.084.480 I srv  llama_server: listening on http://127.0.0.1:PORT

Flags understood: ``-m/--model`` (must exist, else exit 1 like a failed load), ``--host``,
``--port`` (0 = pick a free one), ``-np/--parallel``, ``-c/--ctx-size``, ``-t/--threads``,
``--no-webui/--no-ui``, ``--embedding(s)``, ``--pooling``, ``--api-key`` (or env
``LLAMA_API_KEY``; enforced, Bearer or X-Api-Key, on everything but ``/health`` and
``/v1/health``), ``-ub/--ubatch-size``, ``-b/--batch-size``, ``-a/--alias``, ``--help``.
Unknown flags are ignored (with their value, if the next token is not a flag).
With ``--embeddings``, ``-ub`` not divisible by ``-np`` aborts the load (SIGABRT), as the
real server does for BERT models.

Signals: SIGTERM/SIGINT while loading kill at once (-15); after loading the first one
exits 0 cleanly, a second exits 1.

Endpoints: ``GET /health``, ``/v1/health``, ``/v1/models``, ``/models``, ``/props``;
``POST /v1/chat/completions`` (also ``/chat/completions``; ``"stream": true`` answers
server-sent events, one delta per word), ``/v1/completions`` (its OpenAI text completions:
see ``Handler.completions``), ``/v1/embeddings`` (also
``/embeddings``; 501 without ``--embeddings``; vectors deterministic per input text,
L2-normalised, ``encoding_format`` float or base64; an input longer than ``-ub`` tokens
is the real 500 ``input (N tokens) is too large to process``), ``/tokenize``, ``/detokenize``
(an id past ``n_vocab`` is the real 500, a C++ range check).
Tokens are ``\\w+`` runs and single punctuation marks, ids from a hash.

Chat answers, first match wins: the next entry of ``FAKE_LLAMA_BEHAVIOUR``; else
``FAKE_LLAMA_CONTENT``; else, given a GBNF ``grammar``, its first walk (400 if it does
not parse); else, given ``response_format`` json_schema, the smallest JSON
instance of the schema (first enum/const/anyOf branch, every property, minimum lengths
and bounds); else ``"Hello from the fake llama-server."``. Every answer carries ``usage``
and ``timings``.

Environment knobs:

FAKE_LLAMA_MODE         ok (default) | exit_during_start | hang_start | crash_after_ready |
                        slow | ignore_sigterm
                        exit_during_start: log a load error and exit FAKE_LLAMA_EXIT_CODE;
                        hang_start: answer 503 forever; crash_after_ready: exit
                        FAKE_LLAMA_EXIT_CODE (default 134) FAKE_LLAMA_CRASH_AFTER s after
                        ready; slow: every chat/embedding answer waits FAKE_LLAMA_DELAY
                        (default 2 s); ignore_sigterm: log SIGTERM and carry on.
FAKE_LLAMA_LOAD_DELAY   seconds of 503 "Loading model" before ready (default 0)
FAKE_LLAMA_EXIT_CODE    exit code for exit_during_start (1; -N: die of signal N) and crash_after_ready (134)
FAKE_LLAMA_CRASH_AFTER  seconds after ready before crash_after_ready exits (default 0.3)
FAKE_LLAMA_EXIT_DELAY   seconds a clean SIGTERM exit takes after the HTTP server has closed
                        (default 0; a real server frees its model meanwhile)
FAKE_LLAMA_DELAY        seconds each chat/embedding request waits before answering
FAKE_LLAMA_CONTENT      fixed chat ``content`` string
FAKE_LLAMA_STREAM_DELAY seconds between the events of a streamed answer (default 0)
FAKE_LLAMA_BEHAVIOUR    JSON file ``{"responses": [{"content": str} | {"status": int,
                        "message": str}, optional "delay": s], ...}`` served in order, the
                        last one repeating
                        An entry may also carry "logprobs": {"<token>": {"<token>": p,
                        "<other token>": p, ...}}: the distribution at each generated token
                        with that text (see FAKE_LLAMA_LOGPROBS)
FAKE_LLAMA_LOGPROBS     ok (default) | none | refuse: with "logprobs": true in the body, ok
                        answers choices[0].logprobs.content (tokens as below; each token's
                        logprob and top_logprobs from the entry's "logprobs" map, else
                        probability 1), none leaves them out, refuse answers 400
FAKE_LLAMA_EMBD_DIM     embedding dimension (default 384)
FAKE_LLAMA_LOG          new (default; the format above) | old ("main: server is listening
                        on http://H:P - starting the main loop", plus an early "HTTP server
                        is listening, hostname: H, port: P" line) | zero (old build that
                        echoes port 0) | none (no listening line at all)
FAKE_LLAMA_HELP         full (default: --help lists --no-webui, --swa-full) | none (an old build without them)
FAKE_LLAMA_STDERR_FLOOD bytes of filler written to stderr while loading (pipe-stall test)
FAKE_LLAMA_SPAWN_LOG    file appended with one JSON line per event: {"event": "start", "pid",
                        "argv", "ld_library_path", "api_key_set"}, {"event": "ready", "pid",
                        "port"}, {"event": "signal", "pid", "signal"}, {"event": "exit",
                        "pid", "code"}
FAKE_LLAMA_CRASH_MID_CALL  always | once:<path> — a chat or embeddings POST makes the
                        process exit 134 after reading the request and before answering (a
                        crash mid-call: the client's connection closes with no answer);
                        once:<path>: only while <path> does not exist (it is created first,
                        so a respawned server answers); the start's grammar canary is answered
FAKE_LLAMA_REQUEST_LOG  file appended with one JSON line per request (POSTs also say how many
                        POSTs were in flight when they arrived, "inflight"): {"method", "path",
                        "status", "headers" (keys redacted: "Bearer ***"), "body" (POST)};
                        written before the answer's first byte, so a client that has its
                        answer finds its request in the log
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import resource
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_T0 = time.monotonic()
_INFLIGHT = [0]  # POSTs being served right now (the handler threads share it)
_INFLIGHT_LOCK = threading.Lock()
_WORD = re.compile(r"\w+|[^\w\s]")


def log(level: str, func: str, message: str) -> None:
    """One stderr line in llama.cpp's format: ``M.SS.mmm.uuu L srv  <func>: <message>``."""
    elapsed = time.monotonic() - _T0
    minutes, seconds = divmod(elapsed, 60)
    micros = int((seconds % 1) * 1_000_000)
    stamp = f"{int(minutes)}.{int(seconds):02d}.{micros // 1000:03d}.{micros % 1000:03d}"
    sys.stderr.write(f"{stamp} {level} srv  {func:>12.12}: {message}\n")
    sys.stderr.flush()


def event(kind: str, **fields: Any) -> None:
    path = os.environ.get("FAKE_LLAMA_SPAWN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": kind, "pid": os.getpid(), **fields}) + "\n")


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


# -- argv -------------------------------------------------------------------------------
_VALUE_FLAGS = {
    "-m": "model",
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "-np": "parallel",
    "--parallel": "parallel",
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-t": "threads",
    "--threads": "threads",
    "--pooling": "pooling",
    "--api-key": "api_key",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "-b": "batch",
    "--batch-size": "batch",
    "-a": "alias",
    "--alias": "alias",
}
_BOOL_FLAGS = {
    "--no-webui": "no_ui",
    "--no-ui": "no_ui",
    "--embedding": "embeddings",
    "--embeddings": "embeddings",
    "--swa-full": "swa_full",
}

HELP = """usage: llama-server [options]
-m,    --model FNAME                    model path to load
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-c,    --ctx-size N                     size of the prompt context (default: 0)
-t,    --threads N                      number of CPU threads to use during generation
--embedding, --embeddings               restrict to only support embedding use case
--api-key KEY                           API key to use for authentication
"""
#: what a newer build's --help adds (FAKE_LLAMA_HELP=none: an old build without these)
HELP_UI = (
    "--ui,  --webui, --no-ui, --no-webui     whether to enable the Web UI (default: enabled)\n"
    "--swa-full                              use full-size SWA cache (default: false)\n"
)


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "model": None,
        "host": "127.0.0.1",
        "port": "8080",
        "parallel": "4",
        "ctx": "0",
        "threads": None,
        "pooling": None,
        "api_key": None,
        "ubatch": "512",
        "batch": "2048",
        "alias": None,
        "no_ui": False,
        "embeddings": False,
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            opts["help"] = True
        elif arg in _VALUE_FLAGS and i + 1 < len(argv):
            opts[_VALUE_FLAGS[arg]] = argv[i + 1]
            i += 1
        elif arg in _BOOL_FLAGS:
            opts[_BOOL_FLAGS[arg]] = True
        elif arg.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            i += 1  # an unknown flag with a value
        i += 1
    return opts


# -- behaviour ---------------------------------------------------------------------------
#: ids 0 to N_VOCAB - 1 (``tokens`` gives 1 to 32000)
N_VOCAB = 32001


def tokens(text: str) -> list[int]:
    return [(fnv1a(w.encode()) % (N_VOCAB - 1)) + 1 for w in _WORD.findall(text)]


def fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def embed(text: str, dim: int) -> list[float]:
    """FNV-1a seed, 64-bit LCG components, L2-normalised (zero norm -> e0)."""
    s = fnv1a(text.encode("utf-8"))
    out = []
    for _ in range(dim):
        s = (s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        hi = s >> 32
        out.append((hi - (1 << 32) if hi >= 1 << 31 else hi) / 2**31)
    norm = math.sqrt(sum(x * x for x in out))
    if norm == 0:
        return [1.0] + [0.0] * (dim - 1)
    return [x / norm for x in out]


def instance(schema: Any, root: Any) -> Any:
    """The smallest value satisfying the common structural parts of ``schema``."""
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return instance(target, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance(schema[key][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(sub, root) for name, sub in props.items()}
    if kind == "array":
        if "prefixItems" in schema:
            return [instance(sub, root) for sub in schema["prefixItems"]]
        count = int(schema.get("minItems", 1 if "items" in schema else 0))
        return [instance(schema.get("items", {}), root) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + (1 if "exclusiveMinimum" in schema else 0))
        high = schema.get("maximum")
        value = max(low, 0) if high is None else min(max(low, 0), high)
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    fmt = {
        "date": "2024-01-01",
        "time": "12:00:00",
        "date-time": "2024-01-01T12:00:00Z",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }.get(schema.get("format", ""))
    if fmt:
        return fmt
    length = max(int(schema.get("minLength", 1)), 1)
    if "maxLength" in schema:
        length = min(length, int(schema["maxLength"]))
    return "x" * length


def token_logprobs(content: str, table: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    """``logprobs.content`` in llama-server's shape: pieces are \\w+ runs and single other characters."""
    top_n = int(body.get("top_logprobs", 20))

    def entry(text: str, prob: float) -> dict[str, Any]:
        data = text.encode("utf-8")
        return {"id": fnv1a(data) % 32000, "token": text, "bytes": list(data), "logprob": math.log(prob)}

    out = []
    for piece in re.findall(r"\w+|\W", content, re.UNICODE):
        dist = table.get(piece) or {piece: 1.0}
        ranked = sorted(dist.items(), key=lambda kv: -float(kv[1]))
        own = float(dist.get(piece, 1.0))
        out.append({**entry(piece, own), "top_logprobs": [entry(t, float(p)) for t, p in ranked[:top_n]]})
    return out


class Behaviour:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index = 0
        path = os.environ.get("FAKE_LLAMA_BEHAVIOUR")
        self.responses: list[dict[str, Any]] = []
        if path:
            with open(path, encoding="utf-8") as fh:
                self.responses = list(json.load(fh).get("responses", []))

    def next(self) -> dict[str, Any] | None:
        if not self.responses:
            return None
        with self.lock:
            item = self.responses[min(self.index, len(self.responses) - 1)]
            self.index += 1
        return item


def crash_mid_call(path: str, body: Any) -> None:
    """FAKE_LLAMA_CRASH_MID_CALL: die with this chat/embeddings request unanswered."""
    how = os.environ.get("FAKE_LLAMA_CRASH_MID_CALL", "")
    if not how or path not in ("/v1/chat/completions", "/chat/completions", "/v1/embeddings", "/embeddings"):
        return
    if (
        isinstance(body, dict)
        and "grammar" in body
        and body.get("messages") == [{"role": "user", "content": "Say OK."}]
    ):
        return  # the start's grammar canary (managed.server.CANARY_BODY) is answered
    if how.startswith("once:"):
        try:
            os.close(os.open(how[len("once:") :], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    sys.stderr.write("fake: simulated crash mid-call (GGML_ASSERT failed)\n")
    sys.stderr.flush()
    event("exit", code=134)
    os._exit(134)


# -- server ------------------------------------------------------------------------------
class State:
    def __init__(self, opts: dict[str, Any]) -> None:
        self.opts = opts
        self.ready = threading.Event()
        self.api_key: str | None = opts["api_key"] or os.environ.get("LLAMA_API_KEY") or None
        self.behaviour = Behaviour()
        self.mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
        default_delay = 2.0 if self.mode == "slow" else 0.0
        self.delay = env_float("FAKE_LLAMA_DELAY", default_delay)
        self.parallel = max(int(opts["parallel"]), 1)
        self.ctx = int(opts["ctx"]) or 8192
        self.model_id = opts["alias"] or opts["model"]
        self.dim = int(env_float("FAKE_LLAMA_EMBD_DIM", 384))
        self.ubatch = int(opts["ubatch"])


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-llama-server"
    protocol_version = "HTTP/1.1"
    state: State  # set on the subclass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the real server logs requests only at higher verbosity

    status = 0  # of the last answer, for the request log
    unlogged: tuple[str, str, Any] | None = None  # (method, path, body) until its answer starts

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        self.log_request_once()  # before the client can read a byte of the answer
        super().send_response(code, message)

    def log_request_once(self) -> None:
        if self.unlogged is not None:
            self.record(*self.unlogged)
            self.unlogged = None

    def send_json(self, status: int, payload: Any) -> None:
        self.status = status
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status: int, message: str, kind: str) -> None:
        self.send_json(status, {"error": {"code": status, "message": message, "type": kind}})

    def gate(self, path: str) -> bool:
        """503 while loading, 401 without the key; True when the request may proceed."""
        if not self.state.ready.is_set():
            self.error(503, "Loading model", "unavailable_error")
            return False
        if path in ("/health", "/v1/health") or self.state.api_key is None:
            return True
        header = self.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else self.headers.get("X-Api-Key", "")
        if given != self.state.api_key:
            log("W", "operator()", "unauthorized: Invalid API Key")
            self.error(401, "Invalid API Key", "authentication_error")
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.unlogged = ("GET", path, None)
        try:
            self.get(path)
        finally:
            self.log_request_once()  # if it was never answered

    def get(self, path: str) -> None:
        if not self.gate(path):
            return
        st = self.state
        if path in ("/health", "/v1/health"):
            self.send_json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            meta = {"n_vocab": N_VOCAB, "n_ctx": st.ctx // st.parallel, "n_ctx_train": 8192, "n_embd": st.dim}
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": st.model_id, "object": "model", "created": 0, "owned_by": "llamacpp", "meta": meta}
                    ],
                },
            )
        elif path == "/props":
            self.send_json(
                200,
                {
                    "total_slots": st.parallel,
                    "model_path": st.opts["model"],
                    "build_info": "b0-fake",
                    "default_generation_settings": {"n_ctx": st.ctx // st.parallel},
                    "chat_template": "{{ messages }}",
                    "modalities": {"vision": False, "audio": False},
                },
            )
        else:
            self.error(404, "File Not Found", "not_found_error")

    def read_body(self) -> Any:
        length = int(self.headers.get("Content-Length", "0") or 0)
        raw = self.rfile.read(length) if length else b""
        try:  # like llama-server's parser: UTF-8 only (no byte-order mark, no UTF-16/32)
            return json.loads((raw or b"{}").decode("utf-8"))
        except ValueError:
            return None

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self.read_body()
        crash_mid_call(path, body)
        with _INFLIGHT_LOCK:
            _INFLIGHT[0] += 1
            self.inflight = _INFLIGHT[0]  # POSTs being served when this one arrived, itself included
        self.unlogged = ("POST", path, body)
        try:
            self.post(path, body)
        finally:
            with _INFLIGHT_LOCK:
                _INFLIGHT[0] -= 1
            self.log_request_once()  # if it was never answered

    def record(self, method: str, path: str, body: Any) -> None:
        log_path = os.environ.get("FAKE_LLAMA_REQUEST_LOG")
        if not log_path:
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        if "authorization" in headers:
            headers["authorization"] = headers["authorization"].split(" ", 1)[0] + " ***"
        if "x-api-key" in headers:
            headers["x-api-key"] = "***"
        entry = {"method": method, "path": path, "status": self.status, "headers": headers, "body": body}
        if method == "POST":
            entry["inflight"] = self.inflight
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def post(self, path: str, body: Any) -> None:
        if not self.gate(path):
            return
        if not isinstance(body, dict):
            self.error(400, "invalid JSON body", "invalid_request_error")
            return
        if path in ("/v1/chat/completions", "/chat/completions"):
            self.chat(body)
        elif path == "/v1/completions":
            self.completions(body)
        elif path in ("/v1/embeddings", "/embeddings"):
            self.embeddings(body)
        elif path == "/tokenize":
            self.send_json(200, {"tokens": tokens(str(body.get("content", "")))})
        elif path == "/detokenize":
            self.detokenize(body.get("tokens", []))
        else:
            self.error(404, "File Not Found", "not_found_error")

    def detokenize(self, ids: list[int]) -> None:
        """``<id>`` per token; an id outside the vocabulary is the real server's 500."""
        outside = next((t for t in ids if t >= N_VOCAB), None)
        if outside is not None:
            message = f"vector::_M_range_check: __n (which is {outside}) >= this->size() (which is {N_VOCAB})"
            self.error(500, message, "server_error")
            return
        self.send_json(200, {"content": "".join(f"<{t}>" for t in ids)})

    def chat(self, body: dict[str, Any]) -> None:
        st = self.state
        if st.opts["embeddings"]:
            self.error(
                501, "This server does not support completions. Start it without `--embeddings`", "not_supported_error"
            )
            return
        item = st.behaviour.next() or {}
        delay = float(item.get("delay", st.delay))
        if delay:
            time.sleep(delay)
        if "status" in item and int(item["status"]) != 200:
            self.error(int(item["status"]), str(item.get("message", "fake error")), "server_error")
            return
        if "content" in item:
            content = str(item["content"])
        elif "FAKE_LLAMA_CONTENT" in os.environ:
            content = os.environ["FAKE_LLAMA_CONTENT"]
        elif isinstance(body.get("grammar"), str):
            # like llama-server: an unparsable grammar is a 400; else the grammar's first walk
            from localllm.grammar.walk import Grammar, GrammarSyntaxError

            try:
                content = Grammar.parse(body["grammar"]).first()
            except GrammarSyntaxError as exc:
                self.error(400, f"failed to parse grammar: {exc}", "invalid_request_error")
                return
        else:
            rf = body.get("response_format") or {}
            schema = (rf.get("json_schema") or {}).get("schema") if isinstance(rf, dict) else None
            if isinstance(schema, dict) and rf.get("type") == "json_schema":
                content = json.dumps(instance(schema, schema))
            else:
                content = "Hello from the fake llama-server."
        logprobs_mode = os.environ.get("FAKE_LLAMA_LOGPROBS", "ok")
        if body.get("logprobs") and logprobs_mode == "refuse":
            self.error(400, "logprobs is not supported", "invalid_request_error")
            return
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        n_prompt, n_out = len(tokens(prompt)), max(len(tokens(content)), 1)
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": content},
        }
        if body.get("logprobs") and logprobs_mode == "ok":
            choice["logprobs"] = {"content": token_logprobs(content, item.get("logprobs") or {}, body)}
        if body.get("stream"):
            self.stream(body, content, n_prompt, n_out)
            return
        self.send_json(
            200,
            {
                "id": f"chatcmpl-fake-{os.getpid()}-{st.behaviour.index}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or st.model_id,
                "system_fingerprint": "b0-fake",
                "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
                "timings": {
                    "cache_n": 0,
                    "prompt_n": n_prompt,
                    "prompt_ms": 1.0,
                    "prompt_per_token_ms": 1.0 / max(n_prompt, 1),
                    "prompt_per_second": 1000.0 * n_prompt,
                    "predicted_n": n_out,
                    "predicted_ms": 2.0 * n_out,
                    "predicted_per_token_ms": 2.0,
                    "predicted_per_second": 500.0,
                },
            },
        )

    def completions(self, body: dict[str, Any]) -> None:
        """OpenAI's text completions as this llama-server answers them: one task per prompt and
        per ``n`` (indexed in that order), ``echo``/``best_of``/``suffix`` not read, logprobs
        (``n_probs``, else ``logprobs``) in its chat shape, a stream of ``text`` deltas."""
        st = self.state
        item = st.behaviour.next() or {}
        if "status" in item and int(item["status"]) != 200:
            self.error(int(item["status"]), str(item.get("message", "fake error")), "server_error")
            return
        prompt = body.get("prompt")
        if prompt is None:
            self.error(500, '"prompt" is required', "server_error")
            return
        single = isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))
        prompts = [prompt] if single else list(prompt)
        content = str(item.get("content", os.environ.get("FAKE_LLAMA_CONTENT", " Hello from the fake llama-server.")))
        n = int(body.get("n", 1))
        n_probs = int(body.get("n_probs", body.get("logprobs", 0)) or 0)
        n_prompt = sum(len(p) if isinstance(p, list) else len(tokens(p)) for p in prompts)
        n_out = max(len(tokens(content)), 1)
        if body.get("stream"):
            self.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": st.model_id}

            def send(payload: str) -> None:
                data = f"data: {payload}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            if not single:
                send("null")  # the pinned llama-server starts a batch's stream with this event
            for index in range(len(prompts) * n):
                for piece in re.findall(r"\s*\S+", content) or [content]:
                    probs = {"content": token_logprobs(piece, {}, {"top_logprobs": n_probs})} if n_probs else None
                    choice = {"text": piece, "index": index, "logprobs": probs, "finish_reason": None}
                    send(json.dumps({**base, "choices": [choice]}))
                done = {"text": "", "index": index, "logprobs": None, "finish_reason": "stop"}
                send(json.dumps({**base, "choices": [done]}))
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):  # any other value: not read
                usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
                send(json.dumps({**base, "choices": [], "usage": usage}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return
        choices = []
        for index in range(len(prompts) * n):
            logprobs = {"content": token_logprobs(content, item.get("logprobs") or {}, {"top_logprobs": n_probs})}
            choices.append(
                {"text": content, "index": index, "logprobs": logprobs if n_probs else None, "finish_reason": "stop"}
            )
        self.send_json(
            200,
            {
                "choices": choices,
                "created": int(time.time()),
                "model": st.model_id,
                "system_fingerprint": "b0-fake",
                "object": "text_completion",
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
                "id": "cmpl-fake",
                "timings": {"prompt_n": n_prompt, "predicted_n": n_out},
            },
        )

    def stream(self, body: dict[str, Any], content: str, n_prompt: int, n_out: int) -> None:
        """Server-sent events like llama-server's: a role delta, one delta per token, a final
        chunk with finish_reason and timings (and usage), then ``data: [DONE]``."""
        self.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {
            "id": f"chatcmpl-fake-{os.getpid()}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model") or self.state.model_id,
        }

        def send(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        pieces = re.findall(r"\s*\S+", content) or [content]
        send(
            json.dumps(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
                }
            )
        )
        pause = env_float("FAKE_LLAMA_STREAM_DELAY", 0.0)
        for piece in pieces:
            send(json.dumps({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
            time.sleep(pause)
        final = {
            **base,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "timings": {"prompt_n": n_prompt, "predicted_n": n_out},
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            final["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        send(json.dumps(final))
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def embeddings(self, body: dict[str, Any]) -> None:
        st = self.state
        if not st.opts["embeddings"]:
            self.error(
                501, "This server does not support embeddings. Start it with `--embeddings`", "not_supported_error"
            )
            return
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not inputs:
            self.error(400, '"input" must be a non-empty string or array', "invalid_request_error")
            return
        if st.delay:
            time.sleep(st.delay)
        data, total = [], 0
        for index, item in enumerate(inputs):
            text = item if isinstance(item, str) else json.dumps(item)
            n = len(item) if isinstance(item, list) else len(tokens(text))
            if n > st.ubatch:
                self.error(
                    500,
                    f"input ({n} tokens) is too large to process. increase the physical "
                    f"batch size (current batch size: {st.ubatch})",
                    "server_error",
                )
                return
            total += n
            vector = embed(text, st.dim)
            value: Any = vector
            if body.get("encoding_format") == "base64":
                value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": value})
        self.send_json(
            200,
            {
                "object": "list",
                "model": body.get("model") or st.model_id,
                "data": data,
                "usage": {"prompt_tokens": total, "total_tokens": total},
            },
        )


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts.get("help"):
        sys.stdout.write(HELP + (HELP_UI if os.environ.get("FAKE_LLAMA_HELP", "full") == "full" else ""))
        return 0
    event(
        "start",
        argv=argv,
        ld_library_path=os.environ.get("LD_LIBRARY_PATH", ""),
        api_key_set=bool(opts["api_key"] or os.environ.get("LLAMA_API_KEY")),
    )
    state = State(opts)
    log_style = os.environ.get("FAKE_LLAMA_LOG", "new")
    host, port = opts["host"], int(opts["port"])

    loading = threading.Event()
    loading.set()
    terms = [0]

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        event("signal", signal=name)
        if state.mode == "ignore_sigterm":
            log("W", "signal", f"received {name}, ignoring it (wedged)")
            return
        if loading.is_set():
            # Like the real server during a load: die of the signal at once.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        terms[0] += 1
        if terms[0] > 1:
            os._exit(1)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    log("I", "main", f"build: 0 (fake) with python {sys.version.split()[0]}")
    log("I", "main", f"system info: n_threads = {opts['threads'] or os.cpu_count()}, parallel = {state.parallel}")
    handler = type("BoundHandler", (Handler,), {"state": state})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError:
        log("E", "start", f"couldn't bind HTTP server socket, hostname: {host}, port: {port}")
        log("E", "llama_server", "exiting due to HTTP server error")
        event("exit", code=1)
        return 1
    server.daemon_threads = True
    bound = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    if log_style in ("old", "zero"):
        shown = 0 if log_style == "zero" else bound
        log("I", "main", f"HTTP server is listening, hostname: {host}, port: {shown}, http threads: 3")
    log("I", "load_model", f"loading model '{opts['model']}'")

    flood = int(env_float("FAKE_LLAMA_STDERR_FLOOD", 0))
    line = "llama_model_loader: - kv filler " + "x" * 90 + "\n"
    while flood > 0:
        sys.stderr.write(line)
        flood -= len(line)
    sys.stderr.flush()

    if state.mode == "hang_start":
        while True:
            time.sleep(3600)
    time.sleep(env_float("FAKE_LLAMA_LOAD_DELAY", 0.0))
    if state.mode == "exit_during_start" or not (opts["model"] and os.path.exists(opts["model"])):
        log("E", "load_model", f"failed to load model '{opts['model']}'")
        log("E", "llama_server", "exiting due to model loading error")
        code = int(env_float("FAKE_LLAMA_EXIT_CODE", 1))
        event("exit", code=code)
        if code < 0:  # die of that signal, as a server built for another CPU dies of SIGILL
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        return code
    if opts["embeddings"] and state.ubatch % state.parallel:
        sys.stderr.write("GGML_ASSERT(n_ubatch % n_seq == 0) failed\n")
        sys.stderr.flush()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.abort()

    state.ready.set()
    loading.clear()
    log("I", "llama_server", "model loaded")
    if log_style == "new":
        log("I", "llama_server", f"listening on http://{host}:{bound}")
    elif log_style == "old":
        log("I", "main", f"server is listening on http://{host}:{bound} - starting the main loop")
    event("ready", port=bound)

    if state.mode == "crash_after_ready":
        time.sleep(env_float("FAKE_LLAMA_CRASH_AFTER", 0.3))
        sys.stderr.write("fake: simulated crash (GGML_ASSERT failed)\n")
        sys.stderr.flush()
        code = int(env_float("FAKE_LLAMA_EXIT_CODE", 134))
        event("exit", code=code)
        os._exit(code)

    # serve_forever runs in a thread; the main thread waits here so signal handlers run.
    while not terms[0]:
        time.sleep(0.05)
    server.server_close()
    log("I", "operator()", "cleaning up before exit...")
    time.sleep(env_float("FAKE_LLAMA_EXIT_DELAY", 0.0))
    event("exit", code=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
