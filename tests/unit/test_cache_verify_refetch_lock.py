"""``cache verify --refetch`` removes a corrupt copy only under the lock its fetch holds, and
only if it is still the copy it hashed: a ``localllm fetch model`` of the same model in
another process (real, from a loopback mirror that pauses mid-body) keeps what it delivered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from localllm.managed.inventory import Entry, verify_cache
from localllm.managed.pins import add_user_model, load_pins
from tests.unit.test_cache_rm_model_lock import DATA, FILE, SHA, Fetcher, PausingServer, fetcher

__all__ = ["fetcher"]  # the fixture, used here by name


@pytest.fixture
def gets(fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The mirror's GETs from now on (the paused fetch's own is already under way); this
    process's pins know the model, so ``cache verify`` checks it against the pin."""
    add_user_model("tiny", url=f"https://example.invalid/{FILE}", sha256=SHA)
    handler: type[BaseHTTPRequestHandler] = fetcher.server.httpd.RequestHandlerClass  # type: ignore[assignment]
    seen: list[str] = []
    serve = handler.do_GET  # type: ignore[attr-defined]

    def counting(self: BaseHTTPRequestHandler) -> None:
        seen.append(self.path)
        serve(self)

    monkeypatch.setattr(handler, "do_GET", counting, raising=False)
    yield seen


def _model(entries: list[Entry]) -> Entry:
    [entry] = [e for e in entries if e.kind == "model"]
    return entry


def test_a_copy_the_other_fetch_replaced_after_the_hash_is_kept(fetcher: Fetcher, gets: list[str]) -> None:
    # verify hashes the damaged copy; before it acts, the other process's fetch delivers
    # the good one (and reports its path): that file is not removed and not fetched again
    delivered: list[bool] = []

    def log(_message: str) -> None:
        if not delivered:
            delivered.append(fetcher.finish() == fetcher.dest and fetcher.dest.read_bytes() == DATA)

    server = fetcher.server
    entries = verify_cache(fetcher.layout, load_pins(), refetch=True, mirrors=[server.url], log=log)
    assert delivered == [True]
    assert (_model(entries).status, len(gets)) == ("refetched", 0)
    assert fetcher.dest.read_bytes() == DATA


def test_the_corrupt_copy_is_removed_only_once_the_fetch_lock_is_free(fetcher: Fetcher, gets: list[str]) -> None:
    notices: list[str] = []
    result: list[object] = []

    def run() -> None:
        try:
            result.extend(
                verify_cache(
                    fetcher.layout, load_pins(), refetch=True, mirrors=[fetcher.server.url], log=notices.append
                )
            )
        except BaseException as exc:  # handed to the test thread
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not any(str(fetcher.lock) in n for n in notices) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    # waiting for the lock, with the copy the other process is replacing still in place
    waiting_with_copy = thread.is_alive() and fetcher.dest.exists()
    fetched = fetcher.finish()
    thread.join(timeout=60)
    assert (waiting_with_copy, thread.is_alive()) == (True, False)
    entry = _model([e for e in result if isinstance(e, Entry)])
    assert (entry.status, len(gets), len(result)) == ("refetched", 0, 1)
    assert fetched == fetcher.dest and fetcher.dest.read_bytes() == DATA


def test_a_corrupt_copy_nobody_is_fetching_is_fetched_again(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.managed.cache import cache_layout

    server = PausingServer()
    server.release()
    try:
        add_user_model("tiny", url=f"https://example.invalid/{FILE}", sha256=SHA)
        layout = cache_layout()
        dest = layout.models_dir / "tiny" / SHA[:16] / FILE
        dest.parent.mkdir(parents=True)
        dest.write_bytes(b"GGUF a damaged copy")
        entries = verify_cache(layout, load_pins(), refetch=True, mirrors=[server.url], log=lambda _m: None)
        assert _model(entries).status == "refetched"
        assert dest.read_bytes() == DATA
        # offline, nothing to fetch it from: reported corrupt, still removed (it was never usable)
        dest.write_bytes(b"GGUF damaged again")
        monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
        entries = verify_cache(layout, load_pins(), refetch=True, mirrors=[], log=lambda _m: None)
        entry = _model(entries)
        assert (entry.status, entry.size, dest.exists()) == ("corrupt", 0, False)
    finally:
        server.close()
