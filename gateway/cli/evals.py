"""`gateway trim-eval | route-eval | tools-eval`: the offline evaluations of trimming, the
tier router (labels, or a shadow router on the request log) and the tool-call checker,
under the evaluation protocol's parts (docs/development/evaluation.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.cli.common import Subcommands, add_part, print_report
from gateway.policy import PolicyError, load_policy


def register(sub: Subcommands) -> None:
    trim = sub.add_parser("trim-eval", help="replay conversations through session trimming")
    trim.add_argument("--trajectories", required=True, help="JSONL, one {messages, tools} each")
    trim.add_argument("--policy", default="policies/agent-airline.yaml")
    trim.add_argument("--tokenizer", help="tokenizer.json for token counts (else the policy's)")
    trim.add_argument("--window", type=int, default=12, help="baseline: last N messages")
    trim.add_argument("--limit", type=int, default=0, help="only the first N conversations")
    add_part(trim)
    trim.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    trim.set_defaults(run=_trim_eval)

    route = sub.add_parser("route-eval", help="small-tier share and quality of the router")
    judged = route.add_mutually_exclusive_group(required=True)
    judged.add_argument("--labels", help="RouteLLM-style JSONL of labelled prompts")
    judged.add_argument(
        "--shadow",
        metavar="LOG",
        help="a request log: the shadow router against the live one on checked answers",
    )
    route.add_argument("--tier", default="small", help="with --shadow: the checked (small) tier")
    route.add_argument(
        "--last", type=int, default=0, help="with --shadow: only the most recent N requests"
    )
    route.add_argument("--policy", help="apply this policy's tier rules before the router")
    route.add_argument("--artifact", help="score this artifact as it is (labels it never saw)")
    route.add_argument(
        "--folds", type=int, default=0, help="held-out folds over groups (0: one per group)"
    )
    add_part(route)
    route.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    route.set_defaults(run=_route_eval)

    tools = sub.add_parser("tools-eval", help="tool-call checker on real and seeded calls")
    tools.add_argument(
        "--data", help="the shared data folder (default: ../shared/data from the repository)"
    )
    tools.add_argument(
        "--out", help="the JSON report (default: .run/bench/tools-eval.json in the repository)"
    )
    tools.add_argument("--seed", type=int, default=0, help="which faults are seeded")
    tools.add_argument("--limit", type=int, default=0, help="only the first N calls per dataset")
    tools.set_defaults(run=_tools_eval)


def _trim_eval(args: argparse.Namespace) -> int:
    from gateway.offline.trim_eval import evaluate, table
    from gateway.trimming.tokens import token_counter

    try:
        spec = load_policy(args.policy).trimming
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    tokenizer = args.tokenizer or spec.tokenizer
    try:
        with open(args.trajectories, encoding="utf-8") as lines:
            records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        print(f"gateway trim-eval: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        records = records[: args.limit]
    result = evaluate(spec, token_counter(tokenizer), records, window=args.window, part=args.part)
    result = {"trajectories": args.trajectories, "policy": args.policy, **result}
    return print_report(result, args.json, table)


def _route_eval(args: argparse.Namespace) -> int:
    from gateway.offline.route_eval import parts_table, route_eval_parts
    from gateway.offline.route_train.labels import LabelError, read_labels
    from gateway.tiering.learned import ArtifactError, LearnedRouter
    from gateway.tiering.rules import policy_fixed_tier

    if args.shadow:
        return _shadow_eval(args)
    try:
        prompts = read_labels(args.labels)
        router = LearnedRouter.load(args.artifact) if args.artifact else None
        fixed_tier = policy_fixed_tier(load_policy(args.policy)) if args.policy else None
    except (OSError, LabelError, ArtifactError, PolicyError) as exc:
        print(f"gateway route-eval: {exc}", file=sys.stderr)
        return 2
    result = route_eval_parts(
        prompts,
        part=args.part,
        router=router,
        folds=args.folds,
        fixed_tier=fixed_tier,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    result = {"labels": args.labels, "policy": args.policy, "artifact": args.artifact, **result}
    return print_report(result, args.json, parts_table)


def _shadow_eval(args: argparse.Namespace) -> int:
    from gateway.offline.log_lines import LogLineError, read_entries
    from gateway.offline.shadow_eval import shadow_eval, table

    try:
        entries = list(read_entries(args.shadow))
    except (OSError, LogLineError) as exc:
        print(f"gateway route-eval: {exc}", file=sys.stderr)
        return 2
    result = shadow_eval(entries, tier=args.tier, last=args.last)
    return print_report({"log": args.shadow, **result}, args.json, table)


def _tools_eval(args: argparse.Namespace) -> int:
    from gateway.offline.tools_eval import (
        DEFAULT_DATA,
        DEFAULT_OUT,
        DataError,
        table,
        tools_eval,
        write_report,
    )

    out = Path(args.out) if args.out else DEFAULT_OUT
    try:
        result = tools_eval(
            Path(args.data) if args.data else DEFAULT_DATA,
            seed=args.seed,
            limit=args.limit,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        write_report(result, out)
    except (OSError, DataError) as exc:
        print(f"gateway tools-eval: {exc}", file=sys.stderr)
        return 2
    print(table(result))
    print(f"wrote {out}")
    return 1 if result["missed"] else 0
