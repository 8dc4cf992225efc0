"""A streamed answer runs until it ends or its client goes away, whichever is first, and
nothing it started outlives the call (gateway/api/inference.py `until_disconnect`)."""

from __future__ import annotations

import asyncio
import contextlib
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


def test_a_client_leaving_as_the_stream_ends_does_not_cancel_the_caller_afterwards() -> None:
    async def scenario() -> None:
        client = Client()
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def both_at_once() -> None:  # the listener wakes first, the stream right after
            client.gone.set()
            answered.set_result(None)

        async def streaming() -> None:
            asyncio.get_running_loop().call_soon(both_at_once)
            await answered

        await until_disconnect(streaming(), client.receive)
        await asyncio.sleep(0)  # where a late cancellation would land
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    asyncio.run(scenario())


def test_a_stream_that_catches_the_cancellation_leaves_the_caller_uncancelled() -> None:
    async def scenario() -> None:
        client = Client()

        async def streaming() -> None:
            client.gone.set()
            with contextlib.suppress(asyncio.CancelledError):  # ends, as a generator may
                await asyncio.sleep(3600)

        await asyncio.wait_for(until_disconnect(streaming(), client.receive), timeout=5)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)
        assert not tasks_left()

    asyncio.run(scenario())
