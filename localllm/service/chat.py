"""The OpenAI chat surface localllm guarantees: validated requests, compiled structured output, tool calls.

:func:`prepare` turns a client's ``/v1/chat/completions`` body into the body sent to
llama-server, or raises :class:`BadRequest` (400, OpenAI's error shape):

* **Checks and caps**: known roles only; text content parts only; a message ``name`` is a string;
  numbers finite (integers too) and in OpenAI's ranges; ``logit_bias`` entries llama-server reads;
  ``max_tokens`` defaults to, and is capped at, the service's ceiling; ``n_predict`` is
  folded into ``max_tokens``; ``n``, ``n_probs`` and ``top_logprobs`` are clamped; the
  model's pinned stop strings are added; ``keep_alive`` is taken out (the pool applies it).
* **Structured output**: a ``response_format`` ``json_schema`` is compiled with
  localllm's own compiler (:func:`localllm.grammar.compile_schema`) and sent as
  ``grammar`` (``compiled``). When it cannot be expressed exactly, ``strict: true`` is a
  400 naming the refusal (path + construct); otherwise llama.cpp's converter gets the
  schema (``converter``), and its failing on it is a 400 too (:func:`converter_failure`).
  llama.cpp's top-level ``json_schema`` field is taken as a ``response_format``. Every
  answer is validated against the schema.
* **Tool calls on any model**: the tool list is rendered into the prompt and the answer
  is constrained by a compiled grammar admitting exactly the calls (each tool's
  ``parameters`` schema), or with ``tool_choice: auto`` either calls or a reply. The
  model writes ``{"tool_calls": [{"name": …, "arguments": {…}}]}`` or ``{"content": …}``;
  :func:`finish` turns that into OpenAI's ``tool_calls`` (ids, ``finish_reason:
  "tool_calls"``) after validating every call's arguments.

:func:`finish` post-processes llama-server's answer (validation, tool calls, the served
model id); :func:`sse_events` renders a finished answer as a stream (structured and tool
requests are generated whole and validated before the first byte is sent).
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from localllm.managed.vocab import MAX_TOKENIZE_BYTES

__all__ = [
    "INTERNAL_FIELDS",
    "MAX_CONTENT_PARTS",
    "MAX_EMBEDDING_INPUTS",
    "MAX_LOGIT_BIAS",
    "MAX_MESSAGES",
    "MAX_PRESERVED_TOKENS",
    "MAX_TOKEN_IDS",
    "ROLES",
    "BadRequest",
    "ChatLimits",
    "Invalid",
    "Prepared",
    "bias_token_ids",
    "cap_costs",
    "check_embeddings",
    "check_grammar",
    "check_items",
    "check_numbers",
    "check_tokens",
    "converter_failure",
    "dimensions_refusal",
    "ended_failure",
    "finish",
    "loads",
    "merge_stops",
    "prepare",
    "prompt_parts",
    "sse_events",
    "token_ids",
    "token_refusal",
    "vocab_refusal",
    "vocab_size",
]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: tool calls one answer may hold when ``parallel_tool_calls`` is allowed
MAX_PARALLEL_CALLS = 8

# (field, low, high, integer?) — OpenAI's documented ranges (llama-server's extras sensibly)
_RANGES: tuple[tuple[str, float, float, bool], ...] = (
    ("temperature", 0.0, 2.0, False),
    ("top_p", 0.0, 1.0, False),
    ("min_p", 0.0, 1.0, False),
    ("typical_p", 0.0, 1.0, False),
    ("top_k", 0, 1000, True),
    ("frequency_penalty", -2.0, 2.0, False),
    ("presence_penalty", -2.0, 2.0, False),
    ("repeat_penalty", 0.0, 10.0, False),  # above 0 (_ABOVE_LOW): llama-server divides by it
    # the pinned llama-server's own floor is 0 for both (-1 was its 400 without param)
    ("repeat_last_n", 0, 1 << 20, True),
    # llama.cpp's DRY sampler keeps a window of this many tokens per slot: 10^9 took 8 GB of the
    # pinned server's memory, kept after the request; 2^31 - 1 past 9 GB
    ("dry_penalty_last_n", 0, 1 << 20, True),
    ("seed", -(1 << 63), (1 << 64) - 1, True),
    ("max_tokens", 1, 1 << 31, True),
    ("max_completion_tokens", 1, 1 << 31, True),
    ("n_predict", -1, 1 << 31, True),
    ("n", 1, 128, True),
    ("n_cmpl", 1, 128, True),
    ("n_probs", 0, 1 << 31, True),
    ("top_logprobs", 0, 1 << 31, True),
)
#: the ranges whose low end is out (the pinned llama-server's 400 without param for it)
_ABOVE_LOW = frozenset({"repeat_penalty"})


#: llama.cpp's DRY sampler matches each of a request's ``dry_sequence_breakers`` against the
#: whole vocabulary when the request starts, the server's other slots waiting: on the pinned
#: server 0.05-0.25 s a breaker (1,000 short ones: past 60 s); its own default has 4
MAX_BREAKERS = 8
MAX_BREAKER_CHARS = 32


#: the messages of one request (Azure OpenAI's limit): the template renders each with its role
#: markers, which llama.cpp's tokenizer splits at (pieces.py): 40,000 empty messages (1.1 MB)
#: held the pinned server 51 s before its "exceeds the context" 400
MAX_MESSAGES = 2048
#: the content parts of one request's messages: llama-server joins a message's text parts with
#: a newline (a special token llama.cpp's tokenizer splits at), so each part may be pieces more
#: than its text alone, which pieces.py counts: 48,000 parts of ``"a"`` (1.5 MB, within the
#: context by their bytes) held the pinned server 11.8 s before its "exceeds the context" 400
MAX_CONTENT_PARTS = 2048
#: llama-server's ``chat_template_kwargs``: switches, not content (see _check_template_kwargs)
MAX_TEMPLATE_KWARGS = 16
MAX_TEMPLATE_KWARG_CHARS = 256
#: OpenAI's ``reasoning_effort`` values (llama.cpp renders the value in templates that read it)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: the variables llama.cpp gives a chat template, which a ``chat_template_kwargs`` entry would replace
TEMPLATE_INPUTS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
#: the fields llama-server's chat layer sets from the template for its sampler and parser,
#: which it takes from a request too where it set none (/v1/completions): ``chat_parser`` is a
#: PEG parser whose rules name each other by index, unchecked, so 100 bytes of a rule naming
#: itself overflowed the pinned server's stack (every model and request on it gone) and one
#: naming a rule past the list read out of bounds; the tags, prompt and message delimiters are
#: tokenized (pieces.py: one delimiter of 120 KB of ``"a\n"`` held the pinned server 7.6 s);
#: ``grammar_type: "tool_calls"`` feeds the template's generation prompt to a client's grammar
INTERNAL_FIELDS = (
    "chat_parser",
    "chat_format",
    "generation_prompt",
    "grammar_type",
    "message_delimiters",
    "reasoning_budget_start_tag",
    "reasoning_budget_end_tags",
    "reasoning_budget_end_tag",
)
#: a lazy grammar's triggers (llama-server's ``grammar_triggers``): words only. Its other
#: types crashed or stalled the pinned server: a pattern (2, 3) is matched against the text
#: generated so far with std::regex at every token, on the loop every slot shares (``(a*)*b``
#: over 30 forced ``a`` tokens: past 60 s, its other slots waiting); a type it does not know
#: (7) took the server down; a token trigger (0) is a word of one token, which it makes of
#: a word itself
TRIGGER_WORD = 1
MAX_TRIGGERS = 16
#: ``logit_bias`` entries (OpenAI takes 300): llama-server applies each at every token and
#: tokenizes each text: a million tiny texts held it 24 s, a million ids 15 ns a token each
MAX_LOGIT_BIAS = 4096
#: ``preserved_tokens`` (each a token's text: a template sets a handful): llama-server tokenizes
#: each; a million of ``"ab"`` held it 37 s
MAX_PRESERVED_TOKENS = 64
#: llama-server's samplers, in the order of their letters (``samplers: "dkypsmtxiea"``)
_SAMPLERS = (
    "dry",
    "top_k",
    "typ_p",
    "top_p",
    "top_n_sigma",
    "min_p",
    "temperature",
    "xtc",
    "infill",
    "penalties",
    "adaptive_p",
)
_SAMPLER_LETTERS = dict(zip("dkypsmtxiea", _SAMPLERS, strict=True))
#: each name llama-server reads in ``samplers`` → its sampler
_SAMPLER_NAMES = {
    **{alias: n for n in _SAMPLERS for alias in (n, n.replace("_", "-"), n.replace("_", ""))},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typ_p",
}
#: the inputs of one embeddings request (OpenAI's limit): llama-server embeds each as a task
#: of its own and writes every vector into one answer; 40,000 one-letter inputs (160 KB) held
#: the pinned server 100 s and 1.2 GB for a 309 MB answer, and the 16 MiB a body may be would
#: take hours and past 100 GB
MAX_EMBEDDING_INPUTS = 2048
#: the token ids (and texts) of one request's prompts, inputs or ``/tokenize`` ``content``, and
#: of one ``/detokenize`` (see check_items): llama-server builds a ``/detokenize`` answer whole
#: (2 million of gemma-3's longest token, 48 bytes: a 92 MB text, 540 MB at the peak); 262,144:
#: 0.2 s, 60 MB
MAX_TOKEN_IDS = 1 << 18


class BadRequest(Exception):
    """A 400 in OpenAI's shape: the message, the offending parameter and a code."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": self.code}
        }


class Invalid(Exception):
    """An answer that breaks a strict guarantee (schema or tool arguments): never a 200."""


@dataclass(frozen=True)
class ChatLimits:
    """The service's ceilings (``localllm serve`` flags)."""

    max_tokens: int = 1024
    max_n: int = 4
    max_logprobs: int = 20


#: a request's schemas together (response_format, json_schema, tools), as JSON: checking and
#: compiling them takes time in proportion (500 tools of 200 properties, 2.8 MB: 45 s), so
#: no request may make the service spend more than a second or two on them. The schemas
#: of the corpora here are 12 KiB at most.
MAX_SCHEMA_BYTES = 256 << 10
#: the functions a request may offer: the answer's grammar alternates between them, and the
#: compiler keeps at most 64 alternatives in one place (OpenAI allows 128)
MAX_TOOLS = 64
#: the body keys that hold schemas
SCHEMA_KEYS = ("response_format", "json_schema", "tools", "functions")

#: objects are generated closed, as builtin.local_llm does by default (``open_objects: false``):
#: with extension keys admitted, gemma-3-270m wrote extra keys until max_tokens in 12 of 48
#: answers. Closed objects are valid instances of an open schema; answers are validated as sent.
OPEN_OBJECTS = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def _finite_int(text: str) -> int:
    value = int(text)
    try:
        float(value)
    except OverflowError:
        # llama-server's parser reads such an integer as a double and fails with a 500
        raise ValueError(f"the integer {text[:20]}... ({len(text)} digits) is out of range for a number") from None
    return value


def loads(raw: bytes) -> Any:
    """Strict JSON: NaN/Infinity and numbers (integers too) that overflow a double are errors (ValueError).

    UTF-8 only, as JSON between systems must be: ``json.loads`` would also read UTF-16 and
    UTF-32, which llama-server cannot, and a lone surrogate in them would pass
    :func:`check_text`, which looks for its UTF-8 forms. ``surrogatepass``: a
    surrogate written in UTF-8 is left for :func:`check_text` to name.
    """
    text = raw.decode("utf-8", "surrogatepass")  # UTF-16/32 holds NULs: not JSON as UTF-8 text
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_finite_int)


# -------------------------------------------------------------------------- request


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    description: str
    strict: bool
    #: what the grammar holds the arguments to: the parameters when they compile exactly, else
    #: the parameters relaxed (localllm.grammar.relax), else None (any object); the arguments
    #: are validated against the parameters either way
    held: Any


@dataclass
class Prepared:
    """What to send upstream, and what to do with the answer."""

    body: dict[str, Any]
    model: str
    stream: bool  # the client asked for a stream
    include_usage: bool = False
    structured: str = "none"  # compiled | relaxed | converter | none
    schema: Any = None  # what the content must validate against (json_schema / json_object)
    strict: bool = False
    tools: dict[str, Tool] = field(default_factory=dict)
    tool_mode: str = "none"  # none | auto | required | named
    legacy: bool = False  # asked with OpenAI's deprecated functions/function_call: answered so
    reply_schema: Any = None  # tool_choice auto with a response_format: the reply's schema
    #: the shape a tool-mode answer must have (the grammar's, arguments and a client's reply
    #: schema left to their own checks): a server that ignores grammars is caught by it
    envelope: Any = None
    keep_alive: float | None = None
    notes: list[str] = field(default_factory=list)
    schema_param: str = "response_format.json_schema.schema"  # where the client gave the schema
    stops: list[str] = field(default_factory=list)  # the request's own stop strings
    completion: bool = False  # a legacy /v1/completions request (localllm.service.completion)
    logprobs: int | None = None  # its logprobs, answered in OpenAI's legacy shape
    prompts: list[Any] = field(default_factory=list)  # its prompts (one, or a batch)

    @property
    def buffered(self) -> bool:
        """Generate whole upstream (validated before the first byte) even when the client streams."""
        return self.structured != "none" or self.tool_mode != "none"


def parse_keep_alive(value: Any) -> float:
    """Ollama's ``keep_alive``: seconds (number) or a duration (``5m``); negative keeps it loaded."""
    if isinstance(value, bool) or value is None:
        raise BadRequest("keep_alive must be a number of seconds or a duration such as 5m", "keep_alive")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        from localllm.service.units import parse_duration

        try:
            return parse_duration(value)
        except ValueError as exc:
            raise BadRequest(str(exc), "keep_alive") from None
    raise BadRequest("keep_alive must be a number of seconds or a duration such as 5m", "keep_alive")


#: what llama-server's ``reasoning_format`` takes
_REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def check_numbers(body: dict[str, Any]) -> None:
    """No field of llama-server's own (:data:`INTERNAL_FIELDS`); every number of ``_RANGES``
    finite, of its type and in its range; booleans boolean;
    ``logit_bias`` of a shape llama-server reads; ``dry_sequence_breakers`` bounded;
    llama-server's ``reasoning_format`` one it knows (BadRequest naming the field). A null is
    the default: taken out of ``body``."""
    internal = next((name for name in INTERNAL_FIELDS if name in body), None)
    if internal is not None:
        raise BadRequest(
            f"{internal} is llama-server's own, set from the model's chat template; a request may not send it",
            internal,
        )
    for name, low, high, integer in _RANGES:
        if name not in body:
            continue
        if body[name] is None:  # null is OpenAI's "the default": left to llama-server's own
            del body[name]
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest(f"{name} must be a number, got {value!r}", name)
        if integer and not (isinstance(value, int) or float(value).is_integer()):
            raise BadRequest(f"{name} must be an integer, got {value!r}", name)
        above = name in _ABOVE_LOW
        if not low <= value <= high or (above and value == low):
            span = f"above {low:g} and at most {high:g}" if above else f"between {low:g} and {high:g}"
            raise BadRequest(f"{name} must be {span}, got {value!r}", name)
        if integer:
            body[name] = int(value)
    for name in ("stream", "logprobs", "parallel_tool_calls", "ignore_eos", "continue_final_message"):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise BadRequest(f"{name} must be true or false, got {body[name]!r}", name)
    if "logit_bias" in body:
        _check_logit_bias(body)
    _check_strings(
        body,
        "dry_sequence_breakers",
        MAX_BREAKERS,
        "llama-server matches each against its whole vocabulary",
        MAX_BREAKER_CHARS,
    )
    _check_strings(body, "preserved_tokens", MAX_PRESERVED_TOKENS, "each a token's text, tokenized by llama-server")
    if body.get("samplers") is not None:
        _check_samplers(body["samplers"])
    if "top_logprobs" in body and body.get("logprobs") is not True:  # OpenAI's rule; llama-server's 400 lacks param
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    if "reasoning_format" in body:  # llama-server's own: any other value, null too, is its 500
        given = body["reasoning_format"]
        if given is None:
            del body["reasoning_format"]
        elif given not in _REASONING_FORMATS:
            formats = ", ".join(_REASONING_FORMATS)
            raise BadRequest(f"reasoning_format must be one of {formats}, got {given!r:.40}", "reasoning_format")


def _check_strings(body: dict[str, Any], name: str, most: int, why: str, chars: int | None = None) -> None:
    """``body[name]``, when given, an array of at most ``most`` strings (of at most ``chars``)."""
    given = body.get(name)
    if given is not None and (
        not isinstance(given, list)
        or len(given) > most
        or not all(isinstance(t, str) and (chars is None or len(t) <= chars) for t in given)
    ):
        longest = f" of at most {chars} characters" if chars is not None else ""
        raise BadRequest(f"{name} must be an array of at most {most} strings{longest} ({why})", name)


def _check_samplers(given: Any) -> None:
    """llama-server's ``samplers`` (its chain, in order): a string of their letters or an array
    of their names, each sampler at most once (:data:`_SAMPLER_NAMES`). It builds the chain as
    given, so a sampler named again runs again at every token, on the loop all slots share:
    ``"t" * 10_000`` took the pinned server 1.1 s a token, ``"d" * 100`` (DRY, each matching its
    breakers against the vocabulary) 10 s before the first. Never ``infill`` (/infill's own,
    which compares each pair of candidates: ``"i"`` over gemma-3's 262,144 tokens held the
    pinned server past 590 s for one token)."""
    shape = "samplers must be a string of sampler letters or an array of sampler names"
    if not isinstance(given, (str, list)):
        raise BadRequest(shape, "samplers")
    if len(given) > len(_SAMPLERS):
        raise BadRequest(
            f"samplers names {len(given)} samplers; llama-server has {len(_SAMPLERS)}: {', '.join(_SAMPLERS)}",
            "samplers",
        )
    if not all(isinstance(n, str) and len(n) <= 32 for n in given):
        raise BadRequest(shape, "samplers")
    named = [_SAMPLER_LETTERS.get(n, n) if isinstance(given, str) else _SAMPLER_NAMES.get(n.lower(), n) for n in given]
    again = next((n for i, n in enumerate(named) if n in named[:i]), None)
    if again is not None:
        raise BadRequest(f"samplers may name each sampler once: {again!r:.40} is named again", "samplers")
    if "infill" in named:
        raise BadRequest(
            "samplers may not name infill, the sampler of llama-server's /infill (not served here): it "
            "compares every pair of the candidate tokens, past 590 s a token over a whole vocabulary",
            "samplers",
        )


def _check_logit_bias(body: dict[str, Any]) -> None:
    """``logit_bias`` as llama-server reads it: an object of token id (or, its extension, text)
    → bias, or an array of ``[token, bias]`` pairs; a bias a number from -100 to 100 (OpenAI's
    range) or ``false`` (ban). llama-server skips any other entry without a word."""
    given = body["logit_bias"]
    if given is None:
        del body["logit_bias"]
        return
    if isinstance(given, dict):
        entries = [(f"logit_bias.{key}", value) for key, value in given.items()]
    elif isinstance(given, list):
        entries = []
        for i, pair in enumerate(given):
            token = pair[0] if isinstance(pair, list) and len(pair) == 2 else None
            if isinstance(token, bool) or not isinstance(token, (str, int)):
                raise BadRequest(
                    f"logit_bias[{i}] must be a [token id or text, bias] pair, got {pair!r:.40}", f"logit_bias[{i}]"
                )
            entries.append((f"logit_bias[{i}]", pair[1]))
    else:
        raise BadRequest("logit_bias must be an object of token id → bias", "logit_bias")
    if len(entries) > MAX_LOGIT_BIAS:
        raise BadRequest(f"logit_bias holds {len(entries)} entries; at most {MAX_LOGIT_BIAS}", "logit_bias")
    for param, bias in entries:
        if bias is False:
            continue
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise BadRequest(f"{param} must be a bias from -100 to 100 (or false), got {bias!r:.40}", param)
    negative = next(((param, token) for param, token in bias_token_ids(body) if token < 0), None)
    if negative is not None:
        raise BadRequest(f"{negative[0]} is {negative[1]}, a negative token id", negative[0], "invalid_token")


#: an object key llama-server reads as a token id (``strtol`` taking all of it), not as text
_ID_KEY = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def bias_token_ids(body: dict[str, Any]) -> list[tuple[str, int]]:
    """The token ids of a checked ``logit_bias`` (not its texts), each with its ``param``."""
    given = body.get("logit_bias")
    if isinstance(given, dict):
        return [(f"logit_bias.{key}", int(key)) for key in given if _ID_KEY.fullmatch(key)]
    if isinstance(given, list):
        return [(f"logit_bias[{i}]", pair[0]) for i, pair in enumerate(given) if isinstance(pair[0], int)]
    return []


def token_ids(prepared: Prepared) -> list[tuple[str, int]]:
    """The token ids a request names, each with its ``param``: its ``logit_bias`` ids
    (:func:`bias_token_ids`), then a completions prompt's (``prompt[j]``, in a batch ``prompt[i][j]``)."""
    ids = bias_token_ids(prepared.body)
    given = prepared.body.get("prompt")  # a checked prompt: a string, or a non-empty array
    batch = len(prepared.prompts) > 1 or (isinstance(given, list) and isinstance(given[0], list))
    for i, prompt in enumerate(prepared.prompts):
        if isinstance(prompt, list):
            where = f"prompt[{i}]" if batch else "prompt"
            ids += [(f"{where}[{j}]", token) for j, token in enumerate(prompt)]
    return ids


def token_refusal(ids: list[tuple[str, int]], n_vocab: int | None) -> BadRequest | None:
    """The 400 for a token id (:func:`token_ids`) past the model's vocabulary of ``n_vocab``
    tokens (None: unknown, nothing refused). llama-server skips such a ``logit_bias`` entry
    without a word (and reads an id past 2**31 cut to 32 bits: as another token's), and
    refuses such a prompt id with a 400 that names no ``param``."""
    if n_vocab is None:
        return None
    outside = next(((param, token) for param, token in ids if token >= n_vocab), None)
    if outside is None:
        return None
    param, token = outside
    return BadRequest(
        f"{param} is {token}, not a token id of this model: its vocabulary has {n_vocab} tokens "
        f"(ids 0 to {n_vocab - 1})",
        param,
        "invalid_token",
    )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"messages holds {len(messages)} messages; at most {MAX_MESSAGES} in one request", "messages")
    parts = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or object is unhashable
            raise BadRequest(
                f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}, got {role!r}", f"messages[{i}].role"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content must be a string or an array of parts", f"messages[{i}].content")
        if isinstance(content, list):
            parts += len(content)
            if parts > MAX_CONTENT_PARTS:
                raise BadRequest(
                    f"messages up to messages[{i}] hold {parts} content parts; "
                    f"at most {MAX_CONTENT_PARTS} in one request",
                    f"messages[{i}].content",
                )
            _check_parts(content, f"messages[{i}].content")
        # llama-server reads these as strings and answers any other type with a 500
        for key in ("name", "tool_call_id", "reasoning_content"):
            value = m.get(key)
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"messages[{i}].{key} must be a string, got {value!r:.40}", f"messages[{i}].{key}")
        if m.get("tool_calls") is not None:
            _check_tool_calls(m["tool_calls"], role, f"messages[{i}].tool_calls")
        call = m.get("function_call")  # the deprecated form of one call
        if call is not None and (
            role != "assistant" or not isinstance(call, dict) or not isinstance(call.get("name"), str)
        ):
            raise BadRequest(
                f'messages[{i}].function_call must be an assistant\'s {{"name": …, "arguments": …}}',
                f"messages[{i}].function_call",
            )


def _check_tool_calls(calls: Any, role: str, param: str) -> None:
    """An assistant's earlier calls: an array of ``{"function": {"name": …, "arguments": …}}``."""
    if role != "assistant":
        raise BadRequest(f"{param}: only an assistant message has tool_calls, not a {role} message", param)
    if not isinstance(calls, list):
        raise BadRequest(f"{param} must be an array of tool calls", param)
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise BadRequest(
                f'{param}[{j}].function must be an object {{"name": …, "arguments": …}}', f"{param}[{j}].function"
            )
        if not isinstance(fn.get("name"), str):
            raise BadRequest(f"{param}[{j}].function.name must be a string", f"{param}[{j}].function.name")


#: where a surrogate can enter a parsed body: an escape ``\ud800``–``\udfff``, or the bytes
#: ED A0–BF that ``json.loads`` decodes with ``surrogatepass``
_SURROGATE_SOURCE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _check_template_kwargs(body: dict[str, Any]) -> None:
    """llama-server's ``chat_template_kwargs``: variables set over the template's own, so
    ``messages`` there replaced the checked messages (80 KB of them held the pinned server
    10 s, past every bound here), and a list could be rendered whole. Switches are what
    templates read there (``enable_thinking``): at most :data:`MAX_TEMPLATE_KWARGS` of
    booleans, numbers or short strings, none named like the template's inputs. OpenAI's
    ``reasoning_effort``, which llama.cpp sets as one more variable: one of its values."""
    effort = body.get("reasoning_effort")
    if effort is None:
        body.pop("reasoning_effort", None)
    elif effort not in REASONING_EFFORTS:
        raise BadRequest(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r:.40}", "reasoning_effort"
        )
    given = body.get("chat_template_kwargs")
    if given is None:
        body.pop("chat_template_kwargs", None)
        return
    if not isinstance(given, dict) or len(given) > MAX_TEMPLATE_KWARGS:
        raise BadRequest(
            f"chat_template_kwargs must be an object of at most {MAX_TEMPLATE_KWARGS} switches "
            '(e.g. {"enable_thinking": false})',
            "chat_template_kwargs",
        )
    for key, value in given.items():
        param = f"chat_template_kwargs.{key}"
        if key in TEMPLATE_INPUTS:
            raise BadRequest(f"{param} would replace the template's own {key!r}: send it as the request's", param)
        if not (
            value is None
            or isinstance(value, (bool, int))
            or (isinstance(value, float) and math.isfinite(value))
            or (isinstance(value, str) and len(value) <= MAX_TEMPLATE_KWARG_CHARS)
        ):
            raise BadRequest(
                f"{param} must be a boolean, a number, null or a string of at most {MAX_TEMPLATE_KWARG_CHARS} "
                f"characters, got {value!r:.40}",
                param,
            )


def check_text(data: dict[str, Any], raw: bytes) -> None:
    """Every string of a request body (keys too) must be encodable text: JSON admits a lone
    surrogate escape (``"\\ud800"``), which no UTF-8 can hold and llama-server answers with a 500.
    ``raw`` is the body's bytes: without a surrogate's source in them (nearly every request)
    nothing is walked."""
    if _SURROGATE_SOURCE.search(raw) is None:
        return
    try:  # a pair (an emoji written as two escapes) is text: only a lone one is refused
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, param = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                where = f"{param}.{key}" if param else str(key)
                _check_encodable(key, param or where)
                stack.append((value, where))
        elif isinstance(node, list):
            stack.extend((value, f"{param}[{j}]") for j, value in enumerate(node))
        elif isinstance(node, str):
            _check_encodable(node, param)


def _check_encodable(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"{param} holds a lone surrogate (\\u{ord(text[exc.start]):04x}), which is not text: "
            "send a character as one escape pair or as UTF-8",
            param,
        ) from None


def _check_parts(parts: list[Any], param: str) -> None:
    """Content parts: text only (every served model reads text; llama-server answers others with a 500)."""
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            what = f"a {kind!r} part" if isinstance(kind, str) else "not a typed part"
            raise BadRequest(
                f'{param}[{j}] is {what}: the served models read text only (send {{"type": "text", "text": …}})',
                f"{param}[{j}]",
                "unsupported_content",
            )
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"{param}[{j}].text must be a string", f"{param}[{j}].text")


def check_grammar(body: dict[str, Any]) -> None:
    """A client's own GBNF ``grammar``: bounded before the shared server parses it; a lazy
    grammar's ``grammar_triggers`` words only (:data:`TRIGGER_WORD`)."""
    if body.get("grammar") is not None:
        from localllm.grammar.limits import grammar_problem

        problem = grammar_problem(body["grammar"])
        if problem is not None:
            raise BadRequest(f"grammar {problem}", "grammar", "invalid_grammar")
    triggers = body.get("grammar_triggers")
    if triggers is None:
        body.pop("grammar_triggers", None)
        return
    if not isinstance(triggers, list) or len(triggers) > MAX_TRIGGERS:
        raise BadRequest(f"grammar_triggers must be an array of at most {MAX_TRIGGERS} triggers", "grammar_triggers")
    for i, trigger in enumerate(triggers):
        kind = trigger.get("type") if isinstance(trigger, dict) else None
        value = trigger.get("value") if isinstance(trigger, dict) else None
        if isinstance(kind, bool) or kind != TRIGGER_WORD or not isinstance(value, str) or not value:
            raise BadRequest(
                f'grammar_triggers[{i}] must be a word trigger, {{"type": {TRIGGER_WORD}, "value": "…"}}: '
                "llama-server matches a pattern trigger (types 2, 3) with std::regex, which backtracks "
                "without end, and crashes on a type it does not know",
                f"grammar_triggers[{i}]",
            )


def _check_ends(body: dict[str, Any], param: str) -> None:
    """Nothing that keeps the answer of a grammar the service compiled (``param``: what set
    it) from ending. Its last step is the end-of-generation token, which ``ignore_eos`` makes
    llama-server generate past: the pinned server failed each such request with a 500
    ("Unexpected empty grammar stack") once the answer was done, or ran on to ``max_tokens``.
    A continued message (``continue_final_message``) is the message's text with the grammar's
    value after it: never the schema's. A request's own ``grammar`` may go on without end
    (``root ::= [a-z ]+``), so beside it both pass (see :func:`ended_failure`)."""
    for name, why in _ENDLESS.items():
        if body.get(name) is True:
            raise BadRequest(
                f"{name} cannot be used with {param}: the answer is generated under a grammar that {why}", name
            )


_ENDLESS = {
    "ignore_eos": "ends it with the end-of-generation token, which ignore_eos forbids",
    "continue_final_message": "writes a whole new value after the message it would continue",
}


def cap_costs(body: dict[str, Any], limits: ChatLimits, parallel: int | None, default_max: int | None = None) -> None:
    """The cost caps (numbers checked): one ceiling for ``max_tokens`` (``default_max`` when
    not asked for, else the ceiling too), ``n_predict`` and ``max_completion_tokens`` folded in;
    ``n`` capped at the ceiling and the model's slots (``parallel``), llama-server's own name
    for it folded in (``n_cmpl``, which it reads before ``n``); ``n_probs`` and
    ``top_logprobs`` at theirs."""
    asked = [body[k] for k in ("max_tokens", "max_completion_tokens") if isinstance(body.get(k), int)]
    n_predict = body.pop("n_predict", None)
    if isinstance(n_predict, int) and n_predict >= 0:
        asked.append(n_predict)
    body.pop("max_completion_tokens", None)
    if not asked and default_max is not None:
        asked.append(default_max)
    body["max_tokens"] = min([*asked, limits.max_tokens])
    if "n_cmpl" in body:  # past every cap of n before: 20 prompts × 4 choices where 20 were the most
        body["n"] = body.pop("n_cmpl")
    if "n" in body:  # capped, never refused: llama-server refuses more choices than its slots
        body["n"] = min(body["n"], limits.max_n, parallel or limits.max_n)
    for name in ("n_probs", "top_logprobs"):
        if name in body:
            body[name] = min(body[name], limits.max_logprobs)


def merge_stops(body: dict[str, Any], extra: tuple[str, ...]) -> list[str]:
    """Merge the pin's stop strings into the request's; the request's own, checked."""
    stop = body.get("stop")
    if stop is None:
        given: list[str] = []
    elif isinstance(stop, str):
        given = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        given = list(stop)
    else:
        raise BadRequest("stop must be a string or an array of strings", "stop")
    merged = given + [s for s in extra if s not in given]
    if merged:
        body["stop"] = merged
    return given


def _schema_problem(schema: Any, param: str) -> None:
    from localllm.grammar.compile import schema_problem, unresolvable_ref

    if not isinstance(schema, dict):
        raise BadRequest(f"{param} must be a JSON Schema object", param)
    problem = schema_problem(schema) or unresolvable_ref(schema)
    if problem is not None:
        where, why = problem
        raise BadRequest(f"{param} is not a valid JSON Schema at {where}: {why}", param, "invalid_schema")


def _response_format(rf: Any) -> tuple[str, Any, bool]:
    """(kind, schema, strict) of a ``response_format``; 400 when it is malformed."""
    if not isinstance(rf, dict):
        raise BadRequest("response_format must be an object with a type", "response_format")
    kind = rf.get("type")
    if kind == "text":
        return "text", None, False
    if kind == "json_object":
        # llama.cpp's extension: an optional "schema" beside the type
        schema = rf.get("schema", {"type": "object"})
        _schema_problem(schema, "response_format.schema")
        return "json_object", schema, False
    if kind != "json_schema":
        raise BadRequest(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format.type"
        )
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            'response_format json_schema needs {"json_schema": {"name": …, "schema": {…}}}',
            "response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(
            "response_format.json_schema.name must be a non-empty string", "response_format.json_schema.name"
        )
    strict = spec.get("strict", False)
    if not isinstance(strict, bool):
        raise BadRequest(
            "response_format.json_schema.strict must be true or false", "response_format.json_schema.strict"
        )
    schema = spec.get("schema", {})
    _schema_problem(schema, "response_format.json_schema.schema")
    return "json_schema", schema, strict


def _converter_errors(schema: Any) -> list[Any]:
    """What llama.cpp's converter would not enforce (``check_subset``'s errors)."""
    from localllm.grammar import check_subset

    return [v for v in check_subset(schema) if v.severity == "error"]


def _refuse_runaway(errors: list[Any], compiled: Any, param: str) -> None:
    runaway = next((v for v in errors if v.runaway), None)
    if runaway is not None:
        ours = f" ({compiled.refusals[0].message})" if compiled.refusals else ""
        raise BadRequest(
            f"Invalid schema for {param}: localllm cannot compile it exactly{ours}, and llama.cpp's converter "
            f"must not have it: {runaway.message}",
            param,
            "unsupported_schema",
        )


def _refusal(compiled: Any, param: str) -> BadRequest:
    first = compiled.refusals[0] if compiled.refusals else None
    where = f" at {first.path} [{first.construct}]" if first is not None else ""
    why = f": {first.message}" if first is not None else ""
    if compiled.unsatisfiable:  # no answer could pass: strict or not, no model is asked
        return BadRequest(
            f"Invalid schema for {param}{where}: no value is valid under it{why}. Widen or drop the construct.",
            param,
            "unsatisfiable_schema",
        )
    return BadRequest(
        f"Invalid schema for {param}{where}: localllm cannot enforce it exactly{why}. "
        "Use strict: false to have it validated only, or drop the construct.",
        param,
        "unsupported_schema",
    )


def _check_schema_bytes(body: dict[str, Any]) -> None:
    sizes = {k: len(json.dumps(body[k])) for k in SCHEMA_KEYS if body.get(k) is not None}  # ASCII: bytes
    total = sum(sizes.values())
    if total > MAX_SCHEMA_BYTES:
        raise BadRequest(
            f"the request's schemas (response_format, json_schema and tools together) are {total:,} bytes "
            f"of JSON; at most {MAX_SCHEMA_BYTES:,}",
            max(sizes, key=lambda k: sizes[k]),
            "schema_too_large",
        )


def _tools(raw: Any) -> dict[str, Tool]:
    from localllm.grammar.compile import compile_shared
    from localllm.grammar.relax import relax

    if not isinstance(raw, list) or not raw:
        raise BadRequest("tools must be a non-empty array", "tools")
    if len(raw) > MAX_TOOLS:
        raise BadRequest(f"tools may offer at most {MAX_TOOLS} functions, got {len(raw)}", "tools", "too_many_tools")
    tools: dict[str, Tool] = {}
    for i, item in enumerate(raw):
        fn = item.get("function") if isinstance(item, dict) and item.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise BadRequest(f'tools[{i}] must be {{"type": "function", "function": {{…}}}}', f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise BadRequest(f"tools[{i}].function.name must be a name of 1-64 characters", f"tools[{i}].function.name")
        if name in tools:
            raise BadRequest(f"tools[{i}].function.name {name!r} is given twice", f"tools[{i}].function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        _schema_problem(params, f"tools[{i}].function.parameters")
        strict = fn.get("strict", False)
        if not isinstance(strict, bool):
            raise BadRequest(f"tools[{i}].function.strict must be true or false", f"tools[{i}].function.strict")
        compiled = compile_shared(params, open_objects=OPEN_OBJECTS)
        if compiled.unsatisfiable or (not compiled.exact and strict):
            raise _refusal(compiled, f"tools[{i}].function.parameters")
        relaxed = None if compiled.exact else relax(params, open_objects=OPEN_OBJECTS)
        held = params if compiled.exact else relaxed.schema if relaxed is not None else None
        description = fn.get("description") or ""
        tools[name] = Tool(name, params, str(description), strict, held)
    return tools


def _legacy_functions(body: dict[str, Any]) -> bool:
    """OpenAI's deprecated ``functions``/``function_call``, taken as ``tools``/``tool_choice``
    with one call at most (True when given): llama-server ignores them, which answered a
    forced call with text."""
    functions = body.pop("functions", None)
    choice = body.pop("function_call", None)
    if functions is None:
        if choice is not None:
            raise BadRequest("function_call needs functions", "function_call")
        return False
    if body.get("tools") is not None:
        raise BadRequest("give either tools or functions, not both", "functions")
    if not isinstance(functions, list):
        raise BadRequest("functions must be a non-empty array", "functions")
    body["tools"] = [{"type": "function", "function": f} for f in functions]
    body["tool_choice"] = {"type": "function", "function": choice} if isinstance(choice, dict) else choice
    return True


def _legacy_param(exc: BadRequest) -> BadRequest:
    """``exc`` naming the deprecated fields the client gave, not the tools they became."""
    param = exc.param or ""
    if param == "tools":
        param = "functions"
    elif param.startswith("tools["):
        param = "functions[" + param[len("tools[") :].replace("].function", "]", 1)
    elif param == "tool_choice":
        param = "function_call"
    exc.param = param or exc.param
    return exc


def _tool_choice(choice: Any, tools: dict[str, Tool]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return str(choice), None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise BadRequest(
            'tool_choice must be none, auto, required or {"type": "function", "function": {"name": …}}', "tool_choice"
        )
    if name not in tools:
        raise BadRequest(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return "named", name


def _rebase(schema: Any, at: str) -> Any:
    """``schema`` as it reads placed at the JSON pointer ``at`` of a larger schema: its own
    ``#…`` references (pydantic's ``#/$defs/Model`` for every nested model) made to point
    where its definitions now are, not at the larger schema's root; its ``$id`` dropped, as
    those references are the larger schema's now (a nested ``$id`` would rebase them again)."""
    from localllm.grammar.compile import DATA_KEYWORDS

    def rebased(node: Any) -> Any:
        if isinstance(node, list):
            return [rebased(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
                out[key] = "#" + at + value[1:]
            else:
                out[key] = value if key in DATA_KEYWORDS else rebased(value)
        return out

    if isinstance(schema, dict) and "$id" in schema:
        schema = {k: v for k, v in schema.items() if k != "$id"}
    return rebased(schema)


def _call_schema(tool: Tool, at: str, *, envelope: bool = False) -> dict[str, Any]:
    """One call of ``tool`` (placed at the pointer ``at`` of the answer's schema)."""
    arguments: Any = {"type": "object"} if tool.held is None else _rebase(tool.held, at + "/properties/arguments")
    if envelope and tool.held is not None:
        arguments = {}  # validated against the tool's parameters on their own
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def answer_schema(tools: list[Tool], *, parallel: bool, reply: Any | None, envelope: bool = False) -> dict[str, Any]:
    """The JSON the model writes: calls (one, or up to MAX_PARALLEL_CALLS), or (reply given) a reply.

    ``envelope``: the same shape with each exact tool's arguments admitting any value, for
    validating an answer whose arguments are checked against their tool on their own.
    """
    items = ("" if reply is None else "/anyOf/0") + "/properties/tool_calls/items"
    if len(tools) == 1:
        item = _call_schema(tools[0], items, envelope=envelope)
    else:
        item = {"anyOf": [_call_schema(t, f"{items}/anyOf/{k}", envelope=envelope) for k, t in enumerate(tools)]}
    array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    array["maxItems"] = MAX_PARALLEL_CALLS if parallel else 1
    calling = {
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if reply is None:
        return calling
    replying = {
        "type": "object",
        "properties": {"content": _rebase(reply, "/anyOf/1/properties/content")},
        "required": ["content"],
        "additionalProperties": False,
    }
    return {"anyOf": [calling, replying]}


def _tool_prompt(tools: list[Tool], mode: str, parallel: bool) -> str:
    lines = ["You can call these tools:"]
    for t in tools:
        what = f": {t.description}" if t.description else ""
        lines.append(f"- {t.name}{what}\n  arguments (JSON Schema): {json.dumps(t.parameters, separators=(',', ':'))}")
    call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
    several = " (list several calls to run them in parallel)" if parallel else ""
    lines.append(f"To call a tool, answer with this JSON and nothing else{several}: {call}")
    if mode == "auto":
        # the reply's shape, not a reply: {"content": "<your reply>"} is one the grammar admits,
        # and gemma-3-270m answered it word for word to half the questions asked
        lines.append('To answer in words instead, answer with {"content": …} holding your answer to the user.')
    elif mode == "named" and len(tools) == 1:
        lines.append(f"Call the tool {tools[0].name}.")
    else:
        lines.append("Call a tool.")
    return "\n".join(lines)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _plain_messages(messages: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """Tool turns as text every template can render; the tool prompt in the system message.

    Tool results become one user turn: the results of parallel calls (several ``tool``
    messages in a row) and a user message right after them are joined, since templates
    that require user and assistant turns to alternate refuse two user turns in a row.
    A result names the call it answers (OpenAI's tool message carries only the call's id,
    which the rendered calls do not show): the tool, and its arguments when that turn
    called the tool more than once.
    """
    out: list[dict[str, Any]] = []
    results = False  # out[-1] is a user turn holding tool results
    answers: dict[str, str] = {}  # a call's id → what its result is shown as answering
    for message in messages:
        role = message["role"]
        # null is "absent" (OpenAI's reading): llama-server answers a null name, tool_call_id
        # or reasoning_content with a 500 ("type must be string, but is null")
        given = {k: v for k, v in message.items() if v is not None or k == "content"}
        m = {**given, "role": "system"} if role == "developer" else given
        if role == "assistant" and (m.get("tool_calls") or m.get("function_call")):
            calls = []
            made = m.get("tool_calls") or [{"function": m["function_call"]}]
            for call in made if isinstance(made, list) else []:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except (TypeError, ValueError, RecursionError):  # RecursionError: nested deeper than json decodes
                    args = fn.get("arguments")
                calls.append({"name": fn.get("name"), "arguments": args})
            answers.update(_answered(made, calls))
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls}, separators=(",", ":"))}
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id")
            who = (answers.get(call_id) if call_id else None) or m.get("name") or call_id or "tool"
            m = {"role": "user", "content": f"Result of {who}: {_text(m.get('content'))}"}
            if results:
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{m['content']}"}
                continue
            out.append(m)
            results = True
            continue
        elif role == "user" and results:
            out[-1] = {**m, "content": f"{out[-1]['content']}\n\n{_text(m.get('content'))}"}
            results = False
            continue
        out.append(m)
        results = False
    if system:
        if out and out[0]["role"] == "system":
            # one system message, whatever the form of the client's (text parts too): templates
            # that take a system message only first refuse a second
            head = _text(out[0].get("content"))
            out[0] = {**out[0], "content": f"{head}\n\n{system}" if head else system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _answered(made: Any, calls: list[dict[str, Any]]) -> dict[str, str]:
    """Each of one turn's call ids → the call as its result names it (``made``: the client's
    calls, ``calls``: as rendered, in the same order)."""
    names = [c["name"] for c in calls]
    shown: dict[str, str] = {}
    for call, rendered in zip(made if isinstance(made, list) else [], calls, strict=True):
        name = rendered["name"]
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"] or not name:
            continue
        twice = names.count(name) > 1
        shown[call["id"]] = f"{name} {json.dumps(rendered['arguments'], separators=(',', ':'))}" if twice else name
    return shown


def prepare(
    data: dict[str, Any],
    model: str,
    *,
    limits: ChatLimits = ChatLimits(),
    stop: tuple[str, ...] = (),
    parallel: int | None = None,
) -> Prepared:
    """The upstream body and the answer's handling for one chat request (BadRequest: 400);
    ``parallel``: the model's slots (``n`` is capped to them)."""
    from localllm.grammar.compile import compile_shared
    from localllm.grammar.relax import relax

    body = dict(data)
    _check_messages(body.get("messages"))
    _check_template_kwargs(body)
    check_numbers(body)
    _check_schema_bytes(body)
    check_grammar(body)
    keep_alive = parse_keep_alive(body.pop("keep_alive")) if "keep_alive" in body else None
    cap_costs(body, limits, parallel)
    stops = merge_stops(body, stop)
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    prepared = Prepared(
        body=body, model=model, stream=stream, include_usage=include_usage, keep_alive=keep_alive, stops=stops
    )

    kind, schema, strict = ("text", None, False)
    if body.get("response_format") is not None:
        kind, schema, strict = _response_format(body["response_format"])
        if kind == "json_object":
            prepared.schema_param = "response_format.schema"
    if kind == "text":
        body.pop("response_format", None)
    if body.get("json_schema") is not None:
        # llama.cpp's own extension: compiled and validated like a response_format, never
        # handed to the converter unchecked
        if kind != "text":
            raise BadRequest("give either response_format or json_schema, not both", "json_schema")
        kind, schema, strict = "json_schema", body["json_schema"], False
        _schema_problem(schema, "json_schema")
        prepared.schema_param = "json_schema"
    body.pop("json_schema", None)

    prepared.legacy = _legacy_functions(body)
    try:
        tools = _tools(body["tools"]) if body.get("tools") is not None else {}
        mode, named = _tool_choice(body.get("tool_choice"), tools) if tools else ("none", None)
    except BadRequest as exc:
        raise (_legacy_param(exc) if prepared.legacy else exc) from None
    if "tool_choice" in body and not tools and body["tool_choice"] not in (None, "none", "auto"):
        raise BadRequest("tool_choice needs tools", "tool_choice")
    for key in ("tools", "tool_choice", "parallel_tool_calls"):
        body.pop(key, None)
    if mode != "none":
        _check_ends(body, "functions" if prepared.legacy else "tools")
    elif kind != "text":
        _check_ends(body, prepared.schema_param.split(".")[0])
    body["messages"] = _plain_messages(body["messages"], None)

    if mode != "none":
        if body.get("grammar") is not None:  # the tools' grammar would replace it
            what = "functions" if prepared.legacy else "tools"
            raise BadRequest(f"give either {what} or grammar, not both", "grammar")
        chosen = [tools[named]] if named else list(tools.values())
        parallel = not prepared.legacy and data.get("parallel_tool_calls") is not False
        reply = None
        if mode == "auto":
            reply = schema if kind != "text" else {"type": "string", "minLength": 1}  # never an empty reply
        target = answer_schema(chosen, parallel=parallel, reply=reply)
        # what a server that ignores grammars is held to: a client's reply schema is checked on
        # its own (strict or not), the service's own (a non-empty string) here
        shape = {} if reply is not None and kind != "text" else reply
        prepared.envelope = answer_schema(chosen, parallel=parallel, reply=shape, envelope=True)
        compiled = compile_shared(target, open_objects=OPEN_OBJECTS)
        if not compiled.exact:  # a reply schema the compiler refuses, or tools together
            raise _refusal(compiled, prepared.schema_param if kind != "text" else "tools")
        body.pop("response_format", None)
        body["grammar"] = compiled.grammar
        body["messages"] = _plain_messages(data["messages"], _tool_prompt(chosen, mode, parallel))
        prepared.tools = {t.name: t for t in chosen}
        prepared.tool_mode = mode
        prepared.reply_schema = schema if kind != "text" else None
        prepared.structured = "compiled"
        prepared.strict = strict or any(t.strict for t in chosen)
        body["stream"] = False
        body.pop("stream_options", None)
        return prepared

    if kind in ("json_object", "json_schema"):
        if "grammar" in body:
            raise BadRequest(f"give either {prepared.schema_param.split('.')[0]} or grammar, not both", "grammar")
        compiled = compile_shared(schema if isinstance(schema, (dict, bool)) else {}, open_objects=OPEN_OBJECTS)
        if compiled.unsatisfiable:
            raise _refusal(compiled, prepared.schema_param)
        if compiled.exact:
            body.pop("response_format", None)
            body["grammar"] = compiled.grammar
            prepared.structured = "compiled"
        elif (unenforced := _converter_errors(schema)) and strict:
            # neither localllm's compiler nor llama.cpp's converter enforces it
            raise _refusal(compiled, prepared.schema_param)
        elif unenforced and (relaxed := relax(schema, open_objects=OPEN_OBJECTS)) is not None:
            # the schema without the keywords neither enforces, where that only widens it:
            # the rest constrained, those validated
            body.pop("response_format", None)
            body["grammar"] = relaxed.compiled.grammar
            prepared.structured = "relaxed"
        else:
            # llama.cpp's converter (strict: only when localllm's checker says it enforces the
            # schema); the answer is validated either way. Never a schema it would make a
            # grammar of that llama-server never finishes reading
            _refuse_runaway(unenforced, compiled, prepared.schema_param)
            prepared.structured = "converter"
            prepared.notes = [r.message for r in compiled.refusals]
            if kind == "json_object":
                body["response_format"] = {"type": "json_object", "schema": schema}
            elif prepared.schema_param == "json_schema":
                body["json_schema"] = schema
        prepared.schema = schema
        prepared.strict = strict
        body["stream"] = False
        body.pop("stream_options", None)
    return prepared


# -------------------------------------------------------------------------- answer

#: how llama-server words a schema its converter cannot turn into a working grammar: "Unable
#: to generate parser … JSON schema error" (400), "failed to parse grammar" (400),
#: "Unexpected empty grammar stack" (a 500 mid-generation: the grammar admits no value)
_CONVERTER_FAILED = re.compile(r"grammar|json schema|parser", re.IGNORECASE)


def _upstream_message(answer: Any) -> str | None:
    """The message of llama-server's error answer (``{"error": {"message": …}}``), if it has one."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def converter_failure(prepared: Prepared, status: int, answer: Any) -> BadRequest | None:
    """The 400 for a schema llama.cpp's converter failed on, after localllm's compiler refused it.

    Neither can enforce the schema, so it is the client's to fix: a 400 naming both reasons,
    not llama-server's 500 (which clients retry) or its own error shape.
    """
    if prepared.structured != "converter" or status == 200:
        return None
    message = _upstream_message(answer)
    if message is None or not _CONVERTER_FAILED.search(message):
        return None
    ours = f" ({prepared.notes[0]})" if prepared.notes else ""
    param = prepared.schema_param
    return BadRequest(
        f"Invalid schema for {param}: localllm cannot compile it exactly{ours}, and llama.cpp's converter "
        f"failed on it: {message}. Fix the schema (a schema no value meets is a common cause).",
        param,
        "unsupported_schema",
    )


def ended_failure(prepared: Prepared, status: int, answer: Any) -> BadRequest | None:
    """The 400 for a request's own grammar that ended under ``ignore_eos``: llama-server cannot
    go on and fails the request with a 500 ("Unexpected empty grammar stack"), which clients
    retry and which names nothing."""
    if status != 500 or prepared.body.get("ignore_eos") is not True or prepared.structured != "none":
        return None
    message = _upstream_message(answer)
    if message is None or "empty grammar stack" not in message:
        return None
    return BadRequest(
        f"the request's grammar ended, and ignore_eos forbids the end of generation, so llama-server "
        f"could not go on ({message}): drop ignore_eos, or give a grammar that never ends",
        "ignore_eos",
    )


def _validator(schema: Any) -> Any:
    from localllm.grammar.compile import validator_class
    from localllm.grammar.formats import format_checker

    cls = validator_class(schema)
    return cls(schema, format_checker=format_checker(cls))  # the formats every other path asserts


def _violation(schema: Any, value: Any) -> str | None:
    from referencing.exceptions import Unresolvable

    from localllm.grammar.bounded import ValidationTooCostly
    from localllm.grammar.pattern import PatternTooCostly

    try:
        error = next(iter(_validator(schema).iter_errors(value)), None)
    except RecursionError:  # a recursive schema and an answer nested hundreds of levels deep
        return "$: the answer nests too deeply to validate against this recursive schema"
    except PatternTooCostly as exc:  # a huge repeat searched unanchored in a long answer
        return f"$: a pattern of the schema cannot be checked: {exc}"
    except ValidationTooCostly as exc:  # subschemas applied again and again (allOf/$ref fan-out)
        return f"$: the answer cannot be checked: {exc}"
    except Unresolvable as exc:  # refused with the request (unresolvable_ref); never fetched
        return f"$: a $ref of the schema does not resolve: {getattr(exc, 'ref', exc)}"
    if error is None:
        return None
    where = "$" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"{where}: {error.message}"


def _call_id() -> str:
    return "call_" + secrets.token_urlsafe(18).replace("-", "a").replace("_", "b")


_REPLY_HEAD = re.compile(r'\s*\{\s*"content"\s*:\s*"')


def _cut_reply(content: Any) -> str | None:
    """The text of a ``{"content": "…`` reply that max_tokens cut short; None for anything else."""
    head = _REPLY_HEAD.match(content) if isinstance(content, str) else None
    if head is None:
        return None
    rest = content[head.end() - 1 :]  # from the string's opening quote
    try:  # the string itself ended; only the closing brace is missing
        value, _ = json.JSONDecoder().raw_decode(rest)
        return value if isinstance(value, str) else None
    except ValueError:
        pass
    for trim in range(6):  # a cut escape: a lone backslash, at most "\\uXXX"
        try:
            value = json.loads(rest[: len(rest) - trim] + '"')
        except ValueError:
            continue
        if value and 0xD800 <= ord(value[-1]) <= 0xDFFF:  # half a surrogate pair: no text
            value = value[:-1]
        return value if isinstance(value, str) else None
    return None


#: a content that is not JSON (``null`` is JSON: a schema may admit it)
_NO_JSON = object()


class _RepeatedKey(ValueError):
    """An object of the answer names a key twice."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on a repeated key (Python and JavaScript keep the last value, serde
    # refuses the document): an answer validated as one reading is no answer for the others.
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return value


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _cutter(body: dict[str, Any]) -> str:
    """What ended an answer llama-server reports as ``length``: max_tokens, or a limit of its own
    the request set (a time after the first token, a line's indent)."""
    own = [name for name in ("t_max_predict_ms", "n_indent") if _positive(body.get(name))]
    return " or ".join(["max_tokens", *(f"the request's {name}" for name in own)])


def finish(prepared: Prepared, answer: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the answer for the client, validated); :class:`Invalid` when a strict guarantee broke."""
    answer["model"] = prepared.model
    choices = answer.get("choices")
    if prepared.structured == "none" or not isinstance(choices, list):
        return answer, False
    validated = True
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise Invalid("the model's answer has no message")
        content = message.get("content")
        reason = choice.get("finish_reason")
        value: Any
        try:
            value = json.loads(content, object_pairs_hook=_unique) if isinstance(content, str) else _NO_JSON
        except _RepeatedKey as exc:
            if prepared.tool_mode != "none" or prepared.strict:
                raise Invalid(f"the model's answer names the key {str(exc)!r:.80} twice in one object") from None
            validated = False
            continue
        except (ValueError, RecursionError):  # RecursionError: ~1,000 tokens of "[" are enough
            value = _NO_JSON
        if value is _NO_JSON:
            cut = f" (cut off by {_cutter(prepared.body)})" if reason == "length" else ""
            if reason == "stop" and prepared.stops:  # the grammar was not done: a stop string fired in it
                cut = (
                    f" (cut off by one of the request's stop strings {prepared.stops!r:.80}, which the answer contains)"
                )
            partial = _cut_reply(content) if reason == "length" and prepared.tool_mode == "auto" else None
            if partial is not None and prepared.reply_schema is None:
                # a text reply max_tokens cut: what OpenAI answers too (the text so far, "length")
                message["content"] = partial
                continue
            if prepared.tool_mode != "none" or prepared.strict:
                raise Invalid(f"the model's answer is not complete JSON{cut}")
            validated = False
            continue
        if prepared.tool_mode == "none":
            problem = _violation(prepared.schema, value)
            if problem is not None:
                if prepared.strict:
                    raise Invalid(f"the answer violates the schema at {problem}")
                validated = False
            continue
        shape = _violation(prepared.envelope, value)
        if shape is not None:
            # what the grammar admits (calls of the offered tools, as many as allowed; a reply
            # only with tool_choice auto): a server that ignored the grammar wrote something else
            raise Invalid(f"the model's answer is not one tool_choice {prepared.tool_mode} admits: {shape}")
        if "tool_calls" in value:
            calls = []
            for call in value["tool_calls"]:
                tool = prepared.tools[call["name"]]
                args = call["arguments"]
                problem = _violation(tool.parameters, args)
                if problem is not None:
                    if tool.strict:
                        raise Invalid(f"the arguments of {tool.name} violate its parameters at {problem}")
                    validated = False
                calls.append(
                    {
                        "id": _call_id(),
                        "type": "function",
                        "function": {"name": tool.name, "arguments": json.dumps(args, ensure_ascii=False)},
                    }
                )
            message["content"] = None
            if prepared.legacy:  # one call (the grammar's), in the deprecated shape it was asked in
                message["function_call"] = calls[0]["function"]
                choice["finish_reason"] = "function_call"
                continue
            message["tool_calls"] = calls
            choice["finish_reason"] = "tool_calls"
        else:
            reply = value["content"]
            if prepared.reply_schema is not None:
                problem = _violation(prepared.reply_schema, reply)
                if problem is not None:
                    if prepared.strict:
                        raise Invalid(f"the reply violates the schema at {problem}")
                    validated = False
            message["content"] = reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
    return answer, validated


# -------------------------------------------------------------------------- embeddings


def prompt_parts(given: Any) -> list[list[Any]]:
    """The prompts llama-server makes of a completions ``prompt`` or an embeddings ``input``
    (``tokenize_input_prompts``), each as its items: a string is one; an array holding a token
    id is one (its strings and ids, tokenized in turn); any other array, one per item."""
    if isinstance(given, str):
        return [[given]]
    if not isinstance(given, list):
        return []
    if any(isinstance(x, int) for x in given):
        return [given]
    return [[x] if isinstance(x, str) else x for x in given if isinstance(x, (str, list))]


def check_items(given: Any, param: str) -> None:
    """At most :data:`MAX_TOKEN_IDS` items (token ids or texts) in ``given``, an array, and the
    arrays in it, counted before anything reads each item: 16 MiB of token ids is 8 million,
    and every pass over them in Python (type checks, vocabulary checks, JSON nesting) held the
    service's event loop, every client waiting: 8.5 s for one request. llama-server refuses a
    prompt past its context anyway, after 6 s of its own reading it."""
    if not isinstance(given, list):
        return
    count = len(given)
    if count <= MAX_TOKEN_IDS:
        count = sum(len(x) if isinstance(x, list) else 1 for x in given)
    if count > MAX_TOKEN_IDS:
        raise BadRequest(
            f"{param} holds {count:,} token ids and texts; at most {MAX_TOKEN_IDS:,} in one request: send it in parts",
            param,
            "too_many_tokens",
        )


def check_embeddings(data: dict[str, Any]) -> None:
    """An embeddings request's ``input`` and ``dimensions`` as llama-server takes them (400 otherwise).

    ``input``: a string, or a non-empty array of strings, token ids, or arrays of those
    (llama-server answers other shapes with a 500), at most :data:`MAX_EMBEDDING_INPUTS`
    inputs; ``dimensions``: absent or a positive integer;
    ``encoding_format`` and llama-server's ``embd_normalize`` of the types it reads.
    llama-server's own name for ``input``, ``content``, is sent as ``input``: given ``content``,
    it answers in its own shape (no ``data``), whose vectors no ``dimensions`` check could read.
    """
    name = "content" if "content" in data else "input"  # the errors name the field the client sent
    if name == "content":
        if "input" in data:
            raise BadRequest("give either input or content (llama-server's name for it), not both", "content")
        data["input"] = data.pop("content")
    given = data.get("input")
    check_items(given, name)
    if not isinstance(given, str) and not (isinstance(given, list) and given and all(map(_embedding_item, given))):
        raise BadRequest(f"{name} must be a string, or a non-empty array of strings, token ids or arrays of them", name)
    count = len(prompt_parts(given))
    if count > MAX_EMBEDDING_INPUTS:
        raise BadRequest(
            f"{name} holds {count} inputs; at most {MAX_EMBEDDING_INPUTS} in one request (OpenAI's limit)", name
        )
    dims = data.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise BadRequest(f"dimensions must be a positive integer, got {dims!r:.40}", "dimensions")
    # llama-server's 500s: a type error on either
    if data.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequest(
            f"encoding_format must be float or base64, got {data['encoding_format']!r:.40}", "encoding_format"
        )
    norm = data.get("embd_normalize", -1)
    if isinstance(norm, bool) or not isinstance(norm, int) or not -1 <= norm < 1 << 31:
        raise BadRequest(
            f"embd_normalize must be an integer: -1 (none), 0 (max abs), 1 (taxicab), 2 (euclidean) or a p > 2, "
            f"got {norm!r:.40}",
            "embd_normalize",
        )


def check_tokens(path: str, data: dict[str, Any]) -> None:
    """llama-server's ``/tokenize`` ``content`` (text, or an array of texts and token ids) and
    ``/detokenize`` ``tokens`` (token ids): other shapes are 400s here, 500s there."""
    if path == "/tokenize":
        content = data.get("content")
        check_items(content, "content")
        # a flat array of texts and ids is what _embedding_item accepts as one item
        if not isinstance(content, str) and not (isinstance(content, list) and content and _embedding_item(content)):
            raise BadRequest("content must be a string, or a non-empty array of strings and token ids", "content")
        items = content if isinstance(content, list) else [content]
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in items if isinstance(t, str))
        if size > MAX_TOKENIZE_BYTES:
            raise BadRequest(
                f"content holds {size:,} bytes of text; at most {MAX_TOKENIZE_BYTES:,} in one request "
                "(llama-server builds its whole answer first): send it in parts",
                "content",
            )
        negative = next((j for j, t in enumerate(content) if isinstance(t, int) and t < 0), None)
        if negative is not None:  # never a token id; with_pieces made it llama-server's 500
            raise BadRequest(f"content[{negative}] is a negative token id", f"content[{negative}]", "invalid_token")
    elif path == "/detokenize":
        tokens = data.get("tokens")
        check_items(tokens, "tokens")
        if not isinstance(tokens, list) or not all(_token_id(t) for t in tokens):
            raise BadRequest("tokens must be an array of token ids (integers >= 0)", "tokens")


def vocab_refusal(tokens: list[Any], models: Any, field: str = "tokens") -> BadRequest | None:
    """The 400 for a ``/detokenize`` id (``/tokenize`` ``content`` id, ``with_pieces``) outside
    the vocabulary that ``models`` (llama-server's ``GET /v1/models``) gives: llama-server
    answers it with a 500 (a C++ range check). Items of ``tokens`` other than ids are skipped."""
    size = vocab_size(models)
    if size is None:
        return None
    outside = next(((i, t) for i, t in enumerate(tokens) if _token_id(t) and t >= size), None)
    if outside is None:
        return None
    return BadRequest(
        f"{field}[{outside[0]}] is {outside[1]}, not a token id of this model: its vocabulary has {size} tokens "
        f"(ids 0 to {size - 1})",
        f"{field}[{outside[0]}]",
        "invalid_token",
    )


def vocab_size(models: Any) -> int | None:
    """``meta.n_vocab`` of llama-server's ``GET /v1/models`` answer ``models`` (None: not there)."""
    rows = models.get("data") if isinstance(models, dict) else None
    meta = rows[0].get("meta") if isinstance(rows, list) and rows and isinstance(rows[0], dict) else None
    size = meta.get("n_vocab") if isinstance(meta, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    return size


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _embedding_item(item: Any) -> bool:
    if isinstance(item, list):
        return all(_embedding_item(x) and not isinstance(x, list) for x in item)
    return isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))


def dimensions_refusal(dims: int, answer: Any) -> BadRequest | None:
    """The 400 for ``dimensions`` (checked by :func:`check_embeddings`) other than the size of
    ``answer``'s vectors: llama-server ignores the field, and vectors of another size than
    asked for would break the client's index far from here."""
    rows = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return None
    vector = rows[0].get("embedding")
    if isinstance(vector, str):  # encoding_format "base64": float32 values
        size = len(base64.b64decode(vector)) // 4
    elif isinstance(vector, list):
        size = len(vector)
    else:
        return None
    if size == dims:
        return None
    model = answer.get("model")
    return BadRequest(
        f"model {model!r} gives {size}-dimensional embeddings and cannot shorten them to {dims}: "
        f"drop dimensions (or ask for {size})",
        "dimensions",
        "unsupported_dimensions",
    )


def sse_events(prepared: Prepared, answer: dict[str, Any]) -> list[bytes]:
    """A finished answer as OpenAI's server-sent events (role/content or tool_calls deltas, usage, [DONE])."""
    base = {
        "id": answer.get("id") or f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": answer.get("created") or int(time.time()),
        "model": prepared.model,
    }
    events: list[dict[str, Any]] = []
    for i, choice in enumerate(answer.get("choices") or []):
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
        if message.get("function_call"):
            delta["function_call"] = message["function_call"]
        index = choice.get("index", i)
        first: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": None}
        if choice.get("logprobs") is not None:  # asked for: the whole answer's, with its one delta
            first["logprobs"] = choice["logprobs"]
        events.append({**base, "choices": [first]})
        events.append(
            {**base, "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]}
        )
    if prepared.include_usage and answer.get("usage") is not None:
        events.append({**base, "choices": [], "usage": answer["usage"]})
    out = [b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events]
    out.append(b"data: [DONE]\n\n")
    return out
