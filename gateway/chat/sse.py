"""Server-sent events framing for passthrough.

The gateway forwards an engine's stream event by event, as each completes, without
re-encoding a byte. Knowing where events end lets it stop cleanly between two events and
append a well-formed error event when the engine dies mid-stream.
"""

from __future__ import annotations

# An event ends at a blank line; the SSE spec allows all three line endings.
_TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")


class SSEFramer:
    """Incremental splitter: feed raw chunks, get back complete events (terminator included)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        if (
            not self._buf
            and chunk.endswith(b"\n\n")
            and b"\r" not in chunk
            and chunk.count(b"\n\n") == 1
        ):
            # Fast path, the common case with vLLM: the chunk is exactly one whole event.
            return [chunk]
        self._buf += chunk
        events: list[bytes] = []
        start = 0
        while (end := self._next_end(start)) >= 0:
            events.append(bytes(self._buf[start:end]))
            start = end
        if start:
            del self._buf[:start]
        return events

    def flush(self) -> bytes:
        """Whatever is left when the stream ends: an unterminated final event, or nothing."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def _next_end(self, start: int) -> int:
        best = -1
        for term in _TERMINATORS:
            at = self._buf.find(term, start)
            if at >= 0 and (best < 0 or at + len(term) < best):
                best = at + len(term)
        return best


def data_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
