"""What the HTTP layer knows about a request besides its body, handed to the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.sessions.ids import SessionRef
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import OPEN_ACCESS, Identity, TenantAccess


@dataclass(frozen=True)
class RequestContext:
    request_id: str
    session_id: str | None = None  # the X-Session-Id header
    context_mode: str | None = None  # the X-Context-Mode header
    session: SessionRef | None = None  # set by the caller (the Responses API), wins
    task: str | None = None  # the X-Task header: a label tier rules can match
    # What telemetry learns about the request; the HTTP layer's, or one nobody reads.
    record: RequestRecord = field(default_factory=RequestRecord.detached)
    # The caller's tenant (gateway/edge/auth.py): its models, and the namespace of its state.
    access: TenantAccess = OPEN_ACCESS
    # The caller's key (None when authentication is off): its id and own rate limits.
    identity: Identity | None = None
