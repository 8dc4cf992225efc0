"""A long session's snapshot on a real Redis Cluster (three nodes on loopback, as
tests/integration/test_redis_cluster.py starts them): a session's turns, blobs and
snapshot share a slot, so the scripts that keep and read the snapshot run on the node
that owns it, whichever that is."""

from __future__ import annotations

import uuid

from gateway.sessions.checkpoints import Stored
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import SNAPSHOT_EVERY, RedisCheckpoints
from gateway.state.redis_client import GatedRedisCluster
from tests.integration.test_redis_cluster import LocalCluster
from tests.unit.sessions.test_store import varied


async def test_long_sessions_read_from_their_snapshots_on_every_node(
    cluster_client: GatedRedisCluster, local_cluster: LocalCluster
) -> None:
    store = RedisCheckpoints(cluster_client, ttl_s=600)
    sessions: dict[int, SessionRef] = {}  # one session on each of the nodes
    while len(sessions) < 3:
        session = SessionRef("default", f"long-{uuid.uuid4().hex[:8]}")
        sessions.setdefault(local_cluster.owner(session.key("turns")), session)
    for session in sessions.values():
        stored = Stored()
        for i in range(1, SNAPSHOT_EVERY + 6):
            await store.append(session, varied(i), {}, prior=stored)
            stored = stored.then([varied(i)])
        assert await cluster_client.exists(session.key("snapshot")) == 1
        assert await store.load_stored(session) == stored
        assert await RedisCheckpoints(cluster_client, ttl_s=600).load_stored(session) == stored
        assert await store.delete(session)
