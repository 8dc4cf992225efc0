"""Prometheus metrics, one registry per app (no process-global state).

Per-request figures (requests, latencies, tokens, money) are updated once per request,
after its response, from its record (gateway.telemetry); the per-replica gauges (breaker
state, in flight, what the engines report) are read at scrape time by a collector. Every
name is listed in the README.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

# Latency buckets (seconds): engines on this kind of machine answer in tens of ms to
# minutes; the gateway's own share is meant to stay under a millisecond.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


_Labelled = TypeVar("_Labelled", Counter, Histogram)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # see `child`
        self.requests = Counter(
            "gateway_requests",
            "API requests by model alias, the tier that served them and HTTP status.",
            ["model", "tier", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Whole request, until its last byte was sent.",
            ["model", "tier"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: until the first event of the answer was sent to the client.",
            ["model", "tier"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Time spent in the gateway itself: the whole request less the time waiting on engines.",
            ["model"],
            buckets=_OVERHEAD_BUCKETS,
            registry=self.registry,
        )
        token_labels = ["tenant", "model", "tier"]
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens",
            "Prompt tokens as the engines counted them.",
            token_labels,
            registry=self.registry,
        )
        self.cached_prompt_tokens = Counter(
            "gateway_cached_prompt_tokens",
            "Prompt tokens the engines served from their prefix cache.",
            token_labels,
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens as the engines counted them.",
            token_labels,
            registry=self.registry,
        )
        self.cost = Counter(
            "gateway_cost_usd",
            "What the tokens cost at the policy's prices, in US dollars.",
            token_labels,
            registry=self.registry,
        )
        self.savings = Counter(
            "gateway_savings_usd",
            "Money saved, by source: cache (cached prompt tokens), trimming (tokens removed "
            "from contexts), small_tier (answered by a cheaper tier than the dearest).",
            ["tenant", "model", "source"],
            registry=self.registry,
        )
        self.trimmed_tokens = Counter(
            "gateway_trimmed_tokens",
            "Context tokens trimming removed before the engine saw them.",
            ["model"],
            registry=self.registry,
        )
        self.route_decisions = Counter(
            "gateway_route_decisions",
            "Replica choices, by pool and the reason that decided them.",
            ["pool", "reason"],
            registry=self.registry,
        )
        self.route_engine_evicted = Counter(
            "gateway_route_engine_evicted",
            "Replica choices where the replica's KV events said it had evicted part of the "
            "conversation's last turn, so routing believed only what was left.",
            ["pool"],
            registry=self.registry,
        )
        self.prefix_blocks = Counter(
            "gateway_prefix_blocks",
            "Prompt prefix blocks routed, by pool and whether the chosen replica held them.",
            ["pool", "cached"],
            registry=self.registry,
        )
        # How well routing predicts the engine's prefix cache: for each answer with usage,
        # the prompt tokens routing expected the chosen replica to hold (its share of the
        # prompt's blocks) against what the engine reported. Mean error over prompt tokens
        # = rate(..._abs_error_tokens) / rate(..._prompt_tokens).
        self.cache_prediction_error = Counter(
            "gateway_cache_prediction_abs_error_tokens",
            "Sum of |expected - reported cached prompt tokens| of routed answers, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.cache_prediction_prompt = Counter(
            "gateway_cache_prediction_prompt_tokens",
            "Prompt tokens of the answers whose cache prediction was scored, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.prefix_changes = Counter(
            "gateway_prefix_changes",
            "Turns whose stable prefix differed from the session's previous turn, by part.",
            ["model", "part"],
            registry=self.registry,
        )

        self.checkpoints = Counter(
            "gateway_session_checkpoints",
            "Session turns checkpointed, by outcome (written, failed, over_cap: served unsaved "
            "because the tenant's stored conversations hold its limits.stored_bytes).",
            ["outcome"],
            registry=self.registry,
        )
        self.checkpoint_failures = self.checkpoints.labels("failed")
        self.checkpoints_written = self.checkpoints.labels("written")
        self.checkpoints_over_cap = self.checkpoints.labels("over_cap")

        self.context_edits = Counter(
            "gateway_context_edits",
            "Context edits a request asked for and the gateway applied before the engine saw "
            "the conversation, by API (messages, responses) and edit (clear_tool_uses, "
            "clear_thinking, compaction).",
            ["api", "edit"],
            registry=self.registry,
        )
        self.context_edit_tokens = Counter(
            "gateway_context_edit_tokens",
            "Conversation tokens those edits removed (the trimming tokenizer's count).",
            ["api", "edit"],
            registry=self.registry,
        )
        self.trims = Counter(
            "gateway_trims",
            "Session contexts trimmed, by outcome: trimmed, or untrimmed because the trimmed "
            "one failed validation (fell_back).",
            ["outcome"],
            registry=self.registry,
        )
        self.trim_patches = Counter(
            "gateway_trim_patches",
            "Entity snapshots sent as verified JSON Patches.",
            registry=self.registry,
        )
        self.trim_schema_failures = Counter(
            "gateway_trim_schema_failures",
            "Entity snapshots sent whole because they failed their declared schema.",
            registry=self.registry,
        )
        self.trim_capped = Counter(
            "gateway_trim_capped",
            "Compactions the engine's context forced: the session's history had passed the "
            "trimming budget's share of the engine's context window.",
            registry=self.registry,
        )

        self.tier_decisions = Counter(
            "gateway_tier_decisions",
            "Requests by model alias, the tier that served them and what decided it "
            "(explicit, rule, cascade, router, session, default, escalation).",
            ["model", "tier", "by"],
            registry=self.registry,
        )
        self.shadow_decisions = Counter(
            "gateway_shadow_decisions",
            "A shadow router's decisions (after the answer), by whether the live router "
            "chose the same tier: agreed, differed, or no_live (the route's router is off).",
            ["model", "agreement"],
            registry=self.registry,
        )
        self.feedback = Counter(
            "gateway_feedback",
            "Scores given to served requests through POST /v1/feedback, by tenant.",
            ["tenant"],
            registry=self.registry,
        )
        self.cascades = Counter(
            "gateway_cascades",
            "Checked answers by outcome: passed on the first tier, escalated (passed or "
            "not on the next), or failed (returned as an error).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "gateway_tool_calls",
            "Tool calls engines made, by what became of them: valid, repaired, reasked "
            "(asked again), escalated (one tier up), refused (the agent told), held (for a "
            "person's approval by an analyzer) (gateway/toolcalls/).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.tool_call_problems = Counter(
            "gateway_tool_call_problems",
            "Invalid tool calls by problem: unknown_tool, invalid_json, not_an_object, "
            "schema, denied, no_tool_call, tool_not_allowed; and repairs made: code_fence, "
            "closed_json, coerced.",
            ["model", "problem"],
            registry=self.registry,
        )
        self.output_check_failures = Counter(
            "gateway_output_check_failures",
            "Answers that failed a check, by tier and check.",
            ["model", "tier", "check"],
            registry=self.registry,
        )

        self.breaker_transitions = Counter(
            "gateway_breaker_transitions",
            "Circuit breaker state changes, by replica and the state entered "
            "(open, half-open, closed: recovered).",
            ["replica", "state"],
            registry=self.registry,
        )
        self.retries = Counter(
            "gateway_retries",
            "Requests sent again (another replica where one exists) before any byte "
            "reached the client, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.shed = Counter(
            "gateway_shed",
            "Requests answered 429 because every replica of the pool was at capacity.",
            ["pool"],
            registry=self.registry,
        )
        self.shed_by_tenant = Counter(
            "gateway_tenant_shed",
            "The same 429s by pool and tenant: a tenant at or above its share of a saturated "
            "pool is shed first (gateway/resilience/fair_share.py).",
            ["pool", "tenant"],
            registry=self.registry,
        )
        self.admission_waits = Counter(
            "gateway_admission_waits",
            "Requests that waited in line for a slot because the pool was full and their "
            "tenant was below its share, by pool and tenant.",
            ["pool", "tenant"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "gateway_fallbacks",
            "Requests served by a fallback model, by the model asked for and the fallback.",
            ["model", "fallback"],
            registry=self.registry,
        )
        self.output_capped = Counter(
            "gateway_output_limit_capped",
            "Requests whose output-token limit was above the pool's whole context window "
            "and was sent as the window, by model and pool.",
            ["model", "pool"],
            registry=self.registry,
        )

        # Human approval of tool calls (gateway/approvals/).
        self.approvals = Counter(
            "gateway_approvals",
            "Approval events by tenant: held, approved, denied, expired, released (an "
            "approved call given to the agent), denial_returned, expiry_returned.",
            ["tenant", "event"],
            registry=self.registry,
        )

        # Rate limits and budgets (gateway/quota/).
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused with 429 by a rate limit, by tenant and the limit "
            "(tenant.requests_per_minute, tenant.tokens_per_minute, key.requests_per_minute, "
            "key.tokens_per_minute).",
            ["tenant", "limit"],
            registry=self.registry,
        )
        self.budget_exceeded = Counter(
            "gateway_budget_exceeded",
            "Requests over their tenant's budget, by the limit (tokens_per_day, "
            "tokens_per_month, usd_per_day, usd_per_month) and action (rejected, downgraded).",
            ["tenant", "limit", "action"],
            registry=self.registry,
        )
        self.stored_bytes = Gauge(
            "gateway_tenant_stored_bytes",
            "Bytes the tenant's stored conversations hold in Redis, as this gateway last "
            "counted them (tenants with limits.stored_bytes only; 429 stored_bytes_exceeded "
            "at the limit).",
            ["tenant"],
            registry=self.registry,
        )
        self.quota_store_failures = Counter(
            "gateway_quota_store_failures",
            "Quota calls Redis did not answer, by outcome: served (unmetered, fail open), "
            "refused (503, fail closed), unsettled (a finished request's estimate kept).",
            ["outcome"],
            registry=self.registry,
        )

        # Routing shared between gateway processes (gateway/sharing/).
        self.sharing_up = Gauge(
            "gateway_routing_sharing_up",
            "1 while placements and in-flight counts reach the other gateways through Redis; "
            "0 when Redis does not answer and this gateway routes on its own view.",
            registry=self.registry,
        )
        self.sharing_placements = Counter(
            "gateway_routing_placements",
            "Placements shared between gateways, by outcome: published (written to Redis), "
            "applied (another gateway's, learned here), dropped (queued while Redis was "
            "down and discarded, or naming a replica this gateway does not know), alone (not "
            "written: no other gateway was there at the last read).",
            ["outcome"],
            registry=self.registry,
        )
        self.sharing_lag = Histogram(
            "gateway_routing_sharing_lag_seconds",
            "From another gateway's dispatch to its placement being applied here (wall "
            "clocks of two hosts: includes their skew).",
            buckets=_OVERHEAD_BUCKETS,
            registry=self.registry,
        )

        # The engines' KV-cache events (gateway/fleet/kv_events.py), by replica id.
        self.kv_events = Counter(
            "gateway_engine_kv_events",
            "KV-cache events received from the engines, by replica and type (BlockStored, "
            "BlockRemoved, AllBlocksCleared, other: a type this gateway does not know).",
            ["replica", "type"],
            registry=self.registry,
        )
        self.kv_malformed_frames = Counter(
            "gateway_engine_kv_malformed_frames",
            "KV-event messages that did not decode, skipped, by replica.",
            ["replica"],
            registry=self.registry,
        )
        self.kv_gaps = Counter(
            "gateway_engine_kv_gaps",
            "Jumps in a replica's KV-event sequence numbers (messages missed).",
            ["replica"],
            registry=self.registry,
        )
        self.kv_replays = Counter(
            "gateway_engine_kv_replays",
            "Missed KV events asked of a replica's replay socket, by outcome: complete, "
            "partial (no longer buffered), timeout, unavailable (no replay socket).",
            ["replica", "outcome"],
            registry=self.registry,
        )
        self.kv_forgotten = Counter(
            "gateway_engine_kv_forgotten",
            "Times routing forgot a replica's prefix cache on its engine's word, by reason: "
            "cleared (AllBlocksCleared), restart (sequence numbers began again), reconnect.",
            ["replica", "reason"],
            registry=self.registry,
        )
        self.kv_blocks_held = Gauge(
            "gateway_engine_kv_blocks",
            "KV blocks a replica's prefix cache holds, per its events (stored less removed).",
            ["replica"],
            registry=self.registry,
        )
        self.kv_subscriber_up = Gauge(
            "gateway_engine_kv_subscriber_up",
            "1 while connected to a replica's KV-event stream, else 0.",
            ["replica"],
            registry=self.registry,
        )

    def child(self, metric: _Labelled, *values: str) -> _Labelled:
        """`metric.labels(*values)`, looked up once: prometheus_client validates the values
        and takes a lock on every call (about 2 us, several per request). Only for label
        values as bounded as the series themselves: models, tiers, pools, tenants, statuses,
        reasons. (A metric lives as long as this object, so its id names it.)"""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def render(self) -> bytes:
        return generate_latest(_every_worker() or self.registry)


def _every_worker() -> CollectorRegistry | None:
    """Under `gateway serve --workers N` a scrape reaches one worker, so it answers for
    all: prometheus_client's multiprocess mode, on when `PROMETHEUS_MULTIPROC_DIR` is set
    (the supervisor sets it, gateway/edge/workers.py). Counters and histograms are summed
    over workers; gauges carry a `pid` label."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return None
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
    return registry
