"""`POST /v1/feedback`: a score for a request the gateway served, stored under the caller's
tenant (gateway/feedback/store.py); `gateway dataset export` joins it to the request log."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.edge.body import read_body
from gateway.feedback.store import Feedback, FeedbackStore
from gateway.runtime import current
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.identity import access_of

# A score, a name and a comment of at most 4,000 characters: far under this.
MAX_BODY_BYTES = 32 * 1024


def build_feedback_router(metrics: GatewayMetrics) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/feedback")
    async def give_feedback(request: Request) -> Response:
        feedback = Feedback.parse(await read_body(request, MAX_BODY_BYTES))
        store: FeedbackStore = request.app.state.feedback
        tenant = access_of(request.scope["state"]).name
        stored = current(request.app.state).stored_bytes  # the tenant's limits.stored_bytes
        entry = await store.add(tenant, feedback, stored=stored)
        metrics.feedback.labels(tenant).inc()
        return json_response(feedback.public(entry))

    return router
