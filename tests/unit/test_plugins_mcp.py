"""mcp.json server entries: variants, URLs, headers, placeholders, secrets, aliases."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from localllm.plugins import (
    ALIAS_PATTERN,
    McpServerConfig,
    PluginLoaded,
    alias_part,
    expand_placeholders,
    load_agent_plugin,
    mcp_agent_decls,
)
from localllm.plugins.credentials import looks_like_secret

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"


def make(tmp_path: Path, servers: dict[str, Any], *, name: str = "acme", where: Path | None = None) -> Path:
    root = where if where is not None else tmp_path / "plugins" / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "plugin.json").write_text(json.dumps({"$schema": PLUGIN_SCHEMA, "name": name}))
    (root / "mcp.json").write_text(json.dumps({"$schema": MCP_SCHEMA, "mcpServers": servers}))
    (root / "bin").mkdir(exist_ok=True)
    tool = root / "bin" / "server"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return root


def load(root: Path, **kw: Any) -> PluginLoaded:
    result = load_agent_plugin(root, **kw)
    assert isinstance(result, PluginLoaded), [str(d) for d in result.diagnostics]
    return result


def only(result: PluginLoaded) -> McpServerConfig:
    (server,) = result.mcp_servers
    return server


# ----------------------------------------------------------------------------- variants


def test_stdio_entry_is_parsed_with_defaults(tmp_path: Path) -> None:
    root = make(tmp_path, {"s": {"type": "stdio", "command": "./bin/server"}})
    result = load(root)
    server = only(result)
    assert server.transport == "stdio"
    assert server.command == "./bin/server"
    assert server.command_path == result.root / "bin" / "server"
    assert server.args == () and dict(server.env) == {}
    # cwd defaults to the plugin root (§7.2.1)
    assert (server.cwd, server.cwd_root) == (result.root, "plugin")
    assert server.origin.endswith("mcp.json#/mcpServers/s")
    assert result.diagnostics == ()


def test_bare_command_is_kept_for_path_lookup(tmp_path: Path) -> None:
    server = only(load(make(tmp_path, {"s": {"type": "stdio", "command": "python3", "args": ["-V"]}})))
    assert (server.command, server.command_path, server.args) == ("python3", None, ("-V",))


def test_http_entry_is_parsed(tmp_path: Path) -> None:
    entry = {"type": "streamable-http", "url": "https://mcp.example.com/mcp", "headers": {"X-Tenant": "public"}}
    server = only(load(make(tmp_path, {"h": entry})))
    assert server.transport == "http"
    assert server.url == "https://mcp.example.com/mcp"
    assert dict(server.headers) == {"X-Tenant": "public"}


def test_sse_is_skipped_as_unsupported_transport(tmp_path: Path) -> None:
    result = load(
        make(
            tmp_path,
            {"old": {"type": "sse", "url": "https://x.example/sse"}, "new": {"type": "stdio", "command": "python3"}},
        )
    )
    assert [s.name for s in result.mcp_servers] == ["new"]
    (diag,) = result.diagnostics
    assert (diag.rule, diag.severity, diag.clause) == ("unsupported-transport", "warning", "7.2.2")


@pytest.mark.parametrize(
    ("entry", "rule", "pointer"),
    [
        ("not an object", "server-entry-invalid", ""),
        ({"command": "x"}, "server-entry-invalid", "/type"),
        ({"type": "websocket", "url": "wss://x"}, "server-entry-invalid", "/type"),
        ({"type": "stdio"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": ""}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "npx server --port 1"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "/usr/bin/python3"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "bin/server"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "${PLUGIN_ROOT}/bin/server"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "../bin/server"}, "path-escapes-plugin-root", "/command"),
        ({"type": "stdio", "command": "./bin/../../server"}, "path-escapes-plugin-root", "/command"),
        ({"type": "stdio", "command": "./"}, "server-entry-invalid", "/command"),
        ({"type": "stdio", "command": "x", "args": "--flag"}, "server-entry-invalid", "/args"),
        ({"type": "stdio", "command": "x", "args": [1]}, "server-entry-invalid", "/args"),
        ({"type": "stdio", "command": "x", "args": ["a\u0000b"]}, "server-entry-invalid", "/args/0"),
        ({"type": "stdio", "command": "x", "env": {"A": 1}}, "server-entry-invalid", "/env/A"),
        ({"type": "stdio", "command": "x", "env": {"A=B": "1"}}, "server-entry-invalid", "/env/A=B"),
        ({"type": "stdio", "command": "x", "env": {"PLUGIN_ROOT": "/x"}}, "env-reserved-name", "/env/PLUGIN_ROOT"),
        ({"type": "stdio", "command": "x", "env": {"PLUGIN_DATA": "/x"}}, "env-reserved-name", "/env/PLUGIN_DATA"),
        ({"type": "stdio", "command": "x", "cwd": "data"}, "server-entry-invalid", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "/tmp"}, "server-entry-invalid", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "${HOME}"}, "server-entry-invalid", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "${PLUGIN_ROOT}x"}, "server-entry-invalid", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "../elsewhere"}, "path-escapes-plugin-root", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "./a/../../b"}, "path-escapes-plugin-root", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "${PLUGIN_ROOT}/../b"}, "path-escapes-plugin-root", "/cwd"),
        ({"type": "stdio", "command": "x", "cwd": "${PLUGIN_DATA}/../../b"}, "path-escapes-plugin-root", "/cwd"),
        ({"type": "stdio", "command": "x", "url": "https://x"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "https://x", "command": "x"}, "server-entry-invalid", "/command"),
        ({"type": "streamable-http"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "http://example.com/mcp"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "ftp://127.0.0.1/mcp"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "/relative/mcp"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "https://user:pw@x.example/mcp"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "https://x.example/mcp#frag"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "https://x.example:99999/mcp"}, "server-entry-invalid", "/url"),
        ({"type": "streamable-http", "url": "https://x.example/ mcp"}, "server-entry-invalid", "/url"),
        (
            {"type": "streamable-http", "url": "https://x", "headers": {"Bad Name": "v"}},
            "server-entry-invalid",
            "/headers/Bad Name",
        ),
        (
            {"type": "streamable-http", "url": "https://x", "headers": {"X-A": "line\r\nbreak"}},
            "server-entry-invalid",
            "/headers/X-A",
        ),
        (
            {"type": "streamable-http", "url": "https://x", "headers": {"X-A": "1", "x-a": "2"}},
            "server-entry-invalid",
            "/headers/x-a",
        ),
        (
            {"type": "streamable-http", "url": "https://x", "headers": {"X-A": 5}},
            "server-entry-invalid",
            "/headers/X-A",
        ),
    ],
)
def test_invalid_entries_are_skipped_with_a_pointed_diagnostic(
    tmp_path: Path, entry: Any, rule: str, pointer: str
) -> None:
    result = load(make(tmp_path, {"bad": entry, "good": {"type": "stdio", "command": "python3"}}))
    assert [s.name for s in result.mcp_servers] == ["good"]
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert len(errors) == 1, [str(d) for d in result.diagnostics]
    (diag,) = errors
    assert diag.rule == rule
    assert diag.component == "mcp"
    assert diag.origin == f"{tmp_path / 'plugins' / 'acme' / 'mcp.json'}#/mcpServers/bad{pointer}"
    assert "'bad' skipped" in diag.message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/mcp",
        "http://localhost/mcp",
        "http://[::1]:9/mcp",
        "http://127.1.2.3/mcp",
        "https://example.com/mcp?x=1",
    ],
)
def test_allowed_urls(tmp_path: Path, url: str) -> None:
    server = only(load(make(tmp_path, {"h": {"type": "streamable-http", "url": url}})))
    assert server.url == url


def test_command_missing_at_load_is_a_warning_not_a_skip(tmp_path: Path) -> None:
    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "./bin/not-built-yet"}}))
    assert only(result).name == "s"
    (diag,) = result.diagnostics
    assert (diag.rule, diag.severity) == ("command-not-found", "warning")


# ----------------------------------------------------------------------------- placeholders


def test_placeholders_expand_in_args_env_and_cwd(tmp_path: Path) -> None:
    entry = {
        "type": "stdio",
        "command": "./bin/server",
        "args": ["--config", "${PLUGIN_ROOT}/config/db.json", "--data=${PLUGIN_DATA}", "${PLUGIN_ROOT}${PLUGIN_DATA}"],
        "env": {"DATA_DIR": "${PLUGIN_DATA}/database", "PLAIN": "x"},
        "cwd": "${PLUGIN_DATA}/work",
    }
    result = load(make(tmp_path, {"db": entry}))
    server = only(result)
    root, data = str(result.root), str(result.data_dir)
    assert server.args == ("--config", f"{root}/config/db.json", f"--data={data}", root + data)
    assert dict(server.env) == {"DATA_DIR": f"{data}/database", "PLAIN": "x"}
    assert (server.cwd, server.cwd_root) == (Path(data) / "work", "data")
    assert server.command == "./bin/server"  # never expanded


def test_cwd_forms_resolve_against_their_roots(tmp_path: Path) -> None:
    root = make(
        tmp_path,
        {
            "a": {"type": "stdio", "command": "x", "cwd": "./bin"},
            "b": {"type": "stdio", "command": "x", "cwd": "${PLUGIN_ROOT}"},
            "c": {"type": "stdio", "command": "x", "cwd": "${PLUGIN_ROOT}/bin/"},
            "d": {"type": "stdio", "command": "x", "cwd": "${PLUGIN_DATA}"},
        },
    )
    result = load(root)
    cwd = {s.name: (s.cwd, s.cwd_root) for s in result.mcp_servers}
    assert cwd == {
        "a": (result.root / "bin", "plugin"),
        "b": (result.root, "plugin"),
        "c": (result.root / "bin", "plugin"),
        "d": (result.data_dir, "data"),
    }
    assert result.diagnostics == ()


def test_substituted_text_is_never_rescanned(tmp_path: Path) -> None:
    # A plugin root whose own path contains the placeholder text: after substitution the
    # argument holds a literal "${PLUGIN_DATA}" that must NOT be expanded a second time.
    where = tmp_path / "odd${PLUGIN_DATA}dir" / "acme"
    entry = {
        "type": "stdio",
        "command": "x",
        "args": ["${PLUGIN_ROOT}/cfg"],
        "env": {"R": "${PLUGIN_ROOT}"},
        "cwd": "${PLUGIN_ROOT}/bin",
    }
    result = load(make(tmp_path, {"s": entry}, where=where))
    server = only(result)
    assert "${PLUGIN_DATA}" in str(result.root)
    assert server.args == (f"{result.root}/cfg",)
    assert server.env["R"] == str(result.root)
    assert server.cwd == result.root / "bin"
    assert str(result.data_dir) not in server.args[0]


def test_expand_placeholders_is_single_pass() -> None:
    text = "${PLUGIN_ROOT}|${PLUGIN_DATA}|${PLUGIN_ROOT}"
    out = expand_placeholders(text, plugin_root="/r/${PLUGIN_DATA}", plugin_data="/d/${PLUGIN_ROOT}")
    assert out == "/r/${PLUGIN_DATA}|/d/${PLUGIN_ROOT}|/r/${PLUGIN_DATA}"
    assert (
        expand_placeholders("${PLUGIN_ROOTX} $PLUGIN_ROOT ${plugin_root}", plugin_root="R", plugin_data="D")
        == "${PLUGIN_ROOTX} $PLUGIN_ROOT ${plugin_root}"
    )


def test_other_variables_stay_literal_with_an_info_diagnostic(tmp_path: Path) -> None:
    entry = {"type": "stdio", "command": "x", "args": ["${HOME}/x"], "env": {"P": "${PATH}"}}
    http = {"type": "streamable-http", "url": "https://x.example/${TENANT}", "headers": {"X-T": "${TENANT}"}}
    result = load(make(tmp_path, {"s": entry, "h": http}))
    s, h = result.mcp_servers
    assert s.args == ("${HOME}/x",) and s.env["P"] == "${PATH}"
    assert h.url == "https://x.example/${TENANT}" and h.headers["X-T"] == "${TENANT}"
    infos = [d for d in result.diagnostics if d.rule == "placeholder-not-expanded"]
    assert len(infos) == 4 and all(d.severity == "info" for d in infos)
    assert any(d.origin.endswith("#/mcpServers/s/args/0") for d in infos)


# ----------------------------------------------------------------------------- secrets


def test_secrets_are_loaded_with_a_diagnostic_and_never_printed(tmp_path: Path) -> None:
    token = "ghp_" + "A1b2C3d4" * 5
    entry = {"type": "stdio", "command": "x", "env": {"API_KEY": "hunter2-literal", "GH": token, "MODE": "fast"}}
    http = {
        "type": "streamable-http",
        "url": "https://x.example/mcp?api_key=abcdef123456",
        "headers": {"Authorization": "Bearer abcdefghijklmnop", "X-Tenant": "public"},
    }
    result = load(make(tmp_path, {"s": entry, "h": http}))
    assert [s.name for s in result.mcp_servers] == ["s", "h"]
    secrets = [d for d in result.diagnostics if d.component == "secrets"]
    assert sorted(d.rule for d in secrets) == ["secret-in-env", "secret-in-env", "secret-in-headers", "secret-in-url"]
    assert all(d.severity == "warning" for d in secrets)
    assert {d.origin.split("#")[1] for d in secrets} == {
        "/mcpServers/s/env/API_KEY",
        "/mcpServers/s/env/GH",
        "/mcpServers/h/headers/Authorization",
        "/mcpServers/h/url",
    }
    everything = " ".join(str(d) for d in result.diagnostics) + repr(result)
    for value in ("hunter2-literal", token, "abcdefghijklmnop", "abcdef123456"):
        assert value not in everything
    assert result.mcp_servers[0].env["API_KEY"] == "hunter2-literal"  # loaded, not rejected


def test_secret_warning_is_not_emitted_for_a_skipped_entry(tmp_path: Path) -> None:
    entry = {"type": "stdio", "command": "bin/x", "env": {"API_KEY": "literal-key-123"}}
    result = load(make(tmp_path, {"s": entry}))
    assert result.mcp_servers == ()
    assert [d.rule for d in result.diagnostics] == ["server-entry-invalid"]


@pytest.mark.parametrize(
    ("key", "value", "header", "expected"),
    [
        ("API_KEY", "abc", False, True),
        ("OPENAI_API_KEY", "sk-" + "x" * 30, False, True),
        ("GITHUB_TOKEN", "anything", False, True),
        ("DB_PASSWORD", "pw", False, True),
        ("X", "AKIAABCDEFGHIJKLMNOP", False, True),
        ("X", "xoxb-123456789012-abc", False, True),
        ("Authorization", "Basic dXNlcjpwYXNzd29yZA==", True, True),
        ("X-Api-Key", "k", True, True),
        ("API_KEY", "", False, False),
        ("API_KEY", "${MY_KEY}", False, False),
        ("LOG_LEVEL", "debug", False, False),
        ("TOKENIZER", "bpe", False, False),
        ("X-Tenant", "public-tenant", True, False),
    ],
)
def test_secret_heuristic(key: str, value: str, header: bool, expected: bool) -> None:
    assert looks_like_secret(key, value, header=header) is expected


# ----------------------------------------------------------------------------- aliases


def test_mcp_agent_decls_sanitises_and_disambiguates(tmp_path: Path) -> None:
    servers = {
        "Local Validator": {"type": "stdio", "command": "x"},
        "local-validator": {"type": "stdio", "command": "x"},
        "local.validator": {"type": "stdio", "command": "x"},
        "api": {"type": "streamable-http", "url": "https://x.example/mcp"},
        "__": {"type": "stdio", "command": "x"},
    }
    result = load(make(tmp_path, servers, name="acme.tools"))
    decls = mcp_agent_decls(result)
    aliases = [a for a, _ in decls]
    assert aliases == [
        "agent.acme_tools.local_validator",
        "agent.acme_tools.local-validator",
        "agent.acme_tools.local_validator_2",
        "agent.acme_tools.api",
        "agent.acme_tools.server",
    ]
    assert all(ALIAS_PATTERN.fullmatch(a) for a in aliases)
    assert len(set(aliases)) == len(aliases)
    assert [s.name for _, s in decls] == list(servers)
    assert decls[3][1].transport == "http"


@pytest.mark.parametrize("name", ["Ünïcode", "a b/c", "-x-", "", "İ", "x" * 100, "a__b", "9"])
def test_alias_part_always_fits_the_pattern(name: str) -> None:
    assert ALIAS_PATTERN.fullmatch(f"agent.p.{alias_part(name)}")


def test_config_repr_hides_env_and_header_values(tmp_path: Path) -> None:
    result = load(make(tmp_path, {"s": {"type": "stdio", "command": "x", "env": {"K": "v-secret-ish"}}}))
    assert "v-secret-ish" not in repr(result.mcp_servers[0])
    assert os.fspath(result.root) in repr(result)
