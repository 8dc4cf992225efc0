"""The last fallback: an exact-match cache of deterministic answers, in Redis.

A request is deterministic when it asks for `temperature: 0` and one choice, without
streaming; its key is a hash of its canonical body (model alias included, keys sorted).
Every such answer is kept for `ttl_s`; when the model and all its fallbacks cannot answer,
the kept answer of the very same request is served, marked `X-Gateway-Fallback: cache`.
The cache is advisory: a store outage costs the fallback, never the request.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis

from gateway.state.keys import answer_key
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes
from gateway.tenants.identity import DEFAULT_TENANT

log = logging.getLogger(__name__)

_IGNORED = frozenset({"stream_options", "user", "metadata"})  # do not change the answer


def cache_key(body: dict[str, Any]) -> str | None:
    """The key of a deterministic request's answer, or None for any other request."""
    if body.get("stream") or body.get("temperature") != 0 or body.get("n", 1) != 1:
        return None
    kept = {k: v for k, v in body.items() if k not in _IGNORED}
    return hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)).hexdigest()


class ResponseCache(Protocol):
    """Answers are kept per tenant: one tenant never gets another's kept answer."""

    async def get(self, key: str, *, tenant: str = DEFAULT_TENANT) -> bytes | None: ...

    async def put(self, key: str, payload: bytes, *, tenant: str = DEFAULT_TENANT) -> None: ...


class RedisResponseCache:
    def __init__(
        self, redis: RedisClient, *, ttl_s: int, stored: StoredBytes | None = None
    ) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        # A kept answer counts against the tenant's `limits.stored_bytes`; a tenant at its
        # cap keeps no more (the cache is advisory: nothing is refused for it).
        self._stored = stored

    async def get(self, key: str, *, tenant: str = DEFAULT_TENANT) -> bytes | None:
        try:
            value = await self._redis.get(answer_key(tenant, key))
        except (aioredis.RedisError, OSError) as exc:
            log.warning("response cache not read: %s", exc)
            return None
        if value is None:
            return None
        return value if isinstance(value, bytes) else str(value).encode()

    async def put(self, key: str, payload: bytes, *, tenant: str = DEFAULT_TENANT) -> None:
        stored = self._stored
        if stored is not None and stored.full(tenant):
            return
        try:
            await self._redis.set(answer_key(tenant, key), payload, ex=self._ttl_s)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("response cache not written: %s", exc)
            return
        if stored is not None:
            await stored.put(tenant, "a", key, len(payload), ttl_s=self._ttl_s)
