"""The shipped pins hold exactly the reviewed artifacts; bad pins fail naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.errors import FetchError, PinNotConfigured, UnknownModel, UnsupportedPlatform
from localllm.managed.pins import load_pins

REPO = Path(__file__).resolve().parents[2]


def test_shipped_pins_match_the_reviewed_values() -> None:
    pins = load_pins()
    assert pins.release == "b9444"
    linux = pins.server_for("linux/amd64")
    assert (
        linux.url == "https://github.com/ggml-org/llama.cpp/releases/download/b9444/llama-b9444-bin-ubuntu-x64.tar.gz"
    )
    assert linux.sha256 == "5d676e97ca82353256f24ed381be60c71f721b4ab52962483e5fce22ea8b3fd4"
    mac = pins.server_for("darwin/arm64")
    assert mac.file == "llama-b9444-bin-macos-arm64.tar.gz"
    assert mac.sha256 == "36cd51637cf480220eb29b0adf2003b25e4d6e1665920c29634b49355414e8b8"
    assert pins.source.package == "llama-cpp-python" and pins.source.version == "0.3.36"
    assert pins.source.artifact.sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    shim = pins.shim_for("linux/amd64")
    assert shim is not None and shim.member == "lib/libstdc++.so.6.0.30" and shim.provides_glibcxx == 30
    assert shim.artifact.sha256 == "0289e6a7b9a5249161a3967909e12dcfb4ab4475cdede984635d3fb65c606f08"
    assert pins.default_chat == "qwen2.5-1.5b-instruct"
    expected = {
        "qwen2.5-1.5b-instruct": "6a1a2eb6d15622bf3c96857206351ba97e1af16c30d7a74ee38970e434e9407e",
        "gemma-3-270m": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "nomic-embed-text-v1.5": "d4e388894e09cf3816e8b0896d81d265b55e7a9fff9ab03fe8bf4ef5e11295ac",
        "all-minilm-l6-v2": "45013d2d36e25fb4f81be9fd7216f41e4c5afb936397c07a0e593b8b5fcac181",
        "bge-small-en-v1.5": None,
    }
    assert {mid: m.artifact.sha256 for mid, m in pins.models.items()} == expected
    assert pins.model("all-minilm-l6-v2").artifact.url is None  # mirror only
    assert pins.model("gemma-3-270m").artifact.file == "gemma-3-270m-q4_k_m.gguf"


def test_shipped_pins_are_the_top_level_file() -> None:
    assert load_pins().path.resolve() == (REPO / "pins" / "artifacts.json").resolve()


def test_bge_small_has_no_hash_and_is_refused() -> None:
    art = load_pins().model("bge-small-en-v1.5").artifact
    with pytest.raises(PinNotConfigured) as info:
        art.require_sha256()
    assert "models.entries.bge-small-en-v1.5.sha256" in str(info.value)
    assert "endpoint mode" in info.value.hint


def test_unknown_model_lists_known_ids() -> None:
    with pytest.raises(UnknownModel) as info:
        load_pins().model("llama-70b")
    for mid in ("gemma-3-270m", "qwen2.5-1.5b-instruct", "all-minilm-l6-v2"):
        assert mid in str(info.value)


def test_unpinned_platform_names_the_alternatives() -> None:
    with pytest.raises(UnsupportedPlatform) as info:
        load_pins().server_for("windows/amd64")
    assert "windows/amd64" in str(info.value)
    assert "--from-source" in info.value.hint and "endpoint mode" in info.value.hint


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("models", "entries", "gemma-3-270m", "sha256"), "ABC", "models.entries.gemma-3-270m: sha256"),
        (("models", "entries", "gemma-3-270m", "url"), "http://x/y", "url must be an https://"),
        (("models", "entries", "gemma-3-270m", "file"), "../evil.gguf", "plain file name"),
        (("models", "default_chat"), "nope", "default_chat names unknown model"),
        (("models", "entries", "gemma-3-270m", "size"), True, "models.entries.gemma-3-270m: size"),  # bool is an int
    ],
)
def test_malformed_pins_name_the_key(tmp_path: Path, path: tuple[str, ...], value: object, needle: str) -> None:
    data = json.loads((REPO / "pins" / "artifacts.json").read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = tmp_path / "pins.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(FetchError, match=r"pins\.json") as info:
        load_pins(bad)
    assert needle in str(info.value)


def test_readme_documents_every_field() -> None:
    readme = (REPO / "pins" / "README.md").read_text()
    for field in (
        "file",
        "url",
        "sha256",
        "size",
        "requires_glibcxx",
        "prebuilt",
        "llama_cpp_subdir",
        "member",
        "provides_glibcxx",
        "default_chat",
        "role",
    ):
        assert f"`{field}`" in readme or f".{field}`" in readme or f".{field}." in readme, field
