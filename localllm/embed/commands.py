"""``localllm embed``, ``localllm search`` and ``localllm route``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from localllm.config import Config
    from localllm.embed.local import LocalEmbedder


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("embed", help="embed texts with a declared embedder; one JSON vector per line")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--embedder", required=True, help="a name under embedders:")
    p.add_argument("--role", choices=("query", "document"), default="document",
                   help="which prefix the model gets (default: document)")
    p.add_argument("--json", action="store_true", help="one JSON document with model, dims and vectors")
    p.set_defaults(handler=_embed)

    p = sub.add_parser("search", help="semantic search over files; prints score, path#chunk and a snippet")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--embedder", required=True, help="a name under embedders:")
    p.add_argument("--corpus", required=True, nargs="+", metavar="GLOB",
                   help="files to search: globs (** recursive) or directories, relative to the current directory")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--min-score", type=float, default=0.0)
    p.add_argument("--window", type=int, default=2000, help="chunk window in bytes (default 2000)")
    p.add_argument("--overlap", type=int, default=200, help="overlap of consecutive windows in bytes (default 200)")
    p.add_argument("--no-store", action="store_true", help="embed in memory; do not read or write the store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_search)

    p = sub.add_parser("route", help="route TEXT to one of the config's intents: (embedding tier, then decide)")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--trace", type=Path, help="append the turn.start event (routing provenance) to this trace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_route)


def _load(path: Path) -> Config:
    from localllm.loading import load_config

    return load_config(path)


def _embedder(config: Config, name: str) -> LocalEmbedder:
    from localllm.embed.local import embedder_from_decl

    decl = config.embedders.get(name)
    if decl is None:
        known = ", ".join(sorted(config.embedders)) or "none declared"
        raise ConfigError([ConfigProblem(str(config.path), f"embedders.{name}", "is not declared",
                                         f"declared embedders: {known}")])
    return embedder_from_decl(decl, base_dir=config.base_dir)


def _embed(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json

    config = _load(args.config)
    with _embedder(config, args.embedder) as embedder:
        vectors = embedder.embed(list(args.texts), args.role)
        identity = embedder.identity
    if args.json:
        emit_json({"model": identity.model, "dims": int(vectors.shape[1]), "role": args.role,
                   "vectors": vectors.tolist()})
    else:
        for row in vectors.tolist():
            sys.stdout.write(json.dumps(row) + "\n")
    return 0


def _search(args: argparse.Namespace) -> int:
    from localllm.cli import UsageError, emit_json, err
    from localllm.embed.corpus import Chunking, search

    if args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    if args.window < 1 or not 0 <= args.overlap < args.window:
        raise UsageError(f"need 0 <= --overlap < --window, got --window {args.window} --overlap {args.overlap}")
    config = _load(args.config)
    with _embedder(config, args.embedder) as embedder:
        report = search(args.query, embedder, args.corpus, base_dir=Path.cwd(), top_k=args.top_k,
                        min_score=args.min_score, store=not args.no_store,
                        chunking=Chunking(window=args.window, overlap=args.overlap))
    for pattern in report.unmatched:
        err(f"localllm: warning: --corpus {pattern!r} matched no files")
    for skipped in report.skipped:
        err(f"localllm: skipped {skipped.path}: {skipped.reason}")
    err(f"localllm: {report.files} files, {report.chunks} chunks, {report.embedded} embedded now")
    if args.json:
        emit_json({
            "query": report.query,
            "results": [{"path": h.path, "chunk": h.chunk, "id": h.id, "score": h.score, "start": h.start,
                         "end": h.end, "text": h.text} for h in report.hits],
            "files": report.files, "chunks": report.chunks, "embedded": report.embedded,
            "skipped": [{"path": s.path, "reason": s.reason} for s in report.skipped],
        })
    else:
        for h in report.hits:
            snippet = " ".join(h.text.split())[:100]
            sys.stdout.write(f"{h.score:.4f}  {h.id}  {snippet}\n")
    return 0


def _route(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
    from localllm.embed.router import Router, runtime_decide
    from localllm.runtime import Runtime

    config = _load(args.config)
    where = str(config.path)
    if not config.intents:
        raise ConfigError([ConfigProblem(where, "intents", "no intents declared", "add intents: with examples:")])
    decl = config.router
    if decl is None or decl.embedder is None:
        raise ConfigError([ConfigProblem(where, "router.embedder", "route needs an embedding tier",
                                         "set router: {embedder: NAME} naming an entry of embedders:")])
    with Runtime(config, trace=args.trace) as runtime, _embedder(config, decl.embedder) as embedder:
        intents = list(config.intents.values())
        decide = runtime_decide(runtime, decl.agent, intents) if decl.agent else None
        router = Router(intents, embedder, confident=decl.confident, margin=decl.margin, decide=decide)
        verdict = router.route(args.text)
        payload = verdict.turn_start_payload()
        if runtime.trace is not None:
            runtime.trace.append("turn.start", payload, turn=runtime.turn, state_path="route")
    out: dict[str, Any] = {**verdict.as_dict(), "turn_start": payload}
    if args.json:
        emit_json(out)
    else:
        conf = f"{verdict.confidence:.4f}" if verdict.confidence is not None else "-"
        sys.stdout.write(f"{verdict.intent or '-'}\t{verdict.outcome}\trouted_by={verdict.routed_by}\t"
                         f"match_type={verdict.match_type or '-'}\tconfidence={conf}\n")
    return 0 if verdict.intent is not None else 1
