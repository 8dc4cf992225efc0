"""A response's head leaves with the first write after it, or alone at the end of the
loop's turn; nothing else waits (gateway/edge/held_heads.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from gateway.edge.held_heads import HeldHeads

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Wire(asyncio.Transport):
    """What reached the socket, one entry per system call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.calls.append(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_a_head_and_its_body_go_in_one_write() -> None:
    async def scenario() -> list[bytes]:
        wire = Wire()
        held = HeldHeads(wire, asyncio.get_running_loop())
        held.write(HEAD)
        assert wire.calls == []
        held.write(b"{}")
        await asyncio.sleep(0)
        return wire.calls

    assert asyncio.run(scenario()) == [HEAD + b"{}"]


def test_a_head_with_nothing_after_it_leaves_at_the_end_of_the_turn() -> None:
    async def scenario() -> list[bytes]:
        wire = Wire()
        held = HeldHeads(wire, asyncio.get_running_loop())
        held.write(HEAD)  # a stream whose first event is still being generated
        await asyncio.sleep(0)
        first = list(wire.calls)
        held.write(b"5\r\nhello\r\n")  # the event, when it comes, is not held
        assert wire.calls == [HEAD, b"5\r\nhello\r\n"]
        return first

    assert asyncio.run(scenario()) == [HEAD]


def test_only_heads_wait() -> None:
    async def scenario() -> None:
        wire = Wire()
        held = HeldHeads(wire, asyncio.get_running_loop())
        held.write(b"5\r\nhello\r\n")
        assert wire.calls == [b"5\r\nhello\r\n"]
        assert held.get_write_buffer_size() == 0

    asyncio.run(scenario())


def test_closing_sends_the_held_head_first_and_aborting_drops_it() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        wire = Wire()
        held = HeldHeads(wire, loop)
        held.write(HEAD)
        assert held.get_write_buffer_size() == len(HEAD)
        held.close()
        assert wire.calls == [HEAD] and wire.closed
        await asyncio.sleep(0)
        assert wire.calls == [HEAD]  # not written twice

        wire = Wire()
        held = HeldHeads(wire, loop)
        held.write(HEAD)
        held.abort()
        await asyncio.sleep(0)
        assert wire.calls == [] and wire.aborted

    asyncio.run(scenario())
