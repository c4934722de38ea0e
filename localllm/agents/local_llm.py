"""``builtin.local_llm``: a llama.cpp server (managed sidecar or attached endpoint) over OpenAI HTTP.

Managed mode (``model:``) owns a :class:`~localllm.managed.server.ManagedServer`: the pinned
llama-server and GGUF are fetched on the first call (never before), one server is shared by
all calls, and ``close()`` stops it (cancelling a first-use download).
Endpoint mode (``endpoint:``) attaches to a running OpenAI-compatible server and never
fetches, spawns or kills anything; ``model:`` beside ``endpoint:`` is only the model name
sent in the body.

Constrained decoding (:meth:`LocalLLMAgent.constraint`), the §9 knobs first:
``json_schema: true`` always sends ``response_format: {type: json_schema, strict: true}``
(wins over grammar, no probe). ``grammar: true`` with a schema constrains: in managed mode
with localllm's own exact, compact GBNF (:func:`localllm.grammar.compile_schema`) as the
request's ``grammar`` (localllm's addition; a schema it cannot compile exactly, or
``grammar: server``, gets ``response_format: json_schema`` when the schema is inside
llama.cpp's subset; else, but for ``grammar: server``, the grammar of the schema without the
keywords the compiler refuses where dropping them only widens it — ``relaxed``, the keywords
in ``meta.grammar_relaxed``, left to validation —; else no constraint); in endpoint mode with
``response_format: json_schema``. ``grammar: false`` sends nothing. ``meta.grammar`` is the
contract's boolean (was the grammar constraint applied), ``meta.grammar_source``
``compiled | server | relaxed | none``,
``meta.json_schema`` whether ``json_schema: true`` applied. ``response_format:`` picks
another field; ``probe`` negotiates it (:mod:`localllm.agents.structured`: one probe per
endpoint per Runtime, opt-in because it is an extra request); ``meta.structured_output``
names the style that ran, ``meta.structured_probe`` what the probe found.
llama-server does not put the
schema in the prompt, so unless ``schema_in_prompt: false`` the prompt is preceded by a short
statement of the required JSON shape (static text first, so warm calls hit llama-server's
prompt cache; ``meta.cache_n``/``meta.prompt_n`` say how much did). The runtime validates
every answer regardless.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import _http, settings
from localllm._http import CONNECTION_REFUSED, map_httpx_errors
from localllm._upstream import REDIRECT_HINT, UpstreamError, read_error, redirected
from localllm.agents import confidence, structured
from localllm.agents.base import Agent
from localllm.config import LocalLLMDecl
from localllm.errors import (
    AgentError,
    ErrorKind,
    FetchError,
    LocalLLMError,
    ServiceError,
    SidecarError,
    truncate_detail,
)
from localllm.managed.spec import ServerSpec
from localllm.managed.upstream import Route, Target, Upstream, openai_base
from localllm.wire import AskRequest, AskResponse, Transcript

if TYPE_CHECKING:
    from localllm.grammar.relax import Relaxed
    from localllm.managed.server import ManagedServer
    from localllm.managed.vocab import Vocab

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_CONNECT_TIMEOUT = 5.0
#: how long a failed request waits for a dying managed server to exit, to report why
_EXIT_SETTLE = 1.0
_CHAT_PATH = "/v1/chat/completions"


#: the most prepare(wait=False) waits for its server process to be spawned, seconds
_SPAWN_WAIT = 2.0


def normalize_endpoint(url: str) -> str:
    """``http://h:p``, ``http://h:p/``, ``http://h:p/v1/`` → ``http://h:p/v1`` (the upstream's one URL rule)."""
    return openai_base(url)


def strip_fence(text: str) -> str:
    """Remove a leading ```json / ``` fence around the whole answer."""
    match = _FENCE.match(text)
    return match.group(1).strip() if match else text.strip()


def shape_statement(schema: dict[str, Any]) -> str:
    """The concise JSON-shape instruction put before the prompt (static text first: cacheable)."""
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return f"Answer with only a JSON value that matches this JSON Schema (no prose, no code fence):\n{compact}\n\n"


class LocalLLMAgent(Agent):
    """A local model behind the Ask contract; its schema_invalid answers fall back to claude."""

    plugin = "builtin.local_llm"
    is_local_model = True

    def __init__(
        self, decl: LocalLLMDecl, *, base_dir: Path | None = None, styles: structured.Styles | None = None
    ) -> None:
        super().__init__(decl.alias)
        self.decl = decl
        #: the Runtime's negotiated style per endpoint URL (shared by its agents)
        self.styles = styles if styles is not None else structured.Styles()
        #: relative ``*.gguf`` model paths resolve against the config's directory
        self.base_dir = base_dir
        self._lock = threading.Lock()
        #: the one route to the server: a running `localllm serve`, the own sidecar, or the endpoint
        self.upstream = (
            Upstream(endpoint=decl.endpoint)
            if decl.endpoint is not None
            else Upstream(ServerSpec.from_chat_decl(decl, base_dir=base_dir), policy=decl.service)
        )
        self._client: Any = None
        self._subset_cache: dict[str, bool] = {}
        self._pinned_meta: dict[str, Any] | None = None
        self._choice_cache: dict[str, bool] = {}
        #: the endpoint answered 400 to ``logprobs``: confidence is unavailable from it
        self._logprobs_refused = False
        self._one_at_a_time = threading.Lock() if decl.reproducible else contextlib.nullcontext()
        self._starter: threading.Thread | None = None  # prepare(wait=False)'s thread, until base_url() joins it
        self._start_error: BaseException | None = None
        self._closed = False
        #: own server's base URL → its vocabulary and context per slot (None: it does not say)
        self._contexts: dict[str, tuple[Vocab, int] | None] = {}

    def _import_jsonschema(self) -> None:
        """compile_schema needs jsonschema inside ask(), on the runtime's worker thread, while
        the calling thread imports it to prime the validator: racing lazy imports deadlock, so
        it is imported on the calling thread first — by :meth:`prepare` (wait=False) once the server
        process exists (not before: the spawn comes first), and again (a no-op) by ask()."""
        if self.decl.grammar:
            from localllm import _jsonschema

            _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
            import jsonschema  # noqa: F401

    # ------------------------------------------------------------------ server

    @property
    def managed(self) -> bool:
        return self.decl.endpoint is None

    @property
    def _server(self) -> ManagedServer | None:
        """The agent's own server if it was built (never builds it)."""
        return self.upstream.own_server

    def _http(self) -> Any:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = _http.client(
                    limits=httpx.Limits(max_connections=max(4, self.decl.parallel * 2)),
                    headers={"Accept-Encoding": "identity"},
                )
            return self._client

    def _drop_connections(self) -> None:
        """Before a retry: the pool's keep-alive sockets died with the server (a respawn may reuse its port)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def prepare(self, *, wait: bool = True) -> None:
        """Resolve the route now — attach to a running service, or fetch and start the agent's
        own server — instead of on the first call (:meth:`Upstream.prepare`).

        ``wait=False`` begins it on a background thread and returns at once: for a caller about
        to prepare a call (imports, schema, grammar) that would otherwise happen before the
        server even starts loading (``localllm run`` and ``localllm call``); the next call
        waits for it and takes its outcome (its error included, raised once). Endpoint mode,
        or a route already resolved: nothing to do.
        """
        if wait:
            self.base_url()
            return
        if not self.managed:
            return
        # What the start imports is imported here, before the thread exists: two threads
        # importing one package at once can leave one with a half-initialised module.
        import localllm.managed.discovery
        import localllm.managed.probes
        import localllm.managed.server  # noqa: F401

        with self._lock:
            if self._closed or self._starter is not None or self.upstream.current() is not None:
                return
            starter = self._starter = threading.Thread(target=self._start_now, name=f"{self.alias}-start", daemon=True)
            starter.start()
        # Up to the spawn the start is a little Python work (cache checks, argv) that a busy
        # calling thread would slow down (one GIL): wait for the process to exist, briefly —
        # a first-use download goes on in the background.
        deadline = time.monotonic() + _SPAWN_WAIT
        while starter.is_alive() and time.monotonic() < deadline:
            server = self._server
            if server is not None and server.pid is not None:
                break
            time.sleep(0.001)
        self._import_jsonschema()

    def _start_now(self) -> None:
        try:
            self._target()
        except BaseException as exc:  # kept for the call that joins this thread
            self._start_error = exc

    def base_url(self) -> str:
        """The ``…/v1`` base URL; in managed mode this attaches, or fetches and starts the server."""
        return self._joined_target().base_url

    def _joined_target(self) -> Target:
        """The resolved route, after a ``prepare(wait=False)`` in progress (whose error is raised once)."""
        starter = self._starter
        if starter is not None:
            starter.join()
            with self._lock:
                error, self._start_error = self._start_error, None
                self._starter = None
            if error is not None:
                raise error
        return self._target()

    def _target(self) -> Target:
        """:meth:`Upstream.prepare`, its failures as AgentErrors."""
        try:
            return self.upstream.prepare()
        except (FetchError, SidecarError, ServiceError, ValueError) as exc:
            raise self._start_failed(exc) from exc

    def _start_failed(self, exc: BaseException) -> AgentError:
        if self._closed:
            return AgentError(ErrorKind.TRANSPORT_ERROR, "closed while starting", alias=self.alias)
        hint = exc.hint if isinstance(exc, LocalLLMError) else ""
        return AgentError(ErrorKind.TRANSPORT_ERROR, f"cannot start llama-server: {exc}", hint=hint, alias=self.alias)

    # ------------------------------------------------------------------ request

    def _in_subset(self, key: str, schema: dict[str, Any]) -> bool:
        cached = self._subset_cache.get(key)
        if cached is None:
            from localllm.grammar import check_subset

            cached = not any(v.severity == "error" for v in check_subset(schema))
            self._subset_cache[key] = cached
        return cached

    def style(self) -> str | None:
        """The configured style; ``None`` when it is negotiated (``probe`` in endpoint mode).

        ``json_schema: true`` is ``json_schema``, full stop (§9: it wins over grammar and is
        independent of the subset gate). ``auto`` is the contract's knobs: ``grammar: true``
        constrains (the compiled grammar on a managed server, ``response_format: json_schema``
        on an endpoint), ``grammar: false`` sends nothing. No probe: every request is the call's own.
        """
        decl = self.decl
        if decl.json_schema:
            return "json_schema"
        if decl.response_format == "probe":
            return None if not self.managed and decl.grammar else ("grammar" if decl.grammar else "none")
        if decl.response_format != "auto":
            return decl.response_format
        if not decl.grammar:
            return "none"
        return "grammar" if self.managed or decl.grammar == "server" else "json_schema"

    def constraint(self, schema: dict[str, Any] | None, style: str | None = None) -> tuple[dict[str, Any], str, str]:
        """The body fields that constrain decoding, ``meta.grammar_source`` (compiled |
        server | relaxed | none: what applied the grammar: true constraint) and the style run."""
        style = style or self.style() or "grammar"
        if schema is None or style == "none":
            return {}, "none", "none"
        if self.decl.json_schema:  # the endpoint's native json_schema: not the grammar knob
            return structured.fields("json_schema", schema), "none", "json_schema"
        if style != "grammar":
            return structured.fields(style, schema), "server", style
        server = structured.fields("json_schema", schema)
        mode: Any = self.decl.grammar
        if mode != "server":  # "server": llama.cpp's own converter, never the compiled grammar
            from localllm.grammar.compile import compile_shared

            # kept by the schema's JSON in its declared order: the order the grammar generates
            compiled = compile_shared(schema, space=not self.decl.compact, open_objects=self.decl.open_objects)
            if compiled.grammar is not None:
                return {"grammar": compiled.grammar}, "compiled", "grammar"
        if self._in_subset(json.dumps(schema, sort_keys=True), schema):
            return server, "server", "json_schema"
        if mode != "server" and (relaxed := self._relaxed(schema)) is not None:
            return {"grammar": relaxed.compiled.grammar}, "relaxed", "grammar"
        return {}, "none", "none"

    def _relaxed(self, schema: dict[str, Any]) -> Relaxed | None:
        """The grammar of ``schema`` without the keywords the compiler refuses, where dropping
        them only widens it (:func:`localllm.grammar.relax.relax`; kept per schema there)."""
        from localllm.grammar.relax import relax

        return relax(schema, space=not self.decl.compact, open_objects=self.decl.open_objects)

    def build_body(self, request: AskRequest, style: str | None = None) -> tuple[dict[str, Any], str, bool, str]:
        """The chat-completions body, ``meta.grammar``, whether json_schema applied and the style run."""
        schema = request.schema
        native = schema is not None and self.decl.json_schema
        constraint, grammar, ran = self.constraint(schema, style)
        # static first, the prompt (whose args vary) last: llama-server reuses the cached
        # prefix, so a warm call re-evaluates only what follows the first varying token
        content = request.prompt
        if schema is not None and self.decl.schema_in_prompt:
            content = shape_statement(schema) + content
        body: dict[str, Any] = {
            "model": self.decl.model or "local",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.decl.max_tokens,
        }
        temperature = self.decl.temperature
        if temperature is None and request.verb == "decide":
            temperature = 0.0
        if temperature is not None:
            body["temperature"] = temperature
        if self.decl.reproducible:
            # llama.cpp's logits differ with the batch a token is evaluated in, so a prompt
            # partly served from the cache (or batched with another slot's) can change the
            # answer; evaluated whole and alone (ask() holds _one_at_a_time), it does not
            body.update(cache_prompt=False, seed=0)
        body.update(constraint)
        if self._wants_logprobs(schema):
            body.update(logprobs=True, top_logprobs=confidence.TOP_LOGPROBS)
        return body, grammar, native, ran

    @staticmethod
    def _score(post: Any, body: dict[str, Any], head: str, alt: str) -> list[confidence.Token] | None:
        """One alternative's tokens: the answer so far as an assistant prefill, a grammar admitting only ``alt``."""
        from localllm.grammar.compile import gbnf_literal

        constrained = ("grammar", "response_format", "json_schema", "logprobs", "top_logprobs")
        forced = {k: v for k, v in body.items() if k not in constrained}
        forced["messages"] = [*body["messages"], {"role": "assistant", "content": head}]
        forced.update(
            grammar="root ::= " + gbnf_literal(alt),
            logprobs=True,
            top_logprobs=1,
            max_tokens=len(alt.encode("utf-8")) + 4,
            temperature=0.0,
        )
        reply = post(forced)
        if reply.status_code >= 400:
            return None
        try:
            return confidence.parse_logprobs(reply.json())
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than json decodes
            return None

    def _wants_logprobs(self, schema: dict[str, Any] | None) -> bool:
        """Whether this request asks for token probabilities (a schema with a choice field)."""
        if schema is None or self.decl.confidence != "logprobs" or self._logprobs_refused:
            return False
        key = json.dumps(schema, sort_keys=True)
        if key not in self._choice_cache:
            self._choice_cache[key] = confidence.has_choice_fields(schema)
        return self._choice_cache[key]

    def _headers(self) -> dict[str, str]:
        name = self.decl.api_key_env
        if not name:
            return {}
        key = settings.env_value(name)
        if not key:
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"api_key_env {name} is not set; export {name}=<key> (no request was made)",
                alias=self.alias,
            )
        issue = _http.token_issue(key)
        if issue:
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"api_key_env {name}: its value {issue} (no request was made)",
                hint=f"export {name} again with the key alone",
                alias=self.alias,
            )
        return {"Authorization": f"Bearer {key}"}

    def ask(self, request: AskRequest, *, deadline: float) -> AskResponse:
        import httpx

        self._import_jsonschema()

        own_headers = self._headers()
        first = self._joined_target()
        base = first.base_url  # the negotiated-style key; errors name the target that failed
        answered = [first]  # the target that gave the last answer (a retry may change it)
        retries = [0]

        def post(body: dict[str, Any]) -> Any:
            attempts: list[Target] = []

            def send(target: Target) -> Any:
                attempts.append(target)
                remaining = self.remaining(deadline)
                if remaining <= 0:
                    raise AgentError(
                        ErrorKind.DEADLINE_EXCEEDED, "deadline passed before the request", alias=self.alias
                    )
                timeout = httpx.Timeout(remaining, connect=min(_CONNECT_TIMEOUT, remaining))
                sent = body if target.model is None else {**body, "model": target.model}
                headers = {**own_headers, **target.headers()}
                return self._http().post(target.url(_CHAT_PATH), json=sent, headers=headers, timeout=timeout)

            # one failure rule for every upstream (managed.upstream): a broken connection to a
            # sidecar or a service is retried once on a fresh resolution; an endpoint never is
            with map_httpx_errors(lambda reason, exc: self._failed(reason, exc, attempts)):
                try:
                    reply, answered[0] = self.upstream.call(send, reset=self._drop_connections)
                except (FetchError, SidecarError, ServiceError, ValueError) as exc:  # the respawn failed
                    raise self._start_failed(exc) from exc
            retries[0] += len(attempts) - 1
            moved = redirected(reply.status_code, reply.headers.get("location"), str(reply.request.url))
            if moved is not None:
                raise AgentError(ErrorKind.TRANSPORT_ERROR, moved, hint=REDIRECT_HINT, alias=self.alias)
            return reply

        def probe() -> tuple[int, Any]:
            reply = post(structured.probe_body(self.decl.model or "local"))
            if reply.status_code >= 400:
                upstream = read_error(reply.status_code, reply.text)
                if upstream.auth:
                    raise self._upstream_error(upstream, f"{base}/chat/completions")
                return reply.status_code, None
            with contextlib.suppress(ValueError, RecursionError):
                return reply.status_code, reply.json()
            return reply.status_code, None

        negotiated: structured.Negotiated | None = None
        probed = False
        style = self.style()
        if style is None and request.schema is not None:
            negotiated, probed = self.styles.get(base, probe, compiles=self.decl.grammar is True)
            style = negotiated.style
        body, grammar, native, ran = self.build_body(request, style)
        self._check_context(body, first, own_headers)
        started = time.monotonic()
        with self._one_at_a_time:  # reproducible: never batched with this agent's other calls
            reply = post(body)
        if reply.status_code >= 400 and negotiated is not None and not negotiated.verified:
            upstream = read_error(reply.status_code, reply.text)
            if not upstream.auth and reply.status_code not in (429, 502, 503, 504):
                # the guessed style (json_object after a rejected probe) is rejected too: unconstrained
                negotiated = self.styles.demote(base, reply.status_code)
                body, grammar, native, ran = self.build_body(request, negotiated.style)
                reply = post(body)
                if reply.status_code >= 400:  # not about the style (a gateway whose upstream is down)
                    self.styles.forget(base)
        elif reply.status_code < 400 and negotiated is not None and not negotiated.verified:
            self.styles.confirm(base)
        if reply.status_code == 400 and body.get("logprobs"):
            # an OpenAI-compatible server that refuses logprobs (llama-server and vLLM take
            # them): answer without confidence rather than fail, and stop asking
            retry = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
            second = post(retry)
            if second.status_code < 400:
                self._logprobs_refused = True
                reply, body = second, retry
        elapsed_ms = int((time.monotonic() - started) * 1000)
        if reply.status_code >= 400:
            raise self._upstream_error(read_error(reply.status_code, reply.text), f"{base}/chat/completions")
        try:
            data = reply.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"unusable response (no choices[0].message.content): {truncate_detail(reply.text)}",
                alias=self.alias,
            ) from exc
        if not isinstance(content, str):
            raise AgentError(ErrorKind.TRANSPORT_ERROR, "choices[0].message.content is not text", alias=self.alias)
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}  # an endpoint's "n/a" is no usage
        choice = data["choices"][0]
        meta: dict[str, Any] = {
            **self._model_meta(data),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "finish_reason": choice.get("finish_reason") if isinstance(choice, dict) else None,
            "max_tokens": body["max_tokens"],
            # §9: whether the grammar constraint was applied (a boolean); what applied it beside
            "grammar": grammar != "none",
            "grammar_source": grammar,
            "json_schema": native,
            "structured_output": ran,
        }
        if probed and negotiated is not None:
            meta["structured_probe"] = negotiated.as_meta()
        if retries[0]:  # a broken connection, retried once on a fresh resolution (managed.upstream)
            meta["upstream_retries"] = retries[0]
        if grammar == "relaxed":  # what the grammar left to validation
            relaxed = self._relaxed(request.schema or {})
            meta["grammar_relaxed"] = [f"{r.path} {r.construct}" for r in relaxed.dropped] if relaxed else []
        if self.managed:
            meta["served_by"] = answered[0].route.value  # "service" or "sidecar"
            if grammar != "none":  # did this server pass the grammar canary at its start?
                meta["grammar_enforced"] = self._grammar_enforced(reply, answered[0])
                if meta["grammar_enforced"] is False:  # a server that ignores grammars: fail-open
                    meta["grammar"] = False
        timings = data.get("timings")
        if isinstance(timings, dict):  # llama.cpp: how much of the prompt came from its cache
            meta["timings"] = timings
            meta["cache_n"] = timings.get("cache_n")
            meta["prompt_n"] = timings.get("prompt_n")
        if self.decl.confidence == "off":
            meta.update(confidence=None, confidence_method="off")
        elif self.decl.confidence == "score":
            scored_ms = time.monotonic()
            measured = confidence.score_alternatives(
                request.schema, strip_fence(content), lambda head, alt: self._score(post, body, head, alt)
            )
            meta.update(measured.as_meta(), confidence_ms=int((time.monotonic() - scored_ms) * 1000))
        else:
            tokens = confidence.parse_logprobs(data) if body.get("logprobs") else None
            meta.update(confidence.measure(request.schema, strip_fence(content), tokens).as_meta())
        sent_model = answered[0].model or body["model"]
        transcript = self._transcript({**body, "model": sent_model}, content, usage, elapsed_ms)
        return AskResponse(submission=strip_fence(content), meta=meta, transcript=transcript)

    def _check_context(self, body: dict[str, Any], target: Target, headers: dict[str, str]) -> None:
        """A prompt past the context of the own server (its ``GET /props``, asked once) is a
        ``transport_error`` before the server is asked: llama.cpp's tokenizer would spend time
        growing with the square of its special-token pieces (80 KB of ``"a\\n"``: 13 s) before
        refusing it (:mod:`localllm.managed.vocab`). A service or an endpoint checks its own; a
        prompt within :data:`~localllm.managed.vocab.QUICK_BYTES` is not counted."""
        if target.route is not Route.SIDECAR:
            return
        import httpx

        from localllm.managed import vocab

        texts, _ = vocab.message_texts(body.get("messages"))
        if sum(len(t) for t in texts) <= vocab.QUICK_BYTES:  # characters: at most as many bytes
            return
        if target.base_url not in self._contexts:
            try:
                props = self._http().get(target.url("/props"), headers={**headers, **target.headers()}, timeout=5.0)
                known = vocab.from_props(props.json()) if props.status_code == 200 else None
            except (httpx.HTTPError, ValueError, RecursionError):  # a server that cannot say: not checked
                known = None
            self._contexts[target.base_url] = known
        known = self._contexts[target.base_url]
        if known is None:
            return
        found = known[0].tokens(texts, known[1], vocab.SLACK)
        if found > known[1]:
            raise AgentError(
                ErrorKind.TRANSPORT_ERROR,
                f"the prompt holds at least {found} tokens, past the context of {known[1]} tokens per slot "
                f"of {self.decl.model}'s server (counted before it was asked)",
                hint="shorten the prompt (or its args), or raise ctx_size",
                alias=self.alias,
                meta={"context": known[1], "prompt_tokens_at_least": found},
            )

    def _grammar_enforced(self, reply: Any, target: Target) -> bool | None:
        if target.route is not Route.SERVICE:
            server = self._server
            return server.grammar_enforced if server is not None else None
        from localllm.managed.server import GRAMMAR_HEADER

        verdict = reply.headers.get(GRAMMAR_HEADER)  # the service relays its server's canary
        return {"true": True, "false": False}.get(verdict or "")

    def _failed(self, reason: str, exc: BaseException, attempts: list[Target]) -> AgentError:
        """A request that got no answer, as an AgentError naming the target that failed last."""
        import httpx

        target = attempts[-1]
        meta = {"route": target.route.value, "upstream_retries": len(attempts) - 1}
        if isinstance(exc, httpx.TimeoutException):
            detail = f"no answer from {target.base_url} in time ({reason})"
            return AgentError(ErrorKind.DEADLINE_EXCEEDED, detail, alias=self.alias, meta=meta)
        retried = "; retried once on a fresh connection" if len(attempts) > 1 else ""
        if target.route is Route.SERVICE:  # the service went away: the next call looks again, then spawns
            detail = f"the localllm service (pid {target.pid}) failed mid-call: {reason} ({type(exc).__name__}: {exc})"
            return AgentError(ErrorKind.TRANSPORT_ERROR, detail + retried, alias=self.alias, meta=meta)
        hint = ""
        if reason == CONNECTION_REFUSED and target.route is Route.ENDPOINT:
            hint = (
                f"nothing listens at {target.base_url}: start the server there, "
                f"or fix agent_plugins.{self.alias}.endpoint"
            )
        detail = self._connection_detail(target, reason, exc) + retried
        return AgentError(ErrorKind.TRANSPORT_ERROR, detail, hint=hint, alias=self.alias, meta=meta)

    def _upstream_error(self, upstream: UpstreamError, where: str) -> AgentError:
        """An error reply as an AgentError: status and message; a refused key names api_key_env."""
        if upstream.constraint_broken:  # the model's answer, refused by the server's own check
            return AgentError(
                ErrorKind.SCHEMA_INVALID,
                upstream.describe(where),
                alias=self.alias,
                hint="the answer broke the grammar the server enforced; the fallback answers",
            )
        hint = upstream.auth_hint(self.decl.api_key_env) if upstream.auth else ""
        return AgentError(ErrorKind.TRANSPORT_ERROR, upstream.describe(where), hint=hint, alias=self.alias)

    def _model_meta(self, data: dict[str, Any]) -> dict[str, Any]:
        """``model`` as an id (a managed server reports its GGUF path), plus the pinned GGUF's sha256."""
        if not self.managed:
            return {"model": data.get("model") or self.decl.model or "local"}
        if self._pinned_meta is None:
            model = self.decl.model or "local"
            self._pinned_meta = {"model": Path(model).name if model.endswith(".gguf") else model}
            if not model.endswith(".gguf"):
                from localllm.managed.pins import load_pins

                with contextlib.suppress(FetchError):
                    sha256 = load_pins().model(model).artifact.sha256
                    if sha256:
                        self._pinned_meta["model_sha256"] = sha256
        return dict(self._pinned_meta)

    def _connection_detail(self, target: Target, reason: str, exc: BaseException) -> str:
        detail = f"request to {target.base_url} failed: {reason} ({type(exc).__name__}: {exc})"
        server = self._server
        if server is None or target.route is not Route.SIDECAR:
            return detail
        server.settle(_EXIT_SETTLE)  # so the caller learns why, not just that the connection broke
        crash = server.crash_detail(pid=target.pid)
        if crash:
            detail += f"; llama-server died ({crash}); it is respawned on the next call"
        return detail

    @staticmethod
    def _transcript(body: dict[str, Any], content: str, usage: dict[str, Any], elapsed_ms: int) -> Transcript:
        """The ``openai-chat`` transcript: request, assistant message, result (REFERENCE-NOTES)."""

        def line(obj: dict[str, Any]) -> str:
            return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

        prompt = body["messages"][-1]["content"]
        lines = [
            line({"message": {"content": prompt, "role": "user"}, "model": body["model"], "type": "request"}),
            line({"message": {"content": content, "role": "assistant"}, "type": "assistant"}),
            line(
                {
                    "result": content,
                    "type": "result",
                    "usage": {
                        "input_tokens": usage.get("prompt_tokens", 0),
                        "output_tokens": usage.get("completion_tokens", 0),
                    },
                }
            ),
        ]
        return Transcript(format="openai-chat", lines=lines, offsets_ms=[0, elapsed_ms, elapsed_ms])

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop the managed server; a first-use download in progress is cancelled."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            starter = self._starter
        if client is not None:
            client.close()
        self.upstream.close()  # refuses later resolutions, cancels a download in progress
        if starter is not None:
            # a prepare(wait=False) that had not made its server yet finds the upstream
            # closed; one that had is cancelled by the stop above (or stopped here). Bounded:
            # a start wedged in a blocking call must not wedge close() (the thread is a daemon).
            starter.join(5.0)
            self.upstream.stop()
