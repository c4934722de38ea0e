"""Every load-time config rule: asserting the key path (and the message where wording is the point)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from localllm import load_config
from localllm.config import (
    PLUGINS,
    ClaudeCliDecl,
    Config,
    LocalLLMDecl,
    McpHttpDecl,
    McpStdioDecl,
    Selection,
    SubprocessDecl,
    interpolate,
)
from localllm.config.fields import Context, parse_decl
from localllm.errors import ConfigError, ProblemList


def write(tmp_path: Path, text: str, name: str = "app.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return [f"{p.key}: {p.message}" for p in info.value.problems]


def keys(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert all(p.file for p in info.value.problems)
    return [p.key for p in info.value.problems]


def agent(tmp_path: Path, body: str) -> str:
    return f"agent_plugins:\n  agent.x: {body}\n"


def test_minimal_config_injects_claude(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "app_id: demo\n"))
    assert config.app_id == "demo"
    assert isinstance(config.agents["agent.claude"], ClaudeCliDecl)


def test_app_id_defaults_to_file_stem(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "", name="triage.yaml")).app_id == "triage"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  agent.a: {plugin: [\n")
    assert len(found) == 1
    assert "YAML syntax error at line 3" in found[0]


def test_top_level_not_mapping(tmp_path: Path) -> None:
    assert problems(tmp_path, "- a\n- b\n") == [": the top level must be a mapping, got list"]


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    assert problems(tmp_path, "agents: {}\n") == ['agents: unknown top-level key (did you mean "agent_plugins"?)']


def test_alias_must_start_with_agent(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  fixer: {plugin: builtin.inprocess}\n")
    assert found == ['agent_plugins.fixer: alias "fixer" must start with "agent."']


def test_unknown_plugin_lists_supported_and_suggests(tmp_path: Path) -> None:
    found = problems(tmp_path, agent(tmp_path, "{plugin: builtin.local_lm}"))
    assert found == [
        "agent_plugins.agent.x.plugin: unknown plugin 'builtin.local_lm' (did you mean \"builtin.local_llm\"?) "
        "(supported: builtin.claude_cli, builtin.inprocess, subprocess, mcp_http, builtin.local_llm)"
    ]


def test_cassette_not_declarable(tmp_path: Path) -> None:
    assert keys(tmp_path, agent(tmp_path, "{plugin: cassette}")) == ["agent_plugins.agent.x"]


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        ("{plugin: subprocess}", "agent_plugins.agent.x: subprocess plugin requires command:"),
        ("{plugin: mcp_http}", "agent_plugins.agent.x: mcp_http plugin requires endpoint:"),
        ("{plugin: builtin.local_llm}", "agent_plugins.agent.x: builtin.local_llm plugin requires model: or endpoint:"),
    ],
)
def test_required_fields(tmp_path: Path, decl: str, message: str) -> None:
    assert problems(tmp_path, agent(tmp_path, decl)) == [message]


def test_unknown_key_for_plugin_suggests(tmp_path: Path) -> None:
    found = problems(tmp_path, agent(tmp_path, "{plugin: mcp_http, endpoint: 'http://h/mcp', tols: x}"))
    assert found == ['agent_plugins.agent.x.tols: unknown key for mcp_http plugin (did you mean "tool"?)']


def test_wrong_types(tmp_path: Path) -> None:
    text = agent(tmp_path, "{plugin: builtin.local_llm, endpoint: 'http://h', parallel: many, grammar: 1}")
    assert problems(tmp_path, text) == [
        "agent_plugins.agent.x.parallel: must be an integer, got 'many'",
        "agent_plugins.agent.x.grammar: must be true or false, got 1",
    ]


def test_local_llm_ranges_in_file_order(tmp_path: Path) -> None:
    text = agent(
        tmp_path,
        "{plugin: builtin.local_llm, endpoint: 'http://h', parallel: 0, temperature: 3, api_key_env: 'sk-123 456'}",
    )
    assert keys(tmp_path, text) == [
        "agent_plugins.agent.x.parallel",
        "agent_plugins.agent.x.temperature",
        "agent_plugins.agent.x.api_key_env",
    ]


def test_endpoint_must_be_url(tmp_path: Path) -> None:
    text = agent(tmp_path, "{plugin: mcp_http, endpoint: localhost:7301}")
    assert keys(tmp_path, text) == ["agent_plugins.agent.x.endpoint"]


def test_env_interpolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "s3cret${HOME}")
    text = "agent_plugins:\n  agent.x:\n    plugin: subprocess\n    command: /bin/agent\n    env: {API_KEY: 'k-${TOKEN}-z'}\n"
    decl = load_config(write(tmp_path, text)).agents["agent.x"]
    assert isinstance(decl, SubprocessDecl)
    # single pass: the resolved value's ${HOME} is kept verbatim
    assert decl.env == {"API_KEY": "k-s3cret${HOME}-z"}


def test_unset_env_var_names_var_and_key(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x:\n    plugin: subprocess\n    command: /bin/agent\n    env: {API_KEY: '${NOPE_VAR}'}\n"
    assert problems(tmp_path, text) == ["agent_plugins.agent.x: env var NOPE_VAR referenced in env.API_KEY not set"]


def test_unset_header_var(tmp_path: Path) -> None:
    text = (
        "agent_plugins:\n  agent.x:\n    plugin: mcp_http\n    endpoint: http://127.0.0.1:1/mcp\n"
        "    headers: {Authorization: 'Bearer ${NO_TOKEN}'}\n"
    )
    assert problems(tmp_path, text) == [
        "agent_plugins.agent.x: env var NO_TOKEN referenced in headers.Authorization not set"
    ]


def test_empty_var_reference_is_an_error(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x:\n    plugin: subprocess\n    command: a\n    env: {K: 'a${}b'}\n"
    assert problems(tmp_path, text) == ["agent_plugins.agent.x.env.K: empty ${} reference"]


def test_interpolation_only_in_env_and_headers(tmp_path: Path) -> None:
    decl = load_config(write(tmp_path, agent(tmp_path, "{plugin: subprocess, command: '${NOT_EXPANDED}'}"))).agents
    assert isinstance(decl["agent.x"], SubprocessDecl)
    assert decl["agent.x"].command == "${NOT_EXPANDED}"


def test_interpolate_is_single_pass() -> None:
    env = {"A": "${B}", "B": "no"}
    assert interpolate("x${A}y${B}", env.get) == ("x${B}yno", [], ["${B}", "no"])
    assert interpolate("${MISSING}", env.get) == ("", ["env var MISSING not set"], [])


def test_headers_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOK", "abc")
    text = (
        "agent_plugins:\n  agent.r:\n    plugin: mcp_http\n    endpoint: http://127.0.0.1:7301/mcp\n"
        "    headers: {Authorization: 'Bearer ${TOK}'}\n"
    )
    decl = load_config(write(tmp_path, text)).agents["agent.r"]
    assert isinstance(decl, McpHttpDecl)
    assert decl.headers == {"Authorization": "Bearer abc"}
    assert decl.tool == "ask"


def test_local_llm_defaults(tmp_path: Path) -> None:
    local = load_config(write(tmp_path, agent(tmp_path, "{plugin: builtin.local_llm, endpoint: 'http://h:1'}"))).agents
    decl = local["agent.x"]
    assert isinstance(decl, LocalLLMDecl)
    assert (decl.grammar, decl.json_schema, decl.parallel, decl.max_tokens, decl.fallback) == (
        True,
        False,
        4,
        512,
        "agent.claude",
    )


def test_null_means_the_default(tmp_path: Path) -> None:
    text = agent(
        tmp_path,
        "{plugin: builtin.local_llm, endpoint: 'http://h:1', temperature: null, threads: null, "
        "port: null, server_bin: null, parallel: null}",
    )
    decl = load_config(write(tmp_path, text)).agents["agent.x"]
    assert isinstance(decl, LocalLLMDecl)
    assert (decl.temperature, decl.threads, decl.port, decl.server_bin, decl.parallel) == (None, None, None, None, 4)


def gate_config(tmp_path: Path, gate: str, agents: str = "") -> str:
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "v.json").write_text(
        json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    )
    return f"agent_plugins:\n  agent.i: {{plugin: builtin.inprocess}}\n{agents}gates:\n{gate}"


def test_gate_ok(tmp_path: Path) -> None:
    text = gate_config(
        tmp_path,
        "  g:\n    invoke: host.agent.decide\n    agent: agent.i\n"
        "    with: {prompt: 'Is {{ args.x }} ok?', schema: schemas/v.json}\n",
    )
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert (gate.verb, gate.agent, gate.schema_path) == ("decide", "agent.i", (tmp_path / "schemas/v.json").resolve())


def test_gate_undeclared_alias_suggests(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.decide\n    agent: agent.j\n    with: {prompt: hi}\n")
    assert problems(tmp_path, text) == [
        'gates.g.agent: agent "agent.j" is not declared in agent_plugins: (did you mean "agent.i"?) '
        "(declared: agent.claude, agent.i)"
    ]


def test_gate_bad_verb_and_missing_prompt(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.decid\n    agent: agent.i\n    with: {}\n")
    assert problems(tmp_path, text) == [
        "gates.g.invoke: unknown verb 'decid' (did you mean \"decide\"?) (verbs: ask, decide, extract, task, converse)",
        "gates.g.with.prompt: prompt is required: inline text or a path to a prompt file",
    ]


def test_prompt_file_resolves_relative(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.md").write_text("Decide about {{ args.x }}.")
    text = gate_config(
        tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: prompts/p.md}\n"
    )
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert gate.prompt == "Decide about {{ args.x }}."


def test_missing_prompt_file(tmp_path: Path) -> None:
    text = gate_config(
        tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: prompts/none.md}\n"
    )
    assert keys(tmp_path, text) == ["gates.g.with.prompt"]


def test_schema_outside_config_dir(tmp_path: Path) -> None:
    sub = tmp_path / "app"
    sub.mkdir()
    (tmp_path / "outside.json").write_text("{}")
    text = gate_config(
        sub, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: ../outside.json}\n"
    )
    assert keys(sub, text) == ["gates.g.with.schema"]


def test_schema_ref_outside_and_absolute(tmp_path: Path) -> None:
    sub = tmp_path / "app"
    (sub / "schemas").mkdir(parents=True)
    (tmp_path / "evil.json").write_text("{}")
    (sub / "schemas" / "s.json").write_text(
        json.dumps(
            {
                "properties": {
                    "a": {"$ref": "../../evil.json"},
                    "b": {"$ref": "/etc/passwd"},
                    "c": {"$ref": "common.json#/$defs/x"},
                }
            }
        )
    )
    (sub / "schemas" / "common.json").write_text(json.dumps({"$defs": {"y": {}}}))
    text = gate_config(
        sub, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: schemas/s.json}\n"
    )
    found = problems(sub, text)
    assert len(found) == 3
    assert "$.properties.a: $ref '../../evil.json' points outside the config directory" in found[0]
    assert "$.properties.b: $ref '/etc/passwd' is absolute or remote" in found[1]
    assert "$.properties.c: $ref 'common.json#/$defs/x' does not resolve" in found[2]


def test_a_gate_schema_no_answer_could_be_checked_against_in_time(tmp_path: Path) -> None:
    # 16 $defs that each allOf the next twice: 262,142 applications to check one wrong answer
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(16)}
    (tmp_path / "fan.json").write_text(json.dumps({"$defs": {**defs, "d16": {}}, "$ref": "#/$defs/d0"}))
    text = gate_config(
        tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: fan.json}\n"
    )
    assert keys(tmp_path, text) == ["gates.g.with.schema"]
    assert f"{tmp_path / 'fan.json'}: at $:" in problems(tmp_path, text)[0]


def test_invalid_schema_json(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    text = gate_config(
        tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: bad.json}\n"
    )
    assert keys(tmp_path, text) == ["gates.g.with.schema"]


def test_decide_gate_outside_grammar_subset(tmp_path: Path) -> None:
    (tmp_path / "u.json").write_text(json.dumps({"type": "array", "items": {"type": "string"}, "uniqueItems": True}))
    text = (
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:1', grammar: true}\n"
        "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n    with: {prompt: hi, schema: u.json}\n"
    )
    found = problems(tmp_path, text)
    assert len(found) == 1
    assert 'agent "agent.local" is builtin.local_llm with grammar: true but its decide schema' in found[0]
    assert '"uniqueItems"' in found[0]


def test_grammar_check_skipped_with_json_schema(tmp_path: Path) -> None:
    (tmp_path / "u.json").write_text(json.dumps({"type": "array", "uniqueItems": True}))
    text = (
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://h:1', json_schema: true}\n"
        "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n    with: {prompt: hi, schema: u.json}\n"
    )
    assert "g" in load_config(write(tmp_path, text)).gates


def test_errors_collected_in_stable_file_order(tmp_path: Path) -> None:
    text = (
        "bogus: 1\nagent_plugins:\n  x: {plugin: subprocess}\n  agent.y: {plugin: nope}\n"
        "gates:\n  g: {invoke: host.agent.ask, agent: agent.z, with: {prompt: hi}}\n"
    )
    first = keys(tmp_path, text)
    assert first == keys(tmp_path, text)
    assert first == ["bogus", "agent_plugins.x", "agent_plugins.x", "agent_plugins.agent.y.plugin", "gates.g.agent"]


def test_problem_str_has_file_key_and_hint(tmp_path: Path) -> None:
    path = write(tmp_path, agent(tmp_path, "{plugin: subprocess}"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: agent_plugins.agent.x: subprocess plugin requires command:")
    assert "(hint: command: /path/to/agent)" in text


def test_embedders_intents_router(tmp_path: Path) -> None:
    text = (
        "embedders:\n  docs: {model: all-minilm-l6-v2, dims: 384}\n"
        "intents:\n  greet: [hello, hi]\n  bye: {examples: [goodbye]}\n"
        "router: {embedder: docs, confident: 0.9}\n"
    )
    config = load_config(write(tmp_path, text))
    assert config.embedders["docs"].dims == 384
    assert config.intents["greet"].examples == ("hello", "hi")
    assert config.router is not None and config.router.confident == 0.9
    assert config.router.margin is None  # unset: the embedding model's measured bar, at route time


def test_router_and_embedder_errors(tmp_path: Path) -> None:
    text = "embedders:\n  e: {dims: 0}\nintents:\n  a: []\nrouter: {embedder: nope, margin: 2}\n"
    assert keys(tmp_path, text) == ["embedders.e.dims", "intents.a", "router.embedder", "router.margin"]


def test_router_without_intents(tmp_path: Path) -> None:
    assert keys(tmp_path, "router: {agent: agent.claude}\n") == ["router"]


def test_unknown_managed_model_suggests(tmp_path: Path) -> None:
    found = problems(tmp_path, agent(tmp_path, "{plugin: builtin.local_llm, model: gemma-3-27m}"))
    assert found == ["agent_plugins.agent.x.model: unknown model 'gemma-3-27m' (did you mean \"gemma-3-270m\"?)"]


# ---------------------------------------------------------------- issue 10: fallback, selection, with, templates


def test_fallback_declared_per_agent_and_gate(tmp_path: Path) -> None:
    text = (
        "agent_plugins:\n"
        "  agent.a: {plugin: builtin.local_llm, endpoint: 'http://h:1'}\n"
        "  agent.b: {plugin: builtin.local_llm, endpoint: 'http://h:1', fallback: none}\n"
        "  agent.c: {plugin: builtin.local_llm, endpoint: 'http://h:1', fallback: agent.a}\n"
        "  agent.s: {plugin: subprocess, command: /bin/true}\n"
        "gates:\n"
        "  ga: {invoke: host.agent.ask, agent: agent.a, with: {prompt: hi}}\n"
        "  gb: {invoke: host.agent.ask, agent: agent.b, with: {prompt: hi}}\n"
        "  gc: {invoke: host.agent.ask, agent: agent.c, with: {prompt: hi}}\n"
        "  gn: {invoke: host.agent.ask, agent: agent.a, fallback: none, with: {prompt: hi}}\n"
        "  gs: {invoke: host.agent.ask, agent: agent.s, with: {prompt: hi}}\n"
    )
    config = load_config(write(tmp_path, text))
    assert config.fallbacks() == {"ga": "agent.claude", "gb": None, "gc": "agent.a", "gn": None, "gs": None}
    assert config.fallback_for("agent.a") == "agent.claude"
    assert config.fallback_for("agent.a", "gn") is None
    assert config.fallback_for("agent.s") is None


def test_fallback_errors(tmp_path: Path) -> None:
    text = (
        "agent_plugins:\n"
        "  agent.a: {plugin: builtin.local_llm, endpoint: 'http://h:1', fallback: agent.nope}\n"
        "  agent.s: {plugin: subprocess, command: /bin/true}\n"
        "  agent.t: {plugin: builtin.local_llm, endpoint: 'http://h:1', fallback: agent.t}\n"
        "gates:\n"
        "  g1: {invoke: host.agent.ask, agent: agent.s, fallback: agent.claude, with: {prompt: hi}}\n"
        "  g2: {invoke: host.agent.ask, agent: agent.a, fallback: agent.a, with: {prompt: hi}}\n"
        "  g3: {invoke: host.agent.ask, agent: agent.a, fallback: 7, with: {prompt: hi}}\n"
    )
    assert keys(tmp_path, text) == [
        "agent_plugins.agent.a.fallback",
        "agent_plugins.agent.t.fallback",
        "gates.g1.fallback",
        "gates.g2.fallback",
        "gates.g3.fallback",
    ]


def selection_config(tmp_path: Path, selection: str) -> str:
    return (
        "gates:\n  g:\n    invoke: host.agent.decide\n    with: {agent: agent.claude, prompt: hi}\n"
        f"    selection: {selection}\n"
    )


def test_selection_accepted_and_validated(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "latest.json").write_text(
        '{"kind": "localllm_eval_report", "version": 1, "gate": "g", "fingerprint": {}, "agents": {}}'
    )
    text = selection_config(
        tmp_path,
        "{profile: synthetic-codex, model: 'syn:small:text', effort: low, "
        "evidence: evals/latest.json, fallback_profile: claude, "
        "policy: cheapest-passing, min_accuracy: 0.9, max_fallback_rate: 0.1}",
    )
    selection = load_config(write(tmp_path, text)).gates["g"].selection
    assert selection == Selection(
        profile="synthetic-codex",
        model="syn:small:text",
        effort="low",
        evidence=(tmp_path / "evals" / "latest.json").resolve(),
        fallback_profile="claude",
        policy="cheapest-passing",
        min_accuracy=0.9,
        max_fallback_rate=0.1,
    )


def test_selection_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "plain.json").write_text('{"accuracy": 0.9}')
    (tmp_path.parent / "outside.json").write_text("{}")
    cases = {
        "{evidence: plain.json}": "gates.g.selection.evidence",
        "{evidence: bad.json}": "gates.g.selection.evidence",
        "{evidence: ../outside.json}": "gates.g.selection.evidence",
        "{policy: cheapest}": "gates.g.selection.policy",
        "{min_accuracy: 1.5}": "gates.g.selection.min_accuracy",
        "{max_fallback_rate: .nan}": "gates.g.selection.max_fallback_rate",
        "{profil: x}": "gates.g.selection.profil",
        "[a]": "gates.g.selection",
    }
    for selection, key in cases.items():
        assert keys(tmp_path, selection_config(tmp_path, selection)) == [key], selection


def test_with_agent_is_the_gate_agent(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g: {invoke: host.agent.ask, with: {agent: agent.i, prompt: hi, args: {k: 1}}}\n")
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert gate.agent == "agent.i"
    assert gate.with_ == {"agent": "agent.i", "prompt": "hi", "args": {"k": 1}}


def test_with_agent_errors(tmp_path: Path) -> None:
    text = gate_config(
        tmp_path,
        "  g: {invoke: host.agent.ask, agent: agent.i, with: {agent: agent.claude, prompt: hi}}\n"
        "  h: {invoke: host.agent.ask, with: {agent: agent.nope, prompt: hi}}\n",
    )
    assert keys(tmp_path, text) == ["gates.g.with.agent", "gates.h.with.agent"]


def test_gate_with_block_is_carried_as_written(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.md").write_text("Decide {{ args.x }}")
    text = gate_config(
        tmp_path,
        "  g:\n    invoke: host.agent.decide\n    agent: agent.i\n"
        "    with: {prompt: prompts/p.md, schema: schemas/v.json, args: {x: '{{ args.x }}'}}\n",
    )
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert gate.with_ == {"prompt": "prompts/p.md", "schema": "schemas/v.json", "args": {"x": "{{ args.x }}"}}
    assert str(tmp_path) not in json.dumps(gate.with_)


def test_gate_args_must_be_json_data(tmp_path: Path) -> None:
    text = gate_config(
        tmp_path, "  g: {invoke: host.agent.ask, agent: agent.i, with: {prompt: hi, args: {d: 2020-01-01}}}\n"
    )
    assert keys(tmp_path, text) == ["gates.g.with"]


def test_api_key_env_empty_disables_auth(tmp_path: Path) -> None:
    text = agent(tmp_path, "{plugin: builtin.local_llm, endpoint: 'http://h:1', api_key_env: ''}")
    decl = load_config(write(tmp_path, text)).agents["agent.x"]
    assert isinstance(decl, LocalLLMDecl) and decl.api_key_env is None
    emb = load_config(
        write(tmp_path, "embedders:\n  e: {endpoint: 'http://h:1', model: m, api_key_env: ''}\n")
    ).embedders["e"]
    assert emb.api_key_env is None


def test_templated_schema_path_resolves_per_call(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "bug.json").write_text('{"type": "object"}')
    (tmp_path.parent / "secret.json").write_text("{}")
    text = (
        "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.claude\n"
        "    with: {prompt: hi, schema: 'schemas/{{ args.kind }}.json'}\n"
    )
    config = load_config(write(tmp_path, text))
    gate = config.gates["g"]
    assert gate.schema_path is None and gate.templated_schema
    render = {"bug": "schemas/bug.json", "up": "../secret.json", "none": "schemas/none.json"}.get
    assert config.schema_for("g", lambda t: render("bug") or t) == (tmp_path / "schemas" / "bug.json").resolve()
    for kind in ("up", "none"):
        with pytest.raises(ConfigError) as info:
            config.schema_for(gate, lambda t, kind=kind: render(kind) or t)  # type: ignore[misc]
        assert [p.key for p in info.value.problems] == ["gates.g.with.schema"]


def test_templated_schema_checked_where_it_can_be(tmp_path: Path) -> None:
    text = (
        "gates:\n"
        "  a: {invoke: host.agent.ask, with: {prompt: hi, schema: 'schemas/{{ args.kind }}.json'}}\n"
        "  b: {invoke: host.agent.ask, with: {prompt: hi, schema: 'schemas/{{ env.HOME }}.json'}}\n"
        "  c: {invoke: host.agent.ask, with: {prompt: hi, schema: '../{{ args.kind }}.json'}}\n"
    )
    assert keys(tmp_path, text) == ["gates.a.with.schema", "gates.b.with.schema", "gates.c.with.schema"]


def test_relative_server_bin_resolves_against_the_config_dir(
    tmp_path: Path, server_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "app"
    sub.mkdir()
    (sub / "llama-server").write_text(server_bin.read_text())
    (sub / "llama-server").chmod(0o755)
    monkeypatch.chdir(tmp_path)  # not the config dir: ./ must not mean the cwd
    decl = load_config(
        write(sub, agent(sub, "{plugin: builtin.local_llm, endpoint: 'http://h:1', server_bin: ./llama-server}"))
    ).agents["agent.x"]
    assert isinstance(decl, LocalLLMDecl) and decl.server_bin == str(sub / "llama-server")


def test_server_bin_must_exist_and_be_executable(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("#!/bin/sh\n")
    text = (
        "agent_plugins:\n"
        "  agent.a: {plugin: builtin.local_llm, endpoint: 'http://h:1', server_bin: ./missing}\n"
        "  agent.b: {plugin: builtin.local_llm, endpoint: 'http://h:1', server_bin: plain/..}\n"
        "  agent.c: {plugin: builtin.local_llm, endpoint: 'http://h:1', server_bin: ./plain}\n"
        "  agent.d: {plugin: builtin.local_llm, endpoint: 'http://h:1', server_bin: no-such-llama-server}\n"
        "embedders:\n  e: {endpoint: 'http://h:1', model: m, server_bin: ./missing}\n"
    )
    assert keys(tmp_path, text) == [f"agent_plugins.agent.{a}.server_bin" for a in "abcd"] + ["embedders.e.server_bin"]


def test_model_paths_ids_and_roles(tmp_path: Path) -> None:
    (tmp_path / "ok.gguf").write_bytes(b"")
    text = (
        "agent_plugins:\n"
        "  agent.a: {plugin: builtin.local_llm, model: models/missing.gguf}\n"
        "  agent.b: {plugin: builtin.local_llm, model: ok.gguf}\n"
        "  agent.c: {plugin: builtin.local_llm, model: all-minilm-l6-v2}\n"
        "  agent.d: {plugin: builtin.local_llm, model: all-minilm-l6-v2, endpoint: 'http://h:1'}\n"
        "embedders:\n"
        "  e1: {model: gemma-3-270m}\n"
        "  e2: {model: all-minilm-l6}\n"
        "  e3: {model: missing.gguf}\n"
        "  e4: {model: anything, endpoint: 'http://h:1'}\n"
    )
    found = problems(tmp_path, text)
    assert [f.split(":")[0] for f in found] == [
        "agent_plugins.agent.a.model",
        "agent_plugins.agent.c.model",
        "embedders.e1.model",
        "embedders.e2.model",
        "embedders.e3.model",
    ]
    assert "is an embedding model, not a chat model" in found[1]
    assert "is a chat model, not an embedding model" in found[2]
    assert 'did you mean "all-minilm-l6-v2"' in found[3]


def test_no_cascading_errors(tmp_path: Path) -> None:
    text = (
        "agent_plugins:\n  agent.local: {plugin: builtin.local_lm, model: gemma-3-270m}\n"
        "embedders:\n  docs: 7\n"
        "gates:\n  g: {invoke: host.agent.ask, agent: agent.local, with: {prompt: hi}}\n"
        "intents:\n  a: {examples: [hi]}\nrouter: {agent: agent.local}\n"
    )
    assert keys(tmp_path, text) == ["agent_plugins.agent.local.plugin", "embedders.docs"]


# ---------------------------------------------------------------- issue 11: input that must not crash or leak


@pytest.mark.parametrize(
    "text",
    [
        'app_id: "\\U00110000"\n',
        "app_id: !!timestamp banana\n",
        "app_id: !!timestamp 2020-13-45\n",
        'app_id: "\\ud800"\n',
        'gates:\n  g: {invoke: host.agent.ask, with: {prompt: hi, schema: "\\ud800.json"}}\n',
        "gates:\n  g: {invoke: host.agent.ask, with: {prompt: hi, schema: " + "a" * 300 + ".json}}\n",
        "gates:\n  g: {invoke: host.agent.ask, with: {prompt: " + "b" * 300 + ".md}}\n",
        'plugin_dirs: ["\\ud800"]\n',
        "plugin_dirs: [" + "c" * 300 + "]\n",
        'agent_plugins:\n  agent.x: {plugin: subprocess, command: a, cwd: "\\ud800"}\n',
        'agent_plugins:\n  "agent.\\ud800": {plugin: builtin.inprocess}\n',
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, model: " + "d" * 300 + ".gguf}\n",
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://h', timeout: !!int "
        + "9" * 400
        + "}\n",
        "app_id: &a [*a]\n",
        "agent_plugins:\n  agent.x: {plugin: subprocess, command: a, cwd: ~nosuchuser-x/w}\n",
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, model: ~nosuchuser-x/m.gguf}\n",
        "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://h', server_bin: ~nosuchuser-x/s}\n",
        "app_id: *nowhere\n",
    ],
)
def test_fuzz_found_inputs_are_config_errors(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert info.value.problems


@pytest.mark.parametrize("name", ["\ud800.yaml", "e" * 300 + ".yaml", "nul\x00.yaml"])
def test_unusable_config_path_is_a_config_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / name)
    assert [p.key for p in info.value.problems] == [""]


def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines)


@pytest.mark.parametrize(
    "text",
    [
        "agent_plugins:\n  agent.x:\n    plugin: builtin.local_llm\n    endpoint: http://h\n    extra_args: "
        + "["
        + ", ".join(["*a8"] * 10)
        + "]\n_: &q\n"
        + "\n".join("  " + ln for ln in _bomb(9).splitlines())
        + "\n",
        "app_id: " + "[" * 5000 + "]" * 5000 + "\n",
        "app_id:\n" + "".join(" " * (i + 1) + "-\n" for i in range(800)),
        "app_id: " + "{k: " * 3000 + "v" + "}" * 3000 + "\n",
        "".join(" " * i + f"k{i}:\n" for i in range(1500)) + " " * 1500 + "v\n",
    ],
)
def test_yaml_bombs_are_refused_fast(tmp_path: Path, text: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert time.monotonic() - started < 2.0
    assert info.value.problems[0].key == ""
    assert "YAML" in info.value.problems[0].message


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("{plugin: subprocess, command: a, timeout: .inf}", "timeout"),
        ("{plugin: subprocess, command: a, timeout: .nan}", "timeout"),
        ("{plugin: subprocess, command: a, timeout: 1e309}", "timeout"),
        ('{plugin: subprocess, command: "a\\0b"}', "command"),
        ('{plugin: subprocess, command: a, args: ["x\\0"]}', "args"),
        ('{plugin: subprocess, command: a, env: {K: "v\\0"}}', "env.K"),
        ('{plugin: subprocess, command: a, env: {"K=V": v}}', "env.K=V"),
        ("{plugin: mcp_http, endpoint: 'http://[::1/mcp'}", "endpoint"),
        ("{plugin: mcp_http, endpoint: 'http://127.0.0.1:99999/mcp'}", "endpoint"),
        ("{plugin: builtin.local_llm, endpoint: 'http://h', port: 99999}", "port"),
        ('{plugin: mcp_http, endpoint: "http://h/mcp", headers: {X-Key: "caf\\u00e9\\u2603"}}', "headers.X-Key"),
        ('{plugin: mcp_http, endpoint: "http://h/mcp", headers: {X-Key: "a\\r\\nb"}}', "headers.X-Key"),
        ('{plugin: mcp_http, endpoint: "http://h/mcp", headers: {"Bad Name": v}}', "headers.Bad Name"),
        ("{plugin: builtin.local_llm, endpoint: 'http://h', health_timeout: .inf}", "health_timeout"),
        ("{plugin: builtin.local_llm, endpoint: 'http://h', temperature: .nan}", "temperature"),
    ],
)
def test_values_that_would_crash_a_call_are_load_errors(tmp_path: Path, body: str, key: str) -> None:
    assert keys(tmp_path, agent(tmp_path, body)) == [f"agent_plugins.agent.x.{key}"]


def test_gate_timeout_must_be_finite(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g: {invoke: host.agent.ask, agent: agent.i, timeout: .inf, with: {prompt: hi}}\n")
    assert keys(tmp_path, text) == ["gates.g.timeout"]


def test_repr_hides_secrets_and_secret_values_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOK", "tok-canary-1234")
    monkeypatch.setenv("API_KEY_VAR", "key-canary-5678")
    text = (
        "agent_plugins:\n"
        "  agent.s: {plugin: subprocess, command: a, env: {SECRET: 'env-canary-${TOK}', DEBUG: '1'}}\n"
        "  agent.h: {plugin: mcp_http, endpoint: 'http://h/mcp', headers: {Authorization: 'Bearer ${TOK}'}}\n"
        "  agent.l: {plugin: builtin.local_llm, endpoint: 'http://h', api_key_env: API_KEY_VAR}\n"
    )
    config = load_config(write(tmp_path, text))
    shown = repr(config)
    for canary in ("tok-canary-1234", "env-canary", "key-canary-5678"):
        assert canary not in shown
    assert set(config.secret_values()) == {
        "env-canary-tok-canary-1234",
        "tok-canary-1234",
        "Bearer tok-canary-1234",
        "key-canary-5678",
    }
    values = config.secret_values()
    assert values == tuple(sorted(values, key=len, reverse=True))


# ---------------------------------------------------------------- the declarations are the source of truth


def test_parsing_comes_from_the_declaration(tmp_path: Path) -> None:
    from localllm.config.decls import AgentDecl, setting

    @dataclasses.dataclass(frozen=True)
    class NewDecl(AgentDecl):
        REQUIRED = (("url",),)
        url: str = setting("", "where", check="url")
        retries: int = setting(2, "how often", low=0, high=5)

    ctx = Context(base_dir=tmp_path, problems=ProblemList("f.yaml"))
    values = parse_decl(
        NewDecl, {"url": "http://h:1", "retries": 9, "retry": 1}, "agent_plugins.agent.n", ctx, what="new plugin"
    )
    assert values == {"url": "http://h:1"}
    assert [(p.key, p.message) for p in ctx.problems.items] == [
        ("agent_plugins.agent.n.retries", "must be between 0 and 5, got 9"),
        ("agent_plugins.agent.n.retry", 'unknown key for new plugin (did you mean "retries"?)'),
    ]


def test_declarations_hold_data_only() -> None:
    for cls in (*PLUGINS.values(), McpStdioDecl, Config):
        for f in dataclasses.fields(cls):
            assert "Callable" not in str(f.type), (cls.__name__, f.name)


def test_config_package_imports_nothing_above_the_pins() -> None:
    root = Path(__file__).resolve().parents[2] / "localllm" / "config"
    allowed = (
        "localllm.config",
        "localllm.errors",
        "localllm.settings",
        "localllm.wire",
        "localllm.managed.pins",
        "localllm._fs",  # a leaf: the bounded read of a prompt file
        "localllm.calibrate",  # a leaf: leave-one-out's same_text, for an example under two intents
    )
    for module in root.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            for name in names:
                if name.startswith("localllm") and name != "localllm":
                    assert name.startswith(allowed), f"{module.name} imports {name}"


def test_mcp_stdio_decl_from_plugin_dir_is_data(tmp_path: Path) -> None:
    root = tmp_path / "plug"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "srv").write_text("#!/bin/sh\n")
    (root / "bin" / "srv").chmod(0o755)
    (root / "plugin.json").write_text(
        json.dumps({"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": "plug"})
    )
    (root / "mcp.json").write_text(
        json.dumps(
            {
                "$schema": "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json",
                "mcpServers": {"s": {"type": "stdio", "command": "./bin/srv"}},
            }
        )
    )
    config = load_config(write(tmp_path, "plugin_dirs: [plug]\n"))
    decl = config.agents["agent.plug.s"]
    assert isinstance(decl, McpStdioDecl)
    assert (decl.plugin_dir, decl.server) == (root.resolve(), "s")
    assert decl == dataclasses.replace(decl)  # plain values: equal to a copy
    assert os.fspath(root) in repr(decl)


def test_templated_schema_gate_validates_each_call_against_its_file(tmp_path: Path) -> None:
    from localllm import Runtime
    from localllm.errors import AgentError, ErrorKind

    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "bug.json").write_text(
        json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    )
    text = (
        "agent_plugins:\n  agent.i: {plugin: builtin.inprocess}\n"
        "gates:\n  g: {invoke: host.agent.ask, agent: agent.i, with: {prompt: hi, schema: 'schemas/{{ args.kind }}.json'}}\n"
    )
    with Runtime(load_config(write(tmp_path, text))) as rt:
        rt.register_inprocess("agent.i", lambda request: {"ok": "not a boolean"})
        with pytest.raises(AgentError) as info:
            rt.run_gate("g", args={"kind": "bug"})
        assert info.value.kind is ErrorKind.SCHEMA_INVALID
        with pytest.raises(ConfigError) as bad:
            rt.run_gate("g", args={"kind": "../../etc/passwd"})
        assert [p.key for p in bad.value.problems] == ["gates.g.with.schema"]


def test_plugin_server_secrets_are_listed(tmp_path: Path) -> None:
    root = tmp_path / "plug"
    root.mkdir()
    (root / "plugin.json").write_text(
        json.dumps({"$schema": "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json", "name": "plug"})
    )
    (root / "mcp.json").write_text(
        json.dumps(
            {
                "$schema": "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json",
                "mcpServers": {"r": {"type": "streamable-http", "url": "http://127.0.0.1:9/mcp?token=tok-canary-99"}},
            }
        )
    )
    config = load_config(write(tmp_path, "plugin_dirs: [plug]\n"))
    assert "tok-canary-99" not in repr(config)
    assert "token=tok-canary-99" in config.secret_values()
