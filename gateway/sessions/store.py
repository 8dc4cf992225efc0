"""Where checkpoints live: Redis, or an in-memory twin for unit tests.

Per session two keys in one hash slot: `turns`, a list with one checkpoint per completed
turn (RPUSH's reply is the turn number, so concurrent gateways never hand out the same
one), and `blobs`, a hash of tool sets by digest. A turn is appended in one MULTI/EXEC
with the TTL refresh, so a reader sees a turn whole or not at all, on any gateway replica.

A fork never writes over a session: the target is checked and written by one Lua script
on the target's slot, so of two forks racing to one new id exactly one lands, whole, and
the other is told the id is taken (a check-then-write from the gateway could not promise
that across replicas).
"""

from __future__ import annotations

import uuid
from typing import Protocol

import redis.asyncio as aioredis

from gateway.errors import Conflict, StateUnavailable
from gateway.sessions.checkpoints import Checkpoint
from gateway.sessions.ids import MAX_ID_LENGTH, SessionRef
from gateway.state.redis_client import RedisClient

_NEW_ID_TRIES = 5


class CheckpointStore(Protocol):
    async def load(self, session: SessionRef) -> list[Checkpoint]: ...

    async def blobs(self, session: SessionRef) -> dict[str, bytes]: ...

    async def append(
        self, session: SessionRef, checkpoint: Checkpoint, blobs: dict[str, bytes]
    ) -> int:
        """Store a completed turn; return its number (1-based)."""
        ...

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        """`target` becomes a copy of `source`'s first `turns` turns; False, and nothing
        written, when `target` exists already."""
        ...

    async def delete(self, session: SessionRef) -> bool: ...


# KEYS: the target's turns and blobs (one hash tag: one slot). ARGV: TTL (s), number of
# turns, the turns, then the blobs as name, value pairs. 1 when written; 0 when the target
# exists (nothing is written). Pushed in batches: Lua's unpack stops at 8,000 values.
FORK = """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
local ttl, turns = ARGV[1], tonumber(ARGV[2])
local function write(command, key, first, last)
  if first > last then return end
  for i = first, last, 1000 do
    redis.call(command, key, unpack(ARGV, i, math.min(i + 999, last)))
  end
  redis.call('EXPIRE', key, ttl)
end
write('RPUSH', KEYS[1], 3, 2 + turns)
write('HSET', KEYS[2], 3 + turns, #ARGV)  -- 1,000 a batch: name, value pairs stay whole
return 1
"""


class RedisCheckpoints:
    def __init__(self, redis: RedisClient, *, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._fork = redis.register_script(FORK)

    async def load(self, session: SessionRef) -> list[Checkpoint]:
        try:
            raw = await self._redis.lrange(session.key("turns"), 0, -1)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return [Checkpoint.from_json(_bytes(item)) for item in raw]

    async def blobs(self, session: SessionRef) -> dict[str, bytes]:
        try:
            raw = await self._redis.hgetall(session.key("blobs"))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return {_bytes(k).decode(): _bytes(v) for k, v in raw.items()}

    async def append(
        self, session: SessionRef, checkpoint: Checkpoint, blobs: dict[str, bytes]
    ) -> int:
        turns, blob_key = session.key("turns"), session.key("blobs")
        try:
            async with self._redis.pipeline(transaction=True) as tx:
                for name, value in blobs.items():
                    tx.hsetnx(blob_key, name, value)
                tx.rpush(turns, checkpoint.to_json())
                tx.expire(turns, self._ttl_s)
                tx.expire(blob_key, self._ttl_s)
                results = await tx.execute()
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return int(results[len(blobs)])

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        try:
            items = await self._redis.lrange(source.key("turns"), 0, turns - 1)
            blobs = await self._redis.hgetall(source.key("blobs"))
            # Source and target may sit in different hash slots (cluster nodes): the source
            # is read first, the target checked and written by one script on its own slot.
            pairs = [part for name, value in blobs.items() for part in (_bytes(name), value)]
            written = await self._fork(
                keys=[target.key("turns"), target.key("blobs")],
                args=[self._ttl_s, len(items), *items, *pairs],
            )
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return bool(written)

    async def delete(self, session: SessionRef) -> bool:
        try:
            removed = await self._redis.delete(session.key("turns"), session.key("blobs"))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return bool(removed)


class MemoryCheckpoints:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.turns: dict[SessionRef, list[Checkpoint]] = {}
        self.blob_store: dict[SessionRef, dict[str, bytes]] = {}

    async def load(self, session: SessionRef) -> list[Checkpoint]:
        return list(self.turns.get(session, []))

    async def blobs(self, session: SessionRef) -> dict[str, bytes]:
        return dict(self.blob_store.get(session, {}))

    async def append(
        self, session: SessionRef, checkpoint: Checkpoint, blobs: dict[str, bytes]
    ) -> int:
        for name, value in blobs.items():
            self.blob_store.setdefault(session, {}).setdefault(name, value)
        self.turns.setdefault(session, []).append(checkpoint)
        return len(self.turns[session])

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        if target in self.turns or target in self.blob_store:
            return False
        self.turns[target] = list(self.turns.get(source, []))[:turns]
        self.blob_store[target] = dict(self.blob_store.get(source, {}))
        return True

    async def delete(self, session: SessionRef) -> bool:
        found = session in self.turns
        self.turns.pop(session, None)
        self.blob_store.pop(session, None)
        return found


async def fork_to_new_id(
    store: CheckpointStore, source: SessionRef, turns: int, prefix: str
) -> SessionRef:
    """A fork under an id the gateway makes up (`prefix` + 8 hex digits, the prefix cut to
    keep it a session id the API takes); another one when that id is taken, which happens
    about never (the fork refuses it: nothing is overwritten either way)."""
    prefix = prefix[: MAX_ID_LENGTH - 8]
    for _ in range(_NEW_ID_TRIES):
        target = SessionRef(source.tenant, f"{prefix}{uuid.uuid4().hex[:8]}")
        if await store.fork(source, turns, target):
            return target
    raise Conflict(f"No free session id for a fork of `{source.id}`.", code="session_exists")


def _unavailable(exc: Exception) -> StateUnavailable:
    return StateUnavailable(f"The session store is unreachable ({type(exc).__name__}).")


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
