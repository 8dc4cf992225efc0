"""What the gateway answers a call with, before it is HTTP: a whole body, or a stream of
events (relayed live from an engine, or replayed after it was read whole), and the
`X-Gateway-*` headers that say how it was served (gateway/headers.py). The pipeline
returns it; the Responses API converts it without re-parsing anything; the HTTP layer
renders it once (gateway/api/inference.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.chat.stream import ChatEvent
from gateway.delivery.whole import Answer


class EventStream(Protocol):
    """Events sent as they come; closed exactly once, iterated or not (the replica's slot
    behind a live stream is given back on close)."""

    def events(self) -> AsyncIterator[bytes]:
        """One event at a time (what converters to other APIs read)."""
        ...

    def sends(self) -> AsyncIterator[bytes]:
        """The bytes to write to the client: events, those ready together joined (here,
        for a stream that has nothing to join: one event per write)."""
        return self.events()

    def close(self) -> None: ...


class Replay(EventStream):
    """The events of a stream read whole, sent as the engine produced them."""

    def __init__(self, events: list[bytes]) -> None:
        self._events = events

    async def events(self) -> AsyncIterator[bytes]:
        for event in self._events:
            yield ChatEvent.of(event)  # a ChatEvent already when the engine's: parsed once

    def close(self) -> None:
        return None  # nothing held: the engine's answer was read whole


class ConvertedEvents(EventStream):
    """Another stream's events, each rewritten by `convert` as it passes; closing it closes
    the source (and gives its replica back)."""

    def __init__(
        self,
        convert: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]],
        source: EventStream,
    ) -> None:
        self._convert = convert
        self._source = source

    def events(self) -> AsyncIterator[bytes]:
        return self._convert(self._source.events())

    def close(self) -> None:
        self._source.close()


@dataclass(frozen=True)
class Served:
    headers: dict[str, str]
    body: bytes = b""
    media_type: str = "application/json"
    stream: EventStream | None = None
    parsed: dict[str, Any] | None = None  # the body, when a step parsed it already

    @classmethod
    def answer(cls, answer: Answer, headers: dict[str, str]) -> Served:
        """An answer read (or written) whole: replayed as a stream when it is one."""
        if answer.events is not None:
            return cls(headers, stream=Replay(answer.events))
        return cls(headers, answer.payload, answer.media_type, parsed=answer.completion)

    def completion(self) -> dict[str, Any]:
        """The whole body as JSON: the parse a step made, or (a kept or written answer)
        parsed now."""
        if self.parsed is not None:
            return self.parsed
        body = orjson.loads(self.body)
        return body if isinstance(body, dict) else {}
