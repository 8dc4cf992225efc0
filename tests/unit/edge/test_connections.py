"""The gateway's own sockets are bounded (gateway/edge/connections.py): the protocol on a real
loopback listener, on asyncio's loop and on uvloop's (the one `gateway serve` runs), with
timeouts of a fraction of a second. tests/unit/edge/test_serve_connections.py proves the same
against a real `gateway serve` process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.edge.connections import ConnectionBounds, protocol_for, raise_descriptor_limit
from gateway.policy import parse_policy
from gateway.policy.reloadable import needs_restart
from gateway.policy.schema import ServerSpec

HEADER_TIMEOUT_S = 0.4
KEEP_ALIVE_S = 0.8  # longer than the header deadline: each is seen to be its own
GET = b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"
HOLD = b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n"


@dataclass
class Listener:
    port: int
    bounds: ConnectionBounds
    release: asyncio.Event  # requests to /hold wait for it
    held: int = 0
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.clients.append(writer)
        return Client(reader, writer, time.monotonic())


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    opened: float

    async def closed_after(self, limit_s: float = 5.0) -> tuple[bytes, float]:
        """Everything the server sent until it closed, and how long after connecting."""
        try:
            data = await asyncio.wait_for(self.reader.read(), limit_s)
        except ConnectionResetError:
            data = b""
        return data, time.monotonic() - self.opened

    async def still_open(self, wait_s: float = 0.05) -> bool:
        try:
            await asyncio.wait_for(self.reader.read(1), wait_s)
        except TimeoutError:
            return True
        return False

    async def response(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head + await self.reader.readexactly(length)


Scenario = Callable[[Listener], Awaitable[None]]


async def _listening(scenario: Scenario, settings: dict[str, Any]) -> None:
    release = asyncio.Event()
    listener: Listener

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/hold":
            listener.held += 1
            await release.wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    spec = ServerSpec(header_timeout_s=HEADER_TIMEOUT_S, keep_alive_s=KEEP_ALIVE_S, **settings)
    protocol = protocol_for(spec)
    config = Config(app=app, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: protocol(config=config, server_state=state, app_state={}, _loop=loop),
        "127.0.0.1",
        0,
    )
    listener = Listener(server.sockets[0].getsockname()[1], protocol.bounds, release)
    try:
        await asyncio.wait_for(scenario(listener), 30)
    finally:
        release.set()
        for writer in listener.clients:
            writer.close()
        server.close()
        for connection in list(state.connections):
            connection.shutdown()
        await server.wait_closed()
        await asyncio.sleep(0.05)  # connection_lost runs for the ones just closed
    # The books balance: nothing counted, listed idle or timed once every socket closed.
    assert listener.bounds.open == 0
    assert not listener.bounds.idle


def on_both_loops(**settings: Any) -> Callable[[Scenario], Callable[[str], None]]:
    def wrap(scenario: Scenario) -> Callable[[str], None]:
        @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
        def test(loop: str) -> None:
            factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(_listening(scenario, settings))

        return test

    return wrap


def _error(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head
    assert b"connection: close" in head
    return int(head.split(b" ")[1]), orjson.loads(body)["error"]


@on_both_loops()
async def test_a_connection_that_never_sends_a_byte_is_closed_at_the_header_timeout(
    listener: Listener,
) -> None:
    silent = await listener.connect()
    data, after = await silent.closed_after()
    assert data == b""  # no request began: nothing to answer
    assert HEADER_TIMEOUT_S - 0.05 <= after < HEADER_TIMEOUT_S + 1.0


@on_both_loops()
async def test_headers_sent_a_byte_at_a_time_get_408_at_the_header_timeout(
    listener: Listener,
) -> None:
    slow = await listener.connect()

    async def drip() -> None:
        for byte in b"GET /ok HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa":
            slow.writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    dripping = asyncio.create_task(drip())
    data, after = await slow.closed_after()
    dripping.cancel()
    status, error = _error(data)
    assert status == 408
    assert error["type"] == "invalid_request_error" and error["code"] == "request_timeout"
    assert HEADER_TIMEOUT_S - 0.05 <= after < HEADER_TIMEOUT_S + 1.0


@on_both_loops()
async def test_a_kept_alive_connection_is_served_then_closed_after_keep_alive_s(
    listener: Listener,
) -> None:
    client = await listener.connect()
    await asyncio.sleep(HEADER_TIMEOUT_S / 2)  # half the header deadline before the request
    for _ in range(3):
        client.writer.write(GET)
        assert (await client.response()).endswith(b"\r\n\r\nok")
    answered = time.monotonic()
    assert await client.still_open(HEADER_TIMEOUT_S)  # the header deadline ended with the head
    data, _ = await client.closed_after()
    assert data == b""
    assert KEEP_ALIVE_S - 0.05 <= time.monotonic() - answered < KEEP_ALIVE_S + 1.0


@on_both_loops()
async def test_a_later_request_on_a_connection_has_its_own_header_deadline(
    listener: Listener,
) -> None:
    client = await listener.connect()
    client.writer.write(GET)
    await client.response()
    client.writer.write(b"GET /ok HTTP/1.1\r\nHo")  # and no more
    started = time.monotonic()
    data, _ = await client.closed_after()
    assert _error(data)[0] == 408
    assert HEADER_TIMEOUT_S - 0.05 <= time.monotonic() - started < HEADER_TIMEOUT_S + 1.0


@on_both_loops()
async def test_a_slow_pipelined_head_does_not_cut_the_answer_in_flight(
    listener: Listener,
) -> None:
    client = await listener.connect()
    client.writer.write(HOLD + b"GET /ok HTTP/1.1\r\nHo")  # the second head never ends
    await asyncio.sleep(HEADER_TIMEOUT_S + 0.2)
    assert await client.still_open()
    listener.release.set()
    data, _ = await client.closed_after()
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"ok")  # then closed


@on_both_loops(max_connections=3)
async def test_past_max_connections_the_connection_idle_longest_is_closed(
    listener: Listener,
) -> None:
    first, second, third = [await listener.connect() for _ in range(3)]
    third.writer.write(GET)
    await third.response()  # idle again, but more recently than the other two
    fourth = await listener.connect()
    data, after = await first.closed_after()
    assert data == b""
    assert after < HEADER_TIMEOUT_S  # closed for the newcomer, not by the deadline
    assert await second.still_open() and await third.still_open()
    fourth.writer.write(GET)
    assert (await fourth.response()).endswith(b"ok")
    fifth = await listener.connect()  # the next newcomer closes the next oldest
    assert (await second.closed_after())[0] == b""
    assert await third.still_open() and await fifth.still_open()
    assert listener.bounds.open == 3


@on_both_loops(max_connections=2)
async def test_past_max_connections_with_none_idle_the_new_one_is_closed(
    listener: Listener,
) -> None:
    busy = [await listener.connect() for _ in range(2)]
    for client in busy:
        client.writer.write(HOLD)
    async with asyncio.timeout(5):  # both requests reach the app
        while listener.held < 2:  # noqa: ASYNC110 - a counter the app bumps; polled briefly
            await asyncio.sleep(0.01)
    refused = await listener.connect()
    data, after = await refused.closed_after()
    assert data == b"" and after < HEADER_TIMEOUT_S
    listener.release.set()
    for client in busy:  # the requests in flight were never cut
        assert (await client.response()).endswith(b"ok")


@on_both_loops()
async def test_a_request_that_is_not_http_gets_400_in_openai_shape(listener: Listener) -> None:
    client = await listener.connect()
    client.writer.write(b"GET /ok HTTP/1.1\r\nHost t\r\n\r\n")
    data, _ = await client.closed_after()
    status, error = _error(data)
    assert status == 400
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("the request is not valid HTTP/1.1")


def test_the_bounds_are_restart_only() -> None:
    pools = (
        "pools: {p: {served_model: m, replicas: [{url: 'http://e:1'}]}}\nmodels: {m: {pool: p}}\n"
    )
    running = parse_policy("version: 1\n" + pools)
    changed = parse_policy(
        "version: 1\nserver: {header_timeout_s: 3, keep_alive_s: 75, max_connections: 9}\n" + pools
    )
    assert needs_restart(running, changed) == [
        "server.header_timeout_s",
        "server.keep_alive_s",
        "server.max_connections",
    ]


@pytest.mark.parametrize(
    ("limits", "raised_to", "warned"),
    [
        ((1024, 1_048_576), 2 * 8192 + 1024, False),  # a container's usual soft limit: lifted
        ((1024, 4096), 4096, True),  # as far as the hard limit goes, and said
        ((65_536, 1_048_576), None, False),  # enough already: untouched
    ],
)
def test_the_open_files_limit_is_lifted_to_what_max_connections_needs(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    limits: tuple[int, int],
    raised_to: int | None,
    warned: bool,
) -> None:
    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr("resource.getrlimit", lambda _: limits)
    monkeypatch.setattr("resource.setrlimit", lambda _, pair: set_to.append(pair))
    raise_descriptor_limit(ServerSpec())
    assert set_to == ([] if raised_to is None else [(raised_to, limits[1])])
    assert ("lower max_connections or raise the limit" in caplog.text) is warned
