"""The loader never raises: random plugin.json / mcp.json / SKILL.md / flow contents → only results."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localllm.cli.plugins import render_text, result_to_json
from localllm.plugins import (
    ALIAS_PATTERN,
    PluginLoaded,
    PluginRejected,
    load_agent_plugin,
    mcp_agent_decls,
)
from localllm.plugins.diagnostics import COMPONENTS, SEVERITIES

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"

INTERESTING = st.sampled_from(
    [
        "stdio",
        "streamable-http",
        "sse",
        "./bin/x",
        "../x",
        "./",
        "bin/x",
        "python3",
        "a b",
        "${PLUGIN_ROOT}",
        "${PLUGIN_ROOT}/a",
        "${PLUGIN_DATA}/b",
        "${HOME}",
        "PLUGIN_ROOT",
        "PLUGIN_DATA",
        "http://127.0.0.1:1/mcp",
        "https://x.example/mcp",
        "http://example.com",
        "https://u:p@x/#f",
        "Authorization",
        "Bearer abcdefghijkl",
        "sk-" + "a" * 24,
        "",
        "\x00",
        "é",
        "\n",
        PLUGIN_SCHEMA,
        MCP_SCHEMA,
        "acme",
        "Acme",
        "a--b",
    ]
)
LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12) | INTERESTING
JSON = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | INTERESTING, inner, max_size=4),
    max_leaves=20,
)
SERVER_KEYS = st.sampled_from(["type", "command", "args", "env", "cwd", "url", "headers", "extra"])
SERVER = st.dictionaries(SERVER_KEYS, JSON, max_size=6)
MCP_DOC = (
    st.fixed_dictionaries(
        {"$schema": st.just(MCP_SCHEMA) | JSON, "mcpServers": st.dictionaries(st.text(max_size=10), SERVER, max_size=4)}
    )
    | JSON
)
MANIFEST_KEYS = st.sampled_from(["$schema", "name", "version", "author", "keywords", "extensions", "other"])
MANIFEST = (
    st.fixed_dictionaries(
        {"$schema": st.just(PLUGIN_SCHEMA), "name": st.just("acme") | JSON},
        optional={k: JSON for k in ("version", "description", "author", "keywords", "extensions", "hooks")},
    )
    | st.dictionaries(MANIFEST_KEYS, JSON, max_size=5)
    | JSON
)


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


FILE_TEXT = st.text(max_size=200) | JSON.map(json.dumps)
RAW = st.binary(max_size=80)


def check(result: Any) -> None:
    assert isinstance(result, (PluginLoaded, PluginRejected))
    for d in result.diagnostics:
        assert d.rule != "loader-internal-error", str(d)
        assert d.component in COMPONENTS and d.severity in SEVERITIES
        assert d.origin and d.message
    if isinstance(result, PluginRejected):
        assert any(d.severity == "error" for d in result.diagnostics)
    else:
        assert all(ALIAS_PATTERN.fullmatch(alias) for alias, _ in mcp_agent_decls(result))
    json.dumps(result_to_json(result))
    assert render_text(result)


def write(root: Path, rel: str, content: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest=MANIFEST.map(as_text) | FILE_TEXT | RAW, mcp=MCP_DOC.map(as_text) | FILE_TEXT | RAW)
def test_random_plugin_and_mcp_json_never_raise(manifest: str | bytes, mcp: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "p"
        write(root, "plugin.json", manifest)
        write(root, "mcp.json", mcp)
        check(load_agent_plugin(root))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mcp=MCP_DOC.map(as_text),
    skill_front=st.text(max_size=120) | JSON.map(json.dumps),
    skill_raw=FILE_TEXT | RAW,
    flow=FILE_TEXT | RAW,
    flow_yaml=st.text(max_size=120),
)
def test_random_components_never_raise(
    mcp: str, skill_front: str, skill_raw: str | bytes, flow: str | bytes, flow_yaml: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "p"
        write(root, "plugin.json", json.dumps({"$schema": PLUGIN_SCHEMA, "name": "acme"}))
        write(root, "mcp.json", mcp)
        write(root, "skills/front/SKILL.md", f"---\n{skill_front}\n---\nbody\n")
        write(root, "skills/raw/SKILL.md", skill_raw)
        write(root, "skills/ok/SKILL.md", "---\nname: ok\ndescription: fine\n---\n")
        write(root, "flows/a.flow.json", flow)
        write(root, "flows/b.flow.yaml", flow_yaml)
        result = load_agent_plugin(root)
        check(result)
        # The one valid skill always survives whatever its siblings contain.
        assert isinstance(result, PluginLoaded)
        assert "ok" in [s.name for s in result.skills]
