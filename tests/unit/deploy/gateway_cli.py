"""The gateway's own command line, for deploy tests: parse the arguments a Deployment,
a Compose service or the Dockerfile gives `gateway`, without serving."""

from __future__ import annotations

import argparse
from unittest import mock

import gateway.cli
import gateway.cli.serve


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """What `gateway <argv>` would serve with; fails the test if the CLI rejects `argv`."""
    seen: list[argparse.Namespace] = []

    def capture(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    with mock.patch.object(gateway.cli.serve, "_serve", capture):
        try:
            gateway.cli.main(argv)
        except SystemExit as exc:
            raise AssertionError(f"`gateway {' '.join(argv)}` is refused by the CLI") from exc
    assert len(seen) == 1, f"`gateway {' '.join(argv)}` does not run `serve`"
    return seen[0]
