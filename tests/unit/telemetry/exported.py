"""Every metric family a gateway process exports, read from the objects that register them
(its registry, discovery's and reload's counters, the per-replica collector), for the
tests that hold other files to them: the Grafana dashboard's queries and the metrics
reference page."""

from __future__ import annotations

from gateway.dashboard.fleet_view import FleetView
from gateway.fleet.discovery import DiscoveryMetrics
from gateway.fleet.engine_metrics import EngineStats
from gateway.fleet.replicas import Fleet
from gateway.policy import parse_policy
from gateway.reload import ReloadMetrics
from gateway.resilience.breaker import Breakers
from gateway.telemetry.metrics import GatewayMetrics

_ONE_REPLICA = """\
version: 1
pools: {p: {served_model: s, replicas: [{url: "http://a.test:1"}]}}
models: {m: {pool: p}}
"""


def exported_families() -> dict[str, str]:
    """Family name (as prometheus_client names it: a counter without `_total`) -> type."""
    metrics = GatewayMetrics()
    DiscoveryMetrics(metrics.registry)
    ReloadMetrics(metrics.registry)
    policy = parse_policy(_ONE_REPLICA)
    # Every engine figure defined, so every gauge family has a sample.
    stats = EngineStats(prefix_queries=1, spec_drafts=1, spec_draft_tokens=1)
    view = FleetView(
        Fleet(policy), Breakers(policy.resilience.breaker, metrics), lambda url: stats, lambda r: 0
    )
    metrics.registry.register(view)
    return {family.name: family.type for family in metrics.registry.collect()}
