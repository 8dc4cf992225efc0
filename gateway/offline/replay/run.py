"""Replay a trace through routers over simulated replicas and score them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.fleet.replicas import Replica
from gateway.offline.replay.baselines import SGLangStyleRouter
from gateway.offline.replay.sim import LRUCache, SimReplica, Tally
from gateway.offline.replay.traces import TraceRequest
from gateway.policy.schema import RoutingSpec
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from gateway.routing.router import RoundRobinRouter, Router


@dataclass(frozen=True)
class ReplayConfig:
    replicas: int
    cache_blocks: int
    block_tokens: int = 512
    prefill_tps: float = 10_000.0
    decode_tps: float = 30.0
    window_s: float = 60.0


class TraceClock:
    """Trace time, so load decay follows the trace rather than the wall clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    trace: Sequence[TraceRequest], make_router: Callable[[TraceClock], Router], config: ReplayConfig
) -> Tally:
    clock = TraceClock()
    pool = [
        Replica("replay", f"http://replica-{i}.replay", "replay") for i in range(config.replicas)
    ]
    sims = [SimReplica(LRUCache(config.cache_blocks)) for _ in pool]
    position = {replica.id: i for i, replica in enumerate(pool)}
    router = make_router(clock)
    tally = Tally(config.replicas, config.window_s)
    for request in trace:
        clock.now = request.at_s
        for replica, sim in zip(pool, sims, strict=True):
            replica.inflight = sim.running(request.at_s)  # what the live gateway counts
        route = RouteRequest(request.blocks, request.session)
        decision = router.choose(pool, route, frozenset())
        assert decision is not None  # simulated replicas are always healthy
        router.dispatched(decision, route)
        i = position[decision.replica.id]
        sim = sims[i]
        hits = sim.cache.leading_hits(request.blocks)
        sim.cache.insert(request.blocks)
        uncached = max(1, request.input_tokens - hits * config.block_tokens)
        start = max(request.at_s, sim.prefill_free_at)
        first_token = start + uncached / config.prefill_tps
        sim.prefill_free_at = first_token
        sim.finishes.append(first_token + request.output_tokens / config.decode_tps)
        tally.add(request.at_s, i, hits, len(request.blocks), first_token - request.at_s)
    return tally


def oracle_hit_rate(trace: Sequence[TraceRequest], blocks: int) -> float:
    """One pooled LRU holding every replica's memory, no load limits: the ceiling."""
    cache = LRUCache(blocks)
    hits = total = 0
    for request in trace:
        hits += cache.leading_hits(request.blocks)
        total += len(request.blocks)
        cache.insert(request.blocks)
    return hits / total if total else 0.0


def evaluate(
    trace: Sequence[TraceRequest], spec: RoutingSpec, config: ReplayConfig
) -> dict[str, Any]:
    # The gateway's belief about each engine's cache is sized like the simulated engine's.
    gateway_spec = spec.model_copy(update={"index_blocks_per_replica": config.cache_blocks})
    ours = replay(trace, lambda clock: build_router(gateway_spec, clock), config)
    rr = replay(trace, lambda clock: RoundRobinRouter(), config)
    sglang = replay(trace, lambda clock: SGLangStyleRouter(config.cache_blocks), config)
    oracle = oracle_hit_rate(trace, config.replicas * config.cache_blocks)
    result: dict[str, Any] = {
        "requests": len(trace),
        "replicas": config.replicas,
        "cache_blocks": config.cache_blocks,
        "strategy": spec.strategy,
        **ours.summary(),
        "oracle_hit_rate": round(oracle, 4),
        "round_robin": rr.summary(),
        "sglang_cache_aware": sglang.summary(),
        "service_model": {
            "block_tokens": config.block_tokens,
            "prefill_tokens_per_s": config.prefill_tps,
            "decode_tokens_per_s_per_request": config.decode_tps,
            "note": "one prefill at a time per replica over uncached tokens; decode batched",
        },
    }
    result["checks"] = {
        "hit_rate_over_oracle": round(ours.hit_rate / oracle, 4) if oracle else None,
        "hit_rate_at_least_0.9_oracle": ours.hit_rate >= 0.9 * oracle,
        "imbalance_at_most_round_robin": ours.imbalance_p95() <= rr.imbalance_p95(),
        "beats_sglang_style_hit_rate": ours.hit_rate >= sglang.hit_rate,
        "beats_sglang_style_imbalance": ours.imbalance_p95() <= sglang.imbalance_p95(),
    }
    return result
