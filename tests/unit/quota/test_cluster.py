"""The quota scripts on a real Redis Cluster (three nodes on loopback, as
tests/integration/test_redis_cluster.py starts them): each tenant's keys share a slot, so
one script call checks them all on the node that owns it, whichever node that is, and a
node that lost its scripts is sent them again. Concurrent admissions on a cluster's fresh
connections are where redis-py was seen sending a call twice (see gateway/quota/store.py):
every caller must still hear exactly the capacity admitted."""

from __future__ import annotations

import asyncio
import uuid

from gateway.quota.store import Bucket, Period, RedisQuotaStore
from gateway.state.keys import quota_key
from gateway.state.redis_client import GatedRedisCluster
from tests.integration.test_redis_cluster import LocalCluster


async def test_every_tenant_s_limits_hold_on_whichever_node_owns_it(
    cluster_client: GatedRedisCluster, local_cluster: LocalCluster
) -> None:
    store = RedisQuotaStore(cluster_client)
    owners = set()
    for _ in range(6):
        tenant = f"c-{uuid.uuid4().hex[:8]}"
        requests = Bucket(quota_key(tenant, "tenant:requests"), "tenant", "requests", 5, 1)
        tokens = Bucket(quota_key(tenant, "key:k1:tokens"), "key", "tokens", 1000, 10)
        budget = Period(quota_key(tenant, "day:today"), "day", 2_000_000_000, 10_000, None, 10, 0)
        verdicts = await asyncio.gather(
            *(
                store.admit(tenant, [requests, tokens], [budget], enforce_budget=True)
                for _ in range(9)
            )
        )
        assert [v.outcome for v in verdicts].count("admitted") == 5
        await store.settle(tenant, [tokens], [budget], -5, 0)
        used = (await store.admit(tenant, [], [budget], enforce_budget=True)).used
        assert used == ((5 * 10 - 5, 0),)  # five admitted at 10 each, 5 settled back
        owners.add(local_cluster.owner(requests.key))
    assert len(owners) > 1  # the tenants landed on more than one node

    await cluster_client.script_flush()  # a node restarted empty: redis-py loads the script again
    assert (
        await store.admit(tenant, [requests], [], enforce_budget=True)
    ).outcome == "rate_limited"
