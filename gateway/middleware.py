"""Plain ASGI middleware (no BaseHTTPMiddleware: it would buffer and slow streaming)."""

from __future__ import annotations

import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry.service import Telemetry

# Accept a client's id only if it is short and printable; it is echoed and sent upstream.
_CLIENT_ID = re.compile(rb"^[A-Za-z0-9._:/=+-]{1,128}$")


class RequestIdMiddleware:
    """Accept or generate X-Request-Id, expose it as `request.state.request_id`, echo it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _CLIENT_ID.match(value):
                request_id = value.decode("ascii")
                break
        if not request_id:
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                headers.append(header)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)


# The API calls that make a request record (and count in metrics, usage and traces).
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}


class TelemetryMiddleware:
    """Starts each API call's record (trace context from the client's `traceparent`),
    notes its status, first byte and last byte as they are sent, and hands it to
    telemetry once the response is complete, whatever happened in between."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = _OPERATIONS.get(scope["path"]) if scope["type"] == "http" else None
        if operation is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        traceparent = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = value.decode("latin-1")
                break
        state = scope.setdefault("state", {})
        record = self.telemetry.start(
            state.get("request_id", ""), operation, route=scope["path"], traceparent=traceparent
        )
        state["telemetry"] = record
        trace_header = (b"x-gateway-trace-id", record.trace.trace_id_hex.encode("ascii"))

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message["headers"] = [*message.get("headers", []), trace_header]
            elif message["type"] == "http.response.body":
                if not record.first_byte_ns and message.get("body"):
                    record.first_byte_ns = time.perf_counter_ns()
                if not message.get("more_body", False):
                    record.end_ns = time.perf_counter_ns()
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            record.end_ns = record.end_ns or time.perf_counter_ns()
            record.status = record.status or 500  # an error escaped: the server answers 500
            self.telemetry.finish(record)
