"""The background loop every poller runs on (gateway/periodic.py): a round in progress
finishes; it stops, even when its work swallowed the cancellation, as redis-py's commands
do on Python 3.11."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.periodic import Periodic


async def stops_within(loop: Periodic, seconds: float = 2.0) -> bool:
    # Not `asyncio.timeout` around stop(): a stop() that swallows cancellation would hang.
    stopping = asyncio.ensure_future(loop.stop())
    done, _ = await asyncio.wait({stopping}, timeout=seconds)
    return bool(done)


async def test_a_loop_whose_work_swallowed_the_cancellation_still_stops() -> None:
    rounds = 0
    working = asyncio.Event()

    async def swallowing() -> None:
        nonlocal rounds
        rounds += 1
        working.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return  # what asyncio.wait_for does on 3.11 when its inner task just finished

    loop = Periodic("swallowing", 0, swallowing, stop_grace_s=0.1)
    loop.start()
    await working.wait()
    assert await stops_within(loop)
    assert rounds == 1


async def test_a_loop_of_redis_commands_stops_whenever_it_is_stopped(redis_url: str) -> None:
    # The case seen in CI: a usage flush loop on real Redis kept a gateway's shutdown
    # waiting; cancelled at random points, about half of the commands swallowed it.
    client = aioredis.Redis.from_url(redis_url)
    try:
        for attempt in range(50):

            async def incr() -> None:
                await client.incr("agw:test:periodic")

            loop = Periodic("redis", 0, incr, stop_grace_s=0.1)
            loop.start()
            await asyncio.sleep(0.001 * (attempt % 10))
            assert await stops_within(loop), f"attempt {attempt}: the loop did not stop"
    finally:
        await client.delete("agw:test:periodic")
        await client.aclose()


async def test_stopping_does_not_swallow_the_callers_own_cancellation() -> None:
    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.1)  # takes its time to wind down
            raise

    loop = Periodic("stubborn", 0, stubborn, stop_grace_s=10)
    loop.start()
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(loop.stop())  # waits for the round: up to 10 s
    await asyncio.sleep(0.01)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert loop._task is not None
    loop._task.cancel()
    await asyncio.wait({loop._task})


async def test_a_round_in_progress_finishes_before_the_loop_stops() -> None:
    # A usage flush cancelled mid-way would drop the counts it had taken to write.
    written: list[str] = []
    started = asyncio.Event()

    async def flush() -> None:
        started.set()
        await asyncio.sleep(0.05)
        written.append("counts")

    loop = Periodic("flush", 0, flush)
    loop.start()
    await started.wait()
    assert await stops_within(loop)
    assert written == ["counts"]


async def test_a_sleeping_loop_stops_at_once() -> None:
    loop = Periodic("idle", 3600, _nothing)
    loop.start()
    await asyncio.sleep(0)
    assert await stops_within(loop, 0.5)


async def _nothing() -> None:
    return None
