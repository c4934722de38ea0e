"""Host, Origin and Content-Type checks: what makes the service safe against web pages.

A web page cannot set ``Authorization``, but it can make a browser send a ``text/plain``
POST to ``http://127.0.0.1:8911`` (a "simple" request, no CORS preflight), and with DNS
rebinding it can make ``http://evil.example:8911`` resolve to 127.0.0.1 and read the
answers. So every request, in every mode (token or ``--no-auth``), must pass:

* **Host** (421): its name is the bound loopback name or address (``127.0.0.1``,
  ``localhost``, ``[::1]``; on a wildcard bind also any IP literal, this machine's host
  names and ``--allow-host`` names) and its port, when given, is the bound port. A
  rebinding page's ``Host`` names the attacker's domain, never one of these.
* **Origin** (403): absent (every non-browser client), the service's own origin, or one
  given with ``--allow-origin``. ``Origin: null`` (a sandboxed page, a ``file:`` URL) is
  foreign.
* **Content-Type** (415): a POST's media type is ``application/json``; ``text/plain``,
  form encodings and a missing type are refused, so no "simple" cross-site request gets
  through even where the other checks would not catch it.

Pure functions over header values: the HTTP front calls :meth:`Guard.check` first thing.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Guard", "Refused"]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"})
_WILDCARD = frozenset({"0.0.0.0", "::", ""})


@dataclass(frozen=True)
class Refused:
    """Why a request is refused: the HTTP status, the OpenAI-style error code and a message."""

    status: int
    code: str
    message: str


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` / ``[v6][:port]`` → (lower-case name, port); None when malformed."""
    value = value.strip().lower()
    if not value:
        return None
    port: int | None = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                return None
            port = int(rest[1:])
        return name, port
    if value.count(":") == 1:
        name, _, text = value.partition(":")
        if not text.isdigit():
            return None
        port = int(text)
    elif ":" in value:
        return None  # a bare IPv6 address must be bracketed in a Host header
    else:
        name = value
    return name.rstrip("."), port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Guard:
    """The checks of one bound service (``host``/``port`` as bound)."""

    host: str
    port: int
    allow_origins: frozenset[str] = frozenset()
    allow_hosts: frozenset[str] = frozenset()
    _names: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        names = set(_LOOPBACK_NAMES) | {h.lower().strip("[]") for h in self.allow_hosts}
        bound = self.host.lower().strip("[]")
        if bound in _WILDCARD:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    names.add(name.lower())
        else:
            names.add(bound)
        object.__setattr__(self, "_names", frozenset(names))

    @classmethod
    def build(cls, host: str, port: int, allow_origins: Iterable[str] = (), allow_hosts: Iterable[str] = ()) -> Guard:
        return cls(
            host=host,
            port=port,
            allow_origins=frozenset(o.strip().rstrip("/").lower() for o in allow_origins if o.strip()),
            allow_hosts=frozenset(h.strip().lower() for h in allow_hosts if h.strip()),
        )

    def host_ok(self, value: str | None) -> bool:
        if value is None:
            return False  # HTTP/1.1 requires Host; every real client sends one
        parsed = _split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        if port is not None and port != self.port:
            return False
        if name in self._names:
            return True
        # on a wildcard bind any IP literal is the machine itself: rebinding needs a DNS name
        return self.host.lower().strip("[]") in _WILDCARD and _is_ip(name)

    def origin_ok(self, value: str | None) -> bool:
        if value is None:
            return True
        origin = value.strip().rstrip("/").lower()
        if origin in self.allow_origins or "*" in self.allow_origins:
            return True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme != "http":
            return False
        parsed = _split_host(rest)
        return parsed is not None and parsed[1] == self.port and self.host_ok(rest)

    def check(self, method: str, host: str | None, origin: str | None, content_type: str | None) -> Refused | None:
        """None when the request may proceed, else why not."""
        if not self.host_ok(host):
            return Refused(
                421,
                "misdirected_request",
                f"{f'Host {host!r}' if host else 'a request without a Host header'} is not for this service "
                f"(use 127.0.0.1:{self.port} or localhost:{self.port}; "
                "a DNS name pointing here is refused against DNS rebinding, add it with --allow-host)",
            )
        if not self.origin_ok(origin):
            return Refused(
                403,
                "origin_not_allowed",
                f"Origin {origin!r} may not call this service (allow a web app with --allow-origin ORIGIN)",
            )
        if method == "POST":
            media = (content_type or "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return Refused(
                    415,
                    "unsupported_media_type",
                    f"a POST body must be sent as Content-Type: application/json, got {content_type or 'none'!r}",
                )
        return None
