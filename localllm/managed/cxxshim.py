"""The libstdc++ shim: prebuilt llama-server on Linux hosts whose C++ runtime is too old.

Upstream Linux builds use GCC 12 and need ``GLIBCXX_3.4.30``; RHEL 9, Debian 11 and
Ubuntu 20.04 stop at 3.4.29. The probe reads the system ``libstdc++.so.6`` (found through
``ldconfig -p``, then the usual library directories) and takes the highest
``GLIBCXX_3.4.N`` in its bytes. Only when that is below what the release needs is the
pinned conda-forge ``libstdcxx-ng`` fetched and its ``libstdc++.so.6.0.30`` installed as
``libstdc++.so.6`` in the release directory, where it resolves first (RUNPATH ``$ORIGIN``
and the release dir leading ``LD_LIBRARY_PATH``).

What the release needs is read from the release itself: the highest ``GLIBCXX_3.4.N``
its own ELF files reference. The pin's ``requires_glibcxx`` is the reviewed expectation.
How disagreements are reported:

* release needs more than the pin says → a ``warning:`` line on stderr naming both
  numbers; the release's own figure is used (it is what the dynamic loader will demand);
* the shim package provides less than the release needs, or there is no shim pin for
  the platform → :class:`~localllm.errors.LibstdcxxTooOld` carrying ``required``,
  ``system`` and ``shim`` and naming the fixes (newer libstdc++, ``--from-source``,
  endpoint mode); nothing is installed;
* no system libstdc++ found → treated as too old (``system=None``), shim installed;
* ``localllm doctor`` prints system, pin and shim figures side by side.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from localllm.errors import LibstdcxxTooOld
from localllm.managed.pins import ShimPin

_GLIBCXX = re.compile(rb"GLIBCXX_3\.4\.(\d+)")
_USUAL_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
    "/usr/local/lib64",
    "/usr/local/lib",
)
SHIM_NAME = "libstdc++.so.6"
_ELF = b"\x7fELF"


@dataclass(frozen=True)
class CxxProbe:
    """The system libstdc++ found (or ``None``) and its highest GLIBCXX_3.4.N."""

    path: Path | None
    highest: int | None


def highest_glibcxx(path: Path) -> int | None:
    """Highest ``N`` of ``GLIBCXX_3.4.N`` in a file's bytes, ``None`` if there is none."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    found = [int(m.group(1)) for m in _GLIBCXX.finditer(data)]
    return max(found) if found else None


def _ldconfig_paths() -> list[Path]:
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        paths = []
        for line in out.splitlines():
            name, _, where = line.partition("=>")
            if name.strip().startswith(SHIM_NAME + " "):
                paths.append(Path(where.strip()))
        return paths
    return []


def find_system_libstdcxx(extra: Iterable[Path] = ()) -> Path | None:
    """The system ``libstdc++.so.6``: ldconfig's answer first, then the usual directories."""
    candidates = [*extra, *_ldconfig_paths(), *(Path(d) / SHIM_NAME for d in _USUAL_DIRS)]
    for path in candidates:
        if path.exists():
            return path
    return None


def probe_system(candidates: Iterable[Path] | None = None) -> CxxProbe:
    """Find the system libstdc++ and its highest GLIBCXX version."""
    path = find_system_libstdcxx() if candidates is None else next((p for p in candidates if p.exists()), None)
    return CxxProbe(path=path, highest=highest_glibcxx(path) if path else None)


def required_by_release(release_dir: Path) -> int | None:
    """Highest GLIBCXX_3.4.N referenced by the release's own ELF files (not a shim)."""
    best: int | None = None
    for path in sorted(release_dir.iterdir()):
        if path.is_symlink() or not path.is_file() or path.name.startswith("libstdc++"):
            continue
        with path.open("rb") as fh:
            if fh.read(4) != _ELF:
                continue
        n = highest_glibcxx(path)
        if n is not None and (best is None or n > best):
            best = n
    return best


def fmt(n: int | None) -> str:
    return "none found" if n is None else f"GLIBCXX_3.4.{n}"


def ensure_shim(
    release_dir: Path,
    *,
    pinned_required: int,
    shim: ShimPin | None,
    fetch_shim: Callable[[ShimPin], Path],
    probe: CxxProbe,
    log: Callable[[str], None],
) -> bool:
    """Install the shim into ``release_dir`` when the system is too old; True if installed.

    ``fetch_shim`` returns the verified shim package (the caller owns caching/mirrors).
    """
    from localllm.managed.extract import extract_member

    found = required_by_release(release_dir)
    if found is None:
        return False  # not a GNU C++ build (or not Linux): nothing to check
    if found > pinned_required:
        log(
            f"warning: llama-server in {release_dir} references {fmt(found)} but the pin "
            f"expects {fmt(pinned_required)}; using {fmt(found)}"
        )
    required = found
    if probe.highest is not None and probe.highest >= required:
        return False
    where = f"system libstdc++ ({probe.path or 'not found'}) has {fmt(probe.highest)}"
    if shim is None:
        raise LibstdcxxTooOld(
            f"llama-server needs {fmt(required)}; {where}, and no libstdc++ shim is pinned for this platform",
            required=required,
            system=probe.highest,
            shim=None,
            hint="install a newer libstdc++ (GCC 12+), build with `localllm fetch server --from-source`, "
            "or use endpoint mode",
        )
    log(f"{where}; llama-server needs {fmt(required)}: installing the pinned libstdc++ shim")
    package = fetch_shim(shim)
    target = release_dir / SHIM_NAME
    extract_member(package, shim.member, target)
    provided = highest_glibcxx(target)
    if provided is None or provided < required:
        target.unlink(missing_ok=True)
        raise LibstdcxxTooOld(
            f"llama-server needs {fmt(required)}; {where}, and the pinned shim "
            f"{shim.artifact.file}:{shim.member} provides only {fmt(provided)} "
            f"(pin says {fmt(shim.provides_glibcxx)})",
            required=required,
            system=probe.highest,
            shim=provided,
            hint="update libstdcxx_shim in pins/artifacts.json, build with `localllm fetch server "
            "--from-source`, or use endpoint mode",
        )
    return True
