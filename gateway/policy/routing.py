"""The policy's `routing` section: how a replica is chosen within a pool (the costs'
exchange rates, the prefix index's size, the load bounds) and what gateway processes share
to choose as one (gateway/routing/, gateway/sharing/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.policy.base import Strict


class RoutingWeights(Strict):
    """Exchange rates between costs, in prefill blocks (see gateway/routing/costs.py)."""

    prefix: float = Field(1.0, ge=0, description="Per block the replica would have to prefill.")
    load: float = Field(
        1.0,
        ge=0,
        description="Per block of recent work, with this request's prefill added, above the "
        "tolerated mean.",
    )
    queue: float = Field(
        0.25,
        ge=0,
        description="Per request in flight (from every gateway process, as last shared) "
        "or waiting at the replica.",
    )
    session: float = Field(8.0, ge=0, description="For leaving the replica the session uses.")


class SharingSpec(Strict):
    """Routing state shared between gateway processes through the state store's Redis
    (gateway/sharing/): each gateway publishes where it sent what, and learns the others'
    placements and in-flight counts; reads stay in process. Restart-only."""

    enabled: bool | None = Field(
        None,
        description="Share placements and in-flight counts with the other gateways. Unset: on "
        "when `state.redis_url` is set (a shared Redis is how several gateways meet; the "
        "embedded Redis is private to one process, so there is no one to share with).",
    )
    flush_ms: int = Field(
        10,
        ge=1,
        le=1000,
        description="How often queued placements and in-flight counts are written to Redis: "
        "the bound on how stale the other gateways' view is, less one Redis round trip.",
    )
    stream_max_entries: int = Field(
        10_000,
        ge=100,
        description="A pool's placement stream is trimmed to about this many batches "
        "(XADD MAXLEN ~): what a gateway can catch up on after a Redis outage.",
    )
    inflight_ttl_s: float = Field(
        2.0,
        gt=0,
        description="Another gateway's published in-flight counts stop counting toward "
        "`max_inflight_per_replica` when it has not renewed them for this long (it stopped "
        "or lost Redis).",
    )
    max_queued: int = Field(
        10_000,
        ge=1,
        description="Placements held while Redis does not answer; older ones are dropped.",
    )


class RoutingSpec(Strict):
    strategy: Literal["cache_aware", "round_robin"] = "cache_aware"
    block_bytes: int = Field(
        512,
        ge=64,
        multiple_of=8,
        description="Prompt bytes per prefix block (about 128 tokens); a multiple of 8.",
    )
    implicit_sessions: bool = Field(
        True,
        description="Without X-Session-Id, a chat request's first block and first message "
        "after the system prompt identify its conversation for session affinity.",
    )
    index_blocks_per_replica: int = Field(
        10_000, ge=1, description="Blocks remembered per replica: size it like the engine's cache."
    )
    load_half_life_s: float = Field(15.0, gt=0, description="Decay of the recent-work signal.")
    weights: RoutingWeights = RoutingWeights()
    max_load_factor: float = Field(
        2.0, ge=1, description="Replicas above this multiple of the mean recent work are skipped."
    )
    load_slack_blocks: float = Field(256.0, ge=0, description="Added to that bound.")
    load_tolerance: float = Field(
        0.25, ge=0, description="Recent work up to this fraction above the mean costs nothing."
    )
    shared_opening_conversations: int = Field(
        2,
        ge=0,
        description="Once this many conversations began with the same prefix blocks (a common "
        "system prompt and tools), they count as held by every replica when a new conversation "
        "is placed, so session affinity and load place it, not the first replica that held "
        "them; 0: off.",
    )
    max_waiting: int = Field(32, ge=1, description="A replica with this many queued is saturated.")
    max_kv_usage: float = Field(
        0.98, gt=0, le=1, description="KV usage at which a replica is saturated."
    )
    scrape_interval_s: float = Field(1.0, gt=0, description="How often engines' /metrics are read.")
    sharing: SharingSpec = Field(
        SharingSpec(),
        description="Placements and in-flight counts shared with the other gateway processes.",
    )
