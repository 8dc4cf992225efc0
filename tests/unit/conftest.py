"""Unit-test fixtures: a redis-py asyncio client on the real Redis of tests/conftest.py,
gateways (real apps, engine twin) closed after each test, and a real Redis Cluster with a
gateway's client on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.state.redis_client import GatedRedisCluster
from tests.integration.test_redis_cluster import LocalCluster, _start_cluster
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


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three cluster nodes on loopback (as tests/integration/test_redis_cluster.py starts
    them), for one test module."""
    started = _start_cluster(Path(tmp_path_factory.mktemp("cluster")))
    yield started
    started.stop()


@pytest.fixture
async def cluster_client(local_cluster: LocalCluster) -> AsyncIterator[GatedRedisCluster]:
    opened = GatedRedisCluster.from_url(local_cluster.url, max_connections=32)
    # Learn the slots first, as a serving gateway has: redis-py closes the connections of
    # commands in flight while it first maps the cluster (they fail with AttributeError).
    await opened.initialize()
    yield opened
    await opened.aclose()
