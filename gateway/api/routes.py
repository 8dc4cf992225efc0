"""Routes. Each handler reads what it needs from the request and calls one function."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.body import read_body
from gateway.api.observability import record_of
from gateway.errors import ModelNotFound
from gateway.metrics import GatewayMetrics
from gateway.pipeline import Pipeline, RequestContext
from gateway.policy import Endpoint, Policy
from gateway.replicas import Fleet
from gateway.state_store import StateStore


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def build_api_router(
    policy: Policy, fleet: Fleet, store: StateStore, metrics: GatewayMetrics
) -> APIRouter:
    router = APIRouter()
    limit = policy.limits.max_body_bytes
    created = int(time.time())

    async def forward(request: Request, endpoint: Endpoint) -> Response:
        pipeline: Pipeline = request.app.state.pipeline
        body = await read_body(request, limit)
        context = RequestContext(
            request_id=request.state.request_id,
            session_id=request.headers.get("x-session-id") or None,
            context_mode=request.headers.get("x-context-mode"),
            task=request.headers.get("x-task") or None,
            record=record_of(request),
        )
        return await pipeline.handle(endpoint, body, context)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await forward(request, Endpoint.chat)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, Endpoint.completions)

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await forward(request, Endpoint.embeddings)

    def model_card(alias: str) -> dict[str, Any]:
        return {"id": alias, "object": "model", "created": created, "owned_by": "agent-gateway"}

    @router.get("/v1/models")
    async def list_models() -> Response:
        return _json(
            {"object": "list", "data": [model_card(a) for a in sorted(fleet.descriptions)]}
        )

    @router.get("/v1/models/{alias:path}")
    async def retrieve_model(alias: str) -> Response:
        if alias not in fleet.descriptions:
            raise ModelNotFound(f"The model `{alias}` does not exist.", param="model")
        return _json(model_card(alias))

    @router.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @router.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @router.get("/readyz")
    async def readyz() -> Response:
        models = {
            alias: {
                "pool": pool.name,
                "healthy_replicas": len(pool.healthy),
                "replicas": len(pool.replicas),
            }
            for alias, pool in sorted(fleet.models.items())
        }
        not_ready = sorted(a for a, m in models.items() if m["healthy_replicas"] == 0)
        ready = not not_ready
        body = {
            "status": "ready" if ready else "not ready",
            "models": models,
            "not_ready": not_ready,
            "state_store": "ok" if await store.ping() else "unreachable",
        }
        return _json(body, 200 if ready else 503)

    return router
