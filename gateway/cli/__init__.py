"""`gateway` command line. Each group of subcommands is a module of this package with
`register(sub)` (its arguments) and what it runs: `serve`, `policy_files`, `replay`,
`evals`, `training`, `keys`.

gateway serve [--policy FILE] [--host H] [--port P] [--workers N]
gateway policy check FILE [FILE ...] [--against RUNNING]
gateway policy schema [--out FILE]
gateway policy reference [--out FILE]
gateway replay --trace FILE [--replicas N] [--cache-blocks M] [--policy FILE] [--json]
    [--gateways K[,K...] [--balancer random|round_robin] [--sharing none|placements[,...]]
     [--batch-ms B] [--lag-ms L] [--seed S]]
gateway trim-eval --trajectories FILE [--policy FILE] [--tokenizer FILE] [--part P] [--json]
gateway route-train --labels FILE --out FILE [--words] [--seed N]
gateway route-train --from-log FILE [--tier T] [--feedback-pass X] --out FILE
gateway route-eval --labels FILE [--policy FILE] [--artifact FILE] [--folds K] [--part P] [--json]
gateway route-eval --shadow LOG [--tier T] [--last N] [--json]
gateway tools-eval [--data DIR] [--out FILE] [--seed N] [--limit N]
gateway dataset export --log FILE --out FILE [--tenant T] [--no-feedback] [--policy FILE]
gateway keys create --tenant T [--name N] [--role approver] [--policy FILE]
gateway keys list --tenant T [--policy FILE]
gateway keys revoke KEY_ID [--policy FILE]
"""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

from gateway.cli import evals, keys, policy_files, replay, serve, training


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its options (docs/reference/cli.md lists them; a test keeps
    the two together)."""
    parser = argparse.ArgumentParser(prog="gateway", description="OpenAI-compatible agent gateway")
    parser.add_argument("--version", action="version", version=f"gateway {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (serve, policy_files, replay, evals, training, keys):
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


def _version() -> str:
    try:
        return version("agent-gateway")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"
