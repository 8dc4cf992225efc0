"""Stored responses: Redis, and its in-memory twin held to the same behaviour."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from gateway.responses.records import (
    MemoryResponseRecords,
    RedisResponseRecords,
    ResponseRecords,
)
from gateway.state.keys import response_key


@pytest.fixture(params=["redis", "memory"])
def records(request: pytest.FixtureRequest, redis: aioredis.Redis) -> ResponseRecords:
    if request.param == "memory":
        return MemoryResponseRecords()
    return RedisResponseRecords(redis, ttl_s=600)


async def test_a_record_is_kept_read_and_deleted(records: ResponseRecords) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    assert await records.get(response_id) is None
    record = {"session": "s", "request_id": response_id, "response": {"id": response_id}}
    await records.put(response_id, record)
    assert await records.get(response_id) == record
    assert await records.delete(response_id) is True
    assert await records.delete(response_id) is False
    assert await records.get(response_id) is None


async def test_redis_records_expire_with_the_sessions(redis: aioredis.Redis) -> None:
    response_id = f"resp_{uuid.uuid4().hex}"
    await RedisResponseRecords(redis, ttl_s=600).put(response_id, {"x": 1})
    assert 590 < await redis.ttl(response_key("default", response_id)) <= 600
