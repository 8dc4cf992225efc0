"""The quota store's promises, proven on real Redis (the Lua scripts) and held against
the in-memory twin too: exact counts, continuous refill, all or nothing across buckets,
debt, settling up and down, and budgets by day and month in tokens and dollars."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.quota.store import ADMIT, SETTLE, Bucket, Period, QuotaStore, RedisQuotaStore
from gateway.state.keys import quota_key


def requests_bucket(tenant: str, capacity: int, part: str = "tenant") -> Bucket:
    return Bucket(quota_key(tenant, f"{part}:requests"), "tenant", "requests", capacity, 1)


def tokens_bucket(tenant: str, capacity: int, cost: int, part: str = "tenant") -> Bucket:
    return Bucket(quota_key(tenant, f"{part}:tokens"), "tenant", "tokens", capacity, cost)


def day(
    tenant: str, *, tokens: int = 0, nusd: int = 0, token_limit: int | None = None,
    nusd_limit: int | None = None,
) -> Period:  # fmt: skip
    tomorrow = int(time.time()) // 86_400 * 86_400 + 86_400
    key = quota_key(tenant, "day:today")
    return Period(key, "day", tomorrow, token_limit, nusd_limit, tokens, nusd)


def month(tenant: str, *, nusd: int, nusd_limit: int | None = None) -> Period:
    resets = int(time.time()) + 20 * 86_400
    return Period(quota_key(tenant, "month:this"), "month", resets, None, nusd_limit, 0, nusd)


async def test_a_bucket_admits_exactly_its_capacity_then_refuses(
    store: QuotaStore, tenant: str
) -> None:
    bucket = requests_bucket(tenant, 5)
    remaining = []
    for _ in range(5):
        verdict = await store.admit(tenant, [bucket], [], enforce_budget=True)
        assert verdict.outcome == "admitted"
        remaining.append(verdict.buckets[0].remaining)
    assert remaining == [4, 3, 2, 1, 0]

    refused = await store.admit(tenant, [bucket], [], enforce_budget=True)
    assert refused.outcome == "rate_limited" and refused.denied == 0
    # one request's worth refills in 60 s / 5 = 12 s; a little has refilled already
    assert 11_000 < refused.wait_ms <= 12_000
    assert refused.buckets[0].remaining == 0
    assert 59_000 < refused.buckets[0].reset_ms <= 60_000  # until all 5 are back


async def test_a_bucket_refills_continuously(store: QuotaStore, tenant: str) -> None:
    # 6,000 tokens per minute: 100 a second
    assert (
        await store.admit(tenant, [tokens_bucket(tenant, 6000, 6000)], [], enforce_budget=True)
    ).outcome == "admitted"
    assert (
        await store.admit(tenant, [tokens_bucket(tenant, 6000, 10)], [], enforce_budget=True)
    ).outcome == "rate_limited"
    await asyncio.sleep(0.3)  # about 30 tokens back
    assert (
        await store.admit(tenant, [tokens_bucket(tenant, 6000, 10)], [], enforce_budget=True)
    ).outcome == "admitted"
    refused = await store.admit(
        tenant, [tokens_bucket(tenant, 6000, 3000)], [], enforce_budget=True
    )
    assert refused.outcome == "rate_limited"
    assert 25_000 < refused.wait_ms < 30_000  # (3000 - what refilled) / 100 per second


async def test_a_request_refused_by_one_bucket_takes_nothing_from_the_others(
    store: QuotaStore, tenant: str
) -> None:
    requests, tokens = requests_bucket(tenant, 10), tokens_bucket(tenant, 100, 80)
    assert (await store.admit(tenant, [tokens], [], enforce_budget=True)).outcome == "admitted"
    budget = day(tenant, tokens=50, token_limit=1000)

    refused = await store.admit(
        tenant, [requests, tokens_bucket(tenant, 100, 50)], [budget], enforce_budget=True
    )
    assert refused.outcome == "rate_limited" and refused.denied == 1  # the token bucket
    assert [s.remaining for s in refused.buckets] == [10, 20]

    for _ in range(10):  # the request bucket is still full: ten pass, no more
        assert (
            await store.admit(tenant, [requests], [], enforce_budget=True)
        ).outcome == "admitted"
    assert (
        await store.admit(tenant, [requests], [], enforce_budget=True)
    ).outcome == "rate_limited"
    assert (await store.admit(tenant, [], [budget], enforce_budget=True)).used == ((0, 0),)


async def test_the_bucket_with_the_longest_wait_is_the_one_named(
    store: QuotaStore, tenant: str
) -> None:
    tenant_bucket, key_bucket = requests_bucket(tenant, 60), requests_bucket(tenant, 2, "key:k1")
    for _ in range(2):
        await store.admit(tenant, [tenant_bucket, key_bucket], [], enforce_budget=True)
    refused = await store.admit(tenant, [tenant_bucket, key_bucket], [], enforce_budget=True)
    assert refused.denied == 1 and 29_000 < refused.wait_ms <= 30_000


async def test_a_request_dearer_than_the_bucket_waits_for_a_full_one_and_leaves_debt(
    store: QuotaStore, tenant: str
) -> None:
    assert (
        await store.admit(tenant, [tokens_bucket(tenant, 100, 20)], [], enforce_budget=True)
    ).outcome == "admitted"
    refused = await store.admit(tenant, [tokens_bucket(tenant, 100, 250)], [], enforce_budget=True)
    assert refused.outcome == "rate_limited"  # it needs the whole bucket, not 250
    assert 11_000 < refused.wait_ms <= 12_000  # 20 tokens at 100 a minute

    await store.settle(tenant, [tokens_bucket(tenant, 100, 0)], [], -20, 0)  # full again
    admitted = await store.admit(tenant, [tokens_bucket(tenant, 100, 250)], [], enforce_budget=True)
    assert admitted.outcome == "admitted"
    assert admitted.buckets[0].remaining == 0
    # 150 of debt asked for, 100 taken (the floor: one bucket), then 100 to fill
    assert admitted.buckets[0].taken == 200
    assert 119_000 < admitted.buckets[0].reset_ms <= 120_000
    after = await store.admit(tenant, [tokens_bucket(tenant, 100, 1)], [], enforce_budget=True)
    assert after.outcome == "rate_limited" and 60_000 < after.wait_ms <= 60_600


async def test_one_request_leaves_a_bucket_at_most_one_bucket_in_debt(
    store: QuotaStore, tenant: str
) -> None:
    """A streamed n=100, max_tokens=1000 request against 2,000 tokens a minute: its estimate
    takes the bucket and one more bucket's worth of debt, no more, so the tenant's next
    small request waits about a minute, not 49."""
    admitted = await store.admit(
        tenant, [tokens_bucket(tenant, 2000, 100_020)], [], enforce_budget=True
    )
    assert admitted.outcome == "admitted"
    assert admitted.buckets[0].taken == 4000  # the 2,000 it held, and 2,000 of debt
    assert 119_000 < admitted.buckets[0].reset_ms <= 120_000
    next_one = await store.admit(tenant, [tokens_bucket(tenant, 2000, 30)], [], enforce_budget=True)
    assert next_one.outcome == "rate_limited"
    assert 60_000 < next_one.wait_ms <= 61_000  # back to zero, then its 30 tokens


async def test_settling_never_puts_a_bucket_more_than_one_bucket_in_debt(
    store: QuotaStore, tenant: str
) -> None:
    bucket = tokens_bucket(tenant, 2000, 10)  # no max_tokens: a tiny estimate
    assert (await store.admit(tenant, [bucket], [], enforce_budget=True)).buckets[0].taken == 10
    await store.settle(tenant, [bucket], [], 500_000, 0)  # it used half a million tokens
    after = await store.admit(tenant, [tokens_bucket(tenant, 2000, 30)], [], enforce_budget=True)
    assert after.outcome == "rate_limited" and 60_000 < after.wait_ms <= 61_000


async def test_settling_a_charge_cut_at_the_floor_refunds_only_what_was_taken(
    store: QuotaStore, tenant: str
) -> None:
    verdict = await store.admit(tenant, [tokens_bucket(tenant, 100, 1000)], [], enforce_budget=True)
    assert verdict.buckets[0].taken == 200  # 100 held, 100 of debt: 800 never taken
    charged = replace(tokens_bucket(tenant, 100, 1000), forgiven=1000 - verdict.buckets[0].taken)
    await store.settle(tenant, [charged], [], 150 - 1000, 0)  # it used 150, not 1,000
    after = await store.admit(tenant, [tokens_bucket(tenant, 100, 1)], [], enforce_budget=True)
    # 100 - 150 = 50 in debt (a refund of all 850 would have filled it): 51 tokens to wait
    assert after.outcome == "rate_limited" and 30_000 < after.wait_ms <= 30_700


async def test_settling_refunds_and_charges_the_difference(store: QuotaStore, tenant: str) -> None:
    bucket = tokens_bucket(tenant, 1000, 800)
    assert (await store.admit(tenant, [bucket], [], enforce_budget=True)).buckets[
        0
    ].remaining == 200
    await store.settle(tenant, [bucket], [], -700, 0)  # it used 100, not 800
    verdict = await store.admit(tenant, [tokens_bucket(tenant, 1000, 900)], [], enforce_budget=True)
    assert verdict.outcome == "admitted" and verdict.buckets[0].remaining < 5

    await store.settle(tenant, [bucket], [], 500, 0)  # it used 500 more than guessed: debt
    refused = await store.admit(tenant, [tokens_bucket(tenant, 1000, 1)], [], enforce_budget=True)
    assert refused.outcome == "rate_limited" and 29_000 < refused.wait_ms <= 30_100

    await store.settle(tenant, [bucket], [], -10_000, 0)  # a refund never fills past the capacity
    full = await store.admit(tenant, [tokens_bucket(tenant, 1000, 1)], [], enforce_budget=True)
    assert full.buckets[0].remaining == 999


async def test_a_token_budget_refuses_the_request_that_would_pass_it(
    store: QuotaStore, tenant: str
) -> None:
    def budget(tokens: int) -> Period:
        return day(tenant, tokens=tokens, token_limit=1000)

    assert (await store.admit(tenant, [], [budget(600)], enforce_budget=True)).outcome == "admitted"
    refused = await store.admit(tenant, [], [budget(600)], enforce_budget=True)
    assert refused.outcome == "over_budget" and refused.denied == 0  # day, tokens
    assert refused.used == ((600, 0),)
    assert (await store.admit(tenant, [], [budget(400)], enforce_budget=True)).outcome == "admitted"

    served_anyway = await store.admit(tenant, [], [budget(50)], enforce_budget=False)  # a downgrade
    assert served_anyway.outcome == "admitted" and served_anyway.used == ((1000, 0),)
    assert (await store.admit(tenant, [], [budget(0)], enforce_budget=False)).used == ((1050, 0),)


async def test_a_dollar_budget_is_counted_in_nano_dollars_per_month(
    store: QuotaStore, tenant: str
) -> None:
    periods = [
        day(tenant, tokens=10, token_limit=10_000),
        month(tenant, nusd=3_000, nusd_limit=5_000),
    ]
    assert (await store.admit(tenant, [], periods, enforce_budget=True)).outcome == "admitted"
    refused = await store.admit(tenant, [], periods, enforce_budget=True)
    assert refused.outcome == "over_budget"
    assert refused.denied == 3  # the second period (month), its money limit
    assert refused.used == ((10, 0), (0, 3_000))


async def test_a_budget_refusal_wins_over_a_rate_limit(store: QuotaStore, tenant: str) -> None:
    bucket = requests_bucket(tenant, 1)
    assert (await store.admit(tenant, [bucket], [], enforce_budget=True)).outcome == "admitted"
    refused = await store.admit(
        tenant, [bucket], [day(tenant, tokens=5, token_limit=1)], enforce_budget=True
    )
    assert refused.outcome == "over_budget"  # waiting for the bucket would not help


async def test_settling_replaces_a_budget_estimate(store: QuotaStore, tenant: str) -> None:
    estimate = day(tenant, tokens=500, nusd=5_000, token_limit=10_000)
    bucket = tokens_bucket(tenant, 10_000, 500)
    await store.admit(tenant, [bucket], [estimate], enforce_budget=True)
    await store.settle(tenant, [bucket], [estimate], -400, -4_000)
    assert (
        await store.admit(tenant, [], [day(tenant, token_limit=10_000)], enforce_budget=True)
    ).used == ((100, 1_000),)

    gone = day(f"{tenant}-none", tokens=1, token_limit=10)
    await store.settle(tenant, [], [gone], -400, -4_000)  # its counters expired: nothing to correct
    assert (await store.admit(tenant, [], [gone], enforce_budget=True)).used == ((0, 0),)


async def test_redis_keys_expire_once_they_no_longer_matter(
    redis: aioredis.Redis, tenant: str
) -> None:
    store = RedisQuotaStore(redis)
    bucket, budget = requests_bucket(tenant, 60), day(tenant, tokens=5, token_limit=100)
    await store.admit(tenant, [bucket], [budget], enforce_budget=True)
    assert 0 < await redis.pttl(bucket.key) <= 1_000 + 1_000  # one request back in 1 s
    assert await redis.expiretime(budget.key) == budget.resets_at + 86_400


def test_every_quota_key_of_a_tenant_is_in_one_cluster_slot() -> None:
    keys = [
        quota_key("acme", "tenant:requests"),
        quota_key("acme", "key:0123456789ab:tokens"),
        quota_key("acme", "day:2025-06-01"),
        quota_key("acme", "month:2025-06"),
    ]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert quota_key("we{ir}d", "tenant:requests") == "agw:quota:{we%7Bir%7Dd}:tenant:requests"


@pytest.mark.parametrize("capacity", [1, 7, 60])
async def test_concurrent_admissions_never_pass_more_than_the_capacity(
    store: QuotaStore, tenant: str, capacity: int
) -> None:
    bucket = requests_bucket(tenant, capacity)
    verdicts = await asyncio.gather(
        *(store.admit(tenant, [bucket], [], enforce_budget=True) for _ in range(capacity + 20))
    )
    assert sum(v.outcome == "admitted" for v in verdicts) == capacity


async def test_a_call_sent_twice_is_run_once(redis: aioredis.Redis, tenant: str) -> None:
    """redis-py sends a call again after a connection error that may follow Redis running
    it: the same `once` key gets the first answer back, and nothing is charged twice."""
    admit, settle = redis.register_script(ADMIT), redis.register_script(SETTLE)
    bucket = tokens_bucket(tenant, 100, 30)
    once = quota_key(tenant, "once:call-1")
    first = await admit(keys=[bucket.key, once], args=[1, 0, 1, 100, 30])
    again = await admit(keys=[bucket.key, once], args=[1, 0, 1, 100, 30])
    assert again == first and first[:4] == [1, 0, 0, 70]

    settled = quota_key(tenant, "once:call-2")
    for _ in range(2):
        await settle(keys=[bucket.key, settled], args=[1, 0, 20, 0, 100, 20])
    after = await RedisQuotaStore(redis).admit(
        tenant, [tokens_bucket(tenant, 100, 1)], [], enforce_budget=True
    )
    assert after.buckets[0].remaining in (48, 49)  # 100 - 30 - 20 - 1 (and a little refill)
