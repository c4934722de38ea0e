"""``localllm eval GATE -c C``: run the gate's cases against candidate agents, write the evidence."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from localllm.cli.foundation import add_config_option, load
from localllm.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    check_range,
    emit_json,
    err,
    out,
    output_path,
    path_arg,
)


def _setup(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gate", metavar="GATE", help="a name under gates:")
    add_config_option(parser)
    parser.add_argument(
        "--agents", metavar="A,B", help="candidate aliases, comma-separated (default: the gate's agent)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="ask each case N times (reproducibility; at most 100)"
    )
    parser.add_argument("--cases", type=path_arg, metavar="F", help="cases JSONL (default: evals/GATE/cases.jsonl)")
    parser.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        help="reports directory (default: evals/reports under the current directory, never the config's files)",
    )
    parser.add_argument(
        "--cassette",
        action="append",
        metavar="ALIAS=FILE",
        help="replay FILE instead of calling ALIAS, e.g. agent.claude=claude.yaml (repeatable)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="concurrent calls per agent, at most 256 (default: a local model's parallel slots, else 1)",
    )
    parser.add_argument(
        "--fail-under",
        type=float,
        metavar="X",
        help="exit 1 when an evaluated agent's own accuracy (its answers, not its fallback's) is below X (0..1)",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=0.5,
        metavar="X",
        help="share of the cases held out from confidence calibration (default 0.5)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_eval)


SETUP = {"eval": _setup}

#: where ``localllm eval`` writes reports without ``--out``: relative to the current directory,
#: so an example's committed report is only rewritten from its own directory or on purpose
DEFAULT_OUT = Path("evals") / "reports"


def _cassettes(pairs: list[str] | None) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pair in pairs or []:
        alias, sep, file = pair.partition("=")
        if not sep or not alias or not file or "\x00" in file:
            raise UsageError(f"--cassette {pair!r} is not ALIAS=FILE", hint="e.g. --cassette agent.claude=claude.yaml")
        found[alias] = Path(file)
    return found


def _eval(args: argparse.Namespace) -> int:
    from localllm.eval import MAX_REPEAT, MAX_WORKERS, default_cases_path, evaluate, load_cases
    from localllm.eval.cases import distinct_cases

    check_range("--repeat", args.repeat, low=1, high=MAX_REPEAT, default=1)
    if args.workers is not None:
        check_range("--workers", args.workers, low=1, high=MAX_WORKERS)
    if args.fail_under is not None:
        check_range("--fail-under", args.fail_under, low=0.0, high=1.0)
    check_range("--holdout", args.holdout, low=0.0, high=1.0, low_open=True, high_open=True, default=0.5)
    if args.out is not None:
        output_path(args.out, "--out", directory=True)
    agents = [a.strip() for a in args.agents.split(",") if a.strip()] if args.agents else None
    config = load(args.config)
    cassettes = _cassettes(args.cassette)
    gate = config.gates.get(args.gate)
    cases = cases_path = None
    if gate is not None:  # an unknown gate is evaluate's error to report
        cases_path = args.cases or default_cases_path(config, args.gate)
        if args.cases is None and not cases_path.exists() and gate.examples is not None and gate.examples.cases:
            cases_path = gate.examples.cases  # measured on its examples, leave-one-out
        cases = load_cases(cases_path)
    bar: Any = None
    progress = None
    if sys.stderr.isatty() and not args.json and cases is not None:
        from tqdm import tqdm

        tier = gate is not None and gate.examples is not None and gate.examples.answer
        total = (
            len(distinct_cases(cases)[0])
            * args.repeat
            * len(agents or [gate.agent if gate else ""] * (2 if tier else 1))
        )
        bar = tqdm(total=total, unit="call", desc=f"eval {args.gate}", file=sys.stderr, leave=False)
        progress = bar.update
    try:
        result = evaluate(
            config,
            args.gate,
            agents=agents,
            cases_path=cases_path,
            cases=cases,
            repeat=args.repeat,
            out_dir=args.out if args.out is not None else Path.cwd() / DEFAULT_OUT,
            cassettes=cassettes,
            workers=args.workers,
            progress=progress,
            holdout=args.holdout,
        )
    finally:
        if bar is not None:
            bar.close()
    report = result.report
    if args.json:
        emit_json({k: v for k, v in report.items() if k != "calls"})
    else:
        _print_table(report)
    err(f"report: {result.paths['json']} (latest: {result.paths['latest']}); html: {result.paths['html']}")
    err(f"trace: {result.trace}")
    if args.fail_under is not None:
        # the agent's own answers: a local model whose every answer fails the schema, with a
        # fallback (a cassette in CI) answering for it, is not good enough at 100 % accuracy
        below = {
            a: r["first_try_accuracy"]
            for a, r in report["agents"].items()
            if r["first_try_accuracy"] is None or r["first_try_accuracy"] < args.fail_under
        }
        if below:
            err(
                "localllm: eval: accuracy below --fail-under "
                f"{args.fail_under:g}: " + ", ".join(f"{a} {v}" for a, v in below.items())
            )
            return EXIT_FAILED
    return EXIT_OK


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}"


def table_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """The printed table (also what EVAL-README shows): one row per agent."""
    rows: list[tuple[str, ...]] = [
        (
            "AGENT",
            "CALLS",
            "ACCURACY",
            "VALID_1ST",
            "FALLBACK",
            "ERRORS",
            "P50_MS",
            "P95_MS",
            "TOKENS",
            "COST_USD",
            "REPRO",
            "REPRO_LABELS",
        )
    ]
    for alias, r in report["agents"].items():
        errors = ",".join(f"{k}:{v}" for k, v in r["errors"].items()) or "0"
        rows.append(
            (
                alias,
                str(r["calls"]),
                _pct(r["accuracy"]),
                _pct(r["schema_valid_first_try"]),
                _pct(r["fallback_rate"]),
                errors,
                _ms(r["latency_ms"]["p50"]),
                _ms(r["latency_ms"]["p95"]),
                f"{r['tokens']['prompt']}/{r['tokens']['completion']}",
                f"{r['cost_usd']['total']:.4f}",
                _pct(r["reproducibility"]),
                _pct(r.get("reproducibility_labels")),
            )
        )
    return rows


def _print_table(report: dict[str, Any]) -> None:
    out(f"gate {report['gate']}: {report['cases']} cases x {report['repeat']} repeat(s)")
    if report.get("duplicate_cases"):
        lines = report["duplicate_lines"]
        out(
            f"{report['duplicate_cases']} of the file's cases repeat an earlier one (the same args, world and "
            f"expect: line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}): asked and counted once"
        )
    examples = report.get("examples") or {}
    if examples.get("duplicate_examples"):
        lines = examples["duplicate_lines"]
        out(
            f"{examples['duplicate_examples']} of {examples['file']}'s examples repeat an earlier one (the same "
            f"text, case and spacing aside, and labels: line{'s' if len(lines) > 1 else ''} "
            f"{', '.join(map(str, lines))}): one example, one vote ({examples['examples']} examples)"
        )
    for block in (table_rows(report), _field_rows(report)):
        if len(block) < 2:
            continue
        widths = [max(len(row[i]) for row in block) for i in range(len(block[0]))]
        out("")
        for row in block:
            out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    _print_decision(report)


def _print_decision(report: dict[str, Any]) -> None:
    """Per tier with a confidence: the curve, ECE, thresholds and how they held on the held-out split;
    then what a min_precision cascade would keep local."""
    from localllm.eval.decision import ascii_curve

    for alias, row in report["agents"].items():
        for name, labels in (row.get("per_label") or {}).items():
            if labels:
                shown = ", ".join(f"{label} {_pct(v['accuracy'])} of {v['calls']}" for label, v in labels.items())
                out(f"{alias} {name} per label: {shown}")
    calibration = report.get("calibration") or {}
    beyond = calibration.get("out_of_scope")
    if beyond:
        out(
            f"out-of-scope rule: {beyond['cases']} of {report.get('cases')} cases fall at or below the examples' "
            "novelty bar; they escalate, and no threshold is calibrated on them"
        )
    for alias, tier in (calibration.get("tiers") or {}).items():
        if not tier.get("scored"):
            continue
        out("")
        out(f"{alias}: {tier['scored']} of {tier['calls']} answers carry a confidence; ECE {tier['ece']}")
        for line in ascii_curve(tier["curve"], width=40, height=8):
            out("  " + line)
        for target, row in tier["targets"].items():
            value, held = row["threshold"]["value"], row["held_out"]
            n = row["threshold"]["n"]
            shown = (
                f"accept nothing (no threshold's 95% lower bound reaches {target} on {n} answers)"
                if value is None
                else f"confidence >= {value:g} (lower bound {row['threshold']['lower_bound']:.3f} on {n} answers)"
            )
            out(
                f"  precision {target}: {shown}; held out: {held['accepted']}/{held['n']} accepted, "
                f"precision {_pct(held['precision'])}"
            )
    for target, sim in (report.get("decision") or {}).items():
        out(
            f"min_precision {target}: {_pct(sim['local_share'])} local at precision {_pct(sim['local_precision'])}; "
            f"cascade accuracy {_pct(sim['cascade_accuracy'])} vs {_pct(sim['strong_accuracy'])} all-"
            f"{sim['order'][-1]}; mean {_ms(sim['mean_ms'])} vs {_ms(sim['strong_mean_ms'])}; "
            f"cost ${sim['cost_usd']:g} vs ${sim['strong_cost_usd']:g}"
        )


def _field_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    fields = sorted({f for r in report["agents"].values() for f in r["fields"]})
    rows: list[tuple[str, ...]] = [("AGENT", *(f.upper() for f in fields))]
    for alias, r in report["agents"].items():
        rows.append((alias, *(_pct(r["fields"].get(f, {}).get("accuracy")) for f in fields)))
    return rows if fields else []
