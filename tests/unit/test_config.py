"""Every load-time config rule, asserting the message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.config import (
    ClaudeCliDecl,
    LocalLLMDecl,
    McpHttpDecl,
    SubprocessDecl,
    interpolate,
    load_config,
)
from localllm.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "app.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return [f"{p.key}: {p.message}" for p in info.value.problems]


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


def test_unknown_top_level_key(tmp_path: Path) -> None:
    assert problems(tmp_path, "agents: {}\n") == ["agents: unknown top-level key"]


def test_alias_must_start_with_agent(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  fixer: {plugin: builtin.inprocess}\n")
    assert found == ['agent_plugins.fixer: alias "fixer" must start with "agent."']


def test_unknown_plugin_lists_supported(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  agent.x: {plugin: openai}\n")
    assert found == [
        'agent_plugins.agent.x: unknown plugin "openai" (supported: builtin.claude_cli, builtin.inprocess, '
        "subprocess, mcp_http, builtin.local_llm)"
    ]


def test_cassette_not_declarable(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  agent.x: {plugin: cassette}\n")
    assert found == ['agent_plugins.agent.x: plugin "cassette" cannot be declared in agent_plugins:']


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        ("{plugin: subprocess}", "agent_plugins.agent.x: subprocess plugin requires command:"),
        ("{plugin: mcp_http}", "agent_plugins.agent.x: mcp_http plugin requires endpoint:"),
        ("{plugin: builtin.local_llm}", "agent_plugins.agent.x: builtin.local_llm plugin requires model: or endpoint:"),
    ],
)
def test_required_fields(tmp_path: Path, decl: str, message: str) -> None:
    assert problems(tmp_path, f"agent_plugins:\n  agent.x: {decl}\n") == [message]


def test_unknown_key_for_plugin(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  agent.x: {plugin: mcp_http, endpoint: 'http://h/mcp', cmd: x}\n")
    assert found == ["agent_plugins.agent.x.cmd: unknown key for plugin mcp_http"]


def test_wrong_types(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://h', parallel: many, grammar: 1}\n"
    assert problems(tmp_path, text) == [
        "agent_plugins.agent.x.parallel: must be an integer, got 'many'",
        "agent_plugins.agent.x.grammar: must be true or false, got 1",
    ]


def test_local_llm_ranges(tmp_path: Path) -> None:
    text = ("agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://h', parallel: 0, "
            "temperature: 3, api_key_env: 'sk-123 456'}\n")
    assert problems(tmp_path, text) == [
        "agent_plugins.agent.x.api_key_env: must be the NAME of an environment variable (not the key itself)",
        "agent_plugins.agent.x.parallel: must be between 1 and 256, got 0",
        "agent_plugins.agent.x.temperature: must be between 0 and 2, got 3.0",
    ]


def test_endpoint_must_be_url(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x: {plugin: mcp_http, endpoint: localhost:7301}\n"
    assert problems(tmp_path, text) == ["agent_plugins.agent.x.endpoint: must be an http(s) URL, got 'localhost:7301'"]


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
    text = ("agent_plugins:\n  agent.x:\n    plugin: mcp_http\n    endpoint: http://127.0.0.1:1/mcp\n"
            "    headers: {Authorization: 'Bearer ${NO_TOKEN}'}\n")
    assert problems(tmp_path, text) == [
        "agent_plugins.agent.x: env var NO_TOKEN referenced in headers.Authorization not set"
    ]


def test_empty_var_reference_is_an_error(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x:\n    plugin: subprocess\n    command: a\n    env: {K: 'a${}b'}\n"
    assert problems(tmp_path, text) == ["agent_plugins.agent.x.env.K: empty ${} reference"]


def test_interpolation_only_in_env_and_headers(tmp_path: Path) -> None:
    text = "agent_plugins:\n  agent.x: {plugin: subprocess, command: '${NOT_EXPANDED}'}\n"
    decl = load_config(write(tmp_path, text)).agents["agent.x"]
    assert isinstance(decl, SubprocessDecl)
    assert decl.command == "${NOT_EXPANDED}"


def test_interpolate_is_single_pass() -> None:
    env = {"A": "${B}", "B": "no"}
    assert interpolate("x${A}y${B}", env.get) == ("x${B}yno", [])
    assert interpolate("${MISSING}", env.get) == ("", ["env var MISSING not set"])


def test_headers_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOK", "abc")
    text = ("agent_plugins:\n  agent.r:\n    plugin: mcp_http\n    endpoint: http://127.0.0.1:7301/mcp\n"
            "    headers: {Authorization: 'Bearer ${TOK}'}\n")
    decl = load_config(write(tmp_path, text)).agents["agent.r"]
    assert isinstance(decl, McpHttpDecl)
    assert decl.headers == {"Authorization": "Bearer abc"}
    assert decl.tool == "ask"


def test_local_llm_defaults(tmp_path: Path) -> None:
    decl = load_config(write(tmp_path, "agent_plugins:\n  agent.l: {plugin: builtin.local_llm, endpoint: 'http://h:1'}\n"))
    local = decl.agents["agent.l"]
    assert isinstance(local, LocalLLMDecl)
    assert (local.grammar, local.json_schema, local.parallel, local.max_tokens) == (True, False, 4, 512)


def gate_config(tmp_path: Path, gate: str, agents: str = "") -> str:
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "v.json").write_text(json.dumps(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}))
    return f"agent_plugins:\n  agent.i: {{plugin: builtin.inprocess}}\n{agents}gates:\n{gate}"


def test_gate_ok(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.decide\n    agent: agent.i\n"
                                 "    with: {prompt: 'Is {{ args.x }} ok?', schema: schemas/v.json}\n")
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert (gate.verb, gate.agent, gate.schema_path) == ("decide", "agent.i", (tmp_path / "schemas/v.json").resolve())


def test_gate_undeclared_alias_is_error(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.decide\n    agent: agent.typo\n    with: {prompt: hi}\n")
    assert problems(tmp_path, text) == [
        'gates.g.agent: agent "agent.typo" is not declared in agent_plugins: (declared: agent.claude, agent.i)'
    ]


def test_gate_bad_verb_and_missing_prompt(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.guess\n    agent: agent.i\n    with: {}\n")
    assert problems(tmp_path, text) == [
        'gates.g.invoke: unknown verb "guess" (verbs: ask, decide, extract, task, converse)',
        "gates.g.with.prompt: prompt is required: inline text or a path to a prompt file",
    ]


def test_prompt_file_resolves_relative(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.md").write_text("Decide about {{ args.x }}.")
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: prompts/p.md}\n")
    gate = load_config(write(tmp_path, text)).gates["g"]
    assert gate.prompt == "Decide about {{ args.x }}."


def test_missing_prompt_file(tmp_path: Path) -> None:
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: prompts/none.md}\n")
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith("gates.g.with.prompt: prompt file") and "not found" in found[0]


def test_schema_outside_config_dir(tmp_path: Path) -> None:
    sub = tmp_path / "app"
    sub.mkdir()
    (tmp_path / "outside.json").write_text("{}")
    text = gate_config(sub, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: ../outside.json}\n")
    found = problems(sub, text)
    assert found == [f"gates.g.with.schema: schema '../outside.json' is outside the config directory {sub}"]


def test_schema_ref_outside_and_absolute(tmp_path: Path) -> None:
    sub = tmp_path / "app"
    (sub / "schemas").mkdir(parents=True)
    (tmp_path / "evil.json").write_text("{}")
    (sub / "schemas" / "s.json").write_text(json.dumps({"properties": {
        "a": {"$ref": "../../evil.json"}, "b": {"$ref": "/etc/passwd"}, "c": {"$ref": "common.json#/$defs/x"}}}))
    (sub / "schemas" / "common.json").write_text(json.dumps({"$defs": {"y": {}}}))
    text = gate_config(sub, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: schemas/s.json}\n")
    found = problems(sub, text)
    assert len(found) == 3
    assert "$.properties.a: $ref '../../evil.json' points outside the config directory" in found[0]
    assert "$.properties.b: $ref '/etc/passwd' is absolute or remote" in found[1]
    assert "$.properties.c: $ref 'common.json#/$defs/x' does not resolve" in found[2]


def test_invalid_schema_json(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    text = gate_config(tmp_path, "  g:\n    invoke: host.agent.ask\n    agent: agent.i\n    with: {prompt: hi, schema: bad.json}\n")
    found = problems(tmp_path, text)
    assert len(found) == 1 and "not valid JSON" in found[0]


def test_decide_gate_outside_grammar_subset(tmp_path: Path) -> None:
    (tmp_path / "u.json").write_text(json.dumps({"type": "array", "items": {"type": "string"}, "uniqueItems": True}))
    text = ("agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:1', grammar: true}\n"
            "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n    with: {prompt: hi, schema: u.json}\n")
    found = problems(tmp_path, text)
    assert len(found) == 1
    assert 'agent "agent.local" is builtin.local_llm with grammar: true but its decide schema' in found[0]
    assert '"uniqueItems"' in found[0]


def test_grammar_check_skipped_with_json_schema(tmp_path: Path) -> None:
    (tmp_path / "u.json").write_text(json.dumps({"type": "array", "uniqueItems": True}))
    text = ("agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://h:1', json_schema: true}\n"
            "gates:\n  g:\n    invoke: host.agent.decide\n    agent: agent.local\n    with: {prompt: hi, schema: u.json}\n")
    assert "g" in load_config(write(tmp_path, text)).gates


def test_errors_collected_in_stable_order(tmp_path: Path) -> None:
    text = ("bogus: 1\nagent_plugins:\n  x: {plugin: subprocess}\n  agent.y: {plugin: nope}\n"
            "gates:\n  g: {invoke: host.agent.ask, agent: agent.z, with: {prompt: hi}}\n")
    first = problems(tmp_path, text)
    assert first == problems(tmp_path, text)
    assert [p.split(":")[0] for p in first] == [
        "bogus", "agent_plugins.x", "agent_plugins.x", "agent_plugins.agent.y", "gates.g.agent"]


def test_problem_str_has_file_key_and_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "agent_plugins:\n  agent.x: {plugin: subprocess}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: agent_plugins.agent.x: subprocess plugin requires command:")
    assert "(hint: command: /path/to/agent)" in text


def test_embedders_intents_router(tmp_path: Path) -> None:
    text = ("embedders:\n  docs: {model: all-minilm-l6-v2, dims: 384}\n"
            "intents:\n  greet: [hello, hi]\n  bye: {examples: [goodbye]}\n"
            "router: {embedder: docs, confident: 0.9}\n")
    config = load_config(write(tmp_path, text))
    assert config.embedders["docs"].dims == 384
    assert config.intents["greet"].examples == ("hello", "hi")
    assert config.router is not None and config.router.confident == 0.9 and config.router.margin == 0.08


def test_router_and_embedder_errors(tmp_path: Path) -> None:
    text = "embedders:\n  e: {dims: 0}\nintents:\n  a: []\nrouter: {embedder: nope, margin: 2}\n"
    assert problems(tmp_path, text) == [
        "embedders.e: embedder requires model: or endpoint:",
        "embedders.e.dims: must be a positive integer",
        "intents.a: needs examples: a non-empty list of phrases",
        'router.embedder: embedder "nope" is not declared under embedders:',
        "router.margin: must be between 0 and 1, got 2.0",
        "router: a router needs intents:",
    ]


_YAMLISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["plugin", "agent", "with", "prompt", "schema", "command", "endpoint", "env", "headers",
                         "model", "invoke", "args", "timeout", "parallel", "x", "agent.a", "${X}"]),
        children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(
    st.sampled_from(["app_id", "agent_plugins", "gates", "embedders", "intents", "router", "plugin_dirs", "junk"]),
    _YAMLISH, max_size=5))
def test_property_malformed_configs_only_raise_config_error(tmp_path: Path, data: dict[str, object]) -> None:
    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    try:
        load_config(path)
    except ConfigError as exc:
        assert exc.problems  # every ConfigError lists at least one problem


def test_unknown_managed_model_is_a_load_time_error(tmp_path: Path) -> None:
    found = problems(tmp_path, "agent_plugins:\n  agent.l: {plugin: builtin.local_llm, model: gemma-4-9000}\n")
    assert found == ['agent_plugins.agent.l.model: unknown model "gemma-4-9000"']
    ok = "agent_plugins:\n  agent.l: {plugin: builtin.local_llm, model: models/own.gguf}\n"
    assert load_config(write(tmp_path, ok)).agents["agent.l"]  # a .gguf path is a file, not a pin id
