"""Prometheus metrics, one registry per app (no process-global state).

The observability issue grows this; today it counts routing decisions and prefix changes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.route_decisions = Counter(
            "gateway_route_decisions",
            "Replica choices, by pool and the reason that decided them.",
            ["pool", "reason"],
            registry=self.registry,
        )
        self.prefix_blocks = Counter(
            "gateway_prefix_blocks",
            "Prompt prefix blocks routed, by pool and whether the chosen replica held them.",
            ["pool", "cached"],
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
            "Session turns checkpointed, by outcome (written, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.checkpoint_failures = self.checkpoints.labels("failed")
        self.checkpoints_written = self.checkpoints.labels("written")

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

        self.tier_decisions = Counter(
            "gateway_tier_decisions",
            "Requests by model alias, the tier that served them and what decided it "
            "(explicit, rule, cascade, router, session, default, escalation).",
            ["model", "tier", "by"],
            registry=self.registry,
        )
        self.cascades = Counter(
            "gateway_cascades",
            "Checked answers by outcome: passed on the first tier, escalated (passed or "
            "not on the next), or failed (returned as an error).",
            ["model", "outcome"],
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
        self.fallbacks = Counter(
            "gateway_fallbacks",
            "Requests served by a fallback model, by the model asked for and the fallback.",
            ["model", "fallback"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
