"""Where checkpoints live: Redis, or an in-memory twin for unit tests.

Per session two keys in one hash slot: `turns`, a list with one checkpoint per completed
turn (RPUSH's reply is the turn number, so concurrent gateways never hand out the same
one), and `blobs`, a hash of tool sets by digest. A turn is appended in one MULTI/EXEC
with the TTL refresh, so a reader sees a turn whole or not at all, on any gateway replica.
"""

from __future__ import annotations

from typing import Protocol

import redis.asyncio as aioredis

from gateway.errors import GatewayError
from gateway.redis_client import RedisClient
from gateway.sessions.checkpoints import Checkpoint
from gateway.sessions.keys import SessionRef


class StateUnavailable(GatewayError):
    status = 503
    error_type = "service_unavailable"
    default_code = "state_store_unavailable"


class CheckpointStore(Protocol):
    async def load(self, session: SessionRef) -> list[Checkpoint]: ...

    async def blobs(self, session: SessionRef) -> dict[str, bytes]: ...

    async def append(
        self, session: SessionRef, checkpoint: Checkpoint, blobs: dict[str, bytes]
    ) -> int:
        """Store a completed turn; return its number (1-based)."""
        ...

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> None:
        """`target` becomes a copy of `source`'s first `turns` turns (replacing it)."""
        ...

    async def delete(self, session: SessionRef) -> bool: ...


class RedisCheckpoints:
    def __init__(self, redis: RedisClient, *, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

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

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> None:
        try:
            items = await self._redis.lrange(source.key("turns"), 0, turns - 1)
            blobs = await self._redis.hgetall(source.key("blobs"))
            # Source and target may sit in different hash slots (cluster nodes): the source
            # is read first, the target written in one transaction of its own slot.
            async with self._redis.pipeline(transaction=True) as tx:
                tx.delete(target.key("turns"), target.key("blobs"))
                if items:
                    tx.rpush(target.key("turns"), *items)
                    tx.expire(target.key("turns"), self._ttl_s)
                if blobs:
                    tx.hset(target.key("blobs"), mapping={_bytes(k): v for k, v in blobs.items()})
                    tx.expire(target.key("blobs"), self._ttl_s)
                await tx.execute()
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None

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

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> None:
        self.turns[target] = list(self.turns.get(source, []))[:turns]
        self.blob_store[target] = dict(self.blob_store.get(source, {}))

    async def delete(self, session: SessionRef) -> bool:
        found = session in self.turns
        self.turns.pop(session, None)
        self.blob_store.pop(session, None)
        return found


def _unavailable(exc: Exception) -> StateUnavailable:
    return StateUnavailable(f"The session store is unreachable ({type(exc).__name__}).")


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
