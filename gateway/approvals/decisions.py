"""A tenant's approvals as the API sees them: read, list, decide.

Deciding checks, in this order, so that nothing is learned about another tenant's ids:
the approval exists in the caller's tenant (else 404, as for an id that never existed),
the caller's key has the `approver` role (else 403 permission_denied), the body says
`approve` or `deny` (else 400), the approval is still pending (else 409:
approval_expired, or approval_already_decided). Who decided (the key id) and when are
recorded with the decision, in the audit trail too. What `decide` learns goes into the
decision's telemetry record (gateway/telemetry/approval_spans.py), whose trace id is the one
in the audit entry: the span and the entry name the same trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from gateway.approvals.audit import AuditEvent, AuditLog
from gateway.approvals.records import ID_PATTERN, STATUSES, Approval, Decision, Verdict
from gateway.approvals.store import RedisApprovals
from gateway.chat.inbound import json_object
from gateway.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from gateway.telemetry.approval_spans import DecisionRecord
from gateway.tenants.identity import Identity
from gateway.untrusted.client_text import check_label

APPROVER = "approver"
_VERDICTS: dict[str, Verdict] = {"approve": "approved", "deny": "denied"}
_MAX_REASON = 1000


class Approvals:
    def __init__(
        self, store: RedisApprovals, audit: AuditLog, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.audit = audit
        self.clock = clock

    async def get(self, tenant: str, approval_id: str) -> Approval:
        found = None
        if ID_PATTERN.fullmatch(approval_id):
            found = await self.store.get(tenant, approval_id)
        if found is None:
            raise NotFound(
                f"No approval `{approval_id}` (or it is no longer kept).",
                param="approval_id",
                code="approval_not_found",
            )
        return found

    async def recent(self, tenant: str, status: str | None, limit: int) -> list[Approval]:
        if status is not None and status not in STATUSES:
            raise InvalidRequest(f"`status` must be one of: {', '.join(STATUSES)}.", param="status")
        now = self.clock()
        found = await self.store.recent(tenant)
        return [a for a in found if status is None or a.status(now) == status][:limit]

    async def decide(
        self,
        tenant: str,
        approval_id: str,
        identity: Identity | None,
        raw_body: bytes,
        record: DecisionRecord,
    ) -> Approval:
        """`record`: the decision's telemetry, filled in here; its request id and trace id
        go into the audit entry."""
        approval = await self.get(tenant, approval_id)
        record.found(approval.guarded, approval.trace_id, approval.span_id)
        if identity is None or APPROVER not in identity.roles:
            raise PermissionDenied(
                "Deciding an approval needs an API key with the `approver` role."
            )
        verdict, reason = _decision_of(raw_body)
        request_id, trace_id = record.request_id, record.trace_id_hex
        approval = await self.expire_if_due(approval, request_id, trace_id)
        if approval.decision is not None:
            if approval.decision.verdict == "expired":
                raise Conflict(
                    f"Approval `{approval.id}` expired before anyone decided it.",
                    code="approval_expired",
                )
            raise Conflict(
                f"Approval `{approval.id}` was {approval.decision.verdict} already.",
                code="approval_already_decided",
            )
        decision = Decision(verdict, self.clock(), identity.key_id, reason, request_id)
        if not await self.store.decide(approval, decision):  # another reviewer was first
            return await self.decide(tenant, approval_id, identity, raw_body, record)
        decided = replace(approval, decision=decision)
        record.decided(verdict)
        by = identity.key_id
        await self.audit.append(AuditEvent(verdict, decided, request_id, trace_id, by, reason))
        return decided

    async def expire_if_due(
        self, approval: Approval, request_id: str | None, trace_id: str | None
    ) -> Approval:
        """An undecided approval past its time is decided `expired`, once, by whoever
        notices first (a reviewer, or the conversation's next request)."""
        now = self.clock()
        if approval.decision is not None or now < approval.expires_at:
            return approval
        decision = Decision("expired", now, request_id=request_id)
        if await self.store.decide(approval, decision):
            expired = replace(approval, decision=decision)
            await self.audit.append(AuditEvent("expired", expired, request_id, trace_id))
            return expired
        return await self.get(approval.tenant, approval.id)  # decided meanwhile: that stands


def _decision_of(raw: bytes) -> tuple[Verdict, str | None]:
    body = json_object(raw)
    named = body.get("decision")
    verdict = _VERDICTS.get(named) if isinstance(named, str) else None
    if verdict is None:
        raise InvalidRequest("`decision` must be `approve` or `deny`.", param="decision")
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > _MAX_REASON):
        raise InvalidRequest(
            f"`reason` must be a string of at most {_MAX_REASON} characters.", param="reason"
        )
    if reason:  # kept in the audit trail and on spans: one line, as the reviewer sent it
        check_label(reason, param="reason")
    return verdict, reason or None
