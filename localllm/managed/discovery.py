"""Finding a running service: the discovery file, the token, and :func:`discover`.

A service writes ``<cache>/run/service.json`` (0600, in a 0700 directory) once it listens,
and removes it on a clean shutdown. The file names the pid, the address, a random
``instance`` id, the token file and, for the llama-server build and every model it can
serve, the artifact's sha256. A reader trusts it only when the file and the token file
belong to this user and are private, the pid is alive, and ``GET /health`` with the token
answers 200 with the same ``instance`` (so a stale file, a recycled pid or a port taken by
something else are all "no service"). Standard library only: attaching must cost a few
milliseconds, not an import of the HTTP stack.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm._fs import read_capped
from localllm.errors import ServiceError

__all__ = [
    "Attachment",
    "Discovery",
    "discover",
    "file_sha256",
    "http_url",
    "read_discovery",
    "read_token",
    "remove_discovery",
    "run_dir",
    "unusable",
    "verify",
    "write_discovery",
    "write_private",
]

DISCOVERY_FILE = "service.json"
TOKEN_FILE = "token"
LOCK_FILE = "service.lock"
LOG_FILE = "service.log"
_VERIFY_TIMEOUT = 1.0
#: the whole /health answer, however it trickles
_VERIFY_TOTAL = 5.0
#: bounds on what a discovery or token file may hold (a service writes a few hundred bytes)
_MAX_FILE = 1 << 20
#: above any kernel's pid_max (Linux caps it at 2**22)
_PID_MAX = (1 << 31) - 1
#: an address or host name as a service binds it: no spaces, controls, or over-long labels
_HOST = re.compile(r"[A-Za-z0-9.:\[\]%_-]{0,253}")


def _int_in(value: Any, low: int, high: int) -> int | None:
    """``value`` if it is an integer (not a bool) in ``[low, high]``, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _read_small(path: Path) -> str | None:
    """The text of a private regular file of at most :data:`_MAX_FILE` bytes, else None: never
    waiting on a FIFO (``read_text`` blocked every reader for ever), never reading a huge file."""
    try:
        return read_capped(path, _MAX_FILE, regular=True).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def unusable(path: Path, exc: OSError) -> ServiceError:
    """The error for a path of the run directory (or the directory itself) that is not what
    the service makes there: a file at ``run``, a directory at ``service.lock``…"""
    return ServiceError(f"cannot use {path}: {exc.strerror or exc}", hint=f"remove {path} (the service makes its own)")


def run_dir(cache_root: Path) -> Path:
    """``<cache>/run``: the service's discovery file, token, lock and log."""
    return Path(cache_root) / "run"


def http_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` for a bound address: the wildcard as 127.0.0.1, IPv6 in brackets."""
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{port}"


@dataclass(frozen=True)
class Discovery:
    """The contents of ``service.json``."""

    pid: int
    host: str
    port: int
    instance: str
    token_file: str | None
    build_sha256: str
    #: model id → {"sha256", "role", "build_sha256"} for every model it can serve
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    build_path: str = ""
    started: str = ""

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host,
            "port": self.port,
            "url": self.url,
            "instance": self.instance,
            "token_file": self.token_file,
            "build": {"sha256": self.build_sha256, "path": self.build_path},
            "models": {k: dict(v) for k, v in self.models.items()},
            "started": self.started,
        }

    @classmethod
    def from_json(cls, data: Any) -> Discovery | None:
        """The discovery in ``data``, or None when any field is not what a service writes (a
        garbage pid, port or host was an ``OverflowError``, ``InvalidURL`` or ``UnicodeError``
        out of :func:`verify`, failing every managed call that looked for a service)."""
        if not isinstance(data, dict):
            return None
        build = data.get("build")
        models = data.get("models") or {}
        pid, port, host = _int_in(data.get("pid"), 1, _PID_MAX), _int_in(data.get("port"), 1, 65535), data.get("host")
        token_file, instance = data.get("token_file"), data.get("instance")
        if (
            not isinstance(build, dict)
            or not isinstance(build.get("sha256"), str)
            or not isinstance(models, dict)
            or pid is None
            or port is None
            or not isinstance(host, str)
            or not _HOST.fullmatch(host)
            or not isinstance(instance, str)
            or not (token_file is None or (isinstance(token_file, str) and token_file and "\0" not in token_file))
        ):
            return None
        return cls(
            pid=pid,
            host=host,
            port=port,
            instance=instance,
            token_file=token_file,
            build_sha256=build["sha256"],
            build_path=str(build.get("path", "")),
            models={str(k): dict(v) for k, v in models.items() if isinstance(v, dict)},
            started=str(data.get("started", "")),
        )

    def model_for(self, sha256: str, build_sha256: str, role: str) -> str | None:
        """The id this service serves the artifact ``sha256`` under, with that build and role."""
        for model_id, info in sorted(self.models.items()):
            if (
                info.get("sha256") == sha256
                and info.get("role") == role
                and info.get("build_sha256", self.build_sha256) == build_sha256
            ):
                return model_id
        return None


@dataclass(frozen=True)
class Attachment:
    """A verified running service and the id it serves the wanted model under."""

    url: str
    token: str | None
    model: str
    pid: int
    instance: str

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``…/v1``)."""
        return self.url + "/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __repr__(self) -> str:  # the token never appears in a repr
        return f"Attachment(url={self.url!r}, model={self.model!r}, pid={self.pid})"


def _private(path: Path) -> bool:
    """Owned by this user and unreadable by anyone else (a file others could write is not trusted)."""
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as 0600: temp file beside it, fsync, rename, fsync the directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_discovery(cache_root: Path, discovery: Discovery) -> Path:
    path = run_dir(cache_root) / DISCOVERY_FILE
    write_private(path, json.dumps(discovery.to_json(), indent=2, sort_keys=True) + "\n")
    return path


def read_discovery(cache_root: Path) -> Discovery | None:
    """The discovery file if present, private and well-formed (not yet verified)."""
    path = run_dir(cache_root) / DISCOVERY_FILE
    if not _private(path):
        return None
    text = _read_small(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return Discovery.from_json(data)


def remove_discovery(cache_root: Path, instance: str) -> None:
    """Remove the discovery file if it is still this instance's (never a successor's)."""
    path = run_dir(cache_root) / DISCOVERY_FILE
    current = read_discovery(cache_root)
    if current is not None and current.instance == instance:
        path.unlink(missing_ok=True)


def read_token(path: str | Path | None) -> str | None:
    if not path:
        return None
    file = Path(path)
    if not _private(file):
        return None
    text = _read_small(file)
    token = text.strip() if text is not None else None
    return token or None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: never ours to use
    return True


def _shut(sock: Any) -> None:
    """End a connection's reads now (a blocked ``recv`` returns)."""
    import socket

    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def verify(
    discovery: Discovery, token: str | None, timeout: float = _VERIFY_TIMEOUT, total: float = _VERIFY_TOTAL
) -> bool:
    """True when the service named by ``discovery`` answers /health with its instance id."""
    if not _pid_alive(discovery.pid):
        return False
    import http.client  # only when a service is found (~40 ms with ssl and email, off every start's path)
    import threading

    host = "127.0.0.1" if discovery.host in ("0.0.0.0", "::", "") else discovery.host
    try:
        conn = http.client.HTTPConnection(host, discovery.port, timeout=timeout)
    except (ValueError, http.client.HTTPException):
        return False
    cut: threading.Timer | None = None
    try:
        conn.connect()
        # ``timeout`` bounds each read, not the answer: something else on the port (a stale
        # file, its pid reused) sending a byte every 0.3 s held every attach for hours
        cut = threading.Timer(total, _shut, (conn.sock,))
        cut.daemon = True
        cut.start()
        conn.request("GET", "/health", headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        body = response.read(65536)
    except (OSError, ValueError, http.client.HTTPException):  # ValueError: UnicodeError of a host
        return False
    finally:
        if cut is not None:
            cut.cancel()
        conn.close()
    if response.status != 200:
        return False
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("instance") == discovery.instance


def discover(cache_root: Path, build_sha256: str, model_sha256: str, role: str = "chat") -> Attachment | None:
    """A running, verified service for ``cache_root`` that serves this build and model
    (as a ``chat`` or ``embedding`` server), else None."""
    found = read_discovery(cache_root)
    if found is None:
        return None
    model = found.model_for(model_sha256, build_sha256, role)
    if model is None:
        return None
    token = read_token(found.token_file)
    if found.token_file and token is None:
        return None
    if not verify(found, token):
        return None
    return Attachment(url=found.url, token=token, model=model, pid=found.pid, instance=found.instance)


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoised per process by (real path, size, mtime)."""
    real = os.path.realpath(path)
    info = os.stat(real)
    return _sha256(real, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(real: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(real, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
