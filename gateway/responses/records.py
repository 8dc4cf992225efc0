"""Stored responses: what `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`
read. A record names the session and the turn (by request id) the response was, so any
gateway replica continues from it at once: it is written before the client hears the
response is complete."""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis

from gateway.errors import StateUnavailable
from gateway.state.keys import response_key
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes
from gateway.tenants.identity import DEFAULT_TENANT


class ResponseRecords(Protocol):
    """Records are the tenant's: another tenant's id finds nothing."""

    async def put(
        self, response_id: str, record: dict[str, Any], *, tenant: str = DEFAULT_TENANT
    ) -> None: ...

    async def get(
        self, response_id: str, *, tenant: str = DEFAULT_TENANT
    ) -> dict[str, Any] | None: ...

    async def delete(self, response_id: str, *, tenant: str = DEFAULT_TENANT) -> bool: ...


class RedisResponseRecords:
    """One key per response, tagged by the response id: `GET /v1/responses/{id}` knows
    only the id, so a record cannot share its session's slot."""

    def __init__(
        self, redis: RedisClient, *, ttl_s: int, stored: StoredBytes | None = None
    ) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        # Counted against the tenant's `limits.stored_bytes`; checked when the request
        # began (gateway/responses/service.py), so never refused here, after the answer.
        self._stored = stored

    async def put(
        self, response_id: str, record: dict[str, Any], *, tenant: str = DEFAULT_TENANT
    ) -> None:
        kept = orjson.dumps(record)
        try:
            await self._redis.set(response_key(tenant, response_id), kept, ex=self._ttl_s)
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(f"The response store is unreachable ({exc}).") from None
        if self._stored is not None:
            await self._stored.put(tenant, "r", response_id, len(kept))

    async def get(self, response_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any] | None:
        try:
            raw = await self._redis.get(response_key(tenant, response_id))
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(f"The response store is unreachable ({exc}).") from None
        if raw is None:
            return None
        record: dict[str, Any] = orjson.loads(raw)
        return record

    async def delete(self, response_id: str, *, tenant: str = DEFAULT_TENANT) -> bool:
        try:
            removed = await self._redis.delete(response_key(tenant, response_id))
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(f"The response store is unreachable ({exc}).") from None
        if self._stored is not None:
            await self._stored.forget(tenant, "r", response_id)
        return bool(removed)


class MemoryResponseRecords:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], dict[str, Any]] = {}

    async def put(
        self, response_id: str, record: dict[str, Any], *, tenant: str = DEFAULT_TENANT
    ) -> None:
        self.records[tenant, response_id] = record

    async def get(self, response_id: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any] | None:
        return self.records.get((tenant, response_id))

    async def delete(self, response_id: str, *, tenant: str = DEFAULT_TENANT) -> bool:
        return self.records.pop((tenant, response_id), None) is not None
