"""Benchmark: one tenant floods the gateway; does another still get served?

    .venv/bin/python -m tests.bench.tenant_flood [--flooders 300] [--seconds 6] [--hammer]
        [--out FILE]

All real processes on loopback: two fake engines (tests/fault/fault_upstream.py, each
answer 5 tokens at 40 ms: 0.2 s, like a short agent call), `gateway serve` in front of
them with two tenants (static keys, the shared Redis), 16 requests in flight per replica
(capacity 32). Tenant A (no rate limit) runs `--flooders` clients that each send requests
back to back, a greedy agent: after a 429 each waits the Retry-After it was given (as the
openai SDK does), or with `--hammer` retries at once, as a hostile one does (then the
flood is also one of CPU: every refusal costs the gateway's one core some work). One
second into the flood, tenant B sends `--victims` requests at once. Before the flood, B's same requests are
timed on the idle gateway, the peer the flood figures are read against.

Prints a table and writes JSON: B's requests served and their p50 / max latency (and the
ratio to the idle run), A's requests served and shed. A benchmark, not a test
(tests/fault/test_tenant_flood.py asserts the behaviour on a smaller flood).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.fault.harness import running_upstreams
from tests.integration.conftest import running_gateway

KEY_A = "sk-agw-flood-a-3f1c9e2d7b"
KEY_B = "sk-agw-flood-b-8a0d4c6e1f"
BODY = {"model": "main", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def policy(urls: list[str], redis_url: str, share_b: float = 1.0) -> str:
    """Two tenants on one pool of two replicas, 16 in flight each."""
    digest_a = hashlib.sha256(KEY_A.encode()).hexdigest()
    digest_b = hashlib.sha256(KEY_B.encode()).hexdigest()
    replicas = ", ".join(f'{{url: "{u}"}}' for u in urls)
    return f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
routing: {{strategy: round_robin}}
timeouts: {{first_byte_s: 30}}
resilience:
  admission: {{max_inflight_per_replica: 16, on_saturated: reject, retry_after_s: 1}}
pools: {{main: {{served_model: fault-main, replicas: [{replicas}]}}}}
models: {{main: {{pool: main}}}}
tenants:
  flood-a: {{keys: [{{sha256: {digest_a}}}]}}
  flood-b: {{share: {share_b}, keys: [{{sha256: {digest_b}}}]}}
"""


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    retry_after: set[str] = field(default_factory=set)


async def _send(session: aiohttp.ClientSession, v1: str, key: str, tally: Tally) -> float:
    """Sends one request; returns the Retry-After of a refusal (0 when served)."""
    began = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{v1}/chat/completions", json=BODY, headers=headers) as response:
        await response.read()
        tally.statuses[response.status] += 1
        if response.status == 200:
            tally.latencies_s.append(time.monotonic() - began)
        elif (after := response.headers.get("Retry-After")) is not None:
            tally.retry_after.add(after)
            return float(after)
        return 0.0


async def flood(
    v1: str, flooders: int, seconds: float, victims: int, hammer: bool = False
) -> dict[str, Any]:
    """B's requests timed idle, then during A's flood."""
    connector = aiohttp.TCPConnector(limit=flooders + victims + 8)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        idle = Tally()
        await asyncio.gather(*(_send(session, v1, KEY_B, idle) for _ in range(victims)))
        a, b = Tally(), Tally()
        stop = asyncio.Event()

        async def flooder() -> None:
            while not stop.is_set():
                retry_after = await _send(session, v1, KEY_A, a)
                if retry_after and not hammer:
                    await asyncio.sleep(retry_after)

        flooding = [asyncio.create_task(flooder()) for _ in range(flooders)]
        await asyncio.sleep(1.0)
        await asyncio.gather(*(_send(session, v1, KEY_B, b) for _ in range(victims)))
        await asyncio.sleep(max(0.0, seconds - 1.0))
        stop.set()
        await asyncio.gather(*flooding)
    return {"idle_b": _summary(idle), "flood_b": _summary(b), "flood_a": _summary(a)}


def _summary(tally: Tally) -> dict[str, Any]:
    lat = sorted(tally.latencies_s)
    return {
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "served": tally.statuses[200],
        "p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "max_ms": round(1000 * lat[-1], 1) if lat else None,
        "retry_after": sorted(tally.retry_after),
    }


def run(
    redis_url: str, flooders: int, seconds: float, victims: int, hammer: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agw-flood-") as tmp:
        work = Path(tmp)
        with running_upstreams(["a", "b"], work, tokens=5, token_delay_s=0.04) as upstreams:
            path = work / "policy.yaml"
            path.write_text(policy([u.url for u in upstreams], redis_url))
            with running_gateway(path, work / "gateway.log") as gateway:
                return asyncio.run(flood(gateway.v1, flooders, seconds, victims, hammer))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--flooders", type=int, default=300)
    parser.add_argument("--victims", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--hammer", action="store_true", help="retry a 429 at once")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", default=".run/bench/tenant-flood.json")
    args = parser.parse_args()
    how = "retrying at once" if args.hammer else "honouring Retry-After"
    print(f"bench: tenant A floods with {args.flooders} clients for {args.seconds:g} s, {how}; "
          f"tenant B sends {args.victims} requests 1 s in", flush=True)  # fmt: skip
    report = run(args.redis_url, args.flooders, args.seconds, args.victims, args.hammer)
    report["hammer"] = args.hammer
    idle, b, a = report["idle_b"], report["flood_b"], report["flood_a"]
    if idle["p50_ms"] and b["p50_ms"]:
        report["b_p50_flood_over_idle"] = round(b["p50_ms"] / idle["p50_ms"], 2)
    print(f"{'':<22}{'served':>8}{'statuses':>26}{'p50 ms':>9}{'max ms':>9}")
    for name, row in (("B, idle gateway", idle), ("B, during the flood", b), ("A, the flood", a)):
        statuses = ", ".join(f"{k}: {v}" for k, v in row["statuses"].items())
        print(f"{name:<22}{row['served']:>8}{statuses:>26}{row['p50_ms']!s:>9}{row['max_ms']!s:>9}")
    print(f"B's p50 during the flood over idle: {report.get('b_p50_flood_over_idle')}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"bench: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
