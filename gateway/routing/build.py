"""Build the router the policy asks for."""

from __future__ import annotations

from collections.abc import Callable

from gateway.fleet.engine_metrics import EngineLoads
from gateway.policy.routing import RoutingSpec
from gateway.routing.index import PrefixIndex
from gateway.routing.load import LoadTracker
from gateway.routing.router import CacheAwareRouter, CacheAwareSettings, RoundRobinRouter, Router


def build_router(
    spec: RoutingSpec, clock: Callable[[], float], engine_loads: EngineLoads | None = None
) -> Router:
    if spec.strategy == "round_robin":
        return RoundRobinRouter()
    settings = CacheAwareSettings(
        weights=spec.weights.model_dump(),
        max_waiting=spec.max_waiting,
        max_kv_usage=spec.max_kv_usage,
        max_load_factor=spec.max_load_factor,
        load_slack_blocks=spec.load_slack_blocks,
        load_tolerance=spec.load_tolerance,
        shared_opening_conversations=spec.shared_opening_conversations,
    )
    return CacheAwareRouter(
        settings,
        PrefixIndex(spec.index_blocks_per_replica),
        LoadTracker(spec.load_half_life_s, clock),
        engine_loads,
    )
