"""Porting help: ``localllm check`` names a Kitsoki idiom when it meets one, and what localllm
expects instead (asserted on the problem's key and on the replacement it names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm import load_config
from localllm.errors import ConfigError
from localllm.trace.reader import load_object

PORTED = """\
app:
  id: judge-story
  version: "1.0"
states:
  idle: {}
world:
  verdict: ""
agent_plugins:
  agent.local: {plugin: builtin.inprocess}
gates:
  judge:
    invoke: host.agent.decide
    with:
      agent: judge
      prompt: "Judge {{ args.x }}"
"""


def problems(tmp_path: Path, text: str) -> dict[str, tuple[str, str]]:
    (tmp_path / "app.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "app.yaml")
    return {p.key: (p.message, p.hint) for p in info.value.problems}


def test_a_verbatim_kitsoki_port_names_each_idiom(tmp_path: Path) -> None:
    found = problems(tmp_path, PORTED)
    assert set(found) == {"app", "states", "world", "gates.judge.with.agent"}
    assert "app_id: judge-story" in found["app"][1]  # the replacement, with the story's own id
    assert "gates:" in found["states"][1] and "gates:" in found["world"][1]
    assert "persona" in found["gates.judge.with.agent"][1] and "agent: ALIAS" in found["gates.judge.with.agent"][1]


def test_with_agent_naming_a_declared_alias_is_fine(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        "app_id: judge-story\n"
        "agent_plugins:\n  agent.local: {plugin: builtin.inprocess}\n"
        "gates:\n  judge:\n    invoke: host.agent.decide\n"
        "    with: {agent: agent.local, prompt: 'Judge {{ args.x }}'}\n"
    )
    assert load_config(tmp_path / "app.yaml").gates["judge"].agent == "agent.local"


def test_an_unknown_key_that_is_no_idiom_keeps_the_plain_message(tmp_path: Path) -> None:
    found = problems(tmp_path, "app_id: a\nagent_plugin: {}\n")
    assert "agent_plugins" in found["agent_plugin"][0]  # the closest known key


def test_json_errors_never_say_at_at() -> None:
    _, problem = load_object('{"a": "unterminated')
    assert " at at " not in problem and problem.endswith("at column 7")
