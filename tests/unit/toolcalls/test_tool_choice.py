"""A chat request's `tool_choice` read: the call its answer owes, the tools it may call,
and what the engine is sent in place of OpenAI's `allowed_tools`, which vLLM does not take."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.toolcalls.tool_choice import ANY_TOOL, AS_SENT, ToolChoice, read_tool_choice

DECLARED = frozenset({"search", "book", "cancel"})


def allowed(mode: str, *names: str) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


@pytest.mark.parametrize(
    ("tool_choice", "read"),
    [
        (None, AS_SENT),
        ("auto", AS_SENT),
        ("none", AS_SENT),
        ("required", ToolChoice(demand=ANY_TOOL)),
        ({"type": "function", "function": {"name": "book"}}, ToolChoice(demand="book")),
        (allowed("auto", "search", "book"),
         ToolChoice(allowed=frozenset({"search", "book"}), engine="auto")),
        (allowed("required", "search", "book"),
         ToolChoice(demand=ANY_TOOL, allowed=frozenset({"search", "book"}), engine="required")),
        (allowed("required", "search"),
         ToolChoice(demand="search", allowed=frozenset({"search"}),
                    engine={"type": "function", "function": {"name": "search"}})),
    ],
    ids=["absent", "auto", "none", "required", "named", "allowed-auto", "allowed-required",
         "allowed-required-one"],
)  # fmt: skip
def test_each_choice_reads_as_what_the_answer_owes(tool_choice: Any, read: ToolChoice) -> None:
    assert read_tool_choice(tool_choice, DECLARED) == read


@pytest.mark.parametrize(
    ("tool_choice", "param"),
    [
        ({"type": "allowed_tools"}, "tool_choice.allowed_tools"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "any", "tools": []}},
         "tool_choice.allowed_tools.mode"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
         "tool_choice.allowed_tools.tools"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": ["search"]}},
         "tool_choice.allowed_tools.tools[0]"),
        (allowed("auto", "search", "drop_tables"), "tool_choice.allowed_tools.tools[1]"),
    ],
    ids=["no-spec", "bad-mode", "no-tools", "not-an-object", "undeclared"],
)  # fmt: skip
def test_a_malformed_allowed_tools_choice_is_a_400_naming_where(
    tool_choice: Any, param: str
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        read_tool_choice(tool_choice, DECLARED)
    assert raised.value.param == param
    assert raised.value.status == 400
