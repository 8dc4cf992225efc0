"""The other gateways' in-flight counts per replica, as they last published them.

Each gateway writes one field of a pool's in-flight hash (gateway/state/keys.py): its
instance id -> `{"n": round, "c": {replica id: in flight}, "t": {replica id: {tenant: in
flight}}}`. The per-tenant counts let fair admission (gateway/resilience/fair_share.py)
see a tenant that floods through another gateway; a field without them (a gateway of an
earlier version) counts toward the totals only. Whether a field is current is
judged by its round number advancing, timed on the reader's own clock: a gateway that
stopped (or lost Redis) leaves a field whose round no longer moves, and after
`inflight_ttl_s` it stops counting. No two hosts' clocks are compared. The hash itself
expires after the same time without writes, so a fleet that is gone leaves nothing behind.

Eventually consistent: a count is as old as the writer's flush interval plus a Redis round
trip, so two gateways that admit at the same instant can together exceed the limit by
what they admitted within that window. Pure: the caller does the Redis I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

# replica id -> tenant -> requests in flight
TenantCounts = Mapping[str, Mapping[str, int]]
_NONE: Mapping[str, int] = {}


def encode_counts(round_no: int, counts: Mapping[str, int], tenants: TenantCounts) -> bytes:
    return orjson.dumps({"n": round_no, "c": counts, "t": tenants})


class PeerInflight:
    """In flight per replica at the other gateways (this one's own field is skipped)."""

    def __init__(self, own: str, ttl_s: float, clock: Callable[[], float]) -> None:
        self._own = own
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: dict[str, tuple[int, float]] = {}  # gateway -> (round, when it moved)
        self._by_pool: dict[str, dict[str, int]] = {}  # pool -> replica id -> peers' sum
        self._totals: dict[str, int] = {}  # replica id -> peers' sum (ids name their pool)
        self._tenants_by_pool: dict[str, dict[str, dict[str, int]]] = {}  # pool -> the same
        self._tenants: dict[str, dict[str, int]] = {}  # replica id -> tenant -> peers' sum
        self._peers_by_pool: dict[str, int] = {}  # pool -> gateways counted at its last read

    def get(self, replica_id: str) -> int:
        return self._totals.get(replica_id, 0)

    def tenants(self, replica_id: str) -> Mapping[str, int]:
        """The other gateways' requests in flight at the replica, per tenant."""
        return self._tenants.get(replica_id, _NONE)

    def any_peers(self) -> bool:
        """Whether another gateway renewed its field within `inflight_ttl_s`, as of the
        last read of any pool."""
        return any(self._peers_by_pool.values())

    def update(self, pool: str, fields: Mapping[bytes, bytes]) -> list[bytes]:
        """The pool's hash as just read (HGETALL). Returns the fields of gateways that
        have not renewed theirs for `inflight_ttl_s`, for the caller to delete: a stopped
        gateway's field would otherwise stay as long as any other gateway writes."""
        now = self._clock()
        totals: dict[str, int] = {}
        tenants: dict[str, dict[str, int]] = {}
        stale: list[bytes] = []
        peers = 0
        for raw_gateway, raw in fields.items():
            gateway = raw_gateway.decode(errors="replace")
            if gateway == self._own:
                continue
            try:
                value = orjson.loads(raw)
                round_no, counts = int(value["n"]), dict(value["c"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                stale.append(raw_gateway)  # not a field this code writes
                continue
            seen = self._seen.get(gateway)
            if seen is None or seen[0] != round_no:
                self._seen[gateway] = seen = (round_no, now)
            if now - seen[1] > self._ttl_s:
                stale.append(raw_gateway)
                del self._seen[gateway]
                continue
            peers += 1
            for replica, count in counts.items():
                if isinstance(count, int) and count > 0:
                    totals[str(replica)] = totals.get(str(replica), 0) + count
            _add_tenants(tenants, value.get("t"))
        self._by_pool[pool] = totals
        self._tenants_by_pool[pool] = tenants
        self._peers_by_pool[pool] = peers
        self._sum()
        return stale

    def clear(self) -> None:
        """Redis does not answer: count only this gateway's own (fail open)."""
        self._by_pool.clear()
        self._tenants_by_pool.clear()
        self._totals = {}
        self._tenants = {}

    def _sum(self) -> None:
        totals: dict[str, int] = {}
        tenants: dict[str, dict[str, int]] = {}
        for pool, counts in self._by_pool.items():
            totals.update(counts)  # replica ids are unique across pools
            tenants.update(self._tenants_by_pool.get(pool, {}))
        self._totals = totals
        self._tenants = tenants


def _add_tenants(into: dict[str, dict[str, int]], raw: object) -> None:
    """One peer's per-tenant counts added in; anything else in their place is ignored
    (the totals still count)."""
    if not isinstance(raw, dict):
        return
    for replica, per_tenant in raw.items():
        if not isinstance(per_tenant, dict):
            continue
        held = into.setdefault(str(replica), {})
        for tenant, count in per_tenant.items():
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                held[str(tenant)] = held.get(str(tenant), 0) + count
