"""Quota stores under test: the Redis one on the real Redis of tests/conftest.py, and its
in-memory twin held to the same tests; every test gets a tenant of its own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.store import QuotaStore, RedisQuotaStore


@pytest.fixture
async def tenant(redis: aioredis.Redis) -> AsyncIterator[str]:
    name = f"q-{uuid.uuid4().hex[:10]}"
    yield name
    async for key in redis.scan_iter(match=f"agw:quota:{{{name}}}:*"):
        await redis.delete(key)


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, redis: aioredis.Redis) -> QuotaStore:
    if request.param == "redis":
        return RedisQuotaStore(redis)
    return MemoryQuotaStore()
