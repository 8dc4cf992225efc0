"""Unit-test fixtures: a redis-py asyncio client on the real Redis of tests/conftest.py, and
gateways (real apps, engine twin) closed after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests.unit.clients import OpenGateways


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def gateways() -> Iterator[OpenGateways]:
    opened = OpenGateways()
    yield opened
    opened.close_all()
