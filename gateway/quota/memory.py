"""The in-memory twin of `RedisQuotaStore` (the same buckets and budgets, in one
process), for unit tests of the request path. What the gateway promises about limits
across replicas is proven against real Redis (tests/unit/quota/)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.quota.store import MINUTE_MS, Bucket, BucketState, Period, QuotaVerdict


class MemoryQuotaStore:
    def __init__(self, clock_ms: Callable[[], float] = lambda: time.monotonic() * 1000) -> None:
        self._clock_ms = clock_ms
        self.levels: dict[str, tuple[float, float]] = {}  # key -> (level, at ms)
        self.counters: dict[str, dict[str, int]] = {}  # period key -> tokens, nusd
        self.down = False  # set to make every call fail as a Redis outage would

    async def admit(
        self,
        tenant: str,
        buckets: Sequence[Bucket],
        periods: Sequence[Period],
        *,
        enforce_budget: bool,
    ) -> QuotaVerdict:
        self._check_up()
        now = self._clock_ms()
        levels = [self._level(b, now) for b in buckets]
        wait, denied = 0.0, -1
        for i, (bucket, level) in enumerate(zip(buckets, levels, strict=True)):
            need = min(bucket.cost, bucket.capacity)
            if level < need and (w := (need - level) * MINUTE_MS / bucket.capacity) > wait:
                wait, denied = w, i
        used = tuple(self._used(p) for p in periods)
        over = _first_over(periods, used) if enforce_budget else -1
        admitted = over < 0 and denied < 0
        taken = [0] * len(buckets)
        if admitted:
            for i, bucket in enumerate(buckets):
                after = max(-bucket.capacity, levels[i] - bucket.cost)  # the debt floor
                cut = after != levels[i] - bucket.cost  # rounded as the Lua script rounds:
                taken[i] = math.floor(levels[i] - after + 0.5) if cut else bucket.cost
                levels[i] = after
                self.levels[bucket.key] = (levels[i], now)
            for period in periods:
                counters = self.counters.setdefault(period.key, {"tokens": 0, "nusd": 0})
                counters["tokens"] += period.tokens
                counters["nusd"] += period.nusd
        states = tuple(
            _state(b, level, took) for b, level, took in zip(buckets, levels, taken, strict=True)
        )
        if over >= 0:
            return QuotaVerdict("over_budget", over, math.ceil(wait), states, used)
        if denied >= 0:
            return QuotaVerdict("rate_limited", denied, math.ceil(wait), states, used)
        return QuotaVerdict("admitted", -1, 0, states, used)

    async def settle(
        self,
        tenant: str,
        tokens: Sequence[Bucket],
        periods: Sequence[Period],
        token_delta: int,
        nusd_delta: int,
    ) -> None:
        self._check_up()
        now = self._clock_ms()
        for bucket in tokens:
            level = self._level(bucket, now) - token_delta - bucket.forgiven
            self.levels[bucket.key] = (max(-bucket.capacity, min(bucket.capacity, level)), now)
        for period in periods:
            counters = self.counters.get(period.key)
            if counters is not None:
                counters["tokens"] += token_delta
                counters["nusd"] += nusd_delta

    def _level(self, bucket: Bucket, now: float) -> float:
        saved = self.levels.get(bucket.key)
        if saved is None:
            return bucket.capacity
        level, at = saved
        return min(bucket.capacity, level + max(0.0, now - at) * bucket.capacity / MINUTE_MS)

    def _used(self, period: Period) -> tuple[int, int]:
        counters = self.counters.get(period.key, {})
        return counters.get("tokens", 0), counters.get("nusd", 0)

    def _check_up(self) -> None:
        if self.down:
            raise RedisConnectionError("the quota store is down")


def _first_over(periods: Sequence[Period], used: Sequence[tuple[int, int]]) -> int:
    """The first budget limit the request would pass, as `QuotaVerdict.denied` numbers it."""
    for i, (period, (tokens, nusd)) in enumerate(zip(periods, used, strict=True)):
        if period.token_limit is not None and tokens + period.tokens > period.token_limit:
            return 2 * i
        if period.nusd_limit is not None and nusd + period.nusd > period.nusd_limit:
            return 2 * i + 1
    return -1


def _state(bucket: Bucket, level: float, taken: int) -> BucketState:
    reset = math.ceil((bucket.capacity - level) * MINUTE_MS / bucket.capacity)
    return BucketState(math.floor(max(0.0, level)), reset, taken)
