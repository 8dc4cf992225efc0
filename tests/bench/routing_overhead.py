"""Benchmark: the cost of the routing decision itself, per request, at 8 replicas.

    .venv/bin/python -m tests.bench.routing_overhead [--out FILE]     (make bench-routing)

Times what the gateway adds on the request path for routing, on real tau-bench agent
requests (6 KB system prompt, 14 tools, growing history): canonicalization, prefix block
hashing, filter/cost/pick over 8 replicas and the after-dispatch bookkeeping. The routing
decision is hashing + choose + record; canonicalization runs whatever the routing strategy
(it rewrites the prompt) and is shown on its own and in the total. Prints
p50/p99 over all rounds (and each round's p99: this machine kind shares its CPUs, so
figures move between runs) and writes JSON. Garbage collection stays on, as in the gateway.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from engine.supervisor import ROOT
from gateway.fleet.replicas import Replica
from gateway.offline.replay.sim import percentile
from gateway.policy.canonicalize import CanonicalizeSpec
from gateway.policy.routing import RoutingSpec
from gateway.prompt.blocks import conversation_key, request_blocks
from gateway.prompt.canonical import Canonicalizer
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from tests.bench.report import write_report
from tests.bench.tau_routing import DATA

REPLICAS = 8


def requests(limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with DATA.open() as lines:
        for line in lines:
            record = json.loads(line)
            for i, message in enumerate(record["messages"]):
                if message["role"] == "assistant":
                    out.append(
                        {"model": "m", "messages": record["messages"][:i], "tools": record["tools"]}
                    )
            if len(out) >= limit:
                break
    return out[:limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "routing-overhead.json"))
    args = parser.parse_args()
    spec = RoutingSpec()
    router = build_router(spec, time.monotonic)
    canonicalizer = Canonicalizer(CanonicalizeSpec())
    pool = [Replica("bench", f"http://10.0.0.{i}:8000", "m") for i in range(REPLICAS)]
    bodies = requests(args.requests)
    rng = random.Random(0)
    samples: dict[str, list[float]] = {
        "canonicalize": [],
        "blocks": [],
        "choose+record": [],
        "routing decision": [],
        "total": [],
    }
    round_p99: list[float] = []
    for round_number in range(args.rounds):
        rng.shuffle(bodies)
        first = len(samples["total"])
        for body in bodies:
            t0 = time.perf_counter_ns()
            canonical = canonicalizer.apply(body)
            t1 = time.perf_counter_ns()
            chat = canonical.body or body
            blocks = request_blocks(chat, spec.block_bytes, canonical.tools_json)
            route = RouteRequest(blocks, conversation_key(chat, blocks))  # as the pipeline does
            t2 = time.perf_counter_ns()
            decision = router.choose(pool, route, frozenset())
            assert decision is not None
            router.dispatched(decision, route)
            t3 = time.perf_counter_ns()
            for name, ns in (
                ("canonicalize", t1 - t0),
                ("blocks", t2 - t1),
                ("choose+record", t3 - t2),
                ("routing decision", t3 - t1),
                ("total", t3 - t0),
            ):
                samples[name].append(ns / 1000)
        this_round = sorted(samples["routing decision"][first:])
        round_p99.append(round(percentile(this_round, 0.99), 1))
        print(
            f"round {round_number + 1}/{args.rounds}: routing decision p99 {round_p99[-1]} us",
            flush=True,
        )
    report: dict[str, Any] = {
        "replicas": REPLICAS,
        "requests": len(bodies) * args.rounds,
        "gc": "enabled, as in the gateway",
        "microseconds": {},
        "routing_decision_p99_per_round": round_p99,
    }
    print(f"{'stage':<17} {'p50 us':>8} {'p99 us':>8}")
    for name, values in samples.items():
        values.sort()
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        report["microseconds"][name] = {"p50": round(p50, 1), "p99": round(p99, 1)}
        print(f"{name:<17} {p50:>8.1f} {p99:>8.1f}")
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
