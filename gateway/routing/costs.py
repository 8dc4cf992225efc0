"""Candidates, filters and costs: small pure functions over facts gathered beforehand.

Everything is measured in prefill blocks, so weights from the policy read as exchange
rates: `load: 1.0` means a block of recent work that a replica runs ahead of the others
counts as much as a block that would have to be recomputed there. The chosen replica
has the lowest weighted sum: where this request's prefill is expected to cost least and
start soonest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from gateway.fleet.replicas import Replica
from gateway.tenants.identity import DEFAULT_TENANT


@dataclass(frozen=True)
class RouteRequest:
    blocks: tuple[int, ...]  # chained prefix block hashes (gateway/prompt/blocks.py)
    session: str | None = None
    tenant: str = DEFAULT_TENANT  # whose session: what is remembered about it is per tenant

    @cached_property
    def session_hash(self) -> int | None:
        """The conversation as routers remember it: a 64-bit hash of tenant and session
        name, so equal names of two tenants are two conversations, and what gateways
        share about a session (gateway/sharing/) carries no client text. Computed once:
        choosing, recording and publishing all read it."""
        if self.session is None:
            return None
        named = f"{self.tenant}\x1f{self.session}".encode()
        return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "little")


class Candidate(NamedTuple):
    """What is known about one replica when a request arrives; gathered before scoring.
    (A named tuple: immutable like a frozen dataclass, at a fifth of the cost to build,
    and eight are built per request.)"""

    replica: Replica
    cached_blocks: int  # leading blocks of this request the replica is believed to hold
    recent_work: float  # decayed prefill work recently sent to it (routing/load.py)
    # How far recent_work, with this request's prefill there added, is above the
    # tolerated mean of the candidates' recent work.
    excess_work: float
    queued: int  # in flight from every gateway (as last shared) plus waiting in the engine
    kv_usage: float  # engine's KV cache usage, 0..1 (scraped /metrics)
    session_home: bool  # the replica this request's session belongs to
    # For a conversation's first request: its leading blocks that many conversations
    # began with, priced as held everywhere (routing/openings.py); else 0.
    shared_opening: int = 0


# A cost prices every candidate at once (one call per cost, not one per replica: the
# routing decision is on every request's path).
Cost = Callable[[RouteRequest, Sequence[Candidate]], list[float]]
Filter = Callable[[RouteRequest, Sequence[Candidate]], list[Candidate]]


def prefix_cost(request: RouteRequest, candidates: Sequence[Candidate]) -> list[float]:
    """Blocks each replica would have to prefill, plus one for the request itself; a new
    conversation's shared opening counts as held everywhere (it decides nothing)."""
    whole = len(request.blocks) + 1
    return [float(whole - max(c.cached_blocks, c.shared_opening)) for c in candidates]


def load_cost(request: RouteRequest, candidates: Sequence[Candidate]) -> list[float]:
    """Recent work, with this request's prefill added, above the tolerated mean. Below it
    load is noise, and letting noise outbid a cache hit moves agents between replicas for
    nothing; counting the request's own prefill sends a long uncached prompt to the
    replica it leaves least loaded (imbalance p95 on the Mooncake replay: docs/benchmarks/
    scale-out.md)."""
    return [c.excess_work for c in candidates]


def queue_cost(request: RouteRequest, candidates: Sequence[Candidate]) -> list[float]:
    return [float(c.queued) for c in candidates]


def session_cost(request: RouteRequest, candidates: Sequence[Candidate]) -> list[float]:
    """1 for leaving the session's replica; nothing for requests without a session."""
    if request.session is None:
        return [0.0] * len(candidates)
    return [0.0 if c.session_home else 1.0 for c in candidates]


COSTS: dict[str, Cost] = {
    "prefix": prefix_cost,
    "load": load_cost,
    "queue": queue_cost,
    "session": session_cost,
}


def not_saturated(max_waiting: int, max_kv_usage: float) -> Filter:
    """Drop replicas whose engine is full, unless every replica is."""

    def keep(request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        fine = [c for c in candidates if c.queued < max_waiting and c.kv_usage < max_kv_usage]
        return fine or list(candidates)

    return keep


def bounded_load(max_factor: float, slack_blocks: float) -> Filter:
    """Drop replicas whose recent work is far above the mean of the *other* replicas, so a
    hot prefix cannot pile onto one replica while others idle. (Against the mean of all
    replicas, one hot replica among two could never exceed twice the mean.) The slack
    keeps a quiet system from bouncing."""

    def keep(request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        if len(candidates) < 2:
            return list(candidates)
        total = sum(c.recent_work for c in candidates)
        others = len(candidates) - 1
        fine = [
            c
            for c in candidates
            if c.recent_work <= max_factor * (total - c.recent_work) / others + slack_blocks
        ]
        return fine or list(candidates)

    return keep
