"""Schema-constrained decoding: localllm's exact GBNF compiler, and the truth about llama.cpp's.

``compile_schema(schema)`` returns a :class:`CompiledGrammar` (the GBNF, or the
:class:`Refusal` naming the construct it cannot express exactly). ``check_subset(schema)``
lists every :class:`Violation` of llama.cpp's own converter (errors: it does not enforce
the schema; warnings: value constraints only validation enforces); ``format_violation``
renders one for a config load-time error; ``unenforced(schema)`` is what a ``grammar: true``
agent leaves unenforced (nothing when the schema compiles). The corpora live in the
top-level ``grammar/``.
"""

from __future__ import annotations

from localllm.grammar.compile import CompiledGrammar, Refusal, compile_schema
from localllm.grammar.subset import Violation, check_subset, format_violation, unenforced

__all__ = [
    "CompiledGrammar",
    "Refusal",
    "Violation",
    "check_subset",
    "compile_schema",
    "format_violation",
    "unenforced",
]
