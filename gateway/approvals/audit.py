"""The audit trail of approvals: every hold, decision and outcome, three ways at once.

- an entry in the tenant's audit stream in Redis (`agw:approvals:{<tenant>}:audit`, XADD
  trimmed to about `approvals.audit_max_entries`), read with XRANGE/XREVRANGE;
- a structured log line on the `gateway.audit` logger (the entry as JSON, also in the
  record's `audit` attribute for structured handlers), so it reaches the log pipeline
  even when Redis does not take the entry;
- `gateway_approvals_total{tenant,event}`.

Events: held, approved, denied, expired, released (the approved call given to the agent),
denial_returned and expiry_returned (the agent told the call was not run). A tool call's
arguments are in the `held` entry of the stream only, never in the log line: they may
carry personal data, and the stream is the tenant's own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.approvals.records import Approval
from gateway.state.keys import approvals_key
from gateway.state.redis_client import RedisClient
from gateway.telemetry.metrics import GatewayMetrics

audit_log = logging.getLogger("gateway.audit")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditEvent:
    event: str
    approval: Approval
    request_id: str | None  # the request that caused it
    trace_id: str | None  # its trace (a decision: its span's, the caller's when it sent one)
    by: str | None = None  # the approver's key id
    reason: str | None = None

    def entry(self, at: float) -> dict[str, Any]:
        approval = self.approval
        fields = {
            "event": self.event,
            "approval": approval.id,
            "tenant": approval.tenant,
            "session": approval.session,
            "model": approval.model,
            "tools": ",".join(approval.guarded),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "held_trace_id": approval.trace_id,
            "by": self.by,
            "reason": self.reason,
            "at": round(at, 3),
        }
        return {k: v for k, v in fields.items() if v is not None}


class AuditLog:
    def __init__(self, redis: RedisClient, metrics: GatewayMetrics, *, max_entries: int) -> None:
        self._redis = redis
        self._metrics = metrics
        self._max_entries = max_entries

    async def append(self, event: AuditEvent) -> None:
        """Never fails the request that caused it: a Redis outage loses the stream entry,
        not the log line."""
        entry = event.entry(time.time())
        tenant = event.approval.tenant
        self._metrics.approvals.labels(tenant, event.event).inc()
        audit_log.info("approval %s", orjson.dumps(entry).decode(), extra={"audit": entry})
        stream: dict[str, Any] = dict(entry)
        if event.event == "held":
            stream["tool_calls"] = orjson.dumps(event.approval.tool_calls).decode()
        try:
            await self._redis.xadd(
                approvals_key(tenant, "audit"),
                stream,  # type: ignore[arg-type]
                maxlen=self._max_entries,
                approximate=True,
            )
        except (aioredis.RedisError, OSError) as exc:
            log.warning("audit entry of %s not stored (%s)", event.approval.id, exc)
