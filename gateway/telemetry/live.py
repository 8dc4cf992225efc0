"""The last few minutes of traffic, in time buckets, for the dashboard.

This process's view only (each gateway replica shows its own; Prometheus and the Grafana
dashboard in deploy/ sum over all of them).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.telemetry.record import RequestRecord
from gateway.telemetry.usage import summary

_TTFT_SAMPLES = 1024  # per bucket: enough for a p95, bounded memory


@dataclass
class _Bucket:
    t: float
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return round(sorted_values[index], 2)


class LiveStats:
    def __init__(
        self,
        *,
        bucket_s: float = 5.0,
        window_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bucket_s = bucket_s
        self.window_s = window_s
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()
        self._totals: Counter[str] = Counter()
        self._tiers: Counter[str] = Counter()
        self._by_replica: Counter[str] = Counter()

    def _bucket(self, now: float) -> _Bucket:
        start = now - now % self.bucket_s
        if not self._buckets or self._buckets[-1].t < start:
            self._buckets.append(_Bucket(start))
        while self._buckets and self._buckets[0].t <= now - self.window_s:
            self._buckets.popleft()
        return self._buckets[-1]

    def add(self, record: RequestRecord, counts: dict[str, int]) -> None:
        """One finished request, with its ledger counters (Spend.counts)."""
        bucket = self._bucket(self._clock())
        bucket.requests += 1
        bucket.errors += counts["errors"]
        bucket.prompt_tokens += counts["input_tokens"]
        bucket.cached_prompt_tokens += counts["cached_input_tokens"]
        if record.first_byte_ns and record.stream and len(bucket.ttft_ms) < _TTFT_SAMPLES:
            bucket.ttft_ms.append((record.first_byte_ns - record.start_ns) / 1e6)
        self._totals.update(counts)
        if record.tier is not None:
            self._tiers[record.tier] += 1
        if record.replica is not None:
            self._by_replica[record.replica] += 1

    def replica_requests(self, replica: str) -> int:
        return self._by_replica[replica]

    def snapshot(self, replicas: list[dict[str, Any]]) -> dict[str, Any]:
        now = self._clock()
        self._bucket(now)  # drop what fell out of the window
        series = []
        for bucket in self._buckets:
            ttft = sorted(bucket.ttft_ms)
            span = min(self.bucket_s, max(1e-3, now - bucket.t))
            series.append(
                {
                    "t": bucket.t,
                    "requests": bucket.requests,
                    "rps": round(bucket.requests / span, 3),
                    "errors": bucket.errors,
                    "ttft_p50_ms": _quantile(ttft, 0.5),
                    "ttft_p95_ms": _quantile(ttft, 0.95),
                    "prompt_tokens": bucket.prompt_tokens,
                    "cached_prompt_tokens": bucket.cached_prompt_tokens,
                    "cache_hit_ratio": (
                        round(bucket.cached_prompt_tokens / bucket.prompt_tokens, 4)
                        if bucket.prompt_tokens
                        else None
                    ),
                }
            )
        totals = summary(self._totals)  # the same figures as GET /v1/usage
        return {
            "now": now,
            "window_s": self.window_s,
            "bucket_s": self.bucket_s,
            "series": series,
            "totals": {
                "requests": totals["requests"],
                "errors": totals["errors"],
                "prompt_tokens": totals["input_tokens"],
                "cached_prompt_tokens": totals["cached_input_tokens"],
                "completion_tokens": totals["output_tokens"],
                "cache_hit_ratio": totals["cache_hit_ratio"],
                "cost_usd": totals["cost_usd"],
                "saved_usd": totals["saved_usd"],
                "saved_tokens": totals["saved_tokens"],
            },
            "tiers": dict(self._tiers),
            "replicas": replicas,
        }
