"""The router the dispatcher calls when routing is shared: the runtime's own router, whose
`dispatched` hook also queues the placement for the other gateways (no I/O: the queue is
written by gateway/sharing/service.py's flush task)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.replicas import Replica
from gateway.routing.costs import RouteRequest
from gateway.routing.router import ReplicaChoice, Router, placed_work
from gateway.sharing.placements import Placement
from gateway.sharing.service import RoutingShare


class PublishingRouter:
    def __init__(self, router: Router, share: RoutingShare) -> None:
        self._router = router
        self._share = share

    def choose(
        self,
        replicas: Sequence[Replica],
        request: RouteRequest,
        exclude: frozenset[Replica] = frozenset(),
    ) -> ReplicaChoice | None:
        return self._router.choose(replicas, request, exclude)

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None:
        self._router.dispatched(decision, request)
        replica = decision.replica
        placement = Placement(
            replica.id, request.blocks, placed_work(decision), request.session_hash
        )
        self._share.placed(replica.pool, placement)

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        self._router.forget(replica_id, keep_since)

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        return self._router.cached_share(replicas, request)
