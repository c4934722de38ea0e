"""JSON paths into a schema (``$.a["b c"][0]``), as the checker and the compiler report them."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

__all__ = ["child_path", "parse_path", "pointer_tokens", "resolve_pointer"]

_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


def child_path(path: str, key: str | int) -> str:
    """``$.a`` + ``b`` → ``$.a.b``; odd keys and indexes use brackets."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def parse_path(path: str) -> list[str | int]:
    """Inverse of :func:`child_path`: ``$.a["b c"][0]`` → ``["a", "b c", 0]``."""
    if not path.startswith("$"):
        raise ValueError(f"not a JSON path: {path!r}")
    tokens: list[str | int] = []
    i = 1
    while i < len(path):
        if path[i] == ".":
            m = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*").match(path, i + 1)
            if not m:
                raise ValueError(f"bad JSON path {path!r} at {i}")
            tokens.append(m.group(0))
            i = m.end()
        elif path.startswith("[", i):
            if path.startswith('["', i):
                decoder = json.JSONDecoder()
                key, end = decoder.raw_decode(path, i + 1)
                tokens.append(str(key))
                i = end + 1
            else:
                end = path.index("]", i)
                tokens.append(int(path[i + 1 : end]))
                i = end + 1
        else:
            raise ValueError(f"bad JSON path {path!r} at {i}")
    return tokens


def pointer_tokens(pointer: str) -> list[str]:
    """A URI fragment's JSON pointer (``/$defs/a~1b%20c``) as its tokens (``["$defs", "a/b c"]``)."""
    return [unquote(t).replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def resolve_pointer(doc: Any, pointer: str) -> tuple[Any, str] | None:
    """What a URI fragment's JSON pointer names in ``doc``, with its JSON path (``$`` for
    ``""``); None when it names nothing there."""
    node, path = doc, "$"
    for token in pointer_tokens(pointer):
        if isinstance(node, dict) and token in node:
            node, path = node[token], child_path(path, token)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node, path = node[int(token)], child_path(path, int(token))
        else:
            return None
    return node, path
