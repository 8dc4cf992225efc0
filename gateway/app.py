"""`create_app()`: every object the gateway uses is built here and handed to the code that
needs it. No module-level state, no singletons.

What lives as long as the process (the engine client, the state store, metrics, telemetry,
the API-key check) is built once; what a policy decides is a runtime built from the policy
(gateway/runtime.py), which a policy reload replaces while the app serves
(gateway/reload.py).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from opentelemetry.sdk.trace import SpanProcessor
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from gateway.api.admin import build_admin_router
from gateway.api.approvals import build_approvals_router
from gateway.api.feedback import build_feedback_router
from gateway.api.inference import ApiCalls
from gateway.api.observability import build_observability_router
from gateway.api.openapi import build_openapi_router
from gateway.api.responses import build_responses_router
from gateway.api.routes import build_api_router
from gateway.api.sessions import build_sessions_router
from gateway.edge.auth import AdminKeyStore, ApiKeyAuth, KeyStore
from gateway.edge.body import BodyLimit
from gateway.edge.middleware import EdgeMiddleware
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    error_response,
)
from gateway.feedback.store import FeedbackStore
from gateway.fleet.discovery import DiscoveryMetrics, Resolver, SystemResolver
from gateway.policy import Policy
from gateway.policy.reloadable import PolicyFile
from gateway.reload import PolicyReloader, ReloadMetrics
from gateway.runtime import CurrentEngineLoads, Runtime, Services, build_runtime
from gateway.state.store import StateStore
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.service import Telemetry
from gateway.telemetry.usage import RedisUsageLedger
from gateway.tenants.directory import Tenants
from gateway.tenants.key_checks import admin_keys, tenant_keys
from gateway.tenants.stored_keys import RedisKeys
from gateway.upstream.client import Upstream, probe_session
from gateway.upstream.http1 import Http1Upstream

log = logging.getLogger(__name__)


def create_app(
    policy: Policy,
    *,
    upstream: Upstream | None = None,
    store: StateStore | None = None,
    health_checks: bool = True,
    span_processor: SpanProcessor | None = None,
    resolver: Resolver | None = None,
    policy_file: PolicyFile | None = None,
    reload_on_sighup: bool = False,
) -> FastAPI:
    """`policy_file`: the file `policy` was read from (`load_policy_file` in
    gateway/policy/reloadable.py); the app then applies changes to it while serving, and with
    `reload_on_sighup` (for `gateway serve`) checks it at once on SIGHUP."""
    metrics = GatewayMetrics()
    discovery_metrics = DiscoveryMetrics(metrics.registry)
    reload_metrics = ReloadMetrics(metrics.registry) if policy_file is not None else None
    keys = tenant_keys(policy)  # files read now: the first request is already guarded
    admin = admin_keys(policy)
    telemetry = Telemetry(policy, metrics, span_processor=span_processor)
    state = store if store is not None else StateStore(policy.state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # What start-up opens is closed in reverse order, at shutdown or as soon as a later
        # step fails (a refused artifact must not leave an engine session or the embedded
        # Redis open behind it).
        async with AsyncExitStack() as opened:
            # The clients are created here: they bind to the running loop. A test's own
            # upstream comes without health checks or /metrics scraping (nothing to poll).
            client = upstream if upstream is not None else Http1Upstream()
            opened.push_async_callback(client.close)
            await state.open()
            opened.push_async_callback(state.close)
            probes = probe_session() if upstream is None and health_checks else None
            if probes is not None:
                opened.push_async_callback(probes.close)
            assert state.redis is not None
            if keys is not None:
                keys.attach(state.redis)  # keys created at run time
            app.state.api_keys = RedisKeys(state.redis)
            app.state.feedback = FeedbackStore(state.redis)
            telemetry.open(
                RedisUsageLedger(
                    state.redis,
                    retention_days=policy.telemetry.usage.retention_days,
                    session_ttl_s=policy.sessions.ttl_s,
                )
            )
            # Closed before the store: the last usage is written.
            opened.push_async_callback(telemetry.close)
            services = Services(
                upstream=client,
                state=state,
                metrics=metrics,
                telemetry=telemetry,
                resolver=resolver or SystemResolver(),
                discovery_metrics=discovery_metrics,
                engine_loads=CurrentEngineLoads(),
                probes=probes,
            )
            app.state.telemetry = telemetry
            telemetry.engine_chains = services.engine_chains
            runtime = build_runtime(policy, services)
            opened.push_async_callback(_stop_runtime, app.state, services, runtime)
            await runtime.start(first=True)
            runtime.activate(app.state, services, previous=None)
            for key_check in (keys, admin):
                if key_check is not None:
                    key_check.start()
                    opened.push_async_callback(key_check.stop)
            reloader: PolicyReloader | None = None
            if policy_file is not None and reload_metrics is not None:
                reloader = PolicyReloader(app.state, services, policy_file, reload_metrics)
                reloader.start(sighup=reload_on_sighup)
                # first at shutdown: no reload swaps the runtime stopped after it
                opened.push_async_callback(reloader.stop)
            app.state.reloader = reloader
            # Everything built so far lives as long as the process: move it out of the
            # collector's sight. Full collections otherwise walk all of it (imported
            # modules, the learned router, tokenizer tables, pydantic models): 130 ms stalls
            # at p99 under load, measured (`make bench`); per-request garbage is collected
            # as before. (A reload thaws and freezes again once the replaced runtime is
            # unused.)
            gc.collect()
            gc.freeze()
            opened.callback(gc.unfreeze)
            yield

    app = _GatewayApp(
        telemetry,
        policy.limits.max_body_bytes,
        keys,
        admin,
        title="agent-gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(build_api_router(state, metrics))
    app.include_router(build_observability_router())
    app.include_router(build_sessions_router())
    app.include_router(build_responses_router())
    app.include_router(build_approvals_router(telemetry))  # held tool calls (gateway/approvals/)
    app.include_router(
        build_feedback_router(metrics)
    )  # scores for served requests (gateway/feedback/)
    if admin is not None:  # no admin key, no admin API
        app.include_router(build_admin_router(Tenants(policy)))
    app.include_router(build_openapi_router())  # the hand-written one: gateway/api/openapi.py
    _install_error_handlers(app)
    return app


async def _stop_runtime(state: State, services: Services, started: Runtime) -> None:
    """The runtime in use at shutdown (a reload may have replaced the first one), or the
    one being started when start-up failed before it was in use."""
    in_use: Runtime | None = getattr(state, "runtime", None)
    await (in_use or started).stop()
    if in_use is not None:
        in_use.deactivate(services)


class _GatewayApp(FastAPI):
    """FastAPI, with the request id, telemetry and the hot API calls in plain ASGI in
    front of its own stack (gateway/api/inference.py says why)."""

    def __init__(
        self,
        telemetry: Telemetry,
        max_body_bytes: int,
        keys: KeyStore | None,
        admin: AdminKeyStore | None,
        **kwargs: Any,
    ) -> None:
        # The gateway makes its own spans and metrics (gateway/telemetry/). FastAPI's
        # native OpenTelemetry would add a server span and metrics of its own to every
        # request whenever a global provider is set (opentelemetry-instrument sets one),
        # and asks on every request whether one is.
        super().__init__(telemetry={"tracing": False, "metrics": False, "logs": False}, **kwargs)
        self._gateway_telemetry = telemetry
        self._max_body_bytes = max_body_bytes
        self._keys = keys
        self._admin = admin

    def build_middleware_stack(self) -> ASGIApp:
        limit = self._max_body_bytes
        app: ASGIApp = ApiCalls(
            BodyLimit(super().build_middleware_stack(), max_body_bytes=limit), max_body_bytes=limit
        )
        if self._keys is not None or self._admin is not None:
            # inside the edge: a 401 has a request id and a record
            app = ApiKeyAuth(app, self._keys, self._admin)
        return EdgeMiddleware(app, self._gateway_telemetry)


def _install_error_handlers(app: FastAPI) -> None:
    def request_id(request: Request) -> str | None:
        return getattr(request.state, "request_id", None)

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        record = getattr(request.state, "telemetry", None)
        if record is not None:
            record.error_type = exc.label
        return error_response(exc, request_id=request_id(request), path=request.url.path)

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
        return error_response(error, request_id=request_id(request), path=request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        error = InvalidRequest(str(exc))
        return error_response(error, request_id=request_id(request), path=request.url.path)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # A bug, not the client's fault: log it whole, tell the client nothing internal.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        error = GatewayError.internal()
        return error_response(error, request_id=request_id(request), path=request.url.path)

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
