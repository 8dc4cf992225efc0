"""Engine discovery from DNS: replicas join and leave with the name's answer, keep their
state while they stay, survive failed lookups, and get requests routed to them."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.fleet.discovery import (
    Discovery,
    DiscoveryMetrics,
    DnsWatcher,
    LookupFailed,
    NameNotFound,
    SystemResolver,
    replica_urls,
)
from gateway.fleet.replicas import Fleet, Pool, Replica
from gateway.policy import Policy, parse_policy
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted

COMPLETION = b'{"id":"c1","object":"chat.completion","choices":[]}'
CHAT = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}

Answer = list[str] | Exception


class MemoryResolver:
    """The resolver's in-memory twin: each name answers what the test last set."""

    def __init__(self, **answers: Answer) -> None:
        self.answers: dict[str, Answer] = dict(answers)
        self.delay_s = 0.0
        self.lookups = 0

    async def resolve(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        answer = self.answers.get(host, NameNotFound(host))
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


def policy_with(discover: str, *, extra_pool: str = "", routing: str = "") -> Policy:
    return parse_policy(
        f"""\
version: 1
{routing}
pools:
  large:
    served_model: served-large
    discover: {discover}
{extra_pool}
models:
  big: {{pool: large}}
"""
    )


def watcher(
    resolver: MemoryResolver, discover: str = "{dns: engines.test, port: 8000}", extra: str = ""
) -> tuple[DnsWatcher, Pool, DiscoveryMetrics, list[Replica]]:
    fleet = Fleet(policy_with(discover, extra_pool=extra))
    departed: list[Replica] = []
    fleet.on_departure(departed.append)
    pool = fleet.pools["large"]
    assert pool.spec.discover is not None
    metrics = DiscoveryMetrics(CollectorRegistry())
    return DnsWatcher(pool, pool.spec.discover, resolver, metrics), pool, metrics, departed


def urls(pool: Pool) -> list[str]:
    return [r.url for r in pool.replicas]


def failures(metrics: DiscoveryMetrics, reason: str) -> float:
    value = metrics.failures.labels("large", reason)._value.get()
    return float(value)


async def test_addresses_join_the_pool_as_replicas() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.2", "10.0.0.1"]})
    watch, pool, metrics, _ = watcher(resolver)
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert all(r.served_model == "served-large" and r.healthy for r in pool.replicas)
    assert metrics.replicas.labels("large")._value.get() == 2


async def test_replicas_that_stay_keep_their_objects_and_state() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1", "10.0.0.2"]})
    watch, pool, _, departed = watcher(resolver)
    await watch.refresh()
    first, second = pool.replicas
    first.mark_failed("slow", threshold=5)
    first.inflight = 3
    resolver.answers["engines.test"] = ["10.0.0.3", "10.0.0.1", "10.0.0.2"]
    await watch.refresh()
    assert pool.replicas[0] is first and pool.replicas[1] is second
    assert (first.consecutive_failures, first.inflight) == (1, 3)
    assert urls(pool)[2] == "http://10.0.0.3:8000"
    assert departed == []


async def test_replicas_that_leave_the_answer_leave_the_pool_and_are_announced() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1", "10.0.0.2"]})
    watch, pool, _, departed = watcher(resolver)
    await watch.refresh()
    gone = pool.replicas[0]
    resolver.answers["engines.test"] = ["10.0.0.2"]
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.2:8000"]
    assert departed == [gone]


async def test_a_failed_lookup_keeps_the_last_known_replicas() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1"]})
    watch, pool, metrics, departed = watcher(resolver)
    await watch.refresh()
    known = pool.replicas[0]
    resolver.answers["engines.test"] = LookupFailed("engines.test: server failure")
    for _ in range(10):
        await watch.refresh()
    assert pool.replicas == [known]
    assert failures(metrics, "error") == 10
    assert departed == []


async def test_a_lookup_slower_than_the_timeout_counts_as_failed() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1"]})
    watch, pool, metrics, _ = watcher(resolver, "{dns: engines.test, timeout_s: 0.05}")
    await watch.refresh()
    resolver.delay_s = 1.0
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000"]
    assert failures(metrics, "error") == 1


async def test_no_such_name_empties_the_pool_only_after_consecutive_rounds() -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1"]})
    watch, pool, metrics, departed = watcher(resolver, "{dns: engines.test, empty_after_rounds: 3}")
    await watch.refresh()
    resolver.answers["engines.test"] = NameNotFound("engines.test")
    await watch.refresh()
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000"]  # a DNS hiccup is ridden out
    resolver.answers["engines.test"] = ["10.0.0.1"]  # ...and the streak is reset
    await watch.refresh()
    resolver.answers["engines.test"] = []  # an empty answer counts like NXDOMAIN
    await watch.refresh()
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000"]
    await watch.refresh()
    assert pool.replicas == []
    assert len(departed) == 1
    assert failures(metrics, "empty") == 5


async def test_ipv6_addresses_are_bracketed_and_dual_stack_pods_count_once() -> None:
    resolver = MemoryResolver(v6=["fd00::2", "fd00::1"], dual=["fd00::1", "10.0.0.1"])
    watch, pool, _, _ = watcher(resolver, "{dns: v6, port: 8001}")
    await watch.refresh()
    assert urls(pool) == ["http://[fd00::1]:8001", "http://[fd00::2]:8001"]
    watch, pool, _, _ = watcher(resolver, "{dns: dual}")
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000"]
    watch, pool, _, _ = watcher(resolver, "{dns: dual, family: ipv6, scheme: https}")
    await watch.refresh()
    assert urls(pool) == ["https://[fd00::1]:8000"]
    assert replica_urls(["fe80::1%eth0"], scheme="http", port=1, family="auto") == []


async def test_static_and_discovered_replicas_mix_without_duplicates() -> None:
    static = '    replicas: [{url: "http://10.0.0.1:8000"}, {url: "http://gpu-0.lan:8000"}]'
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1", "10.0.0.9"]})
    watch, pool, _, departed = watcher(resolver, extra=static)
    static_replica = pool.replicas[0]
    await watch.refresh()
    assert urls(pool) == [
        "http://10.0.0.1:8000",
        "http://gpu-0.lan:8000",
        "http://10.0.0.9:8000",
    ]
    assert pool.replicas[0] is static_replica
    resolver.answers["engines.test"] = ["10.0.0.9"]
    await watch.refresh()
    assert pool.replicas[0] is static_replica  # still listed by the policy
    assert departed == []


async def test_the_router_forgets_what_a_departed_replica_held() -> None:
    """A pod that leaves and comes back at the same address has an empty cache."""
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1", "10.0.0.2"]})
    policy = policy_with("{dns: engines.test}")
    fleet = Fleet(policy)
    router = build_router(policy.routing, time.monotonic)
    fleet.on_departure(lambda replica: router.forget(replica.id))
    discovery = Discovery(fleet, resolver, DiscoveryMetrics(CollectorRegistry()))
    await discovery.refresh_all()
    pool = fleet.pools["large"]
    request = RouteRequest(tuple(range(20)))
    decision = router.choose(pool.replicas, request, frozenset())
    assert decision is not None
    router.dispatched(decision, request)
    assert router.cached_share(pool.replicas, request) == 1.0
    holder = decision.replica.url.removeprefix("http://").removesuffix(":8000")
    resolver.answers["engines.test"] = [a for a in ("10.0.0.1", "10.0.0.2") if a != holder]
    await discovery.refresh_all()
    resolver.answers["engines.test"] = ["10.0.0.1", "10.0.0.2"]
    await discovery.refresh_all()
    assert router.cached_share(pool.replicas, request) == 0.0


async def test_the_system_resolver_resolves_localhost_and_ip_literals() -> None:
    resolver = SystemResolver()
    local = await resolver.resolve("localhost", 8000)
    assert "127.0.0.1" in local or "::1" in local
    assert set(local) <= {"127.0.0.1", "::1"}
    assert await resolver.resolve("::1", 8000) == ["::1"]


async def test_the_system_resolver_tells_no_such_name_from_a_failed_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    def failing(errno: int) -> Callable[..., object]:
        async def getaddrinfo(*args: object, **kwargs: object) -> object:
            raise socket.gaierror(errno, "scripted")

        return getaddrinfo

    monkeypatch.setattr(loop, "getaddrinfo", failing(socket.EAI_NONAME))
    with pytest.raises(NameNotFound):
        await SystemResolver().resolve("engines.test", 8000)
    monkeypatch.setattr(loop, "getaddrinfo", failing(socket.EAI_AGAIN))
    with pytest.raises(LookupFailed):
        await SystemResolver().resolve("engines.test", 8000)


def ok(call: Call) -> Scripted:
    return Scripted(body=COMPLETION)


@pytest.fixture
def open_gateway(redis_url: str) -> Iterator[Callable[..., tuple[TestClient, FakeUpstream]]]:
    opened: list[TestClient] = []

    def open_(
        discover: str, resolver: MemoryResolver | None = None
    ) -> tuple[TestClient, FakeUpstream]:
        policy = policy_with(
            discover,
            routing=f"state: {{redis_url: '{redis_url}'}}\nrouting: {{strategy: round_robin}}",
        )
        fake = FakeUpstream(ok)
        app = create_app(policy, upstream=fake, store=StateStore(policy.state), resolver=resolver)
        client = TestClient(app)
        client.__enter__()
        opened.append(client)
        return client, fake

    yield open_
    for client in opened:
        client.__exit__(None, None, None)


def test_a_request_is_routed_to_a_replica_found_through_the_real_resolver(
    open_gateway: Callable[..., tuple[TestClient, FakeUpstream]],
) -> None:
    client, fake = open_gateway("{dns: localhost, port: 8123, family: ipv4}")
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert fake.calls[0].url == "http://127.0.0.1:8123/v1/chat/completions"
    assert client.get("/readyz").json()["models"]["big"]["replicas"] == 1


def test_requests_follow_replicas_joining_and_leaving_under_a_running_gateway(
    open_gateway: Callable[..., tuple[TestClient, FakeUpstream]],
) -> None:
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1"]})
    client, fake = open_gateway("{dns: engines.test, interval_s: 0.02}", resolver)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert fake.calls[-1].url.startswith("http://10.0.0.1:8000/")

    resolver.answers["engines.test"] = ["10.0.0.2"]  # a rolling update: old pod out, new in
    deadline = time.monotonic() + 5
    while not fake.calls[-1].url.startswith("http://10.0.0.2:8000/"):
        assert time.monotonic() < deadline, "the new replica never got a request"
        time.sleep(0.02)
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    for _ in range(5):
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert fake.calls[-1].url.startswith("http://10.0.0.2:8000/")


async def test_a_replica_listed_by_the_state_file_and_dns_is_one_object(tmp_path: Path) -> None:
    state = tmp_path / "engines.json"
    entry = {"pool": "large", "url": "http://10.0.0.1:8000", "served_model": "served-large"}
    state.write_text(json.dumps({"replicas": [entry]}))
    resolver = MemoryResolver(**{"engines.test": ["10.0.0.1"]})
    watch, pool, _, departed = watcher(resolver, extra=f"    engine_state: {state}")
    pool.refresh_from_engine_state()
    from_state = pool.replicas[0]
    await watch.refresh()
    assert pool.replicas == [from_state]
    state.write_text(json.dumps({"replicas": []}))
    pool.refresh_from_engine_state()
    assert pool.replicas == [from_state]  # DNS still lists it
    resolver.answers["engines.test"] = ["10.0.0.2"]
    await watch.refresh()
    assert urls(pool) == ["http://10.0.0.2:8000"]
    assert departed == [from_state]
