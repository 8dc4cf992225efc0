"""API keys created at run time (`gateway keys create`, `POST /admin/keys`), kept in Redis
so every gateway replica accepts them at once; only the key's SHA-256 is stored.

Layout (gateway/state/keys.py): one hash per key, found by its digest, holding tenant,
name, roles, created_at and the key's own rate limits if it has any; an index key id ->
digest (for revoke) and a set of key ids per tenant (for list). The key's record is
written last and deleted first, so a key works only while its record exists whatever
happens between the commands.

`CachedKeys` keeps each answer (found or not) in process for `ttl_s`, so most requests
cost no Redis round trip; a revoked key therefore keeps working on a replica that saw it
for up to `ttl_s` (policy `auth.key_cache_ttl_s`, 5 s by default).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError

from gateway.errors import StateUnavailable
from gateway.policy.quota import RateLimitSpec
from gateway.state.keys import API_KEY_IDS_KEY, api_key_key, tenant_keys_key
from gateway.state.redis_client import RedisClient
from gateway.tenants.identity import Identity, key_id_of, new_key
from gateway.untrusted.client_text import control_character

ROLES = ("user", "approver")


@dataclass(frozen=True)
class KeyRecord:
    """What is known about a run-time key; never the key itself."""

    key_id: str
    tenant: str
    name: str
    roles: tuple[str, ...]
    created_at: int
    rate_limits: RateLimitSpec | None = None  # its own, in place of its tenant's default

    def identity(self) -> Identity:
        return Identity(self.key_id, self.tenant, frozenset(self.roles), self.rate_limits)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "object": "api_key",
            "tenant": self.tenant,
            "name": self.name,
            "roles": list(self.roles),
            "created_at": self.created_at,
            # Its own limits (null: its tenant's `key_rate_limits`).
            "rate_limits": self.rate_limits.model_dump(exclude_none=True)
            if self.rate_limits
            else None,
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(fields: dict[Any, Any]) -> KeyRecord | None:
    data = {_text(k): _text(v) for k, v in fields.items()}
    try:
        return KeyRecord(
            key_id=data["key_id"],
            tenant=data["tenant"],
            name=data.get("name", ""),
            roles=tuple(r for r in data.get("roles", "user").split(",") if r),
            created_at=int(data.get("created_at", "0")),
            rate_limits=_rate_limits(data),
        )
    except (KeyError, ValueError):
        return None  # a record this code did not write: no key


def _rate_limits(data: dict[str, str]) -> RateLimitSpec | None:
    """A key's own limits, kept as the fields `requests_per_minute`, `tokens_per_minute`."""
    limits = {name: int(data[name]) for name in _RATE_FIELDS if data.get(name)}
    try:
        return RateLimitSpec(**limits) if limits else None
    except ValidationError:
        raise ValueError("invalid rate limits") from None


_RATE_FIELDS = ("requests_per_minute", "tokens_per_minute")


def _unavailable(exc: Exception) -> StateUnavailable:
    return StateUnavailable(f"The API key store is unreachable ({type(exc).__name__}).")


class RedisKeys:
    def __init__(self, redis: RedisClient, clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._clock = clock

    async def create(
        self,
        tenant: str,
        *,
        name: str = "",
        roles: Iterable[str] = ("user",),
        rate_limits: RateLimitSpec | None = None,
    ) -> tuple[str, KeyRecord]:
        """A new key for `tenant`: the key (shown once, never stored) and its record."""
        wanted = tuple(dict.fromkeys(roles)) or ("user",)
        if unknown := [r for r in wanted if r not in ROLES]:
            raise ValueError(f"unknown role {unknown[0]!r} (expected one of: {', '.join(ROLES)})")
        if (bad := control_character(name)) is not None:  # the API and CLI refuse it first
            raise ValueError(f"a key's name must not contain control characters (found {bad})")
        try:
            for _ in range(5):  # a 48-bit key id collides about never; still, never reuse one
                key = new_key()
                digest = hashlib.sha256(key.encode()).digest()
                key_id = key_id_of(digest)
                if await self._redis.hsetnx(API_KEY_IDS_KEY, key_id, digest.hex()):
                    break
            else:
                raise RuntimeError("no free key id after 5 tries")
            record = KeyRecord(key_id, tenant, name, wanted, int(self._clock()), rate_limits)
            limits = rate_limits.model_dump(exclude_none=True) if rate_limits else {}
            await self._redis.sadd(tenant_keys_key(tenant), key_id)
            await self._redis.hset(
                api_key_key(digest.hex()),
                mapping={
                    "key_id": key_id,
                    "tenant": tenant,
                    "name": name,
                    "roles": ",".join(wanted),
                    "created_at": str(record.created_at),
                    **{field: str(value) for field, value in limits.items()},
                },
            )
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return key, record

    async def lookup(self, digest: bytes) -> KeyRecord | None:
        try:
            fields = await self._redis.hgetall(api_key_key(digest.hex()))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return _record(fields) if fields else None

    async def of_tenant(self, tenant: str) -> list[KeyRecord]:
        try:
            ids = sorted(_text(i) for i in await self._redis.smembers(tenant_keys_key(tenant)))
            records: list[KeyRecord] = []
            for key_id in ids:
                record = await self._by_id(key_id)
                if record is not None and record.tenant == tenant:
                    records.append(record)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return sorted(records, key=lambda r: (r.created_at, r.key_id))

    async def get(self, key_id: str) -> KeyRecord | None:
        try:
            return await self._by_id(key_id)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None

    async def revoke(self, key_id: str) -> KeyRecord | None:
        """Delete a key; its record, or None when no such key exists."""
        try:
            digest_hex = await self._redis.hget(API_KEY_IDS_KEY, key_id)
            if digest_hex is None:
                return None
            key = api_key_key(_text(digest_hex))
            record = _record(await self._redis.hgetall(key))
            await self._redis.delete(key)  # first: from here on the key is refused
            await self._redis.hdel(API_KEY_IDS_KEY, key_id)
            if record is not None:
                await self._redis.srem(tenant_keys_key(record.tenant), key_id)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return record

    async def _by_id(self, key_id: str) -> KeyRecord | None:
        digest_hex = await self._redis.hget(API_KEY_IDS_KEY, key_id)
        if digest_hex is None:
            return None
        fields = await self._redis.hgetall(api_key_key(_text(digest_hex)))
        return _record(fields) if fields else None


class CachedKeys:
    """Run-time keys looked up through a small in-process cache of answers, found or not.
    Bounded: a flood of made-up keys evicts the oldest answers, never grows memory."""

    def __init__(
        self,
        keys: RedisKeys,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 10_000,
    ) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._clock = clock
        self._max = max_entries
        self._answers: dict[bytes, tuple[float, Identity | None]] = {}

    async def identify(self, digest: bytes) -> Identity | None:
        now = self._clock()
        cached = self._answers.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        record = await self._keys.lookup(digest)
        identity = record.identity() if record is not None else None
        if self._ttl_s > 0:
            self._answers.pop(digest, None)  # re-inserted last: the dict stays oldest-first
            self._answers[digest] = (now + self._ttl_s, identity)
            while len(self._answers) > self._max:
                del self._answers[next(iter(self._answers))]
        return identity
