"""Requests sent to a gateway's ASGI app directly, in its own event loop, for what an HTTP
client library will not send: header values of raw bytes, and a client that goes away
in the middle of a streamed answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.testclient import TestClient
from starlette.types import Message


@dataclass
class Answered:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


def call(
    client: TestClient,
    method: str,
    path: str,
    *,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    body: bytes = b"",
    leave_after_bytes: int | None = None,
) -> Answered:
    """One request to the (entered) test client's app. With `leave_after_bytes`, the
    client disconnects once that much of the answer's body has arrived."""
    answered = Answered()

    async def run() -> None:
        left = anyio.Event()
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered.status = message["status"]
                answered.headers = {
                    name.decode("latin-1"): value.decode("latin-1")
                    for name, value in message.get("headers", ())
                }
            elif message["type"] == "http.response.body":
                answered.body += message.get("body", b"")
                if leave_after_bytes is not None and len(answered.body) >= leave_after_bytes:
                    left.set()

        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"testserver"), *headers],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "state": {},
            "app": client.app,
        }
        await client.app(scope, receive, send)

    assert client.portal is not None, "enter the TestClient first"
    client.portal.call(run)
    return answered
