"""Relaying an engine's SSE stream to the client.

Each event is forwarded as soon as it is complete; nothing is buffered beyond one event.
After the first byte, failures travel in-stream as OpenAI sends them, and the engine
request is aborted (its connection dropped) unless it ended normally. `on_end` gives the
replica's slot back, with the stream's outcome for its breaker, exactly once, whether the
stream ends, breaks, the client goes away mid-stream, or the response is cancelled before
its first byte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.chat.conformance import NotAnAnswer, conform_event
from gateway.chat.messages import Message
from gateway.chat.replies import ReplyCollector
from gateway.chat.sse import SSEFramer, data_event, is_done
from gateway.errors import GatewayError, UpstreamError, UpstreamTimeout
from gateway.fleet.replicas import Replica
from gateway.resilience.dispatcher import Outcome
from gateway.telemetry.record import ResultFacts
from gateway.upstream.client import UpstreamResponse

log = logging.getLogger(__name__)

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class StreamRelay:
    def __init__(
        self,
        replica: Replica,
        response: UpstreamResponse,
        *,
        deadline: float,
        idle_s: float,
        conform: bool = False,
        on_done: Callable[[Message | None, dict[str, Any] | None], Awaitable[object]] | None = None,
        hide_usage: bool = False,
        on_end: Callable[[Outcome], None],
        facts: ResultFacts | None = None,
        capture: bool = False,
    ) -> None:
        self.replica = replica
        # Gives the replica's slot back and tells its breaker how the stream ended.
        self._on_end = on_end
        self._broken = False
        # A session turn: collect the reply as it passes and checkpoint it before [DONE];
        # collected too when the trace records the answer's content.
        self._on_done = on_done
        self._reply = ReplyCollector() if on_done is not None or capture else None
        # The gateway asked for the usage chunk, not the client: it is not passed on.
        self._hide_usage = hide_usage
        # Model, usage and finish reasons, for telemetry (read from the few events that
        # carry them).
        self._facts = facts if facts is not None else ResultFacts()
        self._conform = conform
        self._response = response
        self._deadline = deadline
        self._idle_s = idle_s
        self._finished = False
        self._saw_done = False
        self._closed = False

    async def events(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        framer = SSEFramer()
        try:
            while True:
                try:
                    async with asyncio.timeout_at(min(self._deadline, loop.time() + self._idle_s)):
                        chunk = await self._response.next_chunk()
                except TimeoutError:
                    self._broken = True
                    yield stream_error(UpstreamTimeout("The engine stopped sending mid-stream."))
                    return
                except UpstreamError as exc:
                    self._broken = True
                    log.warning("stream from %s broke: %s", self.replica.id, exc.message)
                    yield stream_error(exc)
                    return
                if not chunk:
                    if self._saw_done:
                        self._finished = True
                        return
                    # The body ended and the stream did not: never a silent truncation.
                    self._broken = True
                    log.warning("stream from %s ended without [DONE]", self.replica.id)
                    yield stream_error(UpstreamError("The engine's stream ended without [DONE]."))
                    return
                for event in framer.feed(chunk):
                    try:
                        passed = await self._take(event)
                    except NotAnAnswer as exc:  # the engine's failure: no turn is kept
                        self._broken = True
                        log.warning("stream from %s: %s", self.replica.id, exc)
                        yield stream_error(exc.upstream_error())
                        return
                    except GatewayError as exc:  # the turn could not be kept
                        yield stream_error(exc)
                        self._finished = True  # the engine did finish
                        return
                    if passed is not None:
                        yield passed
        finally:
            self.close()

    async def _take(self, event: bytes) -> bytes | None:
        """One whole event: noted, collected, the turn kept after its last one; what to
        pass on (None: the usage chunk only the gateway asked for). Raises NotAnAnswer for
        a chunk of the wrong shape, or the GatewayError that kept the turn from being
        kept."""
        self._saw_done = self._saw_done or is_done(event)
        usage_only = self._facts.observe_event(event)
        if self._reply is not None and not self._reply.done:
            self._reply.feed(event)
            if self._reply.done:
                self._facts.reply = self._reply.message()
                if self._on_done is not None:
                    await self._on_done(self._reply.message(), self._reply.usage)
        if usage_only and self._hide_usage:
            return None
        return conform_event(event) if self._conform else event

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_end("ok" if self._finished else "failed" if self._broken else "released")
        if self._finished:
            self._response.release()
        else:
            self._response.abort()


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always closes its relay, even if never iterated."""

    def __init__(self, relay: StreamRelay, headers: dict[str, str]) -> None:
        super().__init__(
            relay.events(), media_type="text/event-stream", headers={**STREAM_HEADERS, **headers}
        )
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.relay.close()


class ReplayedStream(StreamingResponse):
    """A stream read whole before it is passed on (its answer had to be checked first),
    sent event by event as the engine produced it."""

    def __init__(self, events: list[bytes], headers: dict[str, str]) -> None:
        super().__init__(
            _replay(events), media_type="text/event-stream", headers={**STREAM_HEADERS, **headers}
        )


async def _replay(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def stream_error(error: GatewayError) -> bytes:
    """Errors after the first byte travel in-stream, as OpenAI sends them."""
    return data_event(orjson.dumps(error.body()))
