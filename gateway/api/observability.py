"""What operators read: `GET /v1/usage` (tokens, cost and savings per tenant, model and
day, or per session), the dashboard page and its data."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.dashboard import PAGE
from gateway.errors import InvalidRequest, NotFound, StateUnavailable
from gateway.runtime import current
from gateway.sessions.ids import SessionRef, check_session_id
from gateway.telemetry.service import Telemetry
from gateway.telemetry.usage import parse_days, summary, usage_report
from gateway.tenants.identity import access_of

_MAX_DAYS = 366


def build_observability_router() -> APIRouter:
    router = APIRouter()

    def telemetry(request: Request) -> Telemetry:
        found: Telemetry = request.app.state.telemetry
        return found

    @router.get("/v1/usage")
    async def usage(request: Request) -> Response:
        book = telemetry(request).usage
        if book is None:
            raise NotFound(
                "Usage is not kept here: `telemetry.usage.enabled` is off.", code="usage_disabled"
            )
        params = request.query_params
        # Only the caller's tenant's usage: a `tenant` parameter is ignored when
        # authentication is on (without it, everything is the `default` tenant anyway).
        tenant = access_of(request.scope["state"]).name
        try:
            if session_id := params.get("session"):
                ref = SessionRef(tenant, check_session_id(session_id, param="session"))
                counts = await book.session(ref)
                if not counts:
                    raise NotFound(f"No usage for session `{session_id}`.", param="session")
                return json_response(
                    {"object": "session.usage", "session": session_id, **summary(counts)}
                )
            start, end = _days(params.get("start"), params.get("end"))
            rows = await book.read(tenant, start, end)
        except (RedisError, OSError) as exc:  # counts stay queued in memory meanwhile
            raise StateUnavailable(f"Usage cannot be read now: {exc}") from None
        return json_response(usage_report(rows, start, end))

    @router.get("/dashboard")
    async def dashboard() -> Response:
        return Response(PAGE, media_type="text/html; charset=utf-8")

    @router.get("/dashboard/data")
    async def dashboard_data(request: Request) -> Response:
        view = current(request.app.state).fleet_view
        return json_response(telemetry(request).live.snapshot(view.replicas()))

    return router


def _days(start: str | None, end: str | None) -> tuple[dt.date, dt.date]:
    today = dt.datetime.now(dt.UTC).date()
    try:
        first, last = parse_days(start, end, today)
    except ValueError:
        raise InvalidRequest(
            "`start` and `end` are dates such as 2026-11-30.", param="start", code="invalid_date"
        ) from None
    if last < first:
        raise InvalidRequest("`end` is before `start`.", param="end", code="invalid_date")
    if (last - first).days >= _MAX_DAYS:
        raise InvalidRequest(
            f"At most {_MAX_DAYS} days at once.", param="start", code="invalid_date"
        )
    return first, last
