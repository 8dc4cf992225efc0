"""Routes. Each handler reads what it needs from the request and calls one function."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.errors import ModelNotFound
from gateway.fleet.replicas import Fleet
from gateway.runtime import current
from gateway.state.store import StateStore
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.identity import access_of


def build_api_router(store: StateStore, metrics: GatewayMetrics) -> APIRouter:
    router = APIRouter()
    created = int(time.time())

    def fleet_of(request: Request) -> Fleet:
        # The current policy's: a reload swaps it (gateway/reload.py).
        return current(request.app.state).fleet

    def model_card(alias: str, fleet: Fleet) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": alias,
            "object": "model",
            "created": created,
            "owned_by": "agent-gateway",
        }
        # As vLLM lists it: the context a request may fill, the smallest of the engines
        # that may serve the alias (clients size their own trimming by it).
        if (context := fleet.context_tokens(alias)) is not None:
            card["max_model_len"] = context
        return card

    @router.get("/v1/models")
    async def list_models(request: Request) -> Response:
        # Only the models the caller's tenant may use (all, without tenants).
        fleet = fleet_of(request)
        aliases = access_of(request.scope["state"]).visible(fleet.descriptions)
        return json_response({"object": "list", "data": [model_card(a, fleet) for a in aliases]})

    @router.get("/v1/models/{alias:path}")
    async def retrieve_model(alias: str, request: Request) -> Response:
        allowed = access_of(request.scope["state"]).allows(alias)
        if not allowed or alias not in fleet_of(request).descriptions:
            raise ModelNotFound(f"The model `{alias}` does not exist.", param="model")
        return json_response(model_card(alias, fleet_of(request)))

    @router.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @router.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @router.get("/readyz")
    async def readyz(request: Request) -> Response:
        fleet = fleet_of(request)
        models = {
            alias: {
                "pool": pool.name,
                "healthy_replicas": len(pool.healthy_replicas),
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
        return json_response(body, 200 if ready else 503)

    return router
