"""``localllm embed``, ``localllm search`` and ``localllm route``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli.foundation import add_config_option, load
from localllm.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    check_range,
    emit_json,
    err,
    input_path,
    out,
    output_path,
    warn,
)

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
    p.add_argument("text", metavar="TEXT", nargs="?", help="the input to route (optional with --calibrate)")
    add_config_option(p)
    p.add_argument("--trace", type=Path, metavar="F", help="append the turn (turn.start, decide call) to this trace")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="choose the semantic tier's bars from the intents' examples (leave-one-out), print them, "
        "and route TEXT (if given) with them",
    )
    p.add_argument(
        "--cases",
        type=Path,
        metavar="CASES.jsonl",
        help="with --calibrate: certify the bars on these held-out labelled inputs (JSONL, text and intent "
        "per line; not the examples) instead of leave-one-out: the precision bound then holds",
    )
    p.add_argument(
        "--target-precision",
        type=float,
        metavar="P",
        help="the precision --calibrate aims at (default: router.target_precision, 0.9)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="show per-intent similarities, the margin, the bars and which tier decided why",
    )
    p.add_argument("--json", action="store_true", help="print the verdict (and calibration) as JSON")
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

    check_range("--top-k", args.top_k, low=1, default=5)
    # a cosine; nan compared false with every score: 0 hits, exit 0
    check_range("--min-score", args.min_score, low=-1.0, high=1.0, default=0.0)
    check_range("--window", args.window, low=1, unit="bytes", default=2000)
    check_range("--overlap", args.overlap, low=0, high=args.window, high_open=True, unit="bytes (below --window)")
    for pattern in args.corpus:  # a plain path (no glob) must exist; a glob matching nothing is a warning
        if not any(c in pattern for c in "*?[") and not Path(pattern).exists():
            raise UsageError(
                f"--corpus {pattern}: no such file or directory",
                hint=f"corpus paths are relative to the current directory ({Path.cwd()})",
            )
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
    from localllm.embed.router import Router, calibrate, load_route_cases, route_turn, runtime_decide
    from localllm.errors import ConfigError, ConfigProblem
    from localllm.runtime import Runtime

    if args.text is None and not args.calibrate:
        raise UsageError("route needs TEXT (or --calibrate alone to print the calibrated bars)")
    if args.target_precision is not None:
        check_range("--target-precision", args.target_precision, low=0.5, high=1.0, high_open=True, default=0.9)
    if args.cases is not None and not args.calibrate:
        raise UsageError("--cases certifies the bars of --calibrate: give --calibrate too")
    if args.trace is not None:
        output_path(args.trace, "--trace")
    if args.cases is not None:
        input_path(args.cases, "--cases")
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
    target = args.target_precision if args.target_precision is not None else decl.target_precision
    # --cases, else router.calibration_cases (checked when the config loaded)
    cases_file = args.cases if args.cases is not None else decl.calibration_cases
    cases = load_route_cases(cases_file, list(config.intents)) if cases_file is not None else None
    with Runtime(config, trace=args.trace) as runtime, _embedder(config, decl.embedder) as embedder:
        intents = list(config.intents.values())
        decide = runtime_decide(runtime, decl.agent, intents) if decl.agent else None
        # unset bars: the embedding model's measured ones (registry), else the defaults
        router = Router(intents, embedder, confident=decl.confident, margin=decl.margin, decide=decide)
        calibration = None
        if args.calibrate or decl.calibrate:
            calibration = calibrate(router, target, cases=cases)
            router.apply(calibration)
            if not calibration.bound_met:  # router: {calibrate: true} routes on these bars too: say so every time
                warn(_unbounded(calibration))
        verdict = route_turn(router, args.text, runtime.trace, turn=runtime.turn) if args.text is not None else None
    if args.json:
        doc: dict[str, Any] = {}
        if verdict is not None:
            doc.update(verdict.as_dict(), turn_start=verdict.turn_start_payload())
        if calibration is not None:
            doc["calibration"] = calibration.as_dict()
        emit_json(doc)
    else:
        if calibration is not None and (args.calibrate or args.explain):
            _print_calibration(calibration, embedder.info.id)
        if verdict is not None:
            conf = f"{verdict.confidence:.4f}" if verdict.confidence is not None else "-"
            out(
                f"{verdict.intent or '-'}\t{verdict.outcome}\trouted_by={verdict.routed_by}\t"
                f"match_type={verdict.match_type or '-'}\tconfidence={conf}"
            )
            if args.explain:
                _explain(verdict)
    if verdict is None:
        return EXIT_OK
    return EXIT_OK if verdict.intent is not None else EXIT_FAILED


def _print_calibration(cal: Any, model: str) -> None:
    d = cal.as_dict()
    how = "lower bound" if cal.bound_met else "observed precision (no bar met the bound)"
    if cal.source == "cases":
        out(
            f"# certified on {d['cases']} held-out cases ({d['in_scope']} in scope, {d['out_of_scope']} out of "
            "scope), testing bars from the strictest down"
        )
        if cal.dropped_cases:
            out(f"# {cal.dropped_cases} cases are examples of the intents (not held out): dropped")
        if cal.duplicate_cases:
            out(f"# {cal.duplicate_cases} cases repeat an earlier case (case and spacing aside): counted once")
    else:
        out(f"# calibrated on {d['in_scope']} in-scope and {d['out_of_scope']} out-of-scope leave-one-out decisions")
    if cal.duplicates:
        out(f"# {cal.duplicates} examples repeat another of their intent's (case and spacing aside): counted once")
    out(
        f"# accepted {d['accepted']} ({d['coverage']:.0%} of in-scope), "
        f"precision {'n/a (none accepted)' if d['precision'] is None else d['precision']}, "
        f"{cal.level:.0%} lower bound {d['lower_bound']}; chosen by {how}"
    )
    out(f"router: {{confident: {d['confident']}, margin: {d['margin']}}}   # {model}")


def _unbounded(cal: Any) -> str:
    """The warning for bars chosen on the observed precision: why no bound, and what to do."""
    chosen = "the bars are chosen on the observed precision, which promises nothing on new inputs"
    if cal.source == "cases":
        return (
            f"no bar reaches a {cal.target_precision:.0%} precision lower bound on {cal.cases} held-out cases "
            f"tested from the strictest bar down: {chosen}; give more held-out cases (about {cal.needed} right "
            "ones above the bar at least) or aim at a lower --target-precision"
        )
    if cal.in_scope < cal.needed:
        return (
            f"a {cal.target_precision:.0%} precision bound needs about {cal.needed} correct decisions; "
            f"these examples give {cal.in_scope}: {chosen}; add examples per intent for a bound that holds"
        )
    return (
        f"no bar reaches a {cal.target_precision:.0%} precision lower bound on {cal.in_scope} in-scope "
        f"decisions (intents whose examples look alike, or like inputs none of them covers): {chosen}; "
        "give the intents more distinct examples or aim at a lower --target-precision"
    )


def _explain(verdict: Any) -> None:
    for name, score in verdict.scores:
        out(f"  {score:+.4f}  {name}")
    margin = "-" if verdict.margin is None else f"{verdict.margin:.4f}"
    bars = verdict.bars
    if bars:
        out(f"  bars: confident {bars['confident']:.4f}, margin {bars['margin']:.4f} ({bars['source']})")
    out(f"  margin: {margin}")
    out(f"  decided by: {verdict.routed_by} — {verdict.reason}")
