"""SSE passthrough framing: events leave whole and byte-identical, however they arrive."""

from __future__ import annotations

import pytest

from gateway.chat.sse import SSEFramer

EVENTS = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"b\\n\\nc"}}]}\n\n',
    b"data: [DONE]\n\n",
]
STREAM = b"".join(EVENTS)


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 1000])
def test_events_come_out_whole_whatever_the_chunking(size: int) -> None:
    framer = SSEFramer()
    out: list[bytes] = []
    for chunk in split_every(STREAM, size):
        out.extend(framer.feed(chunk))
    assert out == EVENTS
    assert framer.flush() == b""


def test_one_chunk_with_several_events_is_split() -> None:
    assert SSEFramer().feed(STREAM) == EVENTS


def test_an_event_is_released_as_soon_as_its_blank_line_arrives() -> None:
    framer = SSEFramer()
    assert framer.feed(b"data: 1\n") == []
    assert framer.feed(b"\ndata: 2") == [b"data: 1\n\n"]
    assert framer.flush() == b"data: 2"


@pytest.mark.parametrize("terminator", [b"\r\n\r\n", b"\r\r", b"\n\n"])
def test_all_spec_line_endings_end_an_event(terminator: bytes) -> None:
    stream = b"event: x" + terminator + b"data: y" + terminator
    out: list[bytes] = []
    framer = SSEFramer()
    for chunk in split_every(stream, 3):
        out.extend(framer.feed(chunk))
    assert out == [b"event: x" + terminator, b"data: y" + terminator]


def test_comments_and_multiline_data_pass_through_untouched() -> None:
    event = b": keep-alive\ndata: line1\ndata: line2\nid: 7\n\n"
    assert SSEFramer().feed(event) == [event]


def test_unterminated_tail_is_returned_by_flush_only() -> None:
    framer = SSEFramer()
    assert framer.feed(b"data: partial") == []
    assert framer.flush() == b"data: partial"
    assert framer.flush() == b""
