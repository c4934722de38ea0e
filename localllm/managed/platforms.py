"""The host platform as pins name it (``linux/amd64``) and as cache dirs name it."""

from __future__ import annotations

import os
import platform as _platform
import sys
from dataclasses import dataclass

_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
}
_SLUG_ARCH = {"amd64": "x86_64", "arm64": "arm64"}


@dataclass(frozen=True)
class Platform:
    """``os`` is ``linux``/``darwin``/…, ``arch`` is ``amd64``/``arm64``/the raw machine name."""

    os: str
    arch: str

    @property
    def key(self) -> str:
        """The pin key, e.g. ``linux/amd64``."""
        return f"{self.os}/{self.arch}"

    @property
    def slug(self) -> str:
        """A path-safe name used in cache directories, e.g. ``linux-x86_64``."""
        return f"{self.os}-{_SLUG_ARCH.get(self.arch, self.arch)}"

    @property
    def is_linux(self) -> bool:
        return self.os == "linux"

    @property
    def is_macos(self) -> bool:
        return self.os == "darwin"


def current() -> Platform:
    """The platform this interpreter runs on."""
    system = sys.platform
    os_name = "linux" if system.startswith("linux") else system
    machine = _platform.machine().lower()
    return Platform(os=os_name, arch=_ARCH.get(machine, machine))


def glibc_version() -> str | None:
    """The C library version on glibc Linux (``2.36``), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        value = None
    if value and value.startswith("glibc "):
        return value.split(" ", 1)[1]
    lib, version = _platform.libc_ver()
    return version if lib == "glibc" and version else None
