"""llama.cpp's whole-vocabulary grammar pass, timed per position (``bench_grammar_decode.py --engine-pass``).

Runs in the llama-cpp-python 0.3.36 venv of ``make e2e-endpoints`` (its ``llama_cpp`` bindings
to the same vendored llama.cpp as the pinned llama-server): stdlib and ``llama_cpp`` only.
argv: the GGUF (its vocabulary only is loaded) and the repetitions per position. Input on
stdin, one JSON object a line: ``{"id": str, "text": str, "grammars": {name: gbnf}}``; output
one line each: ``{"id", "tokens", name: {"sum_ms", "max_ms", "per_pos"}}``.

For each grammar: a grammar sampler over the model's vocabulary; at each token of ``text``
(tokenized by the model, no special tokens) the time of ``llama_sampler_apply`` over every
token of the vocabulary (the pass llama-server runs when the grammar refuses the model's
choice), best of the repetitions, then the token is accepted. ``text`` must be a prefix of a
string both grammars admit.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

import llama_cpp as ll  # type: ignore[import-not-found]


def main() -> int:
    model_path, reps = sys.argv[1], int(sys.argv[2])
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(model_path.encode(), params)
    vocab = ll.llama_model_get_vocab(model)
    n = ll.llama_vocab_n_tokens(vocab)
    data_type = ll.llama_token_data * n
    pristine = data_type()
    for i in range(n):
        pristine[i].id = i
        pristine[i].logit = 0.0
        pristine[i].p = 0.0
    work = data_type()
    size = ctypes.sizeof(data_type)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        raw = job["text"].encode()
        buf = (ll.llama_token * 4096)()
        count = ll.llama_tokenize(vocab, raw, len(raw), buf, 4096, False, False)
        tokens = list(buf[: max(count, 0)])
        out: dict[str, Any] = {"id": job["id"], "tokens": len(tokens)}
        for name, grammar in job["grammars"].items():
            sampler = ll.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            times = []
            for token in tokens:
                best = float("inf")
                for _ in range(reps):
                    ctypes.memmove(work, pristine, size)
                    arr = ll.llama_token_data_array(work, n, -1, False)
                    start = time.perf_counter()
                    ll.llama_sampler_apply(sampler, ctypes.byref(arr))
                    best = min(best, time.perf_counter() - start)
                times.append(best * 1000)
                ll.llama_sampler_accept(sampler, token)
            ll.llama_sampler_free(sampler)
            out[name] = {"sum_ms": sum(times), "max_ms": max(times, default=0.0), "per_pos": times}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
