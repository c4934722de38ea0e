"""Build grammar/realworld/instances.jsonl: the test instances upstream ships with the corpus schemas.

For every ``jsb/<category>/<name>`` schema of grammar/realworld/schemas.jsonl, the ``tests`` of
``maskbench/data/<category>---<name>.json`` in guidance-ai/jsonschemabench (kept only when that
file's schema is the corpus schema); for every ``jsts/<draft>/<file>/<n>``, the ``tests`` of group
``n`` of ``tests/<draft>/<file>.json`` in json-schema-org/JSON-Schema-Test-Suite (the corpus schema
is that group's, ``$schema`` possibly added). Each test keeps ``description``, ``valid`` and
``data``. Deterministic: the same clones at the same commits give the same file.

    python tests/e2e/grammar_engine/make_instances.py JSONSCHEMABENCH_CLONE TEST_SUITE_CLONE
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
REALWORLD = REPO / "grammar" / "realworld" / "schemas.jsonl"
OUT = REPO / "grammar" / "realworld" / "instances.jsonl"
JSB_LICENSE = "JSONSchemaBench (no LICENSE file in the repository; schemas and tests collected from public sources)"
JSTS_LICENSE = "MIT (JSON-Schema-Test-Suite)"


def _git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True, check=True).stdout


def _tests(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"description": t.get("description", ""), "valid": bool(t["valid"]), "data": t["data"]} for t in raw]


def _without_schema_key(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: v for k, v in schema.items() if k != "$schema"}
    return schema


def build(jsb: Path, jsts: Path) -> list[dict[str, Any]]:
    jsb_commit = _git(jsb, "rev-parse", "HEAD").strip()
    jsts_commit = _git(jsts, "rev-parse", "HEAD").strip()
    out: list[dict[str, Any]] = []
    suite_files: dict[str, Any] = {}
    for line in REALWORLD.read_text().splitlines():
        entry = json.loads(line)
        sid = entry["id"]
        if sid.startswith("jsb/"):
            _, category, name = sid.split("/", 2)
            path = f"maskbench/data/{category}---{name}.json"
            try:
                doc = json.loads(_git(jsb, "show", f"HEAD:{path}"))
            except subprocess.CalledProcessError:
                continue
            if doc.get("schema") != entry["schema"] or not doc.get("tests"):
                continue
            source = f"github:guidance-ai/jsonschemabench@{jsb_commit}:{path}"
            out.append({"id": sid, "source": source, "license": JSB_LICENSE, "tests": _tests(doc["tests"])})
        elif sid.startswith("jsts/"):
            _, draft, file, n = sid.split("/", 3)
            path = f"tests/{draft}/{file}.json"
            if path not in suite_files:
                suite_files[path] = json.loads(_git(jsts, "show", f"HEAD:{path}"))
            group = suite_files[path][int(n)]
            if _without_schema_key(group["schema"]) != _without_schema_key(entry["schema"]):
                raise SystemExit(f"{sid}: the corpus schema is not group {n} of {path} at {jsts_commit[:8]}")
            source = f"github:json-schema-org/JSON-Schema-Test-Suite@{jsts_commit}:{path}#{n}"
            out.append({"id": sid, "source": source, "license": JSTS_LICENSE, "tests": _tests(group["tests"])})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsonschemabench", type=Path, help="a clone of guidance-ai/jsonschemabench")
    parser.add_argument("test_suite", type=Path, help="a clone of json-schema-org/JSON-Schema-Test-Suite")
    args = parser.parse_args(argv)
    entries = build(args.jsonschemabench, args.test_suite)
    OUT.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries))
    n = sum(len(e["tests"]) for e in entries)
    bad = sum(1 for e in entries for t in e["tests"] if not t["valid"])
    print(f"wrote {len(entries)} schemas, {n} instances ({bad} invalid) to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
