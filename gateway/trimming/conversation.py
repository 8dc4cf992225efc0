"""The structure of a chat conversation: stable prefix, tool calls paired with their
results by position, and which results are snapshots of a declared entity.

Pairing is by position, never by `tool_call_id`: real agents reuse ids (gpt-4o does 71
times in the tau-bench data), so an id map would pair results with the wrong calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.chat.messages import Message
from gateway.policy.sessions import StateToolSpec
from gateway.untrusted.schemas import TooCostly


@dataclass(frozen=True)
class ToolResult:
    index: int  # position of the tool message in the conversation
    name: str | None  # the called function, None for an orphan
    arguments: str


@dataclass(frozen=True)
class Snapshot:
    index: int
    entity: str  # "<kind>:<id>"
    state: dict[str, Any]


def prefix_length(messages: list[Message]) -> int:
    """Leading system / developer messages: the stable prefix trimming never touches."""
    n = 0
    while n < len(messages) and messages[n].get("role") in ("system", "developer"):
        n += 1
    return n


def tool_results(messages: list[Message]) -> dict[int, ToolResult]:
    """Each tool message's call, paired by position after its assistant message."""
    out: dict[int, ToolResult] = {}
    pending: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            pending = list(message.get("tool_calls") or ())
        elif role == "tool":
            call = pending.pop(0) if pending else None
            function = (call or {}).get("function") or {}
            out[i] = ToolResult(i, function.get("name"), str(function.get("arguments") or ""))
        else:
            pending = []
    return out


def snapshot_of(
    result: ToolResult, content: Any, specs: dict[str, StateToolSpec]
) -> tuple[Snapshot | None, bool]:
    """The entity snapshot this tool result is, if any; and whether it failed its schema."""
    spec = specs.get(result.name or "")
    if spec is None or not isinstance(content, str):
        return None, False
    try:
        state = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None, False  # an error message, not a state
    if not isinstance(state, dict):
        return None, False
    if (schema := spec.checked_schema) is not None:
        try:
            failed = schema.first_error(state) is not None
        except TooCostly:  # a result the bounded check cannot vouch for is not a snapshot
            failed = True
        if failed:
            return None, True
    if spec.id_field is not None:
        key = state.get(spec.id_field)
    else:
        try:
            arguments = orjson.loads(result.arguments or "{}")
        except orjson.JSONDecodeError:
            return None, False
        key = arguments.get(spec.id_argument) if isinstance(arguments, dict) else None
    if not isinstance(key, str | int) or isinstance(key, bool):
        return None, False
    return Snapshot(result.index, f"{spec.entity}:{key}", state), False


def problems(messages: list[Message], *, to_send: bool = True) -> list[str]:
    """Why chat templates (or the engine) would reject this conversation; [] when valid.

    System messages only first; then a user message; an assistant's tool calls followed by
    exactly their results, in order; no tool message anywhere else; no two user messages
    in a row (strict templates require alternation); ends on a user or tool message (one
    about to be sent; a conversation kept for later, `to_send=False`, may end on the
    assistant's answer).
    """
    found: list[str] = []
    start = prefix_length(messages)
    if any(m.get("role") in ("system", "developer") for m in messages[start:]):
        found.append("system message after the conversation started")
    body = messages[start:]
    if not body:
        return [*found, "no conversation"]
    if body[0].get("role") != "user":
        found.append("the conversation does not start with a user message")
    expected = 0
    previous_role = None
    for i, message in enumerate(body):
        role = message.get("role")
        if role == "tool":
            if expected == 0:
                found.append(f"message {start + i}: tool result without a call")
            expected = max(0, expected - 1)
        else:
            if expected:
                found.append(f"message {start + i}: {expected} tool call(s) without results")
                expected = 0
            if role == "user" and previous_role == "user":
                found.append(f"message {start + i}: two user messages in a row")
            if role == "assistant":
                expected = len(message.get("tool_calls") or ())
        previous_role = role
    if expected:
        found.append(f"the last {expected} tool call(s) have no results")
    if to_send and body[-1].get("role") not in ("user", "tool"):
        found.append("the conversation does not end on a user or tool message")
    return found


def latest_states(
    messages: list[Message], specs: dict[str, StateToolSpec]
) -> dict[str, dict[str, Any]]:
    """Each declared entity's latest snapshot in these messages, by `<kind>:<id>`."""
    states: dict[str, dict[str, Any]] = {}
    for index, result in tool_results(messages).items():
        snapshot, _ = snapshot_of(result, messages[index].get("content"), specs)
        if snapshot is not None:
            states[snapshot.entity] = snapshot.state
    return states
