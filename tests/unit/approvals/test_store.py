"""Approvals in real Redis: kept per tenant, found through their session, decided and
closed exactly once however many try at the same time."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from gateway.approvals.records import Closing, Decision
from gateway.approvals.store import RedisApprovals
from gateway.sessions.ids import SessionRef
from gateway.state.keys import stored_bytes_key
from gateway.state.stored_bytes import StoredBytes
from tests.unit.approvals.conftest import pending_approval

approval = pending_approval  # the one these tests hold


@pytest.fixture
def store(redis: aioredis.Redis) -> RedisApprovals:
    return RedisApprovals(redis, keep_s=120)


async def test_an_approval_round_trips_and_is_found_by_its_session(
    redis: aioredis.Redis, store: RedisApprovals, tenant: str
) -> None:
    held = approval(tenant)
    await store.add(held)
    assert await store.get(tenant, held.id) == held
    assert await store.get("another", held.id) is None
    assert await store.open_for(SessionRef(tenant, "s1")) == held.id
    assert await store.open_for(SessionRef("another", "s1")) is None
    ttl = await redis.ttl(f"agw:approval:{{{tenant}/{held.id}}}")
    assert 170 <= ttl <= 180  # ttl_s + keep_s


async def test_a_decision_and_a_closing_are_written_once(
    store: RedisApprovals, tenant: str
) -> None:
    held = approval(tenant)
    await store.add(held)
    decisions = [Decision("approved", 1.0, f"k{i}") for i in range(5)]
    won = await asyncio.gather(*(store.decide(held, d) for d in decisions))
    assert sorted(won) == [False] * 4 + [True]
    winner = decisions[won.index(True)]
    closings = [Closing("released", 2.0, f"r{i}") for i in range(5)]
    closed = await asyncio.gather(*(store.close(held, c) for c in closings))
    assert closed.count(True) == 1
    stored = await store.get(tenant, held.id)
    assert stored is not None and stored.decision == winner
    assert stored.status(time.time()) == "released"
    assert await store.open_for(SessionRef(tenant, "s1")) is None  # told: no longer open


async def test_closing_an_older_approval_keeps_a_newer_ones_pointer(
    store: RedisApprovals, tenant: str
) -> None:
    older, newer = approval(tenant), approval(tenant)
    await store.add(older)
    await store.add(newer)
    await store.close(older, Closing("denial_returned", 1.0, "r"))
    assert await store.open_for(SessionRef(tenant, "s1")) == newer.id


async def test_recent_lists_newest_first(store: RedisApprovals, tenant: str) -> None:
    now = time.time()
    made = [approval(tenant, session=None, at=now + i) for i in range(3)]
    for one in made:
        await store.add(one)
    assert [a.id for a in await store.recent(tenant)] == [a.id for a in reversed(made)]
    assert await store.recent("nobody-" + tenant) == []


async def test_a_held_turn_counts_against_the_tenants_stored_bytes_while_kept(
    redis: aioredis.Redis, tenant: str
) -> None:
    stored = StoredBytes(redis, ttl_s=600, cap_of=lambda _: 10**6)
    held = approval(tenant)
    try:
        await RedisApprovals(redis, keep_s=120, stored=stored).add(held)
        sizes = await redis.hgetall(stored_bytes_key(tenant, "bytes"))
        kept = await redis.hget(f"agw:approval:{{{tenant}/{held.id}}}", "held")
        assert int(sizes[f"p:{held.id}".encode()]) == len(kept or b"") > 0
        expires = await redis.zscore(stored_bytes_key(tenant, "expiry"), f"p:{held.id}")
        assert expires is not None and abs(expires - (time.time() + 180)) < 15  # ttl + keep
    finally:
        await redis.delete(stored_bytes_key(tenant, "expiry"), stored_bytes_key(tenant, "bytes"))
