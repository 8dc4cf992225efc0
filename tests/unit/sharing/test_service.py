"""Two gateways' routers in one process, sharing through the real Redis: what one
dispatches, the other learns after a flush; a gateway ignores its own entries; in-flight
counts cross over; with Redis gone nothing raises, the metric says 0, and sharing resumes
when Redis is back; on a Redis Cluster, pools on different nodes share alike."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.supervisor import free_port
from gateway.fleet.replicas import Fleet, Replica
from gateway.policy import Policy, parse_policy
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from gateway.routing.router import CacheAwareRouter
from gateway.sharing.publishing import PublishingRouter
from gateway.sharing.service import RoutingShare
from gateway.state.keys import routing_key
from gateway.state.redis_client import GatedRedisCluster, RedisClient
from gateway.state.store import redis_server_binary
from gateway.telemetry.metrics import GatewayMetrics
from tests.integration.test_redis_cluster import LocalCluster, _start_cluster
from tests.lifetimes import suite_reaper

PREFIX = tuple(range(1000, 1040))  # 40 blocks


def policy_of(pool: str, inflight_ttl_s: float = 2.0) -> Policy:
    return parse_policy(f"""\
version: 1
pools:
  {pool}:
    served_model: m
    replicas: [{{url: "http://10.0.0.1:8000"}}, {{url: "http://10.0.0.2:8000"}}]
models:
  m: {{pool: {pool}}}
routing:
  implicit_sessions: false
  shared_opening_conversations: 0
  sharing: {{flush_ms: 5, inflight_ttl_s: {inflight_ttl_s}}}
""")  # fmt: skip


@dataclass
class Gateway:
    fleet: Fleet
    router: CacheAwareRouter
    share: RoutingShare
    publishing: PublishingRouter
    metrics: GatewayMetrics

    @property
    def replicas(self) -> list[Replica]:
        return next(iter(self.fleet.pools.values())).replicas

    def route(
        self, blocks: tuple[int, ...], avoid: Replica | None = None, session: str | None = None
    ) -> Replica:
        request = RouteRequest(blocks, session)
        exclude = frozenset({avoid}) if avoid is not None else frozenset()
        choice = self.publishing.choose(self.replicas, request, exclude)
        assert choice is not None
        self.publishing.dispatched(choice, request)
        return choice.replica

    def counted(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "gateway_routing_placements_total", {"outcome": outcome}
        )
        return value or 0.0

    def up(self) -> float | None:
        return self.metrics.registry.get_sample_value("gateway_routing_sharing_up")


def gateway(redis: RedisClient, policy: Policy, name: str) -> Gateway:
    fleet = Fleet(policy)
    router = build_router(policy.routing, time.monotonic)
    assert isinstance(router, CacheAwareRouter)
    metrics = GatewayMetrics()
    share = RoutingShare(redis, policy.routing.sharing, fleet, router, metrics, instance=name)
    return Gateway(fleet, router, share, PublishingRouter(router, share), metrics)


@asynccontextmanager
async def started(*gateways: Gateway) -> AsyncIterator[None]:
    for each in gateways:
        await each.share.start()
    try:
        yield
    finally:
        for each in gateways:
            await each.share.stop()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.005)


@pytest.fixture
def pool() -> str:
    return f"p{uuid.uuid4().hex[:10]}"


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


@asynccontextmanager
async def sharing(redis_url: str, pool: str) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Gateways a and b sharing through Redis, started, both followers at the stream's
    end; their keys deleted after."""
    redis = aioredis.Redis.from_url(redis_url)
    policy = policy_of(pool)
    a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
    try:
        async with started(a, b):
            await asyncio.sleep(0.05)  # both followers stand at the stream's end
            yield a, b
    finally:
        await redis.delete(routing_key(pool, "placements"), routing_key(pool, "inflight"))
        await redis.aclose()


def test_a_placement_made_by_one_gateway_steers_the_other(redis_url: str, pool: str) -> None:
    async def scenario() -> None:
        async with sharing(redis_url, pool) as (a, b):
            first, second = a.replicas
            assert a.route(PREFIX, avoid=first) is second
            await until(lambda: b.counted("applied") == 1)
            request = RouteRequest((*PREFIX, 7))
            choice = b.publishing.choose(b.replicas, request)
            assert choice is not None
            assert (choice.replica.id, choice.reason) == (second.id, "prefix")
            assert choice.cached_blocks == len(PREFIX)
            # its own entry, read back from the stream, is not applied twice (the round
            # that wrote it may end after the other gateway has read it)
            await until(lambda: a.counted("published") == 1)
            await asyncio.sleep(0.05)
            assert a.counted("applied") == 0
            assert a.up() == 1.0

    run(scenario)


def test_a_conversation_moved_by_one_gateway_is_at_home_there_for_the_other(
    redis_url: str, pool: str
) -> None:
    """Session homes travel with placements: a conversation one gateway moved (its home
    was excluded, as after a failure) is sent to its new home by the other gateway too,
    though the other's rendezvous hash still names the old one."""

    async def scenario() -> None:
        async with sharing(redis_url, pool) as (a, b):
            hashed = b.publishing.choose(b.replicas, RouteRequest((), "chat-7"))
            assert hashed is not None and hashed.reason == "session"
            moved = a.route((), avoid=hashed.replica, session="chat-7")
            assert moved is not hashed.replica
            await until(lambda: b.counted("applied") == 1)
            followed = b.publishing.choose(b.replicas, RouteRequest((), "chat-7"))
            assert followed is not None
            assert (followed.replica.id, followed.reason) == (moved.id, "session")

    run(scenario)


def test_without_sharing_the_other_gateway_knows_nothing(redis_url: str, pool: str) -> None:
    """The contrast: the same placement, not flushed, leaves the other gateway guessing."""

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        policy = policy_of(pool)
        a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
        try:
            first, second = a.replicas
            assert a.route(PREFIX, avoid=first) is second
            assert b.router.cached_share(b.replicas, RouteRequest(PREFIX)) == 0.0
        finally:
            await redis.aclose()

    run(scenario)


def test_in_flight_counts_cross_over_and_expire(redis_url: str, pool: str) -> None:
    async def scenario() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        policy = policy_of(pool, inflight_ttl_s=0.3)
        a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
        try:
            target = a.replicas[1]
            target.inflight = 3
            await a.share.flush()
            await b.share.flush()
            assert b.share.peer_inflight(target.id) == 3
            assert a.share.peer_inflight(target.id) == 0  # its own are not peers'
            target.inflight = 1
            await a.share.flush()
            await b.share.flush()
            assert b.share.peer_inflight(target.id) == 1
            # a stops renewing (as if it died): after the TTL its count no longer holds
            await asyncio.sleep(0.35)
            await b.share.flush()
            assert b.share.peer_inflight(target.id) == 0
            await b.share.flush()  # and its field was deleted for everyone
            assert b"gw-a" not in await redis.hkeys(routing_key(pool, "inflight"))
        finally:
            await redis.delete(routing_key(pool, "placements"), routing_key(pool, "inflight"))
            await redis.aclose()

    run(scenario)


@contextmanager
def private_redis(port: int, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    binary = redis_server_binary() or shutil.which("redis-server")
    assert binary is not None, "no redis-server to start"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # held by the suite's reaper: gone with pytest
    )
    suite_reaper().hold(proc.pid)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        suite_reaper().release(proc.pid)


def test_redis_down_routes_on_the_local_view_and_sharing_resumes(tmp_path: Path, pool: str) -> None:
    port = free_port()

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=2)
        policy = policy_of(pool)
        a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
        first, second = a.replicas
        async with started(a, b):
            with private_redis(port, tmp_path):
                await until(lambda: a.up() == 1.0 and b.up() == 1.0)
                b.replicas[0].inflight = 2
                await until(lambda: a.share.peer_inflight(first.id) == 2)
            # Redis is gone under both gateways: they say so, and route on their own view
            await until(lambda: a.up() == 0.0 and b.up() == 0.0)
            assert a.share.peer_inflight(first.id) == 0
            assert a.route(PREFIX, avoid=first) is second  # nothing raises
            await asyncio.sleep(0.1)  # flush rounds come and fail meanwhile
            assert a.counted("published") == 0
            with private_redis(port, tmp_path):
                await until(lambda: a.up() == 1.0 and b.up() == 1.0, timeout_s=10)
                # what was queued during the outage is published, and the other learns it
                await until(lambda: b.counted("applied") == 1, timeout_s=10)
                choice = b.publishing.choose(b.replicas, RouteRequest(PREFIX))
                assert choice is not None and choice.replica.id == second.id
                await until(lambda: a.counted("published") == 1)  # its round may end later
        await redis.aclose()

    run(scenario)


def test_a_gateway_alone_writes_no_placements_until_another_appears(
    redis_url: str, pool: str
) -> None:
    """Alone, a gateway's placements would be read by nobody but its own follower: they
    are not written (its in-flight field is, for the next gateway to find). Once the
    second gateway's field is read, placements flow again."""

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        policy = policy_of(pool)
        a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
        stream, inflight = routing_key(pool, "placements"), routing_key(pool, "inflight")
        try:
            first, second = a.replicas
            await a.share.flush()  # its first read: nobody else there
            assert a.route(PREFIX, avoid=first) is second
            await a.share.flush()
            assert await redis.xlen(stream) == 0
            assert a.counted("alone") == 1 and a.counted("published") == 0
            assert b"gw-a" in await redis.hkeys(inflight)  # there to be found
            await b.share.flush()  # b announces itself, and a reads it at its next round
            await a.share.flush()
            assert a.route(PREFIX, avoid=first) is second
            await a.share.flush()
            assert await redis.xlen(stream) == 1
            assert a.counted("published") == 1
        finally:
            await redis.delete(stream, inflight)
            await redis.aclose()

    run(scenario)


def pools_on_two_nodes(cluster: LocalCluster) -> tuple[str, str]:
    """Two pool names whose routing keys (one slot per pool: its tag) live on two nodes."""
    first = f"p{uuid.uuid4().hex[:10]}"
    owner = cluster.owner(routing_key(first, "placements"))
    while True:
        second = f"p{uuid.uuid4().hex[:10]}"
        if cluster.owner(routing_key(second, "placements")) != owner:
            return first, second


def test_placements_cross_over_on_a_redis_cluster(tmp_path: Path) -> None:
    """On a Redis Cluster each pool's stream and in-flight hash share the pool's slot: a
    pool's placements are written and followed on the node that owns it, whichever it is."""
    cluster = _start_cluster(tmp_path)
    pools = pools_on_two_nodes(cluster)
    replicas = '[{url: "http://10.0.0.1:8000"}, {url: "http://10.0.0.2:8000"}]'
    policy = parse_policy(
        "version: 1\npools:\n"
        + "".join(f"  {p}: {{served_model: m, replicas: {replicas}}}\n" for p in pools)
        + "models:\n"
        + "".join(f"  m{i}: {{pool: {p}}}\n" for i, p in enumerate(pools))
        + "routing: {implicit_sessions: false, shared_opening_conversations: 0, "
        "sharing: {flush_ms: 5}}\n"
    )

    async def scenario() -> None:
        client = GatedRedisCluster.from_url(cluster.url, max_connections=8)
        await client.initialize()  # the slots mapped first, as a serving gateway has them
        a, b = gateway(client, policy, "gw-a"), gateway(client, policy, "gw-b")
        try:
            async with started(a, b):
                await asyncio.sleep(0.2)  # both followers stand at the streams' end
                for name in pools:
                    first, second = a.fleet.pools[name].replicas
                    request = RouteRequest(PREFIX)
                    choice = a.publishing.choose([first, second], request, frozenset({first}))
                    assert choice is not None and choice.replica is second
                    a.publishing.dispatched(choice, request)
                await until(lambda: b.counted("applied") == 2)
                for name in pools:
                    listed = b.fleet.pools[name].replicas
                    choice = b.publishing.choose(listed, RouteRequest(PREFIX))
                    assert choice is not None
                    assert (choice.replica.id, choice.reason) == (listed[1].id, "prefix")
                assert a.up() == b.up() == 1.0
        finally:
            await client.aclose()

    try:
        run(scenario)
    finally:
        cluster.stop()
