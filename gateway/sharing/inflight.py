"""The other gateways' in-flight counts per replica, as they last published them.

Each gateway writes one field of a pool's in-flight hash (gateway/state/keys.py): its
instance id -> `{"n": round, "c": {replica id: in flight}}`. Whether a field is current is
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


def encode_counts(round_no: int, counts: Mapping[str, int]) -> bytes:
    return orjson.dumps({"n": round_no, "c": counts})


class PeerInflight:
    """In flight per replica at the other gateways (this one's own field is skipped)."""

    def __init__(self, own: str, ttl_s: float, clock: Callable[[], float]) -> None:
        self._own = own
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: dict[str, tuple[int, float]] = {}  # gateway -> (round, when it moved)
        self._by_pool: dict[str, dict[str, int]] = {}  # pool -> replica id -> peers' sum
        self._totals: dict[str, int] = {}  # replica id -> peers' sum (ids name their pool)

    def get(self, replica_id: str) -> int:
        return self._totals.get(replica_id, 0)

    def update(self, pool: str, fields: Mapping[bytes, bytes]) -> list[bytes]:
        """The pool's hash as just read (HGETALL). Returns the fields of gateways that
        have not renewed theirs for `inflight_ttl_s`, for the caller to delete: a stopped
        gateway's field would otherwise stay as long as any other gateway writes."""
        now = self._clock()
        totals: dict[str, int] = {}
        stale: list[bytes] = []
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
            for replica, count in counts.items():
                if isinstance(count, int) and count > 0:
                    totals[str(replica)] = totals.get(str(replica), 0) + count
        self._by_pool[pool] = totals
        self._sum()
        return stale

    def clear(self) -> None:
        """Redis does not answer: count only this gateway's own (fail open)."""
        self._by_pool.clear()
        self._totals = {}

    def _sum(self) -> None:
        totals: dict[str, int] = {}
        for counts in self._by_pool.values():
            totals.update(counts)  # replica ids are unique across pools
        self._totals = totals
