"""Per-answer confidence from token logprobs: choice fields, spans and hand-computed values."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from localllm.agents import confidence
from localllm.agents.confidence import Token, alternatives, has_choice_fields, measure, parse_logprobs

TRIAGE = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "queue": {"enum": ["billing", "bug", "feature", "other"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["summary", "queue", "priority"],
}


def toks(content: str, dists: dict[str, dict[str, float]] | None = None) -> list[Token]:
    """``content`` as \\w+ runs and single characters; ``dists[piece]`` is the distribution there."""
    out = []
    for piece in re.findall(r"\w+|\W", content):
        dist = (dists or {}).get(piece, {piece: 1.0})
        top = tuple((t.encode(), math.log(p)) for t, p in dist.items())
        out.append(Token(piece.encode(), math.log(dist.get(piece, 1.0)), top))
    return out


def test_alternatives_per_kind() -> None:
    root: dict[str, Any] = {"$defs": {"q": {"enum": ["a", "b"]}}}
    assert alternatives({"enum": ["a", 1, None, True]}, root) == ('"a"', "1", "null", "true")
    assert alternatives({"enum": ["only"]}, root) is None  # one alternative says nothing
    assert alternatives({"type": "boolean"}, root) == ("true", "false")
    assert alternatives({"type": ["boolean", "null"]}, root) == ("true", "false", "null")
    assert alternatives({"type": "integer", "minimum": 1, "maximum": 3}, root) == ("1", "2", "3")
    assert alternatives({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, root) == ("1", "2")
    assert alternatives({"type": "integer", "minimum": 0, "maximum": 1000}, root) is None  # too many: free text
    assert alternatives({"type": "integer", "minimum": 0}, root) is None
    assert alternatives({"type": "string"}, root) is None
    assert alternatives({"$ref": "#/$defs/q"}, root) == ('"a"', '"b"')
    assert alternatives({"enum": ["é"]} | {"enum": ["é", "e"]}, root) == ('"é"', '"e"')  # not ASCII-escaped


def test_has_choice_fields_walks_properties_items_and_refs() -> None:
    assert has_choice_fields(TRIAGE)
    assert not has_choice_fields({"type": "object", "properties": {"s": {"type": "string"}}})
    nested = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/flag"}}},
        "$defs": {"flag": {"type": "boolean"}},
    }
    assert has_choice_fields(nested)


def test_value_probability_is_renormalised_over_the_alternatives() -> None:
    content = '{"summary":"x","queue":"bug","priority":3}'
    # "hello" is a token the grammar forbids here: it takes no share of the alternatives' mass
    tokens = toks(
        content,
        {"bug": {"bug": 0.5, "billing": 0.2, "feature": 0.1, "hello": 0.15}, "3": {"3": 0.6, "1": 0.2, "x": 0.2}},
    )
    got = measure(TRIAGE, content, tokens)
    assert got.method == "logprobs"
    assert got.fields["queue"] == pytest.approx(0.5 / 0.8)
    assert got.fields["priority"] == pytest.approx(0.6 / 0.8)
    assert got.value == pytest.approx(0.5 / 0.8 * 0.6 / 0.8)  # combined by product
    assert "summary" not in got.fields  # free text is not measured
    meta = got.as_meta()
    assert meta["confidence"] == pytest.approx(0.46875) and meta["confidence_method"] == "logprobs"


def test_a_token_that_spans_the_value_and_what_follows() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    content = '{"ok":true}'
    tokens = [
        Token(b'{"ok":', 0.0, ((b'{"ok":', 0.0),)),
        # "true}" runs past the value; "false}" and "fals" are the other alternative
        Token(
            b"true}", math.log(0.6), ((b"true}", math.log(0.6)), (b"fals", math.log(0.3)), (b"maybe", math.log(0.1)))
        ),
    ]
    got = measure(schema, content, tokens)
    assert got.fields == {"ok": pytest.approx(0.6 / 0.9)}


def test_a_number_another_alternative_extends_is_decided_by_the_next_token() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}}}
    content = '{"n":1}'
    tokens = toks(content, {"1": {"1": 0.5, "2": 0.3}, "}": {"}": 0.4, "0": 0.4, "5": 0.2}})
    got = measure(schema, content, tokens)
    # step 1: "1" keeps 1, 10, 11, 12 alive (0.5) against "2" (0.3); step 2: "}" ends it (0.4)
    # against "0" (10: 0.4); "5" would make 15, outside 1..12, so it is not an alternative
    assert got.fields["n"] == pytest.approx(0.5 / 0.8 * 0.4 / 0.8)


def test_array_items_get_their_own_labels() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}}}}
    content = '{"tags":["a","b"]}'
    tokens = toks(content, {"a": {"a": 0.9, "b": 0.1}, "b": {"b": 0.6, "a": 0.4}})
    got = measure(schema, content, tokens)
    assert got.fields == {"tags[0]": pytest.approx(0.9), "tags[1]": pytest.approx(0.6)}
    assert got.value == pytest.approx(0.54)


def test_what_cannot_be_measured_says_why() -> None:
    content = '{"summary":"x","queue":"bug","priority":3}'
    assert measure(TRIAGE, content, None).method == confidence.UNAVAILABLE
    assert measure(TRIAGE, content, None).value is None
    assert measure(None, "hi", toks("hi")).method == confidence.NOT_APPLICABLE
    free = {"type": "object", "properties": {"s": {"type": "string"}}}
    assert measure(free, '{"s":"x"}', toks('{"s":"x"}')).method == confidence.NOT_APPLICABLE
    # tokens that do not spell the content (a stop word cut, a fence) are not guessed at
    assert measure(TRIAGE, content, toks(content[:-1])).method == confidence.UNMATCHED
    # an optional choice field that is absent: nothing to measure
    optional = {"type": "object", "properties": {"q": {"enum": ["a", "b"]}, "s": {"type": "string"}}}
    assert measure(optional, '{"s":"x"}', toks('{"s":"x"}')).method == confidence.NOT_APPLICABLE


def test_parse_logprobs_reads_the_openai_shape() -> None:
    data = {
        "choices": [
            {
                "logprobs": {
                    "content": [
                        # bytes win over token (a multi-byte character split across tokens)
                        {
                            "token": "?",
                            "bytes": [0xC3],
                            "logprob": -0.1,
                            "top_logprobs": [{"token": "?", "bytes": [0xC3], "logprob": -0.1}],
                        },
                        {"token": "\xa9", "logprob": -0.2, "top_logprobs": [{"token": "x", "logprob": -3.0}]},
                    ]
                }
            }
        ]
    }
    tokens = parse_logprobs(data)
    assert tokens is not None
    assert [t.data for t in tokens] == [b"\xc3", "\xa9".encode()]
    assert tokens[1].top == ((b"x", -3.0),) and tokens[0].logprob == -0.1
    assert parse_logprobs({"choices": [{"message": {}}]}) is None
    assert parse_logprobs({"choices": [{"logprobs": {"content": [{"token": "a"}]}}]}) is None  # no logprob


def test_score_alternatives_normalises_each_values_whole_probability() -> None:
    content = '{"summary":"x","queue":"bug","priority":3}'
    seen: list[tuple[str, str]] = []
    # each alternative's tokens: "bug" as two tokens (0.5 · 0.8), the others one token each;
    # a trailing end-of-turn token (empty bytes) must not count
    table = {
        '"billing"': [Token(b'"billing"', math.log(0.2))],
        '"bug"': [Token(b'"b', math.log(0.5)), Token(b'ug"', math.log(0.8)), Token(b"", math.log(0.01))],
        '"feature"': [Token(b'"feature"', math.log(0.1))],
        '"other"': [Token(b'"other"', math.log(0.3))],
        **{
            str(i): [Token(str(i).encode(), math.log(p))]
            for i, p in zip(range(1, 6), (0.1, 0.1, 0.6, 0.1, 0.1), strict=True)
        },
    }

    def scorer(head: str, alt: str) -> list[Token]:
        seen.append((head, alt))
        return table[alt]

    got = confidence.score_alternatives(TRIAGE, content, scorer)
    assert got.method == "score"
    assert got.fields["queue"] == pytest.approx(0.4 / (0.2 + 0.4 + 0.1 + 0.3))
    assert got.fields["priority"] == pytest.approx(0.6)
    assert got.value == pytest.approx(0.4 * 0.6)
    assert ('{"summary":"x","queue":', '"bug"') in seen and ('{"summary":"x","queue":"bug","priority":', "5") in seen
    assert len(seen) == 4 + 5  # one request per alternative, none for the free-text summary
    assert confidence.score_alternatives(TRIAGE, content, lambda h, a: None).method == confidence.UNAVAILABLE
