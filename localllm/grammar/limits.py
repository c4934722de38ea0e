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
  allocate without end: 3.5 GB in 10 s, and on until the OOM killer, the request waiting;
- copies of one element that may match nothing, in a row (``"a"? "a"? …``, ``("a"?){n}``),
  share a text in as many ways, each a parse stack: one token took 0.24 s with 40 in a row,
  1.35 s with 80, 15-26 s with 160 (about the fourth power), the server's other slots
  waiting (160 different optional elements: 64 ms a token).

So :func:`grammar_problem` refuses such a repeat and rows of more than 64 such copies
(:func:`skips_in_a_row`), bounds nesting and rules far below the crashes (with room for the
512 KiB thread stacks of other platforms) and the ``|`` separators to 512 in all, a proxy
for the alternatives live at one position (~0.4 s a token at most here: what such a
grammar costs is then what a long answer costs). llama.cpp's own JSON grammar has 20; a
country list about 250.
The scan is one linear pass (literals, classes and comments skipped); the rows are counted
on the parsed grammar (:mod:`localllm.grammar.walk`) once the scan passes: what it cannot
parse is llama-server's to report.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

__all__ = [
    "MAX_ALTERNATIVES",
    "MAX_GRAMMAR_BYTES",
    "MAX_NESTING",
    "MAX_RULES",
    "MAX_SKIPS",
    "grammar_problem",
    "skips_in_a_row",
]

MAX_GRAMMAR_BYTES = 256 << 10
MAX_NESTING = 256
MAX_RULES = 16_384
MAX_ALTERNATIVES = 512
MAX_SKIPS = 64

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
    skips = skips_in_a_row(text)
    if skips > MAX_SKIPS:
        return (
            f"has more than {MAX_SKIPS} copies of one element that may match nothing in a row (each way to "
            "share a text among them is one more parse stack llama-server checks for every token)"
        )
    return None


def skips_in_a_row(text: str) -> int:
    """The most copies of one element that may match nothing the grammar has in a row (``"a"?
    "a"? …``, ``("a"?){n}``, ``x x x`` for a rule ``x`` that may be empty), each copy counted
    with those inside it: every way to share a text among the copies is one more parse stack
    to llama-server. Different elements in a row (an object's optional properties, each its
    own key) are not counted: their stacks part at the first character that differs (160 of
    them cost 64 ms a token, against 20 ms). 0 when :mod:`localllm.grammar.walk` cannot parse
    the text."""
    from localllm.grammar.walk import Grammar, GrammarSyntaxError

    try:
        rules = Grammar.parse(text).rules
    except (GrammarSyntaxError, ValueError, RecursionError):
        return 0
    return _rows(rules)


def _rows(rules: dict[str, Any]) -> int:
    """:func:`skips_in_a_row` over parsed rules (``walk`` nodes), capped past the limit; no
    recursion (groups nest 256 deep, rules chain 16,384 long), each rule read a bounded number
    of times (a fixed point read every rule again for each one found empty: a chain of 16,384
    rules took 9 minutes)."""
    orders = {name: _postorder(body) for name, body in rules.items()}
    named = {name: [n[1] for n in order if n[0] == "ref" and n[1] in rules] for name, order in orders.items()}
    # the rules, each after the rules it names (a rule met again inside itself: before them)
    sequence: list[str] = []
    entered: set[str] = set()
    for start in rules:
        stack = [(start, False)]
        while stack:
            name, named_done = stack.pop()
            if named_done:
                sequence.append(name)
            elif name not in entered:
                entered.add(name)
                stack.append((name, True))
                stack.extend((n, False) for n in named[name] if n not in entered)
    # which rules may match nothing: in that order, then again for the callers of each rule
    # found empty later (only through a cycle)
    empty = dict.fromkeys(rules, False)
    callers: dict[str, set[str]] = {name: set() for name in rules}
    for name in sequence:
        for callee in named[name]:
            callers[callee].add(name)
    queue, queued = deque(sequence), set(sequence)
    while queue:
        name = queue.popleft()
        queued.discard(name)
        if not empty[name] and _nullable(orders[name], empty)[id(rules[name])]:
            empty[name] = True
            fresh = callers[name] - queued
            queue.extend(fresh)
            queued |= fresh
    nullable = {k: v for name in rules for k, v in _nullable(orders[name], empty).items()}
    counted: dict[str, int] = {}  # a rule met again inside itself counts 0 there
    for name in sequence:
        counted[name] = _row(orders[name], nullable, counted, MAX_SKIPS + 1)
    return max(counted.values(), default=0)


def _postorder(node: Any) -> list[Any]:
    """A ``walk`` node and those inside it, each after its own."""
    out, stack = [], [(node, False)]
    while stack:
        item, inside_done = stack.pop()
        if inside_done:
            out.append(item)
            continue
        stack.append((item, True))
        if item[0] in ("seq", "alt"):
            stack.extend((child, False) for child in item[1])
        elif item[0] == "rep":
            stack.append((item[1], False))
    return out


def _nullable(order: list[Any], empty: dict[str, bool]) -> dict[int, bool]:
    """Which nodes of ``order`` (a postorder) may match nothing, by ``id``."""
    known: dict[int, bool] = {}
    for node in order:
        kind = node[0]
        if kind == "lit":
            known[id(node)] = node[1] == ""
        elif kind == "ref":
            known[id(node)] = empty.get(node[1], False)
        elif kind == "seq":
            known[id(node)] = all(known[id(e)] for e in node[1])
        elif kind == "alt":
            known[id(node)] = any(known[id(o)] for o in node[1])
        elif kind == "rep":
            known[id(node)] = node[2] == 0 or known[id(node[1])]
        else:  # a class, any character
            known[id(node)] = False
    return known


def _row(order: list[Any], nullable: dict[int, bool], counted: dict[str, int], cap: int) -> int:
    """The longest row of copies in the node ``order`` ends with, a row of its own counting
    those inside it (``counted``: the rules' own, 0 for one being counted)."""
    rows: dict[int, int] = {}
    for node in order:
        kind = node[0]
        if kind == "ref":
            row = counted.get(node[1], 0)
        elif kind == "alt":
            row = max((rows[id(o)] for o in node[1]), default=0)
        elif kind == "rep":
            inner, low, high = node[1], node[2], node[3]
            copies = max(low, high or 1) if nullable[id(inner)] else 1
            row = copies * max(rows[id(inner)], 1) if copies > 1 else rows[id(inner)]
        elif kind == "seq":
            row = run = 0
            last = None
            for element in node[1]:
                inside = rows[id(element)]
                if not nullable[id(element)]:
                    run = inside
                elif element == last:  # one more copy
                    run += max(inside, 1)
                else:
                    run = max(inside, 1)
                row, last = max(row, run), element
        else:
            row = 0
        rows[id(node)] = min(cap, row)
    return rows[id(order[-1])] if order else 0
