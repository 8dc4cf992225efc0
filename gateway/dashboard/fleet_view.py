"""The replicas as operators see them: health, breaker, load and what each engine
reports, read at scrape time (a Prometheus collector) and for the dashboard. Nothing is
updated per request: the numbers are read from where they already live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.engine_metrics import EngineStats
from gateway.fleet.replicas import Fleet
from gateway.resilience.breaker import Breakers

BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}


class FleetView(Collector):
    def __init__(
        self,
        fleet: Fleet,
        breakers: Breakers,
        engine_stats: Callable[[str], EngineStats | None],
        served: Callable[[str], int],
    ) -> None:
        self._fleet = fleet
        self._breakers = breakers
        self._engine_stats = engine_stats
        self._served = served  # requests this process sent to a replica

    def replicas(self) -> list[dict[str, Any]]:
        out = []
        for replica in self._fleet.all_replicas():
            stats = self._engine_stats(replica.url)
            out.append(
                {
                    "id": replica.id,
                    "pool": replica.pool,
                    "url": None,  # engine addresses stay inside the gateway
                    "healthy": replica.healthy,
                    "breaker": self._breakers.of(replica).state,
                    "inflight": replica.inflight,
                    "requests": self._served(replica.id),
                    # the engine's context window in tokens, from its /v1/models
                    "context_tokens": replica.context_tokens,
                    "engine": _engine(stats) if stats is not None else None,
                }
            )
        return out

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "replica"]
        breaker = GaugeMetricFamily(
            "gateway_breaker_state",
            "Circuit breaker state per replica: 0 closed, 1 half-open, 2 open.",
            labels=labels,
        )
        inflight = GaugeMetricFamily(
            "gateway_replica_inflight", "Requests in flight at the replica.", labels=labels
        )
        healthy = GaugeMetricFamily(
            "gateway_replica_healthy", "1 when the replica is in the rotation.", labels=labels
        )
        engine = {
            name: GaugeMetricFamily(f"gateway_engine_{name}", doc, labels=labels)
            for name, doc in _ENGINE_GAUGES.items()
        }
        for replica in self._fleet.all_replicas():
            values = [replica.pool, replica.id]
            state = self._breakers.of(replica).state
            breaker.add_metric(values, BREAKER_STATES.get(state, 0))
            inflight.add_metric(values, replica.inflight)
            healthy.add_metric(values, 1 if replica.healthy else 0)
            stats = self._engine_stats(replica.url)
            if stats is None:
                continue
            for name, value in _engine_values(stats).items():
                if value is not None:
                    engine[name].add_metric(values, value)
        yield from (breaker, inflight, healthy, *engine.values())


_ENGINE_GAUGES = {
    "requests_waiting": "Requests queued at the engine (vllm:num_requests_waiting).",
    "requests_running": "Requests the engine is running (vllm:num_requests_running).",
    "kv_cache_usage_ratio": "Share of the engine's KV cache in use (vllm:kv_cache_usage_perc).",
    "prefix_cache_hit_ratio": "Prompt tokens the engine served from its prefix cache, of those "
    "it looked up, since it started (vllm:prefix_cache_hits / queries).",
    "spec_decode_acceptance_rate": "Draft tokens accepted of those proposed by speculative "
    "decoding, since the engine started.",
    "spec_decode_mean_accepted_length": "Tokens produced per speculative verification step "
    "(1 + accepted per draft).",
}


def _engine_values(stats: EngineStats) -> dict[str, float | None]:
    return {
        "requests_waiting": stats.waiting,
        "requests_running": stats.running,
        "kv_cache_usage_ratio": stats.kv_usage,
        "prefix_cache_hit_ratio": stats.prefix_cache_hit_ratio,
        "spec_decode_acceptance_rate": stats.spec_acceptance_rate,
        "spec_decode_mean_accepted_length": stats.spec_mean_accepted_length,
    }


def _engine(stats: EngineStats) -> dict[str, Any]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return {
        "waiting": stats.waiting,
        "running": stats.running,
        "kv_cache_usage": rounded(stats.kv_usage),
        "prefix_cache_hit_ratio": rounded(stats.prefix_cache_hit_ratio),
        "spec_acceptance_rate": rounded(stats.spec_acceptance_rate),
        "spec_mean_accepted_length": rounded(stats.spec_mean_accepted_length),
    }
