"""The import graph of localllm/ has no cycle and no upward import (DESIGN.md "Layering").

Every module belongs to one layer of ``LAYERS`` (bottom first); a module may import its
own layer and the layers below it, never one above. Every import counts: module level,
inside functions (lazy) and under ``TYPE_CHECKING`` — a lazy import upward is still a
dependency upward. A package's ``__init__`` re-exporting its own children is not an edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "localllm"

# Bottom to top. A module's layer is its longest matching prefix ("localllm.trace" covers
# localllm.trace.writer unless a longer prefix is listed); the root package matches only itself.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # leaf helpers: standard library (and their one foreign library) only
    (
        "leaf",
        (
            "localllm._version",
            "localllm._fs",
            "localllm._process",
            "localllm._http",
            "localllm._upstream",
            "localllm._lock",
            "localllm._jsonschema",
            "localllm.redact",
            "localllm.resources",
            "localllm.calibrate",
            # re's semantics in linear time (standard library only): eval cases match with it
            "localllm.grammar.pattern",
            # the latest results, kept within a count and a size (standard library only): the
            # pattern matchers are kept with it
            "localllm.grammar.kept",
        ),
    ),
    # the head start reads settings and spawns through _process; managed.server claims from it
    ("core", ("localllm.errors", "localllm.wire", "localllm.settings", "localllm._head_start")),
    # the JSONL sink and reader, call_id, sidecar files, verify/stats: low-level, used by
    # agents (transcripts), the runtime and the CLI; they know nothing of calls or config
    ("trace", ("localllm.trace",)),
    ("pins", ("localllm.managed.pins", "localllm.managed.platforms")),
    # the eval cases format is data (it imports only errors): config checks and the examples tier read it
    ("config", ("localllm.config", "localllm.eval.cases")),
    ("schema", ("localllm.schema", "localllm.grammar")),
    ("managed", ("localllm.managed",)),
    # Agent Plugins directories: parsed into declarations the transports then run
    ("plugins", ("localllm.plugins",)),
    # load_config: the data-only config plus the checks that need schema, grammar and plugins
    # selection: evidence fingerprints and the choice, read by load_config, check and the runtime
    ("loading", ("localllm.loading", "localllm.selection")),
    ("agents", ("localllm.agents", "localllm.embed")),
    # the recorder observes calls for the runtime, which owns and notifies it: just below it
    ("recorder", ("localllm.trace.recorder",)),
    ("runtime", ("localllm.runtime",)),
    # the root package re-exports the public names (lazily) from the layers below
    ("api", ("localllm",)),
    ("service", ("localllm.service", "localllm.eval")),
    ("cli", ("localllm.cli", "localllm.__main__")),
)

# Current violations outside the CLI's area, each removed by the work named beside it.
# The set only shrinks: an entry that no longer exists fails test_tolerated_entries_are_current.
TOLERATED: frozenset[tuple[str, str]] = frozenset({})


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int


def module_names() -> dict[str, Path]:
    names: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted import target lives in (``localllm.trace.TraceWriter`` → ``localllm.trace``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: anchor at the package, up (level - 1) more
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        # `from localllm import settings` names a module, `from localllm.trace import Event` a
        # package's attribute: the owner lookup resolves either to the module it lives in
        yield from (f"{base}.{alias.name}" for alias in node.names)


def import_edges() -> list[Edge]:
    modules = module_names()
    edges: dict[tuple[str, str], Edge] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _targets(node, module, is_package):
                owner = _owner(target, modules)
                if owner is None or owner == module or (is_package and owner.startswith(module + ".")):
                    continue
                edges.setdefault((module, owner), Edge(module, owner, getattr(node, "lineno", 0)))
    return sorted(edges.values(), key=lambda e: (e.importer, e.imported))


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            hit = module == prefix if prefix == "localllm" else module == prefix or module.startswith(prefix + ".")
            if hit and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if (layer_of(e.imported) or 0) > (layer_of(e.importer) or 0)]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, []).append(e.imported)
        graph.setdefault(e.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _checked_edges() -> list[Edge]:
    return [e for e in import_edges() if (e.importer, e.imported) not in TOLERATED]


def _show(edge: Edge) -> str:
    return (
        f"{edge.importer} (layer {LAYERS[layer_of(edge.importer) or 0][0]}) imports {edge.imported} "
        f"(layer {LAYERS[layer_of(edge.imported) or 0][0]}) at line {edge.line}"
    )


def test_every_module_has_a_layer() -> None:
    assert [m for m in module_names() if layer_of(m) is None] == []


def test_no_upward_import() -> None:
    assert [_show(e) for e in upward(_checked_edges())] == []


def test_no_import_cycle() -> None:
    assert cycles(_checked_edges()) == []


def test_tolerated_entries_are_current() -> None:
    # A violation that was fixed must leave TOLERATED, so it cannot come back unnoticed.
    edges = import_edges()
    still = {(e.importer, e.imported) for e in upward(edges)}
    cyclic = {m for component in cycles(edges) for m in component}
    stale = [pair for pair in TOLERATED if pair not in still and not set(pair) <= cyclic]
    assert stale == []


def test_the_cli_area_has_no_tolerated_violation() -> None:
    mine = (
        "localllm.cli",
        "localllm.__main__",
        "localllm._version",
        "localllm.trace.verify",
        "localllm.trace.stats",
        "localllm.embed.router",
    )
    assert [pair for pair in TOLERATED if pair[0].startswith(mine)] == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ([("a", "b"), ("b", "c")], []),
        ([("a", "b"), ("b", "a")], [["a", "b"]]),
        ([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d")], [["a", "b", "c"], ["d", "e"]]),
    ],
)
def test_the_cycle_finder_finds_cycles(edges: list[tuple[str, str]], expected: list[list[str]]) -> None:
    assert cycles([Edge(a, b, 0) for a, b in edges]) == expected


def test_the_walker_sees_lazy_relative_and_type_checking_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from localllm.runtime import Runtime\n"
        "def f():\n    from . import settings\n    import localllm.cli.app\n"
    )
    tree = ast.parse(source)
    found = {t for node in ast.walk(tree) for t in _targets(node, "localllm.errors", False)}
    assert {"localllm.runtime.Runtime", "localllm.settings", "localllm.cli.app"} <= found
    assert layer_of("localllm") == [n for n, _ in LAYERS].index("api")
    assert layer_of("localllm.trace.writer") < layer_of("localllm.config")  # type: ignore[operator]
    assert layer_of("localllm.managed.pins") < layer_of("localllm.config") < layer_of("localllm.managed")  # type: ignore[operator]
