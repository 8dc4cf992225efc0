"""What the agent is told in place of a held call, and how a later request of the same
conversation is recognised without a session: the hold message names the approval id,
and a client that resends its history resends that message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway.approvals.records import ID_PATTERN, Approval

_ARGUMENTS_CHARS = 200  # per call: enough to recognise the action, not a data dump


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _arguments(raw: Any) -> str:
    try:
        parsed = orjson.loads(raw) if isinstance(raw, str) and raw else raw
    except orjson.JSONDecodeError:
        parsed = raw
    if isinstance(parsed, dict):
        text = ", ".join(f"{k}: {orjson.dumps(v).decode()}" for k, v in parsed.items())
    else:
        text = str(parsed or "")
    if len(text) > _ARGUMENTS_CHARS:
        text = text[: _ARGUMENTS_CHARS - 3] + "..."
    return text or "no arguments"


def _guarded_calls(approval: Approval) -> list[dict[str, Any]]:
    return [c for c in approval.tool_calls if c["function"]["name"] in approval.guarded]


def arguments_summary(approval: Approval) -> str:
    calls = _guarded_calls(approval)
    if len(calls) == 1:
        return _arguments(calls[0]["function"].get("arguments"))
    return "; ".join(
        f"{c['function']['name']}: {_arguments(c['function'].get('arguments'))}" for c in calls
    )


def _action(approval: Approval) -> str:
    return f"{_names(approval.guarded)} ({arguments_summary(approval)})"


def hold_text(template: str, approval: Approval) -> str:
    text = template.format(
        tools=_names(approval.guarded),
        arguments=arguments_summary(approval),
        approval_id=approval.id,
    )
    others = [
        c["function"]["name"]
        for c in approval.tool_calls
        if c["function"]["name"] not in approval.guarded
    ]
    if others:
        text += f" The other call(s) of this turn, {_names(others)}, wait with it."
    return text


def pending_text(approval: Approval) -> str:
    return (
        f"The action {_action(approval)} is still waiting for a reviewer's approval "
        f"(approval {approval.id}); it has not been run."
    )


def denied_text(approval: Approval) -> str:
    decision = approval.decision
    reason = f" Reason: {decision.reason}" if decision is not None and decision.reason else ""
    return (
        f"A reviewer denied the action {_action(approval)} (approval {approval.id}); "
        f"it was not run.{reason}"
    )


def expired_text(approval: Approval) -> str:
    return (
        f"Nobody approved the action {_action(approval)} in time (approval {approval.id} "
        "expired); it was not run."
    )


def approval_named_in(messages: Any) -> str | None:
    """The approval id the conversation's last assistant message names, if any: after a
    hold that is the hold message the client resent."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            found = ID_PATTERN.search(_text_of(message.get("content")))
            return found.group(0) if found else None
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""
