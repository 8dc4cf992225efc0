"""The pipeline's send step when a pool cannot answer: the request sent to the pool its tier
chose (or straight to a wider window, where an earlier turn of the conversation outgrew
this one: gateway/tiering/outgrown.py); when nothing reached the client and that pool
cannot answer, to a tier whose window holds the prompt, then to the model's fallbacks in
turn (the tenant's own, and only models the tenant may use). The client hears the first
refusal when none can answer.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gateway.call import Call
from gateway.chat.inbound import InboundRequest
from gateway.errors import (
    ContextLengthExceeded,
    GatewayError,
    NoHealthyReplica,
    Overloaded,
    UpstreamError,
)
from gateway.fleet.replicas import Pool
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatch, Dispatcher
from gateway.routing.costs import RouteRequest
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tiering.chooser import TierChoice, TierChooser

log = logging.getLogger(__name__)

# What makes a pool unable to answer, so that a fallback is tried: nothing reached the
# client yet. No replica could take it, the engines failed, or their window cannot hold its
# prompt (a larger one can); an engine's other 4xx are the client's to fix, passed on.
CANNOT_ANSWER = (NoHealthyReplica, Overloaded, UpstreamError, ContextLengthExceeded)


class FallbackSteps:
    def __init__(self, tiers: TierChooser, dispatcher: Dispatcher, metrics: GatewayMetrics) -> None:
        self._tiers = tiers
        self._dispatcher = dispatcher
        self._metrics = metrics

    async def send(self, call: Call, request: InboundRequest) -> tuple[TierChoice, Dispatch]:
        """`request` sent for `call`: to its chosen pool, else (nothing sent to the client
        yet) a wider window, else the model's fallbacks; the choice that answered, and
        its dispatch."""
        choice, route, context = call.choice, call.route, call.context
        assert choice is not None and route is not None
        tenant = call.tenant
        failure: GatewayError
        past = self._tiers.past_outgrown(
            request.model, choice, route, lambda: request.size, tenant.tier_clamps
        )
        if past is not None:  # an earlier turn of this conversation was too long for it
            choice = past
        try:
            return choice, await self.send_to(choice.pool, request, route, context)
        except ContextLengthExceeded as exc:  # a tier with a larger window may hold it
            failure = exc
            self._tiers.outgrew(request.model, route, exc, request.size)
            wider = self._tiers.wider(request.model, choice, exc.limit, tenant.tier_clamps)
            if wider is not None:
                try:
                    return wider, await self.send_to(wider.pool, request, route, context)
                except CANNOT_ANSWER:
                    pass  # the model's fallbacks next; the client hears the first refusal
        except CANNOT_ANSWER as exc:
            failure = exc
        for fallback in tenant.fallbacks.get(request.model, ()):
            try:
                alternative = await self._tiers.choose(
                    fallback, request.endpoint, request.body, route, clamps=tenant.tier_clamps
                )
                dispatch = await self.send_to(alternative.pool, request, route, context)
            except CANNOT_ANSWER as exc:
                log.warning("fallback %s of %s failed too: %s", fallback, request.model, exc)
                continue
            self._metrics.fallbacks.labels(request.model, fallback).inc()
            return replace(alternative, fallback=fallback), dispatch
        try:
            raise failure
        finally:
            # The error's traceback holds this frame: a local still holding the error
            # would make a cycle that keeps the request's body alive until the collector
            # runs (gateway/resilience/dispatcher.py says what that costs).
            del failure

    async def send_to(
        self, pool: Pool, request: InboundRequest, route: RouteRequest, context: RequestContext
    ) -> Dispatch:
        """`request` to one pool: its body for the pool's served model, its output capped
        at the engines' window where it asks for more."""
        headers = {"Content-Type": "application/json", "X-Request-Id": context.request_id}
        if request.stream:
            headers["Accept"] = "text/event-stream"
        context_tokens = pool.context_tokens()
        capped = request.output_capped(context_tokens)
        dispatch = await self._dispatcher.send(
            pool,
            request.model,
            request.endpoint.path,
            request.body_for(pool.spec.served_model, capped),
            headers,
            route,
            context.record,
        )
        if capped:
            dispatch.output_capped_to = context_tokens
            self._metrics.child(self._metrics.output_capped, request.model, pool.name).inc()
        return dispatch
