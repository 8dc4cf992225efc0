"""The approvals API: a tenant's held tool calls, and deciding them; the work is in
gateway/approvals/decisions.py.

    GET  /v1/approvals?status=pending&limit=20   the tenant's approvals, newest first
    GET  /v1/approvals/{approval_id}             one, with its history
    POST /v1/approvals/{approval_id}             {"decision": "approve"|"deny", "reason"}

Another tenant's ids are 404, as ids that never existed. Deciding needs a key with the
`approver` role (403 otherwise); a decided or expired approval answers 409. Each decision,
refused ones too, is a span continuing the caller's `traceparent`
(gateway/telemetry/approval_spans.py).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.approvals.decisions import Approvals
from gateway.errors import InvalidRequest
from gateway.runtime import current
from gateway.telemetry.service import Telemetry
from gateway.tenants.identity import access_of, identity_of
from gateway.untrusted.client_text import ascii_number

_LIMIT = 20
_MAX_LIMIT = 100


def _limit(value: str | None) -> int:
    if value is None:
        return _LIMIT
    number = ascii_number(value)
    if number is None or not 1 <= number <= _MAX_LIMIT:
        raise InvalidRequest(f"`limit` must be a number from 1 to {_MAX_LIMIT}.", param="limit")
    return number


def build_approvals_router(telemetry: Telemetry) -> APIRouter:
    router = APIRouter()

    def approvals_of(request: Request) -> Approvals:
        return current(request.app.state).approvals

    def tenant_of(request: Request) -> str:
        return access_of(request.scope["state"]).name

    @router.get("/v1/approvals")
    async def list_approvals(request: Request) -> Response:
        approvals = approvals_of(request)
        params = request.query_params
        found = await approvals.recent(
            tenant_of(request), params.get("status"), _limit(params.get("limit"))
        )
        now = approvals.clock()
        return json_response({"object": "list", "data": [a.public(now) for a in found]})

    @router.get("/v1/approvals/{approval_id}")
    async def get_approval(approval_id: str, request: Request) -> Response:
        approvals = approvals_of(request)
        approval = await approvals.get(tenant_of(request), approval_id)
        return json_response(approval.public(approvals.clock()))

    @router.post("/v1/approvals/{approval_id}")
    async def decide(approval_id: str, request: Request) -> Response:
        approvals = approvals_of(request)
        state = request.scope["state"]
        identity = identity_of(state)
        tenant = tenant_of(request)
        with telemetry.decision(
            request.headers.get("traceparent"),
            tenant=tenant,
            approval_id=approval_id,
            by=identity.key_id if identity is not None else None,
            request_id=state.get("request_id"),
        ) as record:
            body = await request.body()
            decided = await approvals.decide(tenant, approval_id, identity, body, record)
        return json_response(decided.public(approvals.clock()))

    return router
