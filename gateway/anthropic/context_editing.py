"""Anthropic's context editing (`context_management.edits`, beta `context-management-2025-06-27`),
applied by the gateway before the engine is asked, as Anthropic's API applies it before the
model is: the client keeps its whole history and sends it every turn; the engine is sent
the edited one, and the answer says what was cleared (`context_management.applied_edits`).

- `clear_tool_uses_20250919`: once the prompt passes `trigger` (input tokens, 100,000 by
  default, or a number of tool uses), every tool result but the `keep` most recent (3) is
  replaced by a placeholder, oldest first; tools named in `exclude_tools` are never
  cleared; `clear_tool_inputs` (true, or a list of tool names) empties the calls' inputs
  too; with `clear_at_least`, nothing is cleared unless that many tokens would be.
- `clear_thinking_20251015`: the history's thinking (each assistant message's `reasoning`,
  gateway/anthropic/convert.py) kept for the last `keep` assistant messages only (`all`:
  every one, which keeps the engine's cached prefix whole). Without it, Anthropic's rule:
  the last assistant message's thinking with thinking on, none with it off
  (`thinking_kept`).
- `compact_20260112`: compaction on the gateway's trimming (gateway/anthropic/compaction.py),
  parsed here and run by the Messages service.

Edits are a function of the request alone, so the same history is edited the same way on
every turn (the engine's prefix cache keeps hitting up to the oldest result newly cleared;
`clear_at_least` makes each such invalidation worth it, as Anthropic advises). Token counts
are the trimming tokenizer's (gateway/trimming/tokens.py), each message counted once per
process; a prompt whose bytes are under an `input_tokens` trigger is not tokenized at all
(a token is at least a byte), and under a `tool_uses` trigger only what is cleared is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.anthropic.compaction import COMPACT, Compact, compact_edit
from gateway.chat.messages import Message
from gateway.errors import InvalidRequest
from gateway.trimming.tokens import TokenCounter, message_text

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
CLEARED_RESULT = "[tool result cleared to save context]"
_DEFAULT_TRIGGER_TOKENS = 100_000
_DEFAULT_KEEP = 3
_MESSAGE_OVERHEAD = 4  # role and separators, as the trimmer counts them
_COUNTED_MAX = 20_000  # distinct messages whose counts are kept
_PARAM = "context_management"


@dataclass(frozen=True)
class ClearToolUses:
    trigger: Literal["input_tokens", "tool_uses"]
    trigger_value: int
    keep: int
    clear_at_least: int | None
    exclude_tools: frozenset[str]
    clear_inputs: bool | frozenset[str]  # every call's input, or only these tools'


@dataclass(frozen=True)
class ClearThinking:
    keep: int | None  # assistant messages whose thinking is kept, the last ones; None: all


Edit = ClearToolUses | ClearThinking | Compact


def parse_edits(value: Any) -> tuple[Edit, ...] | None:
    """The request's `context_management`, checked; None when it has none."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"`{_PARAM}` must be an object.", param=_PARAM)
    unknown = sorted(set(value) - {"edits"})
    if unknown:
        raise InvalidRequest(
            f"{_PARAM}.{unknown[0]}: Extra inputs are not permitted",
            param=f"{_PARAM}.{unknown[0]}",
        )
    edits = value.get("edits", [])
    if not isinstance(edits, list):
        raise InvalidRequest(f"`{_PARAM}.edits` must be a list.", param=f"{_PARAM}.edits")
    parsed: list[Edit] = []
    for i, edit in enumerate(edits):
        param = f"{_PARAM}.edits.{i}"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_TOOL_USES:
            assert isinstance(edit, dict)
            parsed.append(_clear_tool_uses(edit, param))
        elif kind == CLEAR_THINKING:
            assert isinstance(edit, dict)
            if any(isinstance(e, ClearToolUses) for e in parsed):
                raise InvalidRequest(
                    f"`{CLEAR_THINKING}` must come before `{CLEAR_TOOL_USES}` in `edits`.",
                    param=f"{param}.type",
                )
            parsed.append(ClearThinking(_thinking_keep(edit.get("keep", None), param)))
        elif kind == COMPACT:
            assert isinstance(edit, dict)
            parsed.append(compact_edit(edit, param))
        else:
            raise InvalidRequest(
                f"Unknown context management edit `{kind}`: this gateway applies "
                f"`{CLEAR_TOOL_USES}`, `{CLEAR_THINKING}` and `{COMPACT}`.",
                param=f"{param}.type",
            )
    return tuple(parsed)


def _count(value: Any, kinds: tuple[str, ...], param: str, *, least: int) -> tuple[str, int]:
    """A `{type, value}` count (`trigger`, `keep`, `clear_at_least`)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in kinds:
        raise InvalidRequest(
            f"`{param}` must be an object whose `type` is "
            + " or ".join(f"`{k}`" for k in kinds)
            + ".",
            param=f"{param}.type",
        )
    assert isinstance(value, dict) and isinstance(kind, str)
    number = value.get("value")
    if type(number) is not int or number < least:
        raise InvalidRequest(
            f"`{param}.value` must be an integer of at least {least}.", param=f"{param}.value"
        )
    return kind, number


def _names(value: Any, param: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidRequest(f"`{param}` must be a list of tool names.", param=param)
    return frozenset(value)


def _clear_tool_uses(edit: dict[str, Any], param: str) -> ClearToolUses:
    trigger: tuple[str, int] = ("input_tokens", _DEFAULT_TRIGGER_TOKENS)
    if edit.get("trigger") is not None:
        kinds = ("input_tokens", "tool_uses")
        trigger = _count(edit["trigger"], kinds, f"{param}.trigger", least=1)
    keep = _DEFAULT_KEEP
    if edit.get("keep") is not None:
        keep = _count(edit["keep"], ("tool_uses",), f"{param}.keep", least=0)[1]
    least = None
    if edit.get("clear_at_least") is not None:
        least = _count(
            edit["clear_at_least"], ("input_tokens",), f"{param}.clear_at_least", least=0
        )[1]
    excluded: frozenset[str] = frozenset()
    if edit.get("exclude_tools") is not None:
        excluded = _names(edit["exclude_tools"], f"{param}.exclude_tools")
    inputs: bool | frozenset[str] = False
    value = edit.get("clear_tool_inputs")
    if isinstance(value, bool):
        inputs = value
    elif value is not None:
        inputs = _names(value, f"{param}.clear_tool_inputs")
    kind: Literal["input_tokens", "tool_uses"] = (
        "tool_uses" if trigger[0] == "tool_uses" else "input_tokens"
    )
    return ClearToolUses(kind, trigger[1], keep, least, excluded, inputs)


def _thinking_keep(value: Any, param: str) -> int | None:
    if value is None:
        return 1  # Anthropic's default: the last assistant turn's thinking
    if value == "all" or (isinstance(value, dict) and value.get("type") == "all"):
        return None
    return _count(value, ("thinking_turns",), f"{param}.keep", least=1)[1]


class Tally:
    """Tokens per message, each distinct message counted once (by its digest, so a long
    tool result is not kept twice), for the trigger and the `cleared_input_tokens`."""

    def __init__(self, tokens: TokenCounter) -> None:
        self._tokens = tokens
        self._counted: dict[bytes, int] = {}

    def message(self, message: Message) -> int:
        return self._count(orjson.dumps(message), lambda: message_text(message), _MESSAGE_OVERHEAD)

    def prompt(self, messages: list[Message], tools: Any) -> int:
        """The whole prompt's: its tools (Claude Code's are about 12,000 tokens, the same
        on every turn) and its messages."""
        if tools:
            raw = orjson.dumps(tools)
            tool_tokens = self._count(raw, raw.decode, 0)
        else:
            tool_tokens = 0
        return tool_tokens + sum(self.message(m) for m in messages)

    def text(self, text: str) -> int:
        raw = text.encode()
        return self._count(raw, lambda: text, 0)

    def _count(self, raw: bytes, text: Callable[[], str], overhead: int) -> int:
        key = hashlib.blake2b(raw, digest_size=16).digest()
        count = self._counted.get(key)
        if count is None:
            count = self._tokens.count(text()) + overhead
            if len(self._counted) >= _COUNTED_MAX:
                self._counted.clear()
            self._counted[key] = count
        return count


@dataclass(frozen=True)
class Edited:
    messages: list[Message]  # what the engine is sent
    applied: list[dict[str, Any]]  # `context_management.applied_edits`


def default_thinking(edits: tuple[Edit, ...] | None, thinking_on: bool) -> ClearThinking | None:
    """What is kept of the history's thinking when the request does not say: Anthropic's
    rule, the last assistant message's with thinking on, none with it off (whatever the
    edits say: thinking off, no past thought is read). None when the request's own
    `clear_thinking_20251015` decides (and is reported: `apply_edits`)."""
    if not thinking_on:
        return ClearThinking(keep=0)
    if any(isinstance(edit, ClearThinking) for edit in edits or ()):
        return None
    return ClearThinking(keep=1)


def clear_thinking(
    edit: ClearThinking, messages: list[Message], tally: Tally
) -> tuple[list[Message], dict[str, Any] | None]:
    """The messages with `reasoning` left on the last `edit.keep` assistant messages that
    carry it, and what was cleared (None when nothing was)."""
    if edit.keep is None:  # `all`
        return messages, None
    carrying = [i for i, m in enumerate(messages) if m.get("reasoning")]
    cut = carrying[: max(0, len(carrying) - edit.keep)]
    if not cut:
        return messages, None
    edited = list(messages)
    tokens = 0
    for i in cut:
        tokens += tally.text(edited[i]["reasoning"])
        edited[i] = {k: v for k, v in edited[i].items() if k != "reasoning"}
    report = {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": len(cut),
        "cleared_input_tokens": tokens,
    }
    return edited, report


def apply_edits(
    edits: tuple[Edit, ...], messages: list[Message], tools: Any, tally: Tally
) -> Edited:
    """The chat conversation (gateway/anthropic/convert.py's) with `edits` applied in order,
    and what each applied edit cleared. The messages given are not changed. Compaction is
    not applied here: it keeps state (gateway/anthropic/compaction.py)."""
    applied: list[dict[str, Any]] = []
    for edit in edits:
        if isinstance(edit, ClearToolUses):
            messages, report = _clear(edit, messages, tools, tally)
        elif isinstance(edit, ClearThinking):
            messages, report = clear_thinking(edit, messages, tally)
        else:
            continue
        if report is not None:
            applied.append(report)
    return Edited(messages, applied)


def _upper_bound(messages: list[Message], tools: Any) -> int:
    """At least the prompt's tokens: every token is at least one byte."""
    size = len(orjson.dumps(tools)) if tools else 0
    return size + sum(len(message_text(m).encode()) + _MESSAGE_OVERHEAD for m in messages)


def _clear(
    edit: ClearToolUses, messages: list[Message], tools: Any, tally: Tally
) -> tuple[list[Message], dict[str, Any] | None]:
    calls: list[tuple[int, int, str, str]] = []  # (message, call, call id, tool name)
    for i, message in enumerate(messages):
        for j, call in enumerate(message.get("tool_calls") or ()):
            name = (call.get("function") or {}).get("name")
            calls.append((i, j, str(call.get("id")), str(name)))
    if edit.trigger == "tool_uses":
        if len(calls) <= edit.trigger_value:
            return messages, None
    elif (
        _upper_bound(messages, tools) <= edit.trigger_value
        or tally.prompt(messages, tools) <= edit.trigger_value
    ):
        return messages, None
    older = calls[: max(0, len(calls) - edit.keep)]
    clearable = [c for c in older if c[3] not in edit.exclude_tools]
    results = {m.get("tool_call_id"): i for i, m in enumerate(messages) if m.get("role") == "tool"}
    edited = list(messages)
    cleared = 0
    for message_at, call_at, call_id, name in clearable:
        result_at = results.get(call_id)
        if result_at is not None and edited[result_at].get("content") != CLEARED_RESULT:
            edited[result_at] = {**edited[result_at], "content": CLEARED_RESULT}
            cleared += 1
        if edit.clear_inputs is True or (
            isinstance(edit.clear_inputs, frozenset) and name in edit.clear_inputs
        ):
            edited[message_at] = _without_input(edited[message_at], call_at)
    changed = [i for i, message in enumerate(edited) if message is not messages[i]]
    if not changed:
        return messages, None
    # only what changed is counted: under a `tool_uses` trigger the rest is never tokenized
    saved = sum(tally.message(messages[i]) - tally.message(edited[i]) for i in changed)
    if edit.clear_at_least is not None and saved < edit.clear_at_least:
        return messages, None
    report = {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": cleared,
        "cleared_input_tokens": max(0, saved),
    }
    return edited, report


def _without_input(message: Message, at: int) -> Message:
    calls = list(message["tool_calls"])
    call = calls[at]
    calls[at] = {**call, "function": {**call.get("function", {}), "arguments": "{}"}}
    return {**message, "tool_calls": calls}
