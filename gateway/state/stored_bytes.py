"""What each tenant's stored conversations may hold: `limits.stored_bytes`.

Sessions, stored responses, compactions, kept answers, feedback and held approvals live in
the one Redis every tenant shares. Without a cap one tenant could fill it, at the pace the
engines answer, and at `maxmemory` (`noeviction`) every tenant's turns would go unsaved.
So the gateway keeps, per tenant, what each stored thing holds and when it expires, and a
tenant whose things together hold its cap stores no more until some expire or are
deleted: `admit` raises 429 `stored_bytes_exceeded`, which the session steps turn into a
turn served unsaved where the client sent its whole history (gateway/session_steps.py),
and which refuses the rest (delta-mode turns, stored responses, forks, compactions,
feedback). Requests that store nothing are served as before.

Per tenant, two keys in its slot: a sorted set of its stored things (`s:<session>`,
`r:<response>`, `c:<compaction>`, `a:<kept answer>`, `f:feedback`, `p:<approval>`) by
expiry, and a hash of their bytes and their `total`. One script, on Redis's clock, drops
what has expired from the total, then applies a write (bytes added or a value replaced,
the expiry pushed back, as the write's own EXPIRE does to the keys) or a delete (the
thing's bytes taken off). Counting what is held, thing by thing, is what keeps the cap a
cap: a count of bytes written per window would fall below what is held for a session kept
alive past the window by one small turn a week, and a delete could not be credited without
being gamed. Values' bytes are counted (turns, new tool sets, the snapshot's growth,
responses, compactions, answers the response cache keeps, which a full tenant's cache
stops keeping instead of refusing anything); Redis adds about 1.3x.

The check before a request asks Redis nothing: a gateway learns that a tenant is full from
the total its own writes bring back, and asks again at most every `RECHECK_S` while it is.
So each gateway process may store the turns it admitted before it learnt: the cap is
passed by at most those (a turn admitted is always stored: its answer was given). Redis
unreachable: not counted, not refused (the writes themselves follow
`sessions.on_store_outage`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from gateway.errors import StoredBytesExceeded
from gateway.state.keys import stored_bytes_key
from gateway.state.redis_client import RedisClient

log = logging.getLogger(__name__)

RECHECK_S = 10.0  # a full tenant's total is asked again this often: deletes elsewhere show
_EXPIRED_PER_CALL = 1000  # a call drops at most this many expired things (the rest: next)

# A session, a stored response, a compaction, an answer kept by the response cache, the
# tenant's feedback stream, a turn held for approval.
Kind = Literal["s", "r", "c", "a", "f", "p"]

# KEYS: the tenant's things by expiry (zset), their bytes and `total` (hash). ARGV: the
# thing ('' to only read); the bytes it now holds more (an integer, may be negative), or
# `=N` (it now holds N: a value written over), or `forget`; its lifetime (s); how many
# expired things to drop at most; the tenant's cap.
# Returns the total, and at the cap the seconds until the first thing expires (-1: none,
# or under the cap).
COUNT = """
local now = tonumber(redis.call('TIME')[1])
local total = tonumber(redis.call('HGET', KEYS[2], 'total') or '0')
local before = total
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[4])
for _, thing in ipairs(expired) do
  total = total - tonumber(redis.call('HGET', KEYS[2], thing) or '0')
  redis.call('HDEL', KEYS[2], thing)
  redis.call('ZREM', KEYS[1], thing)
end
local thing, change = ARGV[1], ARGV[2]
if thing ~= '' and change ~= 'forget' then
  local had = tonumber(redis.call('HGET', KEYS[2], thing) or '0')
  local has
  if string.sub(change, 1, 1) == '=' then
    has = tonumber(string.sub(change, 2))
  else
    has = math.max(0, had + tonumber(change))
  end
  total = math.max(0, total + has - had)
  redis.call('HSET', KEYS[2], thing, has, 'total', total)
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), thing)
  -- the keys live as long as the longest-lived thing in them
  if redis.call('TTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    redis.call('EXPIRE', KEYS[2], ARGV[3])
  end
else
  if thing ~= '' then
    total = total - tonumber(redis.call('HGET', KEYS[2], thing) or '0')
    redis.call('HDEL', KEYS[2], thing)
    redis.call('ZREM', KEYS[1], thing)
  end
  if total < 0 then total = 0 end
  if total ~= before then  -- written only when it moved: a read of nothing makes no key
    redis.call('HSET', KEYS[2], 'total', total)
  end
end
if total < tonumber(ARGV[5]) then return {total, -1} end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] == nil then return {total, -1} end
return {total, math.max(1, math.floor(tonumber(first[2]) - now))}
"""


@dataclass(frozen=True, slots=True)
class _Full:
    held: int  # the tenant's total when this gateway last saw it
    first_expiry_at: float | None  # monotonic: when the first of its things expires
    recheck_at: float  # monotonic


class StoredBytes:
    """What each tenant's conversations hold, against its cap (`cap_of`: None for a tenant
    without one, which costs nothing: not even a count)."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        ttl_s: int,
        cap_of: Callable[[str], int | None],
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        """`ttl_s`: how long a write keeps what it wrote (`sessions.ttl_s`); `on_count`:
        told each tenant's total as its writes bring it back (a gauge)."""
        self._redis = redis
        self._ttl_s = ttl_s
        self._cap_of = cap_of
        self._on_count = on_count
        self._count = redis.register_script(COUNT)
        self._full: dict[str, _Full] = {}

    def counts(self, tenant: str) -> bool:
        """Whether the tenant's writes are counted: it has a cap."""
        return self._cap_of(tenant) is not None

    async def admit(self, tenant: str) -> None:
        """Raise StoredBytesExceeded if the tenant holds its cap, as far as this gateway
        knows; asks Redis only every RECHECK_S while it does."""
        if not self.full(tenant):  # never seen full, or the policy raised or lifted the cap
            return
        full, cap = self._full[tenant], self._cap_of(tenant)
        assert cap is not None  # full() says there is one
        if time.monotonic() >= full.recheck_at:
            held = await self._run(tenant, "", "0", cap)
            if held is None or held < cap:
                return  # Redis unreachable (not refused), or room again
            full = self._full[tenant]  # the count just made
        raise _exceeded(tenant, cap, full)

    async def charge(self, tenant: str, kind: Kind, name: str, added: int) -> None:
        """A write of the tenant's has just stored `added` bytes more in one thing (fewer
        where negative) and pushed its expiry back by the lifetime."""
        cap = self._cap_of(tenant)
        if cap is not None:
            await self._run(tenant, f"{kind}:{name}", str(added), cap)

    async def put(
        self, tenant: str, kind: Kind, name: str, size: int, *, ttl_s: int | None = None
    ) -> None:
        """A value of `size` bytes was written over the thing (or made it), to live `ttl_s`
        (the lifetime when None)."""
        cap = self._cap_of(tenant)
        if cap is not None:
            await self._run(tenant, f"{kind}:{name}", f"={size}", cap, ttl_s=ttl_s)

    async def held(self, tenant: str) -> int | None:
        """What the tenant's conversations hold now, asked of Redis (None: it did not
        answer, or the tenant has no cap, so nothing is counted)."""
        cap = self._cap_of(tenant)
        return None if cap is None else await self._run(tenant, "", "0", cap)

    def full(self, tenant: str) -> bool:
        """Whether the tenant holds its cap as far as this gateway last saw, asking nothing:
        for what may skip a write instead of refusing a request (a cache)."""
        seen = self._full.get(tenant)
        cap = self._cap_of(tenant)
        return seen is not None and cap is not None and seen.held >= cap

    async def forget(self, tenant: str, kind: Kind, name: str) -> None:
        """The thing was deleted: what it held is the tenant's again."""
        cap = self._cap_of(tenant)
        if cap is not None:
            await self._run(tenant, f"{kind}:{name}", "forget", cap)

    async def _run(
        self, tenant: str, thing: str, change: str, cap: int, *, ttl_s: int | None = None
    ) -> int | None:
        """Run the count: the tenant's total, or None when Redis did not answer."""
        expiry, sizes = stored_bytes_key(tenant, "expiry"), stored_bytes_key(tenant, "bytes")
        lifetime = self._ttl_s if ttl_s is None else ttl_s
        try:
            held, first_expiry_s = await self._count(
                keys=[expiry, sizes], args=[thing, change, lifetime, _EXPIRED_PER_CALL, cap]
            )
        except (aioredis.RedisError, OSError) as exc:
            log.warning("stored bytes of tenant %s not counted: %s", tenant, exc)
            return None
        held = int(held)
        if self._on_count is not None:
            self._on_count(tenant, held)
        if held >= cap:
            now = time.monotonic()
            first = now + int(first_expiry_s) if int(first_expiry_s) > 0 else None
            self._full[tenant] = _Full(held, first, now + RECHECK_S)
        else:
            self._full.pop(tenant, None)
        return held


def _exceeded(tenant: str, cap: int, full: _Full) -> StoredBytesExceeded:
    # Retry-After: when the first stored thing expires, if nothing is deleted before then.
    until = full.first_expiry_at if full.first_expiry_at is not None else full.recheck_at
    wait_s = max(1, math.ceil(until - time.monotonic()))
    return StoredBytesExceeded(
        f"Tenant {tenant!r} holds {full.held:,} bytes of stored conversations, at or over "
        f"its limit of {cap:,} (limits.stored_bytes): requests that need the store or ask "
        "to be stored (delta-mode turns, stored responses, forks, compactions, feedback) "
        "are refused until some expire or are deleted. Turns that send their whole "
        "history are served unsaved, and requests that store nothing as before.",
        retry_after_s=wait_s,
    )
