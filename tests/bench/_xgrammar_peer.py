"""XGrammar as a peer of ``bench_grammar.py``, run in its own venv (``make bench-peers``).

XGrammar's wheel declares torch, transformers and triton, and its ``__init__`` imports torch and
transformers, so it cannot sit in the project venv. ``bench_grammar.py`` runs this file with the
venv's interpreter (``~/.cache/localllm-e2e/venvs/xgrammar-<version>``: xgrammar without deps,
the CPU build of torch, transformers, apache-tvm-ffi, numpy, pydantic): stdlib and xgrammar only.

Input on stdin, one JSON object a line: ``{"schema": ..., "texts": ["<compact JSON>", ...]}``.
Output on stdout, one JSON object a line in the same order:
``{"ok": bool, "error": str|null, "seconds": float, "admitted": [bool|null, ...]}``.

- compile: ``Grammar.from_json_schema`` with XGrammar's defaults (any whitespace, strict mode:
  no properties or items the schema does not name), timed alone; then ``GrammarCompiler.
  compile_grammar`` against a byte-level vocabulary (the 256 single bytes plus one stop token),
  outside the timing. An exception in either is a refusal named by its type.
- admit: a fresh ``GrammarMatcher`` per text; ``accept_string`` of the whole text, then the stop
  token: admitted when both are accepted (the grammar may end there). With single-byte tokens
  the matcher checks the grammar itself, not a tokenizer's view of it.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from typing import Any

import xgrammar

STOP = 256


def main() -> int:
    vocab = [bytes([i]) for i in range(256)] + [b"</s>"]
    info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, stop_token_ids=[STOP])
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    print(json.dumps({"version": importlib.metadata.version("xgrammar")}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        out: dict[str, Any] = {"ok": False, "error": None, "seconds": 0.0, "admitted": []}
        start = time.perf_counter()
        try:
            grammar = xgrammar.Grammar.from_json_schema(json.dumps(job["schema"]))
            out["seconds"] = time.perf_counter() - start
            compiled = compiler.compile_grammar(grammar)
        except Exception as exc:  # any failure is a refusal, named by its type
            out["seconds"] = out["seconds"] or time.perf_counter() - start
            out["error"] = type(exc).__name__
            print(json.dumps(out), flush=True)
            continue
        out["ok"] = True
        for text in job["texts"]:
            matcher = xgrammar.GrammarMatcher(compiled)
            try:
                ok = bool(matcher.accept_string(text)) and bool(matcher.accept_token(STOP)) and matcher.is_terminated()
            except Exception:  # the matcher could not read it: no verdict
                out["admitted"].append(None)
                continue
            out["admitted"].append(ok)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
