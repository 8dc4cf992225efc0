"""A reviewer's decision on a held tool call (`POST /v1/approvals/{id}`), as one span.

The decision is not a request for the engine, so it has no `RequestRecord`: its facts are
written here as `Approvals.decide` learns them (the approval's tools and where it was held,
then the verdict), and `Telemetry.decision` turns them into one SERVER span named
`approval.decide` once the answer is ready, refusals included (404, 403, 409, 400: their
status and `error.type`, as the error's code).

Sampling: every decision is recorded while tracing is on, whatever the policy's ratio or
the caller's sampled flag. Decisions are rare (a person makes each one) and are the
evidence the audit trail points at: the span's trace id is the one in the decision's
audit entry, so a sampler must not leave that entry pointing at nothing. A caller's
`traceparent` is still continued (same trace, its span the parent); without one the
decision starts a trace of its own.

The span links to the held request's `approval` span (event `held`), whose ids the
approval keeps, so a trace viewer goes from the decision to the call it decided. It
carries the deciding key's id (`gateway.approval.by`), never the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from gateway.errors import GatewayError
from gateway.telemetry import names
from gateway.telemetry.record import TraceContext, new_span_id
from gateway.telemetry.redaction import redact

SPAN_NAME = "approval.decide"
ROUTE = "/v1/approvals/{approval_id}"
_OK = Status(StatusCode.UNSET)


@dataclass(slots=True)
class DecisionRecord:
    """Facts about one decision request, filled in as they are learned."""

    trace: TraceContext
    tenant: str
    approval_id: str
    by: str | None  # the caller's key id; None when authentication is off
    request_id: str | None
    span_id: int = field(default_factory=new_span_id)
    start_ns: int = field(default_factory=time.perf_counter_ns)
    wall_start_ns: int = field(default_factory=time.time_ns)
    end_ns: int = 0
    # Known once the approval was found in the caller's tenant (not for a 404).
    tools: tuple[str, ...] = ()
    held_trace_id: str | None = None
    held_span_id: str | None = None
    verdict: str | None = None  # approved or denied; None when the decision was refused
    status: int = 0
    error_type: str | None = None

    @classmethod
    def start(
        cls,
        traceparent: str | None,
        *,
        tenant: str,
        approval_id: str,
        by: str | None,
        request_id: str | None,
    ) -> DecisionRecord:
        """Continue the caller's trace, or start one; sampled either way (see above)."""
        trace = TraceContext.start(traceparent, 1.0)
        if not trace.sampled:  # the caller's flag said no: a decision is recorded anyway
            trace = replace(trace, sampled=True, flags="01")
        return cls(trace, tenant, approval_id, by, request_id)

    @property
    def trace_id_hex(self) -> str:
        return self.trace.trace_id_hex

    def found(self, tools: tuple[str, ...], trace_id: str, span_id: str | None) -> None:
        """The approval exists in the caller's tenant: what it holds and where it was held."""
        self.tools, self.held_trace_id, self.held_span_id = tools, trace_id, span_id

    def decided(self, verdict: str) -> None:
        self.verdict = verdict

    def failed(self, exc: BaseException) -> None:
        """The decision was refused (a gateway error: its status and code) or broke."""
        if isinstance(exc, GatewayError):
            self.status, self.error_type = exc.status, exc.label
        else:
            self.status, self.error_type = 500, type(exc).__name__

    def end(self) -> None:
        self.end_ns = time.perf_counter_ns()
        self.status = self.status or 200

    # -- read by the span writer (gateway/telemetry/spans.py) ---------------------------

    @property
    def wall_end_ns(self) -> int:
        return self.wall_start_ns + ((self.end_ns or self.start_ns) - self.start_ns)

    def parent(self) -> SpanContext | None:
        """The caller's span, when it sent a traceparent."""
        trace = self.trace
        if trace.parent_span_id is None:
            return None
        return SpanContext(trace.trace_id, trace.parent_span_id, is_remote=True)

    def links(self) -> list[Link]:
        """To the held request's `approval` span, when the approval was found."""
        if self.held_trace_id is None or self.held_span_id is None:
            return []
        held = SpanContext(int(self.held_trace_id, 16), int(self.held_span_id, 16), is_remote=True)
        return [Link(held, {names.APPROVAL_EVENT: "held"})]

    def span_status(self) -> Status:
        # As for the gateway's other server spans: a 4xx is the caller's, not an error here.
        return Status(StatusCode.ERROR, self.error_type) if self.status >= 500 else _OK

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            names.HTTP_REQUEST_METHOD: "POST",
            names.HTTP_ROUTE: ROUTE,
            names.HTTP_RESPONSE_STATUS_CODE: self.status,
            names.TENANT: self.tenant,
            names.APPROVAL_ID: redact(self.approval_id),  # from the URL: the caller's text
        }
        optional: dict[str, Any] = {
            names.APPROVAL_EVENT: self.verdict,
            names.APPROVAL_TOOLS: self.tools or None,
            names.APPROVAL_BY: self.by,
            names.REQUEST_ID: self.request_id and redact(self.request_id),
            names.ERROR_TYPE: self.error_type,
        }
        attributes.update((k, v) for k, v in optional.items() if v is not None)
        return attributes
