"""Deciding a held call: only an approver of the same tenant, once, before it expires;
another tenant's id is 404 like one that never existed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from gateway.approvals.audit import AuditLog
from gateway.approvals.decisions import Approvals
from gateway.approvals.store import RedisApprovals
from gateway.errors import Conflict, NotFound, PermissionDenied
from gateway.telemetry.approval_spans import DecisionRecord
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.identity import Identity
from tests.unit.approvals.conftest import OpenHeld, pending_approval, user

ASK = [user("Cancel reservation ZFA04Y.")]


def test_only_an_approver_of_the_tenant_decides(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    approval = gw.chat(ASK).headers["x-gateway-approval-pending"]

    by_agent = gw.decide(approval, "approve", key=gw.keys.agent)
    assert by_agent.status_code == 403
    assert by_agent.json()["error"]["code"] == "permission_denied"

    by_rival = gw.decide(approval, "approve", key=gw.keys.rival)  # an approver, elsewhere
    assert by_rival.status_code == 404
    assert by_rival.json()["error"]["code"] == "approval_not_found"
    assert gw.get(f"/v1/approvals/{approval}", key=gw.keys.rival).status_code == 404
    assert gw.get("/v1/approvals", key=gw.keys.rival).json()["data"] == []
    unknown = gw.decide("apr_" + "0" * 24, "approve")
    assert unknown.status_code == 404
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "pending"


def test_a_decision_is_final(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    approval = gw.chat(ASK).headers["x-gateway-approval-pending"]
    assert gw.decide(approval, "deny").status_code == 200
    again = gw.decide(approval, "approve")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "approval_already_decided"
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "denied"


@pytest.mark.parametrize(
    "body",
    [{}, {"decision": "maybe"}, {"decision": ["approve"]}, {"decision": "approve", "reason": 7}],
)
def test_a_malformed_decision_is_400(held_gateway: OpenHeld, body: dict[str, object]) -> None:
    gw = held_gateway()
    approval = gw.chat(ASK).headers["x-gateway-approval-pending"]
    answer = gw.client.post(
        f"/v1/approvals/{approval}", json=body, headers=gw.keys.bearer(gw.keys.reviewer)
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] in ("decision", "reason")


@pytest.mark.parametrize("reason", ["ok\r\nFAKE audit line", "a\tb", "a\u2028b", "\x1b[31m"])
def test_a_decision_reason_with_a_control_character_is_400_and_decides_nothing(
    held_gateway: OpenHeld, reason: str
) -> None:
    gw = held_gateway()
    approval = gw.chat([user("Cancel reservation ZFA04Y.")]).headers["x-gateway-approval-pending"]
    refused = gw.decide(approval, "approve", reason=reason)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "reason"
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "pending"
    decided = gw.decide(approval, "approve", reason="Checked with the customer — ok.")
    assert decided.status_code == 200
    assert decided.json()["reason"] == "Checked with the customer — ok."


def test_listing_checks_its_parameters(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    assert gw.get("/v1/approvals", status="lost").status_code == 400
    assert gw.get("/v1/approvals", limit="0").status_code == 400
    assert gw.get("/v1/approvals", limit="5").status_code == 200


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def book(redis: aioredis.Redis, tenant: str) -> tuple[Approvals, Clock, str]:
    clock = Clock()
    approvals = Approvals(
        RedisApprovals(redis, keep_s=600),
        AuditLog(redis, GatewayMetrics(), max_entries=100),
        clock=clock,
    )
    return approvals, clock, tenant


APPROVER = Identity("k-approver", roles=frozenset({"user", "approver"}))


def record(tenant: str, approval: str) -> DecisionRecord:
    return DecisionRecord.start(None, tenant=tenant, approval_id=approval, by=None, request_id="d")


async def test_an_expired_approval_cannot_be_decided(book: tuple[Approvals, Clock, str]) -> None:
    approvals, clock, tenant = book
    approval = pending_approval(tenant, session=None, at=clock.now)
    await approvals.store.add(approval)
    clock.now += 61
    body = b'{"decision": "approve"}'
    with pytest.raises(Conflict) as refused:
        await approvals.decide(tenant, approval.id, APPROVER, body, record(tenant, approval.id))
    assert refused.value.code == "approval_expired"
    stored = await approvals.get(tenant, approval.id)
    assert stored.status(clock.now) == "expired"
    assert [e["event"] for e in stored.history()] == ["held", "expired"]


async def test_decisions_check_tenant_then_role(book: tuple[Approvals, Clock, str]) -> None:
    approvals, clock, tenant = book
    approval = pending_approval(tenant, session=None, at=clock.now)
    await approvals.store.add(approval)
    body = b'{"decision": "approve"}'
    with pytest.raises(NotFound):
        await approvals.decide("elsewhere", approval.id, APPROVER, body, record("elsewhere", ""))
    with pytest.raises(PermissionDenied):
        await approvals.decide(tenant, approval.id, None, body, record(tenant, approval.id))
    with pytest.raises(NotFound):  # not even an id: the same answer
        await approvals.get(tenant, "../../etc")
    decided = await approvals.decide(
        tenant, approval.id, APPROVER, body, record(tenant, approval.id)
    )
    assert decided.decision is not None and decided.decision.by == "k-approver"
    assert decided.decision.at == clock.now
