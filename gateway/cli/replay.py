"""`gateway replay`: a trace through the gateway's own routing code over simulated
replicas, one gateway or K behind a balancer (the scale-out report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.cli.common import Subcommands, print_report
from gateway.policy import PolicyError, load_policy
from gateway.policy.routing import RoutingSpec


def register(sub: Subcommands) -> None:
    replay = sub.add_parser("replay", help="replay a trace through the routing code")
    replay.add_argument(
        "--trace", required=True, help="Mooncake JSONL or the gateway's request log"
    )
    replay.add_argument("--replicas", type=int, default=8)
    replay.add_argument("--cache-blocks", type=int, default=10_000, help="blocks per replica")
    replay.add_argument("--policy", help="policy whose `routing` section to replay")
    replay.add_argument("--block-tokens", type=int, default=512)
    replay.add_argument(
        "--prefill-tps", type=float, default=10_000.0, help="simulated prefill tokens/s"
    )
    replay.add_argument(
        "--decode-tps", type=float, default=30.0, help="simulated decode tokens/s per request"
    )
    replay.add_argument(
        "--gateways",
        metavar="K[,K...]",
        help="K gateway routers behind a balancer (e.g. 1,2,4,8): the scale-out report",
    )
    replay.add_argument("--balancer", choices=("random", "round_robin"), default="random")
    replay.add_argument(
        "--sharing",
        default="none",
        metavar="none|placements[,...]",
        help="what the gateways share (with --gateways); a list runs each side by side",
    )
    replay.add_argument(
        "--batch-ms",
        type=float,
        default=10.0,
        help="placement publisher's flush interval (routing.sharing.flush_ms)",
    )
    replay.add_argument(
        "--lag-ms",
        type=float,
        default=0.0,
        help="from a flush until the other gateways applied it (Redis round trip)",
    )
    replay.add_argument("--seed", type=int, default=0, help="the random balancer's seed")
    replay.add_argument(
        "--window-s", type=float, default=60.0, help="window of the imbalance figure"
    )
    replay.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    replay.set_defaults(run=_replay)


def _replay(args: argparse.Namespace) -> int:
    from gateway.offline.replay.fleet import FleetConfig, parse_counts, parse_sharings
    from gateway.offline.replay.report import scale_out_table
    from gateway.offline.replay.run import ReplayConfig, evaluate, evaluate_scale_out
    from gateway.offline.replay.traces import TraceError, read_trace

    try:
        routing = load_policy(args.policy).routing if args.policy else RoutingSpec()
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    config = ReplayConfig(
        replicas=args.replicas,
        cache_blocks=args.cache_blocks,
        block_tokens=args.block_tokens,
        prefill_tps=args.prefill_tps,
        decode_tps=args.decode_tps,
        window_s=args.window_s,
    )
    try:
        trace = list(read_trace(Path(args.trace), block_tokens=args.block_tokens))
    except (OSError, TraceError) as exc:
        print(f"gateway replay: {exc}", file=sys.stderr)
        return 2
    if args.gateways is None:
        result = {"trace": args.trace, "policy": args.policy, **evaluate(trace, routing, config)}
        return print_report(result, args.json, _replay_table)
    try:
        counts, sharings = parse_counts(args.gateways), parse_sharings(args.sharing)
        fleet = FleetConfig(
            balancer=args.balancer,
            batch_s=args.batch_ms / 1000,
            lag_s=args.lag_ms / 1000,
            seed=args.seed,
        )
    except ValueError as exc:
        print(f"gateway replay: {exc}", file=sys.stderr)
        return 2
    scale_out = evaluate_scale_out(trace, routing, config, counts, sharings, fleet)
    result = {"trace": args.trace, "policy": args.policy, **scale_out}
    return print_report(result, args.json, scale_out_table)


def _replay_table(r: dict[str, Any]) -> str:
    rows = [
        ("gateway", r),
        ("round-robin", r["round_robin"]),
        ("sglang-style", r["sglang_cache_aware"]),
    ]
    lines = [
        f"{r['requests']} requests, {r['replicas']} replicas x {r['cache_blocks']} blocks; "
        f"oracle hit rate {r['oracle_hit_rate']:.3f}",
        f"{'router':<14} {'hit_rate':>9} {'imbalance_p95':>14} "
        f"{'ttft_p50_s':>11} {'ttft_p95_s':>11}",
    ]
    for name, row in rows:
        lines.append(
            f"{name:<14} {row['hit_rate']:>9.3f} {row['imbalance_p95']:>14.3f} "
            f"{row['ttft_p50_s']:>11.3f} {row['ttft_p95_s']:>11.3f}"
        )
    return "\n".join(lines)
