"""The reference pages list what the code defines, read from the code itself: every
operation of the gateway's OpenAPI document (docs/reference/api.md), every `gateway` and
`engine` subcommand and option (cli.md), every error `code` the gateway writes
(errors.md), every `X-Gateway-*` header (headers.md), every metric family (metrics.md)
and every Redis key (docs/operations/redis.md). A new one without its line in the
reference fails here. (The policy reference is generated whole:
tests/unit/policy/test_reference.py.)"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.cli import build_parser as engine_parser
from gateway import headers
from gateway.api.openapi import openapi_document
from gateway.cli import build_parser as gateway_parser
from gateway.state import keys
from tests.unit.telemetry.exported import exported_families

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs/reference"


def page(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


# -- the HTTP API -------------------------------------------------------------------------


def test_the_api_reference_lists_every_operation_of_the_openapi_document() -> None:
    text = page("api.md")
    operations = [
        f"{method.upper()} {path}"
        for path, item in openapi_document()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]
    assert len(operations) > 20
    missing = [operation for operation in operations if operation not in text]
    assert not missing, f"operations missing from docs/reference/api.md: {missing}"


# -- the command line ---------------------------------------------------------------------


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


COMMANDS = [*commands(gateway_parser(), "gateway"), *commands(engine_parser(), "engine")]


@pytest.mark.parametrize(("command", "options"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_the_cli_reference_lists_each_command_and_its_options(
    command: str, options: list[str]
) -> None:
    rows = [  # a command may have a row per form
        line
        for line in page("cli.md").splitlines()
        if line.startswith((f"| `{command} ", f"| `{command}`"))
    ]
    assert rows, f"docs/reference/cli.md has no row for `{command}`"
    missing = [option for option in options if not any(option in row for row in rows)]
    assert not missing, f"`{command}` options missing from docs/reference/cli.md: {missing}"


# -- errors, headers, metrics ---------------------------------------------------------------


def error_codes() -> dict[str, str]:
    """Every error `code` written as a literal in gateway/ (`code="..."` in a call, or a
    class's `code = "..."`) -> the first file writing it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            values: list[ast.expr] = []
            if isinstance(node, ast.Call):
                values = [kw.value for kw in node.keywords if kw.arg == "code"]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "code" for t in node.targets
            ):
                values = [node.value]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found.setdefault(value.value, str(path.relative_to(ROOT)))
    return found


def test_the_errors_reference_lists_every_code_the_gateway_writes() -> None:
    codes = error_codes()
    assert len(codes) > 20  # the walk found them
    text = page("errors.md")
    missing = {code: where for code, where in codes.items() if f"`{code}`" not in text}
    assert not missing, f"error codes missing from docs/reference/errors.md: {missing}"


def test_the_headers_reference_lists_every_gateway_header_and_no_other() -> None:
    text = page("headers.md")
    documented = set(re.findall(r"`(X-Gateway-[A-Za-z-]+)`", text))
    assert documented == set(headers.MEANINGS)


def test_the_metrics_reference_lists_every_metric_family() -> None:
    text = page("metrics.md")
    missing = [
        f"{name}_total" if kind == "counter" else name
        for name, kind in exported_families().items()
        if f"`{name}_total`" not in text and f"`{name}`" not in text
    ]
    assert not missing, f"metrics missing from docs/reference/metrics.md: {missing}"


def test_every_metric_the_docs_name_is_exported() -> None:
    """The other way round, over every page and the deploy files (Grafana's queries have
    their own test): a renamed metric leaves no page pointing at the old name."""
    exported: set[str] = set()
    for name, kind in exported_families().items():
        exported.add(name)
        if kind == "counter":
            exported.add(f"{name}_total")
        if kind == "histogram":
            exported |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    named = re.compile(r"(?<![A-Za-z0-9_:.])(gateway_[a-z0-9_]*[a-z0-9])(?![A-Za-z0-9_(])")
    unknown: dict[str, str] = {}
    for source in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in named.findall(source.read_text(encoding="utf-8")):
            if name not in exported:
                unknown.setdefault(name, str(source.relative_to(ROOT)))
    assert not unknown, unknown


def test_the_redis_page_lists_every_key_as_the_key_module_does() -> None:
    """docs/operations/redis.md carries gateway/state/keys.py's table of keys, line for line."""
    assert keys.__doc__ is not None
    lines = keys.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["key", "type"])
    table = []
    for line in lines[start:]:
        if not line.strip():
            break
        table.append(line.strip())
    assert len(table) > 20
    documented = {
        line.strip() for line in (ROOT / "docs/operations/redis.md").read_text().splitlines()
    }
    missing = [line for line in table if line not in documented]
    assert not missing, missing
