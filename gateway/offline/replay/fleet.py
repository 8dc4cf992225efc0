"""K gateway processes behind an L4 balancer, replayed over the same simulated replicas.

Each gateway is its own router (built as the gateway builds it) with its own view of the
pool: its own prefix index and load tracker, and its own in-flight counts (a live gateway
counts only the requests it sent). The balancer in front knows nothing of prompts: it
picks a gateway at random (seeded) or in turn.

Sharing, as issue 24 designs it:

- `none`: today; each gateway believes only what it sent.
- `placements`: after a dispatch the gateway queues the placement (replica, the request's
  block hashes, the work it added); its publisher flushes the queue every `batch_s` of
  trace time (at multiples of `batch_s`), and `lag_s` later (the Redis XADD -> XREAD
  round trip, measured by stream_lag.py) every other gateway applies it to its own index
  and load tracker, as gateway/sharing/ does. Session homes are not shared: they agree
  through rendezvous hashing. The in-flight counts gateway/sharing/ also shares (each
  gateway writes its own and reads the others' at every flush) feed each router's queue
  cost (`CacheAwareRouter.peer_inflight`): a gateway sees the others' requests as they
  stood at the flush before its last read, `lag_s` earlier (`InflightBoard`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from gateway.fleet.replicas import Replica
from gateway.routing.costs import RouteRequest
from gateway.routing.router import ReplicaChoice, Router, none_elsewhere, placed_work

Balancer = Literal["random", "round_robin"]
Sharing = Literal["none", "placements"]
BALANCERS: tuple[Balancer, ...] = ("random", "round_robin")
SHARINGS: tuple[Sharing, ...] = ("none", "placements")


@dataclass(frozen=True)
class FleetConfig:
    gateways: int = 1
    balancer: Balancer = "random"
    sharing: Sharing = "none"
    batch_s: float = 0.0  # publisher flush interval; 0 = each placement on its own
    lag_s: float = 0.0  # from a flush until the other gateways have applied it
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gateways < 1:
            raise ValueError("gateways must be at least 1")
        if self.batch_s < 0 or self.lag_s < 0:
            raise ValueError("batch and lag must not be negative")


def pool_of(replicas: int) -> list[Replica]:
    """One gateway's replica objects; ids agree across gateways (same pool, same URLs)."""
    return [Replica("replay", f"http://replica-{i}.replay", "replay") for i in range(replicas)]


@dataclass
class Gateway:
    router: Router
    pool: list[Replica]
    finishes: list[list[float]]  # per replica: when the requests this gateway sent end

    def count_inflight(self, now: float) -> None:
        for replica, ends in zip(self.pool, self.finishes, strict=True):
            ends[:] = [t for t in ends if t > now]
            replica.inflight = len(ends)


@dataclass
class InflightBoard:
    """Every gateway's requests in flight, for what the others believe of them: the
    counts a gateway publishes at each flush, read by the others at theirs, `lag_s` on.
    A reader at `now` sees the counts of the flush before its last read, at the latest
    `batch_s + lag_s` old."""

    config: FleetConfig
    _sent: list[tuple[int, str, float, float]] = field(default_factory=list)

    def add(self, origin: int, replica: str, start: float, end: float) -> None:
        if self.config.sharing == "placements" and self.config.gateways > 1:
            self._sent.append((origin, replica, start, end))

    def seen_by(self, reader: int, now: float) -> Callable[[str], int]:
        if not self._sent:
            return none_elsewhere
        batch, lag = self.config.batch_s, self.config.lag_s
        at = math.floor((now - lag - batch) / batch) * batch if batch else now - lag
        self._sent = [entry for entry in self._sent if entry[3] > at]  # ended: gone for all
        counts: dict[str, int] = {}
        for origin, replica, start, end in self._sent:
            if origin != reader and start <= at < end:
                counts[replica] = counts.get(replica, 0) + 1
        return lambda replica: counts.get(replica, 0)


def balancer(config: FleetConfig) -> Callable[[], int]:
    """Which gateway takes the next request."""
    if config.balancer == "round_robin":
        turn = itertools.count()
        return lambda: next(turn) % config.gateways
    rng = random.Random(config.seed)
    return lambda: rng.randrange(config.gateways)


@dataclass(frozen=True)
class Placement:
    """What a gateway publishes after a dispatch (gateway/sharing/placements.py carries
    the same: replica, block hashes, the work it added, the conversation), plus who sent
    it."""

    origin: int
    replica: str
    blocks: tuple[int, ...]
    work: float
    session: int | None = None


@runtime_checkable
class Learner(Protocol):
    """A router that can take another gateway's placement (CacheAwareRouter.learn)."""

    def learn(
        self, replica_id: str, blocks: Sequence[int], work: float, session: int | None = None
    ) -> None: ...


def placement_of(origin: int, decision: ReplicaChoice, request: RouteRequest) -> Placement:
    return Placement(
        origin, decision.replica.id, request.blocks, placed_work(decision), request.session_hash
    )


def apply_placement(router: Router, placement: Placement) -> None:
    # The call gateway/sharing/ makes: index, recent work and session home. A router that
    # keeps no such record (round-robin) has nothing to learn.
    if isinstance(router, Learner):
        router.learn(placement.replica, placement.blocks, placement.work, placement.session)


@dataclass
class PlacementBus:
    """Placements in flight between gateways, in trace time."""

    config: FleetConfig
    _pending: list[tuple[float, int, Placement]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    delivered: int = 0

    def publish(self, now: float, placement: Placement) -> None:
        if self.config.sharing == "none" or self.config.gateways == 1:
            return
        batch = self.config.batch_s
        flushed = math.ceil(now / batch) * batch if batch else now
        heapq.heappush(self._pending, (flushed + self.config.lag_s, next(self._order), placement))

    def deliver_until(
        self, now: float, gateways: Sequence[Gateway], set_clock: Callable[[float], None]
    ) -> None:
        """Apply, in arrival order, every placement that has reached the others by `now`;
        each at its own arrival time, so load decays as it would have."""
        while self._pending and self._pending[0][0] <= now:
            arrives, _, placement = heapq.heappop(self._pending)
            set_clock(arrives)
            for index, gateway in enumerate(gateways):
                if index != placement.origin:
                    apply_placement(gateway.router, placement)
            self.delivered += 1


def parse_counts(text: str) -> tuple[int, ...]:
    """`1,2,4,8` -> (1, 2, 4, 8): the gateway counts of one report."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--gateways wants counts like 1,2,4,8, not {text!r}") from None
    if any(k < 1 for k in counts):
        raise ValueError(f"--gateways counts must be at least 1, not {text!r}")
    return counts


def parse_sharings(text: str) -> tuple[Sharing, ...]:
    chosen = tuple(part.strip() for part in text.split(","))
    unknown = [part for part in chosen if part not in SHARINGS]
    if unknown:
        raise ValueError(f"--sharing takes {' or '.join(SHARINGS)}, not {', '.join(unknown)}")
    return tuple(s for s in SHARINGS if s in chosen)
