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
    comp = gsub.add_parser(
        "compile",
        help="print the GBNF grammar localllm compiles a schema into (or why it refuses)",
        description="Compile one schema file with localllm's compiler (what grammar: true sends as the "
        "request's grammar) and print the GBNF, then any note on where the grammar is narrower than the "
        "schema. A refused schema prints its refusal (path, construct, reason); --explain finds every "
        "refusal (each refused part set aside in turn) with a hint per construct. Exit 0 when the schema "
        "compiles exactly, 1 when it is refused, 2 when the file cannot be read.",
    )
    comp.add_argument("schema", type=Path, metavar="SCHEMA")
    comp.add_argument("--explain", action="store_true", help="list every refusal, each with a hint")
    comp.add_argument("--space", action="store_true", help="allow one space after : and , (compact: false)")
    comp.add_argument("--json", action="store_true", help="print {grammar, refusals, notes} as JSON")
    comp.set_defaults(handler=_compile)


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
    from localllm.grammar.compile import compile_shared
    from localllm.grammar.relax import relax
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
        compiled = compile_shared(schema)  # relax(schema) below starts from it
        result: dict[str, Any] = {
            "file": str(path),
            "verdict": verdict(findings),
            "findings": [asdict(v) for v in findings],
            "compiled": {"exact": compiled.exact, "refusals": [asdict(r) for r in compiled.refusals]},
        }
        result["enforced"] = result["verdict"] != "error" or (compiled.exact and not args.server)
        if not result["enforced"] and not args.server:
            # what a grammar: true agent sends instead: the grammar of the schema without them
            relaxed = relax(schema)
            result["compiled"]["relaxed"] = None if relaxed is None else [asdict(r) for r in relaxed.dropped]
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
                if result["compiled"].get("relaxed"):
                    left = ", ".join(f"{r['path']} [{r['construct']}]" for r in result["compiled"]["relaxed"])
                    out(f"  relaxed the rest is the grammar; left to validation: {left}")
    if unreadable:
        return EXIT_USAGE
    return EXIT_OK if all(r["enforced"] for r in results) else EXIT_FAILED


#: what to change in a schema for each construct the compiler refuses
HINTS = {
    "oneOf": 'make the branches provably disjoint (distinct types, consts, or a required "kind" property with '
    'a distinct const per branch), or use "anyOf" if a value may match several',
    "not": "state what is allowed instead of what is not (an enum, a type list)",
    "if": "split the schema into anyOf branches, one per case, each with its own required properties",
    "uniqueItems": "use an enum of the allowed items with maxItems, or drop uniqueItems and deduplicate after",
    "multipleOf": "use an enum of the allowed values, or drop multipleOf and let validation catch it",
    "contains": "list the required item in prefixItems, or drop contains",
    "unevaluatedProperties": 'use "additionalProperties" on the object that lists the properties',
    "unevaluatedItems": 'use "items" beside "prefixItems"',
    "dependentRequired": "split into anyOf branches with and without the dependent properties",
    "dependentSchemas": "split into anyOf branches with and without the property",
    "dependencies": "split into anyOf branches with and without the property",
    "pattern": "rewrite the pattern without lookaround, backreferences or \\b, anchored with ^...$; "
    "patterns that meet on one string: fold them into one, with fewer counted repeats",
    "$ref": 'point "$ref" at "#/$defs/..." in the same document; no ref may reach itself without consuming input',
    "$id": "remove nested $id, or move the subschema into $defs of the root",
    "format": "drop the format or replace it with a pattern",
    "schema": "fix the schema: it is not valid against its draft's meta-schema",
    "depth": "flatten the schema or move repeated parts into $defs",
    "minLength": "intersect the length bounds into the pattern ({m,n})",
    "maxLength": "intersect the length bounds into the pattern ({m,n})",
    "minimum": "widen the range, or use an enum of the allowed values",
    "minProperties": "declare the properties that may count (by name, not by patternProperties), or make them required",
    "maxProperties": "declare fewer properties, or group them in anyOf branches",
    "patternProperties": "declare the properties by name",
}


def all_refusals(schema: Any, *, space: bool = False, limit: int = 20) -> list[Any]:
    """Every refusal: compile, set the refused schema object aside (``{}``), compile again."""
    import copy

    from localllm.grammar.compile import compile_schema
    from localllm.grammar.paths import parse_path

    doc = copy.deepcopy(schema)
    found: list[Any] = []
    for _ in range(limit):
        compiled = compile_schema(doc, space=space)
        if compiled.exact or not compiled.refusals:
            break
        refusal = compiled.refusals[0]
        if refusal in found:
            break
        found.append(refusal)
        try:
            tokens = parse_path(refusal.path)
        except ValueError:
            break
        if not tokens:
            break
        parent: Any = doc
        for token in tokens[:-1]:
            try:
                parent = parent[token]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        last = tokens[-1]
        in_dict = isinstance(parent, dict) and isinstance(last, str) and last in parent
        in_list = isinstance(parent, list) and isinstance(last, int) and last < len(parent)
        if not (in_dict or in_list):
            break
        parent[last] = {}
    return found


def _compile(args: argparse.Namespace) -> int:
    from localllm.grammar.compile import compile_schema
    from localllm.schema import read_schema_file

    schema, _ = unwrap_corpus_entry(args.schema, read_schema_file(args.schema))
    compiled = compile_schema(schema, space=args.space)
    refusals = all_refusals(schema, space=args.space) if args.explain and not compiled.exact else compiled.refusals
    if args.json:
        emit_json(
            {
                "file": str(args.schema),
                "exact": compiled.exact,
                "grammar": compiled.grammar,
                "refusals": [{**asdict(r), "hint": HINTS.get(r.construct, "")} for r in refusals],
                "notes": compiled.notes,
            }
        )
        return EXIT_OK if compiled.exact else EXIT_FAILED
    if compiled.grammar is not None:
        out(compiled.grammar.rstrip("\n"))
        for note in compiled.notes:
            out(f"# note: {note}")
        return EXIT_OK
    out(f"{args.schema}: refused ({len(refusals)} refusal(s))")
    for r in refusals:
        out(f"  refused {r.path}  [{r.construct}]  {r.message}")
        if args.explain and r.construct in HINTS:
            out(f"    hint: {HINTS[r.construct]}")
    return EXIT_FAILED
