"""GGUF chat templates (issue 10 item 21): the header reader, pinned prompt formats on the
server's command line, and the warnings of ``check``/``doctor`` for a GGUF without one."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.managed.gguf import CHAT_TEMPLATE_KEY, GGUFError, chat_template, read_metadata
from localllm.managed.pins import chat_format_args, load_pins
from localllm.managed.server import ManagedServer


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(path: Path, meta: dict[str, Any]) -> Path:
    """A GGUF v3 header with ``meta`` (str, int, bool, list of str) and no tensors."""
    body = b""
    for key, value in meta.items():
        body += _string(key)
        if isinstance(value, bool):
            body += struct.pack("<I?", 7, value)
        elif isinstance(value, int):
            body += struct.pack("<Iq", 11, value)
        elif isinstance(value, str):
            body += struct.pack("<I", 8) + _string(value)
        else:
            body += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta)) + body)
    return path


def test_reader_finds_the_template_and_skips_the_vocabulary(tmp_path: Path) -> None:
    path = gguf(
        tmp_path / "m.gguf",
        {
            "general.architecture": "gemma3",
            "tokenizer.ggml.tokens": ["<pad>", "a"],
            "tokenizer.ggml.add_bos_token": True,
            CHAT_TEMPLATE_KEY: "{{ messages }}",
            "gemma3.context_length": 32768,
        },
    )
    meta = read_metadata(path)
    assert meta["general.architecture"] == "gemma3" and meta["gemma3.context_length"] == 32768
    assert meta["tokenizer.ggml.tokens"] is None  # arrays are skipped unless asked for
    assert read_metadata(path, arrays=True)["tokenizer.ggml.tokens"] == ["<pad>", "a"]
    assert chat_template(path) == "{{ messages }}"
    assert chat_template(gguf(tmp_path / "base.gguf", {"general.architecture": "gemma3"})) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"GGML" + b"\0" * 20,
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + b"\1\0",
        b"GGUF" + struct.pack("<IQQ", 9, 0, 0),
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40),
        # arrays of arrays 5000 deep: a RecursionError before
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + _string("k")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 9, 1) * 5000
        + struct.pack("<IQ", 4, 0),
    ],
)
def test_a_bad_header_is_a_gguf_error(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "bad.gguf").write_bytes(data)
    with pytest.raises(GGUFError):
        read_metadata(tmp_path / "bad.gguf")


def _user_pins(entries: dict[str, Any]) -> None:
    from localllm.managed.pins import user_pins_path

    user_pins_path().parent.mkdir(parents=True, exist_ok=True)
    user_pins_path().write_text(json.dumps({"format": 1, "models": {"entries": entries}}))


def test_a_pinned_chat_template_reaches_the_server_argv(tmp_path: Path, server_bin: Path) -> None:
    model = gguf(tmp_path / "tiny-base.gguf", {"general.architecture": "gemma3"})
    _user_pins(
        {
            "tiny-base": {
                "role": "chat",
                "file": "tiny-base.gguf",
                "url": None,
                "sha256": "0" * 64,
                "chat_template": "gemma",
            }
        }
    )
    assert load_pins().model_for(model).chat_template == "gemma"  # type: ignore[union-attr]
    assert chat_format_args(model, "chat", []) == ["--chat-template", "gemma"]
    assert chat_format_args(model, "embedding", []) == []
    assert chat_format_args(model, "chat", ["--chat-template-file=x.jinja"]) == []  # the caller's own wins
    log = tmp_path / "spawn.jsonl"
    with ManagedServer(server_bin, model, env={"FAKE_LLAMA_SPAWN_LOG": str(log)}, health_timeout=30) as server:
        server.ensure_ready()
        argv = server.argv()
    assert argv[argv.index("--chat-template") + 1] == "gemma"


def test_the_shipped_gemma_pin_carries_a_prompt_format() -> None:
    assert load_pins().model("gemma-3-270m").chat_format_args() != []


def test_check_warns_when_a_gguf_has_no_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf(tmp_path / "base.gguf", {"general.architecture": "gemma3"})
    gguf(tmp_path / "chat.gguf", {"general.architecture": "gemma3", CHAT_TEMPLATE_KEY: "{{ messages }}"})
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        "  agent.base: {plugin: builtin.local_llm, model: base.gguf}\n"
        "  agent.chat: {plugin: builtin.local_llm, model: chat.gguf}\n"
        "  agent.set: {plugin: builtin.local_llm, model: base.gguf, extra_args: [--chat-template, gemma]}\n"
    )
    assert main(["check", str(tmp_path / "app.yaml"), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("agent_plugins.agent.base.model: base.gguf has no chat")
    assert main(["check", str(tmp_path / "app.yaml")]) == 0
    assert capsys.readouterr().err.count("warning: agent_plugins.agent.base.model") == 1
