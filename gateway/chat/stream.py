"""The one reader of an engine's chat (or text completion) stream: its bytes, framed into
events, each parsed at most once, whoever reads it.

A `ChatEvent` is the event's bytes as the engine sent them (it is `bytes`, so it is
relayed as it is), with its JSON chunks parsed on first request and kept: telemetry, the
checkpoint's reply collector, conformance and the Responses converter all read the same
parse. Most relayed events are never parsed at all (telemetry pre-filters the few it
reads: gateway/telemetry/record.py). The end of the stream is detected here only:
`data: [DONE]`, then the body's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson

from gateway.chat.sse import SSEFramer, data_event
from gateway.errors import UpstreamError, UpstreamTimeout

DONE = object()  # the chunk `data: [DONE]` stands for
# An engine ahead of the gateway leaves its events buffered, so relaying them suspends
# nowhere: without a pause now and then, a burst of thousands holds the event loop, every
# other client waits, and a client that left is noticed only after the whole burst (its
# disconnect is a message the loop must deliver; the engine generated on meanwhile).
_EVENTS_PER_PAUSE = 32
# A `data:` line's JSON object, or DONE.
Chunk = dict[str, Any] | object


class ChatEvent(bytes):
    """One whole SSE event (terminator included), its chunks parsed once, when asked."""

    _chunks: list[Chunk] | None = None

    @classmethod
    def of(cls, event: bytes) -> ChatEvent:
        return event if isinstance(event, ChatEvent) else cls(event)

    @classmethod
    def written(cls, chunk: dict[str, Any]) -> ChatEvent:
        """An event the gateway writes itself (an in-stream error), its chunk known."""
        return cls.parsed_as(data_event(orjson.dumps(chunk)), chunk)

    @classmethod
    def parsed_as(cls, event: bytes, chunk: dict[str, Any]) -> ChatEvent:
        """`event`, whose one chunk is known already (written from it)."""
        made = cls(event)
        made._chunks = [chunk]
        return made

    def chunks(self) -> list[Chunk]:
        """The JSON objects the event's `data:` lines carry, and DONE for `[DONE]`;
        anything else (comments, malformed data) is skipped."""
        if self._chunks is None:
            self._chunks = list(_parse(self))
        return self._chunks

    @property
    def done(self) -> bool:
        """Whether this is the stream's last event, `data: [DONE]` (read without parsing)."""
        return self.find(b"[DONE]") >= 0 and any(
            line.startswith(b"data:") and line[5:].strip() == b"[DONE]"
            for line in self.splitlines()
        )


def chunks_of(event: bytes) -> list[Chunk]:
    """An event's chunks: the kept parse of a ChatEvent, else parsed now."""
    return event.chunks() if isinstance(event, ChatEvent) else list(_parse(event))


def _parse(event: bytes) -> list[Chunk]:
    chunks: list[Chunk] = []
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            chunks.append(DONE)
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict):
            chunks.append(chunk)
    return chunks


async def chat_events(
    next_chunk: Callable[[], Awaitable[bytes]], *, idle_s: float, deadline: float | None = None
) -> AsyncGenerator[ChatEvent, None]:
    """The stream's events as each completes. Raises UpstreamTimeout when the engine sends
    nothing for `idle_s` (or by `deadline`, a loop time), and UpstreamError when the body
    ends before `[DONE]`: never a silent truncation."""
    batches = chat_event_batches(next_chunk, idle_s=idle_s, deadline=deadline)
    async with aclosing(batches):
        async for batch in batches:
            for event in batch:
                yield event


async def chat_event_batches(
    next_chunk: Callable[[], Awaitable[bytes]], *, idle_s: float, deadline: float | None = None
) -> AsyncGenerator[list[ChatEvent], None]:
    """`chat_events`, the events that one read of the engine's body completed given
    together (at most `_EVENTS_PER_PAUSE` at a time): a relay sends them to its client in
    one write, as they arrived, instead of one write each."""
    loop = asyncio.get_running_loop()
    framer = SSEFramer()
    saw_done = False
    since_pause = 0
    while True:
        until = loop.time() + idle_s
        try:
            async with asyncio.timeout_at(until if deadline is None else min(deadline, until)):
                chunk = await next_chunk()
        except TimeoutError:
            raise UpstreamTimeout("The engine stopped sending mid-stream.") from None
        if not chunk:
            if saw_done:
                return
            raise UpstreamError("The engine's stream ended without [DONE].")
        completed = framer.feed(chunk)
        for start in range(0, len(completed), _EVENTS_PER_PAUSE):
            batch = [ChatEvent(raw) for raw in completed[start : start + _EVENTS_PER_PAUSE]]
            # `[DONE]` ends a stream, so it is looked for from a batch's end.
            saw_done = saw_done or any(event.done for event in reversed(batch))
            yield batch
            since_pause += len(batch)
            if since_pause >= _EVENTS_PER_PAUSE:
                since_pause = 0
                await asyncio.sleep(0)


def first_choice(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """The chunk's choice of index 0: the one answer a converter to another API's events
    re-tells (those APIs have no `n`)."""
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) == 0:
            found: dict[str, Any] = choice
            return found
    return None
