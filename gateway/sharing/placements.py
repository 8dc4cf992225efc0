"""A placement (a request's prefix blocks went to a replica, adding work to it, and made
it its conversation's home) and the wire form of a batch of them in a Redis Stream entry.

One stream entry carries one flush's batch, so a busy gateway writes one entry per flush
interval however many requests it routed. Its fields:

    g   the publishing gateway's instance id
    t   when the batch's first placement was made (publisher's wall clock, seconds)
    r   JSON: [[replica id, work, block count, session], ...] in order; session is the
        64-bit `RouteRequest.session_hash` of the request's conversation, or null (a gateway
        of an earlier version writes three items: no session)
    b   every placement's block hashes, concatenated, as little-endian unsigned 64-bit

Block hashes are 64-bit (gateway/prompt/blocks.py), so 8 bytes each: a 195K-token agent
request (about 1,500 blocks of 512 bytes) is 12 KB. Pure: no I/O here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

_BLOCK = struct.Struct("<Q")


@dataclass(frozen=True)
class Placement:
    replica: str  # Replica.id: the same on every gateway for the same pool and URL
    blocks: tuple[int, ...]
    work: float
    session: int | None = None  # RouteRequest.session_hash (gateway/routing/costs.py)


@dataclass(frozen=True)
class Batch:
    gateway: str
    made_at: float
    placements: tuple[Placement, ...]


class MalformedBatch(ValueError):
    """A stream entry that is not a batch this code wrote."""


def encode_batch(
    gateway: str, made_at: float, placements: Sequence[Placement]
) -> dict[bytes, bytes]:
    heads = [[p.replica, p.work, len(p.blocks), p.session] for p in placements]
    blocks = [block for p in placements for block in p.blocks]
    return {
        b"g": gateway.encode(),
        b"t": repr(made_at).encode(),
        b"r": orjson.dumps(heads),
        b"b": struct.pack(f"<{len(blocks)}Q", *blocks),
    }


def decode_batch(fields: Mapping[bytes, bytes]) -> Batch:
    try:
        gateway = fields[b"g"].decode()
        made_at = float(fields[b"t"])
        heads = orjson.loads(fields[b"r"])
        raw = fields[b"b"]
        if len(raw) % _BLOCK.size:
            raise MalformedBatch("block bytes are not whole 64-bit hashes")
        blocks = struct.unpack(f"<{len(raw) // _BLOCK.size}Q", raw)
        placements, start = [], 0
        for head in heads:
            replica, work, count, session = _head(head)
            placements.append(
                Placement(replica, blocks[start : start + count], float(work), session)
            )
            start += count
    except MalformedBatch:
        raise
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise MalformedBatch(str(exc)) from exc
    if start != len(blocks):
        raise MalformedBatch("block counts do not add up to the blocks sent")
    return Batch(gateway, made_at, tuple(placements))


def _head(head: object) -> tuple[str, float, int, int | None]:
    if not isinstance(head, list) or len(head) not in (3, 4):
        raise MalformedBatch("a placement head is not [replica, work, count, session]")
    replica, work, count, session = (*head, None) if len(head) == 3 else head
    if (
        not isinstance(replica, str)
        or isinstance(work, bool)
        or not isinstance(work, int | float)
        or isinstance(count, bool)
        or not isinstance(count, int)
        or count < 0
        or not (session is None or (isinstance(session, int) and 0 <= session < 1 << 64))
    ):
        raise MalformedBatch("a placement head is not [replica, work, count, session]")
    return replica, float(work), count, session
