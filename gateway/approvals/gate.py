"""The request path's side of approvals: which requests are guarded, holding a guarded
call, and answering from an approval on the conversation's next request.

A chat request is guarded when its `tools` declare a tool the policy holds for its tenant
and model; nothing else is touched (approvals off: the pipeline holds no gate at all).
For a guarded request the pipeline asks `Guard.resume` first: when the conversation has
an approval whose outcome the agent has not heard, the gateway answers from it without
the engine (the held call once approved, or why it was not run, or that it still waits).
Otherwise the engine's answer is read whole and given to `Guard.hold`, which holds it
when it calls a guarded tool.

The conversation's approval is found through its session (`X-Session-Id`, or what
`sessions.key_from` names; the Responses API's own), else through the approval id in the
last assistant message the client resent: a client that resends its history needs no
session at all. A client that sends only new messages needs a session (delta mode has one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway import headers
from gateway.approvals.audit import AuditEvent
from gateway.approvals.decisions import Approvals
from gateway.approvals.gateway_answers import gateway_answer
from gateway.approvals.messages import (
    approval_named_in,
    denied_text,
    expired_text,
    hold_text,
    pending_text,
)
from gateway.approvals.records import Approval, ApprovalOutcome, Closing, Status, new_approval_id
from gateway.chat.inbound import InboundRequest
from gateway.chat.messages import Message
from gateway.delivery.whole import Answer
from gateway.errors import InvalidRequest
from gateway.policy.approvals import ApprovalsSpec
from gateway.sessions.ids import SessionRef
from gateway.telemetry import names
from gateway.telemetry.record import RequestRecord, Stage, new_span_id

_NOTHING: frozenset[str] = frozenset()

# The header that reports each event, its value the approval id.
_HEADERS = {
    "held": headers.APPROVAL_PENDING,
    "pending": headers.APPROVAL_PENDING,
    "released": headers.APPROVAL_RELEASED,
    "denial_returned": headers.APPROVAL_DENIED,
    "expiry_returned": headers.APPROVAL_EXPIRED,
}


# What the agent is told once an approval is decided.
_OUTCOMES: dict[Status, ApprovalOutcome] = {
    "approved": "released",
    "denied": "denial_returned",
    "expired": "expiry_returned",
}


@dataclass(frozen=True)
class GateAnswer:
    """An answer the gateway gives in place of the engine's, and the headers that say why."""

    answer: Answer
    headers: dict[str, str]
    approval: str
    event: str


class ApprovalGate:
    def __init__(self, spec: ApprovalsSpec, approvals: Approvals) -> None:
        self._spec = spec
        self._approvals = approvals
        self._everywhere = frozenset(spec.tools)
        self._by_model = {alias: frozenset(tools) for alias, tools in spec.models.items()}
        self._by_tenant = {name: frozenset(tools) for name, tools in spec.tenants.items()}
        # (tenant, model) -> tools held; both come from the policy, so this stays small.
        self._held: dict[tuple[str, str], frozenset[str]] = {}

    def tools_held(self, tenant: str, model: str) -> frozenset[str]:
        found = self._held.get((tenant, model))
        if found is None:
            found = (
                self._everywhere
                | self._by_model.get(model, _NOTHING)
                | self._by_tenant.get(tenant, _NOTHING)
            )
            self._held[(tenant, model)] = found
        return found

    def guard(
        self,
        request: InboundRequest,
        session: SessionRef | None,
        *,
        tenant: str,
        request_id: str,
        record: RequestRecord,
        analyzed: frozenset[str] = _NOTHING,
    ) -> Guard | None:
        """The request's guard when it declares a tool whose calls are held, or whose
        calls an analyzer may hold (`analyzed`: gateway/toolcalls/argument_rules.py);
        else None."""
        tools = request.body.get("tools")
        if not tools:
            return None
        held = self.tools_held(tenant, request.model)
        declared = {
            tool["function"]["name"] for tool in tools
        }  # checked by gateway/chat/inbound.py
        if held.isdisjoint(declared) and analyzed.isdisjoint(declared):
            return None
        if request.body.get("n") not in (None, 1):
            # Only the first choice is looked at: another could call a held tool unseen.
            raise InvalidRequest(
                "`n` must be 1 when the request declares a tool whose calls need approval.",
                param="n",
                code="approval_needs_one_choice",
            )
        return Guard(self, request, held, session, tenant, request_id, record)

    @property
    def spec(self) -> ApprovalsSpec:
        return self._spec

    @property
    def approvals(self) -> Approvals:
        return self._approvals


class Guard:
    """One guarded request."""

    def __init__(
        self,
        gate: ApprovalGate,
        request: InboundRequest,
        held: frozenset[str],
        session: SessionRef | None,
        tenant: str,
        request_id: str,
        record: RequestRecord,
    ) -> None:
        self._gate = gate
        self._approvals = gate.approvals
        self._request = request
        self._held = held
        self._session = session
        self._tenant = tenant
        self._request_id = request_id
        self._record = record

    async def resume(self, include_usage: bool) -> GateAnswer | None:
        """Before the engine: the answer from the conversation's approval whose outcome the
        agent has not heard yet; None when there is none (the engine answers)."""
        start = time.perf_counter_ns()
        approval = await self._open_approval()
        if approval is None:
            return None
        trace_id = self._record.trace.trace_id_hex
        approval = await self._approvals.expire_if_due(approval, self._request_id, trace_id)
        status = approval.status(self._approvals.clock())
        if status == "pending":
            waiting: Message = {"role": "assistant", "content": pending_text(approval)}
            return self._answer(approval, "pending", waiting, start, include_usage)
        outcome = _OUTCOMES[status]
        closing = Closing(outcome, self._approvals.clock(), self._request_id)
        if not await self._approvals.store.close(approval, closing):
            return None  # another request of the conversation told the agent: not twice
        audit = AuditEvent(outcome, approval, self._request_id, trace_id)
        await self._approvals.audit.append(audit)
        message: Message
        if outcome == "released":
            message = approval.message()
        else:
            text = denied_text(approval) if outcome == "denial_returned" else expired_text(approval)
            message = {"role": "assistant", "content": text}
        return self._answer(approval, outcome, message, start, include_usage)

    async def hold(
        self, answer: Answer, include_usage: bool, also: tuple[str, ...] = ()
    ) -> GateAnswer | None:
        """After the engine: hold its answer when it calls a held tool, or one an analyzer
        held (`also`), the whole turn, any other calls with it; None lets it through."""
        reply = answer.reply
        calls: list[dict[str, Any]] = (reply.get("tool_calls") or []) if reply else []
        names_called = [call["function"]["name"] for call in calls]
        guarded = tuple(dict.fromkeys(n for n in names_called if n in self._held or n in also))
        if not guarded:
            return None
        assert reply is not None
        start = time.perf_counter_ns()
        now = self._approvals.clock()
        record = self._record
        span_id = new_span_id()  # the hold's `approval` span: a decision's span links to it
        approval = Approval(
            id=new_approval_id(),
            tenant=self._tenant,
            session=self._session.id if self._session is not None else None,
            request_id=self._request_id,
            trace_id=record.trace.trace_id_hex,
            model=self._request.model,
            tool_calls=calls,
            guarded=guarded,
            content=reply.get("content"),
            created_at=now,
            expires_at=now + self._gate.spec.ttl_s,
            span_id=f"{span_id:016x}",
        )
        await self._approvals.store.add(approval)
        event = AuditEvent("held", approval, self._request_id, record.trace.trace_id_hex)
        await self._approvals.audit.append(event)
        message: Message = {
            "role": "assistant",
            "content": hold_text(self._gate.spec.message, approval),
        }
        return self._answer(
            approval,
            "held",
            message,
            start,
            include_usage,
            usage=answer.usage,  # the engine's tokens were spent all the same
            model=record.result.response_model,
            completion_id=record.result.response_id,
            span_id=span_id,
        )

    async def _open_approval(self) -> Approval | None:
        store = self._approvals.store
        if self._session is not None:
            approval_id = await store.open_for(self._session)
        else:
            approval_id = approval_named_in(self._request.body.get("messages"))
        if approval_id is None:
            return None
        approval = await store.get(self._tenant, approval_id)
        if approval is None or approval.closing is not None:
            return None
        return approval

    def _answer(
        self,
        approval: Approval,
        event: str,
        message: Message,
        start_ns: int,
        include_usage: bool,
        *,
        usage: dict[str, Any] | None = None,
        model: str | None = None,
        completion_id: str | None = None,
        span_id: int | None = None,
    ) -> GateAnswer:
        record = self._record
        attributes = {
            names.APPROVAL_ID: approval.id,
            names.APPROVAL_EVENT: event,
            names.APPROVAL_TOOLS: approval.guarded,
        }
        span_id = span_id or new_span_id()
        record.stages.append(
            Stage("approval", start_ns, time.perf_counter_ns(), attributes, span_id)
        )
        answer = gateway_answer(
            message,
            model=model or self._request.model,
            stream=self._request.stream,
            usage=usage,
            include_usage=include_usage,
            completion_id=completion_id,
        )
        record.result.reply = message
        return GateAnswer(answer, {_HEADERS[event]: approval.id}, approval.id, event)
