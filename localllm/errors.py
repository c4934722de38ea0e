"""The one exception hierarchy of localllm.

Every error localllm raises on purpose is a ``LocalLLMError``; the CLI maps each to a
one-line message, a hint and an exit code. Leaves also subclass the matching builtin so
callers may catch either.

    LocalLLMError
    ├── ConfigError (ValueError)              load-time problems, all collected
    ├── CallError (ValueError)                a call asked for something it cannot (verb, alias, gate, arg)
    ├── AgentError                            call-time failure with a contract §7 kind
    ├── SchemaError (ValueError)              a schema file that cannot be loaded
    ├── TraceError
    │   ├── TraceCorrupted (ValueError)       read-time rejection (spec §7 messages)
    │   ├── TraceWriteRejected (ValueError)   write-time rule broken; file untouched
    │   ├── TraceLocked (BlockingIOError)     another writer holds the lock
    │   └── TraceReplaced                     the file was replaced under the writer
    ├── FetchError
    │   ├── PinNotConfigured                  no sha256 for the artifact: never fetch unverified
    │   ├── UnknownModel (LookupError)        a model id with no pin; the known ids are listed
    │   ├── UnsupportedPlatform               no pin for this OS/arch
    │   ├── ChecksumMismatch (ValueError)     expected, actual, path, url
    │   ├── DownloadFailed (ConnectionError)  network/HTTP failure after retries
    │   ├── DownloadCancelled                 the caller cancelled the download; no partial file kept
    │   ├── ArtifactLocked (BlockingIOError)  another process fetches it: not removed (name, path, lock)
    │   ├── OfflineArtifactMissing            LOCALLLM_OFFLINE=1 and not cached
    │   ├── InsufficientSpace (OSError)       not enough free disk for the download
    │   ├── UnsafeArchive (ValueError)        a member would land outside its directory
    │   │   └── ArchiveTooLarge               members add up past the size, ratio or count cap
    │   ├── LibstdcxxTooOld                   the host (and shim) lack the GLIBCXX the server needs
    │   └── BuildError                        source build failed or a tool is missing
    ├── SidecarError
    │   ├── SidecarExited                     the process exited (argv, returncode, stderr_tail)
    │   └── SidecarStartTimeout (TimeoutError)
    ├── PluginError                           an Agent Plugins directory cannot be used as declared
    │   ├── PluginPathEscape (PermissionError)  command/cwd resolves outside its root at spawn
    │   └── PluginSpawnError (OSError)        command or cwd missing, PLUGIN_DATA unwritable
    ├── EmbedError
    │   ├── InputTooLong (ValueError)
    │   ├── DimensionMismatch (ValueError)
    │   ├── EmbedServerError                  the embedding server failed or answered badly
    │   ├── StoreCorrupt
    │   └── StoreUnavailable (OSError)        disk full, locked or I/O error; nothing was lost
    └── ServiceError                          `localllm serve` and attaching to it
        ├── ServiceRunning                    another service owns this cache (pid, port)
        └── ServiceUnavailable (ConnectionError)  no usable service (``service: required``)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_DETAIL_LIMIT = 256


class LocalLLMError(Exception):
    """Base class of every error localllm raises on purpose.

    Built from data (pip's ``DiagnosticPipError``): ``message`` says what happened,
    ``hint`` what to do next; subclasses add their values as attributes. The CLI formats
    them at the edge. A class-level ``hint`` is the default when none is given.
    """

    hint: str = ""

    def __init__(self, message: str = "", *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        if hint:
            self.hint = hint

    def add_alternative(self, fix: str) -> None:
        """Offer another way out, known only to a caller higher up: ``<hint>; or <fix>``."""
        self.hint = f"{self.hint}; or {fix}" if self.hint else fix


@dataclass(frozen=True)
class ConfigProblem:
    """One load-time problem: where it is, what is wrong, and how to fix it."""

    file: str
    key: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}: {self.key}: " if self.key else f"{self.file}: "
        text = where + self.message
        return f"{text} (hint: {self.hint})" if self.hint else text


class ProblemList:
    """Collects ConfigProblems for one file, in the order they are found."""

    def __init__(self, file: object) -> None:
        self.file = str(file)
        self.items: list[ConfigProblem] = []

    def add(self, key: str, message: str, hint: str = "") -> None:
        self.items.append(ConfigProblem(self.file, key, message, hint))


class ConfigError(LocalLLMError, ValueError):
    """The config file has one or more problems; ``problems`` lists every one."""

    hint = "fix the listed keys and run `localllm check CONFIG` again"

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        super().__init__("\n".join(lines) if lines else "invalid config")


class CallError(LocalLLMError, ValueError):
    """A call that cannot be made as asked: an unknown verb, alias or gate, a missing
    template value. ``key`` names what is wrong (``verb``, ``agent``, ``gates.NAME``,
    ``args.NAME``), ``value`` the offending value. Exit code 2 at the CLI, like ConfigError.
    """

    def __init__(self, message: str, *, key: str, value: object = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.key = key
        self.value = value


class ErrorKind(str, enum.Enum):
    """The error kinds of the agent plugin contract §7 (plus ``plugin_unsupported``)."""

    SCHEMA_INVALID = "schema_invalid"
    PLUGIN_CRASH = "plugin_crash"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    SUB_EVENT_NAMESPACE_VIOLATION = "sub_event_namespace_violation"
    SUB_EVENT_CALL_ID_MISMATCH = "sub_event_call_id_mismatch"
    TRANSPORT_ERROR = "transport_error"
    PLUGIN_UNSUPPORTED = "plugin_unsupported"


def stderr_detail(tail: str) -> str:
    """What a process printed, for the end of a message (never a dangling "last stderr lines:")."""
    return f"; last stderr lines:\n{tail}" if tail.strip() else " (it printed nothing on stderr)"


def truncate_detail(text: str, limit: int = _DETAIL_LIMIT) -> str:
    """Cut ``text`` to ``limit`` UTF-8 bytes plus ``...`` (for quoted bodies)."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore") + "..."


#: AgentError's constructor arguments, each kept as the attribute of the same name
_AGENT_ERROR_FIELDS = ("kind", "detail", "hint", "alias", "meta", "episode_id", "match_idx", "original", "call_id")


class AgentError(LocalLLMError):
    """A failed agent call: ``agent: <kind>: <alias>: <detail>``.

    ``kind`` is a contract §7 kind and ``detail`` the transport's words without the alias;
    ``alias`` (the agent that failed) is prefixed here, in one place — the runtime fills it
    in for errors raised without one. Call-key data rides along typed: ``episode_id`` /
    ``match_idx`` for a replayed cassette error, ``meta`` for the agent's own metadata.
    ``original`` is the first leg's error when this one is a fallback's.
    """

    def __init__(
        self,
        kind: ErrorKind | str,
        detail: str,
        *,
        hint: str = "",
        alias: str | None = None,
        meta: dict[str, Any] | None = None,
        episode_id: str | None = None,
        match_idx: int | None = None,
        original: AgentError | None = None,
        call_id: str | None = None,
    ) -> None:
        self.kind = ErrorKind(kind)
        #: the failed call's call_id (set by the runtime), to find its events in the trace
        self.call_id = call_id
        self.detail = detail
        self.alias = alias
        self.meta = meta
        self.episode_id = episode_id
        self.match_idx = match_idx
        self.original = original
        where = f"{alias}: " if alias else ""
        text = f"agent: {self.kind.value}: {where}{detail}"
        if original is not None:
            text += (
                f" (after the fallback from {original.alias or 'the local agent'}, whose answer failed: "
                f"{original.kind.value}: {original.detail})"
            )
        super().__init__(text, hint=hint)

    def replace(self, **changes: object) -> AgentError:
        """A copy with ``changes`` applied (same class, cause and traceback kept)."""
        fields = {name: getattr(self, name) for name in _AGENT_ERROR_FIELDS} | changes
        clone = AgentError.__new__(type(self))
        AgentError.__init__(clone, **fields)
        clone.__cause__ = self.__cause__
        clone.__context__ = self.__context__
        clone.__traceback__ = self.__traceback__
        return clone

    def redacted(self, redact: Callable[[str], str]) -> AgentError:
        """A copy with every secret replaced in detail, hint and the original leg's error."""
        original = self.original.redacted(redact) if self.original is not None else None
        return self.replace(detail=redact(self.detail), hint=redact(self.hint), original=original)


class SchemaError(LocalLLMError, ValueError):
    """A JSON Schema file that cannot be read, parsed or resolved."""

    #: where a file that is not JSON goes wrong (1-based), when that is the problem
    line: int | None = None
    column: int | None = None


class TraceError(LocalLLMError):
    """Base of every trace read or write failure."""


class TraceCorrupted(TraceError, ValueError):
    """The trace file breaks a read-time rule; the message is the spec's."""


class TraceWriteRejected(TraceError, ValueError):
    """An event breaks a write-time rule; nothing was written."""


class TraceLocked(TraceError, BlockingIOError):
    """Another writer holds the trace file's lock (``path``; ``waited`` seconds for it)."""

    def __init__(self, message: str, *, path: str = "", waited: float = 0.0, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.path = path
        self.waited = waited


class TraceReplaced(TraceError):
    """The trace file was replaced (inode changed) under the writer."""


class FetchError(LocalLLMError):
    """Base of artifact acquisition failures."""


class PinNotConfigured(FetchError):
    """The artifact has no sha256 pin; localllm never downloads unverified bytes."""


class UnknownModel(FetchError, LookupError):
    """A model id that has no pin."""


class UnsupportedPlatform(FetchError):
    """No prebuilt pin for this platform."""

    hint = "use endpoint mode, or build with `localllm fetch server --from-source`"


class ChecksumMismatch(FetchError, ValueError):
    """Downloaded bytes do not hash to the pin; the cache was left untouched."""

    def __init__(
        self, *, expected: str, actual: str, path: str, url: str, final_url: str | None = None, hint: str = ""
    ) -> None:
        self.expected = expected
        self.actual = actual
        self.path = path
        self.url = url
        #: where the bytes came from when ``url`` redirected elsewhere (else None)
        self.final_url = final_url
        origin = f"{url} (redirected to {final_url})" if final_url else url
        super().__init__(f"sha256 mismatch for {path} from {origin}: expected {expected}, got {actual}", hint=hint)


class DownloadFailed(FetchError, ConnectionError):
    """The download failed after bounded retries."""


class DownloadCancelled(FetchError):
    """The caller cancelled the download (``cancel`` was set); the partial file was removed."""


class ArtifactLocked(FetchError, BlockingIOError):
    """Another process held the artifact's lock (``lock``) for ``waited`` seconds: it is
    fetching ``name`` into ``path``, which was left as it was (nothing removed)."""

    def __init__(self, message: str, *, name: str, path: str, lock: str, waited: float, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.name = name
        self.path = path
        self.lock = lock
        self.waited = waited


class OfflineArtifactMissing(FetchError):
    """LOCALLLM_OFFLINE=1 and the artifact is not in the cache."""


class InsufficientSpace(FetchError, OSError):
    """Not enough free disk space for the download."""


class UnsafeArchive(FetchError, ValueError):
    """An archive member would land outside the extraction directory."""


class ArchiveTooLarge(UnsafeArchive):
    """Extraction would pass a cap: ``member``, what was counted (``size``) and the ``limit``."""

    def __init__(self, message: str, *, member: str, size: int, limit: int, hint: str = "") -> None:
        self.member = member
        self.size = size
        self.limit = limit
        super().__init__(message, hint=hint)


class LibstdcxxTooOld(FetchError):
    """llama-server needs ``GLIBCXX_3.4.<required>``; the host has ``<system>``, the shim ``<shim>``."""

    def __init__(self, message: str, *, required: int, system: int | None, shim: int | None, hint: str = "") -> None:
        self.required = required
        self.system = system
        self.shim = shim
        super().__init__(message, hint=hint)


class BuildError(FetchError):
    """Building llama-server from source failed, or a build tool is missing."""


class SidecarError(LocalLLMError):
    """Base of llama-server sidecar failures."""


class SidecarExited(SidecarError):
    """The sidecar process exited; carries argv, return code and the stderr tail."""

    def __init__(self, *, argv: Sequence[str], returncode: int | None, stderr_tail: str, hint: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        super().__init__(f"llama-server exited with code {returncode}{stderr_detail(stderr_tail)}", hint=hint)


class SidecarStartTimeout(SidecarError, TimeoutError):
    """The sidecar did not become healthy before its deadline."""


class PluginError(LocalLLMError):
    """Base of Agent Plugins directory failures that surface as exceptions (at spawn)."""


class PluginPathEscape(PluginError, PermissionError):
    """A server's command or cwd resolves outside the plugin root (or data dir) right before spawn.

    Agent Plugins §4.1: that one server is invalid; the plugin and its other servers are not.
    """

    hint = "keep the plugin's executables and working directories inside the plugin directory"

    def __init__(
        self, *, plugin: str, server: str, field: str, path: str, resolved: str, root: str, hint: str = ""
    ) -> None:
        self.plugin = plugin
        self.server = server
        self.field = field
        self.path = path
        self.resolved = resolved
        self.root = root
        super().__init__(
            f"plugin {plugin!r} server {server!r}: {field} {path} resolves to {resolved}, outside {root}", hint=hint
        )


class PluginSpawnError(PluginError, OSError):
    """A stdio server cannot be launched: command or cwd missing, or PLUGIN_DATA not writable."""

    def __init__(self, message: str, *, plugin: str, server: str, field: str, hint: str = "") -> None:
        self.plugin = plugin
        self.server = server
        self.field = field
        super().__init__(f"plugin {plugin!r} server {server!r}: {message}", hint=hint)


class EmbedError(LocalLLMError):
    """Base of embedding and search failures."""


class InputTooLong(EmbedError, ValueError):
    """An input exceeds the embedding model's context and truncation is off."""


class DimensionMismatch(EmbedError, ValueError):
    """Vectors of different dimensions were mixed."""


class EmbedServerError(EmbedError):
    """The embedding server was unreachable, returned an error, or an invalid answer."""


class StoreCorrupt(EmbedError):
    """An embedding store is corrupt or partial; it is rebuilt, never trusted."""


class StoreUnavailable(EmbedError, OSError):
    """The store cannot be read or written right now (disk full, locked, I/O error).

    Nothing already stored was changed; retry once the cause is gone.
    """

    def __init__(self, message: str, *, path: str, reason: str, hint: str = "") -> None:
        self.path = path
        self.reason = reason
        super().__init__(message, hint=hint)


class ServiceError(LocalLLMError):
    """Base of failures of the machine-wide service (``localllm serve``, ps, stop, attach)."""


class ServiceRunning(ServiceError):
    """A service already runs for this cache; ``pid`` and ``port`` name it."""

    def __init__(self, *, cache: str, pid: int | None, port: int | None) -> None:
        self.cache = cache
        self.pid = pid
        self.port = port
        where = f"pid {pid}, port {port}" if pid else "its discovery file is being written"
        super().__init__(
            f"a localllm service is already running for cache {cache} ({where})",
            hint="use it (`localllm ps`), or stop it first with `localllm stop --all`",
        )


class ServiceUnavailable(ServiceError, ConnectionError):
    """No service answers for this cache (or it does not serve the model)."""
