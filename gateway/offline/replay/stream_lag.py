"""What a placement's trip through Redis costs: XADD of one batch on one connection, until
a reader blocked in XREAD on another connection has it.

    .venv/bin/python -m gateway.offline.replay.stream_lag [--redis-url URL] [--batches 2000]

The shared-placement design (docs/benchmarks/scale-out.md) publishes placements in
batches to a Redis Stream per pool and every gateway tails it; its lag is the batch
interval plus this round trip, which `gateway replay --lag-ms` then models. A payload is a
batch of placements shaped like the Mooncake trace's (about 80 block hashes each). Both
ends run in one event loop, as they would in one gateway, so one clock times them. Prints
percentiles in milliseconds, or JSON with `--json`. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any, cast

import redis.asyncio as aioredis

from gateway.offline.replay.sim import percentile

# XREAD's answer without decoding: [(stream, [(entry id, {field: value})])].
Entries = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]


def placement_batch(placements: int, blocks: int) -> bytes:
    """A batch as a publisher would write it: replica id, block hashes, work added."""
    body = [
        {"replica": "pool/0123abcd", "blocks": [2**63 - i for i in range(blocks)], "work": 3}
        for _ in range(placements)
    ]
    return json.dumps(body).encode()


async def measure(
    url: str, batches: int, placements: int, blocks: int, gap_s: float
) -> dict[str, Any]:
    stream = f"replay-lag:{uuid.uuid4().hex}"
    payload = placement_batch(placements, blocks)
    writer = aioredis.from_url(url)
    reader = aioredis.from_url(url)
    sent: dict[bytes, float] = {}
    lags: list[float] = []
    try:
        await writer.xadd(stream, {"b": b""}, maxlen=10_000, approximate=True)
        last = "$"

        async def tail() -> None:
            nonlocal last
            while len(lags) < batches:
                answer = cast(Entries, await reader.xread({stream: last}, block=1000, count=64))
                arrived = time.perf_counter()
                for _, entries in answer:
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        key = fields.get(b"n")
                        if key is not None:
                            lags.append(arrived - sent[key])

        reading = asyncio.create_task(tail())
        await asyncio.sleep(0.05)  # the reader is blocked in XREAD before the first batch
        for n in range(batches):
            key = str(n).encode()
            sent[key] = time.perf_counter()
            await writer.xadd(stream, {"n": key, "p": payload}, maxlen=10_000, approximate=True)
            await asyncio.sleep(gap_s)
        await asyncio.wait_for(reading, timeout=10)
    finally:
        await writer.delete(stream)
        await writer.aclose()
        await reader.aclose()
    ordered = sorted(lags)
    return {
        "batches": len(ordered),
        "payload_bytes": len(payload),
        "placements_per_batch": placements,
        "round_trip_ms": {
            q: round(1000 * percentile(ordered, p), 3)
            for q, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        },
        "mean_ms": round(1000 * sum(ordered) / len(ordered), 3) if ordered else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream_lag", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--placements", type=int, default=8, help="placements per batch")
    parser.add_argument("--blocks", type=int, default=80, help="block hashes per placement")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="time between batches")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(args.redis_url, args.batches, args.placements, args.blocks, args.gap_ms / 1000)
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        trip = result["round_trip_ms"]
        print(
            f"XADD -> XREAD, {result['batches']} batches of {result['payload_bytes']} bytes: "
            f"p50 {trip['p50']} ms, p95 {trip['p95']} ms, p99 {trip['p99']} ms, "
            f"mean {result['mean_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
