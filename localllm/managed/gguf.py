"""Read a GGUF file's metadata header (key/value pairs) without loading tensors.

Layout (little-endian, GGUF v2/v3): ``b"GGUF"``, u32 version, u64 tensor count, u64
metadata count, then each pair as a string key (u64 length + UTF-8 bytes), a u32 value
type and the value. Only the header is read, bounded by caps, so a hostile or truncated
file is a :class:`GGUFError`, never a huge allocation.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from localllm.errors import LocalLLMError

#: the metadata key holding a model's Jinja chat template
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 16 << 20  # a chat template is a few KiB; a vocabulary entry a few bytes
_MAX_PAIRS = 1 << 16
_MAX_ITEMS = 1 << 22  # tokenizer vocabularies run to ~260k entries
_MAX_DEPTH = 4  # arrays of arrays: real files nest at most one level


class GGUFError(LocalLLMError):
    """The file is not a readable GGUF header."""


class _Reader:
    def __init__(self, stream: BinaryIO, path: Path) -> None:
        self.stream = stream
        self.path = path

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise GGUFError(f"{self.path}: truncated GGUF header")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, *, keep: bool = True) -> str:
        size = self.scalar("<Q")
        if size > _MAX_STRING:
            raise GGUFError(f"{self.path}: GGUF string of {size} bytes is past the {_MAX_STRING}-byte cap")
        if not keep:
            self.stream.seek(size, 1)
            return ""
        return self.take(size).decode("utf-8", errors="replace")

    def value(self, kind: int, *, keep: bool, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string(keep=keep)
        if kind == _ARRAY:
            if depth >= _MAX_DEPTH:
                raise GGUFError(f"{self.path}: GGUF arrays nested past the {_MAX_DEPTH}-level cap")
            inner, count = self.scalar("<I"), self.scalar("<Q")
            if count > _MAX_ITEMS:
                raise GGUFError(f"{self.path}: GGUF array of {count} items is past the {_MAX_ITEMS} cap")
            if not keep and inner in _SCALARS:  # skipped, not read: a vocabulary's scores and types
                self.stream.seek(count * struct.calcsize(_SCALARS[inner]), 1)
                return None
            items = [self.value(inner, keep=keep, depth=depth + 1) for _ in range(count)]
            return items if keep else None
        raise GGUFError(f"{self.path}: unknown GGUF value type {kind}")


def read_metadata(path: Path, *, arrays: bool = False) -> dict[str, Any]:
    """The header's key/value pairs; arrays (the vocabulary) are skipped unless ``arrays``."""
    try:
        with path.open("rb") as stream:
            reader = _Reader(stream, path)
            if reader.take(4) != b"GGUF":
                raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
            version = reader.scalar("<I")
            if version not in (2, 3):
                raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            reader.scalar("<Q")  # tensor count
            pairs = reader.scalar("<Q")
            if pairs > _MAX_PAIRS:
                raise GGUFError(f"{path}: {pairs} metadata pairs is past the {_MAX_PAIRS} cap")
            meta: dict[str, Any] = {}
            for _ in range(pairs):
                key = reader.string()
                kind = reader.scalar("<I")
                meta[key] = reader.value(kind, keep=arrays or kind != _ARRAY)
            return meta
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def chat_template(path: Path) -> str | None:
    """The GGUF's ``tokenizer.chat_template``, or ``None`` when it carries none."""
    value = read_metadata(path).get(CHAT_TEMPLATE_KEY)
    return value if isinstance(value, str) and value.strip() else None


def template_warning(model: str, *, base_dir: Path, extra_args: tuple[str, ...] | list[str] = ()) -> str | None:
    """Why a managed chat ``model:`` will be prompted through llama-server's ChatML
    fallback — its GGUF has no ``tokenizer.chat_template`` and neither its pin nor
    ``extra_args`` set one — or ``None``. A pinned model not cached yet is not read."""
    from localllm.managed.cache import cache_layout
    from localllm.managed.pins import TEMPLATE_FLAGS, load_pins

    if any(a.partition("=")[0] in TEMPLATE_FLAGS for a in extra_args):
        return None
    pin = load_pins().model_for(model)
    if pin is not None and (pin.chat_template or pin.chat_template_file):
        return None
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        path = path if path.is_absolute() else base_dir / path
    elif pin is not None and pin.artifact.sha256:
        path = cache_layout().model_path(pin)
    else:
        return None
    if not path.is_file():
        return None
    try:
        if chat_template(path) is not None:
            return None
    except GGUFError as exc:
        return str(exc)
    return (
        f"{path.name} has no chat template ({CHAT_TEMPLATE_KEY}) and none is configured: llama-server "
        "falls back to ChatML, which a model not trained on it answers with raw <|im_start|> markers; "
        "set extra_args: [--chat-template, NAME] (or pin chat_template for the model)"
    )
