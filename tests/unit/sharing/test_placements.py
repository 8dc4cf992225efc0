"""A batch of placements survives the stream's wire form; an entry that is not one is
refused with `MalformedBatch`, never another error."""

from __future__ import annotations

import pytest

from gateway.sharing.placements import MalformedBatch, Placement, decode_batch, encode_batch

TOP = 2**64 - 1  # block hashes are unsigned 64-bit


def test_a_batch_comes_back_as_it_was_sent() -> None:
    placements = [
        Placement("main/0123abcd", (1, TOP, 3), 4.0, session=TOP),
        Placement("main/0123abcd", (), 1.0, session=0),
        Placement("pool/with/slashes/89abcdef", (TOP - 1,), 2.5),
    ]
    batch = decode_batch(encode_batch("gw-1", 1234.5, placements))
    assert batch.gateway == "gw-1"
    assert batch.made_at == 1234.5
    assert list(batch.placements) == placements


def test_an_earlier_gateways_entry_without_sessions_is_read() -> None:
    """During a rolling upgrade the other gateways may write three-item heads."""
    fields = encode_batch("gw-old", 1.0, [Placement("main/x", (1, 2), 3.0)])
    fields[b"r"] = b'[["main/x", 3.0, 2]]'
    (placement,) = decode_batch(fields).placements
    assert placement == Placement("main/x", (1, 2), 3.0, session=None)


@pytest.mark.parametrize(
    "change",
    [
        {b"g": None},  # a field missing
        {b"t": b"yesterday"},
        {b"r": b"not json"},
        {b"r": b'[["main/x", 1.0]]'},  # a head without its count
        {b"r": b'[["main/x", 1.0, 5]]'},  # more blocks claimed than sent
        {b"r": b'{"main/x": 1}'},  # heads not a list
        {b"r": b'[["main/x", "1.0", 2]]'},  # work not a number
        {b"r": b'[["main/x", 1.0, true]]'},  # a count that is a boolean
        {b"r": b'[["main/x", 1.0, 2, "s"]]'},  # a session that is not a session key
        {b"r": b'[["main/x", 1.0, 2, -1]]'},
        {b"r": b'[["main/x", 1.0, 2, 18446744073709551616]]'},  # past 64 bits
        {b"r": b'[["main/x", 1.0, 2, null, 0]]'},  # a fifth item
        {b"b": b"\x00" * 7},  # not whole 64-bit hashes
    ],
)
def test_a_malformed_entry_is_refused(change: dict[bytes, bytes | None]) -> None:
    fields = encode_batch("gw-1", 1.0, [Placement("main/x", (1, 2), 3.0)])
    for name, value in change.items():
        if value is None:
            del fields[name]
        else:
            fields[name] = value
    with pytest.raises(MalformedBatch):
        decode_batch(fields)
