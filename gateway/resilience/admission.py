"""Admission: which of a pool's replicas a request may be sent to now, and what happens
when none has room.

A replica is a candidate when it is healthy, its breaker admits a request, and it has
room: in flight under `max_inflight_per_replica` counting every gateway's requests, and
the engine's own queue under `routing.max_waiting`. When every candidate is full, a
request its tenant's share entitles to wait waits in line for a slot
(gateway/resilience/fair_share.py); any other waits a bounded time or is shed with a 429,
per `admission.on_saturated`, instead of piling onto a drowning engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.errors import NoHealthyReplica, Overloaded
from gateway.fleet.engine_metrics import EngineLoad
from gateway.fleet.replicas import Pool, Replica
from gateway.policy import Policy
from gateway.resilience.breaker import Breakers
from gateway.resilience.fair_share import FairQueue, PeerTenants, Ticket
from gateway.telemetry.metrics import GatewayMetrics


class Admission:
    def __init__(
        self,
        policy: Policy,
        metrics: GatewayMetrics,
        breakers: Breakers,
        engine_load: Callable[[str], EngineLoad | None],
        peer_inflight: Callable[[str], int],
        peer_tenants: PeerTenants,
    ) -> None:
        """`peer_inflight`: a replica's requests in flight from the other gateway processes,
        as they last published them (gateway/sharing/); `peer_tenants`: the same per
        tenant, for fair admission."""
        # The policy's sections admission reads, bound once (a new policy builds a new one).
        self._spec = policy.resilience.admission
        self._max_waiting = policy.routing.max_waiting
        self._none_healthy_retry_after_s = policy.health.retry_after_s
        self._metrics = metrics
        self._breakers = breakers
        self._engine_load = engine_load
        self._peer_inflight = peer_inflight
        self._peer_tenants = peer_tenants
        self._weights = {name: spec.share for name, spec in policy.tenants.items()}
        self._lines: dict[str, FairQueue] = {}  # per pool: who waits for a slot

    def line(self, pool: Pool) -> FairQueue:
        """The pool's line: who waits for a slot."""
        line = self._lines.get(pool.name)
        if line is None:
            line = self._lines[pool.name] = FairQueue(self._weights, self._peer_tenants)
        return line

    async def admitted(self, pool: Pool, model: str, tenant: str, line: FairQueue) -> list[Replica]:
        """The replicas a request may go to now. When every one is full: a request its
        tenant's share entitles to wait waits in line for a slot
        (gateway/resilience/fair_share.py); any other waits or is shed, per policy."""
        admission = self._spec
        loop = asyncio.get_running_loop()
        now = loop.time()
        until, line_until = now + admission.wait_s, now + admission.share_wait_s
        ticket: Ticket | None = None
        try:
            while True:
                healthy = [r for r in pool.replicas if r.healthy and self._breakers.of(r).admits()]
                if not healthy:
                    raise self.none_healthy(model)
                roomy = [r for r in healthy if not self._full(r)]
                if roomy and line.may_take(pool.replicas, ticket):
                    return roomy
                now = loop.time()
                if ticket is None:
                    capacity = len(healthy) * admission.max_inflight_per_replica
                    # With room, the line is only ahead of this request while its first
                    # tickets are woken to take the free slots: it waits its turn. Only a
                    # full pool is shared out (else a tenant's request arriving while its
                    # own earlier ones were being woken was shed).
                    if roomy or line.may_wait(pool.replicas, tenant, capacity):
                        ticket = line.join(tenant)
                        self._metrics.admission_waits.labels(pool.name, tenant).inc()
                    elif admission.on_saturated == "reject" or now >= until:
                        raise self._shed(pool, model, tenant)
                if ticket is not None:
                    if now >= line_until:
                        raise self._shed(pool, model, tenant)
                    await line.wait(ticket, line_until - now)
                else:
                    await asyncio.sleep(0.02)
        finally:
            if ticket is not None:
                line.leave(ticket)
                line.released(pool.replicas)  # the next in line may take what this left

    def _shed(self, pool: Pool, model: str, tenant: str) -> Overloaded:
        self._metrics.shed.labels(pool.name).inc()
        self._metrics.shed_by_tenant.labels(pool.name, tenant).inc()
        return Overloaded(
            f"Every replica of model `{model}` is at capacity; retry shortly.",
            retry_after_s=self._spec.retry_after_s,
        )

    def _full(self, replica: Replica) -> bool:
        """At `max_inflight_per_replica` counting every gateway's requests, or the engine's
        queue at `routing.max_waiting`. The other gateways' share is eventually consistent:
        as old as their last flush (`routing.sharing.flush_ms`) plus a Redis round trip, so
        gateways admitting within that window can together pass the limit by what each
        admitted in it."""
        inflight = replica.inflight + self._peer_inflight(replica.id)
        if inflight >= self._spec.max_inflight_per_replica:
            return True
        engine = self._engine_load(replica.url)
        return engine is not None and engine.waiting >= self._max_waiting

    def none_healthy(self, model: str) -> NoHealthyReplica:
        return NoHealthyReplica(
            f"No healthy replica is available for model `{model}`; try again shortly.",
            retry_after_s=self._none_healthy_retry_after_s,
        )
