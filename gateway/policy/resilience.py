"""The policy's `resilience` section: breakers, retries, admission, the answer cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.policy.base import Strict


class BreakerSpec(Strict):
    """A circuit breaker per replica: connect errors, timeouts and 5xx count; 4xx and
    clients going away never do."""

    consecutive_failures: int = Field(5, ge=1, description="Failures in a row that open it.")
    error_rate: float = Field(
        0.5, gt=0, le=1, description="Or this share of failures over `window_s` opens it."
    )
    window_s: float = Field(60.0, gt=0, description="The window the error rate is taken over.")
    min_calls: int = Field(
        20, ge=1, description="Calls in the window before the error rate is judged."
    )
    open_s: float = Field(15.0, gt=0, description="How long it stays open before a trial.")
    half_open_trials: int = Field(
        1, ge=1, description="Trial requests let through at once while half-open."
    )


class RetrySpec(Strict):
    attempts: int = Field(
        3, ge=1, description="Tries per request, the first included; only before the first byte."
    )
    backoff_base_s: float = Field(0.1, ge=0, description="Exponential backoff, full jitter.")
    backoff_max_s: float = Field(2.0, ge=0, description="The longest wait between two tries.")
    retry_after_cap_s: float = Field(
        5.0, ge=0, description="An engine's Retry-After is honoured up to this."
    )
    on_status: tuple[int, ...] = Field(
        (429, 502, 503, 504), description="Engine statuses that are retried (on another replica)."
    )


class AdmissionSpec(Strict):
    max_inflight_per_replica: int = Field(
        64, ge=1, description="Requests in flight to one replica before it counts as full."
    )
    on_saturated: Literal["reject", "wait"] = Field(
        "reject",
        description="Every replica full (in flight, or the engine's queue at "
        "`routing.max_waiting`): answer 429 at once, or wait up to `wait_s` for room.",
    )
    wait_s: float = Field(2.0, gt=0, description="Longest wait for room with `on_saturated: wait`.")
    share_wait_s: float = Field(
        10.0,
        gt=0,
        description="Every replica full: a request of a tenant below its share of the pool "
        "(`tenants.<name>.share`) waits in line this long for the next free slot, its tenant "
        "served before those above their share; a tenant at or above its share is answered "
        "per `on_saturated` (gateway/resilience/fair_share.py).",
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After on the 429.")


class ResponseCacheSpec(Strict):
    enabled: bool = Field(
        False,
        description="Keep deterministic answers (temperature 0, one choice, not streamed) "
        "and serve the same request's answer when nothing else can.",
    )
    ttl_s: int = Field(3600, ge=1, description="How long a kept answer can be served.")


class ResilienceSpec(Strict):
    breaker: BreakerSpec = BreakerSpec()
    retries: RetrySpec = RetrySpec()
    admission: AdmissionSpec = AdmissionSpec()
    response_cache: ResponseCacheSpec = ResponseCacheSpec()
