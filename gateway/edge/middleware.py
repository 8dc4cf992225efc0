"""The gateway's edge, in plain ASGI (no BaseHTTPMiddleware: it would buffer and slow
streaming): one wrapper around every request, so the response's `send` is wrapped once.

- X-Request-Id: a client's is accepted when short and printable (it is echoed and sent
  upstream), else one is generated; `request.state.request_id` holds it.
- For the API calls, a telemetry record: started with the client's `traceparent`, told
  the status, the first and the last byte as they are sent, and handed to telemetry once
  the response is complete, whatever happened in between. Its trace id is returned in
  X-Gateway-Trace-Id. When rate limits or a budget applied to the request, its
  x-ratelimit-* headers go on the answer, and once the response is complete its quota
  charge is settled with what the engines counted (gateway/quota/). The pipeline leaves
  the charge in `request.state.charges`, not on the telemetry record, which only reads.
"""

from __future__ import annotations

import os
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.headers import TRACE_ID_ASGI
from gateway.lifetime.startup import lifespan_saying_refusals_plainly
from gateway.request_context import Charges
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.service import Telemetry

# Matched whole: `$` would also match before a final newline.
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:/=+-]{1,128}")

# The API calls that make a request record (and count in metrics, usage and traces).
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/responses/input_tokens": "count_tokens",
    "/v1/responses/compact": "compact",
    "/v1/messages": "messages",  # Anthropic's (gateway/anthropic/)
    "/v1/messages/count_tokens": "count_tokens",
}


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


class EdgeMiddleware:
    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":  # start-up and shutdown
                await lifespan_saying_refusals_plainly(self.app, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        request_id = traceparent = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _CLIENT_ID.fullmatch(value):
                request_id = value.decode("ascii")
            elif name == b"traceparent":
                traceparent = value.decode("latin-1")
        request_id = request_id or os.urandom(16).hex()  # uuid4's 32 hex digits, cheaper
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        added = [(b"x-request-id", request_id.encode("ascii"))]
        operation = _OPERATIONS.get(scope["path"]) if scope["method"] == "POST" else None
        record: RequestRecord | None = None
        charges = Charges()  # admission's charge, left by the pipeline (gateway/quota/)
        if operation is not None:
            record = self.telemetry.start(
                request_id, operation, route=scope["path"], traceparent=traceparent or None
            )
            state["telemetry"] = record
            state["charges"] = charges
            added.append((TRACE_ID_ASGI, record.trace.trace_id_hex.encode("ascii")))

        async def observed(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0] != b"x-request-id"]
                message["headers"] = headers + added
                if record is not None:
                    record.status = message["status"]
                    if charges.charge is not None:  # x-ratelimit-*, on whatever it answers
                        message["headers"] += _encoded(charges.charge.headers)
            elif kind == "http.response.body" and record is not None:
                if not record.first_byte_ns and message.get("body"):
                    record.first_byte_ns = time.perf_counter_ns()
                if not message.get("more_body", False):
                    record.end_ns = time.perf_counter_ns()
            await send(message)

        if record is None:
            await self.app(scope, receive, observed)
            return
        try:
            await self.app(scope, receive, observed)
        finally:
            record.end_ns = record.end_ns or time.perf_counter_ns()
            record.status = record.status or 500  # an error escaped: the server answers 500
            self.telemetry.finish(record)
            if charges.charge is not None:  # estimate -> the engines' count (gateway/quota/)
                await charges.charge.settle(record)
