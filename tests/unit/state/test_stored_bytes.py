"""What each tenant's conversations hold (`limits.stored_bytes`), on the real Redis: counted
thing by thing, refused at the cap, given back when a thing expires or is deleted, free for
tenants without a cap, learnt by each gateway from its own writes, open when Redis is not
answering, and one slot per tenant on a cluster."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.errors import StoredBytesExceeded
from gateway.resilience.response_cache import RedisResponseCache
from gateway.state.keys import answer_key, stored_bytes_key
from gateway.state.redis_client import GatedRedisCluster
from gateway.state.stored_bytes import RECHECK_S, StoredBytes

DAY = 86_400


@pytest.fixture
async def tenant(redis: aioredis.Redis) -> AsyncIterator[str]:
    name = f"stored-{uuid.uuid4().hex[:10]}"
    yield name
    await redis.delete(stored_bytes_key(name, "expiry"), stored_bytes_key(name, "bytes"))


def meter(redis: aioredis.Redis, caps: dict[str, int], ttl_s: int = 7 * DAY) -> StoredBytes:
    return StoredBytes(redis, ttl_s=ttl_s, cap_of=caps.get)


async def held(redis: aioredis.Redis, tenant: str) -> dict[str, int]:
    sizes = await redis.hgetall(stored_bytes_key(tenant, "bytes"))
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in sizes.items()}


async def test_what_is_held_is_counted_and_the_tenant_refused_once_it_reaches_its_cap(
    redis: aioredis.Redis, tenant: str
) -> None:
    stored = meter(redis, {tenant: 1000})
    await stored.charge(tenant, "s", "one", 600)
    await stored.admit(tenant)  # 600 of 1000
    await stored.charge(tenant, "r", "resp_1", 400)
    with pytest.raises(StoredBytesExceeded) as refused:
        await stored.admit(tenant)
    error = refused.value
    assert error.status == 429 and error.code == "stored_bytes_exceeded"
    assert error.error_type == "insufficient_quota" and "1,000" in str(error)
    # when the first thing expires (a week), unless something is deleted first
    assert 7 * DAY - 5 <= int(error.headers["Retry-After"]) <= 7 * DAY
    assert error.headers["x-should-retry"] == "false"
    assert await held(redis, tenant) == {"s:one": 600, "r:resp_1": 400, "total": 1000}


async def test_a_tenant_without_a_cap_costs_nothing(redis: aioredis.Redis, tenant: str) -> None:
    stored = meter(redis, {})
    await stored.charge(tenant, "s", "one", 10**9)
    await stored.forget(tenant, "s", "one")
    await stored.admit(tenant)
    assert not await redis.exists(stored_bytes_key(tenant, "bytes"))


async def test_one_tenant_full_leaves_another_served(redis: aioredis.Redis, tenant: str) -> None:
    other = f"{tenant}-other"
    stored = meter(redis, {tenant: 100, other: 100})
    try:
        await stored.charge(tenant, "s", "one", 100)
        await stored.charge(other, "s", "one", 10)
        await stored.admit(other)
        with pytest.raises(StoredBytesExceeded):
            await stored.admit(tenant)
    finally:
        await redis.delete(stored_bytes_key(other, "expiry"), stored_bytes_key(other, "bytes"))


async def test_a_session_kept_alive_is_counted_whole_however_long_it_lives(
    redis: aioredis.Redis, tenant: str
) -> None:
    """A write pushes the thing's expiry back, as its EXPIRE does to its keys: its bytes
    stay counted for as long as it is held (a count of recent writes would forget them)."""
    stored = meter(redis, {tenant: 10**6}, ttl_s=DAY)
    expiry = stored_bytes_key(tenant, "expiry")
    await stored.charge(tenant, "s", "long", 5000)
    await redis.zadd(expiry, {"s:long": time.time() + 60})  # as if written 23 h 59 m ago
    await stored.charge(tenant, "s", "long", 10)  # one small turn: a day more
    assert (await held(redis, tenant))["s:long"] == 5010
    assert await redis.zscore(expiry, "s:long") > time.time() + DAY - 5  # type: ignore[operator]


async def test_what_expired_is_the_tenants_again(redis: aioredis.Redis, tenant: str) -> None:
    stored = meter(redis, {tenant: 1000})
    await stored.charge(tenant, "s", "old", 900)
    await stored.charge(tenant, "c", "cmp", 100)
    with pytest.raises(StoredBytesExceeded):
        await stored.admit(tenant)
    # The session's keys expired in Redis (its score is past): dropped at the next count.
    await redis.zadd(stored_bytes_key(tenant, "expiry"), {"s:old": time.time() - 1})
    await stored.charge(tenant, "s", "new", 50)
    await stored.admit(tenant)
    assert await held(redis, tenant) == {"c:cmp": 100, "s:new": 50, "total": 150}
    assert await redis.zrange(stored_bytes_key(tenant, "expiry"), 0, -1) == [b"c:cmp", b"s:new"]


async def test_a_delete_gives_the_bytes_back_at_once(redis: aioredis.Redis, tenant: str) -> None:
    stored = meter(redis, {tenant: 1000})
    await stored.charge(tenant, "s", "one", 700)
    await stored.charge(tenant, "s", "two", 300)
    with pytest.raises(StoredBytesExceeded):
        await stored.admit(tenant)
    await stored.forget(tenant, "s", "one")
    await stored.admit(tenant)
    await stored.forget(tenant, "s", "one")  # twice, or never charged: nothing taken off
    assert await held(redis, tenant) == {"s:two": 300, "total": 300}


async def test_a_shrinking_thing_holds_less(redis: aioredis.Redis, tenant: str) -> None:
    stored = meter(redis, {tenant: 1000})
    await stored.charge(tenant, "s", "one", 500)
    await stored.charge(tenant, "s", "one", -200)  # a smaller snapshot replaced a larger
    await stored.charge(tenant, "s", "one", -900)  # never below nothing
    assert await held(redis, tenant) == {"s:one": 0, "total": 0}


async def test_a_full_tenant_is_asked_about_again_only_every_few_seconds(
    redis: aioredis.Redis, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = meter(redis, {tenant: 100})
    await stored.charge(tenant, "s", "one", 100)
    asked: list[int] = []
    count = stored._count

    async def counting(**kwargs: object) -> object:
        asked.append(1)
        return await count(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stored, "_count", counting)
    for _ in range(20):
        with pytest.raises(StoredBytesExceeded):
            await stored.admit(tenant)
    assert asked == []  # refused from what this gateway knows
    # Another gateway deleted the session; RECHECK_S later this one asks once, and serves.
    await StoredBytes(redis, ttl_s=DAY, cap_of=lambda _: 100).forget(tenant, "s", "one")
    later = time.monotonic() + RECHECK_S
    monkeypatch.setattr("gateway.state.stored_bytes.time.monotonic", lambda: later)
    await stored.admit(tenant)
    await stored.admit(tenant)
    assert asked == [1]


async def test_a_higher_cap_after_a_reload_serves_at_once(
    redis: aioredis.Redis, tenant: str
) -> None:
    caps = {tenant: 100}
    stored = meter(redis, caps)
    await stored.charge(tenant, "s", "one", 150)
    with pytest.raises(StoredBytesExceeded):
        await stored.admit(tenant)
    caps[tenant] = 1000
    await stored.admit(tenant)
    del caps[tenant]
    await stored.admit(tenant)


async def test_each_gateway_learns_the_shared_total_from_its_own_writes(
    redis: aioredis.Redis, tenant: str
) -> None:
    first, second = meter(redis, {tenant: 100}), meter(redis, {tenant: 100})
    await first.charge(tenant, "s", "one", 100)
    await second.admit(tenant)  # has not written for the tenant yet: its turn is stored
    await second.charge(tenant, "s", "two", 5)
    with pytest.raises(StoredBytesExceeded) as refused:
        await second.admit(tenant)
    assert "105" in str(refused.value)


async def test_redis_not_answering_neither_fails_a_write_nor_refuses(tenant: str) -> None:
    gone = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        seen: list[tuple[str, int]] = []
        stored = StoredBytes(
            gone, ttl_s=DAY, cap_of=lambda _: 1, on_count=lambda t, n: seen.append((t, n))
        )
        await stored.charge(tenant, "s", "one", 100)
        await stored.forget(tenant, "s", "one")
        await stored.admit(tenant)
        assert seen == []
    finally:
        await gone.aclose()


async def test_the_total_is_reported_as_writes_bring_it_back(
    redis: aioredis.Redis, tenant: str
) -> None:
    seen: list[tuple[str, int]] = []
    stored = StoredBytes(
        redis, ttl_s=DAY, cap_of=lambda _: 10**6, on_count=lambda t, n: seen.append((t, n))
    )
    await stored.charge(tenant, "s", "one", 300)
    await stored.charge(tenant, "r", "two", 200)
    await stored.forget(tenant, "s", "one")
    assert seen == [(tenant, 300), (tenant, 500), (tenant, 200)]


async def test_the_count_runs_on_a_redis_cluster(cluster_client: GatedRedisCluster) -> None:
    tenant = f"stored-{uuid.uuid4().hex[:10]}"
    stored = StoredBytes(cluster_client, ttl_s=DAY, cap_of=lambda _: 50)
    await stored.charge(tenant, "s", "one", 30)
    await stored.admit(tenant)
    await stored.charge(tenant, "s", "two", 30)
    with pytest.raises(StoredBytesExceeded):
        await stored.admit(tenant)
    await stored.forget(tenant, "s", "two")
    await stored.admit(tenant)


async def test_a_value_written_over_counts_once_for_its_own_lifetime(
    redis: aioredis.Redis, tenant: str
) -> None:
    stored = meter(redis, {tenant: 10**6}, ttl_s=DAY)
    await stored.charge(tenant, "s", "one", 100)  # lives a day
    await stored.put(tenant, "a", "k", 500, ttl_s=60)
    await stored.put(tenant, "a", "k", 300, ttl_s=60)  # the same answer kept again
    assert await held(redis, tenant) == {"s:one": 100, "a:k": 300, "total": 400}
    expiry = stored_bytes_key(tenant, "expiry")
    assert await redis.zscore(expiry, "a:k") <= time.time() + 61  # type: ignore[operator]
    assert await redis.ttl(expiry) > DAY - 5  # the keys live as long as their longest thing


async def test_the_response_cache_keeps_no_more_answers_for_a_full_tenant(
    redis: aioredis.Redis, tenant: str
) -> None:
    stored = meter(redis, {tenant: 1000})
    cache = RedisResponseCache(redis, ttl_s=600, stored=stored)
    try:
        await cache.put("first", b"x" * 600, tenant=tenant)
        assert (await held(redis, tenant))["a:first"] == 600
        await stored.charge(tenant, "s", "one", 400)  # now full
        await cache.put("second", b"y" * 10, tenant=tenant)  # skipped, nothing refused
        assert await cache.get("second", tenant=tenant) is None
        assert await cache.get("first", tenant=tenant) == b"x" * 600  # still served
    finally:
        await redis.delete(answer_key(tenant, "first"), answer_key(tenant, "second"))
