"""The Responses API routes for stored responses: read, list their input items, cancel,
delete (creating one is an API call: gateway/api/inference.py). The work is in
gateway/responses/service.py."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.responses.input_items import page_of
from gateway.responses.service import ResponsesService
from gateway.runtime import current
from gateway.tenants.identity import access_of


def build_responses_router() -> APIRouter:
    router = APIRouter()

    def service(request: Request) -> ResponsesService:
        return current(request.app.state).responses

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        body = await service(request).get(response_id, access_of(request.scope["state"]).name)
        return json_response(body)

    @router.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Response:
        query = request.query_params
        page = page_of(query, [*query.getlist("include"), *query.getlist("include[]")])
        tenant = access_of(request.scope["state"]).name
        return json_response(await service(request).input_items(response_id, page, tenant))

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request) -> Response:
        tenant = access_of(request.scope["state"]).name
        return json_response(await service(request).cancel(response_id, tenant))

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        tenant = access_of(request.scope["state"]).name
        body = await service(request).delete(response_id, tenant)
        return json_response(body)

    return router
