"""`Quota` on the in-memory twin: which limits apply to whom, the 429s and their headers,
reject or downgrade over budget, settling, and what a store outage does."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from gateway.chat.inbound import InboundRequest, parse_request
from gateway.errors import BudgetExceeded, RateLimited, StateUnavailable
from gateway.policy import Endpoint, Policy, parse_policy
from gateway.policy.quota import RateLimitSpec
from gateway.quota.estimate import estimate_tokens
from gateway.quota.headers import go_duration, retry_after
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.service import Grant, Quota
from gateway.quota.store import QuotaVerdict
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import Identity, TenantAccess

POLICY = """\
version: 1
quota: {{on_store_outage: {outage}}}
pools:
  big: {{served_model: served-big, replicas: [{{url: "http://b.test:1"}}], price: {{input: 2.0, output: 8.0}}}}
  small: {{served_model: served-small, replicas: [{{url: "http://s.test:1"}}], price: {{input: 0.1, output: 0.4}}}}
  embed: {{served_model: served-embed, serves: [embeddings], replicas: [{{url: "http://e.test:1"}}]}}
models:
  large: {{pool: big}}
  tiny: {{pool: small}}
  vectors: {{pool: embed}}
tenants:
  acme:
    rate_limits: {{requests_per_minute: 3, tokens_per_minute: 10000}}
    key_rate_limits: {{requests_per_minute: 2}}
  strict:
    budget: {{tokens_per_day: 100}}
  capped:
    budget: {{tokens_per_day: 5000, on_exceeded: downgrade, downgrade_to: tiny}}
  thrifty:
    budget: {{usd_per_month: 0.01}}
  free: {{}}
"""
# 2025-06-01T21:00:00Z: three hours before the day's budgets reset
NOW = dt.datetime(2025, 6, 1, 21, tzinfo=dt.UTC).timestamp()


def policy(outage: str = "fail_open") -> Policy:
    return parse_policy(POLICY.format(outage=outage))


def quota(
    store: MemoryQuotaStore | None = None, *, outage: str = "fail_open"
) -> tuple[Quota, MemoryQuotaStore, GatewayMetrics]:
    store = store or MemoryQuotaStore()
    metrics = GatewayMetrics()
    return Quota(policy(outage), store, metrics, clock=lambda: NOW), store, metrics


def chat(
    model: str = "large", *, max_tokens: int | None = None, text: str = "hi"
) -> InboundRequest:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return parse_request(Endpoint.chat, orjson.dumps(body))


def key(key_id: str, tenant: str, limits: RateLimitSpec | None = None) -> Identity:
    return Identity(key_id, tenant, rate_limits=limits)


async def admit(
    q: Quota, request: InboundRequest, tenant: str, identity: Identity | None = None
) -> Grant | None:
    raw_size = len(orjson.dumps(request.body))
    return await q.admit(request, raw_size, TenantAccess(tenant), identity)


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class NoStore(MemoryQuotaStore):
    """A store that must not be called."""

    async def admit(self, *args: Any, **kwargs: Any) -> QuotaVerdict:
        raise AssertionError("the store was called")

    async def settle(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the store was called")


async def test_a_caller_nothing_limits_costs_no_store_call() -> None:
    q = Quota(policy(), NoStore(), GatewayMetrics())
    assert await admit(q, chat(), "free", key("k1", "free")) is None
    assert await admit(q, chat(), "default") is None  # authentication off: no key
    assert await admit(q, chat(), "unlisted", key("k2", "unlisted")) is None


async def test_a_key_over_its_limit_gets_openai_s_429_with_the_headers() -> None:
    q, _, metrics = quota()
    k1 = key("k1", "acme")
    first = await admit(q, chat(), "acme", k1)
    assert first is not None
    assert first.headers["x-ratelimit-limit-requests"] == "2"  # the key's: it has less left
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert first.headers["x-ratelimit-reset-requests"] in ("30s", "29.999s")
    await admit(q, chat(), "acme", k1)

    with pytest.raises(RateLimited) as refused:
        await admit(q, chat(), "acme", k1)
    error = refused.value
    assert (error.status, error.error_type, error.code) == (
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    assert "key `k1` of tenant `acme`" in error.message and "requests per minute" in error.message
    assert error.headers["Retry-After"] == "30"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-limit-requests"] == "2"
    assert (
        sample(
            metrics, "gateway_rate_limited_total", tenant="acme", limit="key.requests_per_minute"
        )
        == 1
    )


async def test_each_key_has_its_own_bucket_inside_the_tenant_s() -> None:
    q, _, _ = quota()
    for identity in (key("k1", "acme"), key("k1", "acme"), key("k2", "acme")):
        assert await admit(q, chat(), "acme", identity) is not None
    # k3's own bucket is full, the tenant's (3 a minute) is not
    with pytest.raises(RateLimited) as refused:
        await admit(q, chat(), "acme", key("k3", "acme"))
    assert "for tenant `acme`" in refused.value.message


async def test_a_key_s_own_limits_replace_its_tenant_s_default() -> None:
    q, _, _ = quota()
    own = key("k1", "acme", RateLimitSpec(tokens_per_minute=50))
    grant = await admit(q, chat(text="x" * 300), "acme", own)  # about 90 tokens: debt
    assert grant is not None and grant.headers["x-ratelimit-limit-requests"] == "3"  # tenant's
    with pytest.raises(RateLimited) as refused:
        await admit(q, chat(), "acme", own)
    assert "key `k1`" in refused.value.message and "tokens per minute" in refused.value.message


async def test_over_a_token_budget_is_a_clear_insufficient_quota_error() -> None:
    q, _, metrics = quota()
    with pytest.raises(BudgetExceeded) as refused:
        await admit(q, chat(max_tokens=200), "strict")
    error = refused.value
    assert (error.status, error.error_type, error.code) == (
        429,
        "insufficient_quota",
        "budget_exceeded",
    )
    assert "Tenant `strict` is over its daily token budget: 0 of 100 tokens" in error.message
    assert "resets at 2025-06-02T00:00:00Z (in 3h0m0s)" in error.message
    assert error.headers == {"Retry-After": "10800", "x-should-retry": "false"}
    assert (
        sample(
            metrics,
            "gateway_budget_exceeded_total",
            tenant="strict",
            limit="tokens_per_day",
            action="rejected",
        )
        == 1
    )
    assert await admit(q, chat(max_tokens=20), "strict") is not None  # a smaller one fits


async def test_over_budget_with_downgrade_is_served_by_the_named_model_and_says_so() -> None:
    q, store, metrics = quota()
    grant = await admit(q, chat(max_tokens=4980), "capped")
    assert grant is not None and "X-Gateway-Budget" not in grant.headers
    downgraded = await admit(q, chat("large", max_tokens=100), "capped")
    assert downgraded is not None
    assert downgraded.request.model == "tiny" and downgraded.request.body["model"] == "tiny"
    assert downgraded.headers["X-Gateway-Budget"] == "downgraded"
    assert (
        sample(
            metrics,
            "gateway_budget_exceeded_total",
            tenant="capped",
            limit="tokens_per_day",
            action="downgraded",
        )
        == 1
    )
    # what it is served with still counts
    assert sum(c["tokens"] for c in store.counters.values()) > 5000


async def test_no_downgrade_to_a_model_that_cannot_serve_the_endpoint() -> None:
    q, _, _ = quota()
    await admit(q, chat(max_tokens=4999), "capped")
    embedding = parse_request(Endpoint.embeddings, b'{"model": "vectors", "input": "some text"}')
    with pytest.raises(BudgetExceeded):
        await admit(q, embedding, "capped")


async def test_a_dollar_budget_uses_the_policy_s_prices() -> None:
    q, _, _ = quota()
    # about 20 prompt tokens at $2/M and 1,000 completion tokens at $8/M: under a cent
    assert await admit(q, chat(max_tokens=1000), "thrifty") is not None
    with pytest.raises(BudgetExceeded) as refused:
        await admit(q, chat(max_tokens=1000), "thrifty")
    assert "monthly spending budget: $0.0080 of $0.0100 spent this month" in refused.value.message
    assert "resets at 2025-07-01T00:00:00Z" in refused.value.message


def finished(
    record_status: int, prompt: int | None = None, completion: int | None = None
) -> RequestRecord:
    record = RequestRecord.detached()
    record.status, record.pool, record.model = record_status, "big", "large"
    record.result.prompt_tokens, record.result.completion_tokens = prompt, completion
    return record


async def test_settling_replaces_the_estimate_with_the_engine_s_count() -> None:
    q, _, _ = quota()
    grant = await admit(q, chat(max_tokens=2000), "acme", key("k1", "acme"))
    assert grant is not None and grant.estimated_tokens > 2000
    await grant.settle(finished(200, prompt=30, completion=70))
    after = await admit(q, chat(), "acme", key("k1", "acme"))
    assert after is not None
    assert 10000 - 100 - after.estimated_tokens - 1 <= int(
        after.headers["x-ratelimit-remaining-tokens"]
    )


async def test_a_failed_request_is_refunded_and_an_uncounted_answer_keeps_its_estimate() -> None:
    q, _, _ = quota()
    failed = await admit(q, chat(max_tokens=3000), "acme")
    assert failed is not None
    await failed.settle(finished(502))
    cut_short = await admit(q, chat(max_tokens=3000), "acme")
    assert cut_short is not None
    assert (
        int(cut_short.headers["x-ratelimit-remaining-tokens"])
        >= 10000 - cut_short.estimated_tokens - 1
    )
    left = finished(200)  # an answer read whole that carried no usage
    left.attempt("b.test:1", "big")
    await cut_short.settle(left)
    after = await admit(q, chat(), "acme")
    assert after is not None
    assert int(after.headers["x-ratelimit-remaining-tokens"]) < 10000 - 3000


async def test_a_stream_cut_short_is_settled_on_its_prompt_and_the_chunks_it_relayed() -> None:
    q, _, _ = quota(MemoryQuotaStore(clock_ms=lambda: 0.0))  # no refill between the calls
    grant = await admit(q, chat(max_tokens=3000), "acme")
    assert grant is not None and grant.estimated_tokens > 3000
    left = finished(200)  # the client left mid-stream: the engine's usage never came
    left.stream = True
    left.attempt("b.test:1", "big")
    left.result.chunks = 40
    await grant.settle(left)
    after = await admit(q, chat(), "acme")
    assert after is not None
    used = 10000 - after.estimated_tokens - int(after.headers["x-ratelimit-remaining-tokens"])
    assert used == grant.estimated_prompt + 40


async def test_a_charge_cut_by_the_debt_floor_is_settled_from_what_it_took() -> None:
    q, _, _ = quota(MemoryQuotaStore(clock_ms=lambda: 0.0))
    grant = await admit(q, chat(max_tokens=50_000), "acme")  # 5 buckets of 10,000
    assert grant is not None and grant.tokens[0].forgiven == grant.estimated_tokens - 20_000
    await grant.settle(finished(200, prompt=100, completion=400))
    after = await admit(q, chat(), "acme")
    assert after is not None  # it used 500: a refund of all it asked for would show 10,000
    remaining = int(after.headers["x-ratelimit-remaining-tokens"])
    assert remaining == 10000 - 500 - after.estimated_tokens


async def test_a_request_no_engine_answered_is_refunded() -> None:
    q, _, _ = quota()
    grant = await admit(q, chat(max_tokens=3000), "acme")
    assert grant is not None
    await grant.settle(finished(200))  # answered by the gateway itself: no attempt
    after = await admit(q, chat(), "acme")
    assert after is not None
    assert int(after.headers["x-ratelimit-remaining-tokens"]) >= 10000 - after.estimated_tokens - 1


async def test_settling_a_budget_charges_the_actual_cost() -> None:
    q, store, _ = quota()
    grant = await admit(q, chat(max_tokens=1000), "thrifty")
    assert grant is not None and grant.estimated_nusd > 8_000_000
    await grant.settle(finished(200, prompt=100, completion=100))  # $0.0002 + $0.0008
    assert list(store.counters.values()) == [{"tokens": 200, "nusd": 1_000_000}]


async def test_a_store_outage_fails_open_by_default_and_closed_when_asked() -> None:
    q, store, metrics = quota()
    store.down = True
    assert await admit(q, chat(), "acme", key("k1", "acme")) is None
    assert sample(metrics, "gateway_quota_store_failures_total", outcome="served") == 1

    closed, closed_store, closed_metrics = quota(outage="fail_closed")
    closed_store.down = True
    with pytest.raises(StateUnavailable) as refused:
        await admit(closed, chat(), "acme", key("k1", "acme"))
    assert refused.value.status == 503 and "fail_closed" in refused.value.message
    assert sample(closed_metrics, "gateway_quota_store_failures_total", outcome="refused") == 1


async def test_a_settle_the_store_misses_is_counted_not_raised() -> None:
    q, store, metrics = quota()
    grant = await admit(q, chat(max_tokens=100), "acme")
    assert grant is not None
    store.down = True
    await grant.settle(finished(200, prompt=1, completion=1))
    assert sample(metrics, "gateway_quota_store_failures_total", outcome="unsettled") == 1


def test_the_estimate_is_a_quarter_of_the_bytes_plus_the_completion_ceiling() -> None:
    raw = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x" * 400}],
            "max_tokens": 50,
            "n": 2,
        }
    )
    request = parse_request(Endpoint.chat, raw)
    assert estimate_tokens(request, len(raw)) == (-(-len(raw) // 4), 100)
    # A ceiling above the engines' whole window could never bind: the window is estimated.
    assert estimate_tokens(request, len(raw), context_tokens=30) == (-(-len(raw) // 4), 60)
    assert estimate_tokens(request, len(raw), context_tokens=16384)[1] == 100
    embedding = parse_request(Endpoint.embeddings, b'{"model": "m", "input": "abcdefgh"}')
    assert estimate_tokens(embedding, 36) == (9, 0)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (20, "20ms"), (1000, "1s"), (1500, "1.5s"), (8640, "8.64s"), (360_000, "6m0s"),
     (61_250, "1m1.25s"), (3_723_000, "1h2m3s")],
)  # fmt: skip
def test_resets_are_written_as_openai_writes_them(ms: int, text: str) -> None:
    assert go_duration(ms) == text


def test_retry_after_is_whole_seconds_and_never_zero() -> None:
    assert [retry_after(ms) for ms in (0, 1, 999, 1000, 1001, 29_999)] == [
        "1",
        "1",
        "1",
        "1",
        "2",
        "30",
    ]
