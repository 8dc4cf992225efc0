"""Every decision on a held call is a span, `approval.decide`: in the caller's trace when
it sent a `traceparent` (else in one of its own), recorded whatever the sampling, with the
approval, the verdict, the tools, the deciding key's id (never the key), the tenant and
the status; linked to the span where the call was held; its trace id the one in the
decision's audit entry. Refused decisions (403, 409, 404) are spans too."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry import names
from tests.unit.approvals.conftest import Held, OpenHeld, user
from tests.unit.tenant_gateway import sha256

ASK = [user("Cancel reservation ZFA04Y.")]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def decision_spans(gw: Held) -> list[ReadableSpan]:
    return [s for s in gw.spans.get_finished_spans() if s.name == "approval.decide"]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def key_id(key: str) -> str:
    return sha256(key)[:12]


def stored(redis_url: str, gw: Held, approval: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The approval as held in Redis, and the tenant's audit entries."""
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        held = orjson.loads(store.hget(f"agw:approval:{{{gw.acme}/{approval}}}", "held") or "{}")
        entries: Any = store.xrange(f"agw:approvals:{{{gw.acme}}}:audit")
    finally:
        store.close()
    return held, [fields for _, fields in entries]


def assert_no_key_text(gw: Held, spans: list[ReadableSpan]) -> None:
    text = "".join(span.to_json() for span in spans)
    for key in (gw.keys.agent, gw.keys.reviewer, gw.keys.rival):
        assert key not in text
    assert "sk-agw-" not in text


def test_an_approval_is_a_span_in_the_callers_trace_linked_to_the_hold(
    held_gateway: OpenHeld, redis_url: str
) -> None:
    gw = held_gateway()
    approval = gw.chat(ASK).headers["x-gateway-approval-pending"]
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert gw.decide(approval, "approve", traceparent=traceparent).status_code == 200

    [span] = decision_spans(gw)
    assert span.kind is SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == CALLER_TRACE
    assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
    assert span.status.status_code is StatusCode.UNSET
    attrs = attributes(span)
    assert attrs[names.APPROVAL_ID] == approval
    assert attrs[names.APPROVAL_EVENT] == "approved"
    assert attrs[names.APPROVAL_TOOLS] == ("cancel_reservation",)
    assert attrs[names.APPROVAL_BY] == key_id(gw.keys.reviewer)
    assert attrs[names.TENANT] == gw.acme
    assert attrs[names.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attrs[names.HTTP_ROUTE] == "/v1/approvals/{approval_id}"
    assert names.ERROR_TYPE not in attrs

    [hold] = [
        s
        for s in gw.spans.get_finished_spans()
        if s.name == "approval" and attributes(s)[names.APPROVAL_EVENT] == "held"
    ]
    [link] = span.links
    assert (link.context.trace_id, link.context.span_id) == (
        hold.context.trace_id,
        hold.context.span_id,
    )
    held, audit = stored(redis_url, gw, approval)
    assert held["span_id"] == f"{hold.context.span_id:016x}"
    [decided] = [e for e in audit if e["event"] == "approved"]
    assert decided["trace_id"] == CALLER_TRACE
    assert_no_key_text(gw, [span])


@pytest.mark.parametrize("traceparent", [None, f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"])
def test_a_denial_is_recorded_whatever_the_sampling(
    held_gateway: OpenHeld, redis_url: str, traceparent: str | None
) -> None:
    gw = held_gateway(sample_ratio=0)
    first = gw.chat(ASK)
    approval = first.headers["x-gateway-approval-pending"]
    assert gw.spans.get_finished_spans() == ()  # the held request was not sampled
    assert gw.decide(approval, "deny", traceparent=traceparent).status_code == 200

    [span] = decision_spans(gw)
    trace_id = f"{span.context.trace_id:032x}"
    if traceparent is None:  # a trace of its own
        assert span.parent is None and trace_id != first.headers["x-gateway-trace-id"]
    else:  # the caller's trace, though its flag said not sampled
        assert trace_id == CALLER_TRACE and span.parent is not None
    assert span.context.trace_flags.sampled
    attrs = attributes(span)
    assert attrs[names.APPROVAL_EVENT] == "denied"
    assert attrs[names.APPROVAL_TOOLS] == ("cancel_reservation",)
    # The link names where the call was held, though that trace was not recorded.
    held, audit = stored(redis_url, gw, approval)
    [link] = span.links
    assert f"{link.context.trace_id:032x}" == first.headers["x-gateway-trace-id"]
    assert f"{link.context.span_id:016x}" == held["span_id"]
    [denied] = [e for e in audit if e["event"] == "denied"]
    assert denied["trace_id"] == trace_id and denied["held_trace_id"] == held["trace_id"]
    assert_no_key_text(gw, [span])


def test_refused_decisions_are_spans_with_their_status_and_error(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    approval = gw.chat(ASK).headers["x-gateway-approval-pending"]
    assert gw.decide(approval, "approve", key=gw.keys.agent).status_code == 403
    assert gw.decide(approval, "deny").status_code == 200
    assert gw.decide(approval, "approve").status_code == 409
    assert gw.decide(approval, "approve", key=gw.keys.rival).status_code == 404

    spans = decision_spans(gw)
    by_status = {attributes(s)[names.HTTP_RESPONSE_STATUS_CODE]: s for s in spans}
    assert sorted(by_status) == [200, 403, 404, 409]
    for status, who, error in (
        (403, gw.keys.agent, "permission_denied"),
        (409, gw.keys.reviewer, "approval_already_decided"),
    ):
        span = by_status[status]
        attrs = attributes(span)
        assert attrs[names.ERROR_TYPE] == error, status
        assert attrs[names.APPROVAL_BY] == key_id(who), status
        assert attrs[names.APPROVAL_TOOLS] == ("cancel_reservation",), status
        assert names.APPROVAL_EVENT not in attrs, status  # nothing was decided
        assert len(span.links) == 1, status  # the approval was found: its hold is linked
        assert span.status.status_code is StatusCode.UNSET  # the caller's error, not ours
    elsewhere = attributes(by_status[404])  # nothing about the approval is learned
    assert elsewhere[names.ERROR_TYPE] == "approval_not_found"
    assert elsewhere[names.TENANT] == gw.rival
    assert names.APPROVAL_TOOLS not in elsewhere and not by_status[404].links
    assert_no_key_text(gw, spans)
