"""The one httpx error mapper: every exported httpx exception has its own reason."""

from __future__ import annotations

import inspect
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from localllm import _http


class Mapped(Exception):
    def __init__(self, reason: str, exc: BaseException) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exc = exc


def _exported_exceptions() -> list[type[BaseException]]:
    return [
        obj for name in httpx.__all__ if inspect.isclass(obj := getattr(httpx, name)) and issubclass(obj, BaseException)
    ]


def test_httpx_all_exceptions_mapped() -> None:
    classes = _exported_exceptions()
    assert len(classes) >= 28  # httpx 0.28 exports 28; a new one must be added to the table
    table = _http.reasons()
    for cls in classes:
        first = next((entry for entry, _ in table if issubclass(cls, entry)), None)
        assert first is cls, f"httpx.{cls.__name__} falls through to {first!r}: give it its own entry"
    reasons = [reason for _, reason in table]
    assert len(set(reasons)) == len(reasons)  # one reason names one class
    assert {cls for cls, _ in table} == set(classes)  # nothing stale in the table


def test_mapper_raises_the_subsystem_error_chained() -> None:
    original = httpx.TooManyRedirects("Exceeded maximum allowed redirects.")
    with pytest.raises(Mapped) as info, _http.map_httpx_errors(Mapped):
        raise original
    assert info.value.reason == "too many redirects"
    assert info.value.__cause__ is original and info.value.exc is original


def test_non_httpx_exceptions_pass_through() -> None:
    with pytest.raises(KeyError), _http.map_httpx_errors(Mapped):
        raise KeyError("x")
    with pytest.raises(RuntimeError), _http.map_httpx_errors(Mapped):
        raise RuntimeError("not a stream error")


def test_invalid_url_and_stream_errors_are_mapped() -> None:
    with pytest.raises(Mapped) as info, _http.map_httpx_errors(Mapped):
        httpx.get("http://[::1/mcp")
    assert info.value.reason == "invalid URL"
    with pytest.raises(Mapped) as info2, _http.map_httpx_errors(Mapped):
        raise httpx.StreamConsumed()
    assert info2.value.reason == "stream already consumed"


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_connection_refused_is_named(closed_port: int) -> None:
    with pytest.raises(Mapped) as info, _http.map_httpx_errors(Mapped), httpx.Client() as client:
        client.get(f"http://127.0.0.1:{closed_port}/")
    assert info.value.reason == _http.CONNECTION_REFUSED
    assert not _http.is_permanent(info.value.exc)


def test_name_resolution_failure_is_named_and_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(Mapped) as info, _http.map_httpx_errors(Mapped), httpx.Client() as client:
        client.get("http://mirror.invalid/file")
    assert info.value.reason == _http.NAME_NOT_RESOLVED
    assert _http.is_permanent(info.value.exc)


def test_read_timeout_is_named() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    thread.start()
    try:
        with pytest.raises(Mapped) as info, _http.map_httpx_errors(Mapped), httpx.Client() as client:
            client.get(f"http://127.0.0.1:{server.getsockname()[1]}/", timeout=httpx.Timeout(0.2))
        assert info.value.reason == "timed out reading"
    finally:
        thread.join(2)
        for sock in accepted:
            sock.close()
        server.close()


def _instance(cls: type[BaseException], request: httpx.Request) -> BaseException:
    if cls is httpx.StreamError:
        return cls("stream")
    if issubclass(cls, httpx.StreamError):
        return cls()  # type: ignore[call-arg]  # the subclasses take no message
    if cls is httpx.HTTPStatusError:
        return cls("bad", request=request, response=httpx.Response(500, request=request))
    if issubclass(cls, httpx.RequestError):
        return cls("boom", request=request)
    return cls("boom")


@pytest.mark.parametrize("cls", _exported_exceptions(), ids=lambda c: c.__name__)
def test_every_httpx_exception_from_an_embedding_server_is_an_embed_error(cls: type[BaseException]) -> None:
    from localllm.embed.local import LocalEmbedder
    from localllm.embed.registry import lookup
    from localllm.errors import EmbedServerError

    raised: list[BaseException] = []

    def handler(request: httpx.Request) -> httpx.Response:
        exc = _instance(cls, request)
        raised.append(exc)
        raise exc

    info = lookup("all-minilm-l6-v2")
    assert info is not None
    emb = LocalEmbedder("http://127.0.0.1:9", "m", model_info=info, transport=httpx.MockTransport(handler))
    with pytest.raises(EmbedServerError) as err:
        emb.embed(["a"], "query")
    assert err.value.__cause__ is raised[-1]
    assert _http.reason_for(raised[-1]) in str(err.value)
