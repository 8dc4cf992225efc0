"""Routers: `choose` a replica for a request, then `dispatched` records the choice.

`CacheAwareRouter`: filter (healthy, not saturated, bounded load), then cost every
candidate with the weighted costs of routing/costs.py, then pick the cheapest; exact ties
rotate. State that costs read (prefix index, recent load, session homes) changes only in
`dispatched`, after the request has been sent.

Several gateway replicas agree without talking per request: a session's home is the
replica it was last sent to here, or else its rendezvous-hash winner among the candidates,
which every gateway computes alike; load comes from the engines' own /metrics, which every
gateway scrapes; the prefix index, recent work and session homes are each gateway's own
record of what it sent, plus what the other gateways sent when routing is shared
(gateway/sharing/ calls `learn` with their placements).

`RoundRobinRouter` is the baseline the benchmarks compare against.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.fleet.engine_chains import Held
from gateway.fleet.engine_metrics import EngineLoad, EngineLoads
from gateway.fleet.replicas import Replica
from gateway.routing.costs import (
    COSTS,
    Candidate,
    Filter,
    RouteRequest,
    bounded_load,
    not_saturated,
)
from gateway.routing.index import PrefixIndex
from gateway.routing.load import LoadTracker
from gateway.routing.openings import ConversationOpenings

# Placements remembered per replica for `forget(keep_since=...)`: more than an engine runs
# in one step here.
_RECENT_PLACEMENTS = 256

_IDLE = EngineLoad()  # a replica not scraped (yet) counts as idle


def none_elsewhere(replica_id: str) -> int:
    """In flight from the other gateways when nothing is shared: none."""
    return 0


def _no_engine_load(url: str) -> EngineLoad | None:
    return None


def nothing_followed(tenant: str, session: str, replicas: Sequence[str]) -> dict[str, Held]:
    """What the replicas' KV events say of a conversation when none are followed."""
    return {}


# (tenant, session, replica ids) -> what each replica whose KV events are followed still
# holds of the conversation's last turn there (gateway/fleet/engine_chains.py).
EngineHeld = Callable[[str, str, Sequence[str]], dict[str, Held]]


@dataclass(frozen=True)
class ReplicaChoice:
    replica: Replica
    reason: str  # prefix | session | load | rotation
    cached_blocks: int
    total_blocks: int
    costs: dict[str, float] = field(default_factory=dict)
    # What the engine's KV events say it still holds of the conversation's previous turn
    # there (gateway/fleet/engine_chains.py); None when not known.
    engine_held: Held | None = None

    def header(self) -> str:
        return f"{self.reason}; cached_blocks={self.cached_blocks}/{self.total_blocks}"


class Router(Protocol):
    def choose(
        self, replicas: Sequence[Replica], request: RouteRequest, exclude: frozenset[Replica]
    ) -> ReplicaChoice | None: ...

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None: ...

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        """The replica's cache is gone (it left its pool, restarted, or its engine cleared
        it): drop what is known about it. `keep_since` (the router's clock): requests
        sent to it after then reached the engine after the loss, so their blocks are
        held again (gateway/fleet/kv_events.py: a clear is published only after the
        engine's next step, which runs the requests sent since its previous one)."""
        ...

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        """The share of the request's prefix blocks the best of these replicas holds."""
        ...


def available(replicas: Sequence[Replica], exclude: frozenset[Replica]) -> list[Replica]:
    """The first filter of every router: healthy, and not already tried for this request."""
    return [r for r in replicas if r.healthy and r not in exclude]


def best_cached_share(
    index: PrefixIndex, replicas: Sequence[Replica], request: RouteRequest
) -> float:
    """The share of the request's prefix blocks the best healthy replica holds."""
    healthy = available(replicas, frozenset())
    if not request.blocks or not healthy:
        return 0.0
    return max(index.match(r.id, request.blocks) for r in healthy) / len(request.blocks)


def rendezvous(key: str, replicas: Sequence[Replica]) -> Replica:
    """Highest-random-weight hashing: the same winner on every gateway, and only the keys
    of a removed replica move when the set changes."""

    def weight(replica: Replica) -> bytes:
        return hashlib.blake2b(f"{key}|{replica.id}".encode(), digest_size=8).digest()

    return max(replicas, key=weight)


@dataclass(frozen=True)
class CacheAwareSettings:
    weights: dict[str, float]
    max_waiting: int = 32
    max_kv_usage: float = 0.98
    max_load_factor: float = 2.0
    load_slack_blocks: float = 256.0
    load_tolerance: float = 0.25
    session_memory: int = 100_000
    # Conversations that must have begun with a prefix before it stops deciding where new
    # conversations go (routing/openings.py); 0 turns the rule off.
    shared_opening_conversations: int = 2


class CacheAwareRouter:
    def __init__(
        self,
        settings: CacheAwareSettings,
        index: PrefixIndex,
        load: LoadTracker,
        engine_loads: EngineLoads | None = None,
    ) -> None:
        unknown = set(settings.weights) - set(COSTS)
        if unknown:
            raise ValueError(f"unknown routing costs: {sorted(unknown)}")
        self._weights = [
            (COSTS[name], weight, name) for name, weight in settings.weights.items() if weight
        ]
        self._filters: list[Filter] = [
            not_saturated(settings.max_waiting, settings.max_kv_usage),
            bounded_load(settings.max_load_factor, settings.load_slack_blocks),
        ]
        self._settings = settings
        self._index = index
        self._load = load
        self._engine_loads = engine_loads
        # Requests the other gateway processes have in flight at a replica, as they last
        # said (gateway/sharing/); set by whoever shares them. Without it a gateway among
        # K sees a K-th of each replica's queue, and K gateways pile onto one replica.
        self.peer_inflight: Callable[[str], int] = none_elsewhere
        # What the engines' KV events say a conversation still has cached at a replica
        # (gateway/fleet/engine_chains.py); set by the runtime. It caps the index's belief
        # where the engine evicted part of the conversation.
        self.engine_held: EngineHeld = nothing_followed
        self._sessions: OrderedDict[int, str] = OrderedDict()  # session_hash -> replica id
        # The last placements per replica, for what a cache loss must not erase (`forget`).
        self._recent: dict[str, deque[tuple[float, tuple[int, ...]]]] = {}
        self._openings = ConversationOpenings(settings.shared_opening_conversations)
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
        candidates, held = self._candidates(healthy, request)
        for keep in self._filters:
            candidates = keep(request, candidates)
        totals = [0.0] * len(candidates)
        priced: dict[str, list[float]] = {}
        for cost, weight, name in self._weights:
            values = priced[name] = cost(request, candidates)
            if values.count(values[0]) != len(values):  # a flat cost cannot change the pick
                totals = [t + weight * value for t, value in zip(totals, values, strict=True)]
        best = min(totals)
        tied = [i for i, total in enumerate(totals) if total <= best + 1e-9]
        pick = tied[next(self._turn) % len(tied)] if len(tied) > 1 else tied[0]
        chosen = candidates[pick]
        return ReplicaChoice(
            replica=chosen.replica,
            reason=_reason(chosen, candidates, request, len(tied)),
            cached_blocks=chosen.cached_blocks,
            total_blocks=len(request.blocks),
            costs={name: values[pick] for name, values in priced.items()},
            engine_held=held.get(chosen.replica.id),
        )

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None:
        self.learn(decision.replica.id, request.blocks, placed_work(decision), request.session_hash)

    def learn(
        self, replica_id: str, blocks: Sequence[int], work: float, session: int | None = None
    ) -> None:
        """A request with these prefix blocks went to the replica, adding `work` to it,
        and made it the home of its conversation (`session`: RouteRequest.session_hash):
        sent from here (`dispatched`), or by another gateway (gateway/sharing/). Sharing
        homes keeps a conversation that load moved on one gateway from being sent back by
        the others."""
        if session is not None:
            sessions = self._sessions
            if session not in sessions:  # the conversation's first request anywhere
                self._openings.record(blocks)
            sessions[session] = replica_id
            sessions.move_to_end(session)
            if len(sessions) > self._settings.session_memory:
                sessions.popitem(last=False)
        self._load.add(replica_id, work)
        self._index.record(replica_id, blocks)
        recent = self._recent.get(replica_id)
        if recent is None:
            recent = self._recent[replica_id] = deque(maxlen=_RECENT_PLACEMENTS)
        recent.append((self._load.now(), tuple(blocks)))

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        # Session homes naming it fall back to rendezvous among the replicas left.
        self._index.forget(replica_id)
        self._load.forget(replica_id)
        recent = self._recent.pop(replica_id, None)
        if keep_since is None or not recent:
            return
        kept = [(at, blocks) for at, blocks in recent if at > keep_since]
        for _, blocks in kept:
            self._index.record(replica_id, blocks)
        if kept:
            self._recent[replica_id] = deque(kept, maxlen=_RECENT_PLACEMENTS)

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        return best_cached_share(self._index, replicas, request)

    def _candidates(
        self, replicas: Sequence[Replica], request: RouteRequest
    ) -> tuple[list[Candidate], dict[str, Held]]:
        """The candidates, and per replica what its engine's events say it still holds of
        this conversation's previous turn there, where known."""
        ids = [r.id for r in replicas]
        home: str | None = None
        shared_opening = 0
        session, key = request.session, request.session_hash
        if session is not None and key is not None:
            home = self._sessions.get(key)
            if home is None:  # a new conversation: what it shares with others decides nothing
                shared_opening = self._openings.shared_lead(request.blocks)
            if home is None or home not in ids:
                home = rendezvous(session, replicas).id
        recent = self._load.recent_many(ids)
        tolerated = (1.0 + self._settings.load_tolerance) * sum(recent) / len(recent)
        match, blocks = self._index.match, request.blocks
        engine_load = self._engine_loads.get if self._engine_loads else _no_engine_load
        elsewhere = self.peer_inflight
        known = self.engine_held(request.tenant, session, ids) if session is not None else {}
        out = []
        whole = len(blocks) + 1
        for replica, rid, work in zip(replicas, ids, recent, strict=True):
            engine = engine_load(replica.url) or _IDLE
            cached = match(rid, blocks)
            if known and (held := known.get(rid)) is not None and held.evicted:
                cached = min(cached, held.turn_blocks * held.tokens // held.turn_tokens)
            # Load is priced as it would stand with this request's prefill added: a long
            # prompt no replica holds goes where it leaves the least work, not wherever
            # rotation points while every replica is within the tolerated mean.
            after = work + whole - (cached if cached > shared_opening else shared_opening)
            out.append(
                Candidate(  # positional: built for every replica on every request
                    replica,
                    cached,
                    work,
                    after - tolerated if after > tolerated else 0.0,
                    replica.inflight + elsewhere(rid) + engine.waiting,
                    engine.kv_usage,
                    rid == home,
                    shared_opening,
                )
            )
        return out, known


def placed_work(decision: ReplicaChoice) -> float:
    """The prefill work a dispatch adds to its replica, in blocks: the ones it was not
    believed to hold, plus one for the request itself (routing/load.py)."""
    return decision.total_blocks - decision.cached_blocks + 1


def _reason(
    chosen: Candidate, candidates: Sequence[Candidate], request: RouteRequest, tied: int
) -> str:
    if chosen.cached_blocks and chosen.cached_blocks >= max(c.cached_blocks for c in candidates):
        return "prefix"
    if request.session is not None and chosen.session_home:
        return "session"
    return "rotation" if tied > 1 else "load"


class RoundRobinRouter:
    def __init__(self) -> None:
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
        replica = healthy[next(self._turn) % len(healthy)]
        return ReplicaChoice(replica, "rotation", 0, len(request.blocks))

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None:
        pass

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        pass

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        return 0.0  # keeps no record of what replicas hold
