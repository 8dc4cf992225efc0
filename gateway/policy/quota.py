"""The policy's rate limits and budgets (enforced by gateway/quota/).

A tenant may have `rate_limits` (the whole tenant, all its keys together), `key_rate_limits`
(the default for each of its keys) and a `budget` (per UTC day and month, in tokens or in
US dollars at the policy's prices). A key's own `rate_limits` (a static key's in the
policy, a run-time key's in its Redis record) replace the tenant's `key_rate_limits` for
that key, whole: a field the key's limits leave unset is unlimited for it. The top-level
`quota` section says what happens while Redis, which holds every counter, is unreachable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gateway.policy.base import Name, Strict


class RateLimitSpec(Strict):
    """Per-minute limits, enforced as token buckets (capacity: the limit; refilled
    continuously, the whole capacity per minute)."""

    requests_per_minute: int | None = Field(None, ge=1, description="Requests per minute.")
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        description="Prompt plus completion tokens per minute: estimated when a request "
        "is admitted, corrected to the engine's count when it ends.",
    )

    @model_validator(mode="after")
    def _some_limit(self) -> RateLimitSpec:
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("give requests_per_minute, tokens_per_minute or both")
        return self


class BudgetSpec(Strict):
    """What a tenant may use per UTC day and per UTC month; any mix of the four limits."""

    tokens_per_day: int | None = Field(None, ge=1, description="Tokens per UTC day.")
    tokens_per_month: int | None = Field(None, ge=1, description="Tokens per UTC month.")
    usd_per_day: float | None = Field(
        None, gt=0, description="US dollars per UTC day, at the pools' `price`."
    )
    usd_per_month: float | None = Field(
        None, gt=0, description="US dollars per UTC month, at the pools' `price`."
    )
    on_exceeded: Literal["reject", "downgrade"] = Field(
        "reject",
        description="Over budget: refuse with 429 insufficient_quota, or serve the request "
        "with the model `downgrade_to` (reported in `X-Gateway-Budget: downgraded`).",
    )
    downgrade_to: Name | None = Field(
        None, description="The model alias over-budget requests go to (with `downgrade`)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> BudgetSpec:
        limits = (self.tokens_per_day, self.tokens_per_month, self.usd_per_day, self.usd_per_month)
        if all(limit is None for limit in limits):
            raise ValueError(
                "give at least one of tokens_per_day, tokens_per_month, usd_per_day, usd_per_month"
            )
        if self.on_exceeded == "downgrade" and self.downgrade_to is None:
            raise ValueError("on_exceeded: downgrade needs downgrade_to (a model alias)")
        if self.on_exceeded == "reject" and self.downgrade_to is not None:
            raise ValueError("downgrade_to is used only with on_exceeded: downgrade")
        return self


class QuotaSpec(Strict):
    on_store_outage: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="Redis unreachable while a request has limits: serve it unmetered "
        "(counted in gateway_quota_store_failures), or refuse it with 503.",
    )


def budget_problems(
    tenant: dict[str, Any], models: dict[Any, Any]
) -> list[tuple[tuple[str, ...], str]]:
    """A budget's `downgrade_to` that names no model, or one the tenant may not use, as
    (path inside the tenant, message); read off the raw policy by the loader."""
    budget = tenant.get("budget")
    target = budget.get("downgrade_to") if isinstance(budget, dict) else None
    if not isinstance(target, str):
        return []
    where = ("budget", "downgrade_to")
    if target not in models:
        known = ", ".join(sorted(str(name) for name in models)) or "(no models defined)"
        return [(where, f"model {target!r} is not defined (expected one of: {known})")]
    allowed = tenant.get("models")
    if isinstance(allowed, list) and target not in allowed:
        return [(where, f"model {target!r} is not one of this tenant's `models`")]
    return []
