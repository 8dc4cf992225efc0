"""A response's head and the first of its body sent to the client in one write.

uvicorn writes a response's status line and headers the moment the app sends
`http.response.start`, and its body with the next message: two writes, so two system
calls, two TCP segments and two wake-ups of the client for every answer, when the body is
nearly always ready in the same turn of the event loop. Counted with strace over 200
requests of `make bench`'s tau-bench body: 4.0 writes per answer became 3.0 (5.1 to 4.3
streamed).

`HeldHeads` wraps a connection's transport: a write that is a response head (it starts
`HTTP/1.`) is held back, and goes out with the next write (one `writelines`, one
system call), or by itself at the end of the current turn of the loop when no other
write follows in it (an answer whose first byte is still being generated). Nothing else
is held: a streamed event is never delayed, and a head at most until the loop's next
turn. (A body write that happens to begin `HTTP/1.` is held the same way: later by a
turn at most, never out of order.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class HeldHeads(asyncio.Transport):
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    # -- writing --------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif data[:7] == b"HTTP/1.":
            self._held = bytes(data)
            self._loop.call_soon(self._release)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def _release(self) -> None:
        """The head by itself: nothing followed it in the turn it was written."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def write_eof(self) -> None:
        self._release()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        self._release()  # a head held is part of what was written before the close
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    # -- the rest, as the transport has it ------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()
