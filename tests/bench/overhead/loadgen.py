"""The overhead benchmark's load generator: one target, one body, a fixed concurrency.

    python -m tests.bench.overhead.loadgen --url URL --body FILE --model M --concurrency C \
        --requests N [--stream] [--warmup W] [--header 'Name: value' ...]

Its own process, so that the client's work is never inside the target's process (it still
shares the machine's cores with it). C keep-alive connections, each sending requests back
to back until N are done; the first W requests (default: twice the concurrency) are not
timed: they open every connection, so the timed part measures requests, not handshakes.

It speaks HTTP/1.1 itself (an asyncio protocol and httptools' parser, on uvloop), the
request's bytes rendered once: on this 2-core machine whatever the client spends is taken
from the target, and an aiohttp client spent about 3x as much per request (the figures in
docs/benchmarks/overhead.md), which capped what a second gateway worker could show.

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
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
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


class Exchange(asyncio.Protocol):
    """One keep-alive connection: a request written whole, its answer parsed as it comes."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answered: asyncio.Future[None] | None = None
        self.status = 0
        self.pieces: list[bytes] = []
        self.arrivals: list[float] = []
        self.pending = b""
        self.done = False
        self.reusable = True  # until an answer says `Connection: close`, or it is lost

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._finish(exc or ConnectionResetError("the target closed the connection"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.stream or self.status != 200:
            self.pieces.append(body)
            return
        now = time.perf_counter()
        pending = self.pending + body
        events = pending.count(b"\n\n")
        if events:
            self.done = self.done or b"data: [DONE]" in pending
            self.arrivals.extend([now] * events)
            pending = pending[pending.rfind(b"\n\n") + 2 :]
        self.pending = pending

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        if self.answered is not None and not self.answered.done():
            if exc is None:
                self.answered.set_result(None)
            else:
                self.answered.set_exception(exc)

    async def send(self, request: bytes, timeout_s: float) -> None:
        """Write `request` and wait for its whole answer, at most `timeout_s`."""
        transport = self.transport
        assert transport is not None
        self.status, self.pieces, self.arrivals = 0, [], []
        self.pending, self.done = b"", False
        loop = asyncio.get_running_loop()
        self.answered = loop.create_future()
        timer = loop.call_later(timeout_s, self._finish, TimeoutError("no answer in time"))
        transport.write(request)
        try:
            await self.answered
        finally:
            timer.cancel()


@dataclass
class Target:
    host: str
    port: int
    request: bytes  # the whole HTTP request, rendered once
    stream: bool
    timeout_s: float


async def one(exchange: Exchange, target: Target, record: Record | None) -> None:
    """One request; its figures go to `record` (None: a warm-up request, not timed)."""
    start = time.perf_counter()
    await exchange.send(target.request, target.timeout_s)
    end = time.perf_counter()
    if record is None:
        return
    if exchange.status != 200:
        record.fail(f"HTTP {exchange.status}: {b''.join(exchange.pieces)[:200]!r}")
        return
    if not target.stream:
        payload = b"".join(exchange.pieces)
        if b'"choices"' not in payload:
            record.fail(f"no choices: {payload[:200]!r}")
            return
        record.latency.append(end - start)
        return
    arrivals = exchange.arrivals
    if not exchange.done or not arrivals:
        record.fail(f"stream ended without [DONE] after {len(arrivals)} events")
        return
    record.latency.append(end - start)
    record.ttfc.append(arrivals[0] - start)
    record.gaps.extend(b - a for a, b in itertools.pairwise(arrivals))


async def connect(target: Target) -> Exchange:
    loop = asyncio.get_running_loop()
    _, exchange = await loop.create_connection(
        lambda: Exchange(target.stream), target.host, target.port
    )
    return exchange


async def drive(
    target: Target, exchanges: list[Exchange], count: int, record: Record | None
) -> float:
    """`count` requests over the connections; returns the wall time they took. A
    connection that fails is counted and replaced."""
    left = count

    async def worker(slot: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            try:
                if not exchanges[slot].reusable:
                    exchanges[slot] = await connect(target)
                await one(exchanges[slot], target, record)
            except (OSError, httptools.HttpParserError, TimeoutError) as exc:
                if record is not None:
                    record.fail(f"{type(exc).__name__}: {exc}")
                exchanges[slot].reusable = False
            spent = exchanges[slot]
            if not spent.reusable and spent.transport is not None:
                spent.transport.abort()

    start = time.perf_counter()
    await asyncio.gather(*(worker(slot) for slot in range(len(exchanges))))
    return time.perf_counter() - start


def render(url: str, body: bytes, headers: dict[str, str]) -> tuple[str, int, bytes]:
    """The request as it goes on the wire: host, port and its bytes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def run(args: argparse.Namespace, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    warmup = args.concurrency * 2 if args.warmup is None else args.warmup
    host, port, request = render(args.url, body, headers)
    target = Target(host, port, request, args.stream, args.timeout_s)
    record = Record()
    exchanges = [await connect(target) for _ in range(args.concurrency)]
    try:
        if warmup:
            await drive(target, exchanges, warmup, None)
        wall = await drive(target, exchanges, args.requests, record)
    finally:
        for exchange in exchanges:
            if exchange.transport is not None:
                exchange.transport.close()
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
