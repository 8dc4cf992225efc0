"""Reading a request body under the policy's size limit (or the caller's tenant's own,
`tenants.<name>.limits.max_body_bytes`: the key check runs before any body is read),
without trusting Content-Length."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, error_response
from gateway.tenants.identity import access_of
from gateway.untrusted.client_text import ascii_number


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than this gateway's limit of {limit} bytes."
    )


def declared_length(headers: Headers) -> int | None:
    """The body size Content-Length declares (None without one); a 400 when it is not
    ASCII digits (Latin-1 `²` passes `str.isdigit()`, then fails `int()`)."""
    declared = headers.get("content-length")
    if declared is None:
        return None
    size = ascii_number(declared)
    if size is None:
        raise InvalidRequest("Content-Length is not a number.")
    return size


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, read from the ASGI `receive` directly: Starlette's `stream()` is an
    async generator, a few microseconds of machinery for what is nearly always one message.
    (The request's stream is not used after this: the body is passed on as bytes.)"""
    declared = declared_length(request.headers)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] != "http.request":
            continue
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class BodyLimit:
    """Holds the routes behind FastAPI (a session fork, ...) to the same body limit as the
    API calls: a declared Content-Length over it is answered 413 at once (one that is not
    a number, 400); a body that
    grows past it while the handler reads it raises PayloadTooLarge there, inside FastAPI's
    exception handling, so it is a 413 in OpenAI's shape too."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = access_of(scope.get("state", {})).max_body_bytes or self._limit
        try:
            declared = declared_length(Headers(scope=scope))
            if declared is not None and declared > limit:
                raise _too_large(limit)
        except GatewayError as exc:
            request_id = scope.get("state", {}).get("request_id")
            await error_response(exc, request_id=request_id, path=scope["path"])(
                scope, receive, send
            )
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited, send)
