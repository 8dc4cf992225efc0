"""`gateway serve` bounds the sockets clients open (gateway/edge/connections.py), proven on the
real process: slowloris clients (a header byte a second) and connections that never send
a byte are closed at `server.header_timeout_s` while other clients are served, and past
`server.max_connections` the connections idle longest are closed for new ones.
tests/unit/edge/test_connections.py proves each bound on the protocol alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.integration.conftest import Gateway, running_gateway
from tests.policies import with_redis

HEADER_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 40
SLACK_S = 2.0  # a busy 2-core machine: timers fire late, never early


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    where = tmp_path_factory.mktemp("serve-connections")
    policy = where / "policy.yaml"
    policy.write_text(with_redis(f"""\
version: 1
server: {{reload_interval_s: 0, header_timeout_s: {HEADER_TIMEOUT_S}, keep_alive_s: 1,
          max_connections: {MAX_CONNECTIONS}}}
pools:
  chat: {{served_model: served-tiny, replicas: [{{url: "http://127.0.0.1:9"}}]}}
models:
  tiny: {{pool: chat}}
""", redis_url))  # fmt: skip
    with running_gateway(policy, Path(where / "gateway.log")) as running:
        yield running


class Socket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.opened = time.monotonic()
        self.received = b""
        self.closed_after: float | None = None  # seconds from connecting to the server's close

    @classmethod
    async def open(cls, port: int) -> Socket:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def watch(self) -> None:
        """Reads until the server closes the connection."""
        with contextlib.suppress(ConnectionResetError):
            self.received = await self.reader.read()
        self.closed_after = time.monotonic() - self.opened

    def close(self) -> None:
        self.writer.close()


async def get_healthz(port: int) -> int:
    """A well-behaved client's request on a connection of its own: the status."""
    client = await Socket.open(port)
    try:
        client.writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(client.reader.read(), 10)
        return int(answer.split(b" ", 2)[1])
    finally:
        client.close()


def port_of(gateway: Gateway) -> int:
    return int(gateway.base_url.rsplit(":", 1)[1])


def test_slowloris_and_silent_connections_are_closed_while_others_are_served(
    gateway: Gateway,
) -> None:
    port = port_of(gateway)

    async def scenario() -> None:
        slow = [await Socket.open(port) for _ in range(3)]
        silent = [await Socket.open(port) for _ in range(30)]
        watching = [asyncio.create_task(s.watch()) for s in slow + silent]

        async def drip(client: Socket) -> None:
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 100
            for byte in head:  # a header byte a second, never the end of the headers
                if client.closed_after is not None:
                    return
                client.writer.write(bytes([byte]))
                await asyncio.sleep(1)

        dripping = [asyncio.create_task(drip(s)) for s in slow]
        statuses = []
        try:
            while not all(task.done() for task in watching):
                statuses.append(await get_healthz(port))
                await asyncio.sleep(0.2)
                assert time.monotonic() - silent[0].opened < HEADER_TIMEOUT_S + 3 * SLACK_S
        finally:
            for task in dripping:
                task.cancel()
            for client in slow + silent:
                client.close()
        assert len(statuses) >= 5 and set(statuses) == {200}  # served all along
        for client in slow + silent:
            assert client.closed_after is not None
            assert HEADER_TIMEOUT_S - 0.1 <= client.closed_after < HEADER_TIMEOUT_S + SLACK_S
        for client in silent:
            assert client.received == b""  # no request began: nothing to answer
        for client in slow:
            head, _, body = client.received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), client.received
            assert orjson.loads(body)["error"]["code"] == "request_timeout"

    asyncio.run(scenario())


def test_past_max_connections_the_ones_idle_longest_are_closed_and_requests_served(
    gateway: Gateway,
) -> None:
    port = port_of(gateway)

    async def scenario() -> None:
        opened = [await Socket.open(port) for _ in range(MAX_CONNECTIONS + 10)]
        watching = [asyncio.create_task(s.watch()) for s in opened]
        try:
            await asyncio.wait(watching[:10], timeout=HEADER_TIMEOUT_S / 2)
            assert all(task.done() for task in watching[:10])  # the oldest ten: at once
            assert not any(task.done() for task in watching[10:])
            assert await get_healthz(port) == 200  # a newcomer is served...
            await asyncio.wait(watching[10:11], timeout=HEADER_TIMEOUT_S / 2)
            assert watching[10].done()  # ...in place of the next oldest
            assert not any(task.done() for task in watching[11:])
        finally:
            for client in opened:
                client.close()
            await asyncio.wait(watching, timeout=HEADER_TIMEOUT_S + SLACK_S)

    asyncio.run(scenario())
