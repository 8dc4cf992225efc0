"""A streamed answer runs until it ends or its client goes away, whichever is first, and
nothing it started outlives the call (gateway/api/inference.py `until_disconnect`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.api.inference import until_disconnect


class Client:
    """The ASGI `receive` of a client that leaves when told to."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def tasks_left() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_a_stream_that_ends_returns_and_stops_listening() -> None:
    async def scenario() -> None:
        sent: list[int] = []

        async def streaming() -> None:
            for i in range(3):
                sent.append(i)
                await asyncio.sleep(0)

        await until_disconnect(streaming(), Client().receive)
        assert sent == [0, 1, 2]
        await asyncio.sleep(0)
        assert not tasks_left()

    asyncio.run(scenario())


def test_a_client_that_leaves_cancels_the_stream_and_the_call_returns() -> None:
    async def scenario() -> None:
        client = Client()
        cancelled = asyncio.Event()

        async def streaming() -> None:
            try:
                client.gone.set()  # the client leaves while the engine is silent
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        await asyncio.wait_for(until_disconnect(streaming(), client.receive), timeout=5)
        assert cancelled.is_set()
        assert not tasks_left()

    asyncio.run(scenario())


def test_a_stream_that_fails_raises_its_error() -> None:
    async def scenario() -> None:
        async def streaming() -> None:
            raise RuntimeError("broke")

        with pytest.raises(RuntimeError, match="broke"):
            await until_disconnect(streaming(), Client().receive)
        await asyncio.sleep(0)
        assert not tasks_left()

    asyncio.run(scenario())


def test_a_cancelled_call_cancels_the_stream_too() -> None:
    async def scenario() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def streaming() -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        call = asyncio.create_task(until_disconnect(streaming(), Client().receive))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert cancelled.is_set()
        await asyncio.sleep(0)
        assert not tasks_left()

    asyncio.run(scenario())
