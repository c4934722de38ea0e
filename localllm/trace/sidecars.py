"""Sidecar files beside a trace: large prompts/responses and per-call transcripts.

Layout under the trace's directory (paths in events are relative to it, POSIX style)::

    agent-prompts/<call_id><suffix>.txt             the rendered prompt, UTF-8, verbatim
    agent-prompts/<call_id><suffix>-response.json   the response value as compact JSON + "\\n"
    transcripts/<call_id><suffix>.jsonl             backend-native events, one verbatim line each
    transcripts/<call_id><suffix>.timings           "<index> <ms-offset>" per line

Every file is written atomically: a temp file in the directory's hidden ``.tmp/``
(:data:`TEMP_DIR`; same file system, so the rename or link stays atomic), fsync, rename,
then fsync of the directory — a reader never sees half a sidecar, and a temp name
(``.tmp/.<name>.<pid>.<random>.tmp``) never shares a directory with the sidecars: no
sidecar name starts with a dot, and ``trace verify`` refuses a reference into ``.tmp/``. ``exclusive=True`` (what the
recorder writes) links the temp file to its name instead of renaming it, so it never
replaces a file there: :class:`SidecarTaken` when another writer got the name first.
Sidecar content is not bound by the trace's line rules (that is what they are for).
``suffix`` (``""`` by default) keeps a second attempt under the same call_id (a fallback)
from overwriting the first.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm import _fs
from localllm.errors import TraceError, TraceWriteRejected
from localllm.trace import rules
from localllm.trace.event import dumps

if TYPE_CHECKING:
    from localllm.wire import Transcript

__all__ = [
    "NAME_MAX",
    "PATH_MAX",
    "PROMPTS_DIR",
    "SIDECAR_THRESHOLD",
    "TEMP_DIR",
    "TRANSCRIPTS_DIR",
    "TRANSCRIPT_SCHEMA_VERSION",
    "SidecarTaken",
    "atomic_write",
    "is_temp_ref",
    "name_problem",
    "needs_sidecar",
    "sidecar_refs",
    "sweep_stale_temps",
    "write_prompt",
    "write_response",
    "write_transcript",
]

SIDECAR_THRESHOLD = 1024
"""Prompts/responses larger than this many UTF-8 bytes go to a sidecar file."""
PROMPTS_DIR = "agent-prompts"
TRANSCRIPTS_DIR = "transcripts"
#: the hidden subdirectory of each sidecar directory that temp files are written in
TEMP_DIR = ".tmp"
TRANSCRIPT_SCHEMA_VERSION = 1

NAME_MAX = 255
"""Longest file name component, in bytes, a sidecar reference may have (POSIX NAME_MAX)."""
PATH_MAX = 4095
"""Longest sidecar reference, in bytes."""

#: the name of a temp file :mod:`localllm._fs` writes a sidecar through (``_fs.tmp_name``);
#: an earlier localllm wrote it beside the sidecars, this one in :data:`TEMP_DIR`
_TEMP = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp")
#: a temp older than this belongs to no live write (a sidecar is written in well under a second)
TEMP_GRACE_SECONDS = 3600.0
_CALL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SUFFIX = re.compile(r"[A-Za-z0-9._-]{0,64}")


def needs_sidecar(value: Any) -> bool:
    """True when ``value`` (prompt text or a response value) should go to a sidecar file.

    That is when it is over :data:`SIDECAR_THRESHOLD` bytes (UTF-8 text, or its JSON form
    for other values), or when it cannot be inlined in a trace line at all (CRLF, NUL,
    non-NFC text, NaN, non-JSON types) — a sidecar holds such content verbatim.
    """
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
    else:
        try:
            size = len(dumps(value).encode("utf-8", "surrogatepass"))
        except (TypeError, ValueError, RecursionError):
            return True
    if size > SIDECAR_THRESHOLD:
        return True
    try:
        rules.check_value(value, "value")
    except TraceWriteRejected:
        return True
    return False


def sidecar_refs(payload: dict[str, Any]) -> list[tuple[str, object]]:
    """``(key, relative path)`` of every sidecar an event payload refers to: ``prompt_file``,
    ``response_file`` and the ``path`` of each ``*transcript_ref`` (``None`` when not a dict)."""
    refs: list[tuple[str, object]] = [(key, payload[key]) for key in ("prompt_file", "response_file") if key in payload]
    for key, value in payload.items():
        if key.endswith("transcript_ref"):
            refs.append((key, value.get("path") if isinstance(value, dict) else None))
    return refs


def name_problem(rel: str) -> str | None:
    """Why the string ``rel`` can never name a file (NUL, too long), or ``None``.

    Checked without touching the file system, so a hostile trace cannot make a reader's
    ``stat`` fail with ENAMETOOLONG; whether the file exists is the verifier's question.
    """
    if "\x00" in rel:
        return "contains a NUL character"
    raw = rel.encode("utf-8", "surrogatepass")
    if len(raw) > PATH_MAX:
        return f"is {len(raw)} bytes long (at most {PATH_MAX})"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        return f"has a file name of {longest} bytes (at most {NAME_MAX})"
    return None


def write_prompt(
    trace_dir: str | os.PathLike[str], call_id: str, text: str, *, suffix: str = "", exclusive: bool = False
) -> str:
    """Write the prompt sidecar; returns its path relative to ``trace_dir`` (for ``prompt_file``)."""
    rel = f"{PROMPTS_DIR}/{_stem(call_id, suffix)}.txt"
    atomic_write(_within(trace_dir, rel), _utf8(text, "prompt"), exclusive=exclusive)
    return rel


def write_response(
    trace_dir: str | os.PathLike[str], call_id: str, value: Any, *, suffix: str = "", exclusive: bool = False
) -> str:
    """Write the response sidecar as JSON; returns its relative path (for ``response_file``)."""
    rel = f"{PROMPTS_DIR}/{_stem(call_id, suffix)}-response.json"
    try:
        text = dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise rules.reject("response", f"is not JSON-serialisable: {exc}") from None
    atomic_write(_within(trace_dir, rel), _utf8(text + "\n", "response"), exclusive=exclusive)
    return rel


def write_transcript(
    trace_dir: str | os.PathLike[str],
    call_id: str,
    transcript: Transcript,
    *,
    suffix: str = "",
    exclusive: bool = False,
) -> dict[str, Any]:
    """Write ``transcripts/<call_id><suffix>.jsonl`` and ``.timings``; returns the ``transcript_ref``."""
    stem = _stem(call_id, suffix)
    lines = list(transcript.lines)
    offsets = list(transcript.offsets_ms)
    if len(offsets) != len(lines):
        raise rules.reject("transcript", f"has {len(lines)} lines but {len(offsets)} offsets_ms (one offset per line)")
    for index, line in enumerate(lines):
        if not isinstance(line, str) or "\n" in line:
            raise rules.reject(f"transcript.lines[{index}]", "must be one line of text (no newline)")
    for index, offset in enumerate(offsets):
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise rules.reject(f"transcript.offsets_ms[{index}]", f"must be an integer, got {offset!r}")
    rel = f"{TRANSCRIPTS_DIR}/{stem}.jsonl"
    base = Path(trace_dir)
    timings = "".join(f"{index} {offset}\n" for index, offset in enumerate(offsets))
    timings_path = _within(base, f"{TRANSCRIPTS_DIR}/{stem}.timings")  # first: a transcript never lacks it
    atomic_write(timings_path, timings.encode("ascii"), sync_dir=False, exclusive=exclusive)
    try:
        atomic_write(
            _within(base, rel), _utf8("".join(line + "\n" for line in lines), "transcript"), exclusive=exclusive
        )
    except TraceError:  # taken, or a full disk: the timings of a transcript never written go too
        timings_path.unlink(missing_ok=True)  # ours: written just now
        raise
    return {
        "format": transcript.format,
        "path": rel,
        "events": len(lines),
        "schema_version": TRANSCRIPT_SCHEMA_VERSION,
    }


def sweep_stale_temps(trace_dir: str | os.PathLike[str], *, now: float | None = None) -> list[Path]:
    """Remove the temp files a killed writer left in ``trace_dir``'s sidecar directories
    (a process dies between creating its temp file and linking it; nobody else removes
    them); only names :func:`localllm._fs.tmp_name` makes, older than
    :data:`TEMP_GRACE_SECONDS`. Returns what was removed; a directory that cannot be read
    is skipped.

    It lists each sidecar directory's :data:`TEMP_DIR` only: the cost is the number of
    temp files, never the number of sidecars. A sidecar directory without ``TEMP_DIR`` was
    last written by an earlier localllm, which left its temps beside the sidecars: that
    directory is listed once, and ``TEMP_DIR`` made afterwards to say it was — unless a
    temp there is too young to judge yet (then it is listed again at the next open).
    """
    import time

    now = time.time() if now is None else now
    removed: list[Path] = []
    for sub in (PROMPTS_DIR, TRANSCRIPTS_DIR):
        directory = Path(trace_dir) / sub
        temps = directory / TEMP_DIR
        if directory.is_symlink() or temps.is_symlink():  # never written through, never swept through
            continue
        try:
            _sweep(temps, now, removed)
            continue
        except FileNotFoundError:
            pass
        except OSError:
            continue
        try:
            young = _sweep(directory, now, removed)  # once: what an earlier localllm left
        except OSError:
            continue
        if not young:
            with contextlib.suppress(OSError):
                temps.mkdir()
    return removed


def _sweep(directory: Path, now: float, removed: list[Path]) -> int:
    """Remove the stale temps in ``directory`` (into ``removed``); how many were too young.
    ``OSError`` when ``directory`` cannot be listed."""
    young = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if not _TEMP.fullmatch(entry.name):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                if now - entry.stat(follow_symlinks=False).st_mtime <= TEMP_GRACE_SECONDS:
                    young += 1
                    continue
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                continue
    return young


def is_temp_ref(rel: str) -> bool:
    """Whether the sidecar reference ``rel`` names a temp file (in :data:`TEMP_DIR`, or a
    temp name an earlier localllm wrote beside the sidecars): never a sidecar."""
    parts = rel.split("/")
    return TEMP_DIR in parts[:-1] or bool(_TEMP.fullmatch(parts[-1]))


def _within(trace_dir: str | os.PathLike[str], rel: str) -> Path:
    """``trace_dir / rel``, refused when it resolves outside ``trace_dir`` (``agent-prompts``
    a symlink to elsewhere): a sidecar written there is one the trace's readers refuse."""
    path = Path(trace_dir) / rel
    if _fs.inside(Path(trace_dir), rel) is None:
        raise TraceError(
            f"cannot write sidecar {path}: it resolves outside the trace directory {trace_dir}",
            hint=f"make {path.parent} a real directory (a symlink out of the trace directory is never written through)",
        )
    return path


class SidecarTaken(TraceError):
    """A sidecar's name exists (another writer got there first); nothing was replaced."""


def atomic_write(path: Path, data: bytes, *, sync_dir: bool = True, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` durably (see :mod:`localllm._fs`), through a temp file in
    its directory's :data:`TEMP_DIR`; a ``TraceError`` on failure; ``exclusive``: create it,
    :class:`SidecarTaken` when the name exists.

    ``sync_dir=False`` skips the directory fsync when the caller's next write to the same
    directory does it (one directory fsync makes every earlier link there durable).
    """
    try:
        if exclusive:
            _fs.create_durably(path, data, sync_dir=sync_dir, tmp_dir=path.parent / TEMP_DIR)
        else:
            _fs.atomic_write(path, data, sync_dir=sync_dir, tmp_dir=path.parent / TEMP_DIR)
    except FileExistsError as exc:
        raise SidecarTaken(f"sidecar {path} exists: not replaced", hint="use a fresh directory for the trace") from exc
    except OSError as exc:
        raise TraceError(
            f"cannot write sidecar {path}: {exc.strerror or exc}",
            hint="check that the trace directory is writable and the disk has space",
        ) from exc


def _stem(call_id: str, suffix: str) -> str:
    # call_id becomes a file name: refuse anything that could leave the sidecar directory.
    if not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
        raise rules.reject("call_id", f"{call_id!r} is not a safe file name (use letters, digits, '.', '_', '-')")
    if not isinstance(suffix, str) or not _SUFFIX.fullmatch(suffix):
        raise rules.reject("suffix", f"{suffix!r} is not a safe file name suffix (use letters, digits, '.', '_', '-')")
    return call_id + suffix


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise rules.reject(what, "contains a lone surrogate and is not valid UTF-8") from None
