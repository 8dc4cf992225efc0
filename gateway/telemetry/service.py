"""Telemetry: starts a request's record, and when the response has been sent turns it into
metrics, the dashboard's figures, usage and cost counts, a request-log line and (when
the trace is sampled) spans. A reviewer's decision on a held tool call is traced on its
own (`decision`, gateway/telemetry/approval_spans.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from opentelemetry.sdk.trace import SpanProcessor

from gateway.periodic import Periodic
from gateway.policy import Policy
from gateway.sessions.ids import SessionRef
from gateway.telemetry.approval_spans import DecisionRecord
from gateway.telemetry.cache_expectation import CacheExpectation
from gateway.telemetry.live import LiveStats
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prices import NANO, Prices, Spend
from gateway.telemetry.record import RequestRecord, TraceContext
from gateway.telemetry.request_log import RequestLog
from gateway.telemetry.spans import SpanWriter, otlp_processor, traces_settings
from gateway.telemetry.usage import UsageBook, UsageLedger, day_of
from gateway.tenants.identity import DEFAULT_TENANT

log = logging.getLogger(__name__)


class TurnListener(Protocol):
    """Told of each answered conversation turn (gateway/fleet/engine_chains.py)."""

    def answered(
        self, conversation: tuple[str, str, str], sent_at: float, prompt_tokens: int, blocks: int
    ) -> None: ...


_NO_TIER = "none"  # label value when no tier was chosen (the request failed before)


class Telemetry:
    def __init__(
        self,
        policy: Policy,
        metrics: GatewayMetrics,
        *,
        span_processor: SpanProcessor | None = None,
        live: LiveStats | None = None,
    ) -> None:
        self.metrics = metrics
        self.live = live or LiveStats()
        self.prices = Prices(policy)
        self.usage: UsageBook | None = None
        self._policy = policy
        self._traces = traces_settings(policy.telemetry.traces)
        self._span_processor = span_processor  # given by tests; else made from the policy
        self._spans: SpanWriter | None = None
        self._sample_ratio = 0.0
        self._capture = False
        self._request_log: RequestLog | None = None
        self._flusher: Periodic | None = None
        self.cache_expectation = CacheExpectation()
        # Told of each answered conversation turn, to match its engine's KV blocks (set by
        # the app; gateway/fleet/engine_chains.py).
        self.engine_chains: TurnListener | None = None

    def open(self, usage: UsageLedger | None) -> None:
        """Start what runs in the background: span export, the request log's writer
        thread, the usage flusher (inside the app's lifespan)."""
        processor = self._span_processor or otlp_processor(self._traces)
        if processor is not None:
            self._spans = SpanWriter(processor, self._traces)
            self._sample_ratio = self._traces.sample_ratio
            self._capture = self._traces.capture_content
            log.info(
                "traces: %s, sampled at %g",
                self._traces.endpoint or "given exporter",
                self._sample_ratio,
            )
        log_path = self._policy.telemetry.request_log
        self._request_log = RequestLog(Path(log_path)) if log_path else None
        if usage is not None and self._policy.telemetry.usage.enabled:
            self.usage = UsageBook(usage)
            interval = self._policy.telemetry.usage.flush_interval_s
            self._flusher = Periodic("usage-flush", interval, self._flush)
            self._flusher.start()

    def start(
        self, request_id: str, operation: str, *, route: str, traceparent: str | None
    ) -> RequestRecord:
        trace = TraceContext.start(traceparent, self._sample_ratio)
        record = RequestRecord(request_id, operation, trace, tenant=DEFAULT_TENANT, route=route)
        # Content kept in the request log needs no trace exporter (spans need one).
        record.content_allowed = self._traces.capture_content
        record.capture = self._capture and trace.sampled
        return record

    def finish(self, record: RequestRecord) -> None:
        """Called once per request, after its last byte was sent."""
        if record.shadow is not None:
            self._shadow(record)
        record.expected_cached_tokens = self.cache_expectation.observe(record)
        if self.engine_chains is not None:
            self._answered(self.engine_chains, record)
        spend = self.prices.spend(record)
        self._count(record, spend)
        counts = spend.counts(record.status >= 400)
        self.live.add(record, counts)
        if self.usage is not None and record.model is not None:
            session = SessionRef(record.tenant, record.session) if record.session else None
            key = (
                day_of(record.wall_start_ns),
                record.tenant,
                record.model,
                record.tier or _NO_TIER,
            )
            self.usage.add(key, session, counts)
        if self._request_log is not None:
            self._request_log.write(record)
        if self._spans is not None and record.trace.sampled:
            try:
                self._spans.write(record)
            except Exception:  # telemetry must never fail a request that was served
                log.exception("spans of request %s not written", record.request_id)

    def _shadow(self, record: RequestRecord) -> None:
        assert record.shadow is not None
        try:  # scored now, not while the client waited; never fails the request
            result = record.shadow.run()
        except Exception:
            log.exception("shadow router failed on request %s", record.request_id)
            return
        record.shadow_result = result
        live = result.get("live_tier")
        agreement = (
            "no_live" if live is None else "agreed" if live == result["tier"] else "differed"
        )
        self.metrics.shadow_decisions.labels(record.model or "", agreement).inc()

    @staticmethod
    def _answered(chains: TurnListener, record: RequestRecord) -> None:
        prompt, session, replica = record.result.prompt_tokens, record.route_session, record.replica
        if session is None or replica is None or not prompt or not record.blocks:
            return
        if record.status >= 400:
            return  # not computed by the engine, or not all of it
        sent_at = record.start_ns / 1e9  # perf_counter, EngineChains' clock
        chains.answered((record.tenant, session, replica), sent_at, prompt, len(record.blocks))

    @contextmanager
    def decision(
        self,
        traceparent: str | None,
        *,
        tenant: str,
        approval_id: str,
        by: str | None,
        request_id: str | None,
    ) -> Iterator[DecisionRecord]:
        """`with telemetry.decision(...) as record:` around deciding an approval: the
        record collects its facts, and when the block ends (decided, or refused with a
        gateway error, which is re-raised) it becomes the decision's span."""
        record = DecisionRecord.start(
            traceparent, tenant=tenant, approval_id=approval_id, by=by, request_id=request_id
        )
        try:
            yield record
        except BaseException as exc:
            record.failed(exc)
            raise
        finally:
            record.end()
            if self._spans is not None:
                try:
                    self._spans.write_decision(record)
                except Exception:  # telemetry must never fail the decision it describes
                    log.exception("span of the decision on %s not written", approval_id)

    def _count(self, record: RequestRecord, spend: Spend) -> None:
        m = self.metrics
        child = m.child
        model = record.model or "unknown"
        tier = record.tier or _NO_TIER
        child(m.requests, model, tier, str(record.status)).inc()
        if record.model is None:
            return  # refused before the model was known: only counted
        child(m.duration, model, tier).observe(record.duration_ns / 1e9)
        child(m.overhead, model).observe(record.overhead_ns / 1e9)
        if record.stream and record.first_byte_ns:
            child(m.ttft, model, tier).observe((record.first_byte_ns - record.start_ns) / 1e9)
        tenant = record.tenant
        if spend.input_tokens:
            child(m.prompt_tokens, tenant, model, tier).inc(spend.input_tokens)
        if spend.cached_input_tokens:
            child(m.cached_prompt_tokens, tenant, model, tier).inc(spend.cached_input_tokens)
        if spend.output_tokens:
            child(m.completion_tokens, tenant, model, tier).inc(spend.output_tokens)
        expected, reported = record.expected_cached_tokens, record.result.cached_tokens
        if expected is not None and reported is not None and record.pool is not None:
            child(m.cache_prediction_error, record.pool).inc(abs(expected - reported))
            child(m.cache_prediction_prompt, record.pool).inc(record.result.prompt_tokens or 0)
        if spend.cost_nusd:
            child(m.cost, tenant, model, tier).inc(spend.cost_nusd / NANO)
        for source, nusd in (
            ("cache", spend.saved_cache_nusd),
            ("trimming", spend.saved_trimming_nusd),
            ("small_tier", spend.saved_small_tier_nusd),
        ):
            if nusd:
                child(m.savings, tenant, model, source).inc(nusd / NANO)
        if spend.trimmed_tokens:
            child(m.trimmed_tokens, model).inc(spend.trimmed_tokens)

    async def _flush(self) -> None:
        if self.usage is not None:
            try:
                await self.usage.flush()
            except Exception as exc:  # kept in memory; the next flush tries again
                log.debug("usage flush deferred: %s", exc)

    async def close(self) -> None:
        if self._flusher is not None:
            await self._flusher.stop()
        await self._flush()
        if self._request_log is not None:
            self._request_log.close()
        if self._spans is not None:
            self._spans.shutdown()  # exports what is queued
        self._spans, self._request_log, self.usage, self._flusher = None, None, None, None
