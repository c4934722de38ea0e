"""Fuzzing the loader: generated YAML text (surrogates, deep nesting, wrong types, YAML tags,
aliases) must load or raise ConfigError with printable problems, nothing else; ``localllm
check`` on the same text exits 0 or 2 with no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from localllm import load_config
from localllm.config import PLUGIN_TYPES, PLUGINS
from localllm.config.fields import declared_keys
from localllm.errors import ConfigError

_KEYS = sorted(
    {k for cls in PLUGINS.values() for k in declared_keys(cls)}
    | {
        "plugin",
        "invoke",
        "agent",
        "with",
        "prompt",
        "schema",
        "args",
        "fallback",
        "selection",
        "evidence",
        "policy",
        "examples",
        "embedder",
        "confident",
        "margin",
        "model",
        "dims",
        "x",
        "${X}",
        "1",
    }
)
_TOKENS = [
    "null",
    "~",
    "true",
    "false",
    "0",
    "-1",
    "1",
    "7",
    "99999",
    "1e309",
    ".inf",
    "-.inf",
    ".nan",
    "0.5",
    "3.0",
    '"\\U00110000"',
    '"\\ud800"',
    '"\\udfff.json"',
    '"a\\0b"',
    '"caf\\u00e9\\u2603"',
    '"a\\r\\nb"',
    "!!timestamp banana",
    "!!timestamp 2020-13-45",
    "!!timestamp 2020-01-01",
    "!!binary aGk=",
    "!!set {a: null}",
    "!!omap [{a: 1}]",
    "!!str 1",
    "!!int 12",
    "!!float 1e400",
    "!!python/name:os.system",
    "!!bool yes",
    '"http://[::1/mcp"',
    '"http://127.0.0.1:99999/x"',
    '"http://127.0.0.1:8080"',
    '"localhost:1"',
    '"${X}"',
    '"${}"',
    '"${NOPE_VAR_1}"',
    '"Bearer ${HOME}"',
    "agent.claude",
    "agent.x",
    "host.agent.decide",
    "host.agent.nope",
    "gemma-3-270m",
    "all-minilm-l6-v2",
    "model.gguf",
    "./llama-server",
    "~nosuchuser-x/m.gguf",
    "none",
    "schemas/{{ args.kind }}.json",
    "'{{ env.X }}'",
    "prompts/p.md",
    '"' + "n" * 300 + '.json"',
    "cheapest-passing",
    *[f'"{t}"' for t in PLUGIN_TYPES],
    "cassette",
    "mcp_stdio",
]


def _text(value: str) -> str:
    return json.dumps(value)  # JSON strings are YAML double-quoted scalars (escapes included)


_SCALAR = (
    st.sampled_from(_TOKENS)
    | st.text(alphabet=st.characters(codec=None), max_size=12).map(_text)
    | st.integers(-(10**30), 10**30).map(str)
)
_KEY = st.sampled_from(_KEYS) | st.sampled_from(_TOKENS[:20]) | st.text(max_size=6).map(_text)


def _collections(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    seq = st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
    mapping = st.lists(st.tuples(_KEY, children), max_size=5).map(
        lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
    )
    deep = st.tuples(st.integers(1, 70), children).map(lambda t: "[" * t[0] + t[1] + "]" * t[0])
    return seq | mapping | deep


_VALUE = st.recursive(_SCALAR, _collections, max_leaves=6)
_DECL = st.lists(st.tuples(st.sampled_from(_KEYS), _VALUE | _SCALAR), max_size=5).map(
    lambda kvs: "{" + ", ".join(f"{k}: {v}" for k, v in kvs) + "}"
)
_AGENT = st.tuples(st.sampled_from((*PLUGIN_TYPES, "nope")), _DECL).map(
    lambda t: "{plugin: " + t[0] + ", " + t[1][1:] if t[1] != "{}" else "{plugin: " + t[0] + "}"
)
_SECTION = {
    "app_id": _VALUE,
    "agent_plugins": st.dictionaries(
        st.sampled_from(["agent.a", "agent.b", "b", "agent.claude"]), _AGENT | _VALUE, max_size=3
    ).map(lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"),
    "gates": st.dictionaries(st.sampled_from(["g", "h"]), _DECL | _VALUE, max_size=2).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
    ),
    "embedders": st.dictionaries(st.sampled_from(["docs", "e"]), _DECL, max_size=2).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
    ),
    "intents": _VALUE,
    "router": _DECL | _VALUE,
    "plugin_dirs": _VALUE,
    "junk": _VALUE,
}
_CONFIG = st.fixed_dictionaries({}, optional=_SECTION).map(lambda d: "".join(f"{k}: {v}\n" for k, v in d.items()))
#: an alias or two, sometimes
_DOC = st.tuples(_CONFIG, st.sampled_from([""] * 9 + ["_a: &a [1, 2]\n", "x: &b [*b]\n", "y: *undefined\n"])).map(
    lambda t: t[1] + t[0] if not t[0].startswith("_") else t[0]
)


def _check(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(path)
    except ConfigError as exc:
        assert exc.problems
        rendered = str(exc)
        rendered.encode("utf-8")  # printable: no lone surrogate survives into a message
        json.dumps([p.__dict__ for p in exc.problems], ensure_ascii=False).encode("utf-8")


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(text=_DOC)
def test_fuzzed_configs_load_or_raise_config_error(tmp_path: Path, text: str) -> None:
    _check(tmp_path, text)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(text=_DOC)
def test_fuzzed_configs_through_localllm_check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli import main

    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code = main(["check", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 2), (code, err)
    assert "Traceback" not in out + err
    if code == 0:
        assert json.loads(out)["config"] == str(path)
