"""`gateway policy check | schema | reference`: policy files validated without serving
(and against the one a gateway serves), the policy's JSON Schema and reference page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.cli.common import Subcommands
from gateway.policy import Policy, PolicyError
from gateway.policy.reloadable import load_policy_file, needs_restart


def register(sub: Subcommands) -> None:
    policy = sub.add_parser("policy", help="policy tools").add_subparsers(
        dest="action", required=True
    )
    check = policy.add_parser("check", help="validate policy files without serving")
    check.add_argument("files", nargs="+")
    check.add_argument(
        "--against",
        metavar="RUNNING",
        help="the policy a gateway serves: also fail when applying FILE to it would need "
        "a restart (a running gateway does not apply such a change)",
    )
    check.set_defaults(run=_check)
    schema = policy.add_parser("schema", help="print the policy's JSON Schema")
    schema.add_argument("--out")
    schema.set_defaults(run=_schema)
    reference = policy.add_parser(
        "reference", help="print the policy reference page (docs/reference/policy.md)"
    )
    reference.add_argument("--out")
    reference.set_defaults(run=_reference)


def _check(args: argparse.Namespace) -> int:
    running: Policy | None = None
    if args.against:
        try:
            running = load_policy_file(args.against)[0]
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            return 2
    failed = 0
    for path in args.files:
        try:
            policy = load_policy_file(path)[0]  # the loader a running gateway reloads with
        except PolicyError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        summary = f"{len(policy.models)} models, {len(policy.pools)} pools"
        restart = needs_restart(running, policy) if running is not None else []
        if restart:
            print(f"{path}: valid ({summary}), but needs a restart: {', '.join(restart)}")
            failed += 1
        else:
            print(f"{path}: ok ({summary})")
    return 1 if failed else 0


def _schema(args: argparse.Namespace) -> int:
    from gateway.policy.json_schema import policy_json_schema

    return _write(policy_json_schema(), args.out)


def _reference(args: argparse.Namespace) -> int:
    from gateway.policy.reference import render

    return _write(render(), args.out)


def _write(text: str, out: str | None) -> int:
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0
