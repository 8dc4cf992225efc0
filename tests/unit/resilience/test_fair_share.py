"""Fair admission across tenants (gateway/resilience/fair_share.py): who may wait for a slot
of a full pool, and who gets the next one."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.api.inference import render
from gateway.errors import Overloaded
from gateway.fleet.replicas import Fleet, Replica
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.request_context import RequestContext
from gateway.resilience.fair_share import FairQueue
from gateway.routing.router import RoundRobinRouter
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.identity import TenantAccess
from tests.fakes import FakeUpstream, Scripted


def _replicas(**held: int) -> list[Replica]:
    replica = Replica("p", "http://a.test:1", "m")
    replica.by_tenant = {t: n for t, n in held.items() if n}
    replica.inflight = sum(held.values())
    return [replica]


def test_a_tenant_alone_never_waits_in_line() -> None:
    line = FairQueue({})
    assert not line.may_wait(_replicas(a=8), "a", capacity=8)
    assert not line.may_wait(_replicas(), "a", capacity=8)  # the engines' own queues are full


def test_a_tenant_below_its_share_waits_and_the_hog_does_not() -> None:
    line = FairQueue({})
    replicas = _replicas(a=8)
    assert line.may_wait(replicas, "b", capacity=8)
    assert not line.may_wait(replicas, "a", capacity=8)


def test_a_tenant_at_its_share_still_waits_while_another_holds_more() -> None:
    line = FairQueue({})
    # Capacity shrank (a replica left) while `a` held on: `b` at its share of 4 may still
    # wait, because `a` will give slots back and holds more than `b` would.
    replicas = _replicas(a=12, b=4)
    assert line.may_wait(replicas, "b", capacity=8)
    for _ in range(7):
        line.join("b")
    assert line.may_wait(replicas, "b", capacity=8)  # 4 held + 7 waiting + this one = 12
    line.join("b")
    assert not line.may_wait(replicas, "b", capacity=8)  # 13 would be more than `a` holds
    assert not line.may_wait(replicas, "a", capacity=8)


def test_what_other_gateways_hold_counts_toward_the_shares() -> None:
    """`a` floods through another gateway: here `b` is alone, but not in the pool."""
    replicas = _replicas()  # nothing in flight from this gateway
    elsewhere = {replicas[0].id: {"a": 8}}
    line = FairQueue({}, peers=lambda replica: elsewhere.get(replica, {}))
    assert line.may_wait(replicas, "b", capacity=8)
    assert not line.may_wait(replicas, "a", capacity=8)
    assert line.in_flight(replicas, "a") == 8
    alone = FairQueue({})  # without the others' counts `b` looked alone, and was shed
    assert not alone.may_wait(replicas, "b", capacity=8)


def test_weights_set_the_shares() -> None:
    line = FairQueue({"gold": 3.0})
    replicas = _replicas(gold=5, free=3)
    assert line.may_wait(replicas, "gold", capacity=8)  # 5 < 8 * 3/4
    assert not line.may_wait(replicas, "free", capacity=8)  # 3 >= 8 * 1/4, and 4 > 5/3


def test_the_next_slot_goes_to_the_tenant_holding_least_per_weight() -> None:
    line = FairQueue({"gold": 4.0})
    replicas = _replicas(gold=6, free=2)
    free = line.join("free")
    gold = line.join("gold")
    assert not line.may_take(replicas, None)  # a newcomer queues behind the line
    assert line.may_take(replicas, gold)  # 6/4 < 2/1
    assert not line.may_take(replicas, free)
    line.leave(gold)
    assert line.may_take(replicas, free)
    line.leave(free)
    assert line.may_take(replicas, None)  # nobody waits: anyone may


class _Held(FakeUpstream):
    """Every answer is a stream that stays open until its gate opens."""

    def __init__(self) -> None:
        super().__init__(lambda call: Scripted(chunks=[], content_type="text/event-stream"))
        self.gates: list[asyncio.Event] = []

    async def post(self, url, body, headers, *, connect_timeout_s):  # type: ignore[no-untyped-def]
        response = await super().post(url, body, headers, connect_timeout_s=connect_timeout_s)
        gate = asyncio.Event()
        self.gates.append(gate)

        async def next_chunk() -> bytes:
            await gate.wait()
            return b""

        response.next_chunk = next_chunk  # type: ignore[method-assign]
        return response


POLICY = """\
version: 1
resilience: {admission: {max_inflight_per_replica: 2, retry_after_s: 2, share_wait_s: 5}}
routing: {strategy: round_robin}
pools: {main: {served_model: m, replicas: [{url: "http://a.test:1"}]}}
models: {main: {pool: main}}
tenants: {a: {}, b: {}}
"""


BODY = orjson.dumps({"model": "main", "messages": [{"role": "user", "content": "x"}],
                     "stream": True})  # fmt: skip


def _context(tenant: str) -> RequestContext:
    return RequestContext("r", access=TenantAccess(tenant))


def _held_pipeline() -> tuple[Pipeline, _Held]:
    """A pipeline of POLICY whose engine holds every stream open until its gate opens."""
    policy = parse_policy(POLICY)
    upstream = _Held()
    pipeline = Pipeline(
        policy, Fleet(policy), RoundRobinRouter(), upstream,
        fingerprints=MemoryFingerprints(), metrics=GatewayMetrics(),
    )  # fmt: skip
    return pipeline, upstream


async def test_a_waiting_request_gets_the_slot_the_hog_gives_back() -> None:
    pipeline, upstream = _held_pipeline()
    held = [render(await pipeline.handle(Endpoint.chat, BODY, _context("a"))) for _ in range(2)]
    with pytest.raises(Overloaded) as shed:  # a holds the pool: its next request is shed
        await pipeline.handle(Endpoint.chat, BODY, _context("a"))
    assert shed.value.headers["Retry-After"] == "2"
    waiting = asyncio.create_task(pipeline.handle(Endpoint.chat, BODY, _context("b")))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # b waits in line instead of being shed
    with pytest.raises(Overloaded):  # and a cannot jump it
        await pipeline.handle(Endpoint.chat, BODY, _context("a"))
    upstream.gates[0].set()  # one of a's streams ends ...
    async for _ in held[0].body_iterator:  # type: ignore[attr-defined]
        pass
    await asyncio.wait_for(waiting, 2)  # ... and b takes its slot
    assert len(upstream.calls) == 3
    for gate in upstream.gates:
        gate.set()


async def test_a_request_finding_room_and_its_own_tenant_in_line_waits_its_turn() -> None:
    """Slots given back wake the line's first ticket, which takes its slot when it next
    runs. A request of the same tenant arriving in between finds room, but the line ahead
    of it, and nobody else holding: it waits its turn, it is not shed (the flaky
    tests/fault/test_tenant_flood.py: one of B's requests got 429 that way)."""
    pipeline, upstream = _held_pipeline()
    held = [render(await pipeline.handle(Endpoint.chat, BODY, _context("a"))) for _ in range(2)]
    waiting = [asyncio.create_task(pipeline.handle(Endpoint.chat, BODY, _context("b")))
               for _ in range(2)]  # fmt: skip
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in waiting)  # both in line behind a's streams
    for gate, stream in zip(upstream.gates, held, strict=True):
        gate.set()
        async for _ in stream.body_iterator:  # type: ignore[attr-defined]
            pass
    # a holds nothing now, and b's tickets have not run yet to take the free slots.
    third = asyncio.create_task(pipeline.handle(Endpoint.chat, BODY, _context("b")))
    await asyncio.sleep(0.2)
    assert not third.done() or third.exception() is None
    for served in await asyncio.wait_for(asyncio.gather(*waiting), 2):
        for gate in upstream.gates:
            gate.set()
        async for _ in render(served).body_iterator:  # type: ignore[attr-defined]
            pass  # b's first two streams end: the third takes a slot
    render(await asyncio.wait_for(third, 2))
    assert len(upstream.calls) == 5
    for gate in upstream.gates:
        gate.set()
