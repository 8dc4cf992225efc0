"""The request log: one JSON line per request (ids, tenant, model, tier, replica, status,
tokens, timings, route reason), also the input of `gateway replay`, which reads back the
routed ones (`blocks`, `prompt_tokens`, `output_tokens`, `session`, `ts`) so operators
can replay their own traffic against a changed policy.

Lines are handed to a background thread (logging's QueueHandler/QueueListener): the
event loop never waits on the disk.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
from pathlib import Path
from typing import Any

import orjson

from gateway.telemetry.record import RequestRecord
from gateway.telemetry.redaction import redact


class RequestLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._file = logging.FileHandler(path, encoding="utf-8")
        self._file.setFormatter(logging.Formatter("%(message)s"))
        self._listener = logging.handlers.QueueListener(self._queue, self._file)
        self._logger = logging.Logger(f"agw.request_log.{path}")
        self._logger.addHandler(logging.handlers.QueueHandler(self._queue))
        self._logger.propagate = False
        self._listener.start()

    def write(self, record: RequestRecord) -> None:
        self._logger.info(orjson.dumps(log_entry(record)).decode())

    def close(self) -> None:
        self._listener.stop()  # drains what is queued
        self._file.close()


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)


def log_entry(record: RequestRecord) -> dict[str, Any]:
    result = record.result
    return {
        "ts": round(record.wall_start_ns / 1e9, 3),
        # The two strings a client chooses (X-Request-Id, the session key): a key sent
        # there by mistake is not written down (gateway/telemetry/redaction.py).
        "request_id": redact(record.request_id),
        "trace_id": record.trace.trace_id_hex,
        "tenant": record.tenant,
        "operation": record.operation,
        "model": record.model,
        "tier": record.tier,
        "tier_reason": record.tier_reason,
        "cascade": record.cascade,
        "cascade_tier": record.cascade_tier,
        "tool_check": record.tool_check,
        "tool_check_tier": record.tool_check_tier,
        # Only where the policy and the tenant allow keeping content (redacted as any
        # client text): the prompt half of a learning example.
        "route_text": _redacted(record.route_text) if record.content_allowed else None,
        "shadow": record.shadow_result,
        "tool_calls": record.tool_calls or None,
        "replica": record.replica,
        "reason": record.route_reason,
        "status": record.status,
        "error": record.error_type,
        "stream": record.stream,
        "session": _redacted(record.route_session or record.session),
        "blocks": record.blocks,
        "cached_blocks": record.cached_blocks,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "expected_cached_tokens": record.expected_cached_tokens,
        "engine_held_tokens": record.engine_held_tokens,
        "output_tokens": result.completion_tokens,
        "trimmed_tokens": record.trimmed_tokens,
        "attempts": len(record.attempts),
        "fallback": record.fallback,
        "duration_ms": _ms(record.duration_ns),
        "ttft_ms": (
            _ms(record.first_byte_ns - record.start_ns)
            if record.stream and record.first_byte_ns
            else None
        ),
        "upstream_ms": _ms(record.upstream_ns),
        "overhead_ms": _ms(record.overhead_ns),
    }
