"""What the subcommands share: the policy file they default to, and how they report."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any, TypeAlias

DEFAULT_POLICY = "policies/default.yaml"

# What `register(sub)` of each subcommand module is given (a string: argparse's class
# takes no type arguments at run time).
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def policy_path(explicit: str | None) -> str:
    return explicit or os.environ.get("GATEWAY_POLICY") or DEFAULT_POLICY


def print_report(
    result: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], str]
) -> int:
    print(json.dumps(result, indent=2) if as_json else table(result))
    return 0


def add_part(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--part",
        choices=("both", "design", "report", "all"),
        default="both",
        help="the evaluation protocol's parts (docs/development/evaluation.md): each apart "
        "(default), one of them, or all the data pooled",
    )
