"""``localllm doctor``: what this host has and what the managed backend would use."""

from __future__ import annotations

import platform as _platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from localllm import settings
from localllm.errors import FetchError
from localllm.managed import platforms
from localllm.managed.cache import CacheLayout
from localllm.managed.fetch import shown_url
from localllm.managed.pins import Pins


def _tool_version(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else None


def report(pins: Pins, layout: CacheLayout) -> dict[str, Any]:
    """The doctor report as data (the CLI prints it as text or JSON)."""
    from localllm.managed.cxxshim import fmt, probe_system
    from localllm.managed.inventory import list_cache
    from localllm.managed.release import cached_server
    from localllm.managed.source_build import build_tools

    plat = platforms.current()
    probe = probe_system() if plat.is_linux else None
    shim = pins.shim_for(plat.key)
    server = pins.prebuilt.get(plat.key)
    cached = cached_server(pins, layout)
    entries = list_cache(layout, pins)
    models = {}
    for mid, pin in sorted(pins.models.items()):
        art = pin.artifact
        state = "pin not configured (no sha256)" if not art.sha256 else ("mirror only" if not art.url else "pinned")
        cached_model = any(e.kind == "model" and e.name == mid and e.status != "stale" for e in entries)
        models[mid] = {
            "role": pin.role,
            "file": art.file,
            "pin": state,
            "cached": cached_model,
            "chat_format": pin.chat_template or (pin.chat_template_file and pin.chat_template_file.name),
            "template_warning": _template_warning(mid) if cached_model and pin.role == "chat" else None,
        }
    needs_shim = None
    if probe is not None:
        needs_shim = probe.highest is None or probe.highest < pins.requires_glibcxx
    tools = build_tools()
    return {
        "platform": plat.key,
        "python": sys.version.split()[0],
        "os": f"{_platform.system()} {_platform.release()}",
        "glibc": platforms.glibc_version(),
        "libstdcxx": None
        if probe is None
        else {
            "path": str(probe.path) if probe.path else None,
            "highest": fmt(probe.highest),
            "server_needs": fmt(pins.requires_glibcxx),
            "shim_needed": needs_shim,
            "shim_pin": None if shim is None else f"{shim.artifact.file} ({fmt(shim.provides_glibcxx)})",
        },
        "pins": {
            "file": str(pins.path),
            "server_release": pins.release,
            "prebuilt_for_platform": server.file if server else None,
            "source": f"{pins.source.package} {pins.source.version}",
            "default_chat": pins.default_chat,
            "models": models,
        },
        "settings": {
            "cache_dir": str(layout.root),
            "mirrors": [shown_url(mirror) for mirror in settings.mirrors()],  # a password masked
            "offline": _offline(),
            "server_bin": settings.server_bin(),
        },
        "server": None
        if cached is None
        else {
            "binary": str(cached.binary),
            "release": cached.release,
            "source": cached.source,
        },
        "cache": [e.to_json() for e in entries],
        "build_tools": {
            name: (None if path is None else {"path": path, "version": _tool_version(path)})
            for name, path in tools.items()
        },
    }


def _template_warning(model_id: str) -> str | None:
    """A cached chat model whose GGUF has no chat template and whose pin sets none."""
    from localllm.managed.gguf import template_warning

    return template_warning(model_id, base_dir=Path.cwd())


def _offline() -> bool | str:
    """``LOCALLLM_OFFLINE`` as doctor shows it: on, off, or why it is neither."""
    try:
        return settings.offline()
    except FetchError as exc:
        return f"invalid: {exc}"
