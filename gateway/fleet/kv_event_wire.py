"""vLLM's KV-cache events as they come off the wire, and one replica's view built from them.

An engine started with `--kv-events-config` (engine/profiles.py) publishes one ZMQ
multipart message after each scheduler step that changed its prefix cache:

    topic | sequence number (8 bytes, big-endian) | msgpack [ts, [event, ...], dp_rank]

Events are `BlockStored` (block hashes, parent hash, token ids, block size, medium, ...),
`BlockRemoved` (block hashes, medium) and `AllBlocksCleared`. vLLM 0.32 encodes each as a
map tagged by `type`; earlier releases as a tagged array `[type, fields in declaration
order]` (vLLM switched in 2026 and several decoders broke): both are read. Pure: the
sockets are gateway/fleet/kv_events.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

# vLLM: sha256 digests, or 64-bit integers under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES.
BlockHash = bytes | int

# The engine's own KV cache; other media are offloading tiers (CPU, storage), whose
# blocks are not what a request reuses at no cost.
PRIMARY_MEDIA = (None, "GPU")


@dataclass(frozen=True, slots=True)
class BlocksStored:
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_count: int
    block_size: int
    medium: str | None


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    hashes: tuple[BlockHash, ...]
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlocksStored | BlocksRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One message: the events of one engine step."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]
    unknown: int = 0  # events of a type this gateway does not know, skipped


class MalformedFrame(ValueError):
    """A message that is not vLLM's KV-event framing."""


# Tagged arrays carry the fields in vLLM's declaration order, after the tag.
_STORED_FIELDS = "block_hashes parent_block_hash token_ids block_size lora_id medium lora_name"
_ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": tuple(_STORED_FIELDS.split()),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """One ZMQ message (topic, sequence number, payload) as an `EventBatch`."""
    if len(frames) != 3:
        raise MalformedFrame(f"{len(frames)} frames, not 3 (topic, sequence, payload)")
    _topic, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise MalformedFrame(f"a sequence number of {len(seq_bytes)} bytes, not 8")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedFrame(f"payload is not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2:
        raise MalformedFrame("payload is not [ts, events, dp_rank]")
    ts, raw_events = batch[0], batch[1]
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(raw_events, list):
        raise MalformedFrame("payload is not [ts, events, dp_rank]")
    events: list[KvEvent] = []
    unknown = 0
    for raw in raw_events:
        event = decode_event(raw)
        if event is None:
            unknown += 1
        else:
            events.append(event)
    return EventBatch(seq, float(ts), tuple(events), unknown)


def decode_event(raw: object) -> KvEvent | None:
    """A map `{"type": ..., fields}` or a tagged array `[type, fields...]`; None for a
    well-formed event of a type this gateway does not know."""
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_ARRAY_FIELDS.get(kind, ()), raw[1:], strict=False))
    else:
        raise MalformedFrame(f"an event that is neither a map nor a tagged array: {raw!r:.80}")
    if kind == "BlockStored":
        token_ids = fields.get("token_ids")
        if not isinstance(token_ids, list):
            raise MalformedFrame("BlockStored without token_ids")
        return BlocksStored(
            hashes=_hashes(fields.get("block_hashes")),
            parent=_optional_hash(fields.get("parent_block_hash")),
            token_count=len(token_ids),
            block_size=_positive_int(fields.get("block_size"), "block_size"),
            medium=_optional_str(fields.get("medium")),
        )
    if kind == "BlockRemoved":
        return BlocksRemoved(
            hashes=_hashes(fields.get("block_hashes")),
            medium=_optional_str(fields.get("medium")),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(kind, str):
        raise MalformedFrame("an event without a type")
    return None


def _hashes(value: object) -> tuple[BlockHash, ...]:
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        raise MalformedFrame("block_hashes is not a list of bytes or integers")
    return tuple(value)


def _optional_hash(value: object) -> BlockHash | None:
    if value is None or _is_hash(value):
        return value  # type: ignore[return-value]  # narrowed by _is_hash
    raise MalformedFrame("parent_block_hash is not bytes, an integer or null")


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool))


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise MalformedFrame(f"{name} is not a positive integer")


def _optional_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise MalformedFrame("medium is not a string or null")


SeqStep = Literal["first", "next", "gap", "restart"]


def classify(last_seq: int | None, seq: int) -> SeqStep:
    """Where a live message's sequence number stands against the last one seen. A PUB
    socket never sends one twice, so a number not above the last is a new engine."""
    if last_seq is None:
        return "first"
    if seq == last_seq + 1:
        return "next"
    return "gap" if seq > last_seq else "restart"


@dataclass
class EngineView:
    """One replica's prefix cache as its engine reports it."""

    replica: str
    blocks_held: int = 0
    last_seq: int | None = None
    # When the last live message came, on the gateway's monotonic clock (replayed history
    # leaves it: it was published earlier); `since` when this gateway began following.
    last_event_at: float | None = None
    since: float = 0.0
    stored: int = 0
    removed: int = 0

    @property
    def quiet_since(self) -> float:
        """Since when no step of the engine's has been heard of: requests sent after then
        run in steps still to be published."""
        return self.since if self.last_event_at is None else self.last_event_at

    def apply(self, batch: EventBatch, now: float | None) -> bool:
        """Apply one step's events (`now`: when a live message came; None for replayed
        history); True when they include a clear."""
        cleared = False
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self.stored += len(event.hashes)
                if event.medium in PRIMARY_MEDIA:
                    self.blocks_held += len(event.hashes)
            elif isinstance(event, BlocksRemoved):
                self.removed += len(event.hashes)
                if event.medium in PRIMARY_MEDIA:
                    # Never below 0: a view that started after the engine did (its history
                    # no longer replayable) sees removals of blocks it never saw stored.
                    self.blocks_held = max(0, self.blocks_held - len(event.hashes))
            else:
                self.blocks_held = 0
                cleared = True
        self.last_seq = batch.seq
        if now is not None:
            self.last_event_at = now
        return cleared

    def reset(self) -> None:
        """A new engine, or one that may be: nothing known of it yet."""
        self.blocks_held = 0
        self.last_seq = None
