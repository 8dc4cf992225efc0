"""An approval: a tool call the engine made that the gateway held, what a reviewer decided
about it, and when the agent was told.

Three parts, each written once: `held` when the call is held, `decision` when a reviewer
(or the clock, on expiry) decides, `closing` when the agent is answered with the outcome.
Each is a write-once field of the approval's Redis hash (HSETNX), so a second decision
and a second release lose the race instead of overwriting (gateway/approvals/store.py).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson

from gateway.chat.messages import Message

ID_PATTERN = re.compile(r"apr_[0-9a-f]{24}")

Status = Literal["pending", "approved", "denied", "expired", "released"]
STATUSES: tuple[Status, ...] = ("pending", "approved", "denied", "expired", "released")
Verdict = Literal["approved", "denied", "expired"]
ApprovalOutcome = Literal["released", "denial_returned", "expiry_returned"]


def new_approval_id() -> str:
    return "apr_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    at: float
    by: str | None = None  # the approver's key id; None when the approval expired
    reason: str | None = None
    request_id: str | None = None  # the decision's own request


@dataclass(frozen=True)
class Closing:
    """The agent was answered with the outcome: the released call, or why it was not run."""

    outcome: ApprovalOutcome
    at: float
    request_id: str


@dataclass(frozen=True)
class Approval:
    id: str
    tenant: str
    session: str | None  # None: found through the hold message in the conversation
    request_id: str  # the request whose answer was held
    trace_id: str
    model: str
    tool_calls: list[dict[str, Any]]  # every call of the held turn, as the engine made them
    guarded: tuple[str, ...]  # the names among them that need approval
    content: str | None  # what the engine said beside the calls
    created_at: float
    expires_at: float
    decision: Decision | None = None
    closing: Closing | None = None
    # The held request's `approval` span (hex), which a decision's span links to; None in
    # approvals held before it was kept.
    span_id: str | None = None

    def status(self, now: float) -> Status:
        if self.closing is not None and self.closing.outcome == "released":
            return "released"
        if self.decision is not None:
            return self.decision.verdict
        return "expired" if now >= self.expires_at else "pending"

    def message(self) -> Message:
        """The assistant message the engine produced: what a release gives the agent."""
        return {"role": "assistant", "content": self.content, "tool_calls": self.tool_calls}

    def held_json(self) -> bytes:
        held = asdict(self)
        del held["decision"], held["closing"]
        return orjson.dumps(held)

    @classmethod
    def from_fields(cls, fields: dict[str, bytes]) -> Approval:
        held = orjson.loads(fields["held"])
        held["guarded"] = tuple(held["guarded"])
        decision = fields.get("decision")
        closing = fields.get("closing")
        return cls(
            **held,
            decision=Decision(**orjson.loads(decision)) if decision else None,
            closing=Closing(**orjson.loads(closing)) if closing else None,
        )

    def history(self) -> list[dict[str, Any]]:
        """What happened to it, in order (the tenant's audit stream has the same events)."""
        events: list[dict[str, Any]] = [
            {"event": "held", "at": self.created_at, "request_id": self.request_id}
        ]
        if self.decision is not None:
            decision = {k: v for k, v in asdict(self.decision).items() if v is not None}
            events.append({"event": decision.pop("verdict"), **decision})
        if self.closing is not None:
            closing = asdict(self.closing)
            events.append({"event": closing.pop("outcome"), **closing})
        return events

    def public(self, now: float) -> dict[str, Any]:
        """The approval as the API shows it to its tenant."""
        decision = self.decision
        return {
            "id": self.id,
            "object": "approval",
            "status": self.status(now),
            "model": self.model,
            "session_id": self.session,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "tools": list(self.guarded),
            "tool_calls": self.tool_calls,
            "content": self.content,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "decided_by": decision.by if decision else None,
            "decided_at": decision.at if decision else None,
            "reason": decision.reason if decision else None,
            "history": self.history(),
        }
