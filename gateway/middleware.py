"""Plain ASGI middleware (no BaseHTTPMiddleware: it would buffer and slow streaming)."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
