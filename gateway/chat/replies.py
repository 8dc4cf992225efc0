"""The assistant's reply of a turn, as a message the next turn's history can hold.

Messages are kept in the form chat templates render: role, content, name, tool calls
(id, type, function name and arguments) and tool_call_id; fields that are null or that no
template reads (refusal, annotations, audio, ...) are dropped, so the reply stored from
the engine and the same message resent by any client SDK compare equal.
"""

from __future__ import annotations

from typing import Any

from gateway.chat.conformance import check_shape
from gateway.chat.messages import Message
from gateway.chat.stream import DONE, chunks_of

_KEPT = ("role", "content", "name", "tool_call_id")


def normalise(message: Any) -> Message:
    if not isinstance(message, dict):
        return {"role": "user", "content": message}
    out: Message = {k: message[k] for k in _KEPT if message.get(k) is not None}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call(c) for c in calls if isinstance(c, dict)]
    if out.get("role") == "assistant" and "content" not in out and "tool_calls" not in out:
        out["content"] = ""
    return out


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    assert isinstance(function, dict)
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        "function": {"name": function.get("name"), "arguments": function.get("arguments") or ""},
    }


def reply_of(data: Any) -> tuple[Message | None, dict[str, Any] | None]:
    """The first choice's message and the usage of a chat completion already parsed."""
    choices = data.get("choices") if isinstance(data, dict) else None
    usage = data.get("usage") if isinstance(data, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    return (normalise(message) if isinstance(message, dict) else None), usage


def merge_call_delta(calls: dict[int, dict[str, Any]], piece: dict[str, Any]) -> None:
    """One streamed tool-call delta added to the calls put together so far, by index: the
    id and name when it carries them, its piece of the arguments appended."""
    slot = calls.setdefault(
        int(piece.get("index", 0)),
        {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
    )
    if piece.get("id"):
        slot["id"] = piece["id"]
    function = piece.get("function") or {}
    if function.get("name"):
        slot["function"]["name"] = function["name"]
    if isinstance(function.get("arguments"), str):
        slot["function"]["arguments"] += function["arguments"]


class ReplyCollector:
    """Builds the first choice's message from a chat completion stream, event by event."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False  # `data: [DONE]` seen: the engine finished the turn

    def feed(self, event: bytes) -> bool:
        """Take in one stream event; True when it was only the usage chunk that
        `stream_options.include_usage` adds (no choices). Raises NotAnAnswer when the
        chunk has the wrong shape."""
        usage_only = False
        for chunk in chunks_of(event):
            if chunk is DONE:
                self.done = True
            elif isinstance(chunk, dict):
                check_shape(chunk, "delta")
                self._take(chunk)
                usage_only = bool(chunk.get("usage")) and not chunk.get("choices")
        return usage_only

    def _take(self, chunk: dict[str, Any]) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                self._take_call(call)

    def _take_call(self, call: dict[str, Any]) -> None:
        merge_call_delta(self._calls, call)

    def message(self) -> Message:
        raw: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._calls:
            raw["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        return normalise(raw)
