"""`Quota`: admits each request against its tenant's and key's rate limits and its
tenant's budget, and settles it once its response has been sent.

Admission (on the request path, after the model is known): one store call checks and
charges every bucket and budget period that applies, with the request's estimated tokens
and cost (gateway/quota/estimate.py). A refusal is a 429: `rate_limit_exceeded` with
Retry-After and the x-ratelimit-* headers, or `budget_exceeded` (type
`insufficient_quota`) naming the budget and when it resets. A tenant whose budget says
`on_exceeded: downgrade` is served over budget by `downgrade_to` instead, marked with
`X-Gateway-Budget: downgraded`; nothing is ever downgraded silently.

Settling (at the edge, after the last byte, streams included: gateway/edge/middleware.py):
the estimate is replaced by what the engines counted, at the policy's prices. A request
that failed without an answer is refunded. A stream whose count never came (the client
cut it short, or the engine broke off) is settled on what it relayed: its estimated
prompt, and one completion token per chunk (vLLM streams a chunk per token of one choice;
its role and finish chunks make this err a little high), never on `max_tokens` x `n` it
did not produce. An answer read whole that carried no count keeps its estimate.

A request nothing limits (its tenant has no limits or budget, its key none of its own)
costs a dict lookup: no store call, no estimate.

Redis unreachable: `quota.on_store_outage`. The default serves the request unmetered
(fail open), for the reason the session store's outage rule does: limits here share
engines fairly and keep spend in check, while the engines protect themselves (admission
control answers 429 `overloaded` whatever Redis does); refusing every limited tenant
while Redis is down would make limits cost availability, and the overshoot is bounded
by the outage's length. `fail_closed` refuses with 503 instead, for deployments where
unmetered use is worse than none.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

from redis.exceptions import RedisError

from gateway import headers as gateway_headers
from gateway.chat.inbound import InboundRequest
from gateway.errors import BudgetExceeded, RateLimited, StateUnavailable
from gateway.policy import Endpoint, Policy
from gateway.policy.auth import TenantSpec
from gateway.policy.quota import BudgetSpec, RateLimitSpec
from gateway.policy.telemetry import PriceSpec
from gateway.quota.estimate import estimate_nusd, estimate_tokens
from gateway.quota.headers import go_duration, rate_headers, retry_after
from gateway.quota.store import Bucket, Period, QuotaStore, QuotaVerdict
from gateway.state.keys import quota_key
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prices import NANO, Prices
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import Identity, TenantAccess

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Grant:
    """An admitted request: the request to serve (another model when downgraded), the
    headers to answer with, and what it was charged, to settle when it has ended."""

    request: InboundRequest
    headers: dict[str, str]
    tenant: str
    tokens: tuple[Bucket, ...]  # its token buckets, each with what admission forgave it
    periods: tuple[Period, ...]
    estimated_prompt: int
    estimated_tokens: int  # prompt and completion
    estimated_nusd: int
    quota: Quota

    async def settle(self, record: RequestRecord) -> None:
        await self.quota.settle(self, record)


class Quota:
    def __init__(
        self,
        policy: Policy,
        store: QuotaStore,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.time,
        prices: Prices | None = None,
        context_of: Callable[[str], int | None] | None = None,
    ) -> None:
        """`prices`: the runtime's, which telemetry's spend uses too; else the policy's.
        `context_of`: the window of the engines serving a model alias (Fleet.context_tokens),
        which bounds the output a request is estimated at; asked only of limited tenants."""
        self._store = store
        self._context_of = context_of
        self._metrics = metrics
        self._clock = clock  # names budget periods only; buckets run on Redis's clock
        self._fail_open = policy.quota.on_store_outage == "fail_open"
        self._tenants = {
            name: spec
            for name, spec in policy.tenants.items()
            if spec.rate_limits or spec.key_rate_limits or spec.budget
        }
        self._prices = prices or Prices(policy)
        self._price_of = {
            alias: _alias_price(policy, self._prices, alias) for alias in policy.models
        }
        self._serves = {alias: _served_endpoints(policy, alias) for alias in policy.models}

    async def admit(
        self,
        request: InboundRequest,
        body_bytes: int,
        access: TenantAccess,
        identity: Identity | None,
    ) -> Grant | None:
        """The grant of an admitted request; None when nothing limits it (or the store is
        down and the policy fails open). Raises RateLimited, BudgetExceeded, or
        StateUnavailable (the store is down and the policy fails closed)."""
        tenant = access.name
        spec = self._tenants.get(tenant)
        key_limits = identity.rate_limits if identity is not None else None
        if spec is None and key_limits is None:
            return None
        if key_limits is None and identity is not None and spec is not None:
            key_limits = spec.key_rate_limits
        window = self._context_of(request.model) if self._context_of is not None else None
        prompt, completion = estimate_tokens(request, body_bytes, window)
        buckets = tuple(_buckets(tenant, spec, identity, key_limits, prompt + completion))
        budget = spec.budget if spec is not None else None
        periods = self._periods(tenant, budget, request.model, prompt, completion)
        headers: dict[str, str] = {}
        try:
            verdict = await self._store.admit(tenant, buckets, periods, enforce_budget=True)
            if verdict.outcome == "over_budget":
                assert budget is not None
                limit = _budget_limit(periods, verdict.denied)
                target = self._downgrade_target(tenant, budget, request, periods, verdict)
                request = _with_model(request, target)
                periods = self._periods(tenant, budget, target, prompt, completion)
                # Served over budget: the rate limits still hold, the budget still counts.
                verdict = await self._store.admit(tenant, buckets, periods, enforce_budget=False)
                if verdict.outcome == "admitted":
                    self._metrics.budget_exceeded.labels(tenant, limit, "downgraded").inc()
                headers[gateway_headers.BUDGET] = "downgraded"
        except (RedisError, OSError) as exc:
            self._store_failed(exc)
            return None
        if verdict.outcome == "rate_limited":
            raise self._rate_limited(tenant, identity, buckets, verdict)
        headers.update(rate_headers(buckets, verdict.buckets))
        token_buckets = tuple(
            replace(bucket, forgiven=bucket.cost - state.taken)  # the debt floor's cut
            for bucket, state in zip(buckets, verdict.buckets, strict=True)
            if bucket.unit == "tokens"
        )
        estimated_nusd = periods[0].nusd if periods else 0
        return Grant(
            request,
            headers,
            tenant,
            token_buckets,
            periods,
            prompt,
            prompt + completion,
            estimated_nusd,
            self,
        )

    async def settle(self, grant: Grant, record: RequestRecord) -> None:
        """Replace the grant's estimate by what the engines counted. Never raises: the
        response has been sent; an outage leaves the estimate charged (and is counted)."""
        if not grant.tokens and not grant.periods:
            return  # only request counts: nothing to correct
        actual = self._actual(grant, record)
        if actual is None:
            return
        token_delta = actual[0] - grant.estimated_tokens
        nusd_delta = actual[1] - grant.estimated_nusd if grant.periods else 0
        if not token_delta and not nusd_delta:
            return
        try:
            await self._store.settle(
                grant.tenant, grant.tokens, grant.periods, token_delta, nusd_delta
            )
        except (RedisError, OSError) as exc:
            log.warning("quota of request %s not settled: %s", record.request_id, exc)
            self._metrics.quota_store_failures.labels("unsettled").inc()

    def _actual(self, grant: Grant, record: RequestRecord) -> tuple[int, int] | None:
        """Tokens and nano-dollars the request used: the engines' counts; nothing for a
        request that failed uncounted or never reached an engine (answered by the gateway
        itself); for a stream that ended uncounted, its prompt as estimated and a token
        per chunk relayed; None (keep the estimate) for a whole answer never counted."""
        answers = (record.result, *(facts for _, facts in record.earlier))
        if any(a.prompt_tokens is not None or a.completion_tokens is not None for a in answers):
            spend = self._prices.spend(record)
            return spend.input_tokens + spend.output_tokens, spend.cost_nusd
        if record.status >= 400 or not record.attempts:
            return 0, 0
        if not record.stream:
            return None
        prompt, completion = grant.estimated_prompt, record.result.chunks
        price = self._prices.by_pool.get(record.pool or "")
        return prompt + completion, estimate_nusd(price, prompt, completion)

    def _periods(
        self,
        tenant: str,
        budget: BudgetSpec | None,
        model: str,
        prompt: int,
        completion: int,
    ) -> tuple[Period, ...]:
        if budget is None:
            return ()
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        tokens = prompt + completion
        nusd = estimate_nusd(self._price_of.get(model), prompt, completion)
        today = now.date()
        month = today.replace(day=1)
        next_month = (month + dt.timedelta(days=32)).replace(day=1)
        periods = []
        if budget.tokens_per_day is not None or budget.usd_per_day is not None:
            periods.append(
                Period(
                    quota_key(tenant, f"day:{today.isoformat()}"),
                    "day",
                    _midnight(today + dt.timedelta(days=1)),
                    budget.tokens_per_day,
                    _nusd(budget.usd_per_day),
                    tokens,
                    nusd,
                )
            )
        if budget.tokens_per_month is not None or budget.usd_per_month is not None:
            periods.append(
                Period(
                    quota_key(tenant, f"month:{month:%Y-%m}"),
                    "month",
                    _midnight(next_month),
                    budget.tokens_per_month,
                    _nusd(budget.usd_per_month),
                    tokens,
                    nusd,
                )
            )
        return tuple(periods)

    def _downgrade_target(
        self,
        tenant: str,
        budget: BudgetSpec,
        request: InboundRequest,
        periods: tuple[Period, ...],
        verdict: QuotaVerdict,
    ) -> str:
        """The model an over-budget request is served by; BudgetExceeded when the budget
        rejects, or its downgrade model cannot serve this endpoint."""
        target = budget.downgrade_to
        if target is None or request.endpoint not in self._serves.get(target, ()):
            limit = _budget_limit(periods, verdict.denied)
            self._metrics.budget_exceeded.labels(tenant, limit, "rejected").inc()
            raise self._over_budget(tenant, periods, verdict)
        return target

    def _over_budget(
        self, tenant: str, periods: tuple[Period, ...], verdict: QuotaVerdict
    ) -> BudgetExceeded:
        period = periods[verdict.denied // 2]
        tokens_used, nusd_used = verdict.used[verdict.denied // 2]
        adjective = "daily" if period.name == "day" else "monthly"
        if verdict.denied % 2:
            assert period.nusd_limit is not None
            what = (
                f"spending budget: {_usd(nusd_used)} of {_usd(period.nusd_limit)} spent this "
                f"{period.name} (UTC), and this request may cost up to {_usd(period.nusd)}"
            )
        else:
            assert period.token_limit is not None
            what = (
                f"token budget: {tokens_used:,} of {period.token_limit:,} tokens used this "
                f"{period.name} (UTC), and this request needs about {period.tokens:,} more"
            )
        wait_s = max(1, period.resets_at - int(self._clock()))
        resets = dt.datetime.fromtimestamp(period.resets_at, dt.UTC)
        return BudgetExceeded(
            f"Tenant `{tenant}` is over its {adjective} {what}. The budget resets at "
            f"{resets:%Y-%m-%dT%H:%M:%SZ} (in {go_duration(wait_s * 1000)}).",
            # OpenAI's SDKs retry a 429 unless told not to; waiting hours is not a retry.
            headers={"Retry-After": str(wait_s), "x-should-retry": "false"},
        )

    def _rate_limited(
        self,
        tenant: str,
        identity: Identity | None,
        buckets: tuple[Bucket, ...],
        verdict: QuotaVerdict,
    ) -> RateLimited:
        bucket, state = buckets[verdict.denied], verdict.buckets[verdict.denied]
        self._metrics.rate_limited.labels(tenant, bucket.limit).inc()
        who = f"tenant `{tenant}`"
        if bucket.scope == "key" and identity is not None:
            who = f"key `{identity.key_id}` of {who}"
        return RateLimited(
            f"Rate limit reached for {who} on {bucket.unit} per minute: limit "
            f"{bucket.capacity}, remaining {state.remaining}, requested {bucket.cost}. "
            f"Please try again in {go_duration(verdict.wait_ms)}.",
            headers={
                "Retry-After": retry_after(verdict.wait_ms),
                **rate_headers(buckets, verdict.buckets),
            },
        )

    def _store_failed(self, exc: Exception) -> None:
        if self._fail_open:
            log.warning("quota store unreachable, request served unmetered: %s", exc)
            self._metrics.quota_store_failures.labels("served").inc()
            return
        self._metrics.quota_store_failures.labels("refused").inc()
        raise StateUnavailable(
            "The quota store is unreachable, and this gateway refuses requests it cannot "
            "meter (quota.on_store_outage: fail_closed). Please try again shortly."
        ) from None


def quota_applies(policy: Policy) -> bool:
    """Can any request of this policy be limited? Some tenant has limits or a budget, or
    keys are checked (a run-time key may carry its own limits)."""
    return bool(policy.tenants) or bool(policy.auth.keys_file)


def _buckets(
    tenant: str,
    spec: TenantSpec | None,
    identity: Identity | None,
    key_limits: RateLimitSpec | None,
    tokens: int,
) -> Iterator[Bucket]:
    if spec is not None and spec.rate_limits is not None:
        yield from _rate_buckets(tenant, "tenant", "tenant", spec.rate_limits, tokens)
    if identity is not None and key_limits is not None:
        yield from _rate_buckets(tenant, "key", f"key:{identity.key_id}", key_limits, tokens)


def _rate_buckets(
    tenant: str, scope: Literal["tenant", "key"], part: str, limits: RateLimitSpec, tokens: int
) -> Iterator[Bucket]:
    if limits.requests_per_minute is not None:
        key = quota_key(tenant, f"{part}:requests")
        yield Bucket(key, scope, "requests", limits.requests_per_minute, 1)
    if limits.tokens_per_minute is not None:
        key = quota_key(tenant, f"{part}:tokens")
        yield Bucket(key, scope, "tokens", limits.tokens_per_minute, tokens)


def _budget_limit(periods: tuple[Period, ...], denied: int) -> str:
    """The policy field a budget refusal names, e.g. `usd_per_day`."""
    return f"{'usd' if denied % 2 else 'tokens'}_per_{periods[denied // 2].name}"


def _with_model(request: InboundRequest, alias: str) -> InboundRequest:
    if alias == request.model:
        return request
    return replace(request.with_body({**request.body, "model": alias}), model=alias)


def _nusd(usd: float | None) -> int | None:
    return None if usd is None else round(usd * NANO)


def _usd(nusd: int) -> str:
    dollars = nusd / NANO
    return f"${dollars:,.2f}" if dollars >= 1 else f"${dollars:.4f}"


def _midnight(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp())


def _alias_price(policy: Policy, prices: Prices, alias: str) -> PriceSpec | None:
    model = policy.models[alias]
    if model.pool is not None:
        return prices.by_pool.get(model.pool)
    return prices.reference.get(alias)


def _served_endpoints(policy: Policy, alias: str) -> frozenset[Endpoint]:
    """The endpoints every pool behind a model alias serves."""
    model = policy.models[alias]
    pools = [model.pool] if model.pool else list(policy.tiering[model.tiering or ""].tiers.values())
    served = [frozenset(policy.pools[pool].serves) for pool in pools if pool in policy.pools]
    return frozenset.intersection(*served) if served else frozenset()
