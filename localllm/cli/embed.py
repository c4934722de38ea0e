"""``localllm embed``, ``localllm search`` and ``localllm route``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli.foundation import add_config_option, load
from localllm.cli.output import EXIT_FAILED, EXIT_OK, UsageError, emit_json, err, out, warn

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.embed.local import LocalEmbedder


def _setup_embed(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+", metavar="TEXT")
    add_config_option(p)
    p.add_argument("--embedder", required=True, metavar="NAME", help="a name under embedders:")
    p.add_argument(
        "--role",
        choices=("query", "document"),
        default="document",
        help="which prefix the model gets (default: document)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document with model, dims and vectors")
    p.set_defaults(handler=_embed)


def _setup_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", metavar="QUERY")
    add_config_option(p)
    p.add_argument("--embedder", required=True, metavar="NAME", help="a name under embedders:")
    p.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        metavar="GLOB",
        help="files to search: globs (** recursive) or directories, relative to the current directory",
    )
    p.add_argument("--top-k", type=int, default=5, metavar="N", help="how many hits (default 5)")
    p.add_argument("--min-score", type=float, default=0.0, metavar="S", help="drop hits below this cosine")
    p.add_argument("--window", type=int, default=2000, metavar="B", help="chunk window in bytes (default 2000)")
    p.add_argument(
        "--overlap", type=int, default=200, metavar="B", help="overlap of consecutive windows in bytes (default 200)"
    )
    p.add_argument("--no-store", action="store_true", help="embed in memory; do not read or write the store")
    p.add_argument("--json", action="store_true", help="print the hits as JSON")
    p.set_defaults(handler=_search)


def _setup_route(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", metavar="TEXT")
    add_config_option(p)
    p.add_argument("--trace", type=Path, metavar="F", help="append the turn (turn.start, decide call) to this trace")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(handler=_route)


SETUP = {"embed": _setup_embed, "search": _setup_search, "route": _setup_route}


def _embedder(config: Config, name: str) -> LocalEmbedder:
    from localllm.embed.local import embedder_from_decl

    decl = config.embedders.get(name)
    if decl is None:
        from localllm.errors import ConfigError, ConfigProblem

        known = ", ".join(sorted(config.embedders)) or "none declared"
        raise ConfigError(
            [ConfigProblem(str(config.path), f"embedders.{name}", "is not declared", f"declared embedders: {known}")]
        )
    return embedder_from_decl(decl, base_dir=config.base_dir)


def _embed(args: argparse.Namespace) -> int:
    config = load(args.config)
    with _embedder(config, args.embedder) as embedder:
        vectors = embedder.embed(list(args.texts), args.role)
        identity = embedder.identity
    if args.json:
        emit_json(
            {"model": identity.model, "dims": int(vectors.shape[1]), "role": args.role, "vectors": vectors.tolist()}
        )
    else:
        for row in vectors.tolist():
            out(json.dumps(row))
    return EXIT_OK


def _progress_bar() -> Any:
    """A tqdm bar on stderr for the chunks being embedded; silent unless stderr is a TTY."""
    from tqdm import tqdm

    return tqdm(
        desc="localllm: embedding", unit=" chunks", file=sys.stderr, leave=False, disable=not sys.stderr.isatty()
    )


def _search(args: argparse.Namespace) -> int:
    from localllm.embed.corpus import Chunking, search

    if args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    if args.window < 1 or not 0 <= args.overlap < args.window:
        raise UsageError(f"need 0 <= --overlap < --window, got --window {args.window} --overlap {args.overlap}")
    config = load(args.config)
    with _embedder(config, args.embedder) as embedder, _progress_bar() as bar:
        report = search(
            args.query,
            embedder,
            args.corpus,
            base_dir=Path.cwd(),
            top_k=args.top_k,
            min_score=args.min_score,
            store=not args.no_store,
            chunking=Chunking(window=args.window, overlap=args.overlap),
            progress=bar.update,
        )
    for pattern in report.unmatched:
        warn(f"--corpus {pattern!r} matched no files")
    for skipped in report.skipped:
        err(f"localllm: skipped {skipped.path}: {skipped.reason}")
    err(f"localllm: {report.files} files, {report.chunks} chunks, {report.embedded} embedded now")
    if args.json:
        emit_json(
            {
                "query": report.query,
                "results": [
                    {
                        "path": h.path,
                        "chunk": h.chunk,
                        "id": h.id,
                        "score": h.score,
                        "start": h.start,
                        "end": h.end,
                        "text": h.text,
                    }
                    for h in report.hits
                ],
                "files": report.files,
                "chunks": report.chunks,
                "embedded": report.embedded,
                "skipped": [{"path": s.path, "reason": s.reason} for s in report.skipped],
            }
        )
    else:
        for h in report.hits:
            snippet = " ".join(h.text.split())[:100]
            out(f"{h.score:.4f}  {h.id}  {snippet}")
    return EXIT_OK


def _route(args: argparse.Namespace) -> int:
    from localllm.embed.router import Router, route_turn, runtime_decide
    from localllm.errors import ConfigError, ConfigProblem
    from localllm.runtime import Runtime

    config = load(args.config)
    where = str(config.path)
    if not config.intents:
        raise ConfigError([ConfigProblem(where, "intents", "no intents declared", "add intents: with examples:")])
    decl = config.router
    if decl is None or decl.embedder is None:
        raise ConfigError(
            [
                ConfigProblem(
                    where,
                    "router.embedder",
                    "route needs an embedding tier",
                    "set router: {embedder: NAME} naming an entry of embedders:",
                )
            ]
        )
    with Runtime(config, trace=args.trace) as runtime, _embedder(config, decl.embedder) as embedder:
        intents = list(config.intents.values())
        decide = runtime_decide(runtime, decl.agent, intents) if decl.agent else None
        router = Router(intents, embedder, confident=decl.confident, margin=decl.margin, decide=decide)
        verdict = route_turn(router, args.text, runtime.trace, turn=runtime.turn)
    if args.json:
        emit_json({**verdict.as_dict(), "turn_start": verdict.turn_start_payload()})
    else:
        conf = f"{verdict.confidence:.4f}" if verdict.confidence is not None else "-"
        out(
            f"{verdict.intent or '-'}\t{verdict.outcome}\trouted_by={verdict.routed_by}\t"
            f"match_type={verdict.match_type or '-'}\tconfidence={conf}"
        )
    return EXIT_OK if verdict.intent is not None else EXIT_FAILED
