"""A long session's snapshot on a real Redis Cluster (three nodes on loopback, as
tests/integration/test_redis_cluster.py starts them): a session's turns, blobs and
snapshot share a slot, so the scripts that keep and read the snapshot run on the node
that owns it, whichever that is."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.sessions.checkpoints import Stored
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import SNAPSHOT_EVERY, RedisCheckpoints
from gateway.state.redis_client import GatedRedisCluster
from tests.integration.test_redis_cluster import LocalCluster, _start_cluster
from tests.unit.sessions.test_store import varied


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = _start_cluster(Path(tmp_path_factory.mktemp("sessions-cluster")))
    yield started
    started.stop()


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[GatedRedisCluster]:
    opened = GatedRedisCluster.from_url(cluster.url, max_connections=16)
    await opened.initialize()  # the slots learned first, as a serving gateway has
    yield opened
    await opened.aclose()


async def test_long_sessions_read_from_their_snapshots_on_every_node(
    client: GatedRedisCluster, cluster: LocalCluster
) -> None:
    store = RedisCheckpoints(client, ttl_s=600)
    sessions: dict[int, SessionRef] = {}  # one session on each of the nodes
    while len(sessions) < 3:
        session = SessionRef("default", f"long-{uuid.uuid4().hex[:8]}")
        sessions.setdefault(cluster.owner(session.key("turns")), session)
    for session in sessions.values():
        stored = Stored()
        for i in range(1, SNAPSHOT_EVERY + 6):
            stored = stored.then([varied(i)])
            await store.append(session, varied(i), {}, after=stored)
        assert await client.exists(session.key("snapshot")) == 1
        assert await store.load_stored(session) == stored
        assert await RedisCheckpoints(client, ttl_s=600).load_stored(session) == stored
        assert await store.delete(session)
