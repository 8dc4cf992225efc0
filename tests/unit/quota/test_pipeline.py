"""The request path with limits, on the quota store's in-memory twin: a refused request
never reaches an engine, a downgraded one reaches the downgrade model's, and an admitted
one carries its charge for the edge to settle."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import BudgetExceeded, RateLimited
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, Policy, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.service import Grant, Quota
from gateway.request_context import RequestContext
from gateway.routing.router import RoundRobinRouter
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import Identity, TenantAccess
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.quota.models import TWO_MODELS

POLICY = (
    TWO_MODELS
    + """\
sessions: {enabled: false}
tenants:
  acme:
    rate_limits: {requests_per_minute: 2}
  capped:
    budget: {tokens_per_day: 1000, on_exceeded: downgrade, downgrade_to: tiny}
  strict:
    budget: {tokens_per_day: 1000}
"""
)


def answer(call: Call) -> Scripted:
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    return Scripted(
        body=orjson.dumps({"id": "c", "object": "chat.completion", "choices": [], "usage": usage})
    )


def make(policy: Policy) -> tuple[Pipeline, FakeUpstream]:
    upstream = FakeUpstream(answer)
    pipeline = Pipeline(
        policy,
        Fleet(policy),
        RoundRobinRouter(),
        upstream,
        fingerprints=MemoryFingerprints(),
        metrics=GatewayMetrics(),
        quota=Quota(policy, MemoryQuotaStore(), GatewayMetrics()),
    )
    return pipeline, upstream


def context(tenant: str, record: RequestRecord | None = None) -> RequestContext:
    return RequestContext(
        "rid",
        record=record or RequestRecord.detached(),
        access=TenantAccess(tenant),
        identity=Identity("k1", tenant),
    )


def body(max_tokens: int = 10) -> bytes:
    return orjson.dumps(
        {
            "model": "large",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
        }
    )


async def test_a_rate_limited_request_never_reaches_an_engine() -> None:
    pipeline, upstream = make(parse_policy(POLICY))
    for _ in range(2):
        await pipeline.handle(Endpoint.chat, body(), context("acme"))
    with pytest.raises(RateLimited):
        await pipeline.handle(Endpoint.chat, body(), context("acme"))
    assert len(upstream.calls) == 2


async def test_an_admitted_request_leaves_its_charge_for_the_edge() -> None:
    pipeline, _ = make(parse_policy(POLICY))
    asked = context("acme")
    await pipeline.handle(Endpoint.chat, body(), asked)
    charge = asked.charges.charge
    assert isinstance(charge, Grant)
    assert charge.headers["x-ratelimit-remaining-requests"] == "1"


async def test_over_budget_the_request_goes_to_the_downgrade_model_or_is_refused() -> None:
    pipeline, upstream = make(parse_policy(POLICY))
    await pipeline.handle(Endpoint.chat, body(900), context("capped"))
    record = RequestRecord.detached()
    await pipeline.handle(Endpoint.chat, body(900), context("capped", record))
    assert [c.url.split("/")[2] for c in upstream.calls] == ["b.test:1", "s.test:1"]
    assert orjson.loads(upstream.calls[1].body)["model"] == "served-small"
    assert record.model == "tiny"  # usage and metrics name the model that served

    await pipeline.handle(Endpoint.chat, body(900), context("strict"))
    with pytest.raises(BudgetExceeded):
        await pipeline.handle(Endpoint.chat, body(900), context("strict"))
    assert len(upstream.calls) == 3
