"""SSE passthrough framing: events leave whole and byte-identical, however they arrive."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def split_naively(stream: bytes) -> list[bytes]:
    """The splitting SSEFramer must match: at each point, the event that ends first (at the
    end of any terminator), searched afresh. Too slow for bursts, simple to trust."""
    events: list[bytes] = []
    start = 0
    while True:
        ends = [at + len(t) for t in TERMINATORS if (at := stream.find(t, start)) >= 0]
        if not ends:
            return events
        events.append(stream[start : min(ends)])
        start = min(ends)


TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")


@given(
    pieces=st.lists(st.sampled_from([b"data: x", b"\n", b"\r", b"\r\n", b"\n\n", b"yz"]),
                    max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)  # fmt: skip
def test_any_mix_of_line_endings_in_any_chunking_splits_as_the_spec_reads(
    pieces: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(pieces)
    framer = SSEFramer()
    out: list[bytes] = []
    at = 0
    for cut in [*sorted({c for c in cuts if c < len(stream)}), len(stream)]:
        out.extend(framer.feed(stream[at:cut]))
        at = cut
    rest = framer.flush()
    assert b"".join(out) + rest == stream
    assert out == split_naively(stream)[: len(out)]


def test_a_burst_of_events_in_one_chunk_comes_out_whole() -> None:
    # An engine ahead of the gateway hands over thousands of events at once
    # (gateway/chat/stream.py pauses between them); they are split in one pass.
    burst = [b'data: {"n":%d}\n\n' % i for i in range(16_000)]
    assert SSEFramer().feed(b"".join(burst)) == burst
