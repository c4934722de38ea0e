"""What a GBNF grammar from a client may be before it reaches a shared llama-server.

llama.cpp parses a request's ``grammar`` on the server's own threads, recursively, and
evaluates it against every candidate token. Measured on the pinned build (gemma-3-270m):

- groups nested 30,000 deep (a 60 KB request) crash it (stack overflow: every model of the
  server gone, every request in flight with it); 10,000 deep parse;
- a chain of 70,000 rules, each naming the next, crashes it; 40,000 parse;
- each alternative that can start at a position is a parse stack scanned against the whole
  vocabulary for every token: 3,000 one-literal alternatives cost ~2.3 s per token on 2
  cores, and the server's other slots wait;
- a repeat whose minimum passes its maximum (``"a"{1,0}``: 17 bytes) makes its parser
  allocate without end: 3.5 GB in 10 s, and on until the OOM killer, the request waiting.

So :func:`grammar_problem` refuses such a repeat, bounds nesting and rules far below the
crashes (with room for the 512 KiB thread stacks of other platforms) and the ``|``
separators to 512 in all, a proxy for the alternatives live at one position (~0.4 s a token at most here: what such a
grammar costs is then what a long answer costs). llama.cpp's own JSON grammar has 20; a
country list about 250.
The scan is one linear pass (literals, classes and comments skipped), not a parse: what is
malformed otherwise is llama-server's to report.
"""

from __future__ import annotations

import re

__all__ = ["MAX_ALTERNATIVES", "MAX_GRAMMAR_BYTES", "MAX_NESTING", "MAX_RULES", "grammar_problem"]

MAX_GRAMMAR_BYTES = 256 << 10
MAX_NESTING = 256
MAX_RULES = 16_384
MAX_ALTERNATIVES = 512

# what the scan counts; literals, classes and comments are matched whole so nothing in them counts
_SYNTAX = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*|::=|[()|]|\{(?:[^}#]|#[^\n]*)*\}')
# a repeat's counts, its comments and spaces taken out: ``{m}``, ``{m,}``, ``{m,n}``
_COUNTS = re.compile(r"(\d+)(?:,(\d*))?")


def grammar_problem(text: object) -> str | None:
    """Why a client's GBNF ``text`` must not reach llama-server, or None."""
    if not isinstance(text, str):
        return "must be a string of GBNF"
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        return f"is {size:,} bytes: at most {MAX_GRAMMAR_BYTES:,}"
    depth = deepest = rules = alternatives = 0
    for found in _SYNTAX.finditer(text):
        token = found.group()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token == ")":
            depth = max(depth - 1, 0)
        elif token == "|":
            alternatives += 1
        elif token == "::=":
            rules += 1
        elif token.startswith("{") and (counts := _COUNTS.fullmatch(re.sub(r"#[^\n]*|\s", "", token[1:-1]))):
            low, high = (n.lstrip("0") or "0" for n in counts.groups(""))
            if counts.group(2) and (len(low), low) > (len(high), high):  # as numbers, of any length
                return (
                    f"repeats {token[:40]} times: the minimum passes the maximum (llama-server's parser "
                    "then allocates memory without end)"
                )
    if deepest > MAX_NESTING:
        return f"nests groups {deepest:,} deep: at most {MAX_NESTING} (llama-server's parser recurses per group)"
    if rules > MAX_RULES:
        return f"has {rules:,} rules: at most {MAX_RULES:,}"
    if alternatives > MAX_ALTERNATIVES:
        return (
            f"separates {alternatives:,} alternatives with |: at most {MAX_ALTERNATIVES} (each one that can "
            "start at a position is checked against the whole vocabulary for every token)"
        )
    return None
