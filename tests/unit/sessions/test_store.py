"""The checkpoint store against real Redis, and its in-memory twin held to the same
behaviour."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.errors import StateUnavailable
from gateway.sessions.checkpoints import Checkpoint, Stored
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import (
    KEEP_SNAPSHOT,
    LOAD_STORED,
    SNAPSHOT_EVERY,
    CheckpointStore,
    MemoryCheckpoints,
    RedisCheckpoints,
)
from gateway.state.keys import stored_bytes_key
from gateway.state.stored_bytes import StoredBytes


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


# --- the snapshot: a long session read as one fold and the turns after it ---------------


def varied(i: int) -> Checkpoint:
    """Turn i of a session that rewrites its history now and then and sets entities."""
    return replace(
        turn(f"t{i}"),
        rewrite=i % 37 == 5,
        entities={f"e{i % 3}": {"v": i}} if i % 4 == 0 else {},
        trim_boundary=i % 7,
        reply=None if i % 11 == 0 else {"role": "assistant", "content": f"r{i}"},
    )


async def test_a_long_session_reads_the_same_from_its_snapshot_as_turn_by_turn(
    store: CheckpointStore,
) -> None:
    session = fresh()
    stored = Stored()
    for i in range(1, SNAPSHOT_EVERY * 2 + 11):
        checkpoint = varied(i)
        assert await store.append(session, checkpoint, {}, prior=stored) == i
        stored = stored.then([checkpoint])
        if i in (
            1,
            SNAPSHOT_EVERY - 1,
            SNAPSHOT_EVERY,
            SNAPSHOT_EVERY + 1,
            2 * SNAPSHOT_EVERY + 10,
        ):
            loaded = await store.load_stored(session)
            assert loaded == Stored().then(await store.load(session)) == stored


async def test_the_snapshot_is_kept_every_so_many_turns_and_read_with_the_turns_after(
    redis: aioredis.Redis,
) -> None:
    store, session = RedisCheckpoints(redis, ttl_s=600), fresh()
    stored = Stored()
    for i in range(1, SNAPSHOT_EVERY + 4):
        await store.append(session, varied(i), {}, prior=stored)
        stored = stored.then([varied(i)])
    snapshot = await redis.get(session.key("snapshot"))
    assert isinstance(snapshot, bytes) and snapshot.startswith(b"%d\n" % SNAPSHOT_EVERY)
    assert 590 < await redis.ttl(session.key("snapshot")) <= 600  # expires with the turns
    script = redis.register_script(LOAD_STORED)
    read = await script(keys=[session.key("turns"), session.key("snapshot")])
    assert read[0] == snapshot and len(read) == 1 + 3  # the snapshot, then 3 turns
    # Another gateway reads the list whole the first time, then from the snapshot.
    other = RedisCheckpoints(redis, ttl_s=600)
    assert await other.load_stored(session) == stored
    assert await other.load_stored(session) == stored
    assert await store.delete(session)
    assert await redis.exists(session.key("snapshot")) == 0


async def test_a_snapshot_is_not_kept_when_another_turn_came_between(
    redis: aioredis.Redis,
) -> None:
    """Two gateways continuing one session at once: the one whose fold missed the other's
    turn keeps no snapshot; a snapshot that counts more turns than the list is ignored."""
    store, session = RedisCheckpoints(redis, ttl_s=600), fresh()
    stored = Stored()
    for i in range(1, SNAPSHOT_EVERY - 1):
        await store.append(session, varied(i), {}, prior=stored)
        stored = stored.then([varied(i)])
    await store.append(session, turn("from another gateway"), {})  # turn 63, unseen here
    # This gateway's fold has 62 turns: it read before the other gateway's turn 63.
    assert await store.append(session, varied(SNAPSHOT_EVERY), {}, prior=stored) == SNAPSHOT_EVERY
    assert await redis.exists(session.key("snapshot")) == 0
    truth = Stored().then(await store.load(session))
    assert await store.load_stored(session) == truth
    # One that says it holds more turns than there are (the session deleted and made
    # again under it) is not used.
    await redis.set(
        session.key("snapshot"), Stored(999, [{"role": "user", "content": "old"}]).snapshot()
    )
    assert await store.load_stored(session) == truth


async def test_the_keep_script_writes_only_over_the_turn_it_was_given(
    redis: aioredis.Redis,
) -> None:
    session = fresh()
    await redis.rpush(session.key("turns"), b"turn one", b"turn two")
    keep = redis.register_script(KEEP_SNAPSHOT)
    keys = [session.key("turns"), session.key("snapshot")]
    assert await keep(keys=keys, args=[2, b"another turn", b"2\n{}", 60]) == 0
    assert await redis.exists(session.key("snapshot")) == 0
    assert await keep(keys=keys, args=[2, b"turn two", b"2\n{}", 60]) == 1
    await redis.delete(*keys)


async def test_what_a_session_holds_is_its_tenants_count_through_snapshots_forks_deletes(
    redis: aioredis.Redis,
) -> None:
    """`limits.stored_bytes` counts what Redis holds for each session: its turns, its tool
    sets once each, its latest snapshot; a fork's copy as the fork's own; nothing once
    deleted (gateway/state/stored_bytes.py)."""
    tenant = f"held-{uuid.uuid4().hex[:8]}"
    stored_bytes = StoredBytes(redis, ttl_s=600, cap_of=lambda _: 10**9)
    store = RedisCheckpoints(redis, ttl_s=600, stored=stored_bytes)
    session, fork = SessionRef(tenant, "long"), SessionRef(tenant, "fork")

    async def holds(ref: SessionRef) -> int:
        turns = sum(map(len, await redis.lrange(ref.key("turns"), 0, -1)))
        blobs = sum(map(len, (await redis.hgetall(ref.key("blobs"))).values()))
        return turns + blobs + await redis.strlen(ref.key("snapshot"))

    async def counted() -> dict[str, int]:
        sizes = await redis.hgetall(stored_bytes_key(tenant, "bytes"))
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in sizes.items()}

    try:
        stored = Stored()
        for i in range(1, 2 * SNAPSHOT_EVERY + 3):  # two snapshots, the second replacing
            blobs = {"tools-a": b"[1]" * 50, f"tools-{i % 3}": b"[2]" * i}
            await store.append(session, varied(i), blobs, prior=stored)
            stored = stored.then([varied(i)])
        assert await redis.strlen(session.key("snapshot")) > 0
        assert await store.fork(session, 10, fork)
        assert await counted() == {
            "s:long": await holds(session),
            "s:fork": await holds(fork),
            "total": await holds(session) + await holds(fork),
        }
        assert await store.delete(session)
        assert await counted() == {"s:fork": await holds(fork), "total": await holds(fork)}
    finally:
        await redis.delete(
            stored_bytes_key(tenant, "expiry"), stored_bytes_key(tenant, "bytes"),
            *(ref.key(part) for ref in (session, fork) for part in ("turns", "blobs", "snapshot")),
        )  # fmt: skip


async def test_a_turn_that_was_not_written_is_not_counted(redis: aioredis.Redis) -> None:
    """The count runs beside the write; when the write fails, what it counted is taken
    back (the session store here is a Redis that does not answer, the count's the real)."""
    tenant = f"held-{uuid.uuid4().hex[:8]}"
    stored_bytes = StoredBytes(redis, ttl_s=600, cap_of=lambda _: 10**9)
    gone = aioredis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    try:
        store = RedisCheckpoints(gone, ttl_s=600, stored=stored_bytes)
        with pytest.raises(StateUnavailable):
            await store.append(SessionRef(tenant, "s"), turn("a"), {"t": b"[1]"})
        sizes = await redis.hgetall(stored_bytes_key(tenant, "bytes"))
        assert {k: int(v) for k, v in sizes.items()} == {b"s:s": 0, b"total": 0}
    finally:
        await gone.aclose()
        await redis.delete(stored_bytes_key(tenant, "expiry"), stored_bytes_key(tenant, "bytes"))
