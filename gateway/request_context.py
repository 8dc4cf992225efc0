"""What the HTTP layer knows about a request besides its body, handed to the pipeline,
and what the pipeline hands back to the edge for after the answer (its quota charge)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.sessions.ids import SessionRef
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import OPEN_ACCESS, Identity, TenantAccess


class QuotaCharge(Protocol):
    """What an admitted request was charged against its limits (gateway/quota/)."""

    headers: dict[str, str]  # the x-ratelimit-* headers its answer carries

    async def settle(self, record: RequestRecord) -> None:
        """Called once, after the response's last byte: the charge becomes the actual."""
        ...


class Charges:
    """The edge's side of admission: the pipeline puts an admitted request's charge here,
    and the edge (gateway/edge/middleware.py), which made it, sends the charge's headers
    with whatever is answered, errors included, and settles it after the last byte.

    Its own object, not a field of the telemetry record: telemetry only reads what a
    request did, and this decides what the edge does."""

    __slots__ = ("charge",)

    def __init__(self) -> None:
        self.charge: QuotaCharge | None = None


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
    # Where admission leaves its charge for the edge; a slot nobody reads by default.
    charges: Charges = field(default_factory=Charges)
