"""What is done to each event of an engine's stream, relayed live or read whole, in one
place: noted for telemetry, collected into the turn's reply (and the turn checkpointed
after its last event), the usage chunk only the gateway asked for dropped, and the chunk
made to conform. Every step reads the event's one parse (gateway/chat/stream.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.chat.conformance import conform_event
from gateway.chat.messages import Message
from gateway.chat.replies import ReplyCollector
from gateway.telemetry.record import ResultFacts

# Called with the turn's reply and usage once the engine finished it.
OnReply = Callable[[Message | None, dict[str, Any] | None], Awaitable[object]]


class EventSteps:
    def __init__(
        self,
        facts: ResultFacts,
        *,
        hide_usage: bool,
        conform: bool,
        collect: bool,
        on_reply: OnReply | None = None,
    ) -> None:
        # Model, usage and finish reasons, for telemetry.
        self.facts = facts
        # The gateway asked for the usage chunk, not the client: it is not passed on.
        self._hide_usage = hide_usage
        # Only logprobs chunks need fixing; every other event passes byte for byte.
        self._conform = conform
        # The reply, collected as it passes: for a session turn's checkpoint (`on_reply`,
        # called before `[DONE]` is passed on), an answer read whole, or a captured trace.
        self.reply = ReplyCollector() if collect or on_reply is not None else None
        self._on_reply = on_reply
        self.reply_to_keep = False  # the reply just ended: `keep_reply` before passing on

    async def take(self, event: bytes) -> bytes | None:
        """One whole event: what to pass on (None: the hidden usage chunk). Raises
        NotAnAnswer for a chunk of the wrong shape, or the GatewayError that kept the turn
        from being kept."""
        passed = self.observe(event)
        if self.reply_to_keep:
            await self.keep_reply()
        return passed

    def observe(self, event: bytes) -> bytes | None:
        """`take` without keeping the turn: when this event finished the reply and the
        turn is to be kept, `reply_to_keep` says so, and `keep_reply` must be awaited
        before the event is passed on. (A relay calls this for every event and awaits
        only at that one: a coroutine per event cost more than the step.)"""
        usage_only = self.facts.observe_event(event)
        reply = self.reply
        if reply is not None and not reply.done:
            reply.feed(event)
            if reply.done:
                self.facts.reply = reply.message()
                self.reply_to_keep = self._on_reply is not None
        if usage_only and self._hide_usage:
            return None
        return conform_event(event) if self._conform else event

    async def keep_reply(self) -> None:
        """The turn's reply handed to `on_reply` (its checkpoint), once."""
        self.reply_to_keep = False
        reply = self.reply
        if self._on_reply is not None and reply is not None:
            await self._on_reply(reply.message(), reply.usage)
