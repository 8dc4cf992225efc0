"""`gateway keys create | list | revoke`: tenants' API keys kept in Redis
(gateway/tenants/cli.py has the commands)."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import DEFAULT_POLICY, Subcommands, policy_path
from gateway.policy import PolicyError, load_policy
from gateway.tenants.cli import add_keys_parser, run_keys_command


def register(sub: Subcommands) -> None:
    add_keys_parser(sub, DEFAULT_POLICY).set_defaults(run=_keys)


def _keys(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(policy_path(args.policy))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    return run_keys_command(policy, args)
