"""What a chat request's `tool_choice` makes its answer owe, and what the engine is sent.

- `auto`, `none`, absent: the model may answer in text.
- `required`: at least one call, to any declared tool.
- a named function: a call to it.
- `allowed_tools` (OpenAI's, since 2025): `{"type": "allowed_tools", "allowed_tools":
  {"mode": "auto" | "required", "tools": [{"type": "function", "function": {"name":
  ...}}]}}`: calls only to the listed tools, and with `required` at least one. Its point is
  the prompt cache: the request keeps declaring every tool, so the prompt's prefix stays the
  same turn after turn, while each turn narrows what may be called. vLLM does not take it,
  so the engine is sent the whole tool list with `auto` or `required` (or, with one allowed
  tool and `required`, that tool named, which vLLM constrains), and the restriction is the
  gateway's tool-call check: a call to a tool not allowed is invalid (`tool_not_allowed`)
  and goes through the policy's steps like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest

ANY_TOOL = ""  # a call owed to any of the allowed (or declared) tools

_MODES = ("auto", "required")


@dataclass(frozen=True)
class ToolChoice:
    """`demand`: the call the answer owes (`ANY_TOOL`, a tool's name) or None;
    `allowed`: the tools it may call, None for every declared one; `engine`: the
    `tool_choice` to send the engine instead of the client's, None to send it as it came."""

    demand: str | None = None
    allowed: frozenset[str] | None = None
    engine: Any = None


AS_SENT = ToolChoice()


def read_tool_choice(tool_choice: Any, declared: frozenset[str]) -> ToolChoice:
    """The request's `tool_choice` read; `declared`: the names of the request's tools.
    A malformed `allowed_tools` choice, or one naming undeclared tools, is a 400; other
    shapes are the engine's to refuse."""
    if tool_choice == "required":
        return ToolChoice(demand=ANY_TOOL)
    if not isinstance(tool_choice, dict):
        return AS_SENT
    kind = tool_choice.get("type")
    if kind == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return ToolChoice(demand=name) if isinstance(name, str) and name else AS_SENT
    if kind != "allowed_tools":
        return AS_SENT
    spec = tool_choice.get("allowed_tools")
    if not isinstance(spec, dict):
        raise _invalid("must be an object with `mode` and `tools`", "allowed_tools")
    mode = spec.get("mode")
    if mode not in _MODES:
        raise _invalid("`mode` must be `auto` or `required`", "allowed_tools.mode")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise _invalid("`tools` must list at least one tool", "allowed_tools.tools")
    names: list[str] = []
    for index, tool in enumerate(listed):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        where = f"allowed_tools.tools[{index}]"
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(name, str)
        ):
            raise _invalid(
                'each tool must be `{"type": "function", "function": {"name": ...}}`', where
            )
        if name not in declared:
            raise _invalid(f"`{name[:100]}` is not among the request's `tools`", where)
        names.append(name)
    allowed = frozenset(names)
    if mode == "auto":
        return ToolChoice(allowed=allowed, engine="auto")
    if len(allowed) == 1:  # one tool: named, which the engine constrains
        (only,) = allowed
        named = {"type": "function", "function": {"name": only}}
        return ToolChoice(demand=only, allowed=allowed, engine=named)
    return ToolChoice(demand=ANY_TOOL, allowed=allowed, engine="required")


def declared_names(tools: list[Any]) -> frozenset[str]:
    """The function names a request's `tools` declare."""
    names = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def _invalid(problem: str, where: str) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid `tool_choice`: {problem}.", param=f"tool_choice.{where}", code="invalid_value"
    )
