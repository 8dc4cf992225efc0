"""The pipeline's session steps: which session a request continues, the stored
conversation put in front of it (hydration), and the turn's checkpoint once it is
answered. What a store outage does to each follows `sessions.on_store_outage`: fail open
serves the turn unsaved and says so; fail closed answers 503 (or an error event in place
of `[DONE]`) and keeps nothing half-written.

A tenant whose stored conversations hold its `limits.stored_bytes` has its turns served
unsaved, and told so, when the client sent its whole history (nothing it needs is lost:
its next kept turn takes in what this one did not); a delta-mode turn, which only the
store can continue, is refused with 429 `stored_bytes_exceeded`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.chat.inbound import InboundRequest
from gateway.chat.messages import Message
from gateway.errors import InvalidRequest, StateUnavailable, StoredBytesExceeded
from gateway.fleet.replicas import Fleet
from gateway.policy import Endpoint
from gateway.policy.sessions import SessionsSpec
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatch
from gateway.sessions.ids import SessionRef, session_for
from gateway.sessions.turns import SessionTurns, Turn, context_mode
from gateway.telemetry import names
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import Stage
from gateway.tiering.chooser import TierChoice

# Called with the turn's reply and usage once it completed; returns the turn's number.
Checkpointer = Callable[[Message | None, dict[str, Any] | None], Awaitable[int | None]]

log = logging.getLogger(__name__)


class SessionSteps:
    def __init__(
        self,
        spec: SessionsSpec,
        sessions: SessionTurns | None,
        metrics: GatewayMetrics,
        fleet: Fleet | None = None,
    ) -> None:
        self._spec = spec
        self._sessions = sessions if spec.enabled else None
        self._metrics = metrics
        # For trimming budgets that follow the engines' context window (fleet/health.py).
        self._fleet = fleet
        self._fail_closed = spec.on_store_outage == "fail_closed"

    def session_of(self, request: InboundRequest, context: RequestContext) -> SessionRef | None:
        if context.session is not None:
            return context.session
        if request.endpoint is not Endpoint.chat:
            return None
        return session_for(self._spec, context.session_id, request.body, context.access.name)

    async def hydrate(
        self, request: InboundRequest, session: SessionRef | None, context: RequestContext
    ) -> tuple[Turn | None, InboundRequest, str | None]:
        """Continue the session: in delta mode, put the stored conversation in front. The
        reason last is set when the turn is served unsaved: `checkpoint` (the store could
        not be read) or `stored_bytes` (the tenant holds its cap)."""
        mode = context_mode(context.context_mode)
        if session is None or self._sessions is None:
            if mode == "delta":
                raise InvalidRequest(
                    "X-Context-Mode: delta continues a stored session: name it with "
                    "X-Session-Id (sessions must be enabled in the policy).",
                    param="X-Context-Mode",
                    code="session_required",
                )
            return None, request, None
        try:
            fleet = self._fleet
            turn, body = await self._sessions.begin(
                session,
                mode,
                request.body,
                # the engines' window, asked only by a budget that sets none of its own
                engine_context=(lambda: fleet.context_tokens(request.model)) if fleet else None,
            )
        except StateUnavailable as exc:
            if mode == "delta" or self._fail_closed:
                raise  # 503: without the store the conversation cannot be rebuilt or kept
            # Fail open: the client sent its whole history, so serve it; the next turn's
            # checkpoint takes in what this one could not store.
            log.warning("session %s not loaded, turn served unsaved: %s", session.id, exc)
            self._metrics.checkpoint_failures.inc()
            return None, request, "checkpoint"
        except StoredBytesExceeded:
            if mode == "delta":
                raise  # 429: the next delta turn would need this one stored
            self._metrics.checkpoints_over_cap.inc()
            return None, request, "stored_bytes"
        if body is not request.body:
            request = request.with_body(body)
        if turn.trimmed is not None:
            trimmed = turn.trimmed
            metrics = self._metrics
            metrics.child(metrics.trims, "fell_back" if trimmed.fell_back else "trimmed").inc()
            metrics.trim_patches.inc(trimmed.patches)
            metrics.trim_schema_failures.inc(trimmed.schema_failures)
            if trimmed.capped:
                metrics.trim_capped.inc()
            record = context.record
            record.trimmed_tokens, record.trim_fell_back = trimmed.saved_tokens, trimmed.fell_back
            record.stages.append(
                Stage(
                    "trim",
                    trimmed.started_ns,
                    trimmed.ended_ns,
                    {names.TRIMMED_TOKENS: trimmed.saved_tokens},
                )
            )
        return turn, request, None

    def checkpointer(
        self,
        turn: Turn,
        request: InboundRequest,
        choice: TierChoice,
        dispatch: Dispatch,
        context: RequestContext,
    ) -> Checkpointer:
        """What to call with the engine's reply once the turn has completed."""
        decision = dispatch.decision
        engine_body = {**request.body, "model": choice.pool.spec.served_model}
        route = {
            "tier": choice.tier,
            "tier_reason": choice.reason,
            "replica": decision.replica.id,
            "reason": decision.reason,
            "cached_blocks": decision.cached_blocks,
            "total_blocks": decision.total_blocks,
        }
        return self.committer(turn, request, engine_body, route, context)

    def committer(
        self,
        turn: Turn,
        request: InboundRequest,
        engine_body: dict[str, Any],
        route: dict[str, Any],
        context: RequestContext,
    ) -> Checkpointer:
        """What to call with a reply once the turn has completed, whoever answered it."""
        sessions = self._sessions
        assert sessions is not None  # a turn was begun
        record = context.record

        async def commit(reply: Message | None, usage: dict[str, Any] | None) -> int | None:
            try:
                with record.stage("checkpoint"):
                    number = await sessions.commit(
                        turn,
                        engine_body=engine_body,
                        reply=reply,
                        usage=usage,
                        route=route,
                        request_id=context.request_id,
                        model=request.model,
                    )
            except StateUnavailable as exc:
                log.warning("checkpoint of session %s not written: %s", turn.session.id, exc)
                self._metrics.checkpoint_failures.inc()
                if self._fail_closed:
                    raise  # 503, or an error event in place of [DONE]: nothing half-kept
                return None  # fail open: the answer reaches the client, the turn unsaved
            self._metrics.checkpoints_written.inc()
            record.session_turn = number
            return number

        return commit
