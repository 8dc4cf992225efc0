"""Measure routing sharing against the real Redis (a benchmark, not a test: pytest does not
collect it). Two gateways' shares in one process, as in test_service.py:

- lag: a placement made on gateway A -> applied by gateway B's follower (p50/p99), with
  dispatches paced so each flush carries a few;
- CPU per dispatch: process CPU time over N dispatches with sharing (publish + the other
  gateway's follow and apply) less the same N dispatches without it;
- memory: the Redis stream's bytes per entry, and what is held in process.

    .venv/bin/python -m tests.bench.sharing_lag [--redis redis://127.0.0.1:6379/9]

Prints a table and writes JSON to stdout's last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import redis.asyncio as aioredis

from gateway.routing.costs import RouteRequest
from gateway.state.keys import routing_key
from tests.unit.sharing.test_service import gateway, policy_of, started


def blocks_of(i: int, length: int) -> tuple[int, ...]:
    return tuple(range(i * 10_000, i * 10_000 + length))


async def measure(url: str, dispatches: int, blocks: int, flush_ms: int) -> dict[str, float]:
    redis = aioredis.Redis.from_url(url)
    pool = f"bench{uuid.uuid4().hex[:8]}"
    policy = policy_of(pool).model_copy(deep=True)
    sharing = policy.routing.sharing.model_copy(update={"flush_ms": flush_ms})
    policy = policy.model_copy(
        update={"routing": policy.routing.model_copy(update={"sharing": sharing})}
    )
    a, b = gateway(redis, policy, "gw-a"), gateway(redis, policy, "gw-b")
    out: dict[str, float] = {"flush_ms": flush_ms, "blocks": blocks, "dispatches": dispatches}
    try:
        # CPU without sharing: the router alone
        start = time.process_time()
        for i in range(dispatches):
            request = RouteRequest(blocks_of(i, blocks))
            choice = a.router.choose(a.replicas, request)
            assert choice is not None
            a.router.dispatched(choice, request)
        alone = time.process_time() - start
        async with started(a, b):
            await asyncio.sleep(0.1)
            lag: list[float] = []
            start = time.process_time()
            for i in range(dispatches):
                made = time.perf_counter()
                a.route(blocks_of(dispatches + i, blocks))
                before = b.counted("applied")
                if i % 10 == 0:  # one in ten: wait for it to arrive, timing it
                    # polled: a counter has no event to wait on, and 0.5 ms is the resolution
                    while b.counted("applied") <= before:  # noqa: ASYNC110
                        await asyncio.sleep(0.0005)
                    lag.append(time.perf_counter() - made)
                else:
                    await asyncio.sleep(0)
            while b.counted("applied") < dispatches:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            shared = time.process_time() - start
            length = await redis.xlen(routing_key(pool, "placements"))
            usage = await redis.memory_usage(routing_key(pool, "placements"))
        lag.sort()
        out |= {
            "lag_p50_ms": 1000 * statistics.median(lag),
            "lag_p99_ms": 1000 * lag[min(len(lag) - 1, int(0.99 * len(lag)))],
            "cpu_us_per_dispatch_router_alone": 1e6 * alone / dispatches,
            "cpu_us_per_dispatch_shared_both_gateways": 1e6 * shared / dispatches,
            "stream_entries": float(length),
            "stream_bytes_per_entry": float(usage or 0) / max(1, length),
        }
    finally:
        await redis.delete(routing_key(pool, "placements"), routing_key(pool, "inflight"))
        await redis.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--dispatches", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=64)
    args = parser.parse_args()
    rows = [
        asyncio.run(measure(args.redis, args.dispatches, args.blocks, flush_ms))
        for flush_ms in (2, 5, 10, 20)
    ]
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.1f}" for k in keys))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
