"""Noticing when a session's stable prefix changes between turns.

A changed system prompt or tool set throws away every cached block after it; agents do it
by accident (a timestamp, a tool added mid-session). Each turn's fingerprint is swapped
into the state store atomically (`SET ... GET`), so every gateway replica sees the same
history, and the parts that changed are reported in a header and a metric.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis

from gateway.state.keys import session_key
from gateway.state.redis_client import RedisClient
from gateway.tenants.identity import DEFAULT_TENANT

log = logging.getLogger(__name__)


class FingerprintStore(Protocol):
    async def swap(
        self, session: str, fingerprint: str, *, tenant: str = DEFAULT_TENANT
    ) -> str | None:
        """Store this turn's fingerprint; return the previous turn's, if any."""
        ...


class RedisFingerprints:
    """One key per session, beside its checkpoints (same hash tag)."""

    def __init__(self, redis: RedisClient, *, ttl_s: int = 86_400) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def swap(
        self, session: str, fingerprint: str, *, tenant: str = DEFAULT_TENANT
    ) -> str | None:
        key = session_key(tenant, session, "prefix")
        try:
            previous = await self._redis.set(key, fingerprint, ex=self._ttl_s, get=True)
        except (aioredis.RedisError, OSError) as exc:
            # Detection is advisory: a store outage must not fail the request.
            log.warning("prefix fingerprint not stored: %s", exc)
            return None
        if previous is None:
            return None
        return previous.decode() if isinstance(previous, bytes) else str(previous)


class MemoryFingerprints:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}  # by "tenant/session"

    async def swap(
        self, session: str, fingerprint: str, *, tenant: str = DEFAULT_TENANT
    ) -> str | None:
        previous = self.seen.get(f"{tenant}/{session}")
        self.seen[f"{tenant}/{session}"] = fingerprint
        return previous
