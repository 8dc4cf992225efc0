"""`gateway route-train | dataset export`: the learned tier router trained from labels or
from the gateway's own checked answers, and those answers exported as labelled data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.cli.common import DEFAULT_POLICY, Subcommands, policy_path


def register(sub: Subcommands) -> None:
    train = sub.add_parser("route-train", help="train the learned tier router from labels")
    given = train.add_mutually_exclusive_group(required=True)
    given.add_argument("--labels", help="RouteLLM-style JSONL of labelled prompts")
    given.add_argument(
        "--from-log",
        help="a request log or dataset export: learn from checked answers (cascade, tool "
        "calls, feedback; needs `route_text`, kept where content capture is on)",
    )
    train.add_argument("--tier", help="with --from-log: only answers of this tier (the small one)")
    train.add_argument(
        "--feedback-pass",
        type=float,
        help="with --from-log on a dataset export: an answer whose mean feedback score "
        "reaches this passed (unset: feedback is not a label)",
    )
    train.add_argument("--out", required=True, help="artifact to write (.npz)")
    train.add_argument("--seed", type=int, default=0, help="how groups are dealt to folds")
    train.add_argument(
        "--words",
        action="store_true",
        help="weigh hashed words too: for labels from the traffic the router will route "
        "(words did not carry across MMLU subjects; docs/concepts/tiers.md)",
    )
    train.set_defaults(run=_route_train)

    dataset = sub.add_parser("dataset", help="the gateway's traffic as labelled data")
    actions = dataset.add_subparsers(dest="dataset_command", required=True)
    exported = actions.add_parser(
        "export", help="request-log lines with a check's outcome or feedback, as JSONL"
    )
    exported.add_argument("--log", required=True, help="the request log (telemetry.request_log)")
    exported.add_argument("--out", required=True, help="JSONL to write")
    exported.add_argument(
        "--policy", help=f"for the feedback's Redis (default: $GATEWAY_POLICY or {DEFAULT_POLICY})"
    )
    exported.add_argument("--tenant", help="only this tenant's requests")
    exported.add_argument(
        "--no-feedback", action="store_true", help="checks' outcomes only: no Redis needed"
    )
    exported.set_defaults(run=_dataset_export)


def _route_train(args: argparse.Namespace) -> int:
    from gateway.offline.route_train.labels import LabelError, read_labels
    from gateway.offline.route_train.outcomes import read_log, train_from_outcomes
    from gateway.offline.route_train.train import TrainConfig, train_router
    from gateway.tiering.learned import LearnedRouter

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        router: LearnedRouter
        if args.from_log:
            outcomes = read_log(args.from_log, args.tier, feedback_pass=args.feedback_pass)
            say(f"{len(outcomes.prompts)} labelled answers; {outcomes.skipped} other lines")
            router = train_from_outcomes(
                outcomes.prompts, trained_on=Path(args.from_log).name, progress=say
            )
        else:
            prompts = read_labels(args.labels)
            router = train_router(
                prompts,
                TrainConfig(seed=args.seed, words=args.words),
                labels_name=Path(args.labels).name,
                progress=say,
            )
        router.save(args.out)
    except (OSError, LabelError) as exc:
        print(f"gateway route-train: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {router.version}, trained on {router.trained_on}")
    return 0


def _dataset_export(args: argparse.Namespace) -> int:
    from gateway.offline.dataset import export_command

    return export_command(
        args.log,
        args.out,
        policy=policy_path(args.policy),
        tenant=args.tenant,
        feedback=not args.no_feedback,
    )
