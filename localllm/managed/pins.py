"""Artifact pins, read from the shipped ``pins/artifacts.json`` (see ``pins/README.md``).

A pin says where an artifact comes from and which sha256 it must hash to. Nothing is
ever downloaded without a sha256: an entry whose hash is ``null`` raises
:class:`~localllm.errors.PinNotConfigured` when asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.errors import FetchError, PinNotConfigured, UnknownModel, UnsupportedPlatform
from localllm.resources import data_path

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def default_pins_path() -> Path:
    """The shipped pins file."""
    return data_path("pins", "artifacts.json")


@dataclass(frozen=True)
class Artifact:
    """One downloadable file: ``file`` is its name in the cache and on mirrors."""

    name: str
    file: str
    sha256: str | None
    url: str | None = None
    size: int | None = None
    pin_key: str = ""

    def require_sha256(self, pins_file: str = "pins/artifacts.json") -> str:
        """The pinned hash, or :class:`PinNotConfigured` naming the key to fill."""
        if not self.sha256:
            exc = PinNotConfigured(
                f"{self.name} has no sha256 pin ({pins_file}: {self.pin_key}.sha256 is null); "
                "localllm never downloads unverified bytes"
            )
            exc.hint = (
                f"verify {self.file} yourself, put its sha256 at {self.pin_key}.sha256 in "
                f"{pins_file}, or use endpoint mode"
            )
            raise exc
        return self.sha256


@dataclass(frozen=True)
class ModelPin:
    """A GGUF model: its id, role (``chat``/``embedding``) and the artifact."""

    id: str
    role: str
    artifact: Artifact


@dataclass(frozen=True)
class ShimPin:
    """The libstdc++ package for one platform and the member that is installed."""

    artifact: Artifact
    member: str
    provides_glibcxx: int


@dataclass(frozen=True)
class SourcePin:
    """The sdist whose vendored llama.cpp tree is built by ``--from-source``."""

    package: str
    version: str
    artifact: Artifact
    llama_cpp_subdir: str


@dataclass(frozen=True)
class Pins:
    """Every pin of one pins file."""

    path: Path
    release: str
    requires_glibcxx: int
    prebuilt: Mapping[str, Artifact]
    source: SourcePin
    shims: Mapping[str, ShimPin]
    models: Mapping[str, ModelPin]
    default_chat: str

    def server_for(self, platform_key: str) -> Artifact:
        """The prebuilt archive for ``linux/amd64`` etc., or :class:`UnsupportedPlatform`."""
        try:
            return self.prebuilt[platform_key]
        except KeyError:
            known = ", ".join(sorted(self.prebuilt))
            raise UnsupportedPlatform(
                f"no prebuilt llama-server {self.release} pin for {platform_key} "
                f"(pinned: {known})"
            ) from None

    def shim_for(self, platform_key: str) -> ShimPin | None:
        return self.shims.get(platform_key)

    def model(self, model_id: str) -> ModelPin:
        """The pin of ``model_id``, or :class:`UnknownModel` listing the known ids."""
        try:
            return self.models[model_id]
        except KeyError:
            known = ", ".join(sorted(self.models))
            exc = UnknownModel(f"unknown model {model_id!r}; known models: {known}")
            exc.hint = f"pick one of: {known} (pins: {self.path})"
            raise exc from None


def _artifact(raw: Mapping[str, Any], name: str, key: str, where: Path) -> Artifact:
    def bad(msg: str) -> FetchError:
        return FetchError(f"{where}: {key}: {msg}")

    file = raw.get("file")
    if not isinstance(file, str) or not _SAFE_FILE.match(file):
        raise bad(f"file must be a plain file name, got {file!r}")
    sha = raw.get("sha256")
    if sha is not None and (not isinstance(sha, str) or not _SHA256.match(sha)):
        raise bad(f"sha256 must be 64 lowercase hex digits or null, got {sha!r}")
    url = raw.get("url")
    if url is not None and (not isinstance(url, str) or not url.startswith("https://")):
        raise bad(f"url must be an https:// URL or null, got {url!r}")
    size = raw.get("size")
    if size is not None and (not isinstance(size, int) or size < 0):
        raise bad(f"size must be a byte count or null, got {size!r}")
    return Artifact(name=name, file=file, sha256=sha, url=url, size=size, pin_key=key)


def load_pins(path: Path | None = None) -> Pins:
    """Parse and check a pins file (default: the shipped one)."""
    where = path or default_pins_path()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FetchError(f"cannot read pins file {where}: {exc}") from exc
    try:
        server = data["server"]
        release = str(server["release"])
        prebuilt = {
            plat: _artifact(raw, f"llama-server {release} ({plat})", f"server.prebuilt.{plat}", where)
            for plat, raw in server["prebuilt"].items()
        }
        src = data["source"]
        source = SourcePin(
            package=str(src["package"]),
            version=str(src["version"]),
            artifact=_artifact(src, f"{src['package']} {src['version']} sdist", "source", where),
            llama_cpp_subdir=str(src["llama_cpp_subdir"]),
        )
        shims = {
            plat: ShimPin(
                artifact=_artifact(raw, f"libstdc++ shim ({plat})", f"libstdcxx_shim.{plat}", where),
                member=str(raw["member"]),
                provides_glibcxx=int(raw["provides_glibcxx"]),
            )
            for plat, raw in data.get("libstdcxx_shim", {}).items()
        }
        models_raw = data["models"]
        models = {
            mid: ModelPin(
                id=mid,
                role=str(raw["role"]),
                artifact=_artifact(raw, f"model {mid}", f"models.entries.{mid}", where),
            )
            for mid, raw in models_raw["entries"].items()
        }
        for mid in models:
            if not _SAFE_FILE.match(mid):
                raise FetchError(f"{where}: models.entries: model id {mid!r} is not path-safe")
        default_chat = str(models_raw["default_chat"])
        requires = int(server.get("requires_glibcxx", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FetchError(f"{where}: malformed pins file: {exc!r}") from exc
    if default_chat not in models:
        raise FetchError(f"{where}: models.default_chat names unknown model {default_chat!r}")
    return Pins(
        path=where,
        release=release,
        requires_glibcxx=requires,
        prebuilt=prebuilt,
        source=source,
        shims=shims,
        models=models,
        default_chat=default_chat,
    )
