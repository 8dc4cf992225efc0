"""Spans, checked with the SDK's in-memory exporter: one trace per request, a root span
with the GenAI attributes and the gateway's own, a child per stage and per engine
attempt, the client's traceparent continued and passed on to the engine."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from tests.fakes import Call, Scripted
from tests.unit.telemetry.conftest import OpenTraced, completion

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _chat(alias: str, **extra: object) -> dict[str, object]:
    return {"model": alias, "messages": [{"role": "user", "content": "secret plan"}], **extra}


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def test_a_request_is_one_trace_with_genai_attributes_and_a_span_per_stage(
    traced: OpenTraced,
) -> None:
    gw = traced()
    response = gw.client.post(
        "/v1/chat/completions",
        json=_chat(gw.alias, max_tokens=32, temperature=0.5),
        headers={"X-Session-Id": "t1", "Authorization": "Bearer sk-very-secret"},
    )
    assert response.status_code == 200
    spans = gw.spans.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    by_name = _by_name(spans)
    root = by_name[f"chat {gw.alias}"][0]
    assert root.kind is SpanKind.SERVER
    assert root.parent is None
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == gw.alias
    assert attrs["gen_ai.response.model"] == "served-large"
    assert attrs["gen_ai.usage.input_tokens"] == 100
    assert attrs["gen_ai.usage.output_tokens"] == 20
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 60
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.request.max_tokens"] == 32
    assert attrs["gen_ai.conversation.id"] == "t1"
    assert attrs["gateway.tenant"] == "default"
    assert attrs["gateway.tier"] == "large"
    assert attrs["gateway.replica"] == response.headers["x-gateway-replica"]
    assert attrs["gateway.route.reason"]
    assert attrs["gateway.retries"] == 0
    assert attrs["http.response.status_code"] == 200
    assert f"{root.context.trace_id:032x}" == response.headers["x-gateway-trace-id"]
    for stage in (
        "hydrate",
        "canonicalize",
        "choose_tier",
        "choose_replica",
        "upstream",
        "checkpoint",
    ):
        (span,) = by_name[stage]
        assert span.parent is not None and span.parent.span_id == root.context.span_id, stage
        assert root.start_time is not None and span.start_time is not None
        assert root.start_time <= span.start_time, stage
    upstream = by_name["upstream"][0]
    assert upstream.kind is SpanKind.CLIENT
    assert dict(upstream.attributes or {})["http.response.status_code"] == 200
    # Nothing of the prompt, the answer or the credentials is recorded by default.
    text = repr([dict(s.attributes or {}) for s in spans])
    assert "secret plan" not in text and "sk-very-secret" not in text and "fine" not in text


def test_the_clients_traceparent_is_continued_and_passed_to_the_engine(
    traced: OpenTraced,
) -> None:
    gw = traced(ratio=0.0)  # the client's sampled flag decides, not the ratio
    response = gw.client.post(
        "/v1/chat/completions",
        json=_chat(gw.alias),
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    assert response.headers["x-gateway-trace-id"] == CLIENT_TRACE
    spans = gw.spans.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {CLIENT_TRACE}
    root = _by_name(spans)[f"chat {gw.alias}"][0]
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CLIENT_SPAN
    upstream = _by_name(spans)["upstream"][0]
    sent = gw.fake.calls[0].headers["traceparent"]
    assert sent == f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01"


def test_an_unsampled_client_trace_is_passed_on_untouched_and_not_recorded(
    traced: OpenTraced,
) -> None:
    gw = traced(ratio=1.0)
    header = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"
    gw.client.post("/v1/chat/completions", json=_chat(gw.alias), headers={"traceparent": header})
    assert gw.spans.get_finished_spans() == ()
    assert gw.fake.calls[0].headers["traceparent"] == header


def test_sampling_ratio_zero_records_nothing_and_sends_no_traceparent(
    traced: OpenTraced,
) -> None:
    gw = traced(ratio=0.0)
    for _ in range(5):
        assert gw.client.post("/v1/chat/completions", json=_chat(gw.alias)).status_code == 200
    assert gw.spans.get_finished_spans() == ()
    assert all("traceparent" not in c.headers for c in gw.fake.calls)


def test_a_malformed_traceparent_starts_a_new_trace(traced: OpenTraced) -> None:
    gw = traced()
    response = gw.client.post(
        "/v1/chat/completions", json=_chat(gw.alias), headers={"traceparent": "00-zz-bad-01"}
    )
    assert response.status_code == 200
    root = _by_name(gw.spans.get_finished_spans())[f"chat {gw.alias}"][0]
    assert root.parent is None


def test_content_is_recorded_only_when_the_policy_opts_in(traced: OpenTraced) -> None:
    gw = traced(capture=True)
    gw.client.post(
        "/v1/chat/completions",
        json=_chat(gw.alias),
        headers={"Authorization": "Bearer sk-very-secret"},
    )
    root = _by_name(gw.spans.get_finished_spans())[f"chat {gw.alias}"][0]
    attrs = dict(root.attributes or {})
    assert "secret plan" in str(attrs["gen_ai.input.messages"])
    assert "fine" in str(attrs["gen_ai.output.messages"])
    assert "sk-very-secret" not in repr(attrs)


def test_retries_are_one_span_each_and_a_failed_request_is_an_error_span(
    traced: OpenTraced,
) -> None:
    def first_refused(call: Call) -> Scripted:
        if "l.test" in call.url and "l2" not in call.url:
            return Scripted(status=503, body=b'{"error":{"message":"busy"}}')
        return Scripted(body=completion())

    gw = traced(first_refused)
    for _ in range(4):  # the router's first choice varies; some requests retry
        gw.client.post("/v1/chat/completions", json=_chat(gw.alias))
    roots = [s for s in gw.spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    retried = [r for r in roots if dict(r.attributes or {})["gateway.retries"] != 0]
    assert retried
    trace_id = retried[0].context.trace_id
    attempts = [
        s
        for s in gw.spans.get_finished_spans()
        if s.name == "upstream" and s.context.trace_id == trace_id
    ]
    outcomes = [dict(a.attributes or {})["gateway.attempt.outcome"] for a in attempts]
    assert outcomes[0] == "refused" and outcomes[-1] == "ok"

    def all_down(call: Call) -> Scripted:
        return Scripted(connect_refused=True)

    gw = traced(all_down)
    response = gw.client.post("/v1/chat/completions", json=_chat(gw.alias))
    assert response.status_code == 503
    root = next(s for s in gw.spans.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert not root.status.is_ok
    assert dict(root.attributes or {})["error.type"] == "no_healthy_replica"


def test_a_streamed_answer_is_captured_when_opted_in(traced: OpenTraced) -> None:
    chunk = b'data: {"id":"c","model":"served-large","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'

    def stream(call: Call) -> Scripted:
        return Scripted(
            chunks=[chunk % b"hello ", chunk % b"world", b"data: [DONE]\n\n"],
            content_type="text/event-stream",
        )

    gw = traced(stream, capture=True)
    response = gw.client.post("/v1/chat/completions", json=_chat(gw.alias, stream=True))
    assert b"hello" in response.content
    root = _by_name(gw.spans.get_finished_spans())[f"chat {gw.alias}"][0]
    assert "hello world" in str(dict(root.attributes or {})["gen_ai.output.messages"])


def test_no_second_server_span_from_fastapi_under_a_global_tracer_provider(
    traced: OpenTraced, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI traces and meters every request itself whenever a global OpenTelemetry
    provider is set (as `opentelemetry-instrument` does); the gateway's own spans are
    the only ones it makes."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    outside = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(outside))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    gw = traced()
    assert gw.client.post("/v1/chat/completions", json=_chat(gw.alias)).status_code == 200
    assert gw.client.get("/v1/models").status_code == 200
    assert outside.get_finished_spans() == ()
    assert gw.spans.get_finished_spans()  # the gateway's own trace is still there
