"""A pinned model id ``tiny`` served by a throttled loopback mirror (first-use fetch tests).

``slow_model(monkeypatch, bytes_per_tick=1024, tick=0.25)`` adds a ``tiny`` pin (mirror
only, so no request can leave loopback) to the pins every loader sees, points
``LOCALLLM_MIRROR`` at an :class:`ArchiveServer` sending ``bytes_per_tick`` every ``tick``
seconds, and yields the running :class:`SlowModel`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from localllm.managed import pins as pins_mod
from localllm.managed.pins import Artifact, ModelPin, Pins
from tests.unit.fakes import http_server
from tests.unit.fakes.http_server import ArchiveServer

MODEL_ID = "tiny"
FILE = "tiny-q4.gguf"


@dataclasses.dataclass
class SlowModel:
    server: ArchiveServer
    data: bytes

    def gets(self) -> int:
        return len(self.server.gets(FILE))

    @staticmethod
    def partial_files(root: Path) -> list[Path]:
        """Temp files of a download in progress anywhere under ``root``."""
        return [p for p in root.rglob("*") if p.name.endswith(".part") or p.name.startswith(".tmp")]

    def wait_for_partial(self, root: Path, within: float = 20.0) -> Path:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.partial_files(root)
            if found:
                return found[0]
            time.sleep(0.02)
        raise AssertionError(f"no download started under {root} within {within} s")


@contextmanager
def slow_model(
    monkeypatch: pytest.MonkeyPatch, *, size: int = 8192, bytes_per_tick: int = 1024, tick: float = 0.25
) -> Iterator[SlowModel]:
    data = os.urandom(size)
    pin = ModelPin(
        id=MODEL_ID,
        role="chat",
        artifact=Artifact(
            name=f"model {MODEL_ID}",
            file=FILE,
            sha256=hashlib.sha256(data).hexdigest(),
            url=None,
            pin_key=f"models.entries.{MODEL_ID}",
        ),
    )
    real = pins_mod.load_pins

    def load_pins(path: Path | None = None) -> Pins:
        base = real(path)
        return dataclasses.replace(base, models={**base.models, MODEL_ID: pin})

    monkeypatch.setattr(pins_mod, "load_pins", load_pins)
    monkeypatch.setattr("localllm.managed.acquire.load_pins", load_pins)
    monkeypatch.setattr(http_server, "_CHUNK", bytes_per_tick)
    with ArchiveServer({FILE: data}, delay=tick) as srv:
        monkeypatch.setenv("LOCALLLM_MIRROR", srv.base_url)
        yield SlowModel(srv, data)
