"""Where approvals live: Redis, every key namespaced by tenant (gateway/state/keys.py).

    agw:approval:{<tenant>/<id>}       hash: `held`, then `decision`, then `closing`
    agw:{<tenant>/<session>}:approval  the session's open approval (its id)
    agw:approvals:{<tenant>}:index     sorted set of the tenant's approval ids by time

`decision` and `closing` are written with HSETNX: of two reviewers deciding at once, or two
requests releasing the same call, exactly one wins and the other learns it lost. An
approval is kept `ttl_s + keep_s` after it was held, and `keep_s` after its decision.

A held turn (the engine's calls and text) counts against the tenant's
`limits.stored_bytes` for as long as it is kept (gateway/state/stored_bytes.py); it is
never refused for it: holding a destructive call is the safe side.
"""

from __future__ import annotations

from dataclasses import asdict

import orjson
import redis.asyncio as aioredis

from gateway.approvals.records import Approval, Closing, Decision
from gateway.errors import StateUnavailable
from gateway.sessions.ids import SessionRef
from gateway.state.keys import approval_key, approvals_key
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes

# Approvals a listing looks at, newest first (the rest are older than anyone lists).
_LISTED = 1000
# The session's pointer goes only if it still names this approval: a newer hold keeps its own.
_DELETE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisApprovals:
    def __init__(
        self, redis: RedisClient, *, keep_s: int, stored: StoredBytes | None = None
    ) -> None:
        self._redis = redis
        self._keep_s = keep_s
        self._stored = stored

    async def add(self, approval: Approval) -> None:
        key = approval_key(approval.tenant, approval.id)
        lifetime = int(approval.expires_at - approval.created_at) + self._keep_s
        index = approvals_key(approval.tenant, "index")
        held = approval.held_json()
        try:
            async with self._redis.pipeline(transaction=True) as tx:
                tx.hset(key, "held", held)
                tx.expire(key, lifetime)
                await tx.execute()
            # The index lives in the tenant's slot, the session pointer in the session's.
            async with self._redis.pipeline(transaction=True) as tx:
                tx.zadd(index, {approval.id: approval.created_at})
                tx.zremrangebyscore(index, "-inf", approval.created_at - lifetime)
                tx.expire(index, lifetime)
                await tx.execute()
            if approval.session is not None:
                pointer = SessionRef(approval.tenant, approval.session).key("approval")
                await self._redis.set(pointer, approval.id, ex=lifetime)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        if self._stored is not None:
            await self._stored.put(approval.tenant, "p", approval.id, len(held), ttl_s=lifetime)

    async def get(self, tenant: str, approval_id: str) -> Approval | None:
        try:
            fields = await self._redis.hgetall(approval_key(tenant, approval_id))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return _approval(fields)

    async def open_for(self, session: SessionRef) -> str | None:
        """The id of the session's approval that the agent has not been told the outcome of."""
        try:
            value = await self._redis.get(session.key("approval"))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return _text(value) if value is not None else None

    async def decide(self, approval: Approval, decision: Decision) -> bool:
        """Record the decision unless one was recorded already; True when this one was."""
        key = approval_key(approval.tenant, approval.id)
        try:
            won = await self._redis.hsetnx(key, "decision", orjson.dumps(asdict(decision)))
            if won:
                await self._redis.expire(key, self._keep_s)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return bool(won)

    async def close(self, approval: Approval, closing: Closing) -> bool:
        """Record that the agent was told the outcome, once; True for the one request
        that did (the only one that may release the call)."""
        key = approval_key(approval.tenant, approval.id)
        try:
            won = await self._redis.hsetnx(key, "closing", orjson.dumps(asdict(closing)))
            if won and approval.session is not None:
                pointer = SessionRef(approval.tenant, approval.session).key("approval")
                await self._redis.eval(_DELETE_IF_SAME, 1, pointer, approval.id)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return bool(won)

    async def recent(self, tenant: str) -> list[Approval]:
        """The tenant's approvals still kept, newest first."""
        try:
            ids = await self._redis.zrevrange(approvals_key(tenant, "index"), 0, _LISTED - 1)
            async with self._redis.pipeline(transaction=False) as batch:
                for approval_id in ids:
                    assert isinstance(approval_id, bytes | str)
                    batch.hgetall(approval_key(tenant, _text(approval_id)))
                found = await batch.execute()
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return [a for a in map(_approval, found) if a is not None]


def _approval(fields: dict[bytes | str, bytes | str]) -> Approval | None:
    if not fields:
        return None
    return Approval.from_fields({_text(k): _bytes(v) for k, v in fields.items()})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _unavailable(exc: Exception) -> StateUnavailable:
    return StateUnavailable(f"The approval store is unreachable ({type(exc).__name__}).")
