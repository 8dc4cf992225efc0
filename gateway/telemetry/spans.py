"""A finished request's spans, assembled from its record and handed to the exporter.

Spans are built after the response has been sent, from the clock readings the request
path stored: one root span (SERVER) with the GenAI attributes, a child per pipeline stage
and one per engine attempt (CLIENT; its id is the parent vLLM sees in `traceparent`).
Building them afterwards keeps the SDK's per-span cost (70-150 us each, measured) out of
the time the client waits; the batch processor exports them from its own thread.
A reviewer's decision on a held tool call is one span of its own
(gateway/telemetry/approval_spans.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from gateway.policy.telemetry import TracesSpec
from gateway.telemetry import names
from gateway.telemetry.approval_spans import SPAN_NAME as DECISION_SPAN
from gateway.telemetry.approval_spans import DecisionRecord
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.redaction import redact

log = logging.getLogger(__name__)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("agent-gateway", "0.1.0")
_OK = Status(StatusCode.UNSET)


def traces_settings(spec: TracesSpec) -> TracesSpec:
    """The policy's trace settings with the standard OpenTelemetry variables applied
    (they win, as in every OpenTelemetry SDK)."""
    update: dict[str, Any] = {}
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint and (base := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        endpoint = base.rstrip("/") + "/v1/traces"
    if endpoint:
        update["endpoint"] = endpoint
    if ratio := os.environ.get("OTEL_TRACES_SAMPLER_ARG"):
        try:
            update["sample_ratio"] = min(1.0, max(0.0, float(ratio)))
        except ValueError:
            log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number; ignored", ratio)
    if service := os.environ.get("OTEL_SERVICE_NAME"):
        update["service_name"] = service
    return spec.model_copy(update=update) if update else spec


def otlp_processor(spec: TracesSpec) -> SpanProcessor | None:
    """The batch exporter to the policy's OTLP/HTTP endpoint, or None (no tracing)."""
    if not spec.endpoint:
        return None
    # Imported here: the exporter pulls in protobuf and requests, which a gateway
    # without tracing does not need to load.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(
        OTLPSpanExporter(endpoint=spec.endpoint, timeout=5),
        max_queue_size=spec.max_queue,
        # Few, large exports: each one holds the GIL while it encodes (the request path
        # waits meanwhile), so fewer of them touch fewer requests (see the benchmark).
        schedule_delay_millis=5000,
        max_export_batch_size=512,
    )


class SpanWriter:
    def __init__(self, processor: SpanProcessor, spec: TracesSpec) -> None:
        self._processor = processor
        self._capture = spec.capture_content
        self._resource = Resource.create({"service.name": spec.service_name})

    def write(self, record: RequestRecord) -> None:
        trace = record.trace
        root = self._context(trace.trace_id, record.span_id)
        parent = (
            SpanContext(trace.trace_id, trace.parent_span_id, is_remote=True, trace_flags=_SAMPLED)
            if trace.parent_span_id is not None
            else None
        )
        for stage in record.stages:
            self._emit(
                stage.name,
                self._context(trace.trace_id, stage.span_id),
                root,
                record.wall_ns(stage.start_ns),
                record.wall_ns(stage.end_ns),
                stage.attributes or {},
            )
        for number, attempt in enumerate(record.attempts, 1):
            attributes: dict[str, Any] = {
                names.REPLICA: attempt.replica,
                names.POOL: attempt.pool,
                names.ATTEMPT: number,
                names.ATTEMPT_OUTCOME: attempt.outcome,
            }
            if attempt.status:
                attributes[names.HTTP_RESPONSE_STATUS_CODE] = attempt.status
            if attempt.error:
                attributes[names.ERROR_TYPE] = attempt.error
            failed = attempt.outcome in ("failed", "refused")
            self._emit(
                "upstream",
                self._context(trace.trace_id, attempt.span_id),
                root,
                record.wall_ns(attempt.start_ns),
                record.wall_ns(attempt.end_ns or record.end_ns),
                attributes,
                kind=SpanKind.CLIENT,
                status=Status(StatusCode.ERROR, attempt.error) if failed else _OK,
            )
        status = Status(StatusCode.ERROR, record.error_type) if record.status >= 500 else _OK
        operation = names.OPERATIONS.get(record.operation, record.operation)
        self._emit(
            f"{operation} {record.model}" if record.model else operation,
            root,
            parent,
            record.wall_start_ns,
            record.wall_ns(record.end_ns),
            self._root_attributes(record),
            kind=SpanKind.SERVER,
            status=status,
        )

    def write_decision(self, decision: DecisionRecord) -> None:
        self._emit(
            DECISION_SPAN,
            self._context(decision.trace.trace_id, decision.span_id),
            decision.parent(),
            decision.wall_start_ns,
            decision.wall_end_ns,
            decision.attributes(),
            kind=SpanKind.SERVER,
            status=decision.span_status(),
            links=decision.links(),
        )

    def shutdown(self) -> None:
        self._processor.shutdown()

    def _root_attributes(self, record: RequestRecord) -> dict[str, Any]:
        result = record.result
        attributes: dict[str, Any] = {
            names.GEN_AI_OPERATION_NAME: names.OPERATIONS.get(record.operation, record.operation),
            names.GEN_AI_SYSTEM: names.GEN_AI_SYSTEM_VALUE,
            names.HTTP_REQUEST_METHOD: record.method,
            names.HTTP_ROUTE: record.route,
            names.HTTP_RESPONSE_STATUS_CODE: record.status,
            names.REQUEST_ID: redact(record.request_id),  # the client may choose it
            names.TENANT: record.tenant,
            names.STREAM: record.stream,
            names.RETRIES: record.retries,
            names.OVERHEAD_MS: round(record.overhead_ns / 1e6, 3),
        }
        optional: dict[str, Any] = {
            names.GEN_AI_REQUEST_MODEL: record.model,
            names.GEN_AI_REQUEST_MAX_TOKENS: record.max_tokens,
            names.GEN_AI_REQUEST_TEMPERATURE: record.temperature,
            names.GEN_AI_RESPONSE_MODEL: result.response_model,
            names.GEN_AI_RESPONSE_ID: result.response_id,
            names.GEN_AI_USAGE_INPUT_TOKENS: result.prompt_tokens,
            names.GEN_AI_USAGE_OUTPUT_TOKENS: result.completion_tokens,
            names.GEN_AI_USAGE_CACHED_INPUT_TOKENS: result.cached_tokens,
            names.GEN_AI_CONVERSATION_ID: record.session and redact(record.session),
            names.TIER: record.tier,
            names.TIER_DECIDED_BY: record.tier_by,
            names.TIER_REASON: record.tier_reason,
            names.POOL: record.pool,
            names.REPLICA: record.replica,
            names.ROUTE_REASON: record.route_reason,
            names.FALLBACK: record.fallback,
            names.DEGRADED: record.degraded,
            names.SESSION_TURN: record.session_turn,
            names.ERROR_TYPE: record.error_type,
        }
        attributes.update((k, v) for k, v in optional.items() if v is not None)
        if record.tool_calls:
            attributes[names.TOOL_CALLS] = tuple(record.tool_calls)
        if result.finish_reasons:
            attributes[names.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(result.finish_reasons)
        if record.blocks:
            attributes[names.ROUTE_CACHED_BLOCKS] = record.cached_blocks
            attributes[names.ROUTE_TOTAL_BLOCKS] = len(record.blocks)
        if record.trimmed_tokens or record.trim_fell_back:
            attributes[names.TRIMMED_TOKENS] = record.trimmed_tokens
            attributes[names.TRIM_FELL_BACK] = record.trim_fell_back
        # record.capture: off for a tenant that did not opt in (gateway/edge/auth.py).
        # Redacted: a key pasted into a prompt does not reach the trace store.
        if self._capture and record.capture:
            if record.input_messages is not None:
                attributes[names.GEN_AI_INPUT_MESSAGES] = redact(_json(record.input_messages))
            if result.reply is not None:
                attributes[names.GEN_AI_OUTPUT_MESSAGES] = redact(_json([result.reply]))
        return attributes

    def _context(self, trace_id: int, span_id: int) -> SpanContext:
        return SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)

    def _emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status = _OK,
        links: Sequence[Link] = (),
    ) -> None:
        span = ReadableSpan(
            name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            kind=kind,
            status=status,
            links=links,
            start_time=start_ns,
            end_time=max(start_ns, end_ns),
            instrumentation_scope=_SCOPE,
        )
        self._processor.on_end(span)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()
