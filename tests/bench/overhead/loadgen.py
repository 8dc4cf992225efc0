"""The overhead benchmark's load generator: one target, one body, a fixed concurrency.

    python -m tests.bench.overhead.loadgen --url URL --body FILE --model M --concurrency C \
        --requests N [--stream] [--warmup W] [--header 'Name: value' ...]

Its own process, so that the client's work is never inside the target's process (it still
shares the machine's cores with it). One aiohttp session whose connection limit is the
concurrency; C workers send requests back to back until N are done. The first W requests
(default: twice the concurrency) are not timed: they open every connection, so the timed
part measures requests, not handshakes.

Per request: client latency (send to last byte); for streams also the time to the first
event and the gaps between consecutive SSE events as they reached the client (events that
arrive in one read have a gap of 0). Prints one JSON object on stdout: quantiles of those,
requests/s over the timed part, and the errors (a non-200 answer, a body without
`choices`, a stream without `data: [DONE]`, a transport failure).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def summary(values: list[float], scale: float) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(quantile(ordered, 0.5) * scale, 4),
        "p90": round(quantile(ordered, 0.9) * scale, 4),
        "p99": round(quantile(ordered, 0.99) * scale, 4),
        "mean": round(sum(ordered) / len(ordered) * scale, 4) if ordered else math.nan,
    }


@dataclass
class Record:
    latency: list[float] = field(default_factory=list)
    ttfc: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    errors: int = 0
    error_sample: str = ""

    def fail(self, reason: str) -> None:
        self.errors += 1
        self.error_sample = self.error_sample or reason[:300]


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, record: Record | None
) -> None:
    """One request; its figures go to `record` (None: a warm-up request, not timed)."""
    start = time.perf_counter()
    try:
        async with session.post(url, data=body) as response:
            if response.status != 200:
                if record is not None:
                    record.fail(f"HTTP {response.status}: {(await response.read())[:200]!r}")
                else:
                    await response.read()
                return
            if not stream:
                payload = await response.read()
                end = time.perf_counter()
                if record is None:
                    return
                if b'"choices"' not in payload:
                    record.fail(f"no choices: {payload[:200]!r}")
                    return
                record.latency.append(end - start)
                return
            arrivals: list[float] = []
            pending = b""
            done = False
            async for piece in response.content.iter_any():
                now = time.perf_counter()
                pending += piece
                events = pending.count(b"\n\n")
                if events:
                    done = done or b"data: [DONE]" in pending
                    arrivals.extend([now] * events)
                    pending = pending[pending.rfind(b"\n\n") + 2 :]
            end = time.perf_counter()
    except (aiohttp.ClientError, TimeoutError) as exc:
        if record is not None:
            record.fail(f"{type(exc).__name__}: {exc}")
        return
    if record is None:
        return
    if not done or not arrivals:
        record.fail(f"stream ended without [DONE] after {len(arrivals)} events")
        return
    record.latency.append(end - start)
    record.ttfc.append(arrivals[0] - start)
    record.gaps.extend(b - a for a, b in itertools.pairwise(arrivals))


async def drive(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    concurrency: int,
    count: int,
    record: Record | None,
) -> float:
    """`count` requests over `concurrency` workers; returns the wall time they took."""
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one(session, url, body, stream, record)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def run(args: argparse.Namespace, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    warmup = args.concurrency * 2 if args.warmup is None else args.warmup
    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    record = Record()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        if warmup:
            await drive(session, args.url, body, args.stream, args.concurrency, warmup, None)
        wall = await drive(
            session, args.url, body, args.stream, args.concurrency, args.requests, record
        )
    done = len(record.latency)
    return {
        "requests": args.requests,
        "completed": done,
        "errors": record.errors,
        "error_sample": record.error_sample,
        "concurrency": args.concurrency,
        "stream": args.stream,
        "body_bytes": len(body),
        "wall_s": round(wall, 4),
        "rps": round(done / wall, 2) if wall else 0.0,
        "latency_ms": summary(record.latency, 1e3) if done else None,
        "ttfc_ms": summary(record.ttfc, 1e3) if record.ttfc else None,
        "gap_us": summary(record.gaps, 1e6) if record.gaps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the chat completions URL")
    parser.add_argument("--body", required=True, help="JSON request body (model is replaced)")
    parser.add_argument("--model", required=True, help="the model name the target expects")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000, help="timed requests")
    parser.add_argument("--warmup", type=int, default=None, help="default: 2 x concurrency")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    request = orjson.loads(Path(args.body).read_bytes())
    request["model"] = args.model
    if args.stream:
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    headers = {"Content-Type": "application/json"}
    for header in args.header:
        name, _, value = header.partition(":")
        headers[name.strip()] = value.strip()
    result = uvloop.run(run(args, orjson.dumps(request), headers))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
