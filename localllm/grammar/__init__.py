"""The llama.cpp grammar subset: which JSON Schemas the pinned llama-server fully enforces.

``check_subset(schema)`` lists every :class:`Violation` (errors: out of the subset;
warnings: value constraints only validation enforces); ``format_violation`` renders one
for a config load-time error. The conformance corpus lives in the top-level ``grammar/``.
"""

from __future__ import annotations

from localllm.grammar.subset import Violation, check_subset, format_violation

__all__ = ["Violation", "check_subset", "format_violation"]
