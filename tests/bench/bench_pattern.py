"""Benchmark: schema ``pattern`` matching, localllm's linear-time matcher against ``re``, in one run.

    python tests/bench/bench_pattern.py [--rounds 5] [--smoke]

Two tables. *Everyday patterns*: the 190-odd patterns of the schema corpora
(``grammar/corpus``, ``grammar/realworld``, the JSONSchemaBench sample), each searched in
short texts (probes and strings of the pattern's own characters), timed per search with both
engines warm (``re``'s compiled-pattern cache and localllm's lazy DFA), and one whole answer
validation (an object with six patterned strings) by jsonschema's own validator against the
one localllm builds (``validator_class``). *Near misses*:
``^(a+)+$`` against ``"a" * n + "!"``, where ``re`` doubles its time per character. Prints
both and writes ``tests/bench/results/pattern.json``. Not a test: no asserts on speed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from localllm.grammar.pattern import ecma_regex, search  # noqa: E402
from tests.bench._provenance import provenance, results_path  # noqa: E402
from tests.unit.test_pattern import _corpus_patterns  # noqa: E402

PROBES = ["", "a", "abc", "ABC-123", "2024-01-31", "user@example.com", "https://x.org/a?b=1", " x ", "é٣"]


def workload(seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for pattern in sorted(_corpus_patterns()):
        try:
            re.compile(pattern)
        except re.error:
            continue
        own = [c for c in pattern if c.isprintable()] or ["a"]
        texts = PROBES + ["".join(rng.choice(own) for _ in range(rng.randint(1, 24))) for _ in range(10)]
        pairs += [(pattern, text) for text in texts]
    return pairs


def per_search_us(pairs: list[tuple[str, str]], engine: Any, rounds: int) -> float:
    for pattern, text in pairs:  # warm: both engines cache per pattern
        engine(pattern, text)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for pattern, text in pairs:
            engine(pattern, text)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / len(pairs) * 1e6


SCHEMA = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "pattern": r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$"},
        "phone": {"type": "string", "pattern": r"^\+?[0-9 ()-]{7,20}$"},
        "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"}},
    },
    "required": ["email", "id"],
}
ANSWER = {"email": "jane.doe@example.com", "phone": "+1 (555) 123-4567", "id": "ABC-1234", "tags": ["a", "b-2", "c"]}


def validation_us(cls: Any, n: int) -> float:
    validator = cls(SCHEMA)
    assert not list(validator.iter_errors(ANSWER))
    start = time.perf_counter()
    for _ in range(n):
        list(validator.iter_errors(ANSWER))
    return (time.perf_counter() - start) / n * 1e6


def near_miss(n: int) -> dict[str, float]:
    text = "a" * n + "!"
    start = time.perf_counter()
    assert re.search("^(a+)+$", text) is None
    middle = time.perf_counter()
    assert not search("^(a+)+$", text)
    return {"n": n, "re_ms": (middle - start) * 1e3, "localllm_ms": (time.perf_counter() - middle) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed passes over the everyday workload")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: 1 round, near misses up to 14 (results to a temp file)"
    )
    args = parser.parse_args(argv)
    rounds, sizes = (1, [10, 14]) if args.smoke else (args.rounds, [16, 18, 20, 22])
    pairs = workload()
    # the verdicts of re on the same (ECMA-262) reading of each pattern; the timing is re's own
    verdicts_agree = all(search(p, t) == (ecma_regex(p).search(t) is not None) for p, t in pairs)
    ours = per_search_us(pairs, search, rounds)
    theirs = per_search_us(pairs, re.search, rounds)
    print(
        f"everyday: {len(pairs):,} searches over {len({p for p, _ in pairs})} corpus patterns, verdicts agree: {verdicts_agree}"
    )
    print(f"{'engine':>10}  {'µs/search':>9}")
    print(f"{'re':>10}  {theirs:>9.2f}\n{'localllm':>10}  {ours:>9.2f}   ({ours / theirs:.2f}× re)")
    import jsonschema

    from localllm.grammar.compile import validator_class

    count = 50 if args.smoke else 2000
    stock, linear = validation_us(jsonschema.Draft202012Validator, count), validation_us(validator_class(SCHEMA), count)
    print(f"answer validation: jsonschema {stock:.1f} µs, localllm {linear:.1f} µs ({linear - stock:+.1f} µs)")
    rows = [near_miss(n) for n in sizes]
    print(f"\n^(a+)+$ vs 'a'*n+'!'\n{'n':>4}  {'re ms':>9}  {'localllm ms':>11}")
    for row in rows:
        print(f"{row['n']:>4}  {row['re_ms']:>9.1f}  {row['localllm_ms']:>11.2f}")
    out = results_path("pattern", smoke=args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    everyday = {"searches": len(pairs), "verdicts_agree": verdicts_agree, "re_us": theirs, "localllm_us": ours}
    everyday |= {"validation_jsonschema_us": stock, "validation_localllm_us": linear}
    out.write_text(
        json.dumps({**provenance(smoke=args.smoke), "everyday": everyday, "near_miss": rows}, indent=2) + "\n"
    )
    print(f"wrote {out}")
    return 0 if verdicts_agree else 1


if __name__ == "__main__":
    sys.exit(main())
