"""The seeded faults: each kind's seeder (the faulty version of a clean call, or None where
the kind does not apply) and what the checker must make of it, caught as a problem
(`CAUGHT_AS`) or repaired (`REPAIRED_BY`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.offline.tools_eval.data import RealCall, arguments_text
from gateway.toolcalls.contract import Problem, Repair

FaultKind = Literal[
    "unknown_tool", "missing_required", "wrong_type", "extra_field",
    "truncated_json", "code_fence", "string_number",
]  # fmt: skip
CAUGHT_AS: dict[FaultKind, Problem] = {
    "unknown_tool": "unknown_tool",
    "missing_required": "schema",
    "wrong_type": "schema",
    "extra_field": "schema",
}
REPAIRED_BY: dict[FaultKind, Repair] = {
    "truncated_json": "closed_json",
    "code_fence": "code_fence",
    "string_number": "coerced",
}


@dataclass(frozen=True)
class Seeded:
    """A faulty call and the tools it is checked against."""

    call: dict[str, Any]
    tools: list[dict[str, Any]]


# A fault seeder: the faulty version of a clean call, or None where the kind does not apply.
Seeder = Callable[[RealCall, random.Random], Seeded | None]


def _with(real: RealCall, name: str | None = None, arguments: str | None = None) -> dict[str, Any]:
    function = dict(real.call["function"])
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    return {**real.call, "function": function}


def _dumps(arguments: dict[str, Any]) -> str:
    return orjson.dumps(arguments).decode()


def _unknown_tool(real: RealCall, rng: random.Random) -> Seeded | None:
    declared = {tool["function"]["name"] for tool in real.tools}
    name = f"{real.name}_v2"
    while name in declared:
        name += "_v2"
    return Seeded(_with(real, name=name), real.tools)


def _missing_required(real: RealCall, rng: random.Random) -> Seeded | None:
    present = [n for n in real.parameters.get("required") or [] if n in real.arguments]
    if not present:
        return None
    dropped = rng.choice(present)
    arguments = {k: v for k, v in real.arguments.items() if k != dropped}
    return Seeded(_with(real, arguments=_dumps(arguments)), real.tools)


# One value per JSON type, none a string a repair could read as a number or a boolean.
_WRONG_VALUES: tuple[tuple[str, Any], ...] = (
    ("string", "x"),
    ("integer", 7),
    ("number", 2.5),
    ("boolean", True),
    ("array", []),
    ("object", {}),
    ("null", None),
)


def _wrong_type(real: RealCall, rng: random.Random) -> Seeded | None:
    properties = real.parameters.get("properties") or {}
    typed = [
        name
        for name in real.arguments
        if isinstance(properties.get(name), dict) and isinstance(properties[name].get("type"), str)
    ]
    if not typed:
        return None
    name = rng.choice(typed)
    declared = properties[name]["type"]
    # An integer is a number too: a `number` gets neither.
    same = {declared, "integer"} if declared == "number" else {declared}
    value = rng.choice([v for kind, v in _WRONG_VALUES if kind not in same])
    arguments = {**real.arguments, name: value}
    return Seeded(_with(real, arguments=_dumps(arguments)), real.tools)


def _extra_field(real: RealCall, rng: random.Random) -> Seeded | None:
    properties = real.parameters.get("properties") or {}
    if real.arguments.keys() - properties.keys():
        return None  # already has an undeclared property: the strict copy rejects it clean
    name = "unexpected_field"
    while name in properties:
        name += "_x"
    strict = [
        _strict_copy(tool) if tool["function"]["name"] == real.name else tool for tool in real.tools
    ]
    arguments = {**real.arguments, name: "x"}
    return Seeded(_with(real, arguments=_dumps(arguments)), strict)


def _strict_copy(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = {**(tool["function"].get("parameters") or {}), "additionalProperties": False}
    return {**tool, "function": {**tool["function"], "parameters": parameters}}


def _truncated_json(real: RealCall, rng: random.Random) -> Seeded | None:
    text = arguments_text(real).rstrip()
    cut = text.rstrip("}] \t\r\n")
    if cut == text:
        return None
    return Seeded(_with(real, arguments=cut), real.tools)


def _code_fence(real: RealCall, rng: random.Random) -> Seeded | None:
    return Seeded(_with(real, arguments=f"```json\n{arguments_text(real)}\n```"), real.tools)


def _string_number(real: RealCall, rng: random.Random) -> Seeded | None:
    properties = real.parameters.get("properties") or {}
    numeric = [
        name
        for name, value in real.arguments.items()
        if type(value) in (int, float)
        and isinstance(properties.get(name), dict)
        and properties[name].get("type") in ("integer", "number")
    ]
    if not numeric:
        return None
    name = rng.choice(numeric)
    arguments = {**real.arguments, name: orjson.dumps(real.arguments[name]).decode()}
    return Seeded(_with(real, arguments=_dumps(arguments)), real.tools)


SEEDERS: dict[FaultKind, Seeder] = {
    "unknown_tool": _unknown_tool,
    "missing_required": _missing_required,
    "wrong_type": _wrong_type,
    "extra_field": _extra_field,
    "truncated_json": _truncated_json,
    "code_fence": _code_fence,
    "string_number": _string_number,
}
