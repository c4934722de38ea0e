"""Both corpora against the real llama-server: our compiled grammar, and the truth about its converter.

One llama-server (gemma-3-270m, ``SLOTS`` slots of 1,024 tokens) serves the module.

- **Compiled grammars**: every schema that compiles exactly is sent as the request's
  ``grammar`` (one test each); the server must accept it (our GBNF parses in the real
  engine), and an answer that ends with ``stop`` must be schema-valid. Answers cut by
  ``max_tokens`` are not validated. The requests of the selected tests are sent ahead, one
  per slot, in test order, and each test checks its own reply: the server decodes the slots
  as one batch (four at once take 0.77x the time of one after another on 2 cores).
- **The checker vs llama.cpp's converter**: for every schema, the server's own grammar (the
  ``generation_settings.grammar`` that ``/completion`` with ``json_schema`` reports) is
  walked 1,000 times and validated: the truth is "enforced" when no walk is invalid
  (against the structural part for a warning-only verdict) and "not enforced" when a walk
  is invalid, a directed probe gets through (a schema literal or a one-edit mutation of a
  walk that the grammar admits although it is invalid, or not JSON), or the request is
  refused. The checker must have no false accepts and false rejects at most 2% of its
  rejections; the confusion matrix is printed. The judging is pure Python (~9 min on one
  core on a slow day): it runs in one worker process per core (``grammar_truth.judge``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.grammar import compile_schema
from tests.e2e.grammar_truth import judge
from tests.e2e.test_grammar_corpus_e2e import Server, serving
from tests.unit.grammar_harness import corpus, realworld, validator

pytestmark = pytest.mark.e2e

ENTRIES = list(corpus()) + list(realworld())
MAX_TOKENS = 192
SLOTS = 4  # requests in flight at once


# One client for every request, built once: it never reads os.environ (trust_env=False), so
# the pool threads that outlive a test cannot iterate the environment while the per-test
# ``isolate`` fixture rewrites it (a KeyError in CI: httpx.post reads proxies per call).
CLIENT = httpx.Client(trust_env=False, timeout=httpx.Timeout(10.0, read=540.0))


def _post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return CLIENT.post(base + path, json=body)


COMPILED = [(name, schema, g) for name, schema in ENTRIES if (g := compile_schema(schema).grammar) is not None]


@pytest.fixture(scope="module", autouse=True)
def _close_client() -> Iterator[None]:
    yield
    CLIENT.close()


@pytest.fixture(scope="module")
def server(server_bin: Path, chat_gguf: Path) -> Iterator[Server]:
    with serving(server_bin, chat_gguf, slots=SLOTS) as srv:
        yield srv


def _answer(srv: Server, schema: Any, grammar: str) -> httpx.Response:
    # the schema as a hint, cut so prompt + answer fit one slot (1024 tokens): the grammar
    # enforces it; a schema that tokenizes densely gets a shorter hint
    hint = json.dumps(schema, separators=(",", ":"))
    for cut in (1500, 300):
        reply = _post(
            srv.base,
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "Reply with a JSON value matching this JSON Schema:\n" + hint[:cut]}
                ],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "grammar": grammar,
            },
        )
        if "exceed_context_size" not in reply.text:
            break
    return reply


@pytest.fixture(scope="module")
def answers(server: Server, request: pytest.FixtureRequest) -> Iterator[dict[str, Future[httpx.Response]]]:
    """The reply to each selected compiled-grammar test's request, sent ahead in test order."""
    compiled = {name: (schema, grammar) for name, schema, grammar in COMPILED}
    selected = [
        str(item.callspec.params["name"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == test_compiled_grammar_is_accepted_and_the_answer_validates.__name__
    ]
    with ThreadPoolExecutor(SLOTS, thread_name_prefix="grammar-e2e") as pool:
        yield {name: pool.submit(_answer, server, *compiled[name]) for name in selected}
        pool.shutdown(cancel_futures=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "schema", "grammar"), COMPILED, ids=[n for n, _, _ in COMPILED])
def test_compiled_grammar_is_accepted_and_the_answer_validates(
    answers: dict[str, Future[httpx.Response]],
    name: str,
    schema: Any,
    grammar: str,
) -> None:
    reply = answers[name].result()
    assert reply.status_code == 200, f"{name}: the server refused our grammar: {reply.text[:300]}"
    choice = reply.json()["choices"][0]
    if choice["finish_reason"] != "stop":
        return  # cut at max_tokens: a prefix of a valid answer, nothing to validate
    content = choice["message"]["content"]
    assert validator(schema).is_valid(json.loads(content)), f"{name}: invalid answer {content[:300]!r}"


def test_a_request_from_a_pool_thread_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class Rewritten(dict[str, str]):  # an environment another thread is rewriting
        def __iter__(self) -> Iterator[str]:
            raise KeyError("XDG_CACHE_HOME")

        def items(self) -> Any:
            raise KeyError("XDG_CACHE_HOME")

    monkeypatch.setattr(os, "environ", Rewritten(os.environ))
    with pytest.raises(httpx.ConnectError):  # nothing listens on port 9: the request went out
        _post("http://127.0.0.1:9", "/completion", {})


@pytest.mark.timeout(1800)
def test_checker_matches_the_server_converter(server: Server) -> None:
    def server_grammar(schema: Any) -> str | None:
        reply = _post(server.base, "/completion", {"prompt": "x", "n_predict": 1, "json_schema": schema})
        return str(reply.json()["generation_settings"]["grammar"]) if reply.status_code == 200 else None

    # the server's grammars, one request per slot in flight; then the judging (pure Python,
    # ~9 min on one core) spread over every core
    schemas = [schema for _, schema in ENTRIES]
    with ThreadPoolExecutor(SLOTS, thread_name_prefix="converter") as pool:
        grammars = list(pool.map(server_grammar, schemas))
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")) as workers:
        verdicts = list(workers.map(judge, schemas, grammars))
    matrix = {"accept/enforced": 0, "accept/not": 0, "reject/not": 0, "reject/enforced": 0}
    false_accepts: list[str] = []
    false_rejects: list[str] = []
    for (name, _), (accepts, enforced) in zip(ENTRIES, verdicts, strict=True):
        key = f"{'accept' if accepts else 'reject'}/{'enforced' if enforced else 'not'}"
        matrix[key] += 1
        if accepts and not enforced:
            false_accepts.append(name)
        if not accepts and enforced:
            false_rejects.append(name)
    total = sum(matrix.values())
    agree = matrix["accept/enforced"] + matrix["reject/not"]
    rejections = matrix["reject/not"] + matrix["reject/enforced"]
    print(
        f"\nchecker vs llama.cpp's converter on {total} schemas: {matrix}; agreement {agree / total:.1%}; "
        f"false rejects {len(false_rejects)}/{rejections}: {false_rejects}; false accepts: {false_accepts}"
    )
    assert false_accepts == []
    assert len(false_rejects) <= 0.02 * rejections, false_rejects
