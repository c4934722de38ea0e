"""``localllm grammar check SCHEMA...``: the subset verdict for each schema file."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from localllm.grammar.subset import Violation, check_subset


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grammar = sub.add_parser("grammar", help="the llama.cpp grammar subset")
    gsub = grammar.add_subparsers(dest="grammar_command", metavar="COMMAND", required=True)
    check = gsub.add_parser(
        "check",
        help="will llama-server enforce every structural constraint of these schemas?",
        description="Print the verdict (ok, warning-only, error) of each schema file and every "
        "finding. Exit 0 when all are in the subset (warnings allowed), 1 when any has an error, "
        "2 when a file cannot be read or is not a JSON Schema object.",
    )
    check.add_argument("schemas", nargs="+", type=Path, metavar="SCHEMA")
    check.add_argument("--json", action="store_true", help="print the results as JSON")
    check.set_defaults(handler=_check)


def verdict(findings: list[Violation]) -> str:
    """``error`` if any finding is an error, ``warning-only`` if all are warnings, else ``ok``."""
    if any(v.severity == "error" for v in findings):
        return "error"
    return "warning-only" if findings else "ok"


def _check(args: argparse.Namespace) -> int:
    from localllm.cli import EXIT_FAILED, EXIT_OK, emit_json
    from localllm.schema import read_schema_file

    # Read everything first: an unreadable file is a usage error (exit 2) before any verdict.
    loaded = [(path, read_schema_file(path)) for path in args.schemas]
    results: list[dict[str, Any]] = []
    for path, schema in loaded:
        findings = check_subset(schema)
        results.append({"file": str(path), "verdict": verdict(findings),
                        "findings": [asdict(v) for v in findings]})
    if args.json:
        emit_json(results)
    else:
        for result in results:
            findings = result["findings"]
            errors = sum(1 for f in findings if f["severity"] == "error")
            counts = f" ({errors} error(s), {len(findings) - errors} warning(s))" if findings else ""
            print(f"{result['file']}: {result['verdict']}{counts}")
            for f in findings:
                print(f"  {f['severity']:<7} {f['path']}  [{f['construct']}]  {f['message']}")
    return EXIT_FAILED if any(r["verdict"] == "error" for r in results) else EXIT_OK
