"""A request's tool contract: the tools it declared, and the check every call the engine
makes is held to before the agent sees it.

A call is valid when it names a declared tool, its arguments parse as one JSON object,
and that object satisfies the tool's own `parameters` schema. One that is not is repaired
when exactly one repair makes it valid (gateway/toolcalls/repair.py); otherwise its
problem is reported, and the policy decides what happens next (gateway/tool_call_steps.py).

Contracts are built once per distinct tool list (agents send the same tools every turn)
and kept in a small cache keyed by the tools' canonical bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.toolcalls.arguments_schema import ArgumentsSchema, TooCostly, prepare_arguments
from gateway.toolcalls.repair import closed, coerced, unfenced
from gateway.untrusted.schemas import UnsafeSchema

Problem = Literal[
    "unknown_tool",
    "invalid_json",
    "not_an_object",
    "schema",
    "denied",
    "no_tool_call",
    "tool_not_allowed",
]
Repair = Literal["code_fence", "closed_json", "coerced"]

_CACHED_CONTRACTS = 256


@dataclass(frozen=True)
class CallIssue:
    """What is wrong with one call, as the agent, the metrics and a re-ask are told."""

    index: int
    tool: str
    problem: Problem
    detail: str

    def describe(self) -> str:
        if self.problem == "no_tool_call":  # about the answer, not one of its calls
            return self.detail
        return f"call {self.index} to `{self.tool}`: {self.detail}"


@dataclass(frozen=True)
class Review:
    """The calls of one reply, checked: as they are to be sent (repaired ones replaced),
    the repairs made, and the problems left."""

    calls: list[dict[str, Any]]
    repairs: tuple[Repair, ...] = ()
    issues: tuple[CallIssue, ...] = ()
    arguments: tuple[Any, ...] = ()  # each call's parsed arguments (None where invalid)

    @property
    def valid(self) -> bool:
        return not self.issues


class ToolContract:
    def __init__(self, schemas: dict[str, ArgumentsSchema | None]) -> None:
        # None: a declared tool whose schema cannot be applied (refused as unsafe): its
        # arguments must still be a JSON object.
        self._schemas = schemas

    @property
    def tools(self) -> frozenset[str]:
        return frozenset(self._schemas)

    def review(
        self, calls: list[dict[str, Any]], repairs_allowed: Callable[[str], bool] | None = None
    ) -> Review:
        """`repairs_allowed(tool)`: whether a call to it may be repaired (default: yes)."""
        checked: list[dict[str, Any]] = []
        repairs: list[Repair] = []
        issues: list[CallIssue] = []
        parsed: list[Any] = []
        for index, call in enumerate(calls):
            result, made, issue, arguments = self.check(index, call, repairs_allowed)
            checked.append(result)
            repairs.extend(made)
            parsed.append(arguments)
            if issue is not None:
                issues.append(issue)
        return Review(checked, tuple(repairs), tuple(issues), tuple(parsed))

    def check(
        self,
        index: int,
        call: dict[str, Any],
        repairs_allowed: Callable[[str], bool] | None = None,
    ) -> tuple[dict[str, Any], list[Repair], CallIssue | None, Any]:
        """(the call as to be sent, repairs made, the problem left or None, its arguments)."""
        function = call.get("function") if isinstance(call.get("function"), dict) else None
        name = function.get("name") if function else None
        if not isinstance(name, str) or name not in self._schemas:
            declared = ", ".join(sorted(self._schemas)) or "none"
            detail = f"the tool `{name}` was not declared in this request (declared: {declared})"
            return call, [], CallIssue(index, str(name), "unknown_tool", detail), None
        assert function is not None
        text = function.get("arguments")
        text = text if isinstance(text, str) else ""
        schema = self._schemas[name]
        repair = repairs_allowed is None or repairs_allowed(name)
        arguments, made, problem = _parse(text, repair)
        if problem is not None:
            return call, [], CallIssue(index, name, *problem), None
        if not isinstance(arguments, dict):
            detail = "the arguments must be a JSON object"
            return call, [], CallIssue(index, name, "not_an_object", detail), None
        error = _schema_error(schema, arguments)
        if error is not None and schema is not None and repair:
            turned = coerced(arguments, schema.document)
            if turned is not None and _schema_error(schema, turned) is None:
                arguments, error = turned, None
                made.append("coerced")
        if error is not None:
            return call, [], CallIssue(index, name, "schema", error), None
        if made:
            fixed = {**function, "arguments": orjson.dumps(arguments).decode()}
            call = {**call, "function": fixed}
        return call, made, None, arguments


def _parse(text: str, repair: bool) -> tuple[Any, list[Repair], tuple[Problem, str] | None]:
    try:
        return orjson.loads(text or "{}"), [], None
    except orjson.JSONDecodeError as exc:
        failure = str(exc)
    if not repair:
        return None, [], ("invalid_json", f"the arguments are not valid JSON: {failure}")
    made: list[Repair] = []
    candidate = text
    inner = unfenced(candidate)
    if inner is not None:
        made.append("code_fence")
        candidate = inner
        try:
            return orjson.loads(candidate), made, None
        except orjson.JSONDecodeError:
            pass
    if (completed := closed(candidate)) is not None:
        try:
            return orjson.loads(completed), [*made, "closed_json"], None
        except orjson.JSONDecodeError:
            pass
    return None, [], ("invalid_json", f"the arguments are not valid JSON: {failure}")


def _schema_error(schema: ArgumentsSchema | None, arguments: Any) -> str | None:
    if schema is None:
        return None
    try:
        return schema.first_error(arguments)
    except TooCostly as exc:
        return f"the arguments could not be checked: {exc}"


class ToolContracts:
    """Contracts by the tools' canonical bytes, the most recently used kept."""

    def __init__(self, size: int = _CACHED_CONTRACTS) -> None:
        self._size = size
        self._kept: OrderedDict[bytes, ToolContract] = OrderedDict()

    def of(self, tools: list[Any], key: bytes | None = None) -> ToolContract:
        """`tools`: the request's declared tools (shape checked when it was parsed);
        `key`: their canonical bytes when the caller has them."""
        if key is None:
            key = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        contract = build_contract(tools)
        self._kept[key] = contract
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return contract


def build_contract(tools: list[Any]) -> ToolContract:
    schemas: dict[str, ArgumentsSchema | None] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object"}
        try:
            schemas[function["name"]] = prepare_arguments(parameters)
        except UnsafeSchema:
            schemas[function["name"]] = None
    return ToolContract(schemas)
