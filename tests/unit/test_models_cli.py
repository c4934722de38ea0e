"""``localllm models``, ``cache rm``, stores in ``cache list`` and user pins (issue 10 item 28)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.managed.cache import cache_layout
from localllm.managed.pins import load_pins, user_pins_path


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def _cache_model(model_id: str, data: bytes = b"GGUF" + b"\0" * 60) -> Path:
    path = cache_layout().model_path(load_pins().model(model_id))
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return path


def test_models_lists_every_pin_cached_or_not_with_sizes_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    _cache_model("all-minilm-l6-v2")
    assert main(["models", "--json"]) == 0
    doc = _json(capsys)
    rows = {r["id"]: r for r in doc["models"]}
    assert set(rows) == set(load_pins().models)
    assert (rows["all-minilm-l6-v2"]["cached"], rows["all-minilm-l6-v2"]["size"]) == (True, 64)
    assert (rows["gemma-3-270m"]["cached"], rows["gemma-3-270m"]["size"]) == (False, 253113024)  # the pin's size
    assert rows["gemma-3-270m"]["role"] == "chat" and rows["gemma-3-270m"]["pinned"] == "shipped"
    assert doc["cached_bytes"] == 64
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "1 of 5 cached" in text and "all-minilm-l6-v2" in text


def test_cache_list_shows_embedding_stores_and_cache_rm_removes_one(capsys: pytest.CaptureFixture[str]) -> None:
    store = cache_layout().root / "embed" / "all-minilm-l6-v2-0123abcd.sqlite"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"x" * 100)
    store.with_name(store.name + "-wal").write_bytes(b"y" * 10)
    assert main(["cache", "list", "--json"]) == 0
    [entry] = [e for e in _json(capsys)["entries"] if e["kind"] == "store"]
    assert (entry["name"], entry["size"], entry["status"]) == (store.name, 110, "ok")
    assert main(["cache", "rm", store.name, "--json"]) == 0
    assert _json(capsys)["bytes"] == 110
    assert not store.exists() and not store.with_name(store.name + "-wal").exists()


def test_cache_rm_removes_a_model_and_names_what_exists_when_nothing_matches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _cache_model("all-minilm-l6-v2")
    assert main(["cache", "rm", "gemma-3-270m", "--json"]) == 1
    doc = _json(capsys)
    assert doc["ok"] is False and "all-minilm-l6-v2" in doc["hint"]
    assert main(["cache", "rm", "all-minilm-l6-v2"]) == 0
    assert not path.exists() and not (cache_layout().models_dir / "all-minilm-l6-v2").exists()


def test_fetch_model_url_pins_a_new_model_in_the_user_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    data = b"GGUF tiny model"
    (mirror / "tiny-q8_0.gguf").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setenv("LOCALLLM_MIRROR", str(mirror))
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    argv = [
        "fetch",
        "model",
        "--url",
        "https://example.invalid/m/tiny-q8_0.gguf",
        "--sha256",
        sha,
        "--id",
        "tiny",
        "--json",
    ]
    assert main(argv) == 0
    fetched = Path(_json(capsys)["path"])
    assert fetched.read_bytes() == data
    entry = json.loads(user_pins_path().read_text())["models"]["entries"]["tiny"]
    assert (entry["file"], entry["sha256"], entry["role"]) == ("tiny-q8_0.gguf", sha, "chat")
    assert load_pins().model("tiny").pins_file == user_pins_path()
    assert main(["models", "--json"]) == 0
    rows = {r["id"]: r for r in _json(capsys)["models"]}
    assert (rows["tiny"]["pinned"], rows["tiny"]["cached"]) == ("user", True)
    assert main(argv) == 1  # the id is taken now: refused, the file unchanged
    doc = _json(capsys)
    assert "already exists" in doc["detail"] and "--replace" in doc["hint"] and "--unpin tiny" in doc["hint"]


def test_a_user_pin_can_be_replaced_and_removed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from localllm.managed.pins import add_user_model

    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # the fetch after pinning opens no socket
    add_user_model("tiny", url="https://example.invalid/a.gguf", sha256="a" * 64)
    argv = ["fetch", "model", "--url", "https://example.invalid/b.gguf", "--sha256", "b" * 64, "--id", "tiny"]
    assert main([*argv, "--json"]) == 1  # taken
    capsys.readouterr()
    main([*argv, "--replace", "--json"])  # replaced, then fetched (fails offline: not cached)
    capsys.readouterr()
    entry = json.loads(user_pins_path().read_text())["models"]["entries"]["tiny"]
    assert (entry["file"], entry["sha256"]) == ("b.gguf", "b" * 64)
    assert main(["models", "--unpin", "tiny", "--json"]) == 0
    assert _json(capsys)["unpinned"] == "tiny"
    assert "tiny" not in json.loads(user_pins_path().read_text())["models"]["entries"]
    assert main(["models", "--unpin", "tiny", "--json"]) == 2  # no longer pinned: a usage error
    assert main(["models", "--unpin", "gemma-3-270m", "--json"]) == 1  # shipped: not the user's to remove


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["fetch", "model"], 2),
        (["fetch", "model", "--url", "https://example.invalid/x.gguf", "--id", "x"], 2),  # no --sha256
        (
            ["fetch", "model", "--url", "https://example.invalid/x.gguf", "--sha256", "0" * 64, "--id", "gemma-3-270m"],
            1,
        ),  # a shipped id
    ],
)
def test_fetch_model_bad_usage(argv: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--json"]) == code
    assert _json(capsys)["ok"] is False
    assert not user_pins_path().exists()


def test_a_broken_user_pins_file_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    user_pins_path().parent.mkdir(parents=True, exist_ok=True)
    user_pins_path().write_text("{not json")
    assert main(["models", "--json"]) == 1
    assert str(user_pins_path()) in _json(capsys)["detail"]
