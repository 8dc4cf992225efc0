"""The command-line reference (docs/reference/cli.md) lists every subcommand of `gateway`
and `engine` and every option each takes, read from the parsers themselves: a new option
without its line in the reference fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli import build_parser as engine_parser
from gateway.cli import build_parser as gateway_parser

PAGE = Path(__file__).resolve().parents[3] / "docs/reference/cli.md"


def commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, list[str]]]:
    """(`gateway policy check`, its long options) for every command that runs something."""
    subcommands = [
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ]
    if not subcommands:
        options = [
            option
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        ]
        yield path, options
        return
    for name, child in subcommands[0].choices.items():
        yield from commands(child, f"{path} {name}")


def rows(command: str) -> list[str]:
    """The reference's table rows for `command` (a command may have several forms)."""
    return [
        line
        for line in PAGE.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| `{command} ") or line.startswith(f"| `{command}`")
    ]


ALL = [*commands(gateway_parser(), "gateway"), *commands(engine_parser(), "engine")]


@pytest.mark.parametrize(("command", "options"), ALL, ids=[command for command, _ in ALL])
def test_the_reference_lists_the_command_and_each_of_its_options(
    command: str, options: list[str]
) -> None:
    listed = rows(command)
    assert listed, f"docs/reference/cli.md has no row for `{command}`"
    missing = [option for option in options if not any(option in row for row in listed)]
    assert not missing, f"`{command}` options missing from docs/reference/cli.md: {missing}"
