"""The usage ledger: what requests cost and saved (gateway/telemetry/prices.py), summed
and kept in Redis, and the reports `GET /v1/usage` reads from it.

Counts are summed in memory per (day, tenant, model, tier) and per session, and written
to Redis about once a second in one transaction; a write that fails is kept and retried,
so an outage of the store delays counts but does not lose them. On a Redis Cluster the
batch spans hash slots, which no transaction may: it is written as one transaction per
slot, and only the slots whose transaction failed are kept for the retry (re-sending
the others would count them twice while one node is down).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from gateway.sessions.ids import SessionRef
from gateway.state.keys import USAGE_TENANTS_KEY, usage_day_key
from gateway.state.redis_client import RedisClient
from gateway.telemetry.prices import NANO

log = logging.getLogger(__name__)

# The counters kept per (day, tenant, model, tier) and per session.
COUNTERS = (
    "requests",
    "errors",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "trimmed_tokens",
    "small_tier_tokens",
    "cost_nusd",
    "saved_cache_nusd",
    "saved_trimming_nusd",
    "saved_small_tier_nusd",
)


# (day, tenant, model, tier)
UsageKey = tuple[str, str, str, str]


class UsageLedger(Protocol):
    async def add(
        self,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None: ...

    async def read(
        self, tenant: str | None, start: dt.date, end: dt.date
    ) -> dict[UsageKey, dict[str, int]]: ...

    async def session(self, session: SessionRef) -> dict[str, int]: ...


class UsageNotWritten(RedisError):
    """Part of a batch did not reach the ledger: exactly these rows and sessions (the
    rest of the batch did, and must not be sent again)."""

    def __init__(
        self,
        message: str,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        super().__init__(message)
        self.rows = rows
        self.sessions = sessions


@dataclass
class _SlotBatch:
    """The rows and sessions of a batch whose keys share one hash slot."""

    rows: dict[UsageKey, Mapping[str, int]]
    sessions: dict[SessionRef, Mapping[str, int]]


def _days(start: dt.date, end: dt.date) -> list[str]:
    return [(start + dt.timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


class RedisUsageLedger:
    """Daily usage per tenant in one hash per (tenant, day): field `model|tier|counter`;
    per session, a hash beside its checkpoints (same hash tag, same lifetime)."""

    def __init__(self, redis: RedisClient, *, retention_days: int, session_ttl_s: int) -> None:
        self._redis = redis
        self._retention_s = retention_days * 86_400
        self._session_ttl_s = session_ttl_s

    async def add(
        self,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        tenants = sorted({tenant for (_, tenant, _, _) in rows})
        if not isinstance(self._redis, RedisCluster):
            async with self._redis.pipeline(transaction=True) as tx:
                if tenants:
                    tx.sadd(USAGE_TENANTS_KEY, *tenants)
                self._queue(tx, rows, sessions)
                await tx.execute()
            return
        if tenants:
            # Its own slot, so before the rows: a row is never left unlisted, and
            # adding a tenant again when a retry comes is harmless.
            await self._redis.sadd(USAGE_TENANTS_KEY, *tenants)
        await self._add_by_slot(self._redis, rows, sessions)

    async def _add_by_slot(
        self,
        redis: RedisCluster,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        batches: dict[int, _SlotBatch] = {}
        for usage_key, counts in rows.items():
            slot = key_slot(usage_day_key(usage_key[1], usage_key[0]).encode())
            batches.setdefault(slot, _SlotBatch({}, {})).rows[usage_key] = counts
        for session, counts in sessions.items():
            slot = key_slot(session.key("usage").encode())
            batches.setdefault(slot, _SlotBatch({}, {})).sessions[session] = counts

        async def write(batch: _SlotBatch) -> None:
            async with redis.pipeline(transaction=True) as tx:
                self._queue(tx, batch.rows, batch.sessions)
                await tx.execute()

        outcomes = await asyncio.gather(
            *(write(batch) for batch in batches.values()), return_exceptions=True
        )
        failed = [
            (batch, outcome)
            for batch, outcome in zip(batches.values(), outcomes, strict=True)
            if outcome is not None
        ]
        if not failed:
            return
        for _, outcome in failed:
            if not isinstance(outcome, Exception):
                raise outcome  # cancelled, or the interpreter is going down
        first = failed[0][1]
        raise UsageNotWritten(
            f"{len(failed)} of {len(batches)} hash slots not written "
            f"({type(first).__name__}: {first})",
            rows={k: v for batch, _ in failed for k, v in batch.rows.items()},
            sessions={k: v for batch, _ in failed for k, v in batch.sessions.items()},
        ) from first

    def _queue(
        self,
        pipe: Any,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        """HINCRBY every non-zero counter, then refresh each touched key's lifetime."""
        touched: set[str] = set()
        for (day, tenant, model, tier), counts in rows.items():
            key = usage_day_key(tenant, day)
            touched.add(key)
            for counter, value in counts.items():
                if value:
                    pipe.hincrby(key, f"{model}|{tier}|{counter}", value)
        for key in touched:
            pipe.expire(key, self._retention_s)
        for session, counts in sessions.items():
            key = session.key("usage")
            for counter, value in counts.items():
                if value:
                    pipe.hincrby(key, counter, value)
            pipe.expire(key, self._session_ttl_s)

    async def read(
        self, tenant: str | None, start: dt.date, end: dt.date
    ) -> dict[UsageKey, dict[str, int]]:
        if tenant is not None:
            tenants = [tenant]
        else:
            tenants = sorted(_text(t) for t in await self._redis.smembers(USAGE_TENANTS_KEY))
        days = _days(start, end)
        pipe = self._redis.pipeline(transaction=False)
        wanted = [(t, d) for t in tenants for d in days]
        for t, d in wanted:
            pipe.hgetall(usage_day_key(t, d))
        out: dict[UsageKey, dict[str, int]] = {}
        for (t, d), fields_ in zip(wanted, await pipe.execute(), strict=True):
            for field_, value in fields_.items():
                model, tier, counter = _text(field_).rsplit("|", 2)
                out.setdefault((d, t, model, tier), {})[counter] = int(value)
        return out

    async def session(self, session: SessionRef) -> dict[str, int]:
        raw = await self._redis.hgetall(session.key("usage"))
        return {_text(k): int(v) for k, v in raw.items()}


class MemoryUsageLedger:
    """The in-memory twin, for unit tests."""

    def __init__(self) -> None:
        self.rows: dict[UsageKey, dict[str, int]] = {}
        self.sessions: dict[SessionRef, dict[str, int]] = {}
        self.fail = False  # set to make writes fail as a store outage would

    async def add(
        self,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        if self.fail:
            raise RedisError("the ledger is down")
        for key, counts in rows.items():
            _add_into(self.rows.setdefault(key, {}), counts)
        for session, counts in sessions.items():
            _add_into(self.sessions.setdefault(session, {}), counts)

    async def read(
        self, tenant: str | None, start: dt.date, end: dt.date
    ) -> dict[UsageKey, dict[str, int]]:
        days = set(_days(start, end))
        return {
            key: dict(counts)
            for key, counts in self.rows.items()
            if key[0] in days and (tenant is None or key[1] == tenant)
        }

    async def session(self, session: SessionRef) -> dict[str, int]:
        return dict(self.sessions.get(session, {}))


def _add_into(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for counter, value in counts.items():
        into[counter] = into.get(counter, 0) + value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class UsageBook:
    """Sums counts in memory and writes them to the ledger in batches."""

    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger
        self._rows: dict[UsageKey, dict[str, int]] = defaultdict(dict)
        self._sessions: dict[SessionRef, dict[str, int]] = defaultdict(dict)
        self._lock = asyncio.Lock()

    def add(self, key: UsageKey, session: SessionRef | None, counts: Mapping[str, int]) -> None:
        _add_into(self._rows[key], counts)
        if session is not None:
            _add_into(self._sessions[session], counts)

    async def flush(self) -> None:
        async with self._lock:  # one writer at a time: a failed batch is merged back once
            if not self._rows and not self._sessions:
                return
            rows, sessions = self._rows, self._sessions
            self._rows, self._sessions = defaultdict(dict), defaultdict(dict)
            try:
                await self._ledger.add(rows, sessions)
            except UsageNotWritten as exc:
                log.warning("usage partly written (the rest kept for the next flush): %s", exc)
                self._keep(exc.rows, exc.sessions)
                raise
            except (RedisError, OSError) as exc:
                log.warning("usage not written yet (kept for the next flush): %s", exc)
                self._keep(rows, sessions)
                raise

    def _keep(
        self,
        rows: Mapping[UsageKey, Mapping[str, int]],
        sessions: Mapping[SessionRef, Mapping[str, int]],
    ) -> None:
        """Counts that did not reach the ledger, merged back for the next flush."""
        for key, counts in rows.items():
            _add_into(self._rows[key], counts)
        for session, counts in sessions.items():
            _add_into(self._sessions[session], counts)

    async def read(
        self, tenant: str | None, start: dt.date, end: dt.date
    ) -> dict[UsageKey, dict[str, int]]:
        await self.flush()
        return await self._ledger.read(tenant, start, end)

    async def session(self, session: SessionRef) -> dict[str, int]:
        await self.flush()
        return await self._ledger.session(session)


def usage_report(
    rows: Mapping[UsageKey, Mapping[str, int]], start: dt.date, end: dt.date
) -> dict[str, Any]:
    """`GET /v1/usage`'s body: one entry per (tenant, model, day), tiers within it."""
    grouped: dict[tuple[str, str, str], dict[str, dict[str, int]]] = defaultdict(dict)
    for (day, tenant, model, tier), counts in rows.items():
        grouped[(tenant, model, day)][tier] = dict(counts)
    data = []
    for (tenant, model, day), tiers in sorted(grouped.items()):
        total: dict[str, int] = {}
        for counts in tiers.values():
            _add_into(total, counts)
        data.append(
            {
                "tenant": tenant,
                "model": model,
                "day": day,
                **summary(total),
                "by_tier": {tier: summary(counts) for tier, counts in sorted(tiers.items())},
            }
        )
    everything: dict[str, int] = {}
    for counts in rows.values():
        _add_into(everything, counts)
    return {
        "object": "usage",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "currency": "USD",
        "data": data,
        "totals": summary(everything),
    }


def summary(counts: Mapping[str, int]) -> dict[str, Any]:
    """Counters as the API shows them: tokens, dollars, ratios."""
    c = {name: int(counts.get(name, 0)) for name in COUNTERS}
    saved = {
        "cache": c["saved_cache_nusd"] / NANO,
        "trimming": c["saved_trimming_nusd"] / NANO,
        "small_tier": c["saved_small_tier_nusd"] / NANO,
    }
    return {
        "requests": c["requests"],
        "errors": c["errors"],
        "input_tokens": c["input_tokens"],
        "cached_input_tokens": c["cached_input_tokens"],
        "output_tokens": c["output_tokens"],
        "input_output_ratio": (
            round(c["input_tokens"] / c["output_tokens"], 3) if c["output_tokens"] else None
        ),
        "cache_hit_ratio": (
            round(c["cached_input_tokens"] / c["input_tokens"], 4) if c["input_tokens"] else None
        ),
        "cost_usd": c["cost_nusd"] / NANO,
        "saved_usd": {**saved, "total": sum(saved.values())},
        "saved_tokens": {
            "cache": c["cached_input_tokens"],
            "trimming": c["trimmed_tokens"],
            "small_tier": c["small_tier_tokens"],
        },
    }


_NS_PER_DAY = 86_400 * 1_000_000_000


@functools.lru_cache(maxsize=4)
def _iso_day(day_number: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day_number)).isoformat()


def day_of(wall_ns: int) -> str:
    """The UTC date of a wall-clock time, as `YYYY-MM-DD` (once per request: the date of
    the same day is built once)."""
    return _iso_day(wall_ns // _NS_PER_DAY)


def parse_days(start: str | None, end: str | None, today: dt.date) -> tuple[dt.date, dt.date]:
    """The `start`/`end` query parameters (ISO dates, inclusive; default: today)."""
    first = dt.date.fromisoformat(start) if start else today
    last = dt.date.fromisoformat(end) if end else (first if start else today)
    return first, last
