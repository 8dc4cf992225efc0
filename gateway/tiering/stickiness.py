"""Which tier each session is on, shared by every gateway replica through the state store.

Remembering it is what keeps a session from bouncing between tiers (and their caches)
turn by turn; it is advisory, so a store outage costs stickiness, never the request.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis

from gateway.state.keys import session_tier_key
from gateway.state.redis_client import RedisClient
from gateway.tenants.identity import DEFAULT_TENANT

log = logging.getLogger(__name__)


class SessionTiers(Protocol):
    """A session's tier under each `tiering` entry (route) it was routed by."""

    async def get(
        self, route: str, session: str, *, tenant: str = DEFAULT_TENANT
    ) -> str | None: ...

    async def put(
        self, route: str, session: str, tier: str, ttl_s: int, *, tenant: str = DEFAULT_TENANT
    ) -> None: ...


class RedisSessionTiers:
    """One key per (session, route), beside the session's checkpoints (same hash tag)."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def get(self, route: str, session: str, *, tenant: str = DEFAULT_TENANT) -> str | None:
        try:
            value = await self._redis.get(session_tier_key(tenant, session, route))
        except (aioredis.RedisError, OSError) as exc:
            log.warning("session tier not read: %s", exc)
            return None
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    async def put(
        self, route: str, session: str, tier: str, ttl_s: int, *, tenant: str = DEFAULT_TENANT
    ) -> None:
        try:
            await self._redis.set(session_tier_key(tenant, session, route), tier, ex=ttl_s)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("session tier not stored: %s", exc)


class MemorySessionTiers:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.tiers: dict[str, str] = {}  # by "route:session" ("tenant/route:session")

    async def get(self, route: str, session: str, *, tenant: str = DEFAULT_TENANT) -> str | None:
        return self.tiers.get(_memory_key(tenant, route, session))

    async def put(
        self, route: str, session: str, tier: str, ttl_s: int, *, tenant: str = DEFAULT_TENANT
    ) -> None:
        self.tiers[_memory_key(tenant, route, session)] = tier


def _memory_key(tenant: str, route: str, session: str) -> str:
    return f"{route}:{session}" if tenant == DEFAULT_TENANT else f"{tenant}/{route}:{session}"
