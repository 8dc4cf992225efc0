"""Tool calls in a relayed stream: text flows as it comes, each call is held until it is
complete and judged, then sent on whole, in order.

Engines stream a call as deltas (its id and name, then its arguments in pieces). Passing
them on as they come would show the client half a call it might have to discard. So the
deltas of each call are taken out of the events and kept; a call is complete when a delta
of a later call begins or the choice finishes. A complete, valid (or repaired) call is
sent as one delta just before whatever completed it.

An invalid call is settled as the policy says. Where its steps only refuse, at once: an
in-stream `invalid_tool_call` error, or the assistant's text saying what was refused.
Where they ask again or escalate, every later call is held too, and when the engine's
answer ends the whole reply goes to `recover` (the pipeline asks again unstreamed, or one
tier up, as for a whole answer); the calls of what it settles on are sent, but for those
the client already has, or its refusal. The text of a re-asked answer is not sent: the
client has the first answer's (and the re-ask repeats the calls only, not that text).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.chat.messages import Message
from gateway.chat.replies import merge_call_delta
from gateway.chat.sse import data_event
from gateway.chat.stream import ChatEvent
from gateway.errors import InvalidToolCall
from gateway.toolcalls.checker import Judgement, ToolCheck
from gateway.toolcalls.contract import Review

# The whole reply (text and every call, as the engine made them) -> the settled message.
Recover = Callable[[Message], Awaitable[Message]]


class ToolCallHold:
    def __init__(self, check: ToolCheck, recover: Recover | None = None) -> None:
        self._check = check
        self._recover = recover
        self._pending: dict[int, dict[str, Any]] = {}  # by the engine's call index
        self._made: list[dict[str, Any]] = []  # every complete call, in order
        self._sent: list[tuple[Any, Any]] = []  # (name, arguments) passed on, in order
        self._settling = False  # an invalid call waits for the end of the answer
        self._refused = False
        self._head: dict[str, Any] = {}  # id, created, model of the stream's chunks

    def untouched(self, event: bytes) -> bool:
        """Whether the event passes as it is: text, usage, `[DONE]` while no call is open
        (`take` would return it alone, unparsed). While an answer that owes a call
        (`tool_choice` required or named) has made none, its finish is looked at too."""
        if self._pending or event.find(b'"tool_calls"') >= 0:
            return False
        owed = self._check.demand is not None and not self._made
        return not owed or event.find(b'"finish_reason"') < 0

    async def take(self, event: ChatEvent) -> list[ChatEvent]:
        """The events to pass on for one engine event (none, it, or released calls
        first). Raises InvalidToolCall when a call is refused as an error."""
        if self.untouched(event):
            return [event]
        out: list[ChatEvent] = []
        changed = False
        chunks = event.chunks()
        for chunk in chunks:
            if not isinstance(chunk, dict):
                continue
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                self._head = {k: chunk.get(k) for k in ("id", "created", "model")}
                delta = choice.get("delta")
                calls = delta.get("tool_calls") if isinstance(delta, dict) else None
                if calls and isinstance(delta, dict):
                    changed = True
                    for piece in calls:
                        out += self._feed(piece)
                    choice["delta"] = {k: v for k, v in delta.items() if k != "tool_calls"}
                if choice.get("finish_reason") is not None:
                    out += self._release(None)
                    owed = not (self._settling or self._refused)  # else settled already
                    if owed and (issue := self._check.missing(self._made)):
                        out += self._invalid(Judgement(Review([]), (issue,)))
                    out += await self._settle()
                    if self._refused and not self._sent:
                        choice["finish_reason"] = "stop"  # nothing is left to call
                        changed = True
        if not changed:
            return [*out, event]
        rest = [c for c in chunks if isinstance(c, dict) and _says_something(c)]
        out += [ChatEvent.written(c) for c in rest]
        return out

    def _feed(self, piece: dict[str, Any]) -> list[ChatEvent]:
        index = int(piece.get("index", 0))
        released = self._release(index) if index not in self._pending else []
        merge_call_delta(self._pending, piece)
        return released

    def _release(self, before: int | None) -> list[ChatEvent]:
        """The pending calls of index below `before` (all: None), judged and sent."""
        done = sorted(i for i in self._pending if before is None or i < before)
        out: list[ChatEvent] = []
        for index in done:
            call = self._pending.pop(index)
            self._made.append(call)
            if self._settling:
                continue  # judged with the whole reply when the answer ends
            judgement = self._check.judge([call], count=False, whole=False)
            if judgement.valid:
                self._check.note(judgement)
                self._check.count("repaired" if judgement.review.repairs else "valid")
                out.append(self._call_event(judgement.review.calls[0]))
                continue
            out += self._invalid(judgement)
        return out

    def _invalid(self, judgement: Judgement) -> list[ChatEvent]:
        """An invalid call (or a call owed and not made): left for the end of the answer
        when the policy's steps may ask again or escalate, else refused now."""
        if self._recover is not None and self._check.may_settle(judgement):
            self._settling = True  # the pipeline judges (and counts) it with the rest
            return []
        self._check.note(judgement)
        self._check.count("refused")
        if self._check.refuse_as == "error":
            raise InvalidToolCall(f"The model's tool call was refused: {judgement.summary()}")
        self._refused = True
        return [self._text_event(self._check.refusal(judgement))]

    async def _settle(self) -> list[ChatEvent]:
        if not self._settling or self._recover is None:
            return []
        self._settling = False
        # The text already sent is not repeated to the engine: the calls are what was wrong.
        reply: Message = {"role": "assistant", "content": None, "tool_calls": self._made}
        settled = await self._recover(reply)
        calls = settled.get("tool_calls") or []
        if not calls:
            self._refused = True
            return [self._text_event(settled)]
        out: list[ChatEvent] = []
        for call in calls:
            function = call.get("function") or {}
            if (function.get("name"), function.get("arguments")) not in self._sent:
                out.append(self._call_event(call))
        return out

    def _call_event(self, call: dict[str, Any]) -> ChatEvent:
        function = call.get("function") or {}
        sent = {**call, "index": len(self._sent), "type": call.get("type") or "function"}
        self._sent.append((function.get("name"), function.get("arguments")))
        return self._event({"tool_calls": [sent]})

    def _text_event(self, message: Message) -> ChatEvent:
        text = message.get("content")
        return self._event({"content": text if isinstance(text, str) else ""})

    def _event(self, delta: dict[str, Any]) -> ChatEvent:
        chunk = {
            **self._head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        }
        return ChatEvent.parsed_as(data_event(orjson.dumps(chunk)), chunk)


def _says_something(chunk: dict[str, Any]) -> bool:
    """Whether a chunk with its calls taken out still carries anything: text, a role, a
    finish, usage, another choice."""
    if chunk.get("usage"):
        return True
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason") is not None or choice.get("index", 0) != 0:
            return True
        delta = choice.get("delta") or {}
        if any(v not in (None, "", []) for v in delta.values()):
            return True
    return False
