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
        if not self._buf and b"\r" not in chunk:
            # Only `\n\n` can end an event here, and nothing is left from before.
            if len(chunk) >= 2 and chunk.find(b"\n\n") == len(chunk) - 2:
                return [chunk]  # the common case with vLLM: exactly one whole event
            # Several (an engine a step ahead): split in C, a fifth of the scan below.
            *complete, rest = chunk.split(b"\n\n")
            if rest:
                self._buf += rest
            return [event + b"\n\n" for event in complete]
        buf = self._buf
        buf += chunk
        # Where each terminator next occurs at or after `start` (-1: nowhere in the buffer),
        # found again only once an event ends past it. A burst of thousands of events in
        # one chunk (an engine ahead of a busy gateway) is thus split in one pass; searching
        # the rest of the buffer for every terminator at every event was quadratic, and held
        # the event loop long enough to miss a client leaving (16,000 events: 40 s).
        found = [buf.find(term) for term in _TERMINATORS]
        events: list[bytes] = []
        start = 0
        while True:
            end = -1
            for i, term in enumerate(_TERMINATORS):
                at = found[i]
                if 0 <= at < start:
                    at = found[i] = buf.find(term, start)
                if at >= 0 and (end < 0 or at + len(term) < end):
                    end = at + len(term)
            if end < 0:
                break
            events.append(bytes(buf[start:end]))
            start = end
        if start:
            del buf[:start]
        return events

    def flush(self) -> bytes:
        """Whatever is left when the stream ends: an unterminated final event, or nothing."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


def data_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
