"""Every path that validates an answer asserts the formats it claims (grammar.formats.ASSERTED)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from localllm.errors import AgentError, ErrorKind
from localllm.grammar.compile import compile_schema
from localllm.grammar.formats import ASSERTED, SUPERSETS, format_checker, missing_formats
from localllm.grammar.pattern import search
from localllm.grammar.walk import Grammar
from localllm.schema import SchemaSet
from tests.conftest import REPO, in_child
from tests.unit.grammar_harness import both_paths

BAD = {
    "date": "2023-02-29",
    "date-time": "2024-02-30T00:00:00Z",
    "time": "25:00:00Z",
    "duration": "P",
    "email": "no-at-sign",
    "idn-email": "no-at-sign",
    "hostname": "-bad-.example",
    "idn-hostname": "-x",
    "ipv4": "256.1.1.1",
    "ipv6": "::zz",
    "uri": "relative/path",
    "uri-reference": "a b",
    "iri": "é",
    "iri-reference": "a b",
    "uri-template": "http://x/{a",
    "uuid": "not-a-uuid",
    "json-pointer": "a",
    "relative-json-pointer": "/a",
    "regex": "(",
}
GOOD = {
    "date": "2024-02-29",
    "date-time": "2024-02-29T23:59:59.5+05:30",
    "time": "12:00:00Z",
    "duration": "P1D",
    "email": "a@example.com",
    "idn-email": "ü@example.com",
    "hostname": "api.example.com",
    "idn-hostname": "bücher.example",
    "ipv4": "10.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com/a?b=c#d",
    "uri-reference": "../a/b",
    "iri": "https://bücher.example/ü?q=1",
    "iri-reference": "ü/x",
    "uri-template": "http://x/{a}",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "json-pointer": "/a/0",
    "relative-json-pointer": "1/a",
    "regex": "^a+$",
}


@pytest.mark.parametrize(
    "cls",
    [
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    ],
)
def test_every_format_the_draft_has_is_checked(cls: type) -> None:
    assert missing_formats(cls) == []


@pytest.mark.parametrize("fmt", ASSERTED)
def test_bad_values_fail_and_good_values_pass_on_the_answer_path(tmp_path: Path, fmt: str) -> None:
    schemas = SchemaSet(tmp_path)
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}
    assert schemas.validate(json.dumps({"v": GOOD[fmt]}), schema) == {"v": GOOD[fmt]}
    with pytest.raises(AgentError) as caught:
        schemas.validate(json.dumps({"v": BAD[fmt]}), schema)
    assert caught.value.kind is ErrorKind.SCHEMA_INVALID
    assert "format" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("https://bücher.example/ü", True),
        ("http://[::1]:80/", True),
        ("http://a/?\ue000", True),  # iprivate: in the query only
        ("http://a/\ue000", False),
        ("https://x.y/a b", False),
        ("http://a/%zz", False),
    ],
)
def test_iri_checker_follows_rfc_3987(value: str, valid: bool) -> None:
    assert format_checker(jsonschema.Draft202012Validator).conforms(value, "iri") == valid


@pytest.mark.parametrize(
    ("answer", "valid"),
    [
        ("(" * 5000 + ")" * 5000, False),  # re.compile: RecursionError, was a raw traceback
        ("(?:" * 3000 + ")" * 3000, False),
        ("[[a]", True),  # re.compile: FutureWarning "Possible nested set" (an error under -W error)
        ("a(b", False),
    ],
)
def test_a_hostile_regex_answer_is_a_verdict_on_every_path(tmp_path: Path, answer: str, valid: bool) -> None:
    from localllm.service.chat import _violation

    schema = {"type": "string", "format": "regex"}
    if valid:
        assert SchemaSet(tmp_path).validate(json.dumps(answer), schema) == answer
    else:
        with pytest.raises(AgentError) as caught:
            SchemaSet(tmp_path).validate(json.dumps(answer), schema)
        assert caught.value.kind is ErrorKind.SCHEMA_INVALID
    assert (_violation(schema, answer) is None) is valid  # the service's validator


def test_an_unclosed_uri_template_run_is_decided() -> None:
    # uri-template's split regex is quadratic on unclosed braces: 10 s for 100,000, ~17 min here
    verdicts = in_child(
        """
        import json
        from pathlib import Path
        from localllm.errors import AgentError
        from localllm.schema import SchemaSet
        try:
            SchemaSet(Path(".")).validate(json.dumps("x{a}" + "{" * 1_000_000), {"format": "uri-template"})
            print(json.dumps("valid"))
        except AgentError as exc:
            print(json.dumps(exc.kind.value))
        """
    )
    assert verdicts == "schema_invalid"


SUITE = REPO / "tests" / "bench" / "data" / "json_schema_test_suite_formats.jsonl"
DRAFTS = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft6": "http://json-schema.org/draft-06/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
}


def _suite(draft: str) -> Iterator[dict[str, Any]]:
    """The test suite's format groups of ``draft``, each schema naming its draft (the suite's
    draft-4 to 7 schemas leave it to the directory)."""
    for line in SUITE.read_text().splitlines():
        group = json.loads(line)
        if group["draft"] == draft:
            group["schema"] = {"$schema": DRAFTS[draft], **group["schema"]}
            yield group


@pytest.mark.parametrize("draft", DRAFTS)
def test_every_asserted_format_gives_the_json_schema_test_suite_s_verdicts(tmp_path: Path, draft: str) -> None:
    """Every instance of the JSON-Schema-Test-Suite's format tests, on the answer path and the
    service's: 79 of 745 (draft 2020-12) were wrong when the libraries decided (a leap second
    refused, `@example.com` an email, a UUID with a trailing hyphen, `example.com\n` a
    hostname, a fractional duration, ...)."""
    wrong, seen = [], 0
    for group in _suite(draft):
        for test in group["tests"]:
            seen += 1
            answer_path, service = both_paths(tmp_path, group["schema"], test["data"])
            if (answer_path, service) != (test["valid"], test["valid"]):
                wrong.append((group["format"], test["description"], test["data"], answer_path, service))
    assert seen > 200
    assert wrong == []


@pytest.mark.parametrize("draft", ["draft7", "draft2020-12"])
def test_no_format_grammar_writes_an_instance_the_test_suite_calls_invalid(draft: str) -> None:
    """The compiled grammars are narrower than the formats; none admits an invalid one."""
    admitted, tried = [], 0
    for group in _suite(draft):
        result = compile_schema(group["schema"])
        if result.grammar is None:
            continue
        grammar = Grammar.parse(result.grammar)
        for test in group["tests"]:
            if not test["valid"]:
                tried += 1
                if grammar.matches(json.dumps(test["data"])):
                    admitted.append((group["format"], test["description"], test["data"]))
    assert tried > 150
    assert admitted == []


def _strings(draft: str, valid: bool) -> Iterator[tuple[str, str]]:
    for group in _suite(draft):
        for test in group["tests"]:
            if test["valid"] is valid and isinstance(test["data"], str):
                yield group["format"], test["data"]


@pytest.mark.parametrize("draft", DRAFTS)
def test_every_string_the_suite_calls_valid_matches_its_format_s_superset(draft: str) -> None:
    """SUPERSETS tell formats apart and negate them: each must hold every valid string (and
    an exact one no invalid string)."""
    missed = [(f, s) for f, s in _strings(draft, True) if f in SUPERSETS and not search(SUPERSETS[f][0], s)]
    held = [
        (f, s) for f, s in _strings(draft, False) if SUPERSETS.get(f, ("", False))[1] and search(SUPERSETS[f][0], s)
    ]
    assert sum(f in SUPERSETS for f, _ in _strings(draft, True)) > 40
    assert (missed, held) == ([], [])


@pytest.mark.parametrize("fmt", sorted(set(SUPERSETS) & set(ASSERTED)))
def test_every_string_a_format_grammar_writes_matches_its_superset(fmt: str) -> None:
    for draft in ("http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"):
        compiled = compile_schema({"$schema": draft, "type": "string", "format": fmt})
        if compiled.grammar is None:  # not a format of draft 4
            continue
        grammar, rng = Grammar.parse(compiled.grammar), random.Random(7)
        texts = [json.loads(grammar.sample(rng)) for _ in range(300)]
        assert [t for t in texts if not search(SUPERSETS[fmt][0], t)] == []


@pytest.mark.parametrize(
    "draft", ["http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"]
)
def test_the_exact_supersets_decide_near_misses_as_the_checks_do(draft: str) -> None:
    check = format_checker(jsonschema.validators.validator_for({"$schema": draft}))
    octets = ["0", "00", "01", "1", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "300", "1000"]
    octets += ["\u0663", "-1", " 1", "1 ", "0x1", ""]
    rng = random.Random(11)
    texts = [".".join(rng.choice(octets) for _ in range(rng.choice([3, 4, 4, 4, 5]))) for _ in range(4000)]
    texts += [t + "\n" for t in texts[:200]]
    hexes = "0123456789abcdefABCDEFg-"
    texts += ["-".join("".join(rng.choice(hexes) for _ in range(n)) for n in (8, 4, 4, 4, 12)) for _ in range(2000)]
    texts += [t[:-1] for t in texts[-300:]] + [f"{{{t}}}" for t in texts[-300:]]
    wrong = []
    for fmt, (superset, exact) in SUPERSETS.items():
        if exact and fmt in check.checkers:
            wrong += [(fmt, t) for t in texts if search(superset, t) != check.conforms(t, fmt)]
    assert sum(check.conforms(t, "ipv4") for t in texts) > 100
    assert wrong == []
