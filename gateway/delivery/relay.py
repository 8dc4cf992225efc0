"""Relaying an engine's SSE stream to the client.

Each event is forwarded as soon as it is complete; nothing is buffered beyond one read of
the engine's body. The events one read completed go to the client in one write (`sends`):
an engine a step ahead of its client (a 0 ms engine, a burst after a pause) would
otherwise cost a write, and a trip through the server, per event. After the first byte,
failures travel in-stream as OpenAI sends them, and the engine request is aborted (its
connection dropped) unless it ended normally. `on_end` gives the replica's slot back, with
the stream's outcome for its breaker, exactly once, whether the stream ends, breaks, the
client goes away mid-stream, or the stream is closed before its first event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from gateway.chat.conformance import NotAnAnswer
from gateway.chat.stream import ChatEvent, chat_event_batches
from gateway.delivery.events import EventSteps
from gateway.errors import GatewayError, InvalidToolCall, UpstreamError
from gateway.fleet.replicas import Replica
from gateway.resilience.dispatcher import SlotOutcome
from gateway.toolcalls.stream_hold import ToolCallHold
from gateway.upstream.client import UpstreamResponse

log = logging.getLogger(__name__)


class StreamRelay:
    def __init__(
        self,
        replica: Replica,
        response: UpstreamResponse,
        steps: EventSteps,
        *,
        deadline: float,
        idle_s: float,
        on_end: Callable[[SlotOutcome], None],
        hold: ToolCallHold | None = None,
    ) -> None:
        self.replica = replica
        # Tool-call deltas held until each call is complete and judged (gateway/toolcalls/).
        self._hold = hold
        self._response = response
        self._steps = steps
        self._deadline = deadline
        self._idle_s = idle_s
        # Gives the replica's slot back and tells its breaker how the stream ended.
        self._on_end = on_end
        self._broken = False
        self._finished = False
        self._closed = False

    async def events(self) -> AsyncIterator[bytes]:
        """The events to send, one by one as each completes; a failure ends them with an
        error event. (For converters to other APIs' events, which read one at a time.)"""
        # Closed with this generator, not whenever the collector finds it: closing is what
        # gives the replica's slot back and aborts the engine's request.
        async with aclosing(self._batches()) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def sends(self) -> AsyncIterator[bytes]:
        """The same events, those one read of the engine's body completed joined into one
        write."""
        async with aclosing(self._batches()) as batches:
            async for batch in batches:
                yield batch[0] if len(batch) == 1 else b"".join(batch)

    async def _batches(self) -> AsyncGenerator[list[bytes], None]:
        """What to send after each read of the engine's body: every event it completed
        (once held tool calls and steps passed it), ending with an error event when the
        stream fails."""
        stream = chat_event_batches(
            self._response.next_chunk, idle_s=self._idle_s, deadline=self._deadline
        )
        try:
            async with aclosing(stream):
                hold, steps = self._hold, self._steps
                async for arrived in stream:
                    out: list[bytes] = []
                    for event in arrived:
                        try:
                            # Awaited only where something may wait (a call held, a turn
                            # kept): a coroutine per event cost more than the steps.
                            if hold is None or hold.untouched(event):
                                events: list[ChatEvent] = [event]
                            else:
                                events = await hold.take(event)
                        except InvalidToolCall as exc:  # refused: the rest is not wanted
                            out.append(stream_error(exc))
                            yield out
                            return
                        for each in events:
                            try:
                                passed = steps.observe(each)
                                if steps.reply_to_keep:
                                    await steps.keep_reply()
                            except NotAnAnswer as exc:  # the engine's failure: no turn is kept
                                self._broken = True
                                log.warning("stream from %s: %s", self.replica.id, exc)
                                out.append(stream_error(exc.upstream_error()))
                                yield out
                                return
                            except GatewayError as exc:  # the turn could not be kept
                                out.append(stream_error(exc))
                                yield out
                                self._finished = True  # the engine did finish
                                return
                            if passed is not None:
                                out.append(passed)
                    if out:
                        yield out
            self._finished = True
        except UpstreamError as exc:  # broke, went quiet, or ended before [DONE]
            self._broken = True
            log.warning("stream from %s broke: %s", self.replica.id, exc.message)
            yield [stream_error(exc)]
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_end("ok" if self._finished else "failed" if self._broken else "released")
        if self._finished:
            self._response.release()
        else:
            self._response.abort()


def stream_error(error: GatewayError) -> ChatEvent:
    """Errors after the first byte travel in-stream, as OpenAI sends them."""
    return ChatEvent.written(error.body())
