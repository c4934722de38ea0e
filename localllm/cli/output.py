"""What every command shares: exit codes, ``UsageError``, stdout/stderr helpers, ``K=V`` parsing.

Exit codes, one rule for every command:

- ``EXIT_USAGE`` (2): the command was given something it cannot use, and did nothing —
  an unknown command or flag, a missing argument, a flag value out of range; a name that
  is not declared (gate, agent, embedder, pinned model); a path named on the command line
  (or in ``LOCALLLM_CONFIG``) that does not exist, cannot be read, or is the wrong kind (a
  directory where a file is read or written, a file where a directory is); and a *bad
  config*: a config, schema, cases, cassette or prompt file that fails its load-time checks.
- ``EXIT_FAILED`` (1): the command ran and its work failed, or its verdict is no — a call,
  download or server failed; an output could not be written; ``trace verify``, ``grammar
  check``/``compile``, ``plugins check``, ``eval --fail-under`` or ``route`` said no; the
  trace or plugin being examined (the data under inspection, not an instruction) is malformed.
- 130: interrupted.

:func:`input_path` and :func:`output_path` are the checks for paths named on the command line.

Data goes to stdout, messages to stderr. Only the standard library,
:mod:`localllm.errors` and :mod:`localllm.redact` are imported here, so the command table
stays cheap.

The one output boundary: :func:`masked_output` wraps stdout and stderr for a command's
run, and every secret the command learns (:func:`protect`: a loaded config's resolved
``${VAR}`` values and ``api_key_env`` keys) is masked in everything written through them
— data, messages, warnings, log lines and tracebacks alike — whichever code path wrote it.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from localllm.errors import LocalLLMError
from localllm.redact import Redactor

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

PREFIX = "localllm: "


class UsageError(LocalLLMError):
    """Bad command-line usage (exit 2); ``usage`` is the parser's usage line, when known."""

    def __init__(self, message: str, *, hint: str = "", usage: str = "") -> None:
        super().__init__(message, hint=hint)
        self.usage = usage


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout.

    Strict JSON: NaN and the infinities (a plugin's meta may hold them) are written as
    ``null``, as the trace writes them. Text the stream cannot encode (a lone surrogate
    from a hostile file, or a non-UTF-8 terminal) is written as JSON ``\\uXXXX`` escapes:
    still the same document.
    """
    try:
        sys.stdout.write(_dumps(data, ensure_ascii=False) + "\n")
    except UnicodeEncodeError:  # nothing was written: the encoder fails before the write
        sys.stdout.write(_dumps(data, ensure_ascii=True) + "\n")


def _dumps(data: Any, *, ensure_ascii: bool) -> str:
    try:
        return json.dumps(data, indent=2, ensure_ascii=ensure_ascii, allow_nan=False)
    except ValueError:  # a non-finite float somewhere: only then walk the document
        return json.dumps(_finite(data), indent=2, ensure_ascii=ensure_ascii, allow_nan=False)


def _finite(node: Any) -> Any:
    """``node`` with every NaN or infinity replaced by None."""
    if isinstance(node, float):
        return node if math.isfinite(node) else None
    if isinstance(node, dict):
        return {key: _finite(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_finite(value) for value in node]
    return node


def out(line: str) -> None:
    """One line of data on stdout; what the stream cannot encode is backslash-escaped."""
    _write(sys.stdout, line + "\n")


def err(message: str) -> None:
    """One message on stderr; what the stream cannot encode is backslash-escaped."""
    _write(sys.stderr, message + "\n")


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def warn(message: str) -> None:
    """A one-line ``localllm: warning: …`` on stderr."""
    err(f"{PREFIX}warning: {message}")


def parse_kv(pairs: Sequence[str] | None, *, flag: str = "--arg") -> dict[str, str]:
    """``K=V`` arguments → dict (``--arg``, ``--world``); the last value of a repeated key wins."""
    values: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {pair!r} is not K=V", hint=f"write {flag} NAME=VALUE")
        values[key] = value
    return values


def check_range(
    flag: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    unit: str = "",
    default: object = None,
) -> None:
    """A :class:`UsageError` (exit 2) naming ``flag``, ``value`` and the allowed range when
    ``value`` is outside it (NaN is outside every range)."""
    ok = (low is None or (value > low if low_open else value >= low)) and (
        high is None or (value < high if high_open else value <= high)
    )
    if ok:
        return
    allowed = range_text(low, high, low_open=low_open, high_open=high_open) + (f" {unit}" if unit else "")
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    if low is not None and high is not None:
        fix = f"give {flag} a value in {allowed}"
    else:
        fix = f"give {flag} a value {'of ' if allowed.startswith('at ') else ''}{allowed}"
    raise UsageError(
        f"{flag} {shown} is out of range: it must be {'in ' if low is not None and high is not None else ''}{allowed}",
        hint=fix + (f" (default {default})" if default is not None else ""),
    )


def range_text(low: float | None, high: float | None, *, low_open: bool = False, high_open: bool = False) -> str:
    """``[1, 5)``-style interval text; one-sided: ``at least 1``, ``above 0``, ``at most 9``, ``below 9``."""
    if high is None:
        return f"{'above' if low_open else 'at least'} {low:g}"
    if low is None:
        return f"{'below' if high_open else 'at most'} {high:g}"
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def path_arg(text: str) -> Path:
    """An argparse ``type=`` for paths: a NUL byte (no file name can hold one) is a usage error."""
    import argparse

    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} contains a NUL byte")
    return Path(text)


def input_path(path: Path, what: str, *, directory: bool = False) -> Path:
    """``path`` (named on the command line as ``what``: ``--schema``, ``trace file``) when it
    exists, can be read and is a directory (``directory=True``) or anything but one; else a
    :class:`UsageError` naming ``what`` and the path (exit 2)."""
    import os

    kind = "directory" if directory else "file"
    if not path.exists():
        raise UsageError(f"{what} {path}: no such {kind}", hint=_relative_hint(path))
    if path.is_dir() != directory:
        found = "is a directory" if path.is_dir() else "is not a directory"
        raise UsageError(f"{what} {path}: {found}", hint=f"name a {kind}")
    if not os.access(path, os.R_OK | (os.X_OK if directory else 0)):
        raise UsageError(f"{what} {path}: permission denied", hint=f"pass a {kind} you can read")
    return path


def output_path(path: Path, what: str, *, directory: bool = False) -> Path:
    """``path`` (named on the command line as ``what``: ``-o``, ``--trace``, ``--out``) when it
    can be written as a file (or, ``directory=True``, made a directory): not a directory
    (not a file), and under no file; else a :class:`UsageError` (exit 2). Missing parent
    directories are created by the writer."""
    if path.is_dir() != directory and path.exists():
        found = "a directory" if path.is_dir() else "a file"
        want = "a directory (made if missing)" if directory else "a file (made if missing)"
        raise UsageError(f"{what} {path}: is {found}", hint=f"name {want}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{what} {path}: {parent} is not a directory", hint="name a path under a directory")
            break
    return path


def _relative_hint(path: Path) -> str:
    if path.is_absolute():
        return "check the path"
    return f"check the path (relative to the current directory, {Path.cwd()})"


class OutputUnwritable(OSError):
    """Standard output cannot be written (``> /dev/full``, a full disk); ``str()`` says why."""


class MaskedStream:
    """A text stream whose writes have the known secrets masked (see the module docstring).

    A write or flush the stream refuses (other than a closed pipe, which ``main`` treats as
    the reader having had enough) is :class:`OutputUnwritable`, naming the stream."""

    def __init__(self, stream: TextIO, secrets: list[str], name: str = "stdout") -> None:
        self._name = name
        #: the first write or flush the stream refused
        self.failed: OutputUnwritable | None = None
        self._stream = stream
        self._secrets = secrets  # shared by the stdout and stderr wrappers
        self._redact = Redactor(secrets)
        self._known = len(secrets)

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def add(self, values: Iterable[str]) -> None:
        self._secrets.extend(v for v in values if v not in self._secrets)

    def write(self, text: str) -> int:
        if len(self._secrets) != self._known:
            self._redact, self._known = Redactor(self._secrets), len(self._secrets)
        with self._refused():
            self._stream.write(self._redact(text) if self._redact else text)
        return len(text)

    def flush(self) -> None:
        with self._refused():
            self._stream.flush()

    @contextlib.contextmanager
    def _refused(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as exc:
            # kept too: argparse swallows an OSError while it prints help
            self.failed = OutputUnwritable(exc.errno, f"cannot write to {self._name}: {exc.strerror or exc}")
            raise self.failed from exc

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def masked_output() -> Iterator[None]:
    """Mask every secret :func:`protect` learns in sys.stdout/sys.stderr until the block ends."""
    secrets: list[str] = []
    saved = sys.stdout, sys.stderr
    sys.stdout = MaskedStream(saved[0], secrets, "stdout")
    sys.stderr = MaskedStream(saved[1], secrets, "stderr")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout, sys.stderr = saved


def protect(values: Iterable[str]) -> None:
    """Secrets the output boundary masks from now on (a no-op outside :func:`masked_output`)."""
    stream = sys.stderr
    if isinstance(stream, MaskedStream):
        stream.add(list(values))
