"""A gate schema split over files, as an agent is sent it: one document, the files' refs made
local (``localllm.schema.bundle_file_refs``), admitting exactly what the files admit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from localllm.errors import AgentError, ConfigError, ErrorKind
from localllm.grammar import compile_schema
from localllm.loading import load_config
from localllm.runtime import Runtime
from localllm.schema import SchemaSet, _iter_refs, bundle_file_refs, read_schema_file
from localllm.wire import AskRequest


def _write(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``app/schemas/ticket.json`` reaching four files: one beside it (percent-encoded name),
    one a directory up, one through another file, and a ref back into itself from a file;
    ``ticket.json`` has a ``$defs`` entry of its own named like a file it reaches."""
    root = tmp_path / "app"
    _write(
        root / "schemas" / "ticket.json",
        {
            "type": "object",
            "properties": {
                "queue": {"$ref": "queues%20v2.json"},
                "owner": {"$ref": "../shared/people.json#/$defs/person"},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/queues_v2.json"}, "maxItems": 2},
            },
            "required": ["queue", "owner"],
            "additionalProperties": False,
            "$defs": {"queues_v2.json": {"type": "string", "maxLength": 4}, "id": {"type": "integer", "minimum": 1}},
        },
    )
    _write(root / "schemas" / "queues v2.json", {"enum": ["billing", "tech", "sales"]})
    _write(
        root / "shared" / "people.json",
        {
            "$defs": {
                "person": {
                    "type": "object",
                    "properties": {
                        "name": {"$ref": "#/$defs/name"},
                        "id": {"$ref": "../schemas/ticket.json#/$defs/id"},
                        "team": {"$ref": "teams.json"},
                    },
                    "required": ["name", "id"],
                    "additionalProperties": False,
                },
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
            }
        },
    )
    _write(root / "shared" / "teams.json", {"type": "string", "enum": ["red", "blue"]})
    return root


VALUES: list[Any] = [
    {"queue": "billing", "owner": {"name": "ann", "id": 3}},
    {"queue": "tech", "owner": {"name": "bob", "id": 1, "team": "red"}, "tags": ["ab", "cd"]},
    {"queue": "legal", "owner": {"name": "ann", "id": 3}},  # not a queue
    {"queue": "billing", "owner": {"name": "", "id": 3}},  # name too short
    {"queue": "billing", "owner": {"name": "ann", "id": 0}},  # id below 1 (the root's own def)
    {"queue": "billing", "owner": {"name": "ann", "id": 3, "team": "green"}},  # not a team
    {"queue": "billing", "owner": {"name": "ann", "id": 3}, "tags": ["toolong"]},  # the root's def
    {"queue": "billing", "owner": {"name": "ann", "id": 3, "x": 1}},
    {"queue": "billing"},
]


def _file_refs(doc: Any) -> list[str]:
    return [ref for _, ref in _iter_refs(doc) if not ref.startswith("#")]


def test_the_bundle_admits_exactly_what_the_files_admit(tree: Path) -> None:
    schemas = SchemaSet(tree)
    path = tree / "schemas" / "ticket.json"
    bundled = schemas.bundled(path)
    assert _file_refs(schemas.load(path)) and not _file_refs(bundled)
    assert sorted(bundled["$defs"]) == [
        "id",
        "queues_v2.json",
        "queues_v2.json-2",
        "shared.people.json",
        "shared.teams.json",
    ]
    standalone = jsonschema.Draft202012Validator(bundled)
    verdicts = [(schemas.validate(json.dumps(v), schemas.load(path), base=path) is not None) for v in VALUES[:2]]
    assert verdicts == [True, True]
    for value in VALUES:
        with_files = _admits(schemas, path, value)
        assert standalone.is_valid(value) is with_files, value
    assert [_admits(schemas, path, v) for v in VALUES] == [True, True] + [False] * 7
    assert schemas.load(path) == read_schema_file(path)  # the loaded document is not changed


def _admits(schemas: SchemaSet, path: Path, value: Any) -> bool:
    try:
        schemas.validate(json.dumps(value), schemas.load(path), base=path)
    except AgentError as exc:
        assert exc.kind is ErrorKind.SCHEMA_INVALID
        return False
    return True


def test_the_bundle_compiles_to_a_grammar_and_the_files_do_not(tree: Path) -> None:
    path = tree / "schemas" / "ticket.json"
    assert compile_schema(read_schema_file(path)).refusals[0].construct == "$ref"
    compiled = compile_schema(SchemaSet(tree).bundled(path))
    assert compiled.exact, compiled.refusals


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"$id": "https://example.com/teams.json"}, "an $id: the file's refs resolve against it"),
        ({"$anchor": "team"}, "an anchor"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "another dialect"),
    ],
)
def test_a_file_that_cannot_be_copied_exactly_leaves_the_document_as_it_is(
    tree: Path, change: dict[str, Any], why: str
) -> None:
    teams = tree / "shared" / "teams.json"
    _write(teams, {**json.loads(teams.read_text()), **change})
    path = tree / "schemas" / "ticket.json"
    doc = read_schema_file(path)
    assert bundle_file_refs(path, tree, read_schema_file) == doc, why


@pytest.mark.parametrize(
    "ref",
    ["queues%20v2.json#team", "https://example.com/x.json", "../../outside.json", "missing.json", "/etc/passwd"],
)
def test_a_ref_the_load_check_refuses_leaves_the_document_as_it_is(tree: Path, ref: str) -> None:
    (tree.parent / "outside.json").write_text("{}")
    path = tree / "schemas" / "ticket.json"
    doc = read_schema_file(path)
    doc["properties"]["extra"] = {"$ref": ref}
    _write(path, doc)
    assert bundle_file_refs(path, tree, read_schema_file) == doc


def test_an_agent_is_sent_the_bundle_and_the_answer_is_validated_against_the_files(tree: Path) -> None:
    (tree / "app.yaml").write_text("agent_plugins:\n  agent.other: {plugin: builtin.inprocess}\n")
    seen: list[dict[str, Any] | None] = []
    answers = iter([VALUES[0], VALUES[4]])

    def agent(request: AskRequest) -> Any:
        seen.append(request.schema)
        return next(answers)

    with Runtime(load_config(tree / "app.yaml")) as rt:
        rt.register_inprocess("agent.other", agent)
        assert rt.call("extract", agent="agent.other", prompt="p", schema="schemas/ticket.json").submission == VALUES[0]
        with pytest.raises(AgentError) as info:
            rt.call("extract", agent="agent.other", prompt="p", schema="schemas/ticket.json")
    assert info.value.kind is ErrorKind.SCHEMA_INVALID and info.value.detail.startswith("$.owner.id: minimum")
    assert len(seen) == 2 and all(
        s is not None and not _file_refs(s) and "shared.people.json" in s["$defs"] for s in seen
    )


def test_a_decide_gate_on_a_local_grammar_may_split_its_schema_over_files(tree: Path) -> None:
    gate = (
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:1', grammar: true}\n"
        "gates:\n  g: {invoke: host.agent.decide, agent: agent.local, with: {prompt: hi, schema: schemas/ticket.json}}\n"
    )
    (tree / "app.yaml").write_text(gate)
    load_config(tree / "app.yaml")  # before: "$ref ... is outside the llama.cpp grammar subset"
    # what the grammar cannot hold is still named, inside the file that holds it
    _write(tree / "shared" / "teams.json", {"type": "array", "items": {"type": "string"}, "uniqueItems": True})

    with pytest.raises(ConfigError) as info:
        load_config(tree / "app.yaml")
    assert '"uniqueItems"' in str(info.value) and "gates.g.with.schema" in str(info.value)


def test_an_id_naming_its_own_file_does_not_stop_the_bundle(tree: Path) -> None:
    """``"$id": "ticket.json"`` in ticket.json (and ``teams.json`` in teams.json) moves no base:
    the bundle is made as without it (before: the document was sent with its file refs, which
    no agent can resolve, and a decide gate on a local grammar was refused at load), and a copied
    file's own ``$id`` is dropped (under ``$defs`` it would make a new base)."""
    ticket, teams = tree / "schemas" / "ticket.json", tree / "shared" / "teams.json"
    _write(ticket, {**json.loads(ticket.read_text()), "$id": "ticket.json"})
    _write(teams, {**json.loads(teams.read_text()), "$id": "teams.json"})
    schemas = SchemaSet(tree)
    bundled = schemas.bundled(ticket)
    assert not _file_refs(bundled)
    assert "$id" not in bundled["$defs"]["shared.teams.json"]
    standalone = jsonschema.Draft202012Validator(bundled)
    assert [standalone.is_valid(v) for v in VALUES] == [_admits(schemas, ticket, v) for v in VALUES]
    assert [_admits(schemas, ticket, v) for v in VALUES] == [True, True] + [False] * 7
    assert compile_schema(bundled).exact
    # an $id naming another file still leaves the document as it is
    _write(ticket, {**json.loads(ticket.read_text()), "$id": "elsewhere/ticket.json"})
    assert bundle_file_refs(ticket, tree, read_schema_file) == read_schema_file(ticket)
