"""``localllm grammar check SCHEMA...``: what each schema file gets on both grammar paths.

Per file: whether localllm's compiler expresses it exactly (``grammar: true``) or the
refusal, and the verdict of llama.cpp's own converter (``grammar: server``, and the
fallback for a schema the compiler refuses). The exit code judges the ``grammar: true``
path, like the load-time check; ``--server`` judges llama.cpp's converter alone.

A grammar corpus entry (``{"description", "schema", "verdict", ...}``, see grammar/README.md)
is recognised: its inner ``schema`` is checked and the recorded verdict is shown beside ours.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, emit_json, err, out

if TYPE_CHECKING:
    from localllm.grammar.subset import Violation


def _setup(parser: argparse.ArgumentParser) -> None:
    gsub = parser.add_subparsers(dest="grammar_command", metavar="COMMAND", required=True)
    check = gsub.add_parser(
        "check",
        help="will llama-server enforce every structural constraint of these schemas?",
        description="For each schema file: whether localllm's compiler expresses it exactly "
        "(grammar: true) or why not, and the verdict (ok, warning-only, error) of llama.cpp's own "
        "converter with every finding. A grammar corpus entry is checked by its inner schema. Exit 0 "
        "when every schema is enforced (compiled exactly, or in the converter's subset; warnings "
        "allowed), 1 when any is not, 2 when a file cannot be read or is not a JSON Schema object.",
    )
    check.add_argument("schemas", nargs="+", type=Path, metavar="SCHEMA")
    check.add_argument("--json", action="store_true", help="print the results as JSON")
    check.add_argument("--server", action="store_true", help="judge llama.cpp's converter alone (grammar: server)")
    check.set_defaults(handler=_check)


SETUP = {"grammar": _setup}


def verdict(findings: list[Violation]) -> str:
    """``error`` if any finding is an error, ``warning-only`` if all are warnings, else ``ok``."""
    if any(v.severity == "error" for v in findings):
        return "error"
    return "warning-only" if findings else "ok"


def unwrap_corpus_entry(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``(schema, recorded verdict)``: a corpus entry's inner schema, or ``(doc, None)`` for a plain schema.

    An entry has both ``schema`` and ``verdict`` at the top (neither is a JSON Schema
    keyword); one whose ``schema`` is not an object is refused (``SchemaError``).
    """
    from localllm.errors import SchemaError

    if "schema" not in doc or "verdict" not in doc:
        return doc, None
    inner, recorded = doc["schema"], doc["verdict"]
    if not isinstance(inner, dict):
        raise SchemaError(
            f'{path}: looks like a grammar corpus entry (has "schema" and "verdict"), '
            f'but its "schema" is a {type(inner).__name__}, not a JSON Schema object'
        )
    return inner, recorded if isinstance(recorded, str) else repr(recorded)


def _check(args: argparse.Namespace) -> int:
    from localllm.errors import LocalLLMError
    from localllm.grammar.compile import compile_schema
    from localllm.grammar.subset import check_subset
    from localllm.schema import read_schema_file

    # An unreadable file is reported in its place (exit 2) without hiding the others' verdicts.
    results: list[dict[str, Any]] = []
    unreadable: list[dict[str, Any]] = []
    for path in args.schemas:
        try:
            schema, recorded = unwrap_corpus_entry(path, read_schema_file(path))
        except LocalLLMError as exc:
            from localllm.cli.app import kind_of

            doc = {"file": str(path), "ok": False, "kind": kind_of(exc), "detail": str(exc), "hint": exc.hint}
            unreadable.append(doc)
            if not args.json:
                err(f"localllm: error: {exc}" + (f" (hint: {exc.hint})" if exc.hint else ""))
            continue
        findings = check_subset(schema)
        compiled = compile_schema(schema)
        result: dict[str, Any] = {
            "file": str(path),
            "verdict": verdict(findings),
            "findings": [asdict(v) for v in findings],
            "compiled": {"exact": compiled.exact, "refusals": [asdict(r) for r in compiled.refusals]},
        }
        result["enforced"] = result["verdict"] != "error" or (compiled.exact and not args.server)
        if recorded is not None:
            result["corpus_verdict"] = recorded
        results.append(result)
    if args.json:
        emit_json(results + unreadable)
    else:
        for result in results:
            findings = result["findings"]
            errors = sum(1 for f in findings if f["severity"] == "error")
            counts = f" ({errors} error(s), {len(findings) - errors} warning(s))" if findings else ""
            recorded = result.get("corpus_verdict")
            entry = f"  [corpus entry; recorded verdict: {recorded}]" if recorded is not None else ""
            refusals = result["compiled"]["refusals"]
            if args.server:
                out(f"{result['file']}: {result['verdict']}{counts}{entry}")
            else:
                judged = "enforced" if result["enforced"] else "NOT enforced"
                how = "exact" if not refusals else "refused"
                converter = f"llama.cpp's converter: {result['verdict']}{counts}"
                out(f"{result['file']}: {judged} (compiled: {how}; {converter}){entry}")
            for f in findings:
                out(f"  {f['severity']:<7} {f['path']}  [{f['construct']}]  {f['message']}")
            if not args.server:
                for r in refusals:
                    out(f"  refused {r['path']}  [{r['construct']}]  {r['message']}")
    if unreadable:
        return EXIT_USAGE
    return EXIT_OK if all(r["enforced"] for r in results) else EXIT_FAILED
