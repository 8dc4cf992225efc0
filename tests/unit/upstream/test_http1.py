"""The engine client (gateway/upstream/http1.py) against scripted HTTP servers on loopback: real
sockets, so pooling, framing, early ends and aborts are what an engine would see."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import uvloop

from gateway.errors import UpstreamError
from gateway.upstream.client import ConnectFailed
from gateway.upstream.http1 import Http1Upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]


@dataclass
class Server:
    port: int
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


Serve = Callable[[Handler], Awaitable[Server]]


async def _with_servers(scenario: Callable[[Serve], Awaitable[None]]) -> None:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Server:
        state = Server(0)

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            try:
                while (request := await _read_request(reader)) is not None:
                    state.requests.append(request)
                    state.received.set()
                    await handler(reader, writer, request)
                    if writer.is_closing():
                        break
            except ConnectionError:
                pass
            finally:
                state.disconnected.set()
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    try:
        await asyncio.wait_for(scenario(start), 30)
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


def on_both_loops(scenario: Callable[[Serve], Awaitable[None]]) -> Callable[[str], None]:
    """The test on asyncio's loop and on uvloop's (the one the gateway serves on, through
    uvicorn), whose transports deliver data and ends differently."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str) -> None:
        factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_with_servers(scenario))

    return test


def _whole(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def replying(data: bytes, *, then: str = "stay") -> Handler:
    """A server that answers every request with `data`, then stays, closes the
    connection, or waits until the client goes away."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> None:
        if data:
            writer.write(data)
            await writer.drain()
        if then == "close":
            writer.close()
        elif then == "wait":
            await reader.read()

    return handler


_answer_whole = replying(_whole(b'{"ok":true}'))


@on_both_loops
async def test_a_whole_answer_and_the_connection_reused(serve: Serve) -> None:
    server = await serve(_answer_whole)
    client = Http1Upstream()
    try:
        for _ in range(3):
            response = await client.post(
                server.url, b'{"a":1}', {"Content-Type": "application/json"}, connect_timeout_s=1
            )
            assert response.status == 200
            assert response.content_type == "application/json"
            assert await response.read() == b'{"ok":true}'
    finally:
        await client.close()
    assert server.connections == 1  # kept alive and reused
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
    assert b"Content-Length: 7\r\n" in first and first.endswith(b'\r\n\r\n{"a":1}')


@on_both_loops
async def test_a_chunked_stream_arrives_piece_by_piece_and_ends_empty(serve: Serve) -> None:
    step = asyncio.Event()
    paced = [True]  # the first answer waits for the test between chunks; the second not

    async def stream(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for data in (b"data: 1\n\n", b"data: [DONE]\n\n"):
            if paced[0]:
                await step.wait()
                step.clear()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await serve(stream)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert response.content_type == "text/event-stream"
        step.set()
        assert await response.next_chunk() == b"data: 1\n\n"
        step.set()
        assert await response.next_chunk() == b"data: [DONE]\n\n"
        assert await response.next_chunk() == b""
        response.release()
        paced[0] = False
        again = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        chunks = b""
        while chunk := await again.next_chunk():
            chunks += chunk
        again.release()
        assert chunks == b"data: 1\n\ndata: [DONE]\n\n"
    finally:
        await client.close()
    assert server.connections == 1


@on_both_loops
async def test_an_answer_ended_by_closing_the_connection_is_whole(serve: Serve) -> None:
    close_delimited = replying(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 300_000, then="close"
    )

    server = await serve(close_delimited)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert await response.read() == b"x" * 300_000  # past the pause mark, resumed
        second = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert len(await second.read()) == 300_000
    finally:
        await client.close()
    assert server.connections == 2  # "Connection: close" is never reused


@on_both_loops
async def test_error_statuses_and_retry_after_are_read(serve: Serve) -> None:
    busy = replying(_whole(b'{"error":"busy"}', status="429 Too Many", extra="Retry-After: 3\r\n"))

    server = await serve(busy)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert (response.status, response.retry_after) == (429, "3")
        assert await response.read() == b'{"error":"busy"}'
    finally:
        await client.close()


@on_both_loops
async def test_a_refused_connection_is_connect_failed(serve: Serve) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client = Http1Upstream()
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await client.post(f"http://127.0.0.1:{port}/v1/x", b"{}", {}, connect_timeout_s=1)
    with pytest.raises(ConnectFailed, match="unsupported URL"):
        await client.post("ftp://127.0.0.1/x", b"{}", {}, connect_timeout_s=1)
    await client.close()


@on_both_loops
async def test_a_connection_cut_mid_body_or_mid_stream_is_an_upstream_error(serve: Serve) -> None:
    cut = replying(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", then="close")

    server = await serve(cut)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        with pytest.raises(UpstreamError, match="while reading"):
            await response.read()
        streamed = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert await streamed.next_chunk() == b"only part"
        with pytest.raises(UpstreamError, match="mid-stream"):
            await streamed.next_chunk()
        streamed.abort()
    finally:
        await client.close()


@on_both_loops
async def test_no_answer_at_all_or_not_http_is_an_upstream_error(serve: Serve) -> None:
    hang_up = replying(b"", then="close")

    garbage = replying(b"SMTP ready\r\n\r\n")

    client = Http1Upstream()
    try:
        for handler, words in ((hang_up, "closed the connection"), (garbage, "not valid HTTP")):
            server = await serve(handler)
            with pytest.raises(UpstreamError, match=words):
                await client.post(server.url, b"{}", {}, connect_timeout_s=1)
    finally:
        await client.close()


@on_both_loops
async def test_abort_and_cancellation_drop_the_connection(serve: Serve) -> None:
    slow = replying(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n", then="wait"
    )

    server = await serve(slow)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        assert await response.next_chunk() == b"first"
        response.abort()
        await asyncio.wait_for(server.disconnected.wait(), 5)  # the engine sees it go

        silent = await serve(replying(b"", then="wait"))
        task = asyncio.create_task(client.post(silent.url, b"{}", {}, connect_timeout_s=1))
        await silent.received.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(silent.disconnected.wait(), 5)
    finally:
        await client.close()


@on_both_loops
async def test_release_before_the_end_closes_instead_of_pooling(serve: Serve) -> None:
    partial = replying(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")

    server = await serve(partial)
    client = Http1Upstream()
    try:
        response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
        response.release()  # the rest of the body is still on its way: never reuse
        await asyncio.wait_for(server.disconnected.wait(), 5)
        await client.post(server.url, b"{}", {}, connect_timeout_s=1)
    finally:
        await client.close()
    assert server.connections == 2


@on_both_loops
async def test_idle_connections_past_keepalive_are_not_reused(serve: Serve) -> None:
    server = await serve(_answer_whole)
    client = Http1Upstream(keepalive_s=0.05)
    try:
        await (await client.post(server.url, b"{}", {}, connect_timeout_s=1)).read()
        await asyncio.sleep(0.1)
        await (await client.post(server.url, b"{}", {}, connect_timeout_s=1)).read()
    finally:
        await client.close()
    assert server.connections == 2


@on_both_loops
async def test_a_header_with_a_line_break_is_never_sent(serve: Serve) -> None:
    server = await serve(_answer_whole)
    client = Http1Upstream()
    try:
        for value in ("a\r\nX-Evil: 1", "a\nb", "a\rb"):
            with pytest.raises(UpstreamError, match="line break"):
                await client.post(server.url, b"{}", {"X-Request-Id": value}, connect_timeout_s=1)
    finally:
        await client.close()
    assert server.requests == []


@on_both_loops
async def test_a_pooled_connection_the_engine_closed_is_replaced_not_failed(serve: Serve) -> None:
    """An engine closes idle keep-alive connections (vLLM's server after 5 s); one that
    closes as the next request goes out, without a byte of answer, is replaced once."""
    requests = 0

    async def closes_its_second(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> None:
        nonlocal requests
        requests += 1
        if requests == 2:  # the first connection's second request: closed unanswered
            writer.close()
            return
        writer.write(_whole(b'{"ok":true}'))
        await writer.drain()

    server = await serve(closes_its_second)
    client = Http1Upstream()
    try:
        for _ in range(3):
            response = await client.post(server.url, b"{}", {}, connect_timeout_s=1)
            assert await response.read() == b'{"ok":true}'
    finally:
        await client.close()
    assert server.connections == 2
    assert len(server.requests) == 4  # one request went out twice: on the closed one first
