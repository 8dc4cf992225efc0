"""`create_app()`: every object the gateway uses is built here, once, and handed to the
code that needs it. No module-level state, no singletons.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from opentelemetry.sdk.trace import SpanProcessor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from gateway.api.calls import ApiCalls
from gateway.api.observability import build_observability_router
from gateway.api.responses import build_responses_router
from gateway.api.routes import build_api_router
from gateway.api.sessions import build_sessions_router
from gateway.engine_metrics import EngineMetricsScraper, EngineStats
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    error_response,
)
from gateway.health import HealthMonitor
from gateway.metrics import GatewayMetrics
from gateway.middleware import EdgeMiddleware
from gateway.pipeline import Pipeline
from gateway.policy import Policy
from gateway.prefix_watch import RedisFingerprints
from gateway.replicas import Fleet
from gateway.resilience.dispatcher import Breakers, Dispatcher
from gateway.resilience.response_cache import RedisResponseCache
from gateway.responses.records import RedisResponseRecords
from gateway.responses.service import ResponsesService
from gateway.routing.build import build_router
from gateway.sessions.store import RedisCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.state_store import StateStore
from gateway.telemetry.fleet_view import FleetView
from gateway.telemetry.service import Telemetry
from gateway.telemetry.usage import RedisUsageLedger
from gateway.tiering.chooser import TierChooser, load_learned_router
from gateway.tiering.memory import RedisSessionTiers
from gateway.trimming.tokens import token_counter
from gateway.trimming.trim import Trimmer
from gateway.upstream import AiohttpUpstream, Upstream

log = logging.getLogger(__name__)


def create_app(
    policy: Policy,
    *,
    upstream: Upstream | None = None,
    store: StateStore | None = None,
    health_checks: bool = True,
    span_processor: SpanProcessor | None = None,
) -> FastAPI:
    fleet = Fleet(policy)
    metrics = GatewayMetrics()
    telemetry = Telemetry(policy, metrics, span_processor=span_processor)
    breakers = Breakers(policy, metrics)
    state = store if store is not None else StateStore(policy.state)
    # The aiohttp session is created inside the lifespan: it binds to the running loop.

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = upstream if upstream is not None else AiohttpUpstream.create()
        monitor: HealthMonitor | None = None
        scraper: EngineMetricsScraper | None = None
        if health_checks and isinstance(client, AiohttpUpstream):
            monitor = HealthMonitor(fleet, client.session, policy.health)
            scraper = EngineMetricsScraper(fleet, client.session, policy.routing.scrape_interval_s)
        router = build_router(policy.routing, time.monotonic, scraper)
        await state.open()
        assert state.redis is not None
        telemetry.open(
            RedisUsageLedger(
                state.redis,
                retention_days=policy.telemetry.usage.retention_days,
                session_ttl_s=policy.sessions.ttl_s,
            )
        )
        fleet_view = FleetView(
            fleet,
            breakers,
            scraper.stats if scraper else _no_stats,
            telemetry.live.replica_requests,
        )
        metrics.registry.register(fleet_view)
        app.state.telemetry = telemetry
        app.state.fleet_view = fleet_view
        checkpoints = RedisCheckpoints(state.redis, ttl_s=policy.sessions.ttl_s)
        trimming = policy.trimming
        trimmer = Trimmer(trimming, token_counter(trimming.tokenizer)) if trimming.enabled else None
        app.state.checkpoints = checkpoints
        app.state.pipeline = Pipeline(
            policy,
            fleet,
            router,
            client,
            fingerprints=RedisFingerprints(state.redis),
            metrics=metrics,
            sessions=SessionTurns(checkpoints, trimmer),
            tiers=TierChooser(
                policy,
                fleet,
                memory=RedisSessionTiers(state.redis),
                cached_share=router.cached_share,
                load_scorer=load_learned_router,
            ),
            dispatcher=Dispatcher(
                policy,
                router,
                client,
                metrics,
                engine_load=scraper.get if scraper else None,
                breakers=breakers,
            ),
            answers=RedisResponseCache(state.redis, ttl_s=policy.resilience.response_cache.ttl_s),
        )
        app.state.responses = ResponsesService(
            app.state.pipeline,
            checkpoints,
            RedisResponseRecords(state.redis, ttl_s=policy.sessions.ttl_s),
        )
        if monitor is not None and scraper is not None:
            await monitor.check_all(first=True)  # know who is up before the first request
            monitor.start()
            scraper.start()
        # Everything built so far lives as long as the process: move it out of the
        # collector's sight. Full collections otherwise walk all of it (imported modules,
        # the learned router, tokenizer tables, pydantic models): 130 ms stalls at p99
        # under load, measured (`make bench`); per-request garbage is collected as before.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            if monitor is not None and scraper is not None:
                await monitor.stop()
                await scraper.stop()
            await client.close()
            await telemetry.close()  # before the store closes: the last usage is written
            metrics.registry.unregister(fleet_view)
            await state.close()

    app = _GatewayApp(
        telemetry,
        policy.limits.max_body_bytes,
        title="agent-gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(build_api_router(policy, fleet, state, metrics))
    app.include_router(build_observability_router())
    app.include_router(build_sessions_router())
    app.include_router(build_responses_router())
    _install_error_handlers(app)
    return app


class _GatewayApp(FastAPI):
    """FastAPI, with the request id, telemetry and the hot API calls in plain ASGI in
    front of its own stack (gateway/api/calls.py says why)."""

    def __init__(self, telemetry: Telemetry, max_body_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gateway_telemetry = telemetry
        self._max_body_bytes = max_body_bytes

    def build_middleware_stack(self) -> ASGIApp:
        calls = ApiCalls(super().build_middleware_stack(), max_body_bytes=self._max_body_bytes)
        return EdgeMiddleware(calls, self._gateway_telemetry)


def _no_stats(url: str) -> EngineStats | None:
    return None


def _install_error_handlers(app: FastAPI) -> None:
    def request_id(request: Request) -> str | None:
        return getattr(request.state, "request_id", None)

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        record = getattr(request.state, "telemetry", None)
        if record is not None:
            record.error_type = exc.code or exc.error_type
        return error_response(exc, request_id=request_id(request))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        error: GatewayError
        if exc.status_code == 405:
            error = MethodNotAllowed(
                f"Method {request.method} is not allowed on {request.url.path}."
            )
        elif exc.status_code == 404:
            error = NotFound(f"Unknown request URL: {request.method} {request.url.path}.")
        else:
            error = InvalidRequest(str(exc.detail))
            error.status = exc.status_code  # type: ignore[misc]
        return error_response(error, request_id=request_id(request))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        return error_response(InvalidRequest(str(exc)), request_id=request_id(request))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # A bug, not the client's fault: log it whole, tell the client nothing internal.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        error = GatewayError("The gateway hit an internal error; it has been logged.")
        return error_response(error, request_id=request_id(request))

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
