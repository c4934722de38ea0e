"""The service's upstream HTTP/1.1 client against a scripted asyncio server: framing, the per-server
connection limit, stale-connection retry, and cancellation closing the connection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from localllm.service.upstream import Upstream, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.base_events.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return await reader.readexactly(length)


def test_content_length_chunked_and_keep_alive() -> None:
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                writer.close()
                return
            if body == b"chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def main() -> None:
        server, url = await _serve(handler)
        client = Upstream()
        one = await client.request("POST", url + "/x", b"hello")
        assert (one.status, await one.read()) == (201, b"hello")
        two = await client.request("POST", url + "/x", b"chunked")
        assert [c async for c in two.chunks()] == [b"abc", b"de"]
        assert len(connections) == 1  # kept alive and reused
        await client.aclose()
        await asyncio.sleep(0.1)  # the handler sees the hang-up and closes its side
        server.close()

    asyncio.run(main())


def test_limit_queues_requests_and_a_stale_connection_is_retried() -> None:
    active = [0]
    peak = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await asyncio.sleep(0.05)
        active[0] -= 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # closes after one answer: the pooled connection goes stale

    async def main() -> None:
        server, url = await _serve(handler)
        client = Upstream()

        async def one() -> bytes:
            answer = await client.request("POST", url, b"x", limit=2)
            return await answer.read()

        assert await asyncio.gather(*(one() for _ in range(6))) == [b"ok"] * 6
        assert peak[0] <= 2
        await client.aclose()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_cancelling_a_request_closes_its_connection() -> None:
    saw_eof = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if await reader.read(1) == b"":  # the client hung up while the "generation" ran
            saw_eof.set()
        writer.close()

    async def main() -> None:
        server, url = await _serve(handler)
        client = Upstream()
        task = asyncio.ensure_future(client.request("POST", url, b"x"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(saw_eof.wait(), 2)
        await client.aclose()
        server.close()

    asyncio.run(main())


def test_a_refused_connection_is_an_oserror() -> None:
    async def main() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server, url = await _serve(hang_up)
        server.close()
        await server.wait_closed()
        with pytest.raises(OSError):
            await Upstream().request("GET", url)

    asyncio.run(main())
    assert issubclass(UpstreamError, OSError)
