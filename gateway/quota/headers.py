"""The rate-limit headers, as OpenAI sends them: on 429s and on admitted requests.

    x-ratelimit-limit-requests / -tokens      the per-minute limit
    x-ratelimit-remaining-requests / -tokens  what is left after this request
    x-ratelimit-reset-requests / -tokens      until the bucket is full again ("1s", "6m0s")

A request checked against both its tenant's and its key's bucket of one unit reports
the one with less left: that is the limit the client runs into first.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.quota.store import Bucket, BucketState


def rate_headers(buckets: Sequence[Bucket], states: Sequence[BucketState]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for unit in ("requests", "tokens"):
        pairs = [(b, s) for b, s in zip(buckets, states, strict=True) if b.unit == unit]
        if not pairs:
            continue
        bucket, state = min(pairs, key=lambda pair: (pair[1].remaining, -pair[1].reset_ms))
        headers[f"x-ratelimit-limit-{unit}"] = str(bucket.capacity)
        headers[f"x-ratelimit-remaining-{unit}"] = str(state.remaining)
        headers[f"x-ratelimit-reset-{unit}"] = go_duration(state.reset_ms)
    return headers


def retry_after(wait_ms: int) -> str:
    """Retry-After in whole seconds, rounded up and at least 1 (0 would invite a storm)."""
    return str(max(1, -(-wait_ms // 1000)))


def go_duration(ms: int) -> str:
    """A duration as OpenAI writes it (Go's format): 20ms, 1.5s, 6m0s, 1h2m3s."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds
