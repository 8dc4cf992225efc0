"""The checkpoint store against real Redis, and its in-memory twin held to the same
behaviour."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.errors import StateUnavailable
from gateway.sessions.checkpoints import Checkpoint
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import CheckpointStore, MemoryCheckpoints, RedisCheckpoints


def turn(text: str) -> Checkpoint:
    return Checkpoint(
        created_at=1.0,
        request_id=f"req-{text}",
        model="m",
        mode="full",
        new_messages=[{"role": "user", "content": text}],
        rewrite=False,
        reply={"role": "assistant", "content": text.upper()},
        engine={"model": "served"},
    )


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, redis: aioredis.Redis) -> CheckpointStore:
    if request.param == "memory":
        return MemoryCheckpoints()
    return RedisCheckpoints(redis, ttl_s=600)


def fresh() -> SessionRef:
    return SessionRef("default", f"test-{uuid.uuid4().hex}")


async def test_turns_are_numbered_and_read_back_in_order(store: CheckpointStore) -> None:
    session = fresh()
    assert await store.load(session) == []
    assert await store.append(session, turn("a"), {"t1": b"[1]"}) == 1
    assert await store.append(session, turn("b"), {"t1": b"[changed]"}) == 2
    assert await store.load(session) == [turn("a"), turn("b")]
    assert await store.blobs(session) == {"t1": b"[1]"}  # a digest's blob is written once


async def test_fork_copies_the_first_turns_and_delete_removes_all(store: CheckpointStore) -> None:
    source, target = fresh(), fresh()
    for text in ("a", "b", "c"):
        await store.append(source, turn(text), {"t": b"[]"})
    await store.fork(source, 2, target)
    assert await store.load(target) == [turn("a"), turn("b")]
    assert await store.blobs(target) == {"t": b"[]"}
    assert await store.append(target, turn("x"), {}) == 3
    assert len(await store.load(source)) == 3  # the source is untouched
    assert await store.delete(source) is True
    assert await store.load(source) == []
    assert await store.delete(source) is False


async def test_a_fork_onto_an_existing_session_writes_nothing_and_says_so(
    store: CheckpointStore,
) -> None:
    source, existing, new = fresh(), fresh(), fresh()
    for text in ("a", "b", "c"):
        await store.append(source, turn(text), {"t": b"[]"})
        await store.append(existing, turn(f"mine-{text}"), {"mine": b"[1]"})
    assert await store.fork(source, 1, existing) is False
    assert await store.load(existing) == [turn("mine-a"), turn("mine-b"), turn("mine-c")]
    assert await store.blobs(existing) == {"mine": b"[1]"}
    assert await store.fork(source, 1, new) is True
    assert await store.load(new) == [turn("a")]


async def test_concurrent_forks_onto_one_new_id_leave_exactly_one_whole(
    store: CheckpointStore,
) -> None:
    sources, target = [fresh() for _ in range(8)], fresh()
    for i, source in enumerate(sources):
        for n in range(3):
            await store.append(source, turn(f"{i}-{n}"), {f"t{i}": b"[]"})
    done = await asyncio.gather(*(store.fork(source, 3, target) for source in sources))
    assert sum(done) == 1
    winner = done.index(True)
    assert await store.load(target) == [turn(f"{winner}-{n}") for n in range(3)]
    assert await store.blobs(target) == {f"t{winner}": b"[]"}


async def test_redis_keys_expire_with_the_policy_ttl(redis: aioredis.Redis) -> None:
    session = fresh()
    await RedisCheckpoints(redis, ttl_s=600).append(session, turn("a"), {"t": b"[]"})
    for part in ("turns", "blobs"):
        assert 590 < await redis.ttl(session.key(part)) <= 600


async def test_unreachable_redis_is_a_clear_503() -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(StateUnavailable) as failure:
            await RedisCheckpoints(dead, ttl_s=60).load(fresh())
        assert failure.value.status == 503
    finally:
        await dead.aclose()
