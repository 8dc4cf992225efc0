"""The plain checks a tool's schema compiles to (gateway/toolcalls/arguments_schema.py)
give the verdicts of the bounded JSON Schema validator they stand in for, on every real
tool of tau-bench and BFCL: each call as made, and each call changed in the ways a model
gets arguments wrong (a field dropped, given another type, null, a list or an object,
an unknown field added, a number sent as a string). Where the plain checks do not apply
exactly, the schema goes to the validator itself (`plain` is None) and nothing is
compared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.offline.tools_eval import RealCall, load_bfcl, load_tau_bench
from gateway.toolcalls.arguments_schema import prepare_arguments
from tests.conftest import SHARED_DATA

_OTHER_VALUES: tuple[Any, ...] = (None, 7, 2.5, "text", True, [], ["a", 1], {}, {"k": "v"})


def variants(real: RealCall) -> Iterator[tuple[str, Any]]:
    """The call's arguments as made, then changed one field at a time."""
    arguments = real.arguments
    yield "as made", arguments
    properties = real.parameters.get("properties") or {}
    for name, value in arguments.items():
        yield f"{name} dropped", {k: v for k, v in arguments.items() if k != name}
        for other in _OTHER_VALUES:
            if other != value or type(other) is not type(value):
                yield f"{name} = {other!r}", {**arguments, name: other}
        if type(value) in (int, float):
            yield f"{name} as a string", {**arguments, name: str(value)}
    for name in properties:
        if name not in arguments:
            yield f"{name} = 'x' added", {**arguments, name: "x"}
    yield "unknown field", {**arguments, "zz_not_declared": 1}
    yield "not an object", [arguments]


def calls() -> list[RealCall]:
    return [
        *load_tau_bench(SHARED_DATA, limit=0).calls,
        *load_bfcl(SHARED_DATA, limit=0).calls,
    ]


@pytest.fixture(scope="module")
def every_call() -> list[RealCall]:
    found = calls()
    assert len(found) > 300  # both datasets were read
    return found


def test_plain_checks_and_the_bounded_validator_agree_on_every_real_tool(
    every_call: list[RealCall],
) -> None:
    compared = 0
    disagreements: list[str] = []
    prepared: dict[str, Any] = {}
    for real in every_call:
        key = repr(real.parameters)
        schema = prepared.get(key)
        if schema is None:
            schema = prepared[key] = prepare_arguments(real.parameters)
        if schema.plain is None:
            continue  # the validator judges this schema itself
        for what, value in variants(real):
            plain = schema.plain(value, "")
            bounded = schema.bounded.first_error(value)
            compared += 1
            if (plain is None) != (bounded is None):
                disagreements.append(f"{real.name}, {what}: plain {plain!r}, bounded {bounded!r}")
    assert compared > 5_000
    assert not disagreements, disagreements[:10]


def test_most_real_tool_schemas_compile_to_plain_checks(every_call: list[RealCall]) -> None:
    schemas = {repr(real.parameters): real.parameters for real in every_call}
    plain = [s for s in schemas.values() if prepare_arguments(s).plain is not None]
    assert len(plain) >= 0.9 * len(schemas), (len(plain), len(schemas))
