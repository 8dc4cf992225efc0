"""Fair admission across tenants when a pool's replicas are full.

First come, first served lets one tenant starve the others: a tenant sending 300
requests at once fills every slot, and every other tenant's request arriving meanwhile
is shed with 429. Instead, while a pool is saturated, each tenant is entitled to a share
of its capacity (the pool's healthy replicas times `max_inflight_per_replica`), in
proportion to its weight (`tenants.<name>.share`) among the tenants using the pool now:

- A request waits in line for the next free slot (up to `admission.share_wait_s`) while
  another tenant holds or waits for slots of the pool, if its tenant's demand (in flight
  and waiting) is below its share, or if even with it the tenant would hold no more per
  unit of weight than the biggest other holder (whose slots will come free). Slots are
  handed out to the waiting tenant holding fewest per unit of weight first (first come,
  first served within a tenant). Running requests are never cut; the line moves as they
  finish.
- Any other request of a full pool (its tenant is the one holding most, at or above its
  share) is answered per `on_saturated` (429 with Retry-After, or a bounded wait), and never
  takes a slot someone in line is waiting for.
- A request that finds room while others are in line (the slots just given back, their
  tickets not yet run to take them) waits its turn, whoever's it is: it is never shed
  for the line's sake.
- While nobody waits, the pool is work-conserving: a tenant alone may use all of it, and
  the check costs one empty-dict test.

Shares are counted from the in-flight requests each replica object carries per tenant
(they survive policy reloads with the replica), plus, when routing is shared
(gateway/sharing/), the other gateway processes' per-tenant counts as they last published
them: a tenant flooding through another gateway holds slots here too. A waiter still
learns of slots freed elsewhere only by polling (every `POLL_S`).

Nothing here tells a tenant about another's traffic beyond what a refusal implies: the
429 carries the same message whatever the reason.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.fleet.replicas import Replica

# A waiter re-checks this often even when no slot is given back: an engine's own queue
# (routing.max_waiting) drains without the gateway being told.
POLL_S = 0.05


@dataclass(eq=False)
class Ticket:
    """A request's place in line."""

    tenant: str
    order: int
    woken: asyncio.Event = field(default_factory=asyncio.Event)


# A replica id -> the other gateways' requests in flight there, per tenant.
PeerTenants = Callable[[str], Mapping[str, int]]
_NONE: Mapping[str, int] = {}


def no_peers(replica_id: str) -> Mapping[str, int]:
    """Per-tenant counts of the other gateways when nothing is shared: none."""
    return _NONE


class FairQueue:
    """The line of one pool's requests waiting for a slot, per tenant."""

    def __init__(self, weights: Mapping[str, float], peers: PeerTenants = no_peers) -> None:
        self._weights = weights
        self._peers = peers
        self._waiting: dict[str, deque[Ticket]] = {}
        self._order = itertools.count()

    def in_flight(self, replicas: Sequence[Replica], tenant: str) -> int:
        """The tenant's requests in flight over these replicas, from every gateway."""
        peers = self._peers
        return sum(r.by_tenant.get(tenant, 0) + peers(r.id).get(tenant, 0) for r in replicas)

    def _holdings(self, replicas: Sequence[Replica]) -> dict[str, int]:
        """Requests in flight per tenant over the pool's replicas, from every gateway."""
        held: dict[str, int] = {}
        for replica in replicas:
            for counts in (replica.by_tenant, self._peers(replica.id)):
                for tenant, n in counts.items():
                    held[tenant] = held.get(tenant, 0) + n
        return held

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, 1.0)

    def may_take(self, replicas: Sequence[Replica], ticket: Ticket | None) -> bool:
        """Whether a request may take a free slot now: anyone may while nobody waits;
        otherwise only the ticket first in line."""
        if not self._waiting:
            return True
        return ticket is not None and self._first_in_line(replicas) is ticket

    def may_wait(self, replicas: Sequence[Replica], tenant: str, capacity: int) -> bool:
        """Whether a request of `tenant` may wait in line for a slot of a full pool: while
        another tenant holds or waits for slots here, and either its tenant's demand (in
        flight and waiting) is below its share of `capacity`, or even with this request
        it would hold no more per unit of weight than the biggest other holder, whose
        slots will come free. A tenant alone has nobody to be treated fairly against:
        its own traffic (or the engines' own queues) fill the pool, and `on_saturated`
        decides."""
        holding = {t: n for t, n in self._holdings(replicas).items() if t != tenant}
        others = holding.keys() | (self._waiting.keys() - {tenant})
        if not others:
            return False
        weight = self.weight(tenant)
        demand = self.in_flight(replicas, tenant) + len(self._waiting.get(tenant, ()))
        total = weight + sum(self.weight(t) for t in others)
        if demand < capacity * weight / total:
            return True
        biggest = max((n / self.weight(t) for t, n in holding.items()), default=0.0)
        return (demand + 1) / weight <= biggest

    def join(self, tenant: str) -> Ticket:
        ticket = Ticket(tenant, next(self._order))
        self._waiting.setdefault(tenant, deque()).append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        line = self._waiting.get(ticket.tenant)
        if line is None:
            return
        try:
            line.remove(ticket)
        except ValueError:
            return
        if not line:
            del self._waiting[ticket.tenant]

    async def wait(self, ticket: Ticket, timeout_s: float) -> None:
        """Until a slot is given back (this ticket may be first in line) or `timeout_s`."""
        ticket.woken.clear()
        try:
            async with asyncio.timeout(min(POLL_S, max(0.0, timeout_s))):
                await ticket.woken.wait()
        except TimeoutError:
            pass

    def released(self, replicas: Sequence[Replica]) -> None:
        """A slot was given back: wake whoever is first in line to take it."""
        if self._waiting and (first := self._first_in_line(replicas)) is not None:
            first.woken.set()

    def _first_in_line(self, replicas: Sequence[Replica]) -> Ticket | None:
        """The head of the waiting tenant furthest below its share: fewest in flight per
        unit of weight, then the one waiting longest."""
        best: Ticket | None = None
        best_key = (0.0, 0)
        for tenant, line in self._waiting.items():
            head = line[0]
            key = (self.in_flight(replicas, tenant) / self.weight(tenant), head.order)
            if best is None or key < best_key:
                best, best_key = head, key
        return best
