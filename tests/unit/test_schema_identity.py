"""``$id``s and anchors in gate schemas: the load check (``ref_problems``) resolves every
``$ref`` as validation does, so a schema the check passes validates its answers, and one it
refuses could not have (the two used to disagree in both directions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localllm.errors import AgentError, ConfigError, ErrorKind, SchemaError
from localllm.loading import load_config
from localllm.schema import SchemaSet, bundle_file_refs, read_schema_file, ref_problems

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
INT = {"type": "integer"}


def _obj(a: Any, **extra: Any) -> dict[str, Any]:
    """An object schema whose property ``a`` is ``a``: answers ``{"a": 1}`` / ``{"a": "x"}``."""
    return {"type": "object", "properties": {"a": a}, "required": ["a"], **extra}


#: (name, the gate schema, other files beside it); property ``a`` must be an integer
RESOLVABLE: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "an embedded resource named by its absolute $id",  # refused at load before
        _obj({"$ref": "https://example.com/n.json"}, **{"$defs": {"n": {"$id": "https://example.com/n.json", **INT}}}),
        {},
    ),
    ("an $anchor", _obj({"$ref": "#num"}, **{"$defs": {"n": {"$anchor": "num", **INT}}}), {}),  # refused before
    ("an anchor in another file", _obj({"$ref": "common.json#num"}), {"common.json": {"$anchor": "num", **INT}}),
    (
        "a draft-7 fragment $id",  # refused before
        _obj({"$ref": "#num"}, **{"$schema": D7, "definitions": {"n": {"$id": "#num", **INT}}}),
        {},
    ),
    (
        "a nested relative $id, then a file ref relative to it",  # refused before ("points outside")
        _obj({"$id": "sub/x.json", "$ref": "../common.json#/$defs/n"}),
        {"common.json": {"$defs": {"n": INT}}},
    ),
    (
        "a relative root $id",  # every answer failed before: the ref resolved to a bare "common.json"
        _obj({"$ref": "common.json#/$defs/n"}, **{"$id": "gate.json"}),
        {"common.json": {"$defs": {"n": INT}}},
    ),
    (
        "a relative root $id in a subdirectory",  # every answer failed before
        _obj({"$ref": "../common.json#/$defs/n"}, **{"$id": "sub/gate.json"}),
        {"common.json": {"$defs": {"n": INT}}},
    ),
    (
        "draft 4 with a file ref",  # every answer failed before: draft 4 reads "id", not "$id"
        _obj({"$ref": "common.json#/definitions/n"}, **{"$schema": D4}),
        {"common.json": {"definitions": {"n": INT}}},
    ),
    (
        "draft 4 with an absolute id and a local ref",
        _obj(
            {"$ref": "#/definitions/n"},
            **{"$schema": D4, "id": "https://example.com/g.json", "definitions": {"n": INT}},
        ),
        {},
    ),
    (
        "a draft-4 id in a scheme urljoin does not know",  # refused before: the base lost its "//"
        _obj(
            {"$ref": "#/definitions/n"},
            **{"$schema": D4, "id": "classpath:///schemas/gate.json#", "definitions": {"n": INT}},
        ),
        {},
    ),
    (
        "a ref into a meta-schema",  # refused before ("absolute or remote"): validation has them built in
        _obj({"$ref": "http://json-schema.org/draft-07/schema#/definitions/nonNegativeInteger"}),
        {},
    ),
    (
        "a draft-4 resource holding a boolean schema, in a draft-7 document",  # crawl: TypeError
        _obj(
            {"$ref": "#/definitions/n"},
            **{
                "$schema": D7,
                "$id": "gate.json",
                "definitions": {"n": INT, "old": {"$schema": D4, "properties": {"x": True}}},
            },
        ),
        {},
    ),
    (
        "draft-7 dependencies mixing a schema and a property list",  # crawl: AttributeError
        _obj(
            {"$ref": "#/definitions/n"},
            **{"$schema": D7, "$id": "gate.json", "definitions": {"n": INT}, "dependencies": {"a": {}, "c": ["a"]}},
        ),
        {},
    ),
    (
        "draft 6 with a file ref",
        _obj({"$ref": "common.json#/definitions/n"}, **{"$schema": D6}),
        {"common.json": {"definitions": {"n": INT}}},
    ),
    (
        "an $id in a referred file, resolved against that file",
        _obj({"$ref": "lib/common.json#/$defs/n"}),
        {"lib/common.json": {"$id": "common.json", "$defs": {"n": {"$ref": "more.json"}}}, "lib/more.json": INT},
    ),
]

#: (name, the gate schema, other files, what the load check says)
UNRESOLVABLE: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "an absolute root $id before a relative file ref",  # load passed before, every answer failed
        _obj({"$ref": "common.json#/$defs/n"}, **{"$id": "https://example.com/gate.json"}),
        {"common.json": {"$defs": {"n": INT}}},
        "$.properties.a: $ref 'common.json#/$defs/n' resolves against the $id 'https://example.com/gate.json' "
        "to 'https://example.com/common.json', which no schema here declares",
    ),
    (
        "a draft-4 absolute id before a relative file ref",  # load passed before
        _obj({"$ref": "common.json#/definitions/n"}, **{"$schema": D4, "id": "https://example.com/g.json"}),
        {"common.json": {"definitions": {"n": INT}}},
        "$.properties.a: $ref 'common.json#/definitions/n' resolves against the $id 'https://example.com/g.json'",
    ),
    (
        "an anchor nobody declares",
        _obj({"$ref": "#nope"}, **{"$defs": {"n": {"$anchor": "num", **INT}}}),
        {},
        "$.properties.a: $ref '#nope' does not resolve",
    ),
    (
        "a remote ref no $id declares",
        _obj({"$ref": "https://example.com/m.json"}, **{"$defs": {"n": {"$id": "https://example.com/n.json", **INT}}}),
        {},
        "$.properties.a: $ref 'https://example.com/m.json' is absolute or remote and no schema here declares it",
    ),
    (
        "a nested $id whose file ref leaves the directory",
        _obj({"$id": "sub/x.json", "$ref": "../../common.json#/$defs/n"}),
        {},
        "$.properties.a: $ref '../../common.json#/$defs/n' points outside the config directory",
    ),
    (
        "a missing file beside an anchor",
        _obj({"$ref": "gone.json"}, **{"$defs": {"n": {"$anchor": "num", **INT}}}),
        {},
        "$.properties.a: $ref 'gone.json': file ",
    ),
    (
        "a pointer into an embedded resource that is not there",
        _obj(
            {"$ref": "https://example.com/n.json#/minimum"},
            **{"$defs": {"n": {"$id": "https://example.com/n.json", **INT}}},
        ),
        {},
        "$.properties.a: $ref 'https://example.com/n.json#/minimum' does not resolve",
    ),
]


def _tree(tmp_path: Path, gate: dict[str, Any], files: dict[str, Any]) -> tuple[Path, Path]:
    root = tmp_path / "cfg"
    for name, doc in {"gate.json": gate, **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(doc))
    return root, root / "gate.json"


def _verdict(root: Path, path: Path, value: Any) -> str:
    schemas = SchemaSet(root)
    try:
        schemas.validate(json.dumps(value), schemas.load(path), base=path)
    except AgentError as exc:
        assert exc.kind is ErrorKind.SCHEMA_INVALID
        return "invalid"
    except SchemaError:
        return "unresolvable"
    return "valid"


@pytest.mark.parametrize(("gate", "files"), [c[1:] for c in RESOLVABLE], ids=[c[0] for c in RESOLVABLE])
def test_a_ref_the_load_check_passes_is_one_validation_resolves(
    tmp_path: Path, gate: dict[str, Any], files: dict[str, Any]
) -> None:
    root, path = _tree(tmp_path, gate, files)
    assert ref_problems(path, root) == []
    assert _verdict(root, path, {"a": 1}) == "valid"
    assert _verdict(root, path, {"a": "x"}) == "invalid"


@pytest.mark.parametrize(("gate", "files", "said"), [c[1:] for c in UNRESOLVABLE], ids=[c[0] for c in UNRESOLVABLE])
def test_a_ref_the_load_check_refuses_is_one_validation_cannot_resolve(
    tmp_path: Path, gate: dict[str, Any], files: dict[str, Any], said: str
) -> None:
    root, path = _tree(tmp_path, gate, files)
    found = ref_problems(path, root)
    assert len(found) == 1
    assert found[0].startswith(f"gate.json: {said}")
    assert _verdict(root, path, {"a": 1}) == "unresolvable"


def test_an_unreadable_file_reached_from_a_schema_with_an_id_is_named_once(tmp_path: Path) -> None:
    gate = _obj({"$ref": "broken.json"}, **{"$id": "gate.json", "properties": {"b": {"$ref": "broken.json"}}})
    root, path = _tree(tmp_path, gate, {})
    (root / "broken.json").write_text("{nope")
    found = ref_problems(path, root)
    assert len(found) == 1
    assert found[0].startswith(f"{root / 'broken.json'}: not valid JSON")


def test_a_gate_with_an_embedded_resource_loads_and_a_misplaced_id_is_a_config_problem(tmp_path: Path) -> None:
    good = RESOLVABLE[0][1]
    bad = UNRESOLVABLE[0][1]
    root = tmp_path / "app"
    (root / "schemas").mkdir(parents=True)
    (root / "schemas" / "good.json").write_text(json.dumps(good))
    (root / "schemas" / "bad.json").write_text(json.dumps(bad))
    (root / "schemas" / "common.json").write_text(json.dumps({"$defs": {"n": INT}}))
    head = "agent_plugins:\n  agent.i: {plugin: builtin.inprocess}\ngates:\n"
    gate = (
        "  {0}:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {{prompt: hi, schema: schemas/{0}.json}}\n"
    )
    (root / "ok.yaml").write_text(head + gate.format("good"))
    assert load_config(root / "ok.yaml").gates["good"].schema_path == root / "schemas" / "good.json"
    (root / "app.yaml").write_text(head + gate.format("good") + gate.format("bad"))
    with pytest.raises(ConfigError) as info:
        load_config(root / "app.yaml")
    assert [(p.key, "resolves against the $id" in p.message) for p in info.value.problems] == [
        ("gates.bad.with.schema", True)
    ]


def test_a_draft_4_schema_with_a_nested_id_is_sent_as_written(tmp_path: Path) -> None:
    """Draft 4 spells ``$id`` as ``id``: a file ref below one resolves against it, so the
    bundle cannot make it local (it used to, pointing the ref at the wrong document)."""
    gate = _obj({"id": "https://example.com/x.json", "properties": {"b": {"$ref": "common.json"}}}, **{"$schema": D4})
    root, path = _tree(tmp_path, gate, {"common.json": INT})
    assert bundle_file_refs(path, root, read_schema_file) == gate
    plain = _obj({"$ref": "common.json"}, **{"$schema": D4})
    root, path = _tree(tmp_path / "plain", plain, {"common.json": INT})
    assert bundle_file_refs(path, root, read_schema_file)["properties"]["a"] == {"$ref": "#/$defs/common.json"}


#: (name, the gate schema, the JSON path and key named): each used to raise ValueError
#: ("Invalid IPv6 URL", "embedded null byte"), `localllm check` answering "this is a bug in localllm"
NOT_URIS: list[tuple[str, dict[str, Any], str]] = [
    ("a ref that is no URI", _obj({"$ref": "http://[bad"}), "$.properties.a.$ref"),
    ("a network-path ref that is no URI", _obj({"$ref": "//[::1"}), "$.properties.a.$ref"),
    ("a ref with a NUL", _obj({"$ref": "a%00.json"}), "$.properties.a.$ref"),
    (
        "a ref that is no URI beside an $id",
        _obj({"$ref": "http://[bad"}, **{"$id": "gate.json"}),
        "$.properties.a.$ref",
    ),
    ("a root $id that is no URI", _obj({"$ref": "#/$defs/n"}, **{"$id": "http://[bad", "$defs": {"n": INT}}), "$.$id"),
    ("a nested $id that is no URI", _obj(INT, **{"$defs": {"n": {"$id": "http://[x"}}}), "$.$defs.n.$id"),
    (
        "a draft-4 id that is no URI",
        _obj(INT, **{"$schema": D4, "definitions": {"n": {"id": "//[x"}}}),
        "$.definitions.n.id",
    ),
]


@pytest.mark.parametrize(("gate", "named"), [c[1:] for c in NOT_URIS], ids=[c[0] for c in NOT_URIS])
def test_a_ref_or_id_that_is_no_uri_is_named_never_raised(tmp_path: Path, gate: dict[str, Any], named: str) -> None:
    root, path = _tree(tmp_path, gate, {})
    found = ref_problems(path, root)
    assert [p.split(": ")[:2] for p in found] == [["gate.json", named]]
    assert bundle_file_refs(path, root, read_schema_file) == gate  # sent as written
    with pytest.raises(SchemaError) as info:  # given at call time, never seen by the load check
        SchemaSet(root).validate('{"a": 1}', gate)
    assert named in str(info.value)


def test_a_referred_file_whose_id_is_no_uri_is_named(tmp_path: Path) -> None:
    gate = _obj({"$ref": "lib.json"}, **{"$id": "gate.json"})
    root, path = _tree(tmp_path, gate, {"lib.json": {"$id": 5, **INT}})
    assert [p.split(": ")[:2] for p in ref_problems(path, root)] == [["lib.json", "$.$id"]]


def test_check_names_a_ref_that_is_no_uri(tmp_path: Path) -> None:
    root = tmp_path / "app"
    (root / "schemas").mkdir(parents=True)
    (root / "schemas" / "s.json").write_text(json.dumps(_obj({"$ref": "http://[bad"})))
    (root / "app.yaml").write_text(
        "agent_plugins:\n  agent.i: {plugin: builtin.inprocess}\ngates:\n  g:\n    invoke: host.agent.ask\n"
        "    agent: agent.i\n    with: {prompt: hi, schema: schemas/s.json}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(root / "app.yaml")
    assert [(p.key, "$.properties.a.$ref: Invalid IPv6 URL" in p.message) for p in info.value.problems] == [
        ("gates.g.with.schema", True)
    ]


def test_an_anchor_behind_a_subschema_referencing_cannot_crawl_is_named(tmp_path: Path) -> None:
    """Looking up an anchor crawls the document; where referencing's crawl trips over a
    subschema (a draft-7 ``dependencies`` mixing a schema and a property list), validation
    cannot resolve the ref either: a load problem, not a ``TypeError``/``AttributeError``."""
    gate = _obj({"$ref": "#n"}, **{"$schema": D7, "definitions": {"n": {"$id": "#n", **INT}}})
    root, path = _tree(tmp_path, gate, {})
    assert ref_problems(path, root) == []
    gate["dependencies"] = {"a": {}, "c": ["a"]}
    root, path = _tree(tmp_path / "tripped", gate, {})
    found = ref_problems(path, root)
    assert len(found) == 1
    assert found[0].startswith("gate.json: $.properties.a: $ref '#n' cannot be looked up")


REFS_SAMPLE = Path(__file__).parents[1] / "bench" / "data" / "jsonschemabench_refs.jsonl"


@pytest.mark.parametrize(
    "entry", [json.loads(line) for line in REFS_SAMPLE.read_text().splitlines()], ids=lambda e: e["id"]
)
def test_public_schemas_with_ids_and_anchors_load_and_give_their_labelled_verdicts(
    tmp_path: Path, entry: dict[str, Any]
) -> None:
    """Schemas from JSON Schema Store and GitHub (JSONSchemaBench) that the load check refused,
    misread, or that made validation raise: each now loads and gives every labelled instance
    its label."""
    root, path = _tree(tmp_path, entry["schema"], {})
    assert ref_problems(path, root) == []
    verdicts = [_verdict(root, path, test["data"]) for test in entry["tests"]]
    assert verdicts == ["valid" if test["valid"] else "invalid" for test in entry["tests"]]
