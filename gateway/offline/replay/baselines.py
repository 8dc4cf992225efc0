"""Routing baselines replayed next to the gateway's router, through the same harness."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from gateway.fleet.replicas import Replica
from gateway.routing.costs import RouteRequest
from gateway.routing.index import PrefixIndex
from gateway.routing.router import ReplicaChoice, available, best_cached_share


class SGLangStyleRouter:
    """SGLang's cache-aware policy as its router documents it: when load is imbalanced
    (busiest minus idlest over `balance_abs` requests and over `balance_rel` times the
    idlest) take the least loaded worker; otherwise the worker with the longest prefix
    match if it covers more than `match_threshold` of the request, else the worker with
    the smallest cache. Load is running requests."""

    def __init__(
        self,
        cache_blocks: int,
        *,
        match_threshold: float = 0.5,
        balance_abs: int = 32,
        balance_rel: float = 1.5,
    ) -> None:
        self._index = PrefixIndex(cache_blocks)
        self._held: dict[str, set[int]] = {}
        self._capacity = cache_blocks
        self._threshold = match_threshold
        self._abs = balance_abs
        self._rel = balance_rel
        self._turn = itertools.count()

    def choose(
        self,
        replicas: Sequence[Replica],
        request: RouteRequest,
        exclude: frozenset[Replica] = frozenset(),
    ) -> ReplicaChoice | None:
        healthy = available(replicas, exclude)
        if not healthy:
            return None
        loads = [r.inflight for r in healthy]
        if max(loads) - min(loads) > self._abs and max(loads) > self._rel * min(loads):
            chosen = min(healthy, key=lambda r: r.inflight)
            return ReplicaChoice(
                chosen, "load", self._index.match(chosen.id, request.blocks), len(request.blocks)
            )
        matches = [self._index.match(r.id, request.blocks) for r in healthy]
        best = max(range(len(healthy)), key=lambda i: matches[i])
        if request.blocks and matches[best] / len(request.blocks) > self._threshold:
            return ReplicaChoice(healthy[best], "prefix", matches[best], len(request.blocks))
        chosen = min(healthy, key=lambda r: len(self._held.get(r.id, ())))
        return ReplicaChoice(chosen, "smallest-cache", 0, len(request.blocks))

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        return best_cached_share(self._index, replicas, request)

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        self._index.forget(replica_id)
        self._held.pop(replica_id, None)

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None:
        replica = decision.replica.id
        self._index.record(replica, request.blocks)
        held = self._held.setdefault(replica, set())
        held.update(request.blocks)
        if len(held) > self._capacity:  # approximate the tree's size cap
            held.clear()
            held.update(request.blocks)
