"""Which tier each session is on, shared by every gateway replica through the state store.

Remembering it is what keeps a session from bouncing between tiers (and their caches)
turn by turn; it is advisory, so a store outage costs stickiness, never the request.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis

log = logging.getLogger(__name__)


class SessionTiers(Protocol):
    async def get(self, session: str) -> str | None: ...

    async def put(self, session: str, tier: str, ttl_s: int) -> None: ...


class RedisSessionTiers:
    def __init__(self, redis: aioredis.Redis, *, namespace: str = "default") -> None:
        self._redis = redis
        self._prefix = f"agw:{namespace}:tier:"

    async def get(self, session: str) -> str | None:
        try:
            value = await self._redis.get(self._prefix + session)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("session tier not read: %s", exc)
            return None
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    async def put(self, session: str, tier: str, ttl_s: int) -> None:
        try:
            await self._redis.set(self._prefix + session, tier, ex=ttl_s)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("session tier not stored: %s", exc)


class MemorySessionTiers:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.tiers: dict[str, str] = {}

    async def get(self, session: str) -> str | None:
        return self.tiers.get(session)

    async def put(self, session: str, tier: str, ttl_s: int) -> None:
        self.tiers[session] = tier
