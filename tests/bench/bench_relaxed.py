"""Benchmark: the relaxed grammar vs no constraint, side by side on the real llama-server + gemma-3-270m.

    python tests/bench/bench_relaxed.py [--smoke] [--tickets N] [--json OUT]

Schemas with unique strings (``uniqueItems`` over an open domain): localllm's compiler
refuses them and llama.cpp's converter drops ``uniqueItems``, so until ``d909142`` such an
answer went out with no constraint at all (``grammar_source: none``); now the relaxed grammar
(``localllm/grammar/relax.py``: the schema without ``uniqueItems``) holds it. Two arms that
differ only in ``grammar:`` — ``true`` (the relaxed grammar) and ``false`` (nothing sent: what
``true`` did before) — each with its own sidecar, both up for the whole run; every ticket of
``examples/demo/evals/triage/cases.jsonl`` goes to both in alternating order, once per schema,
through the agent's ``ask`` (``extract``, temperature 0, the schema statement in the prompt,
no fallback). Per arm and schema: answers that parse as JSON, that are valid, that would be
valid but for ``uniqueItems`` (what the relaxed grammar guarantees), cut by ``max_tokens``;
completion tokens and latency.

A third schema, ``words`` (a summary of at most 12 words, ``maxLength`` 100, and a boolean),
measures which keyword the relaxed grammar drops: their product is words × characters
states, past the compiler's limit, so one of the two goes. Its arms: ``relaxed`` (today's:
the ``maxLength`` goes, the word count stays in the grammar, each run of the pattern capped at
the 100 characters), ``runs uncapped`` (what the relaxed grammar did before the cap: the
schema without its ``maxLength``, so one "word" may run on until ``max_tokens``) and
``pattern dropped`` (what it did before ``51aef70``: the schema without its pattern, compiled
exactly, the word count left to validation), all on the ``grammar: true`` sidecar.

Prints one table per schema and writes ``tests/bench/results/relaxed.json``. Not a test: no asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm import Runtime  # noqa: E402
from localllm.grammar.compile import validator_class  # noqa: E402
from localllm.grammar.relax import relax  # noqa: E402
from localllm.wire import AskRequest  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.bench.bench_local_llm import ALIAS, loadavg, other_servers, pct, prepare, with_agent  # noqa: E402
from tests.bench.bench_structured import _fmt, tickets  # noqa: E402

#: the sidecars: ``grammar:`` true and false
MODES = {"relaxed": True, "none": False}


def _tags(words: int) -> dict[str, Any]:
    item = {"type": "string", "minLength": 2, "maxLength": 20}
    return {"type": "array", "items": item, "minItems": 1, "maxItems": words, "uniqueItems": True}


SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "tags": (
        "Tag this support ticket with up to 3 short keywords and rate its severity from 1 (minor) to 5 (critical).",
        {
            "type": "object",
            "properties": {"tags": _tags(3), "severity": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["tags", "severity"],
            "additionalProperties": False,
        },
    ),
    "triage": (
        "Triage this support ticket: the teams that should see it, whether it is urgent, and a one-line summary.",
        {
            "type": "object",
            "properties": {
                "teams": {**_tags(2), "items": {"enum": ["billing", "engineering", "product", "support"]}},
                "mentions": _tags(4),
                "urgent": {"type": "boolean"},
                "summary": {"type": "string", "maxLength": 80},
            },
            "required": ["mentions", "urgent", "summary"],
            "additionalProperties": False,
        },
    ),
    "words": (
        "Summarise this support ticket in at most 12 words and say whether it is urgent.",
        {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "pattern": "^(?:\\S+\\s+){0,11}\\S+$", "maxLength": 100},
                "urgent": {"type": "boolean"},
            },
            "required": ["summary", "urgent"],
            "additionalProperties": False,
        },
    ),
}


def _summary_without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    summary = {k: v for k, v in schema["properties"]["summary"].items() if k != key}
    return {**schema, "properties": {**schema["properties"], "summary": summary}}


def arms(name: str, schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per arm of a schema: the sidecar (a key of MODES) and the schema sent."""
    if name == "words":
        return {
            "relaxed": ("relaxed", schema),
            "runs uncapped": ("relaxed", _summary_without(schema, "maxLength")),
            "pattern dropped": ("relaxed", _summary_without(schema, "pattern")),
        }
    return {"relaxed": ("relaxed", schema), "none": ("none", schema)}


def validators(schema: dict[str, Any]) -> tuple[Any, Any]:
    """The schema's validator and its relaxed schema's (valid but for what the relaxed grammar drops)."""
    relaxed = relax(schema)
    assert relaxed is not None, "the bench's schemas are ones the compiler refuses and relax takes"
    cls = validator_class(schema)
    return cls(schema), cls(relaxed.schema)


def ask(runtime: Runtime, schema: dict[str, Any], prompt: str, checks: tuple[Any, Any]) -> dict[str, Any]:
    """One extract through the agent (no validation, no fallback): the raw answer, classified."""
    agent = runtime.agent(ALIAS)
    request = AskRequest(
        session_id="bench",
        turn=1,
        state_path="relaxed",
        verb="extract",
        prompt=prompt,
        call_id="0" * 16,
        deadline="2099-01-01T00:00:00.000000000Z",
        schema=schema,
    )
    started = time.perf_counter()
    response = agent.ask(request, deadline=time.monotonic() + 300)
    wall = time.perf_counter() - started
    meta = response.meta or {}
    try:
        value = json.loads(response.submission or "")
        parsed = True
    except ValueError:
        value, parsed = None, False
    full, loose = checks
    return {
        "wall": wall,
        "parsed": parsed,
        "valid": parsed and full.is_valid(value),
        "valid_but_dropped": parsed and loose.is_valid(value),
        "cut": meta.get("finish_reason") == "length",
        "completion_tokens": meta.get("completion_tokens"),
        "grammar_source": meta.get("grammar_source"),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [r["completion_tokens"] for r in rows if isinstance(r["completion_tokens"], int)]
    return {
        "answers": len(rows),
        "grammar_source": sorted({str(r["grammar_source"]) for r in rows}),
        "parsed": sum(r["parsed"] for r in rows),
        "valid": sum(r["valid"] for r in rows),
        "valid_but_dropped": sum(r["valid_but_dropped"] for r in rows),
        "cut_by_max_tokens": sum(r["cut"] for r in rows),
        "completion_tokens_mean": statistics.fmean(tokens) if tokens else None,
        "latency_ms_p50": pct([r["wall"] for r in rows], 50) * 1000,
    }


KEYS = ("parsed", "valid", "valid_but_dropped", "cut_by_max_tokens", "completion_tokens_mean", "latency_ms_p50")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CI: 2 tickets (results to a temp file)")
    parser.add_argument("--tickets", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    n = 2 if args.smoke else args.tickets
    out = args.json or results_path("relaxed", smoke=args.smoke)
    config, install, model = prepare()
    texts = tickets(n)
    base = with_agent(config, fallback="none", schema_in_prompt=True, temperature=0.0, max_tokens=128)
    runtimes = {key: Runtime(with_agent(base, grammar=mode)) for key, mode in MODES.items()}
    plan = {name: arms(name, schema) for name, (_, schema) in SCHEMAS.items()}
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {s: {arm: [] for arm in plan[s]} for s in SCHEMAS}
    checks = {name: validators(schema) for name, (_, schema) in SCHEMAS.items()}
    try:
        for runtime in runtimes.values():  # start both sidecars
            runtime.agent(ALIAS).prepare()
        for i, ticket in enumerate(texts):
            for name, (task, _) in SCHEMAS.items():
                order = list(plan[name].items())
                for arm, (key, sent) in order if i % 2 == 0 else reversed(order):
                    rows[name][arm].append(ask(runtimes[key], sent, f"{task}\n\nTicket: {ticket}", checks[name]))
    finally:
        for runtime in runtimes.values():
            runtime.close()
    result: dict[str, Any] = {**provenance(smoke=args.smoke), "tickets": n}
    for name in SCHEMAS:
        result[name] = {arm: summarise(rows[name][arm]) for arm in plan[name]}
    result["machine"] = {
        "loadavg": loadavg(),
        "other_llama_servers": other_servers(),
        "server": str(install.binary),
        "model": str(model),
    }
    for name in SCHEMAS:
        print(f"\n{name} ({n} tickets): {'measure':24}" + "".join(f"{arm:>16}" for arm in plan[name]))
        for key in KEYS:
            cells = "".join(f"{_fmt(result[name][arm][key]):>16}" for arm in plan[name])
            print(f"{' ' * len(name)}               {key:24}{cells}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
